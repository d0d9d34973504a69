"""TensorRT explicit quantization: an ONNX model with QuantizeLinear/DequantizeLinear nodes placed
by TensorRT's rules (qtool.targets.tensorrt.rules.TENSORRT), the only INT8 input TensorRT 11 has.

What TensorRT's ONNX parser accepts (onnx/onnx-tensorrt onnxOpImporters.cpp and docs/operators.md,
branches 8.6-GA and 10.1-GA; the TensorRT developer guide, "Explicit Quantization"):
* signed INT8 only, zero points given explicitly and all 0; scales constant, finite, positive;
* activations per tensor, scale = amax / 127 computed in float32 as the calibration cache writes
  it (qtool.targets.tensorrt.files.scale_hex), amax from qtool.targets.tensorrt.thresholds (mse by default; with
  --method entropy the cache's own amax, so the two agree bit for bit);
* weights per output channel on the axis the parser wants (Conv 0, ConvTranspose 1, Gemm by
  transB, MatMul [K, N] 1), grid [-127, 127], scale max|w| / 127: an FP32 initializer ->
  QuantizeLinear -> DequantizeLinear (every version) or an INT8 initializer -> DequantizeLinear
  (10/11, 4x smaller);
* opset: 13 at least (`axis`), 19 when the scales are FP16; the parser of 8.x reads up to 17,
  10.x up to 20, 11.x up to 25.
Strongly typed builds (10.x with --stronglyTyped, always on 11.x) run each layer in the type the
ONNX gives it, so `high_precision="fp16"` converts the unquantized part to FP16 (qtool.targets.tensorrt.autocast; graph
inputs and outputs stay FP32), as NVIDIA ModelOpt does by default. What the conversion cannot do
stays FP32 with a warning: nodes onnxruntime refuses in FP16 (qtool.targets.tensorrt.autocast), else the If/Loop/Scan
nodes, else the whole model (summary `high_precision` "fp32", `fp16_failed` says why).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper

from ...calibration import Threshold
from ...errors import Opt, QtoolError
from ...model import float16
from ...model import graph as G
from ...quantizers import biascorrection, grids, placement, smoothquant
from ...quantizers import patterns as P
from ...quantizers.quantizer import Quantizer
from ...quantizers.rules import Rules
from .. import get
from ..cpu import Prepared
from ..qdq import add_initializer, upgrade_opset
from . import attention
from .rules import TENSORRT
from .versions import FP16_OPSET, OPSETS

# Smallest scale written when scales are FP16: 2^-16 is exact in FP16 and every scale above it
# keeps 8 significant bits there. A smaller one (a weight channel with max |w| < 2e-3, often a dead
# channel with values near 1e-20) would lose its precision or flush to zero, and qtool.targets.tensorrt.autocast would
# then keep its Q/DQ and Conv in FP32; with the floor such a channel quantizes to a few levels or 0.
FP16_SCALE_FLOOR = 2.0 ** -16


def build_command(major: int, path: str) -> str:
    """The trtexec line that builds an INT8 engine from the Q/DQ model at `path`."""
    if major < 10:
        return f"trtexec --onnx={path} --int8 --fp16"
    if major == 10:
        return f"trtexec --onnx={path} --stronglyTyped"
    return f"trtexec --onnx={path}"


def check_options(major: int, high_precision: str, weights: str) -> None:
    if high_precision not in ("fp16", "fp32"):
        raise QtoolError("{option} must be fp16 or fp32, not {given!r}", option=Opt("high_precision"), given=high_precision)
    if weights not in ("fp32", "int8"):
        raise QtoolError("{option} must be fp32 or int8, not {given!r}", option=Opt("weights"), given=weights)
    if major < 10 and weights == "int8":
        raise QtoolError("{int8} (INT8 initializer -> DequantizeLinear) needs TensorRT 10 or later; TensorRT {major}.x reads "
                         "FP32 weights with QuantizeLinear -> DequantizeLinear: drop {int8}", int8=Opt("weights", "int8"), major=major)
    if major < 10 and high_precision == "fp16":
        raise QtoolError("{fp16} needs FP16 scales (opset {opset}), which TensorRT {major}.x's parser does not read "
                         "(opset <= {highest}); use {fp32} and build with --fp16", fp16=Opt("high_precision", "fp16"), opset=FP16_OPSET,
                         major=major, highest=OPSETS[major][1], fp32=Opt("high_precision", "fp32"))


def _target_opset(model: onnx.ModelProto, major: int, high_precision: str) -> int:
    lowest, highest = OPSETS[major]
    current = G.default_opset(model)
    wanted = max(current, lowest, FP16_OPSET if high_precision == "fp16" else lowest)
    if wanted > highest:
        why = f"FP16 scales need opset {FP16_OPSET}" if current <= highest else f"the model is opset {current}"
        raise QtoolError(f"{why}, but TensorRT {major}.x's ONNX parser reads Q/DQ models up to opset {highest}; "
                         + ("use --high-precision fp32" if current <= highest else f"re-export the model at opset {highest} or lower"))
    return wanted


def activation_scale(amax: float) -> np.float32:
    """amax / 127 in float32 arithmetic, the exact number the calibration cache writes."""
    return np.float32(amax) / np.float32(127.0)


def qdq_nodes(namer: G.Namer, tensor: str, scale: str, zp: str, **attrs) -> list[onnx.NodeProto]:
    """QuantizeLinear -> DequantizeLinear of `tensor` with these scale and zero-point initializers;
    the DequantizeLinear last."""
    q, dq = namer.fresh(f"{tensor}/quantized"), namer.fresh(f"{tensor}/dequantized")
    return [
        helper.make_node("QuantizeLinear", [tensor, scale, zp], [q], name=namer.fresh(f"{tensor}/QuantizeLinear"), **attrs),
        helper.make_node("DequantizeLinear", [q, scale, zp], [dq], name=namer.fresh(f"{tensor}/DequantizeLinear"), **attrs),
    ]


def insert(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan, activation_scale: Callable, zero_point: Callable,
           weight_nodes: Callable, floor: float) -> None:
    """Insert the plan's quantizers as Q/DQ nodes (in place), the INT8 and FP8 writers' way: an
    activation gets scale `activation_scale(amax)` (no scale below `floor`) and the zero point
    `zero_point(model, namer, tensor, shape)`, a weight the nodes `weight_nodes(site)` (the reader's input last)."""
    nodes = G.Index(model).nodes
    new_nodes: list[onnx.NodeProto] = []
    for site in plan.quantizers:
        if site.is_weight:
            new_nodes += weight_nodes(site)
        else:
            scale = add_initializer(model, namer, f"{site.tensor}/scale", np.asarray(max(activation_scale(site.range.amax), np.float32(floor))))
            new_nodes += qdq_nodes(namer, site.tensor, scale, zero_point(model, namer, site.tensor, ()))
        for node_name, slot in site.readers:
            nodes[node_name].input[slot] = new_nodes[-1].output[0]
    model.graph.node.extend(new_nodes)


def _zero(model: onnx.ModelProto, namer: G.Namer, base: str, shape) -> str:
    return add_initializer(model, namer, f"{base}/zero_point", np.zeros(shape, dtype=np.int8))


def apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan, weights: str, floor: float = 0.0) -> None:
    """Insert the plan's quantizers as TensorRT-style Q/DQ nodes (in place); no scale below `floor`."""
    insert(model, namer, plan, activation_scale, _zero, lambda site: _weight_nodes(model, namer, site, weights, floor), floor)


