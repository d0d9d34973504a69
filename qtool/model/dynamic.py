"""A model onnxruntime quantized dynamically (quantize_dynamic), read as the float model it was made
from: each ConvInteger / MatMulInteger layer (its input quantized at run time by
DynamicQuantizeLinear, its int32 result scaled back to float) becomes the Conv / MatMul it replaced,
with the dequantized weight and the float bias; com.microsoft DynamicQuantizeLSTM becomes LSTM with
its dequantized W and R. Quantized nodes of any other pattern (what qtool.model.qoperator, which reads a
statically quantized QOperator model first, does not read: QAttention, onnxruntime's NHWC kernels, ...) are
refused with a one-line error: qtool quantizes float models.

The patterns are those onnxruntime writes (microsoft/onnxruntime,
onnxruntime/python/tools/quantization/operators/conv.py, matmul.py and lstm.py):

- Conv: DynamicQuantizeLinear(x) -> (xq, xs, xzp); ConvInteger(xq, Wq, xzp, Wzp) -> Cast(float) ->
  Mul by Mul(xs, Ws) -> y, the float bias then added through a Reshape (current versions); or, in
  older ones (onnxruntime/python/tools/quantization/onnx_quantizer.py, quantize_bias_dynamic), the
  bias requantized at run time, Cast(int32, Floor(Div(b, Mul(xs, Ws)))), reshaped and added to the
  int32 result before the Cast.
- MatMul: the same with MatMulInteger, per-column weight scales and zero points allowed; no bias.
- LSTM: DynamicQuantizeLSTM(X, Wq, Rq, B, ..., Ws, Wzp, Rs, Rzp): Wq and Rq transposed to
  [directions, input, 4 * hidden], scales and zero points per direction or per direction and gate row.
- Gather (an embedding table, operators/gather.py): Gather(Wq, ids) -> DequantizeLinear(Wq's scale and
  zero point), the integer rows possibly moved first (the quantizer passes them through Transpose,
  Reshape, ...: each such reader of them ends in its own DequantizeLinear). The table becomes the float
  one, and each DequantizeLinear's output is made by the op before it.

A weight is (Wq - zero point) * scale in float32: one rounding, as DequantizeLinear computes it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import QtoolError
from . import graph, lazy
from .graph import Namer, all_nodes, attr, cleanup, consumers, producers, rename_reads, subgraphs

DYNAMIC_OPS = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"}
# ops that move integer values without arithmetic: a per-tensor DequantizeLinear after them equals one before (slot 0 is the data)
MOVES = graph.MOVES | {"Gather", "Slice", "Expand", "Tile"}
# every quantized operator qtool does not read as float: onnxruntime's QOperator format and its contrib ops
_STATIC_OPS = {"QLinearConv", "QLinearMatMul", "QGemm", "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
               "QEmbedLayerNormalization", "QOrderedMatMul", "QOrderedLayerNormalization", "QOrderedGelu", "QOrderedAttention",
               "NhwcQLinearConv", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"}


def quantized_op(n: onnx.NodeProto) -> bool:
    return n.op_type in _STATIC_OPS or (n.domain == "com.microsoft" and n.op_type.startswith("QLinear"))


def is_dynamic(proto: onnx.ModelProto) -> bool:
    """Whether the model looks quantized by quantize_dynamic: it holds ConvInteger, MatMulInteger or
    DynamicQuantizeLSTM nodes and no other quantized operator (its graph alone: no weights read)."""
    ops = {n.op_type for n in all_nodes(proto.graph) if quantized_op(n)}
    return bool(ops & DYNAMIC_OPS) and ops <= DYNAMIC_OPS | {"DynamicQuantizeLinear"}


@dataclass
class Rewrite:
    """What as_float changed: {"ConvInteger": count, ...}; the grids the model's layers used (`grids`)."""

    layers: Counter = field(default_factory=Counter)
    grids: ModelGrids = field(default_factory=lambda: ModelGrids())

    def describe(self) -> str:
        float_op = {"ConvInteger": "Conv", "MatMulInteger": "MatMul", "DynamicQuantizeLSTM": "LSTM",
                    "Gather": "Gather of the float table"}
        return ", ".join(f"{k} {op} -> {float_op[op]}" for op, k in sorted(self.layers.items()))


# the float reading's metadata entry naming what the model quantized at run time (read by model_grids; written by no export)
GRIDS_KEY = "qtool.dynamic_grids"  # one of graph.READING_KEYS: graph.finish leaves it out of every file


@dataclass
class ModelGrids:
    """What a model quantized dynamically computes on its own grids, named in its float reading: the activations its
    DynamicQuantizeLinear nodes quantize (each input's own asymmetric uint8 grid over its min and max, zero included:
    ONNX DynamicQuantizeLinear) and its ConvInteger/MatMulInteger weights, each with how qtool's signed weight grid
    gives back its integers exactly: "per_tensor" (int8, zero point 0, one scale, a code at +-127), "per_channel" (one
    scale per output channel, each channel's peak code at +-127), "" (no signed narrow grid does: uint8 with zero points,
    or codes short of 127)."""

    activations: set[str] = field(default_factory=set)
    weights: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"activations": sorted(self.activations), "weights": dict(sorted(self.weights.items()))})


def model_grids(proto: onnx.ModelProto) -> ModelGrids | None:
    """The ModelGrids a float reading (as_float) records, None for any other model."""
    for p in proto.metadata_props:
        if p.key == GRIDS_KEY:
            doc = json.loads(p.value)
            return ModelGrids(set(doc["activations"]), dict(doc["weights"]))
    return None


