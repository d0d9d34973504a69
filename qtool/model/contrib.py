"""onnxruntime's fused ops (its com.microsoft contrib ops, and its LayerNormalization before opset 17), as
onnxruntime's transformer optimizer and its saved graph optimisations write them, read as the standard ONNX
ops they fuse: the same function of the inputs (up to float rounding), which every export can quantize and every
runtime runs. Without it, their outputs have no type onnx's shape inference knows, so nothing after them is
calibrated, and an Attention's Q/K/V projections sit inside one op: an optimized BERT quantized nothing.

Read (the semantics of onnxruntime's CPU kernels, microsoft/onnxruntime onnxruntime/contrib_ops/cpu/bert/ and
docs/ContribOperators.md):
- Attention: X (B, S, D) times the packed [Wq | Wk | Wv] plus bias, split per qkv_hidden_sizes (equal thirds by
  default) -> num_heads heads, softmax(Q K^T * scale + mask) V, heads merged; scale 1/sqrt(head size) by default.
  The mask: none; a 1-D (B) key length (as EmbedLayerNormalization's mask index or a ReduceSum of the mask makes it:
  keys from that length on masked), or a 2-D (B, T) raw mask (0 masked) or 3-D (B, S, T), masked keys getting
  mask_filter_value added (-10000 by default). Kept as it is: past/present state, unidirectional, rotary, relative
  position bias, packed weights not constant, a 1-D mask of another origin (it may carry start positions).
- MultiHeadAttention: query (B, S, D), key (B, L, D), value (B, L, Dv), the bias (D + D + Dv) added to each, then as
  Attention (its key padding mask and attention bias too). Packed Q/K/V and past state: kept.
- EmbedLayerNormalization: word + position (0..S-1, or position_ids) + segment embeddings, then LayerNorm; its
  mask index output is the count of 1s in the mask per row (embed_layer_norm.cc); the embedding sum output too.
- SkipLayerNormalization / SkipSimplifiedLayerNormalization: LayerNorm / RMSNorm of input + skip (+ bias), the
  sum as the optional fourth output; LayerNormalization / SimplifiedLayerNormalization of onnxruntime's own
  (default domain before opset 17, or com.microsoft) on the last axis.
- Gelu, BiasGelu (erf), FastGelu (tanh approximation, optional bias), QuickGelu (x * sigmoid(alpha x)).
- FusedConv / FusedGemm (activation after, FusedConv's optional Z added before it), FusedMatMul (alpha,
  transA/transB of the last two axes).
A node outside these forms (or whose outputs beyond those above are read) stays as it is.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import graph, lazy, shapes
from .graph import Namer, all_nodes, attr, consumers, default_opset, producers, text_attr

MS = "com.microsoft"
# onnxruntime's LayerNormalization / SimplifiedLayerNormalization kernels registered in the default domain (opset 1)
_ORT_DEFAULT_DOMAIN = {"LayerNormalization", "SimplifiedLayerNormalization"}
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def as_standard(proto: onnx.ModelProto, folder=None) -> tuple[onnx.ModelProto, Counter] | None:
    """(a new model with every fused op of onnxruntime it can read written as standard ops, how many of each) or
    None when there is none (`proto` is not changed). `folder`: where external weights lie when not loaded."""
    opset = default_opset(proto)
    if not any(_candidate(n, opset) for n in proto.graph.node):
        return None
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    done: Counter = Counter()
    for _ in range(3):  # again when a read op typed what a kept one needs (a rank after a FusedGemm)
        more = _Reader(model, folder, opset).run()
        done += more
        if not more or not any(_candidate(n, opset) for n in model.graph.node):
            break
    if not done:
        return None
    if not any(n.domain == MS for n in all_nodes(model.graph)):
        kept = [o for o in model.opset_import if o.domain != MS]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    graph.cleanup(model.graph)
    return model, done


def _candidate(n: onnx.NodeProto, opset: int) -> bool:
    if n.domain == MS:
        return n.op_type in _READERS
    return n.domain in ("", "ai.onnx") and n.op_type in _ORT_DEFAULT_DOMAIN and (n.op_type != "LayerNormalization" or opset < 17)


class _Reader:
    def __init__(self, model: onnx.ModelProto, folder, opset: int):
        self.model, self.g, self.folder, self.opset = model, model.graph, folder, opset
        self.inits = {t.name: t for t in self.g.initializer}
        self.readers = consumers(self.g)
        self.made_by = producers(self.g)
        self.outputs = {o.name for o in self.g.output}
        self.namer = Namer(model)
        self.shapes, self.types = _shapes(model)
        self.dtype = np.dtype(np.float32)  # the float type of the node being read (its first input's)
        self.new_nodes: list[onnx.NodeProto] = []
        self.new_inits: list[TensorProto] = []
        self.base = ""

    def run(self) -> Counter:
        done: Counter = Counter()
        nodes: list[onnx.NodeProto] = []
        for n in self.g.node:
            read = _READERS.get(n.op_type) if _candidate(n, self.opset) else None
            self.new_nodes, self.new_inits, self.base = [], [], n.name or n.output[0]
            elem = self.types.get(n.input[0]) if n.input else None
            self.dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem) if elem in _FLOATS else np.float32)
            if read is not None and read(self, n):
                nodes.extend(self.new_nodes)
                self.g.initializer.extend(self.new_inits)
                done[n.op_type] += 1
            else:
                nodes.append(n)
        if done:
            del self.g.node[:]
            self.g.node.extend(nodes)
        return done

    # ------------------------------------------------------------ reading the graph

    def value(self, name: str) -> np.ndarray | None:
        t = self.inits.get(name)
        return None if t is None else lazy.read_value(t, self.folder)

    def used(self, name: str) -> bool:
        return bool(name) and (name in self.outputs or bool(self.readers.get(name)))

    @staticmethod
    def given(n: onnx.NodeProto, i: int) -> str:
        return n.input[i] if len(n.input) > i else ""

    @staticmethod
    def given_out(n: onnx.NodeProto, i: int) -> str:
        return n.output[i] if len(n.output) > i else ""

    # ------------------------------------------------------------ writing

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.namer.fresh(f"{self.base}/{op_type}_output")
        self.new_nodes.append(helper.make_node(op_type, inputs, [out], name=self.namer.fresh(f"{self.base}/{op_type}"), **attrs))
        return out

    def rank(self, name: str) -> int | None:
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def const(self, value, dtype=None, what: str = "const") -> str:
        """An initializer of `value`, of the node's float type unless `dtype` says otherwise."""
        name = self.namer.fresh(f"{self.base}/{what}")
        self.new_inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype or self.dtype), name))
        return name

    def axes_op(self, op_type: str, x: str, axes: list[int], out: str | None = None, **attrs) -> str:
        """Unsqueeze / ReduceMean / ReduceSum over `axes`, as an attribute or an input by the model's opset."""
        as_input = self.opset >= (18 if op_type == "ReduceMean" else 13)
        if as_input:
            return self.op(op_type, [x, self.const(axes, np.int64, "axes")], out, **attrs)
        return self.op(op_type, [x], out, axes=axes, **attrs)

    def layer_norm(self, x: str, gamma: str, beta: str, eps: float, out: str, simplified: bool = False) -> str:
        """LayerNorm (or RMSNorm) over the last axis: the standard op from opset 17, else its decomposition (as
        torch exports it before 17)."""
        if not simplified and self.opset >= 17:
            return self.op("LayerNormalization", [x, gamma] + ([beta] if beta else []), out, axis=-1, epsilon=eps)
        if simplified:
            d = x
        else:
            d = self.op("Sub", [x, self.axes_op("ReduceMean", x, [-1])])
        var = self.axes_op("ReduceMean", self.op("Pow", [d, self.const(2.0)]), [-1])
        normed = self.op("Div", [d, self.op("Sqrt", [self.op("Add", [var, self.const(eps)])])])
        if not beta:
            return self.op("Mul", [normed, gamma], out)
        return self.op("Add", [self.op("Mul", [normed, gamma]), beta], out)

    def gelu(self, x: str, out: str) -> str:
        """0.5 x (1 + erf(x / sqrt 2)), as torch exports it."""
        erf = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [erf, self.const(1.0)])]), self.const(0.5)], out)

    def activation(self, x: str, kind: str, params: list[float], out: str) -> str | None:
        if kind == "Relu" or kind == "Tanh" or kind == "Sigmoid":
            return self.op(kind, [x], out)
        if kind == "LeakyRelu":
            return self.op(kind, [x], out, alpha=params[0] if params else 0.01)
        if kind == "HardSigmoid":
            return self.op(kind, [x], out, alpha=params[0] if params else 0.2, beta=params[1] if len(params) > 1 else 0.5)
        if kind == "Clip" and len(params) == 2:
            if self.opset >= 11:
                return self.op("Clip", [x, self.const(params[0]), self.const(params[1])], out)
            return self.op("Clip", [x], out, min=params[0], max=params[1])
        return None


