"""The placement's second step: which inputs each op asks to have quantized, under the target's
rules (linear layers, element-wise ops, residual Adds, pooling), NNCF's transformer preset
included. Pooling ops that ask only next to a quantized neighbour are held back (`Requests.pools`)
until the moves through pass-through ops are known (`request_pools`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import onnx

from ...model import graph as G
from ...model.lazy import FLOATS
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
    if rules.transposed_scale_shift and not inputs.own.pairs:
        first = asked.linear_order[0] if asked.linear_order else None
        for n in m.graph.node:
            t = _transposed_scale_shift(inputs, n)
            # not the first layer's output: on open_nsfw (whose stem reads raw mean-subtracted pixels, output
            # |x| up to ~1950) its quantizer alone took the file from 42.8 to 28.2 dB (OpenVINO 38.2 -> 28.4)
            if (t is not None and m.producer[t].name != first and n.name not in kept.nodes and t not in kept.tensors
                    and not asked.wanted.get(t)):
                _ask(inputs, kept, asked, n, [(0, t)], [])
    return asked


def request_pools(inputs: Inputs, kept: Kept, asked: Requests) -> None:
    """Reads `asked.wanted` after the moves. Pooling next to a quantized neighbour only: its
    output is quantized for a reader (after the moves through pass-through ops) or its input is
    quantized anyway."""
    for n in reversed(asked.pools):
        if asked.wanted.get(n.input[0]) or any(asked.wanted.get(o) for o in n.output):
            _ask(inputs, kept, asked, n, [(0, n.input[0])], [])


def _max_subtracted(m: G.Index, sub: onnx.NodeProto) -> onnx.NodeProto | None:
    """The ReduceMax (or ReduceMin) whose result, through ops that only move values, is `sub`'s second input, when it
    reduces `sub`'s first input: x - max(x), a softmax or log-sum-exp written out (Exp and ReduceSum after it)."""
    if sub.op_type != "Sub" or len(sub.input) != 2:
        return None
    t = sub.input[1]
    for _ in range(8):
        n = P.producer(m, t)
        if n is None or not n.input:
            return None
        if n.op_type in ("ReduceMax", "ReduceMin"):
            return n if n.input[0] == sub.input[0] else None
        if n.op_type not in G.MOVES:
            return None
        t = n.input[0]
    return None


def _ask(inputs: Inputs, kept: Kept, asked: Requests, n: onnx.NodeProto, acts: list[tuple[int, str]],
         wts: list[tuple[int, str]]) -> None:
    asked.asks[n.name] = [t for _, t in acts]
    asked.weights_of[n.name] = wts
    for slot, t in acts:
        asked.wanted[t].append((n.name, slot))