def exact_grid(q: np.ndarray, zp: np.ndarray, scale: np.ndarray, axis: int | None) -> str:
    """How qtool's signed narrow weight grid (scale = peak / 127, per tensor or per output channel along `axis`) holds the
    integers `q` (zero points `zp`, scales `scale`) exactly: "per_tensor", "per_channel" or "" (ModelGrids.weights)."""
    if q.dtype != np.int8 or np.any(zp != 0) or q.size == 0:
        return ""
    # the peak |code| from int8 maxima and minima (no int32 copy of the weight: t5's 66 MB head took 132 MB more)
    if scale.size == 1:
        return "per_tensor" if max(int(q.max()), -int(q.min())) == 127 else ""
    if axis is None:
        return ""
    other = tuple(i for i in range(q.ndim) if i != axis % q.ndim)
    peak = np.maximum(q.max(axis=other).astype(np.int32), -q.min(axis=other).astype(np.int32))
    return "per_channel" if np.all(peak == 127) else ""


def _finite(w: np.ndarray, zp: np.ndarray, scale: np.ndarray) -> bool:
    """Whether _dequantized(w, zp, scale) (`zp` and `scale` broadcast against `w`) is finite everywhere, dequantized
    ~4M values at a time along w's first axis."""
    if w.ndim == 0 or w.size == 0:
        return bool(np.all(np.isfinite(_dequantized(w, zp, scale))))
    step = max(1, (1 << 22) // max(1, w[0].size))

    def rows(a: np.ndarray, k: int) -> np.ndarray:  # a's part broadcast against w[k:k + step]
        return a[k:k + step] if a.ndim == w.ndim and a.shape[0] > 1 else a
    return all(np.all(np.isfinite(_dequantized(w[k:k + step], rows(zp, k), rows(scale, k)))) for k in range(0, w.shape[0], step))


class _Unrecognised(Exception):
    """A dynamically quantized layer outside the patterns above: (node, what was expected)."""


def as_float(proto: onnx.ModelProto, folder=None, where: str = "the model", store: lazy.Store | None = None,
             held: bool = False) -> tuple[onnx.ModelProto, Rewrite] | None:
    """(the float model `proto` was made from, what was rewritten) when it holds dynamically
    quantized layers (a new ModelProto: `proto` is not changed); None when it holds no quantized
    operator, or only QuantizeLinear/DequantizeLinear (a Q/DQ model: read as it is, its own quantizers kept,
    qtool.model.prequantized).
    A one-line QtoolError for any other quantized operator or a layer outside the patterns.
    `folder`: where external data lies when the weights were not loaded; `where`: how to name the model;
    `store`: the lazy store of a model loaded lazily, whose dequantized weights are then lazy too,
    computed from `proto`'s integer weights each time they are read (float_weight); `held`: those lazy weights count as
    held in the graph (lazy.Computed.held: where bigmodel.room_for_lazy has no room for them)."""
    found = sorted({n.op_type for n in all_nodes(proto.graph) if quantized_op(n)})
    if not found:
        return None
    if not is_dynamic(proto):
        static = [op for op in found if op not in DYNAMIC_OPS | {"DynamicQuantizeLinear"}] or found
        raise QtoolError(f"{where} holds {', '.join(static)} nodes: it is already quantized (onnxruntime's QOperator format or "
                         "its contrib ops), which qtool does not read back as float; give the FP32 model it was made from")
    inner = (k for n in proto.graph.node for sub in subgraphs(n) for k in all_nodes(sub))
    if any(quantized_op(k) for k in inner):
        raise QtoolError(f"{where} holds dynamically quantized layers inside a subgraph (If/Loop/Scan), which qtool does not "
                         "read back as float; give the FP32 model it was made from")
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    try:
        done = _Rewriter(model, folder, proto if store is not None else None, store, held).run()
    except _Unrecognised as e:
        node, expected = e.args
        raise QtoolError(f"{where}: {node.op_type} node {node.name or node.output[0]!r} is not in the pattern onnxruntime's "
                         f"quantize_dynamic writes ({expected}), so qtool cannot read it back as float; give the FP32 model it "
                         "was made from") from None
    cleanup(model.graph)
    if done.grids.activations or done.grids.weights:
        model.metadata_props.add(key=GRIDS_KEY, value=done.grids.to_json())
    left = sorted({n.op_type for n in all_nodes(model.graph) if quantized_op(n)})
    if left:  # e.g. a DynamicQuantizeLinear whose output something else reads
        raise QtoolError(f"{where}: {', '.join(left)} nodes remain after reading its dynamically quantized layers as float "
                         "(a pattern onnxruntime's quantize_dynamic does not write); give the FP32 model it was made from")
    # parsed again from its bytes (the same message): protobuf keeps what a message ever held in
    # its memory arena until the whole message goes, so the rewritten model also held the copied
    # int8 weights, every node list `replace` rebuilt and each float weight's copy (ddddocr's CRNN:
    # 120 MB for a 54 MB model, for the whole run); past protobuf's 2 GiB it stays as it is
    if model.ByteSize() < 1 << 31:
        data = model.SerializeToString()
        del model
        model = onnx.ModelProto.FromString(data)
    return model, done


def _dequantized(w: np.ndarray, zp: np.ndarray, scale: np.ndarray, transpose=None) -> np.ndarray:
    """(w - zp) * scale: the float32 product of the exact integer difference and the float32 scale
    (DequantizeLinear's one rounding), transposed by `transpose`."""
    zp, scale = np.asarray(zp), np.asarray(scale)
    if w.dtype.itemsize > 2 or zp.dtype.itemsize > 2 or np.broadcast_shapes(w.shape, zp.shape, scale.shape) != w.shape:
        data = (w.astype(np.int32) - zp.astype(np.int32)).astype(np.float32) * scale.astype(np.float32)
        return data if transpose is None else np.ascontiguousarray(data.transpose(transpose))
    # in one float32 array, transposed as the integers are read (integers of 16 bits or less and their difference are
    # exact in float32: the same one rounding): the float weight's bytes while made, not 2-3x them in int32 and
    # float32 temporaries (ddddocr_ocr's 51 MB of LSTM and head weights, made while its segment's session is: 66 MB
    # more at once, docs/benchmarks.md #mem22)
    if transpose is not None:
        zp, scale = (a.reshape((1,) * (w.ndim - a.ndim) + a.shape).transpose(transpose) for a in (zp, scale))
        w = w.transpose(transpose)
    data = w.astype(np.float32, order="C")
    data -= zp.astype(np.float32)
    data *= scale.astype(np.float32)
    return data


def _as_dequantize(source: onnx.TensorProto, folder, zp: np.ndarray, scale: np.ndarray, transpose) -> lazy.Dequantized | None:
    """The DequantizeLinear that makes _dequantized(source's integers, zp, scale, transpose) (`zp` and `scale` in the
    integers' broadcast shape): per tensor, or along the one axis they vary on; None where they vary on more than one
    (an LSTM's scales per direction and gate row, both directions), which no DequantizeLinear of a 1-D scale makes."""
    rank = len(source.dims)  # numpy's broadcasting: the scales' axes are the weight's last ones
    zp, scale = (a.reshape((1,) * (rank - a.ndim) + a.shape) for a in (zp, scale))
    if transpose is not None:
        zp, scale = zp.transpose(transpose), scale.transpose(transpose)
    if scale.size == 1 and zp.size == 1:
        axis, scale, zp = None, scale.reshape(()), zp.reshape(())
    else:
        varies = [k for k, d in enumerate(np.broadcast_shapes(scale.shape, zp.shape)) if d != 1]
        if len(varies) != 1:
            return None
        axis = varies[0]
        length = max(scale.size, zp.size)
        scale, zp = np.broadcast_to(scale.reshape(-1), (length,)).copy(), np.broadcast_to(zp.reshape(-1), (length,)).copy()

    def integers(source=source, folder=folder, transpose=transpose):
        q = lazy.read_value(source, folder)
        return q if transpose is None else np.ascontiguousarray(q.transpose(transpose))
    return lazy.Dequantized(integers, scale.astype(np.float32), zp, axis)


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, folder, given: onnx.ModelProto | None = None, store: lazy.Store | None = None,
                 held: bool = False):
        self.model, self.graph, self.folder = model, model.graph, folder
        self.inits = {t.name: t for t in self.graph.initializer}
        # the model as given (kept beside the float one: LoadedModel.given), whose integer weights the lazy
        # float weights are computed from, and the store those refer to
        self.given = {t.name: t for t in given.graph.initializer} if given is not None else {}
        self.store, self.held = store, held
        self.made_by = producers(self.graph)
        self.readers = consumers(self.graph)
        self.outputs = {o.name for o in self.graph.output}
        self.namer = Namer(model)
        self.weights: dict[tuple, str] = {}  # (quantized weight, scale, zero point, transposed) -> float weight
        self.done = Rewrite()
        self.placed: dict[str, onnx.NodeProto] = {}  # the first output of a replaced node -> the node put in its place
        self.gone: set[str] = set()  # outputs the new nodes make: their old makers go

    # ------------------------------------------------------------ reading the graph

    def value(self, name: str) -> np.ndarray | None:
        """An initializer's value (read from external data when not loaded), None for anything else."""
        t = self.inits.get(name)
        return None if t is None else lazy.read_value(t, self.folder)

    def only_reader(self, tensor: str, op_type: str) -> onnx.NodeProto | None:
        readers = self.readers.get(tensor, [])
        if len(readers) != 1 or tensor in self.outputs:
            return None
        n, _ = readers[0]
        return n if n.op_type == op_type and n.domain in ("", "ai.onnx") else None

    def quantizer(self, node: onnx.NodeProto, q: str, zp: str) -> tuple[str, str]:
        """(the float tensor, its run-time scale) of `q` and `zp`, outputs 0 and 2 of one DynamicQuantizeLinear."""
        d = self.made_by.get(q)
        if (d is None or d.op_type != "DynamicQuantizeLinear" or list(d.output[:1]) != [q]
                or len(d.output) < 3 or d.output[2] != zp):
            raise _Unrecognised(node, "its input quantized by a DynamicQuantizeLinear, with that node's zero point")
        return d.input[0], d.output[1]

    def weight_scale(self, node: onnx.NodeProto, scales: str, x_scale: str, w_scale: str | None = None) -> np.ndarray | str:
        """The constant the run-time scale `x_scale` is multiplied by in the node making `scales`
        (Mul(xs, Ws)); with `w_scale` (an activation's run-time scale), that tensor's name instead."""
        m = self.made_by.get(scales)
        if m is None or m.op_type != "Mul" or len(m.input) != 2 or x_scale not in m.input:
            raise _Unrecognised(node, "its result multiplied by Mul(input scale, weight scale)")
        other = m.input[1] if m.input[0] == x_scale else m.input[0]
        if w_scale is not None:
            if other != w_scale:
                raise _Unrecognised(node, "its result multiplied by the product of both inputs' scales")
            return other
        v = self.value(other)
        if v is None or v.dtype != np.float32:
            raise _Unrecognised(node, "a float32 weight scale initializer")
        return v

    def int_weight(self, node: onnx.NodeProto, name: str, zp: str | None) -> tuple[np.ndarray, np.ndarray]:
        w = self.value(name)
        z = np.zeros((), dtype=w.dtype if w is not None else np.int8) if not zp else self.value(zp)
        if w is None or z is None or w.dtype not in (np.int8, np.uint8) or z.dtype != w.dtype:
            raise _Unrecognised(node, "an int8/uint8 weight initializer with a zero point initializer of its type")
        return w, z

    def scaled(self, node, tensor: str, scales: str) -> str:
        """The float tensor a Mul of `tensor` by `scales` makes (either order): the layer's output."""
        mul = self.only_reader(tensor, "Mul")
        if mul is None or sorted(mul.input) != sorted([tensor, scales]):
            raise _Unrecognised(node, "its result cast to float and multiplied by the scales")
        return mul.output[0]

    def cast_float(self, node, tensor: str) -> str:
        cast = self.only_reader(tensor, "Cast")
        if cast is None or attr(cast, "to") != TensorProto.FLOAT:
            raise _Unrecognised(node, "its int32 result cast to float")
        return cast.output[0]

    # ------------------------------------------------------------ writing

    def float_weight(self, q: str, scale: np.ndarray, zp: np.ndarray, w: np.ndarray, shaped, transpose=None) -> str:
        """A float32 initializer (q - zp) * scale (`shaped` gives scale and zp the broadcast shape),
        transposed by `transpose`; one per quantized weight and its parameters."""
        key = (q, scale.tobytes(), zp.tobytes(), transpose)
        if key in self.weights:
            return self.weights[key]
        source = self.given.get(q)
        made_lazy = source is not None and 4 * w.size >= lazy.INLINE_BYTES
        # a lazy weight's values are checked a slice at a time, never held whole (t5's 66 MB embedding table and its int32
        # temporaries took calibrate to its peak RSS while it was read)
        data = None if made_lazy else _dequantized(w, shaped(zp), shaped(scale), transpose)
        if not (_finite(w, shaped(zp), shaped(scale)) if made_lazy else np.all(np.isfinite(data))):
            raise QtoolError(f"the dequantized weight {q!r} is not finite (its scale is); the model is damaged")
        shape = w.shape if transpose is None else tuple(w.shape[k] for k in transpose)
        base = q[: -len("_quantized")] if q.endswith("_quantized") else q + "_dequantized"
        name = self.namer.fresh(base)
        if made_lazy:
            # lazy: the float weights (4x the integer ones) are not held as well, in the proto and in each
            # serialization of it for onnxruntime (tashkeel_bilstm: 17 MB of them from its 4 MB of int8, its
            # calibrate 190 -> 140 MB of peak RSS); each session reads them from a file written when it is made
            # (spill.runnable)
            zp_, scale_, folder = shaped(zp).copy(), shaped(scale).copy(), self.folder

            def fn(source=source, zp_=zp_, scale_=scale_, folder=folder, transpose=transpose):
                return _dequantized(lazy.read_value(source, folder), zp_, scale_, transpose)
            t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
            made = _as_dequantize(source, folder, zp_, scale_, transpose)
            lazy.refer(t, self.store.add(lazy.Computed(fn, np.dtype(np.float32), dequantized=made, held=self.held)))
            self.graph.initializer.append(t)
        else:
            self.graph.initializer.append(numpy_helper.from_array(data, name))
        self.weights[key] = name
        return name

    def replace(self, old: onnx.NodeProto, new: onnx.NodeProto) -> None:
        """Put `new` where `old` was in the node list (its inputs come before, its readers after) and
        remove the node that made `new`'s outputs until now; the rest of the old layer, which nothing
        reads any more, goes at cleanup."""
        made = {o for o in new.output if o}
        # the node list is rebuilt once, after the last layer (`placed`): rebuilt for each, its copied messages stayed
        # in protobuf's arena until the model was parsed again (t5_title_decoder's 89 layers: 60 MB more while read)
        self.placed[old.output[0]] = new
        self.gone |= made
        for o in made:
            self.made_by[o] = new

    def place(self) -> None:
        """The node list with each layer's new node where its old one was (`replace`)."""
        if not self.placed:
            return
        kept = []
        for k in self.graph.node:
            kept.extend(self.placed[o] for o in k.output if o in self.placed)  # `old` is found by what it makes
            if not self.gone & set(k.output):
                kept.append(k)
        del self.graph.node[:]
        self.graph.node.extend(kept)
        self.placed, self.gone = {}, set()

    def node_name(self, old: onnx.NodeProto, op_type: str, y: str) -> str:
        """onnxruntime names a layer's integer node after the float one (+ "_quant"): that name again."""
        base = old.name[: -len("_quant")] if old.name.endswith("_quant") else (old.name or f"{op_type}_{y}")
        return self.namer.fresh(base)

    # ------------------------------------------------------------ the layers

    def run(self) -> Rewrite:
        self.tables()
        for n in list(self.graph.node):
            if n.op_type == "ConvInteger" and n.domain in ("", "ai.onnx"):
                self.conv(n)
            elif n.op_type == "MatMulInteger" and n.domain in ("", "ai.onnx"):
                self.matmul(n)
            elif n.op_type == "DynamicQuantizeLSTM" and n.domain == "com.microsoft":
                self.lstm(n)
        self.place()
        return self.done

    def conv(self, n: onnx.NodeProto) -> None:
        if len(n.input) < 3 or not n.input[2]:
            raise _Unrecognised(n, "its input's zero point given")
        x, xs = self.quantizer(n, n.input[0], n.input[2])
        wq, wz = self.int_weight(n, n.input[1], n.input[3] if len(n.input) > 3 else None)
        out, bias = n.output[0], None
        add = self.only_reader(out, "Add")
        if add is not None:  # older onnxruntime: the bias requantized at run time, added in int32
            bias = self._int_bias(n, add, out, xs)
            out = add.output[0]
        cast = self.cast_float(n, out)
        scales = self._scales_of(n, cast)
        ws = self.weight_scale(n, scales, xs)
        y = self.scaled(n, cast, scales)
        if bias is None:  # current onnxruntime: the float bias added after the scaling, through a Reshape
            bias, y = self._float_bias(y, wq.shape[0]) or (None, y)
        # the scales multiply the output [N, C, ...]: per channel, Ws's shape puts C on axis 1 ([C, 1, 1] or [1, C, 1, 1])
        per_channel = ws.size > 1 and tuple(ws.shape[-(wq.ndim - 1):]) == (wq.shape[0],) + (1,) * (wq.ndim - 2)
        if not (ws.size == 1 or per_channel) or wz.size not in (1, wq.shape[0]):
            raise _Unrecognised(n, "one weight scale and zero point, or one per output channel")

        def shaped(a):
            return a.reshape((-1,) + (1,) * (wq.ndim - 1)) if a.size > 1 else a.reshape(())
        w = self.float_weight(n.input[1], ws, wz, wq, shaped)
        self.done.grids.activations.add(x)
        self.done.grids.weights[w] = exact_grid(wq, wz, ws, 0)
        conv = helper.make_node("Conv", [x, w] + ([bias] if bias else []), [y], self.node_name(n, "Conv", y))
        conv.attribute.extend(a for a in n.attribute)
        self.replace(n, conv)
        self.done.layers["ConvInteger"] += 1

    def _scales_of(self, n, cast_out: str) -> str:
        mul = self.only_reader(cast_out, "Mul")
        if mul is None or len(mul.input) != 2:
            raise _Unrecognised(n, "its result cast to float and multiplied by the scales")
        return mul.input[1] if mul.input[0] == cast_out else mul.input[0]

    def _int_bias(self, n, add: onnx.NodeProto, out: str, xs: str) -> str:
        """The float bias the int32 bias added to `out` is requantized from at run time:
        Reshape(Cast(Floor(Div(b, Mul(xs, Ws))))) (onnx_quantizer.py's quantize_bias_dynamic)."""
        other = add.input[1] if add.input[0] == out else add.input[0]
        chain = []
        t = other
        for op in ("Reshape", "Cast", "Floor", "Div"):
            p = self.made_by.get(t)
            if p is None or p.op_type != op:
                raise _Unrecognised(n, "an int32 bias Cast(Floor(Div(bias, scales))) added to its result")
            chain.append(p)
            t = p.input[0]
        bias = chain[-1].input[0]
        b = self.value(bias)
        if b is None or b.dtype != np.float32 or b.ndim != 1:
            raise _Unrecognised(n, "a float32 bias initializer divided by the scales")
        self.weight_scale(n, chain[-1].input[1], xs)  # the divisor: Mul(xs, Ws)
        return bias

    def _float_bias(self, y: str, channels: int) -> tuple[str, str] | None:
        """(the float bias, the biased output) when `y` is only read by Add(y, Reshape(b, [1, -1, 1, ...]))."""
        add = self.only_reader(y, "Add")
        if add is None or len(add.input) != 2:
            return None
        other = add.input[1] if add.input[0] == y else add.input[0]
        r = self.made_by.get(other)
        if r is None or r.op_type != "Reshape":
            return None
        b = self.value(r.input[0])
        shape = self.value(r.input[1])
        if b is None or b.dtype != np.float32 or b.shape != (channels,) or shape is None or int(np.prod(shape[shape > 0])) != 1:
            return None
        return r.input[0], add.output[0]

    def matmul(self, n: onnx.NodeProto) -> None:
        if len(n.input) < 3 or not n.input[2]:
            raise _Unrecognised(n, "its input's zero point given")
        a, xs = self.quantizer(n, n.input[0], n.input[2])
        cast = self.cast_float(n, n.output[0])
        scales = self._scales_of(n, cast)
        bzp = n.input[3] if len(n.input) > 3 else ""
        if n.input[1] in self.made_by and self.made_by[n.input[1]].op_type == "DynamicQuantizeLinear":  # both inputs activations
            b, bs = self.quantizer(n, n.input[1], bzp)
            self.weight_scale(n, scales, xs, bs)
            self.done.grids.activations.add(b)
        else:
            ws = self.weight_scale(n, scales, xs)
            bq, bz = self.int_weight(n, n.input[1], bzp or None)
            columns = bq.shape[-1] if bq.ndim else 0
            if bq.ndim != 2 or ws.size not in (1, columns) or bz.size not in (1, columns):
                raise _Unrecognised(n, "a 2-D weight with one scale and zero point, or one per column")

            def shaped(v):
                return v.reshape(-1) if v.size > 1 else v.reshape(())
            b = self.float_weight(n.input[1], ws, bz, bq, shaped)
            self.done.grids.weights[b] = exact_grid(bq, bz, ws, 1)
        self.done.grids.activations.add(a)
        y = self.scaled(n, cast, scales)
        self.replace(n, helper.make_node("MatMul", [a, b], [y], self.node_name(n, "MatMul", y)))
        self.done.layers["MatMulInteger"] += 1

    def lstm(self, n: onnx.NodeProto) -> None:
        if len(n.input) < 12:
            raise _Unrecognised(n, "12 inputs: X, W, R, B, sequence_lens, initial_h, initial_c, P, W_scale, W_zero_point, "
                                   "R_scale, R_zero_point")
        names = []
        for q, s, z in ((n.input[1], n.input[8], n.input[9]), (n.input[2], n.input[10], n.input[11])):
            wq, wz = self.int_weight(n, q, z)
            ws = self.value(s)
            if ws is None or ws.dtype != np.float32 or wq.ndim != 3:
                raise _Unrecognised(n, "3-D int8 weights with float32 scales")
            dirs, rows = wq.shape[0], wq.shape[2]  # [directions, input or hidden, 4 * hidden] (lstm.py transposes them)
            if ws.shape not in ((dirs,), (dirs, rows)) or wz.shape != ws.shape:
                raise _Unrecognised(n, "scales and zero points per direction, or per direction and gate row")

            def shaped(v, dirs=dirs):
                return v.reshape(dirs, 1, -1)
            names.append(self.float_weight(q, ws, wz, wq, shaped, transpose=(0, 2, 1)))
        inputs = [n.input[0], *names, *n.input[3:8]]
        while inputs and not inputs[-1]:
            inputs.pop()
        outputs = list(n.output)
        lstm = helper.make_node("LSTM", inputs, outputs, self.node_name(n, "LSTM", outputs[0]))
        lstm.attribute.extend(a for a in n.attribute)
        self.replace(n, lstm)
        self.done.layers["DynamicQuantizeLSTM"] += 1

    def tables(self) -> None:
        """Each int8/uint8 initializer whose every use moves its values (MOVES, slot 0) into per-tensor
        DequantizeLinears of one scale and zero point (onnxruntime's quantized Gather: operators/gather.py)
        becomes its float table (q - zp) * scale, and the DequantizeLinears go: the op before each makes
        its output. A use of any other kind leaves the table as it is (cleanup then keeps the nodes)."""
        for root in list(self.inits):
            readers = self.readers.get(root, [])
            if not readers or root in self.outputs:
                continue
            moved, dqs, params, ok = [root], [], set(), True
            for t in moved:  # grows as the walk goes: the tensors holding the table's integers
                for r, slot in self.readers.get(t, []):
                    if r.domain not in ("", "ai.onnx") or slot != 0 or (t in self.outputs):
                        ok = False
                    elif r.op_type in MOVES:
                        moved.append(r.output[0])
                    elif r.op_type == "DequantizeLinear" and len(r.input) == 3 and not attr(r, "axis"):
                        dqs.append(r)
                        params.add((r.input[1], r.input[2]))
                    else:
                        ok = False
            if not ok or not dqs or len(params) != 1:
                continue
            (s_name, z_name), = params
            w, scale, zp = self.value(root), self.value(s_name), self.value(z_name)
            if (w is None or scale is None or zp is None or w.dtype not in (np.int8, np.uint8) or zp.dtype != w.dtype
                    or scale.dtype != np.float32 or scale.size != 1 or zp.size != 1):
                continue
            table = self.float_weight(root, scale, zp, w, lambda v: v.reshape(()))
            if any(dq.output[0] in self.outputs for dq in dqs if dq.input[0] == root):
                continue
            gone = {id(dq) for dq in dqs}
            kept = [n for n in self.graph.node if id(n) not in gone]
            del self.graph.node[:]
            self.graph.node.extend(kept)  # copies of the messages: the producers found again
            made_by = producers(self.graph)
            renamed: dict[str, str] = {root: table}
            for dq in dqs:
                t, y = dq.input[0], dq.output[0]
                if t in renamed:  # a second DequantizeLinear of the same integers, or one of the table itself
                    rename_reads(self.graph, y, renamed[t])
                    if y in self.outputs:
                        self.graph.node.append(helper.make_node("Identity", [renamed[t]], [y], self.namer.fresh(dq.name or y)))
                else:  # the op before it makes its output: the float model's tensor, under its name
                    made_by[t].output[0] = y
                    rename_reads(self.graph, t, y)
                    renamed[t] = y
            rename_reads(self.graph, root, table)
            self.readers = consumers(self.graph)
            self.made_by = producers(self.graph)
            self.done.layers["Gather"] += 1


