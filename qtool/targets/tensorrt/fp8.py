"""TensorRT FP8 (E4M3) explicit quantization: an ONNX model with FLOAT8E4M3FN
QuantizeLinear/DequantizeLinear nodes, from the same calibration file as INT8.

What NVIDIA ModelOpt's FP8 path writes (NVIDIA/Model-Optimizer modelopt/onnx/quantization/fp8.py,
graph_utils.py find_nodes_from_convs_to_exclude, qdq_utils.py qdq_to_dq) and TensorRT takes
(TensorRT developer guide, "Explicit Quantization": FP8 is E4M3 only, per-tensor activations,
per-channel weights, scales positive FP32/FP16, zero points FLOAT8E4M3FN zero; opset 19 for
FLOAT8 Q/DQ; qtool.targets.tensorrt.checker checks it with precision "fp8"):
* placement: ModelOpt's FP8 op types, Conv, Gemm, MatMul and the residual Add, placed as the INT8
  Q/DQ model is (qtool.targets.tensorrt.rules.TENSORRT: every input of those layers, the skip input of a residual
  Add, a Concat's inputs sharing one scale), each Q/DQ right before its reader (not moved up
  through MaxPool or shape ops); no ConvTranspose and no pooling (not in ModelOpt's FP8 list). Default exclusions: the INT8
  ones with ModelOpt's FP8 attention rule (head size <= 8 or > 256) for INT8's sequence-length one
  (qtool.targets.tensorrt.rules.exclusions), the attention core whose E4M3 error, estimated from the
  calibration, is too large (qtool.targets.tensorrt.attention: E4M3 holds the probabilities INT8
  loses, but rounds the logits coarser), and ModelOpt's FP8 Conv rule (input or output
  channels <= 16, or a kernel of more than 32 taps): `--include` overrides them;
* activations per tensor, scale = amax / 448 (E4M3's largest finite value) in float32, amax
  from the calibration file's histogram by `method`, max |x| by default as ModelOpt (its FP8 path
  converts a max-calibrated INT8 model, scale * 448 / 127);
* weights per output channel on TensorRT's axis (Conv 0, Gemm by transB, MatMul [K, N] 1),
  scale = max|w| / 448; stored as FLOAT8E4M3FN initializers read by DequantizeLinear (ModelOpt's
  dq_only output, 4x smaller than FP32), or `weights="fp32"`: FP32 weight -> Q -> DQ;
* QuantizeLinear saturates (`saturate` 1, the default): values past amax become +-448 * scale;
* no bias correction (ModelOpt does none; E4M3's rounding error is relative, not a fixed step).
TensorRT 10 and later only: FLOAT8 Q/DQ need opset 19, above the 8.x/9.x parsers' 17.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...calibration import Threshold, clipped_fraction
from ...errors import Opt, QtoolError
from ...model import float16
from ...model import graph as G
from ...quantizers import placement
from ...quantizers.quantizer import Quantizer
from .. import WrittenFile, get
from ..qdq import add_initializer, upgrade_opset
from .int8 import FP16_SCALE_FLOOR, high_precision_fp16, insert, measured_rules, qdq_nodes
from .rules import FP8, FP8_DEFAULT_METHOD, fp8_exclusions
from .versions import FP8_MIN_MAJOR, FP8_OPSET, OPSETS, default_version, parse_version

E4M3_MAX = 448.0  # largest finite FLOAT8E4M3FN value (ONNX: float8e4m3fn has no infinities)
MIN_MAJOR = FP8_MIN_MAJOR
WEIGHT_STORAGE = ("fp8", "fp32")
DEFAULT_METHOD = FP8_DEFAULT_METHOD

RULES = FP8


def _e4m3():
    try:
        import ml_dtypes  # installed with onnx (1.15+)
    except ImportError:
        raise QtoolError("FP8 export needs the ml_dtypes package (installed with onnx 1.15 or later): pip install ml_dtypes") from None
    return ml_dtypes.float8_e4m3fn


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest FLOAT8E4M3FN value (ties to even), saturated at +-448."""
    return np.clip(np.asarray(x, dtype=np.float32), -E4M3_MAX, E4M3_MAX).astype(_e4m3())


def fake_quantize(x: np.ndarray, scale) -> np.ndarray:
    """x through QuantizeLinear -> DequantizeLinear with FLOAT8E4M3FN and `scale`, in float32."""
    scale = np.float32(scale)
    return to_e4m3(np.asarray(x, np.float32) / scale).astype(np.float32) * scale


def activation_scale(amax: float) -> np.float32:
    """amax / 448 in float32; never 0 or subnormal (a tensor that is all zeros gets 1)."""
    scale = np.float32(amax) / np.float32(E4M3_MAX)
    return scale if np.isfinite(scale) and scale >= np.finfo(np.float32).tiny else np.float32(1.0)