def _node_requests(inputs: Inputs, asked: Requests, n: onnx.NodeProto, report: Report):
    """(activation inputs, constant weights) node `n` wants quantized, or (None, None)."""
    op, m, rules = n.op_type, inputs.m, inputs.rules
    if inputs.own.pairs:
        return _shipped_requests(inputs, asked, n, report)
    if op in rules.linear:
        return _linear_requests(inputs, asked, n, report)
    if asked.transformer and (op in rules.elementwise or op in _TRANSFORMER_FLOAT):
        return None, None  # NNCF's transformer preset: the residual stream, norms, masks and scales stay float
    if op in rules.elementwise:
        if len(n.input) != 2 or not all(inputs.quantizable_act(t) for t in n.input):
            return None, None
        if rules.nncf_patterns and (P.is_fused_elementwise(m, n) or P.is_magnitude(m, n) or P.is_recurrent_gate(m, n)
                                    or P.is_normalization(m, n) or _max_subtracted(m, n) is not None):
            # _max_subtracted: a softmax (or log-sum-exp) written out reads float logits, as a Softmax op does (no CPU
            # rule quantizes its input; NNCF's default preset quantizes the Sub's two inputs, each on its own grid).
            # On two grids, the logits' (whose range clips the rare top logit) and the max's own, x - max(x) is no
            # longer 0 at the max, the sum that follows small and its reciprocal huge: trueocr's line reader, whose
            # confidence is 1 / sum(exp(logit - max)), read 4e5 where the model says 1 (-88 dB; NNCF's default preset
            # 24.1). The max on the Sub's quantized x (one grid, NNCF's quantize-agnostic ReduceMax) gave 26.3 dB,
            # float 27.9.
            return None, None
        if any(_one_per_sample(inputs, t) for t in n.input):
            return None, None
        if any(_unfused_source(inputs, t) for t in n.input):
            # one input float (its quantizer would run alone): the runtime runs the op in float, and a quantizer on the
            # other only rounds it, most often alone too (minimol's 14 gated messages Mul -> FakeQuantize -> Add of a
            # scatter-add: standalone FakeQuantizes of OpenVINO's runtime graph; NNCF's file has none there)
            return None, None
        return [(slot, t) for slot, t in enumerate(n.input)], []
    if op == "Add" and rules.residual_input is not None:
        skip = rules.residual_input(m, n)
        if skip is None or not inputs.quantizable_act(n.input[skip]):
            return None, None
        return [(skip, n.input[skip])], []
    if op in rules.pooling:
        if not n.input or not inputs.quantizable_act(n.input[0]) or P.is_power_mean(m, n) \
                or (rules.nncf_patterns and (P.is_variance(m, n) or P.is_centring_mean(m, n))):
            return None, None
        return [(0, n.input[0])], []
    return None, None


def _shipped_requests(inputs: Inputs, asked: Requests, n: onnx.NodeProto, report: Report):
    """A model shipped quantized with its own Q/DQ pairs asks for nothing (qtool.model.prequantized): a linear layer
    whose data and weight it quantizes itself is an int8 layer as it is, one it left float stays float. Quantizers of
    qtool's own where it left tensors float cost more than they gain (onnxruntime's QDQ look-alike with its head Gemm
    left float: 46 dB from the model with it quantized, exact without; efficientword's ResNet-50, 7 on its float
    normalisation head: 22.4 dB, for 7 % of latency within the noise), and the model's author chose them."""
    if n.op_type not in inputs.rules.linear:
        return None, None
    if len(n.input) >= 2 and all(inputs.own.reads_own(t) for t in n.input[:2]):
        asked.linear_order.append(n.name)
        return [], []
    report.fp32[n.name] = "left float by the model, shipped quantized with its own QuantizeLinear/DequantizeLinear"
    return None, None


def _one_per_sample(inputs: Inputs, t: str) -> bool:
    """`t` holds one value per sample, by its calibration record (as many values as samples): a scale or shift computed
    from an input, e.g. a diffusion model's preconditioning c_in = 1 / sqrt(sigma^2 + sigma_data^2). Rounded, such a
    value errs alike at every position of the tensor it scales, an error no later layer averages down, and quantizing
    it lets no layer compute in int8. terrain_unet's c_in, on [0, 2] in 256 codes, is 0.0125 at sigma 80: 2 codes,
    25 % off, its first Conv's output 13.1 dB from FP32 (40.7 with c_in float)."""
    rec = inputs.records.get(t)
    stats = rec.stats if rec is not None else None
    return stats is not None and stats.count > 0 and sum(rec.counts) + rec.nonfinite == stats.count


def _unfused_source(inputs: Inputs, t: str) -> bool:
    """Whether `t` is written, directly or through pass-through ops, by an op of `Rules.unfused_sources` (a scatter
    in OpenVINO): its quantizer would run alone, in float."""
    m, rules = inputs.m, inputs.rules
    if not rules.unfused_sources:
        return False
    for _ in range(16):
        src = P.producer(m, t)
        if src is None or not src.input:
            return False
        if src.op_type in rules.unfused_sources:
            return True
        if not rules.forwards(src.op_type) or src.op_type == "Concat":
            return False
        t = src.input[0]
    return False