# what a session model int8_weights made records (its metadata): qtool.runtime.onnxruntime then makes its sessions without
# onnxruntime's QDQ fusions, which would run a DequantizeLinear -> MatMul of 8-bit per-tensor or per-column weights as
# com.microsoft MatMulNBits (onnxruntime/core/optimizer/qdq_transformer/selectors_actions/qdq_selectors.cc,
# DQMatMulNodeGroupSelector and ValidateDQForMatMulNBits; its activations quantized too: other floats)
SESSION_KEY = "qtool.int8_weights"
# the readers (op, input slot) of a float weight that may read it made at run time: a MatMul's weight, and a Gather's
# table (its rows gathered as integers, then dequantized: the same floats). Not a Conv's weight, which onnxruntime
# reorders into its blocked layout when constant, nor an LSTM's: made at run time, the LSTMs of tashkeel_bilstm,
# tashkeel_rawi_v2/v3 and voicefilter_embedder took calibrate 20-50 MB higher (162 -> 214 MB), not lower
_MADE_READERS = {("MatMul", 1), ("Gather", 0)}
# ... and a Conv's weight that is not 4-D: onnxruntime's blocked (NCHWc) transformer takes 2-D convolutions only
# (kNchwcDims, microsoft/onnxruntime onnxruntime/core/optimizer/nchwc_transformer.cc; qtool.runtime.nchwc.blocks), and
# its CPU Conv kernel reads its weight as it is (no packed copy on x86): a 1-D convolution fed by a DequantizeLinear
# computes the floats its constant weight gives, bit for bit (every Conv output a fetched graph output, nothing fused
# into it). Such a weight is made at run time even when counted as held in the graph (lazy.Computed.held): the floats
# are the same (kokoro_ja_int8's vocoder: ~290 MB of float32 Conv weights from its int8 ones, docs/benchmarks.md #mem24)
_SAME_MADE = ("Conv", 1)
# ... and only where that saves this many bytes of the session's (_made_up_to): smaller models keep their float weights
MADE_SAVES = 16 << 20