def _weight_nodes(model: onnx.ModelProto, namer: G.Namer, site: Quantizer, weights: str,
                  floor: float) -> list[onnx.NodeProto]:
    p = site.params()
    axis = p.axis if p.axis is not None and np.ndim(p.scale) > 0 else None
    attrs = {"axis": axis} if axis is not None else {}
    values = np.maximum(np.asarray(p.scale, dtype=np.float32), np.float32(floor))
    scale = add_initializer(model, namer, f"{site.tensor}/scale", values)
    zp = _zero(model, namer, site.tensor, np.shape(p.scale))
    if weights == "int8":
        dq = namer.fresh(f"{site.tensor}/dequantized")
        q = grids.quantize_linear(site.values, values, p.zero_point, p.grid, axis).astype(np.int8)
        source = add_initializer(model, namer, f"{site.tensor}/int8", q)
        return [helper.make_node("DequantizeLinear", [source, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs)]
    return qdq_nodes(namer, site.tensor, scale, zp, **attrs)


def measured_rules(rules: Rules, records: dict, chosen: dict, grid: attention.Grid, precision: str) -> Rules:
    """`rules` whose default exclusions add the attention cores whose `precision` error, estimated
    from the calibration `records` under the thresholds `chosen` ({tensor: Threshold}) on `grid`,
    is too large (qtool.targets.tensorrt.attention)."""
    measured = attention.rule(records, {n: th.amax for n, th in chosen.items()}, grid, precision)
    return replace(rules, exclusions=functools.partial(rules.exclusions, measured=measured))


def plan(loaded, cal, thresholds: Callable, *, major: int, high_precision: str, exclude=(), include=(),
         smooth_quant="auto") -> Prepared:
    """The Q/DQ export's preparation for TensorRT `major` (a qtool.targets.cpu.Prepared, no `place`), with the activation thresholds
    `thresholds(cal)` ({tensor: calibration.Threshold on the signed grid}) and, on a transformer,
    SmoothQuant as the CPU exports apply it (qtool.quantizers.smoothquant.smooth; the smoothed activations
    take their exact max |x|)."""
    model = float16.twin(G.copy_model(loaded.proto, str(loaded.path.parent)))  # a float16 model: its float32 twin
    opset, source_opset = _target_opset(model, major, high_precision), G.default_opset(model)
    model, _ = upgrade_opset(model, opset, why=f"TensorRT {major}.x Q/DQ with {high_precision.upper()} scales")
    G.unique_node_names(model.graph, G.Namer(model))

    def place(m, c, smoothing=None) -> placement.Plan:
        chosen = thresholds(c)
        if smoothing is not None:
            chosen.update({n: Threshold(a, False, 0.0, False) for n, a in smoothing.amax.items()})
        records = {t.name: t for t in c.tensors}
        return placement.place(m, records, rules=measured_rules(TENSORRT, records, chosen, attention.int8_grid, "int8"),
                               thresholds=chosen, choices=placement.Choices(exclude=list(exclude or ()), include=list(include or ())),
                               float_types=get("tensorrt").float_types)

    cal, smoothing, sq_warnings = smoothquant.smooth(model, cal, smooth_quant, place)
    placed = place(model, cal, smoothing)
    return Prepared(model, placed, sq_warnings + placed.warnings, None, cal if smoothing is not None else None, smoothing, source_opset)


def export(loaded, cal, thresholds: Callable, *, major: int, high_precision: str, weights: str,
           exclude=(), include=(), bias_correction: bool = True, smooth_quant="auto"):
    """(model bytes, warnings, summary) of the Q/DQ model for TensorRT `major` (`plan`'s
    placement, thresholds and SmoothQuant)."""
    check_options(major, high_precision, weights)
    placed = plan(loaded, cal, thresholds, major=major, high_precision=high_precision, exclude=exclude, include=include,
                  smooth_quant=smooth_quant)
    model, quantizers, smoothing = placed.model, placed.plan, placed.smoothing
    cal = placed.cal if placed.cal is not None else cal
    namer = G.Namer(model)  # knows the names smoothing added
    corrected, bc_warnings = biascorrection.apply_to_export(model, namer, quantizers, cal, bias_correction)
    apply(model, namer, quantizers, weights, FP16_SCALE_FLOOR if high_precision == "fp16" else 0.0)
    summary = {**quantizers.summary(), "opset": G.default_opset(model), "source_opset": placed.source_opset,
               "fp32_layer_names": sorted(quantizers.fp32_layers), "bias_corrected_layers": corrected, "high_precision": high_precision,
               "weights": weights}
    if smoothing is not None:
        summary["smooth_quant"] = smoothing.summary
    warnings = placed.warnings + bc_warnings
    if high_precision == "fp16":
        model = high_precision_fp16(model, cal, warnings, summary)
    float16.restore(model)  # a float16 model's graph inputs and outputs float16 again
    data, more = G.finish(model, loaded.proto)
    return data, warnings + more, summary


def high_precision_fp16(model: onnx.ModelProto, cal, warnings: list[str], summary: dict) -> onnx.ModelProto:
    """The Q/DQ model (INT8 or FP8) with its unquantized part in FP16 (qtool.targets.tensorrt.autocast);
    when no FP16 model comes out, `model` as it is (FP32), with a warning and the summary's
    `high_precision` "fp32" and `fp16_failed`. Extends `warnings` and `summary`."""
    from . import autocast  # onnxruntime's converter takes 70 ms to import: only exports in FP16 need it

    G.toposort(model.graph)
    G.cleanup(model.graph)
    # a count rounded into a length (P.length_roundings) and what computes it stay FP32, as the placement keeps them
    # float: FP16's rounding changes the count as INT8's would
    lengths = P.length_roundings(G.Index(model))
    keep = [n for rounding, computing in lengths.items() for n in (*computing, rounding)]
    converted, why = _to_fp16(autocast, model, {t.name: t.absmax for t in cal.tensors}, warnings, keep)
    if converted is None:
        warnings.append(f"FP16 conversion failed ({why}); the unquantized part stays FP32, as with --high-precision fp32 "
                        "(TensorRT runs it in FP32: slower, not less accurate)")
        summary.update(high_precision="fp32", fp16_failed=why)
        return model
    warnings += converted.warnings
    summary["kept_fp32_for_fp16"] = converted.kept_fp32
    return converted.model


def _to_fp16(autocast, model: onnx.ModelProto, absmax: dict, warnings: list[str], keep: list[str] | None = None):
    """(qtool.targets.tensorrt.autocast.to_fp16's result, None), or (None, why) when no FP16 model comes out. When
    the whole model fails and it has If/Loop/Scan nodes (whose bodies the converter converts
    unguarded), those nodes are kept FP32 and the rest tried again, with a warning naming them."""
    try:
        return autocast.to_fp16(model, activation_absmax=absmax, keep_fp32_nodes=keep or ()), ""
    except Exception as e:  # any failure of the conversion falls back to FP32
        why = _reason(e)
    control = [n.name for n in model.graph.node if G.subgraphs(n)]
    if control:
        try:
            converted = autocast.to_fp16(model, activation_absmax=absmax, keep_fp32_nodes=[*control, *(keep or ())])
        except Exception as e:
            return None, f"{why}; with {_names(control)} kept FP32: {_reason(e)}"
        warnings.append(f"FP16 conversion failed ({why}); {_names(control)} (control flow) stay FP32, the rest is FP16")
        return converted, ""
    return None, why


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return first if isinstance(e, QtoolError) else f"{type(e).__name__}: {first}"


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:5])
    return f"node(s) {shown}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