def _transposed_scale_shift(inputs: Inputs, n: onnx.NodeProto) -> str | None:
    """The output of a linear layer (constant weight) that `n`, a Transpose, alone reads, when the
    Transpose's output reaches (through float Casts and Identities, one reader each) an Add/Sub/Mul of
    a constant: a convolution's bias and batch norm after a layout change (a Caffe/TF model converted
    to ONNX: Conv -> Transpose to NHWC -> Cast -> Add(bias) -> Sub/Mul/Add). OpenVINO cannot fuse that
    scale-shift into the convolution; NNCF (quantizing ov.convert_model's output) quantizes the
    Multiply's input, its FakeQuantize moving up through the Transpose to the convolution's output,
    which then writes int8 and the Transpose and scale-shift run on int8 (open_nsfw: 54 f32 Transposes
    -> 1, as NNCF's file; Rules.transposed_scale_shift). Else None."""
    m = inputs.m
    if n.op_type != "Transpose" or not P.standard(n) or not n.input or not n.output:
        return None
    src = P.producer(m, n.input[0])
    if src is None or P.linear_data_input(m, src) is None or len(m.readers.get(n.input[0], ())) != 1:
        return None
    t = n.output[0]
    for _ in range(8):
        readers = m.readers.get(t, ())
        if len(readers) != 1 or t in m.outputs:
            return None
        r, _slot = readers[0]
        if not P.standard(r):
            return None
        if r.op_type == "Identity" or (r.op_type == "Cast" and G.attr(r, "to", 0) in FLOATS):
            t = r.output[0]
            continue
        if r.op_type in ("Add", "Sub", "Mul") and len(r.input) == 2 and sum(not m.is_data(i) for i in r.input) == 1:
            return n.input[0] if inputs.quantizable_act(n.input[0]) else None
        return None
    return None


def _type(code: int | None) -> str:
    return onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else "unknown"


def _unquantizable(inputs: Inputs, n: onnx.NodeProto, slot: int) -> str:
    """Why input `slot` of linear layer `n` is neither a calibrated activation nor a float constant weight."""
    m, t = inputs.m, n.input[slot]
    kind = "weight" if n.op_type in ("Conv", "ConvTranspose") and slot == 1 else "input"
    if t in m.constants:
        if m.constants[t].data_type in inputs.float_types:
            return f"{kind} {t!r} is a constant where the layer's data goes"
        return f"{kind} {t!r} is a constant of type {_type(m.constants[t].data_type)}, not a float the target quantizes"
    if not t or (t not in m.inputs and t not in m.producer):
        return f"{kind} {t!r} is not computed in this graph"
    if t not in m.dependent:
        return (f"{kind} {t!r} is computed from constants and shapes alone (no model input reaches it, e.g. learned "
                "queries broadcast by Expand): the same for every input, so no activation to calibrate")
    if m.types.get(t) not in inputs.float_types:
        return f"{kind} {t!r} is of type {_type(m.types.get(t))}, not a float the target quantizes"
    if kind == "weight":
        return f"weight {t!r} is computed at run time, not a constant"
    return f"input {t!r} is not a calibrated activation (it only feeds shape or index arithmetic)"


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
            reason = _unquantizable(inputs, n, slot)
    if not acts and not reason:
        reason = "no activation input (constant folding will compute it)"
    if not reason and inputs.rules.nncf_patterns and P.is_power_filterbank(m, n):
        reason = "a filterbank over a power spectrum before its log or root (8 bits on a square lose its quiet bins)"
    if not reason and inputs.rules.nncf_patterns and P.is_log_spectrum_stft(m, n):
        reason = "the STFT of a log spectrum (8 bits on its input put a noise floor into every bin that the log brings up)"
    if reason:
        report.fp32[n.name] = reason
        return None, None
    asked.linear_order.append(n.name)
    return acts, wts