def _shapes(model: onnx.ModelProto) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """Each tensor's shape (None for a symbolic dimension) and element type, where onnx's shape inference or the model
    gives them."""
    inferred = shapes.inferred(model) or model
    g = inferred.graph
    dims, types = {}, {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        types[vi.name] = tt.elem_type
        if tt.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for t in model.graph.initializer:
        dims[t.name], types[t.name] = list(t.dims), t.data_type
    return dims, types


# ---------------------------------------------------------------- one reader per op: True when written


def _gelu(r: _Reader, n: onnx.NodeProto) -> bool:
    x = n.input[0]
    if n.op_type == "BiasGelu":
        x = r.op("Add", [x, n.input[1]])
    r.gelu(x, n.output[0])
    return True


def _fast_gelu(r: _Reader, n: onnx.NodeProto) -> bool:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) of x (+ bias)."""
    x = n.input[0] if not r.given(n, 1) else r.op("Add", [n.input[0], n.input[1]])
    cube = r.op("Mul", [r.op("Mul", [x, x]), x])
    inner = r.op("Mul", [r.op("Add", [x, r.op("Mul", [cube, r.const(0.044715)])]), r.const(math.sqrt(2.0 / math.pi))])
    one_plus = r.op("Add", [r.op("Tanh", [inner]), r.const(1.0)])
    r.op("Mul", [r.op("Mul", [x, one_plus]), r.const(0.5)], n.output[0])
    return True


def _quick_gelu(r: _Reader, n: onnx.NodeProto) -> bool:
    x, alpha = n.input[0], float(attr(n, "alpha", 1.702))
    r.op("Mul", [x, r.op("Sigmoid", [r.op("Mul", [x, r.const(alpha)])])], n.output[0])
    return True


def _layer_norm(r: _Reader, n: onnx.NodeProto) -> bool:
    """onnxruntime's own LayerNormalization / SimplifiedLayerNormalization: the last axis only, Y only."""
    rank = r.rank(n.input[0])
    axis = int(attr(n, "axis", -1))
    if rank is None and axis != -1 or rank is not None and axis not in (-1, rank - 1):
        return False
    if any(r.used(o) for o in n.output[1:]):
        return False
    simplified = n.op_type == "SimplifiedLayerNormalization"
    r.layer_norm(n.input[0], n.input[1], "" if simplified else r.given(n, 2), float(attr(n, "epsilon", 1e-5)), n.output[0],
                 simplified=simplified)
    return True