def _made_up_to(sizes: dict[str, int], readers: dict, runs: int) -> int:
    """The size of the largest MatMul weight int8_weights makes at run time, -1 for none at all: of each candidate, the
    bytes the session holds for the weights of `sizes` ({float weight: bytes}) if those up to it are made (a quarter
    of theirs, and the most one node's made weights hold at once, times `runs`; a Gather's table made with them, a
    quarter of its bytes) and the others held float (packed once); the least (the smaller size of equals), where it
    holds MADE_SAVES less than all of them float. ddddocr_ocr's 34 MB head made at run time beside its convolutions,
    in one run at a time: 199 MB against 192-202 float, its file changed; kept float."""
    nodes: dict[int, list[str]] = {}
    for name in sizes:
        for n, _ in readers[name]:
            if n.op_type != "Gather":  # a table's rows are made, not the table
                nodes.setdefault(id(n), []).append(name)
    weights = {w for ws in nodes.values() for w in ws}
    tables = sum(b for w, b in sizes.items() if w not in weights)
    best, least = 0, None
    for size in [0, *sorted({sizes[w] for w in weights})]:
        made = {w for w in weights if sizes[w] <= size}
        at_once = max((sum(sizes[w] for w in set(ws) & made) for ws in nodes.values()), default=0)
        cost = sum(sizes[w] for w in weights - made) + (tables + sum(sizes[w] for w in made)) // 4 + max(1, runs) * at_once
        if least is None or cost < least:
            best, least = size, cost
    return best if sum(sizes.values()) - least >= MADE_SAVES else -1


