"""Where quantizers go: NNCF's CPU placement, as data the exporters turn into nodes.

Rules (openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py, quantizer propagation and
the OpenVINO fused/ignored patterns in src/nncf/openvino/hardware/fused_patterns.py and
src/nncf/openvino/quantization/ignored_patterns.py; reference section 5):

* Conv, ConvTranspose, MatMul, Gemm: the data input(s) per tensor and the constant weight per
  output channel. Such a layer computes in int8 only if every input is quantized, so when one
  cannot be (not calibrated, excluded, shape-derived) the layer keeps all its inputs in FP32.
* Element-wise Add/Sub/Mul/Div/Max/Min: both inputs, when both carry data. Not when the op is
  part of an activation or normalisation of a single tensor, which OpenVINO fuses into one op
  (x*sigmoid(x) -> Swish, x*HardSigmoid(x) / x*clip(x+3,0,6)/6 -> HSwish, GELU, a decomposed
  LayerNorm). The gating Mul of a squeeze-excitation block is quantized like any other
  (NNCF's SE_BLOCK pattern marks it PATTERN_NODE_TO_EXCLUDE: left out of the ignored nodes),
  so every reader of the block input reads one quantized tensor.
* Ignored patterns (NNCF src/nncf/openvino/quantization/ignored_patterns.py and
  src/nncf/onnx/quantization/ignored_patterns.py; on by default, `ignored_patterns=False` turns
  them off): the nodes of these subgraphs get no quantizer on their inputs, so their linear
  layers stay FP32: the gating path of a squeeze-excitation block (ReduceMean/GlobalAveragePool
  -> Conv/Gemm/MatMul [+ bias] -> activation -> Conv/Gemm/MatMul [+ bias] -> Sigmoid or
  relu6(x + 3) / 6 -> Mul, as NNCF matches it on the OpenVINO graph (an ONNX HardSigmoid
  stays OpenVINO's HardSigmoid, not HSigmoid, so NNCF quantizes such blocks, e.g. PP-OCR's);
  the pool and the Mul are not part of it), the attention output (Softmax [-> Reshape] -> MatMul with
  V from Reshape/Transpose/Split/Gather/Squeeze/Concat), rotary position embeddings
  (MatMul [-> Transpose] -> Concat -> Sin, Cos) and SAM's positional embedding
  (MatMul -> Mul -> Sin, Cos -> Concat).
* Depthwise Conv (one input channel per group): its data input per channel (NNCF's CPU setup
  gives DEPTHWISE_CONVOLUTION the per-channel activation space q8_a_ch, with min-max ranges per
  channel), when the calibration file has the per-channel max |x| and no other op reads the
  quantized tensor; per tensor otherwise.
* AveragePool, GlobalAveragePool, ReduceMean, Resize: the data input; not the ReduceMean of squares
  in a decomposed LayerNorm (OpenVINO fuses the normalisation into MVN, whose input NNCF
  quantizes), and the centring Sub(x, ReduceMean(x)) reads the same quantized x as the mean.
* Shape/index tensors and tensors that do not depend on the input (decode grids) never.
* MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice, Split pass ranges through: when everything that reads their output wants it quantized, the
  quantizer moves up to their input (one quantizer, the op runs on integers). Concat does the
  same for all its inputs, which then share one range (NNCF's unified scales), the Concat
  output's calibrated range.
* One quantizer per tensor, whatever the number of readers; only readers that asked for the
  quantized tensor read it.

Ranges: activations from the calibration file (amax, unsigned); weights from the weights
(qtool.quant). The result is a `Plan`; exporters add FakeQuantize or Q/DQ nodes from it.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from . import graph as G
from . import model as M
from . import quant
from .errors import QtoolError

LINEAR = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Max", "Min"}
POOLING = {"AveragePool", "GlobalAveragePool", "ReduceMean", "Resize"}
PASS_THROUGH = {"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Identity"}
# Ops that make up activation functions and normalisations of one tensor (walked through when
# deciding whether an element-wise op only combines a tensor with a function of itself).
_ACTIVATION_PARTS = {
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Exp", "Log", "Sqrt",
    "Reciprocal", "Neg", "Abs", "Clip", "Softplus", "Elu", "Selu", "Gelu", "Mish", "Pow", "Identity",
    "Add", "Sub", "Mul", "Div", "Max", "Min", "ReduceMean", "ReduceSumSquare", "ReduceSum", "ReduceL2",
}
_WALK_LIMIT = 24
_QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "FakeQuantize", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}  # nodes visited when recognising an activation pattern


@dataclass
class Range:
    amax: float
    unsigned: bool


@dataclass
class ActivationSite:
    """One quantizer on `tensor`, read by `readers` (node name, input slot): per tensor, or per
    channel (axis 1 of a rank-`rank` tensor) when `channel_amax` is set."""

    tensor: str
    elem_type: int
    range: Range
    readers: list[tuple[str, int]] = field(default_factory=list)
    shared_with: list[str] = field(default_factory=list)  # tensors in the same range group
    channel_amax: np.ndarray | None = None
    rank: int | None = None

    def params(self) -> quant.QParams:
        if self.channel_amax is None:
            return quant.activation_params(self.range.amax, self.range.unsigned)
        g = quant.grid(8, signed=not self.range.unsigned)
        amax = np.asarray(self.channel_amax, dtype=np.float64)
        return quant.QParams(amax / g.qmax, np.zeros(amax.shape, dtype=np.int64), g, 1)


@dataclass
class WeightSite:
    """One per-channel quantizer on the constant `tensor` (an initializer or Constant output)."""

    tensor: str
    elem_type: int
    axis: int | None
    bits: int
    values: np.ndarray
    readers: list[tuple[str, int]] = field(default_factory=list)

    def params(self) -> quant.QParams:
        return quant.weight_params(self.values, self.axis, self.bits)


@dataclass
class Plan:
    activations: list[ActivationSite]
    weights: list[WeightSite]
    int8_layers: list[str]  # Conv/ConvTranspose/MatMul/Gemm nodes with every input quantized
    fp32_layers: dict[str, str]  # such nodes left in FP32, with the reason
    warnings: list[str]
    ignored: dict[str, str] = field(default_factory=dict)  # node -> the ignored pattern it is part of

    def summary(self) -> dict:
        out = {
            "activation_quantizers": len(self.activations),
            "weight_quantizers": len(self.weights),
            "int8_layers": len(self.int8_layers),
            "fp32_layers": len(self.fp32_layers),
        }
        if self.ignored:
            patterns: dict[str, int] = {}
            for name in self.ignored.values():
                patterns[name] = patterns.get(name, 0) + 1
            out["ignored_pattern_nodes"] = dict(sorted(patterns.items()))
        return out


class _Groups:
    """Union-find over tensor names: tensors that must share one range."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