def _skip_layer_norm(r: _Reader, n: onnx.NodeProto) -> bool:
    """LayerNorm (RMSNorm) of input + skip (+ bias); the sum as output 3. Mean and inverse deviation outputs: kept."""
    if any(r.used(o) for o in n.output[1:3]):
        return False
    simplified = n.op_type == "SkipSimplifiedLayerNormalization"
    beta, bias = ("", r.given(n, 3)) if simplified else (r.given(n, 3), r.given(n, 4))
    total_out = n.output[3] if len(n.output) > 3 and r.used(n.output[3]) else None
    total = r.op("Add", [n.input[0], n.input[1]], None if bias else total_out)
    if bias:
        total = r.op("Add", [total, bias], total_out)
    r.layer_norm(total, n.input[2], beta, float(attr(n, "epsilon", 1e-12)), n.output[0], simplified=simplified)
    return True


def _embed_layer_norm(r: _Reader, n: onnx.NodeProto) -> bool:
    ids, segment, word, position, seg_table = (r.given(n, i) for i in range(5))
    gamma, beta, mask, position_ids = r.given(n, 5), r.given(n, 6), r.given(n, 7), r.given(n, 8)
    if int(attr(n, "mask_index_type", 1)) != 1 and r.used(r.given_out(n, 1)):
        return False
    emb = r.op("Gather", [word, ids], axis=0)
    if position_ids:
        pos = r.op("Gather", [position, position_ids], axis=0)
    else:
        length = r.op("Gather", [r.op("Shape", [ids]), r.const(1, np.int64, "axis1")], axis=0)
        pos = r.op("Gather", [position, r.op("Range", [r.const(0, np.int64, "zero"), length, r.const(1, np.int64, "one")])], axis=0)
    emb = r.op("Add", [emb, pos])
    if segment and seg_table:
        emb = r.op("Add", [emb, r.op("Gather", [seg_table, segment], axis=0)])
    if len(n.output) > 2 and r.used(n.output[2]):
        emb = r.op("Identity", [emb], n.output[2])
    r.layer_norm(emb, gamma, beta, float(attr(n, "epsilon", 1e-12)), n.output[0])
    index = r.given_out(n, 1)
    if r.used(index):
        if mask:
            ones = r.op("Cast", [r.op("Equal", [r.op("Cast", [mask], to=TensorProto.INT32), r.const(1, np.int32, "one")])],
                        to=TensorProto.INT32)
            r.axes_op("ReduceSum", ones, [1], index, keepdims=0)
        else:  # no mask: zeros, one per row
            rows = r.op("Slice", [r.op("Shape", [ids]), r.const([0], np.int64, "start"), r.const([1], np.int64, "end")])
            r.op("ConstantOfShape", [rows], index, value=numpy_helper.from_array(np.zeros(1, np.int32)))
    return True