def int8_weights(proto: onnx.ModelProto, runs: int = 1) -> onnx.ModelProto | None:
    """For a session of the float reading of a model onnxruntime quantized dynamically (as_float, loaded lazily): a copy
    whose dequantized weights read by MatMul and Gather nodes (_MADE_READERS) are the model's integers again, each
    made by a DequantizeLinear as the session runs (a Gather's rows dequantized after it), so that the session holds the
    int8 weights plain inference holds, not their float32 values 4x as large (t5_title_encoder: 141 MB of float32 weights
    from 35 MB of int8). onnxruntime keeps such a DequantizeLinear unfolded (its constant folding folds one only with a
    whole DQ -> op -> Q unit: onnxruntime/core/optimizer/constant_folding.cc) and computes (q - zero point) * scale in
    float32 as _dequantized does; a MatMul then multiplies by its weight unpacked (a constant one is packed once when the
    session is made: the sums of the products come in another order, floats differing in the last bits). None when
    there is no such weight, or the model holds Q/DQ nodes of its own (whose fusions must stay as they are).

    A MatMul's weight so made is held as float32 while its node runs, by each of the `runs` side by side: the weights
    made are those up to the size that makes the least of the int8 bytes and those floats beside the float weights
    kept (_made_up_to; a Gather's table with them, its rows alone float), where that saves MADE_SAVES bytes at least."""
    g = proto.graph
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in all_nodes(g)):
        return None
    opset = graph.default_opset(proto)
    readers = consumers(g)
    outputs = {o.name for o in g.output}
    chosen = {}
    for t in g.initializer:
        reads = readers.get(t.name, [])
        # a weight counted as held in the graph (lazy.Computed.held) stays float, as it did when held there, but for one
        # that only unblocked Convs read (_SAME_MADE: the same floats made at run time)
        same = bool(reads) and len(t.dims) != 4 and all((n.op_type, slot) == _SAME_MADE for n, slot in reads)
        made = lazy.entry(t).dequantized if lazy.is_lazy(t) and (same or not lazy.held(t)) \
            and isinstance(lazy.entry(t), lazy.Computed) else None
        if (made is None or not reads or t.name in outputs or opset < (10 if made.axis is None else 13)
                or any(((n.op_type, slot) not in _MADE_READERS and not same) or n.domain not in ("", "ai.onnx") for n, slot in reads)
                or made.axis is not None and any(n.op_type == "Gather" for n, _ in reads)):
            continue
        chosen[t.name] = (t, made)
    most = _made_up_to({name: lazy.nbytes(t) for name, (t, _) in chosen.items()}, readers, runs)
    chosen = {} if most < 0 else {name: c for name, c in chosen.items() if lazy.nbytes(c[0]) <= most
                                  or all(n.op_type == "Gather" for n, _ in readers[name])}
    return _with_int8(proto, chosen) if chosen else None


