"""A model onnxruntime quantized statically in its QOperator format (quantize_static with QuantFormat.QOperator: QLinearConv,
QLinearMatMul and com.microsoft QGemm, QLinearAdd, ...), read in the Q/DQ form that computes the same arithmetic: each
QLinear layer becomes its float op on the dequantized inputs and weights, its output quantized by a QuantizeLinear to the
layer's own output grid and read back by a DequantizeLinear. The model is then a Q/DQ model (qtool.model.prequantized):
its own quantizers are kept, and nothing is quantized twice.

The semantics are onnxruntime's (ONNX Operators.md QLinearConv / QLinearMatMul; onnxruntime docs/ContribOperators.md
for the com.microsoft ops; the patterns of onnxruntime/python/tools/quantization/operators/*.py):
- QLinearConv(x, xs, xzp, w, ws, wzp, ys, yzp, B): Conv of the dequantized x and w plus B, an int32 bias on the grid
  xs * ws (zero point 0), then quantized to (ys, yzp);
- QLinearMatMul(a, as, azp, b, bs, bzp, ys, yzp): MatMul of the dequantized a and b (b per column: its last axis);
- QGemm(A, as, azp, B, bs, bzp, C, ys, yzp; alpha, transA, transB): Gemm, C an int32 bias on alpha * as * bs;
  without ys the output is float;
- QLinearAdd / QLinearMul / QLinearConcat / QLinearGlobalAveragePool / QLinearAveragePool / QLinearSigmoid /
  QLinearLeakyRelu / QLinearSoftmax: the float op, its output quantized;
- an op that moves the integer codes (Reshape, Transpose, MaxPool, Gather, Split, Resize, Pad ...: onnxruntime's
  "direct 8-bit" ops) computes on the dequantized values; its output stays on its input's grid.
A model holding any other quantized operator (QAttention, QEmbedLayerNormalization, NHWC kernels, ...), a layer whose
scales are not constants, or integer codes read by an op outside these is not read (None): qtool.model.dynamic then
refuses it by name.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from . import dynamic, graph, lazy, prequantized
from .graph import Namer, attr, default_opset

MS = "com.microsoft"
# ops computing on the codes' values alone (a code moved, picked or compared): the same on the dequantized values
_MOVES = prequantized.PASSES | {"Pad", "Resize", "Upsample", "ReduceMax", "ReduceMin"}
# ops reading codes whose output is no value on a grid (indices, shapes): the same on the dequantized values
_READS = {"Shape", "Size", "ArgMax", "ArgMin"}
_ATTRS_POOL = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


def as_qdq(proto: onnx.ModelProto, folder=None) -> tuple[onnx.ModelProto, Counter] | None:
    """(a new model with every QOperator layer of `proto` written in the Q/DQ form, how many of each op) or None when
    it holds none, or anything this reading does not cover (`proto` is not changed)."""
    if not any(_is_qlinear(n) for n in proto.graph.node):
        return None
    if any(dynamic.quantized_op(n) and n.op_type not in _READERS for n in proto.graph.node):
        return None  # another quantized operator (QAttention, an NHWC kernel, ...): not read
    if any(_is_qlinear(k) for n in proto.graph.node for sub in graph.subgraphs(n) for k in graph.all_nodes(sub)):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    try:
        done = _Reader(model, folder).run()
    except _NeedsOpset13:  # per-channel weights before opset 13: read at 13 (onnx's version converter), or not at all
        try:
            model = version_converter.convert_version(proto, 13)
            done = _Reader(model, folder).run()
        except Exception:
            return None
    except _NotRead:
        return None
    if not any(n.domain == MS for n in graph.all_nodes(model.graph)):
        kept = [o for o in model.opset_import if o.domain != MS]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    graph.cleanup(model.graph)
    graph.toposort(model.graph)
    return model, done


def _is_qlinear(n: onnx.NodeProto) -> bool:
    return (n.domain in ("", "ai.onnx") and n.op_type in ("QLinearConv", "QLinearMatMul")) or (
        n.domain == MS and (n.op_type == "QGemm" or n.op_type.startswith("QLinear")))


class _NotRead(Exception):
    """Something outside the patterns above: the model is left as it is."""


class _NeedsOpset13(_NotRead):
    """A per-axis DequantizeLinear (per-channel weights) in a model before opset 13."""


class _Reader:
    def __init__(self, model: onnx.ModelProto, folder):
        self.g, self.folder = model.graph, folder
        self.opset = default_opset(model)
        self.inits = {t.name: t for t in self.g.initializer}
        self.outputs = {o.name for o in self.g.output}
        self.namer = Namer(model)
        self.floats: dict[str, str] = {}  # an integer tensor -> the tensor holding its dequantized values
        self.codes: set[str] = set()  # integer tensors that still exist (a QuantizeLinear's)
        self.grids: dict[str, tuple[str, str]] = {}  # each of those float tensors -> its grid's (scale, zero point)
        self.nodes: list[onnx.NodeProto] = []
        self.base = ""

    def run(self) -> Counter:
        done: Counter = Counter()
        for n in list(self.g.node):
            self.base = n.name or n.output[0]
            if _is_qlinear(n):
                read = _READERS.get(n.op_type)
                if read is None:
                    raise _NotRead
                read(self, n)
                done[n.op_type] += 1
            elif n.op_type == "QuantizeLinear" and n.input[0] not in self.inits:
                self.nodes.append(n)
                self.quantized(n.output[0], n.input[1], n.input[2] if len(n.input) > 2 else "", attr(n, "axis"))
            elif n.op_type == "DequantizeLinear" and n.input[0] in self.floats:
                self.dequantized(n)
            elif n.input and n.input[0] in self.floats and n.op_type in _MOVES | _READS:
                self.moved(n)
            elif any(i in self.floats and i not in self.codes for i in n.input):
                raise _NotRead  # codes read by an op that computes on them
            else:
                self.nodes.append(n)
        del self.g.node[:]
        self.g.node.extend(self.nodes)
        return done

    # ------------------------------------------------------------ reading

    def value(self, name: str) -> np.ndarray | None:
        t = self.inits.get(name)
        return None if t is None else lazy.read_value(t, self.folder)

    def scale(self, name: str) -> np.ndarray:
        v = self.value(name)
        if v is None or not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise _NotRead  # a scale computed in the graph, or none a grid can have
        return v.astype(np.float32)

    # ------------------------------------------------------------ writing

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.namer.fresh(f"{self.base}/{op_type}_output")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.namer.fresh(f"{self.base}/{op_type}"), **attrs))
        return out

    def const(self, value: np.ndarray, what: str) -> str:
        name = self.namer.fresh(f"{self.base}/{what}")
        self.g.initializer.append(numpy_helper.from_array(value, name))
        return name

    def dq(self, x: str, scale: str, zp: str, axis: int | None = None) -> str:
        if axis is not None and self.opset < 13:
            raise _NeedsOpset13
        inputs = [x, scale] + ([zp] if zp else [])
        return self.op("DequantizeLinear", inputs, **({"axis": axis} if axis is not None else {}))

    def quantized(self, codes: str, scale: str, zp: str, axis: int | None = None) -> None:
        """`codes` (a QuantizeLinear's output, kept) read back as float by a DequantizeLinear on the same grid."""
        self.codes.add(codes)
        self.floats[codes] = self.dq(codes, scale, zp, axis)
        if axis is None:
            self.grids[self.floats[codes]] = (scale, zp)

    def activation(self, x: str, scale: str, zp: str) -> str:
        """A layer's quantized input as float: the dequantized values it stands for."""
        if x in self.floats:
            return self.floats[x]
        if x in self.inits:
            return self.weight(x, scale, zp, None)
        self.scale(scale)
        return self.dq(x, scale, zp)  # e.g. a graph input given as codes

    def weight(self, w: str, scale: str, zp: str, axis: int | None) -> str:
        s = self.scale(scale)
        if self.value(w) is None or (zp and self.value(zp) is None):
            raise _NotRead
        return self.dq(w, scale, zp, axis if s.size > 1 else None)

    def bias(self, b: str, scale: np.ndarray) -> str:
        """An int32 bias on the grid `scale` (zero point 0), dequantized by a DequantizeLinear."""
        if self.value(b) is None:
            raise _NotRead
        scale = scale.astype(np.float32).reshape(-1)
        return self.dq(b, self.const(scale if scale.size > 1 else scale.reshape(()), "bias_scale"), "",
                       0 if scale.size > 1 else None)

    def output(self, y: str, raw: str, n: onnx.NodeProto, scale_slot: int) -> None:
        """The float result `raw` of layer `n` quantized to its output grid (inputs scale_slot, scale_slot + 1) as `y`."""
        scale, zp = n.input[scale_slot], n.input[scale_slot + 1] if len(n.input) > scale_slot + 1 else ""
        self.scale(scale)
        self.op("QuantizeLinear", [raw, scale] + ([zp] if zp else []), y)
        self.quantized(y, scale, zp)

    def dequantized(self, n: onnx.NodeProto) -> None:
        """A DequantizeLinear of codes whose float values the reading holds: those values."""
        x, f = n.input[0], self.floats[n.input[0]]
        same = self.grids.get(f) == (n.input[1], n.input[2] if len(n.input) > 2 else "") and not attr(n, "axis")
        if x in self.codes and not same:
            self.nodes.append(n)  # the codes exist: read them as the model does
        elif n.output[0] in self.outputs or not same:
            self.op("Identity", [f], n.output[0])
        else:
            graph.rename_reads(self.g, n.output[0], f)  # the reading's own DequantizeLinear already gives them

    def moved(self, n: onnx.NodeProto) -> None:
        """An op moving codes (or reading indices from them) computed on their dequantized values."""
        inputs = list(n.input)
        inputs[0] = self.floats[n.input[0]]
        if n.op_type == "Pad" and len(n.input) > 2 and n.input[2]:
            inputs[2] = self.pad_value(n)
        grid = self.grids.get(inputs[0])
        if n.op_type in _READS:
            outputs = list(n.output)
        else:
            if grid is None:
                raise _NotRead  # codes on a grid per axis, moved: not followed
            outputs = [self.namer.fresh(f"{o}/float") if o else "" for o in n.output]
            for o, f in zip(n.output, outputs):
                if o:
                    if o in self.outputs:
                        raise _NotRead  # codes the model gives out: not made here
                    self.floats[o], self.grids[f] = f, grid
        node = helper.make_node(n.op_type, inputs, outputs, name=n.name, domain=n.domain)
        node.attribute.extend(n.attribute)
        self.nodes.append(node)
        if n.op_type == "Pad" or (n.op_type in ("Resize", "Upsample") and graph.text_attr(n, "mode", "nearest") != "nearest"):
            # an interpolation of codes is rounded to codes again (on the input's grid); padded codes are codes, quantized
            # again as onnxruntime's Q/DQ format writes it: OpenVINO's CPU plugin pads a shifted u8 grid's FakeQuantize
            # -> Pad(0) -> AveragePool with code 0, not the zero point (docs/benchmarks.md#qoperator)
            for o in n.output:
                codes = self.namer.fresh(f"{o}/codes")
                self.op("QuantizeLinear", [self.floats[o], *[t for t in grid if t]], codes)
                self.quantized(codes, *grid)
                self.floats[o] = self.floats[codes]

    def pad_value(self, n: onnx.NodeProto) -> str:
        """A Pad's constant value (a code) as the float value it stands for, on the grid of the DequantizeLinear that
        reads the padded tensor's input."""
        grid = self.grids.get(self.floats[n.input[0]])
        code = self.value(n.input[2])
        if grid is None or code is None:
            raise _NotRead
        scale, zp = self.scale(grid[0]), self.value(grid[1]) if grid[1] else np.zeros(())
        if scale.size != 1 or zp is None:
            raise _NotRead
        return self.const(((code.astype(np.float64) - float(zp.reshape(-1)[0])) * float(scale.reshape(-1)[0])).astype(np.float32),
                          "pad_value")


# ---------------------------------------------------------------- one reader per QLinear op


def _conv(r: _Reader, n: onnx.NodeProto) -> None:
    x = r.activation(n.input[0], n.input[1], n.input[2])
    w = r.weight(n.input[3], n.input[4], n.input[5], 0)
    inputs = [x, w]
    if len(n.input) > 8 and n.input[8]:
        inputs.append(r.bias(n.input[8], r.scale(n.input[1]).reshape(-1)[0] * r.scale(n.input[4])))
    conv = helper.make_node("Conv", inputs, [r.namer.fresh(f"{r.base}/Conv_output")], name=r.namer.fresh(f"{r.base}/Conv"))
    conv.attribute.extend(n.attribute)
    r.nodes.append(conv)
    r.output(n.output[0], conv.output[0], n, 6)


def _matmul(r: _Reader, n: onnx.NodeProto) -> None:
    a = r.activation(n.input[0], n.input[1], n.input[2])
    b = (r.weight(n.input[3], n.input[4], n.input[5], -1) if n.input[3] in r.inits
         else r.activation(n.input[3], n.input[4], n.input[5]))
    r.output(n.output[0], r.op("MatMul", [a, b]), n, 6)


def _gemm(r: _Reader, n: onnx.NodeProto) -> None:
    alpha = float(attr(n, "alpha", 1.0))
    trans_b = int(attr(n, "transB", 0))
    a = r.activation(n.input[0], n.input[1], n.input[2])
    zp_b = n.input[5] if len(n.input) > 5 else ""
    b = (r.weight(n.input[3], n.input[4], zp_b, 0 if trans_b else 1) if n.input[3] in r.inits
         else r.activation(n.input[3], n.input[4], zp_b))
    inputs = [a, b]
    if len(n.input) > 6 and n.input[6]:
        inputs.append(r.bias(n.input[6], alpha * r.scale(n.input[1]).reshape(-1)[0] * r.scale(n.input[4])))
    keep = {k: attr(n, k) for k in ("alpha", "transA", "transB") if attr(n, k) is not None}
    quantized = len(n.input) > 7 and n.input[7]
    raw = r.op("Gemm", inputs, None if quantized else n.output[0], **keep)
    if quantized:
        r.output(n.output[0], raw, n, 7)


def _binary(r: _Reader, n: onnx.NodeProto) -> None:
    a = r.activation(n.input[0], n.input[1], n.input[2])
    b = r.activation(n.input[3], n.input[4], n.input[5])
    r.output(n.output[0], r.op(n.op_type[len("QLinear"):], [a, b]), n, 6)


def _concat(r: _Reader, n: onnx.NodeProto) -> None:
    rest = list(n.input[2:])
    if len(rest) % 3:
        raise _NotRead
    parts = [r.activation(*rest[i:i + 3]) for i in range(0, len(rest), 3)]
    r.output(n.output[0], r.op("Concat", parts, axis=int(attr(n, "axis"))), n, 0)


def _unary(r: _Reader, n: onnx.NodeProto) -> None:
    if attr(n, "channels_last", 0):
        raise _NotRead
    x = r.activation(n.input[0], n.input[1], n.input[2])
    kind = n.op_type[len("QLinear"):]
    keep = {}
    if kind == "AveragePool":
        keep = {a: attr(n, a) for a in _ATTRS_POOL if attr(n, a) is not None}
        if isinstance(keep.get("auto_pad"), bytes):
            keep["auto_pad"] = keep["auto_pad"].decode()
    elif kind == "LeakyRelu":
        keep = {"alpha": float(attr(n, "alpha", 0.01))}
    elif kind == "Softmax":
        axis = int(attr(n, "axis", -1 if int(attr(n, "opset", r.opset)) >= 13 else 1))
        if int(attr(n, "opset", r.opset)) < 13 <= r.opset and axis != -1:
            # Softmax before opset 13: over the input flattened to 2-D at `axis`, shaped back
            flat = r.op("Softmax", [r.op("Flatten", [x], axis=axis)], axis=-1)
            r.output(n.output[0], r.op("Reshape", [flat, r.op("Shape", [x])]), n, 3)
            return
        if int(attr(n, "opset", r.opset)) >= 13 > r.opset and axis != -1:
            raise _NotRead
        keep = {"axis": axis}
    r.output(n.output[0], r.op(kind, [x], **keep), n, 3)


_READERS = {
    "QLinearConv": _conv,
    "QLinearMatMul": _matmul,
    "QGemm": _gemm,
    "QLinearAdd": _binary,
    "QLinearMul": _binary,
    "QLinearConcat": _concat,
    "QLinearGlobalAveragePool": _unary,
    "QLinearAveragePool": _unary,
    "QLinearSigmoid": _unary,
    "QLinearLeakyRelu": _unary,
    "QLinearSoftmax": _unary,
}