def _mask_rank(r: _Reader, mask: str) -> int | None:
    """A key mask's rank when the reading knows its form: a key length per row (1-D, as EmbedLayerNormalization or a
    ReduceSum of the mask makes it; other 1-D forms carry start positions too), or a raw (B, T) / (B, S, T) mask."""
    made = r.made_by.get(mask)
    if made is not None and made.op_type in ("EmbedLayerNormalization", "ReduceSum"):
        return 1
    rank = r.rank(mask)
    return rank if rank in (2, 3) else None


def _attend(r: _Reader, n: onnx.NodeProto, q: str, k: str, v: str, heads: int, sizes: list[int], mask: str, extra: str) -> None:
    """softmax(Q K^T * scale + mask (+ extra)) V over `heads` heads of the (B, S, D) tensors q, k, v; the merged heads
    (B, S, Dv) written as n's output."""
    head_q, head_v = sizes[0] // heads, sizes[2] // heads
    scale = float(attr(n, "scale", 0.0) or 1.0 / math.sqrt(head_q))
    split = []
    for t, head, perm in ((q, head_q, [0, 2, 1, 3]), (k, head_q, [0, 2, 3, 1]), (v, head_v, [0, 2, 1, 3])):
        t = r.op("Reshape", [t, r.const([0, 0, heads, head], np.int64, "heads")])
        split.append(r.op("Transpose", [t], perm=perm))
    scores = r.op("Mul", [r.op("MatMul", [split[0], split[1]]), r.const(scale, what="scale")])
    if mask:
        rank = _mask_rank(r, mask)
        if rank == 1:  # key lengths (B): keys at that position or later masked
            keys = r.op("Gather", [r.op("Shape", [k]), r.const(1, np.int64, "axis1")], axis=0)
            positions = r.op("Range", [r.const(0, np.int64, "zero"), keys, r.const(1, np.int64, "one")])
            lengths = r.axes_op("Unsqueeze", r.op("Cast", [mask], to=TensorProto.INT64), [1])
            keep = r.axes_op("Unsqueeze", r.op("Less", [positions, lengths]), [1, 2])
        else:  # a raw mask, (B, T) or (B, S, T): 0 masked
            keep = r.axes_op("Unsqueeze", r.op("Cast", [mask], to=TensorProto.BOOL), [1, 2] if rank == 2 else [1])
        fill = float(attr(n, "mask_filter_value", -10000.0))
        scores = r.op("Add", [scores, r.op("Where", [keep, r.const(0.0, what="zero"), r.const(fill, what="mask_filter_value")])])
    if extra:
        scores = r.op("Add", [scores, extra])
    probs = r.op("Softmax", [scores], axis=-1)
    context = r.op("Transpose", [r.op("MatMul", [probs, split[2]])], perm=[0, 2, 1, 3])
    r.op("Reshape", [context, r.const([0, 0, sizes[2]], np.int64, "merged")], n.output[0])