def _with_int8(proto: onnx.ModelProto, chosen: dict) -> onnx.ModelProto:
    """A copy of `proto` with each weight of `chosen` ({name: (its lazy float initializer, lazy.Dequantized)}) made by
    a DequantizeLinear of its integers (after each Gather reading it, before the first other reader)."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    g = model.graph
    namer = Namer(model)
    store = lazy.STORES.entry(next(iter(chosen.values()))[0])[0]
    kept = [t for t in g.initializer if t.name not in chosen]
    del g.initializer[:]
    g.initializer.extend(kept)
    before: dict[int, list[onnx.NodeProto]] = {}  # DequantizeLinear nodes to put before the node at this position
    after: dict[int, list[onnx.NodeProto]] = {}  # ... after it
    for name, (t, made) in chosen.items():
        q = onnx.TensorProto(name=namer.fresh(f"{name}_int8"), data_type=helper.np_dtype_to_tensor_dtype(made.zero_point.dtype),
                             dims=t.dims)
        # the integers of a weight counted as held in the graph count so too (nchwc's layout rule decides as it did)
        lazy.refer(q, store.add(lazy.Computed(made.integers, made.zero_point.dtype, held=lazy.held(t))))
        scale = numpy_helper.from_array(made.scale, namer.fresh(f"{name}_scale"))
        zp = numpy_helper.from_array(made.zero_point, namer.fresh(f"{name}_zero_point"))
        g.initializer.extend([q, scale, zp])
        axis = {} if made.axis is None else {"axis": made.axis}
        whole = False
        for k, n in enumerate(g.node):
            for slot, i in enumerate(n.input):
                if i != name:
                    continue
                if n.op_type == "Gather":  # its rows gathered as integers, dequantized after it under its output's name
                    rows = namer.fresh(f"{n.output[0]}_int8")
                    dq = helper.make_node("DequantizeLinear", [rows, scale.name, zp.name], [n.output[0]],
                                          namer.fresh(f"{n.name or rows}_dequantize"))
                    n.input[slot], n.output[0] = q.name, rows
                    after.setdefault(k, []).append(dq)
                elif not whole:
                    whole = True
                    dq = helper.make_node("DequantizeLinear", [q.name, scale.name, zp.name], [name],
                                          namer.fresh(f"{name}_dequantize"), **axis)
                    before.setdefault(k, []).append(dq)
    nodes = []
    for k, n in enumerate(g.node):
        nodes.extend(before.get(k, []))
        nodes.append(n)
        nodes.extend(after.get(k, []))
    del g.node[:]
    g.node.extend(nodes)
    model.metadata_props.add(key=SESSION_KEY, value="1")
    return model


INTEGER_OPS = {"MatMulInteger": (1, 3), "ConvInteger": (1, 3)}  # op: (its weight's input, the weight's zero point's)


def without_pair_saturation(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """A copy of `model` (onnxruntime's quantize_dynamic output) whose MatMulInteger / ConvInteger weights stored int8
    are stored uint8 with their zero point + 128: the same integers w - zp, and the same products, run by onnxruntime's
    u8 x u8 kernels, which widen to 16 bits before multiplying. Its u8 x s8 kernels on x86 without VNNI add two u8 x s8
    products in int16 with saturation (vpmaddubsw, microsoft/onnxruntime
    onnxruntime/core/mlas/lib/x86_64/QgemmU8S8KernelAvx2.S);
    with VNNI (vpdpbusd) they add in int32. With the number of layers rewritten; None where no weight is int8 (a
    weight or zero point computed, or a Constant node's, stays as it is)."""
    inits = {t.name: t for t in model.graph.initializer}
    rewritten, added = [], {}
    for k, node in enumerate(model.graph.node):
        slots = INTEGER_OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if slots is None or len(node.input) <= slots[0] or node.input[slots[0]] not in inits:
            continue
        w, zp = node.input[slots[0]], node.input[slots[1]] if len(node.input) > slots[1] else ""
        if inits[w].data_type != TensorProto.INT8 or (zp and (zp not in inits or inits[zp].data_type != TensorProto.INT8)):
            continue
        rewritten.append((k, slots, w, zp))
    if not rewritten:
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, slots, w, zp in rewritten:
        names = []
        for t, default in ((w, None), (zp, np.int8(0))):
            if (t, default is None) not in added:
                values = lazy.value(inits[t]) if t else default  # a lazy one read where it lies
                shifted = (np.asarray(values, np.int16) + 128).astype(np.uint8)
                name = f"{t or w + '/zero_point'}/uint8"
                out.graph.initializer.append(numpy_helper.from_array(shifted, name))
                added[(t, default is None)] = name
            names.append(added[(t, default is None)])
        copy = out.graph.node[k]  # the node's copy (CopyFrom keeps the order)
        while len(copy.input) <= slots[1]:
            copy.input.append("")
        copy.input[slots[0]], copy.input[slots[1]] = names
    return out, len(rewritten)
