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
  LayerNorm), nor the gating Mul of a squeeze-excitation block (NNCF's SE_BLOCK pattern).
* AveragePool, GlobalAveragePool, ReduceMean, Resize: the data input.
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
    """One per-tensor quantizer on `tensor`, read by `readers` (node name, input slot)."""

    tensor: str
    elem_type: int
    range: Range
    readers: list[tuple[str, int]] = field(default_factory=list)
    shared_with: list[str] = field(default_factory=list)  # tensors in the same range group

    def params(self) -> quant.QParams:
        return quant.activation_params(self.range.amax, self.range.unsigned)


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

    def summary(self) -> dict:
        return {
            "activation_quantizers": len(self.activations),
            "weight_quantizers": len(self.weights),
            "int8_layers": len(self.int8_layers),
            "fp32_layers": len(self.fp32_layers),
        }


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


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def weight_axis(node: onnx.NodeProto, slot: int, rank: int) -> int | None:
    """The output-channel axis of a constant input of a linear layer (None: per tensor)."""
    op = node.op_type
    if op == "Conv":
        return 0 if slot == 1 and rank >= 2 else None
    if op == "ConvTranspose":  # W is [C_in, C_out/group, k...]; per channel only when group == 1
        return 1 if slot == 1 and rank >= 2 and int(_attr(node, "group", 1)) == 1 else None
    if op == "Gemm":  # Y = op(A) @ op(B): rows of A, columns of B
        if slot == 0:
            return 1 if int(_attr(node, "transA", 0)) else 0
        return 0 if int(_attr(node, "transB", 0)) else 1
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
                value = _attr(n, "value")
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


def _derives_only_from(m: _Model, t: str, source: str) -> bool:
    """Every data path back from `t` reaches `source` within a few ops (any op type)."""
    seen: set[str] = set()
    stack = [t]
    while stack:
        x = stack.pop()
        if x == source or x in seen:
            continue
        seen.add(x)
        if len(seen) > _WALK_LIMIT:
            return False
        n = m.producer.get(x)
        if n is None:
            return False  # reached a graph input other than source
        data = [i for i in n.input if i and m.is_data(i)]
        if not data:
            return False
        stack.extend(data)
    return True


def is_fused_elementwise(m: _Model, node: onnx.NodeProto) -> bool:
    """An element-wise op with two data inputs that OpenVINO/NNCF treat as part of an
    activation, a normalisation or an SE gate, not as an op with two quantized inputs."""
    a, b = node.input[0], node.input[1]
    ra, rb = _roots(m, a, b, [_WALK_LIMIT]), _roots(m, b, a, [_WALK_LIMIT])
    if rb == {a} or ra == {b} or (ra is not None and ra == rb and len(ra) == 1):
        return True  # x op f(x), or f(x) op g(x), through activation parts: SiLU, HardSwish, GELU, LayerNorm
    if node.op_type == "Mul":  # squeeze-excitation: x * gate(x), the gate through pool/conv
        return _derives_only_from(m, b, a) or _derives_only_from(m, a, b)
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
          float_types: tuple[int, ...] = (TensorProto.FLOAT,)) -> Plan:
    """The quantizers for `proto` (whose nodes must have unique names), given the calibration
    records {tensor name: TensorRecord}. float_types: element types the target can quantize."""
    if weights_7bit not in (None, "first", "all"):
        raise QtoolError(f"--weights-7bit must be 'first' or 'all', not {weights_7bit!r}")
    m = _Model(proto)
    excluded_nodes, excluded_tensors = _resolve_names(m, list(exclude))
    warnings: list[str] = []
    fp32: dict[str, str] = {}

    def quantizable_act(t: str) -> bool:
        return m.is_data(t) and m.types.get(t) in float_types

    # 1. What each op asks for: activation requests (tensor, node, slot) and weights.
    wanted: dict[str, list[tuple[str, int]]] = defaultdict(list)
    asks: dict[str, list[str]] = {}  # node -> tensors it needs quantized
    weights_of: dict[str, list[tuple[int, str]]] = {}
    linear_order: list[str] = []
    for n in m.graph.node:
        if not _standard(n) or n.name in excluded_nodes:
            if n.op_type in LINEAR and n.name in excluded_nodes:
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
            if not n.input or not quantizable_act(n.input[0]):
                continue
            acts = [(0, n.input[0])]
        else:
            continue
        asks[n.name] = [t for _, t in acts]
        weights_of[n.name] = wts
        for slot, t in acts:
            wanted[t].append((n.name, slot))

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
    order = {name: i for i, name in enumerate(m.producer)}
    activation_sites.sort(key=lambda s: order.get(s.tensor, -1))
    unexpected = {k: v for k, v in fp32.items() if "excluded" not in v and not v.startswith("no activation input")}
    if unexpected:
        warnings.append(
            f"{len(unexpected)} Conv/ConvTranspose/MatMul/Gemm layer(s) stay FP32: "
            + "; ".join(f"{k} ({v})" for k, v in list(unexpected.items())[:3]) + (" ..." if len(unexpected) > 3 else "")
        )
    already = sorted({n.op_type for n in m.graph.node if n.op_type in _QUANTIZED_OPS})
    if already:
        warnings.append(f"the model already contains {', '.join(already)} nodes; quantizing it again may lose accuracy")
    return Plan(activation_sites, list(weight_sites.values()), int8_layers, fp32, warnings)