# A clipping threshold is meant to cut off a thin tail. One that clips more than this share of
# the calibrated values is degenerate: the entropy search returns one when no value lies near
# zero (every candidate below the smallest |x| has divergence 0 and the last one wins), which
# would map the whole tensor to a single value.
MAX_CLIPPED = 0.10


def clipped_fraction(record) -> float:
    """Share of the record's calibrated |x| values above its amax (from the stored histogram)."""
    counts = np.asarray(record.counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0 or record.amax >= record.absmax:
        return 0.0
    left = record.edges()[:-1]
    return float(counts[left >= record.amax].sum() / total)


def usable_amax(record) -> float:
    """The record's amax, or its max |x| when that threshold is degenerate (see MAX_CLIPPED)."""
    return float(record.absmax) if clipped_fraction(record) > MAX_CLIPPED else float(record.amax)



def weight_axis(node: onnx.NodeProto, slot: int, rank: int) -> int | None:
    """The output-channel axis of a constant input of a linear layer (None: per tensor)."""
    op = node.op_type
    if op == "Conv":
        return 0 if slot == 1 and rank >= 2 else None
    if op == "ConvTranspose":  # W is [C_in, C_out/group, k...]; per channel only when group == 1
        return 1 if slot == 1 and rank >= 2 and int(G.attr(node, "group", 1)) == 1 else None
    if op == "Gemm":  # Y = op(A) @ op(B): rows of A, columns of B
        if slot == 0:
            return 1 if int(G.attr(node, "transA", 0)) else 0
        return 0 if int(G.attr(node, "transB", 0)) else 1
    if op == "MatMul":
        if rank < 2:
            return None
        return rank - 1 if slot == 1 else rank - 2
    return None


class _Model:
    """What placement needs to know about the main graph."""

    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        g = proto.graph
        self.graph = g
        self.types = M.tensor_types(proto)
        self.activations = set(M.activation_tensors(proto, self.types)) & M.data_dependent(proto)
        self.producer = G.producers(g)
        self.readers = G.consumers(g)
        self.outputs = {o.name for o in g.output}
        self.constants: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
        inputs = {i.name for i in g.input}
        for name in list(self.constants):
            if name in inputs:  # an initializer that is also an input can be overridden
                del self.constants[name]
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
                value = G.attr(n, "value")
                if isinstance(value, onnx.TensorProto):
                    self.constants[n.output[0]] = value
        self.nodes = {n.name: n for n in g.node}

    def is_data(self, t: str) -> bool:
        return t in self.activations


def _standard(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _roots(m: _Model, t: str, stop: str, budget: list[int]) -> set[str] | None:
    """The data tensors `t` is computed from through activation/normalisation parts only,
    walking no further than `stop` (None when the walk is too long)."""
    n = m.producer.get(t)
    if t == stop or n is None or not _standard(n) or n.op_type not in _ACTIVATION_PARTS:
        return {t}
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if n.op_type in ELEMENTWISE:
        data_inputs = [i for i in n.input[:2] if i and m.is_data(i)]
    else:
        data_inputs = [n.input[0]] if n.input and m.is_data(n.input[0]) else []
    if not data_inputs:
        return {t}
    roots: set[str] = set()
    for i in dict.fromkeys(data_inputs):
        r = _roots(m, i, stop, budget)
        if r is None:
            return None
        roots |= r
    return roots


def is_fused_elementwise(m: _Model, node: onnx.NodeProto) -> bool:
    """An element-wise op with two data inputs that OpenVINO/NNCF treat as part of an
    activation, a normalisation or an SE gate, not as an op with two quantized inputs."""
    a, b = node.input[0], node.input[1]
    ra, rb = _roots(m, a, b, [_WALK_LIMIT]), _roots(m, b, a, [_WALK_LIMIT])
    # x op f(x), or f(x) op g(x), through activation parts: SiLU, HardSwish, GELU, LayerNorm
    return rb == {a} or ra == {b} or (ra is not None and ra == rb and len(ra) == 1)


# ---------------------------------------------------------------- ignored patterns

IGNORED_PATTERNS = ("se_block", "attention_output", "rope", "sam_pe")
_SHAPE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"}
# NNCF: RELU, PRELU, SWISH (OpenVINO); the ONNX pattern takes any atomic activation
_SE_ACTIVATIONS = {"Relu", "PRelu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu",
                   "Softplus", "Gelu", "Mish"}
_MHA_BRANCH = {"Reshape", "Transpose", "Split", "Gather", "Squeeze", "Concat"}  # READVALUE||RESHAPE||TRANSPOSE||GATHER||SQUEEZE||CONCAT (+ SPLIT)


def _producer(m: _Model, t: str) -> onnx.NodeProto | None:
    n = m.producer.get(t)
    return n if n is not None and _standard(n) else None


def _skip(m: _Model, t: str, nodes: list, bias: bool = True) -> str:
    """Walk up from `t` through shape-only ops and (with bias) Add/Sub/Mul of a constant;
    the walked nodes are appended to `nodes`. Returns the tensor reached."""
    for _ in range(_WALK_LIMIT):
        n = _producer(m, t)
        if n is None or not n.input:
            return t
        if n.op_type in _SHAPE_OPS or (bias and n.op_type in ("Add", "Sub", "Mul") and len(n.input) == 2 and not m.is_data(n.input[1])):
            nodes.append(n)
            t = n.input[0]
        elif bias and n.op_type in ("Add", "Mul") and len(n.input) == 2 and not m.is_data(n.input[0]):
            nodes.append(n)
            t = n.input[1]
        else:
            return t
    return t


def _linear_data_input(m: _Model, n: onnx.NodeProto) -> str | None:
    """The data input of a Conv/Gemm/MatMul with a constant weight, else None."""
    if n.op_type not in LINEAR or len(n.input) < 2:
        return None
    if n.input[1] in m.constants:
        return n.input[0]
    if n.op_type in ("MatMul", "Gemm") and n.input[0] in m.constants:
        return n.input[1]
    return None


def _scalar(m: _Model, t: str) -> float | None:
    c = m.constants.get(t)
    if c is None:
        return None
    v = numpy_helper.to_array(c)
    return float(v.ravel()[0]) if v.size == 1 else None


def _se_gate(m: _Model, t: str) -> tuple[list[onnx.NodeProto], str] | None:
    """The gate producing `t` as NNCF matches it on the OpenVINO graph (SIGMOID || HSIGMOID):
    Sigmoid, or relu6(x + 3) / 6 (Clip(x + 3, 0, 6) then / 6 or * 1/6), which OpenVINO fuses into
    HSigmoid; returns (its nodes, its input). An ONNX HardSigmoid stays OpenVINO's HardSigmoid,
    which NNCF's pattern does not match (PP-OCR's SE blocks): NNCF quantizes those blocks."""
    n = _producer(m, t)
    if n is None:
        return None
    if n.op_type == "Sigmoid":
        return [n], n.input[0]
    if n.op_type in ("Div", "Mul") and len(n.input) == 2:
        k = _scalar(m, n.input[1])
        clip = _producer(m, n.input[0])
        if k is None or abs((k if n.op_type == "Div" else 1 / k if k else 0) - 6) > 1e-4 or clip is None or clip.op_type != "Clip":
            return None
        lo, hi = ((_scalar(m, clip.input[1]) if len(clip.input) > 1 and clip.input[1] else None),
                  (_scalar(m, clip.input[2]) if len(clip.input) > 2 and clip.input[2] else None))
        lo = G.attr(clip, "min", lo)
        hi = G.attr(clip, "max", hi)
        add = _producer(m, clip.input[0])
        if lo != 0 or hi is None or abs(hi - 6) > 1e-6 or add is None or add.op_type != "Add" or _scalar(m, add.input[1]) != 3:
            return None
        return [n, clip, add], add.input[0]
    return None


def _se_block(m: _Model, mul: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The gating path of a squeeze-excitation block ending at `mul`, or []."""
    for slot in (0, 1):
        nodes: list[onnx.NodeProto] = []
        t = _skip(m, mul.input[slot], nodes, bias=False)
        gate = _se_gate(m, t)
        if gate is None:
            continue
        nodes += gate[0]
        second = _producer(m, _skip(m, gate[1], nodes))
        t = _linear_data_input(m, second) if second is not None else None
        if t is None:
            continue
        nodes.append(second)
        t = _skip(m, t, nodes)
        act = _producer(m, t)
        if act is None:
            continue
        if act.op_type == "Mul" and len(act.input) == 2:  # Swish: x * sigmoid(x)
            sig = [_producer(m, i) for i in act.input]
            k = next((k for k in (0, 1) if sig[k] is not None and sig[k].op_type == "Sigmoid" and sig[k].input[0] == act.input[1 - k]), None)
            if k is None:
                continue
            nodes += [act, sig[k]]
            t = act.input[1 - k]
        elif act.op_type in _SE_ACTIVATIONS:
            nodes.append(act)
            t = act.input[0]
        else:
            continue
        first = _producer(m, _skip(m, t, nodes))
        t = _linear_data_input(m, first) if first is not None else None
        if t is None:
            continue
        nodes.append(first)
        pool = _producer(m, _skip(m, t, nodes, bias=False))
        if pool is None or pool.op_type not in ("ReduceMean", "GlobalAveragePool"):
            continue
        other = mul.input[1 - slot]
        if pool.input[0] == other or _skip(m, pool.input[0], [], bias=False) == _skip(m, other, [], bias=False):
            return nodes
    return []


def _attention_output(m: _Model, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Softmax [-> Reshape] -> MatMul <- Reshape/Transpose/Split/Gather/Squeeze/Concat."""
    if len(mm.input) != 2:
        return []
    for slot in (0, 1):
        p = _producer(m, mm.input[slot])
        nodes = []
        if p is not None and p.op_type == "Reshape":
            nodes.append(p)
            p = _producer(m, p.input[0])
        branch = _producer(m, mm.input[1 - slot])
        if p is not None and p.op_type == "Softmax" and branch is not None and branch.op_type in _MHA_BRANCH:
            return [p, *nodes, branch, mm]
    return []


def _rope(m: _Model, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """MatMul [-> Transpose] -> Concat (of it twice) -> Sin, Cos."""
    nodes = [mm]
    t = mm.output[0]
    readers = [n for n, _ in m.readers.get(t, ())]
    if len(readers) == 1 and readers[0].op_type == "Transpose":
        nodes.append(readers[0])
        t = readers[0].output[0]
        readers = [n for n, _ in m.readers.get(t, ())]
    for cat in readers:
        if cat.op_type == "Concat" and list(cat.input).count(t) >= 2:
            after = {n.op_type: n for n, _ in m.readers.get(cat.output[0], ())}
            if "Sin" in after and "Cos" in after:
                return nodes + [cat, after["Sin"], after["Cos"]]
    return []


def _sam_pe(m: _Model, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """MatMul -> Mul -> Sin, Cos -> Concat."""
    for mul, _ in m.readers.get(mm.output[0], ()):
        if mul.op_type != "Mul":
            continue
        after = {n.op_type: n for n, _ in m.readers.get(mul.output[0], ())}
        if "Sin" in after and "Cos" in after:
            cats = {n.name for n, _ in m.readers.get(after["Sin"].output[0], ()) if n.op_type == "Concat"}
            cats &= {n.name for n, _ in m.readers.get(after["Cos"].output[0], ()) if n.op_type == "Concat"}
            if cats:
                return [mm, mul, after["Sin"], after["Cos"], m.nodes[min(cats)]]
    return []


def ignored_nodes(m: _Model) -> dict[str, str]:
    """Node name -> the NNCF ignored pattern (IGNORED_PATTERNS) it belongs to."""
    found: dict[str, str] = {}
    for n in m.graph.node:
        if not _standard(n):
            continue
        if n.op_type == "Mul" and len(n.input) == 2:
            for x in _se_block(m, n):
                found.setdefault(x.name, "se_block")
        if n.op_type == "MatMul":
            for name, match in (("attention_output", _attention_output), ("rope", _rope), ("sam_pe", _sam_pe)):
                for x in match(m, n):
                    found.setdefault(x.name, name)
    return found



def _is_variance(m: _Model, n: onnx.NodeProto) -> bool:
    """A ReduceMean of squares (the variance of a decomposed LayerNorm/MVN): OpenVINO fuses the
    normalisation into one MVN op whose input is the only one NNCF quantizes."""
    p = m.producer.get(n.input[0])
    if p is None or not _standard(p) or len(p.input) != 2:
        return False
    if p.op_type == "Mul":
        return p.input[0] == p.input[1]
    if p.op_type == "Pow" and p.input[1] in m.constants:
        return bool(np.all(numpy_helper.to_array(m.constants[p.input[1]]) == 2))
    return False


def _resolve_names(m: _Model, names: list[str]) -> tuple[set[str], set[str]]:
    node_names = set(m.nodes)
    tensor_names = set(m.producer) | {i.name for i in m.graph.input} | set(m.constants)
    nodes, tensors, unknown = set(), set(), []
    for name in names:
        if name in node_names:
            nodes.add(name)
        if name in tensor_names:
            tensors.add(name)
        if name not in node_names and name not in tensor_names:
            unknown.append(name)
    if unknown:
        known = sorted(node_names | tensor_names)
        hints = []
        for u in unknown:
            near = difflib.get_close_matches(u, known, n=1)
            hints.append(f"{u!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise QtoolError(f"--exclude: no node or tensor named {', '.join(hints)} in the model")
    return nodes, tensors


def place(proto: onnx.ModelProto, records: dict, *, exclude: list[str] | tuple = (), weights_7bit: str | None = None,
          float_types: tuple[int, ...] = (TensorProto.FLOAT,), ignored_patterns: bool = True,
          depthwise_per_channel: bool = True) -> Plan:
    """The quantizers for `proto` (whose nodes must have unique names), given the calibration
    records {tensor name: TensorRecord}. float_types: element types the target can quantize.
    ignored_patterns: leave NNCF's ignored patterns (see the module docstring) unquantized.
    depthwise_per_channel: quantize the inputs of depthwise Convs per channel where the records
    have per-channel ranges."""
    if weights_7bit not in (None, "first", "all"):
        raise QtoolError(f"--weights-7bit must be 'first' or 'all', not {weights_7bit!r}")
    m = _Model(proto)
    excluded_nodes, excluded_tensors = _resolve_names(m, list(exclude))
    warnings: list[str] = []
    fp32: dict[str, str] = {}
    ignored = ignored_nodes(m) if ignored_patterns else {}
    for name, pattern in ignored.items():
        if m.nodes[name].op_type in LINEAR and name not in excluded_nodes:
            fp32[name] = f"ignored pattern {pattern}"
    excluded_nodes = excluded_nodes | set(ignored)

    def quantizable_act(t: str) -> bool:
        return m.is_data(t) and m.types.get(t) in float_types

    # 1. What each op asks for: activation requests (tensor, node, slot) and weights.
    wanted: dict[str, list[tuple[str, int]]] = defaultdict(list)
    asks: dict[str, list[str]] = {}  # node -> tensors it needs quantized
    weights_of: dict[str, list[tuple[int, str]]] = {}
    linear_order: list[str] = []
    for n in m.graph.node:
        if not _standard(n) or n.name in excluded_nodes:
            if n.op_type in LINEAR and n.name in excluded_nodes and n.name not in fp32:
                fp32[n.name] = "excluded"
            continue
        op = n.op_type
        acts: list[tuple[int, str]] = []
        wts: list[tuple[int, str]] = []
        if op in LINEAR:
            slots = (0, 1) if len(n.input) >= 2 else ()
            reason = "" if slots else "fewer than two inputs"
            for slot in slots:
                t = n.input[slot]
                if t in m.constants and m.constants[t].data_type in float_types and (op in ("MatMul", "Gemm") or slot == 1):
                    wts.append((slot, t))
                elif quantizable_act(t) and not (op in ("Conv", "ConvTranspose") and slot == 1):
                    acts.append((slot, t))
                else:
                    reason = f"input {t!r} is neither a calibrated activation nor a float constant weight"
            if not acts and not reason:
                reason = "no activation input (constant folding will compute it)"
            if reason:
                fp32[n.name] = reason
                continue
            linear_order.append(n.name)
        elif op in ELEMENTWISE:
            if len(n.input) != 2 or not all(quantizable_act(t) for t in n.input) or is_fused_elementwise(m, n):
                continue
            acts = [(0, n.input[0]), (1, n.input[1])]
        elif op in POOLING:
            if not n.input or not quantizable_act(n.input[0]) or _is_variance(m, n):
                continue
            acts = [(0, n.input[0])]
        else:
            continue
        asks[n.name] = [t for _, t in acts]
        weights_of[n.name] = wts
        for slot, t in acts:
            wanted[t].append((n.name, slot))
        if op == "ReduceMean":  # a decomposed LayerNorm/MVN reads one quantized input throughout
            for sub, slot in m.readers.get(n.output[0], ()):
                if sub.op_type == "Sub" and slot == 1 and sub.input[0] == n.input[0] and _standard(sub) and sub.name not in excluded_nodes:
                    asks[sub.name] = [n.input[0]]
                    wanted[n.input[0]].append((sub.name, 0))

    # 2. Move requests up through pass-through ops and Concat (reverse topological order, so
    #    every reader of a tensor has asked before its producer is visited).
    groups = _Groups()
    moved: dict[str, list[tuple[str, int, str]]] = {}  # tensor -> [(node, slot, upstream tensor)]
    concat_outputs: set[str] = set()
    for n in reversed(m.graph.node):
        if not _standard(n) or n.name in excluded_nodes or not n.output:
            continue
        op = n.op_type
        if op not in PASS_THROUGH and op != "Concat":
            continue
        outs = [o for o in n.output if o]
        if not outs or any(
            o in m.outputs or o in excluded_tensors or not wanted.get(o)
            or len(wanted[o]) != len(m.readers.get(o, ())) for o in outs
        ):
            continue  # someone reads an output unquantized: keep the quantizer below this op
        slots = range(len(n.input)) if op == "Concat" else [0]
        ups = [(s, n.input[s]) for s in slots if n.input[s]]
        if not ups or not all(quantizable_act(t) and t not in excluded_tensors for _, t in ups):
            continue
        for o in outs:
            moved[o] = [(n.name, s, t) for s, t in ups]
            for s, t in ups:
                groups.union(o, t)
        for s, t in ups:
            if (n.name, s) not in wanted[t]:
                wanted[t].append((n.name, s))
        if op == "Concat":
            concat_outputs.update(outs)

    # 3. Ranges: per group, the Concat outputs' calibrated range if the group has one, else
    #    the widest range of the tensors actually quantized.
    sites = [t for t in wanted if wanted[t] and t not in moved]
    members: dict[str, list[str]] = defaultdict(list)
    for t in set(wanted) | set(moved):
        members[groups.find(t)].append(t)
    group_range: dict[str, Range | None] = {}
    missing: list[str] = []
    zero: list[str] = []
    degenerate: list[str] = []
    for root, names in members.items():
        anchors = [t for t in names if t in concat_outputs and t in records]
        if not anchors:
            anchors = [t for t in names if t in sites and t in records]
        if not anchors:
            group_range[root] = None
            missing.extend(t for t in names if t in sites and t not in records)
            continue
        for t in anchors:
            if clipped_fraction(records[t]) > MAX_CLIPPED:
                degenerate.append(t)
        amax = max(usable_amax(records[t]) for t in anchors)
        unsigned = all(records[t].unsigned for t in anchors)
        if not (np.isfinite(amax) and amax > 0):
            zero.append(anchors[0])
            amax = 1.0
        group_range[root] = Range(amax, unsigned)
    if missing:
        warnings.append(
            f"{len(missing)} tensor(s) to quantize are not in the calibration file, their readers stay FP32 "
            f"(was the file made for this model?): " + ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
        )
    if degenerate:
        warnings.append(
            f"{len(degenerate)} calibrated threshold(s) clip more than {MAX_CLIPPED:.0%} of the tensor's values "
            "(typically a tensor that is never near zero, e.g. a sigmoid output); their maximum |x| is used instead: "
            + ", ".join(sorted(degenerate)[:5]) + (" ..." if len(degenerate) > 5 else "")
        )
    if zero:
        warnings.append(f"{len(zero)} range(s) had amax 0 (tensor always zero) and got [0, 1]: " + ", ".join(sorted(zero)[:5]))

    ok_cache: dict[str, bool] = {}

    def satisfied(t: str) -> bool:
        if t not in ok_cache:
            ok_cache[t] = False  # guards against cycles in malformed graphs
            if t in excluded_tensors:
                ok_cache[t] = False
            elif t in moved:
                ok_cache[t] = all(satisfied(u) for _, _, u in moved[t])
            else:
                ok_cache[t] = group_range.get(groups.find(t)) is not None
        return ok_cache[t]

    # 4. Weights (checked before deciding which layers run in int8).
    weight_values: dict[str, np.ndarray] = {}
    bad_weights: set[str] = set()
    for wts in weights_of.values():
        for _, t in wts:
            if t in weight_values or t in bad_weights:
                continue
            if t in excluded_tensors:
                bad_weights.add(t)
                continue
            try:
                values = numpy_helper.to_array(m.constants[t])
            except Exception as e:  # external data not loaded, damaged tensor
                raise QtoolError(f"cannot read weight {t!r}: {e}") from None
            if not np.all(np.isfinite(values)):
                warnings.append(f"weight {t!r} contains NaN or infinity; the layers reading it stay FP32")
                bad_weights.add(t)
                continue
            weight_values[t] = values

    # 5. Decide per op; collect which quantizer each reader reads.
    readers_of_site: dict[str, list[tuple[str, int]]] = defaultdict(list)

    def need(t: str, reader: tuple[str, int]) -> None:
        if t in moved:
            for node_name, slot, up in moved[t]:
                need(up, (node_name, slot))
        elif reader not in readers_of_site[t]:
            readers_of_site[t].append(reader)

    int8_layers: list[str] = []
    weight_sites: dict[str, WeightSite] = {}
    first_linear = linear_order[0] if linear_order else None
    for n in m.graph.node:
        if n.name not in asks:
            continue
        tensors = asks[n.name]
        wts = weights_of.get(n.name, [])
        if not all(satisfied(t) for t in tensors):
            if n.op_type in LINEAR:
                fp32[n.name] = "input excluded" if set(tensors) & excluded_tensors else "an input has no calibrated range"
            continue
        if any(t in bad_weights for _, t in wts):
            fp32[n.name] = "weight excluded" if any(t in excluded_tensors for _, t in wts) else "weight has NaN or infinity"
            continue
        for slot, t in enumerate(n.input):
            if t in tensors and (n.name, slot) in wanted.get(t, []):
                need(t, (n.name, slot))
        if n.op_type in LINEAR:
            int8_layers.append(n.name)
        for slot, t in wts:
            values = weight_values[t]
            axis = weight_axis(n, slot, values.ndim)
            bits = 7 if weights_7bit == "all" or (weights_7bit == "first" and n.name == first_linear) else 8
            site = weight_sites.get(t)
            if site is None:
                weight_sites[t] = WeightSite(t, m.constants[t].data_type, axis, bits, values, [(n.name, slot)])
                continue
            if site.axis != axis:  # one tensor, two layouts (a weight shared by different ops)
                site.axis = None
            site.bits = min(site.bits, bits)
            site.readers.append((n.name, slot))

    activation_sites = []
    for t in sites:
        if not readers_of_site.get(t):
            continue
        root = groups.find(t)
        activation_sites.append(ActivationSite(
            t, m.types.get(t, TensorProto.FLOAT), group_range[root], readers_of_site[t],
            sorted(x for x in members[root] if x != t),
        ))
    if depthwise_per_channel:
        dims = {name: list(t.dims) for name, t in m.constants.items()}
        for site in activation_sites:
            stats = getattr(records.get(site.tensor), "stats", None)
            peak = None if stats is None or stats.axis != 1 else stats.channel_absmax
            if peak is None or site.shared_with or site.tensor in excluded_tensors:
                continue
            convs = [m.nodes[name] for name, slot in site.readers if slot == 0]
            if len(convs) != len(site.readers) or not all(G.is_depthwise(c, dims) for c in convs):
                continue
            if any(int(dims[c.input[1]][0]) != len(peak) for c in convs):
                continue
            amax = np.asarray(peak, dtype=np.float64)
            fallback = float(amax.max()) if amax.size and amax.max() > 0 else 1.0
            site.channel_amax = np.where((amax > 0) & np.isfinite(amax), amax, fallback)
            site.rank = len(dims[convs[0].input[1]])
    order = {name: i for i, name in enumerate(m.producer)}
    activation_sites.sort(key=lambda s: order.get(s.tensor, -1))
    unexpected = {k: v for k, v in fp32.items() if "excluded" not in v and not v.startswith(("no activation input", "ignored pattern"))}
    if unexpected:
        warnings.append(
            f"{len(unexpected)} Conv/ConvTranspose/MatMul/Gemm layer(s) stay FP32: "
            + "; ".join(f"{k} ({v})" for k, v in list(unexpected.items())[:3]) + (" ..." if len(unexpected) > 3 else "")
        )
    already = sorted({n.op_type for n in m.graph.node if n.op_type in _QUANTIZED_OPS})
    if already:
        warnings.append(f"the model already contains {', '.join(already)} nodes; quantizing it again may lose accuracy")
    return Plan(activation_sites, list(weight_sites.values()), int8_layers, fp32, warnings, ignored)