def e4m3_grid(x: np.ndarray, amax: float) -> np.ndarray:
    """|x| values on the FP8 model's activation grid (scale amax / 448), in float64
    (qtool.targets.tensorrt.attention's estimate)."""
    return fake_quantize(x, activation_scale(amax)).astype(np.float64)


def weight_scales(values: np.ndarray, axis: int | None) -> np.ndarray:
    """max|w| / 448 per slice along `axis` (a scalar when None), float32; zero slices get 1."""
    w = np.abs(np.asarray(values, dtype=np.float64))
    if axis is None:
        amax = np.asarray(w.max() if w.size else 0.0)
    else:
        amax = w.max(axis=tuple(i for i in range(w.ndim) if i != axis)) if w.size else np.zeros(w.shape[axis])
    scale = (amax / E4M3_MAX).astype(np.float32)
    ok = np.isfinite(scale) & (scale >= np.finfo(np.float32).tiny)
    return np.where(ok, scale, np.float32(1.0)).astype(np.float32)


def e4m3_mse_amax(record, candidates: int = 128) -> float:
    """The amax whose E4M3 grid (scale amax / 448, saturating) has the least squared error over
    the record's |x| histogram (bin centres, float64 sums): amax searched on FP8's own grid."""
    counts = np.asarray(record.counts, dtype=np.float64)
    absmax = float(record.absmax)
    if counts.sum() <= 0 or not np.isfinite(absmax) or absmax <= 0 or record.hist_range <= 0:
        return absmax
    centres = (np.arange(len(counts)) + 0.5) * (record.hist_range / len(counts))
    keep = counts > 0
    centres, counts = centres[keep], counts[keep]
    best, best_err = absmax, np.inf
    for amax in absmax * np.linspace(0.25, 1.0, candidates):
        scale = activation_scale(amax)
        err = float(np.sum(counts * (centres - fake_quantize(centres, scale).astype(np.float64)) ** 2))
        if err < best_err:  # ties keep the smaller amax, searched first
            best, best_err = float(amax), err
    return best


def thresholds(cal, method: str | None = None) -> dict:
    """{tensor: calibration.Threshold} for the FP8 grid: `method` when given (a calibration
    method searched on the signed INT8 grid, or "e4m3-mse": the least E4M3 error), else the
    file's method when calibrate pinned one, else max |x| (ModelOpt's FP8 default)."""
    if method == "e4m3-mse":
        out = {}
        for t in cal.tensors:
            amax = e4m3_mse_amax(t)
            out[t.name] = Threshold(amax, False, clipped_fraction(t, amax), False)
        return out
    return cal.decide(signed=True, method=cal.method_for(RULES, method), fallback=RULES.clip_fallback)


def check_options(major: int, high_precision: str, weights: str) -> None:
    if major < MIN_MAJOR:
        raise QtoolError("FP8 Q/DQ needs opset {opset}, which TensorRT {major}.x's parser does not read (opset <= {highest}): "
                         "use {ten} or later, or INT8", opset=FP8_OPSET, major=major, highest=OPSETS[major][1],
                         ten=Opt("trt_version", "10"))
    if high_precision not in ("fp16", "fp32"):
        raise QtoolError("{option} must be fp16 or fp32, not {given!r}", option=Opt("high_precision"), given=high_precision)
    if weights not in WEIGHT_STORAGE:
        raise QtoolError("{option} for FP8 must be fp8 (FLOAT8E4M3FN weight -> DequantizeLinear) or fp32 "
                         "(FP32 weight -> QuantizeLinear -> DequantizeLinear), not {given!r}", option=Opt("weights"), given=weights)


def _target_opset(model: onnx.ModelProto, major: int) -> int:
    highest = OPSETS[major][1]
    current = G.default_opset(model)
    if current > highest:
        raise QtoolError(f"the model is opset {current}, but TensorRT {major}.x's ONNX parser reads Q/DQ models up to opset "
                         f"{highest}; re-export the model at opset {highest} or lower")
    return max(current, FP8_OPSET)


def _zero(model: onnx.ModelProto, namer: G.Namer, base: str, shape) -> str:
    name = namer.fresh(f"{base}/zero_point")
    zeros = np.zeros(shape, dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(to_e4m3(zeros), name))
    return name


def apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan, weights: str = "fp8", floor: float = 0.0) -> None:
    """Insert the plan's quantizers as FP8 Q/DQ nodes (in place); no scale below `floor`."""
    insert(model, namer, plan, activation_scale, _zero, lambda site: _weight_nodes(model, namer, site, weights, floor), floor)