def _attention(r: _Reader, n: onnx.NodeProto) -> bool:
    """Attention(input, packed weight, bias, mask index): one MatMul (+ Add) per projection, then _attend."""
    x, packed, bias, mask = n.input[0], r.given(n, 1), r.given(n, 2), r.given(n, 3)
    heads = int(attr(n, "num_heads", 0))
    if (any(r.given(n, i) for i in range(4, len(n.input))) or any(r.used(o) for o in n.output[1:]) or attr(n, "unidirectional", 0)
            or attr(n, "do_rotary", 0) or heads <= 0 or (mask and _mask_rank(r, mask) is None)):
        return False
    w = r.value(packed)
    b = r.value(bias) if bias else None
    if w is None or w.ndim != 2 or (bias and (b is None or b.shape != (w.shape[1],))):
        return False
    sizes = list(attr(n, "qkv_hidden_sizes", None) or [w.shape[1] // 3] * 3)
    if len(sizes) != 3 or sum(sizes) != w.shape[1] or any(s % heads for s in sizes) or sizes[0] != sizes[1]:
        return False
    starts = np.cumsum([0] + sizes)
    projected = []
    for k, what in enumerate("qkv"):
        y = r.op("MatMul", [x, r.const(w[:, starts[k]:starts[k + 1]], w.dtype, f"W{what}")])
        if b is not None:
            y = r.op("Add", [y, r.const(b[starts[k]:starts[k + 1]], b.dtype, f"b{what}")])
        projected.append(y)
    _attend(r, n, *projected, heads, sizes, mask, "")
    return True


def _multi_head_attention(r: _Reader, n: onnx.NodeProto) -> bool:
    """MultiHeadAttention(query, key, value, bias, key padding mask, attention bias), each of query/key/value (B, *, D):
    the bias added per projection, then _attend. Packed Q/K/V, past state and unidirectional: kept."""
    q, k, v, bias, mask, extra = (r.given(n, i) for i in range(6))
    heads = int(attr(n, "num_heads", 0))
    if (any(r.given(n, i) for i in range(6, len(n.input))) or any(r.used(o) for o in n.output[1:]) or attr(n, "unidirectional", 0)
            or heads <= 0 or not (k and v) or (mask and _mask_rank(r, mask) is None)):
        return False
    shapes = [r.shapes.get(t) for t in (q, k, v)]
    if any(s is None or len(s) != 3 or s[-1] is None for s in shapes):
        return False
    sizes = [s[-1] for s in shapes]
    if sizes[0] != sizes[1] or any(s % heads for s in sizes):
        return False
    if bias:
        b = r.value(bias)
        if b is None or b.shape != (sum(sizes),):
            return False
        starts = np.cumsum([0] + sizes)
        q, k, v = (r.op("Add", [t, r.const(b[starts[i]:starts[i + 1]], b.dtype, f"b{'qkv'[i]}")]) for i, t in enumerate((q, k, v)))
    _attend(r, n, q, k, v, heads, sizes, mask, extra)
    return True


def _fused_conv(r: _Reader, n: onnx.NodeProto) -> bool:
    kind = text_attr(n, "activation", "")
    params = [float(p) for p in (attr(n, "activation_params", None) or [])]
    keep = {a.name: helper.get_attribute_value(a) for a in n.attribute if a.name not in ("activation", "activation_params")}
    if "auto_pad" in keep and isinstance(keep["auto_pad"], bytes):
        keep["auto_pad"] = keep["auto_pad"].decode()
    z = r.given(n, 3)
    final = n.output[0] if not kind and not z else None
    y = r.op("Conv", list(n.input[:2]) + ([n.input[2]] if r.given(n, 2) else []), final, **keep)
    if z:
        y = r.op("Add", [y, z], n.output[0] if not kind else None)
    if kind:
        if r.activation(y, kind, params, n.output[0]) is None:
            return False
    return True


def _fused_gemm(r: _Reader, n: onnx.NodeProto) -> bool:
    kind = text_attr(n, "activation", "")
    params = [float(attr(n, f"activation_{p}", d)) for p, d in (("alpha", 0.01), ("beta", 0.5))]
    if kind == "Clip":
        return False  # its bounds are activation_alpha/beta only in some versions: kept
    keep = {a: attr(n, a) for a in ("alpha", "beta", "transA", "transB") if attr(n, a) is not None}
    y = r.op("Gemm", list(n.input), None if kind else n.output[0], **keep)
    if kind and r.activation(y, kind, params[:1] if kind == "LeakyRelu" else params, n.output[0]) is None:
        return False
    return True


def _fused_matmul(r: _Reader, n: onnx.NodeProto) -> bool:
    if attr(n, "transBatchA", 0) or attr(n, "transBatchB", 0):
        return False
    inputs = []
    for i, flag in ((0, "transA"), (1, "transB")):
        t = n.input[i]
        if attr(n, flag, 0):
            rank = r.rank(t)
            if rank is None or rank < 2:
                return False
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            t = r.op("Transpose", [t], perm=perm)
        inputs.append(t)
    alpha = float(attr(n, "alpha", 1.0))
    y = r.op("MatMul", inputs, n.output[0] if alpha == 1.0 else None)
    if alpha != 1.0:
        r.op("Mul", [y, r.const(alpha)], n.output[0])
    return True


_READERS = {
    "Attention": _attention,
    "MultiHeadAttention": _multi_head_attention,
    "EmbedLayerNormalization": _embed_layer_norm,
    "SkipLayerNormalization": _skip_layer_norm,
    "SkipSimplifiedLayerNormalization": _skip_layer_norm,
    "LayerNormalization": _layer_norm,
    "SimplifiedLayerNormalization": _layer_norm,
    "Gelu": _gelu,
    "BiasGelu": _gelu,
    "FastGelu": _fast_gelu,
    "QuickGelu": _quick_gelu,
    "FusedConv": _fused_conv,
    "FusedGemm": _fused_gemm,
    "FusedMatMul": _fused_matmul,
}
