"""The placement's second step: which inputs each op asks to have quantized, under the target's
rules (linear layers, element-wise ops, residual Adds, pooling), NNCF's transformer preset
included. Pooling ops that ask only next to a quantized neighbour are held back (`Requests.pools`)
until the moves through pass-through ops are known (`request_pools`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import onnx

from .. import patterns as P
from .exclusions import Kept
from .state import Inputs, Report

# NNCF's ModelType.TRANSFORMER ignored metatypes (src/nncf/quantization/algorithms/min_max/onnx_backend.py and
# openvino_backend.py, get_ignored_metatypes: Add, Pow, Squeeze, Sub, AveragePool, GlobalAveragePool, ReduceMean,
# ReduceL2, ReduceSum, Div, Max, Sqrt, Reciprocal, BatchNorm, comparisons; Mul too except on CPU_SPR): besides
# the element-wise ops, the pooling ops among them get no quantizer either
_TRANSFORMER_FLOAT = {"AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceL2", "ReduceSum"}


@dataclass
class Requests:
    """The ops' requests: `wanted` grows when a quantizer moves up (qtool.quantizers.placement.moves)."""

    transformer: dict[str, int]  # the transformer structure found (CPU rules: NNCF's transformer preset), {} when none
    asks: dict[str, list[str]] = field(default_factory=dict)  # node -> tensors it needs quantized
    weights_of: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # node -> its constant weights (slot, tensor)
    wanted: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))  # tensor -> (node, slot) asking for it quantized
    linear_order: list[str] = field(default_factory=list)  # the linear layers that ask, in graph order
    pools: list[onnx.NodeProto] = field(default_factory=list)  # pooling ops waiting for a quantized neighbour


def request(inputs: Inputs, kept: Kept, report: Report) -> Requests:
    """Reads the graph, the rules and what stays float (`kept`). Decides each op's requests; a
    linear layer that cannot ask (excluded, an input neither a calibrated activation nor a float
    weight) goes to report.fp32."""
    m, rules = inputs.m, inputs.rules
    asked = Requests(P.transformer_structure(m) if rules.nncf_patterns else {})
    for n in m.graph.node:
        if not P.standard(n) or n.name in kept.nodes:
            if n.op_type in rules.linear and n.name in kept.nodes and n.name not in report.fp32:
                report.fp32[n.name] = "excluded"
            continue
        acts, wts = _node_requests(inputs, asked, n, report)
        if acts is None:
            continue
        if n.op_type in rules.pooling and rules.pooling_needs_neighbour:
            asked.pools.append(n)
            continue
        _ask(inputs, kept, asked, n, acts, wts)
    return asked


def request_pools(inputs: Inputs, kept: Kept, asked: Requests) -> None:
    """Reads `asked.wanted` after the moves. Pooling next to a quantized neighbour only: its
    output is quantized for a reader (after the moves through pass-through ops) or its input is
    quantized anyway."""
    for n in reversed(asked.pools):
        if asked.wanted.get(n.input[0]) or any(asked.wanted.get(o) for o in n.output):
            _ask(inputs, kept, asked, n, [(0, n.input[0])], [])


def _ask(inputs: Inputs, kept: Kept, asked: Requests, n: onnx.NodeProto, acts: list[tuple[int, str]],
         wts: list[tuple[int, str]]) -> None:
    asked.asks[n.name] = [t for _, t in acts]
    asked.weights_of[n.name] = wts
    for slot, t in acts:
        asked.wanted[t].append((n.name, slot))
    if n.op_type == "ReduceMean" and inputs.rules.nncf_patterns:  # a decomposed LayerNorm reads one quantized input
        for sub, slot in inputs.m.readers.get(n.output[0], ()):
            if sub.op_type == "Sub" and slot == 1 and sub.input[0] == n.input[0] and P.standard(sub) and sub.name not in kept.nodes:
                asked.asks[sub.name] = [n.input[0]]
                asked.wanted[n.input[0]].append((sub.name, 0))


def _node_requests(inputs: Inputs, asked: Requests, n: onnx.NodeProto, report: Report):
    """(activation inputs, constant weights) node `n` wants quantized, or (None, None)."""
    op, m, rules = n.op_type, inputs.m, inputs.rules
    if op in rules.linear:
        return _linear_requests(inputs, asked, n, report)
    if asked.transformer and (op in rules.elementwise or op in _TRANSFORMER_FLOAT):
        return None, None  # NNCF's transformer preset: the residual stream, norms, masks and scales stay float
    if op in rules.elementwise:
        if len(n.input) != 2 or not all(inputs.quantizable_act(t) for t in n.input):
            return None, None
        if rules.nncf_patterns and (P.is_fused_elementwise(m, n) or P.is_magnitude(m, n) or P.is_recurrent_gate(m, n)
                                    or P.is_normalization(m, n)):
            return None, None
        return [(0, n.input[0]), (1, n.input[1])], []
    if op == "Add" and rules.residual_input is not None:
        skip = rules.residual_input(m, n)
        if skip is None or not inputs.quantizable_act(n.input[skip]):
            return None, None
        return [(skip, n.input[skip])], []
    if op in rules.pooling:
        if not n.input or not inputs.quantizable_act(n.input[0]) or (rules.nncf_patterns and P.is_variance(m, n)):
            return None, None
        return [(0, n.input[0])], []
    return None, None


def _linear_requests(inputs: Inputs, asked: Requests, n: onnx.NodeProto, report: Report):
    m, op = inputs.m, n.op_type
    acts: list[tuple[int, str]] = []
    wts: list[tuple[int, str]] = []
    slots = (0, 1) if len(n.input) >= 2 else ()
    reason = "" if slots else "fewer than two inputs"
    for slot in slots:
        t = n.input[slot]
        if t in m.constants and m.constants[t].data_type in inputs.float_types and (op in ("MatMul", "Gemm") or slot == 1):
            wts.append((slot, t))
        elif inputs.quantizable_act(t) and not (op in ("Conv", "ConvTranspose") and slot == 1):
            acts.append((slot, t))
        else:
            reason = f"input {t!r} is neither a calibrated activation nor a float constant weight"
    if not acts and not reason:
        reason = "no activation input (constant folding will compute it)"
    if reason:
        report.fp32[n.name] = reason
        return None, None
    asked.linear_order.append(n.name)
    return acts, wts