def _weight_nodes(model: onnx.ModelProto, namer: G.Namer, site: Quantizer, weights: str,
                  floor: float = 0.0) -> list[onnx.NodeProto]:
    values = np.asarray(site.values, dtype=np.float32)
    axis = site.axis if site.axis is not None and values.ndim > 0 else None
    scales = np.maximum(weight_scales(values, axis), np.float32(floor))
    attrs = {"axis": axis} if axis is not None else {}
    scale = add_initializer(model, namer, f"{site.tensor}/scale", scales)
    zp = _zero(model, namer, site.tensor, scales.shape)
    if weights == "fp8":
        dq = namer.fresh(f"{site.tensor}/dequantized")
        shape = [1] * values.ndim
        if axis is not None:
            shape[axis] = -1
        stored = to_e4m3(values / scales.reshape(shape) if axis is not None else values / scales)
        source = namer.fresh(f"{site.tensor}/fp8")
        model.graph.initializer.append(numpy_helper.from_array(stored, source))
        return [helper.make_node("DequantizeLinear", [source, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs)]
    return qdq_nodes(namer, site.tensor, scale, zp, **attrs)


def plan(model: onnx.ModelProto, cal, *, method: str | None = None, exclude=(), include=()) -> tuple[placement.Plan, dict[str, str]]:
    """The FP8 placement of `model` (unique node names): (plan, the FP8-only default exclusions
    applied). `include` overrides those and placement's own default exclusions."""
    include, exclude = list(include or ()), list(exclude or ())
    records, chosen = {t.name: t for t in cal.tensors}, thresholds(cal, method)
    rules = measured_rules(RULES, records, chosen, e4m3_grid, "fp8")
    fp8_only = fp8_exclusions(model)
    applied = {k: v for k, v in fp8_only.items() if k not in include}
    both = rules.exclusions(G.Index(model)) if any(n in fp8_only for n in include) else {}  # placement's own for FP8
    result = placement.place(model, records, rules=rules, thresholds=chosen,
                             choices=placement.Choices(exclude=[*exclude, *applied],
                                                       include=[n for n in include if n not in fp8_only or n in both]),
                             float_types=get("tensorrt").float_types)
    for name, why in applied.items():  # placement records them as excluded: say why
        if result.fp32_layers.get(name) == "excluded" and name not in exclude:
            result.fp32_layers[name] = why
    return result, applied


def export(loaded, cal, *, trt_version: str | None = None, method: str | None = None, high_precision: str | None = None,
           weights: str = "fp8", exclude=(), include=(), **_options):
    """The FP8 Q/DQ model for TensorRT `trt_version` (default: the newest qtool knows), as a WrittenFile."""
    trt_version = trt_version or default_version()
    major = parse_version(trt_version)[0]
    high_precision = high_precision or "fp16"
    check_options(major, high_precision, weights)
    model = float16.twin(G.copy_model(loaded.proto, str(loaded.path.parent)))  # a float16 model: its float32 twin
    source_opset = G.default_opset(model)
    model, _ = upgrade_opset(model, _target_opset(model, major), why=f"TensorRT {major}.x FP8 Q/DQ")
    namer = G.Namer(model)
    G.unique_node_names(model.graph, namer)
    placed, extra = plan(model, cal, method=method, exclude=exclude, include=include)
    # FP16 scales (high_precision fp16): the INT8 writer's floor, so that qtool.targets.tensorrt.autocast
    # keeps every scale, and so its DequantizeLinear, in FP16 (below it a weight's DQ stays FP32 behind a
    # Cast, which TensorRT's parser takes for an activation: per-channel-axis violations on PP-OCRv5 det)
    apply(model, namer, placed, weights, FP16_SCALE_FLOOR if high_precision == "fp16" else 0.0)
    warnings = list(placed.warnings)
    summary = {"format": "qdq", "precision": "fp8", "trt_version": trt_version, **placed.summary(),
               "opset": G.default_opset(model), "source_opset": source_opset, "method": method or cal.method_for(RULES) or cal.method,
               "fp32_layer_names": sorted(placed.fp32_layers), "high_precision": high_precision, "weights": weights}
    summary["fp8_layers"] = summary.pop("int8_layers")  # the plan counts the quantized layers under INT8's name
    if extra:
        summary["fp8_exclusions"] = dict(sorted(extra.items()))
    if high_precision == "fp16":
        model = high_precision_fp16(model, cal, warnings, summary)
    float16.restore(model)  # a float16 model's graph inputs and outputs float16 again
    data, more = G.finish(model, loaded.proto)
    return WrittenFile(data, warnings + more, summary)
