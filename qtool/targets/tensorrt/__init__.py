"""The TensorRT target's writer: a Q/DQ model (explicit quantization, INT8 or FP8) or one of the
range files of qtool.targets.tensorrt.files (implicit quantization), per TensorRT version.

Everything TensorRT is in this package: rules.py (placement tables, weight axes, ModelOpt's
exclusions), attention.py (the attention core's 8-bit error, estimated from the calibration),
int8.py and fp8.py (the Q/DQ writers), files.py (cache, dynamic-range file,
onnxruntime table), checker.py (the ONNX parser's Q/DQ rules, `qtool inspect`), autocast.py (the
unquantized part in FP16), passthrough.py (ranges carried through pass-through ops), versions.py
(versions and opsets).

Which TensorRT reads what (reference: TensorRT 10.x-to-11.x migration guide and trtexec docs;
TensorRT C API deprecated.html): 8.x/9.x the cache (`--int8 --calib`) and Q/DQ models (with
`--int8`); 10.x Q/DQ (recommended, `--stronglyTyped`) and the cache (deprecated since 10.1);
11.x Q/DQ only: implicit INT8, the calibrator API and trtexec's --int8/--calib are gone.

Formats (`--format`):
  qdq            an ONNX model with QuantizeLinear/DequantizeLinear placed by TensorRT's rules
                 (qtool.targets.tensorrt.int8); the default for 10.x and 11.x.
  cache, dynamic-range, ort-trt   the range files of qtool.targets.tensorrt.files.

Which tensors (range files): every float activation tensor of the model (qtool.model.activation_tensors: graph
inputs and outputs included, shape/index tensors and constants excluded), in graph order. A
pass-through output (qtool.targets.tensorrt.passthrough) whose own range is missing or unusable gets its input's.
A range no 8-bit grid represents is left out of the range files, with a warning (TensorRT then
runs the tensor in FP16/FP32, as qtool.quantizers.placement keeps it float in the Q/DQ model): infinite or
NaN values, |x| >= 1e30 (qtool.quantizers.patterns.HUGE; its scale overflows to +inf in float32) and the
additive attention masks of qtool.quantizers.patterns.additive_masks (a huge negative constant or 0, even
when calibration saw no padding).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ... import model
from ...errors import Opt, QtoolError, opts
from ...model import graph as G
from ...options import ExportOptions, declared_options
from ...quantizers import patterns as P
from .. import ReportView, WrittenFile, get
from . import checker, fp8, int8, passthrough
from .attention import is_measured
from .files import _listed, is_usable, write_cache, write_dynamic_range, write_ort_table
from .options import TensorRTOptions
from .rules import TENSORRT
from .versions import (  # noqa: F401  (re-exported: the CLI and tests read the versions here)
    CACHE_VERSION,
    LATEST_VERSION,
    canonical_version,
    default_format,
    default_version,
    installed_version,
    major_of,
    trt11_removed,
    version_number,
)

DEFAULTS = ExportOptions("tensorrt")
FORMATS = declared_options(TensorRTOptions)["fmt"].choices  # ("qdq", "cache", "dynamic-range", "ort-trt")
RANGE_FORMATS = ("cache", "dynamic-range", "ort-trt")  # implicit INT8: TensorRT 10 and earlier
SUFFIXES = {"qdq": get("tensorrt").suffix, "cache": ".cache", "dynamic-range": ".dynamic_range.txt", "ort-trt": ".calibration.flatbuffers"}
TRT10_DEPRECATED = (
    "TensorRT 10.1 and later deprecate implicit INT8 (calibration caches) and TensorRT 11 removed it; "
    "--format qdq (the default for 10.x) is the supported path"
)  # a warning (the summary's text, the same from Python)


def version_source(given: str | None, fmt: str | None = None) -> str:
    """Where the targeted version came from, for the summary."""
    if given is not None:
        return "--trt-version"
    if installed_version():
        return "the installed tensorrt package"
    if fmt in RANGE_FORMATS:
        return f"the default cache header ({CACHE_VERSION}; no tensorrt package installed)"
    return "the newest TensorRT qtool knows (no tensorrt package installed)"


# ----------------------------------------------------------------------------- ranges of a model

CALIBRATOR_ALGORITHMS = {"entropy2": "EntropyCalibration2", "minmax": "MinMaxCalibration"}


def thresholds(cal, fmt: str, algorithm: str = "entropy2", method: str | None = None) -> dict:
    """{tensor: calibration.Threshold} on TensorRT's signed grid (TensorRT's INT8 is symmetric
    signed, scale = amax / 127, even after ReLU): `method` when given, max |x| with --algorithm
    minmax; otherwise for the range files the calibration's threshold as NVIDIA's calibrator
    would write it (entropy searched again on the signed grid, no clipping fallback), for the Q/DQ
    model the TENSORRT rules' method and clipping fallback (calibration.Calibration.method_for)."""
    if method is None and algorithm == "minmax":
        method = "max"
    if fmt == "qdq":
        return cal.decide(signed=True, method=cal.method_for(TENSORRT, method), fallback=TENSORRT.clip_fallback)
    return cal.decide(signed=True, method=method, fallback=False)


def model_ranges(proto, own: dict[str, float]) -> tuple[dict[str, float], dict[str, list[str]]]:
    """The ranges to write for a model: {activation tensor: amax} in graph order, and a report.

    `own` holds the calibration's amax per tensor. A pass-through output whose own amax is
    missing, zero or non-finite takes its input's (Concat: the largest of its inputs'). Report
    lists: inherited (filled so), missing (activation tensors with no range at all: left out),
    dropped (calibrated tensors that are not activation tensors of this model: left out).
    Zero/non-finite amax that nothing could replace stay in the result for the writers to fix.
    """
    names = model.activation_tensors(proto, model.tensor_types(proto))
    usable = {n: v for n, v in own.items() if is_usable(v)}
    filled = passthrough.inherit(proto, usable)
    ranges: dict[str, float] = {}
    report: dict[str, list[str]] = {"inherited": [], "missing": [], "dropped": []}
    for name in names:
        if name in usable:
            ranges[name] = usable[name]
        elif name in filled:
            ranges[name] = filled[name]
            report["inherited"].append(name)
        elif name in own:
            ranges[name] = own[name]
        else:
            report["missing"].append(name)
    wanted = set(names)
    report["dropped"] = [n for n in own if n not in wanted]
    return ranges, report


def unrepresentable(proto, cal, amax: dict[str, float]) -> dict[str, str]:
    """{tensor: why} for the ranges no 8-bit grid represents (the test qtool.quantizers.placement applies to
    the Q/DQ model): additive masks, infinite or NaN values, |x| >= 1e30, in graph order."""
    found = P.unrepresentable(G.Index(proto), {t.name: t for t in cal.tensors}, amax)
    order = model.activation_tensors(proto, model.tensor_types(proto))
    rank = {n: i for i, n in enumerate(order)}
    return dict(sorted(found.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise QtoolError("{fmt} is not one of {formats}", fmt=Opt("fmt", fmt, quoted=True), formats=", ".join(FORMATS))
    return fmt


def resolve(trt_version: str | None = None, fmt: str | None = None) -> tuple[str, str]:
    """(version as MAJOR.MINOR.PATCH, format) with the defaults filled in and the pair checked:
    TensorRT 11 reads only Q/DQ models, TensorRT 7 only caches (qtool's Q/DQ rules start at 8.x);
    a range format with no version named writes the CACHE_VERSION header."""
    if fmt is not None:
        check_format(fmt)
    if trt_version is None:
        trt_version = default_version()
        if fmt in RANGE_FORMATS and major_of(trt_version) >= 11:
            trt_version = CACHE_VERSION
    trt_version = canonical_version(trt_version)
    major = major_of(trt_version)
    fmt = fmt or default_format(trt_version)
    if fmt in RANGE_FORMATS:
        if major >= 11:
            raise trt11_removed(fmt)
        version_number(trt_version)
    elif major < 8:
        raise QtoolError("TensorRT {version} builds INT8 from a calibration cache only (Q/DQ models need 8.x or later): "
                         "use {cache}, or name a newer TensorRT with {given}", version=trt_version, cache=Opt("fmt", "cache"),
                         given=Opt("trt_version"))
    return trt_version, fmt


def build_command(loaded, cal, fmt: str, trt_version: str, path: str, model_path: str) -> tuple[str, list[str]]:
    """The trtexec line that builds an INT8 engine from what export wrote at `path` (the Q/DQ model,
    or the cache beside the FP32 model at `model_path`), with `--shapes` for every input whose
    dimensions the model leaves open, taken from what the calibration ran; and notes for the
    inputs whose shapes it cannot tell. trtexec sets min = opt = max to the --shapes given when no
    --minShapes/--optShapes/--maxShapes are (NVIDIA/TensorRT samples/common/sampleOptions.cpp,
    AllOptions::parse), so the engine is built for the calibrated shape."""
    if fmt == "qdq":
        line = int8.build_command(major_of(trt_version), path)
    elif fmt == "cache":
        line = f"trtexec --onnx={model_path} --int8 --calib={path}"
    else:
        return "", []
    shapes, notes = input_shapes(loaded.proto, cal.preprocess)
    if shapes:
        line += " --shapes=" + ",".join(f"{name}:{'x'.join(map(str, dims))}" for name, dims in shapes.items())
    return line, notes


def input_shapes(proto, preprocess: dict) -> tuple[dict[str, list[int]], list[str]]:
    """{input: shape} for the graph inputs with a dynamic dimension: the batch as 1 (a first axis
    that cannot be 1 is no batch: model.batch_one) and the image size the calibration recorded
    (images); and notes for inputs whose size it did not record."""
    shapes: dict[str, list[int]] = {}
    notes: list[str] = []
    for spec in model.data_inputs(proto):
        dims = list(spec.dims)
        if all(d is not None for d in dims):
            continue
        if preprocess.get("source") == "images" and preprocess.get("input") == spec.name and len(dims) == 4:
            h, w = int(preprocess["height"]), int(preprocess["width"])
            c = dims[3] if preprocess.get("layout") == "nhwc" else dims[1]
            c = c or int(preprocess.get("channels") or 3)
            full = [1, h, w, c] if preprocess.get("layout") == "nhwc" else [1, c, h, w]
            shapes[spec.name] = [d if d is not None else f for d, f in zip(dims, full)]
        elif dims[0] is None and all(d is not None for d in dims[1:]) and spec.name in model.batch_one(proto):
            shapes[spec.name] = [1] + dims[1:]
        else:
            notes.append(f"input {spec.name!r} has dynamic dimensions the calibration file does not record; "
                         f"add --shapes={spec.name}:<dims> (x-separated) to the trtexec line")
    return shapes, notes


def suffix(options: ExportOptions = DEFAULTS) -> str:
    """Default output file suffix for the format (FP8 models: .fp8.trt.onnx)."""
    own = options.group(TensorRTOptions)
    if own.precision == "fp8":
        return ".fp8" + SUFFIXES[resolve(own.trt_version, own.fmt or "qdq")[1]]
    return SUFFIXES[resolve(own.trt_version, own.fmt)[1]]


def export(loaded, cal, options: ExportOptions = DEFAULTS):
    """TensorRT INT8 (or FP8: qtool.targets.tensorrt.fp8) for `cal` in its format (TensorRTOptions.fmt)
    for its trt_version (see the module docstring)."""
    own = options.group(TensorRTOptions)
    trt_version, algorithm, fmt, high_precision, weights = own.trt_version, own.algorithm, own.fmt, own.high_precision, own.weights
    method, exclude, include, smooth_quant = options.method, options.exclude, options.include, options.smooth_quant
    if own.precision == "fp8":
        trt_version, fmt = resolve(trt_version, fmt or "qdq")
        if fmt != "qdq":
            raise QtoolError("{fp8} writes a Q/DQ model ({qdq}); the {fmt} range files are INT8 only", fp8=Opt("precision", "fp8"),
                             qdq=Opt("fmt", "qdq"), fmt=fmt)
        if smooth_quant not in ("auto", None) or algorithm != "entropy2":
            raise QtoolError("{smooth_quant} and {algorithm} apply to {int8} only", **opts("smooth_quant", "algorithm"),
                             int8=Opt("precision", "int8"))
        _foreign_qdq(loaded, trt_version)
        return fp8.export(loaded, cal, trt_version=trt_version, method=method, high_precision=high_precision,
                          weights=weights or "fp8", exclude=exclude, include=include)
    weights = weights or "fp32"
    trt_version, fmt = resolve(trt_version, fmt)
    _foreign_qdq(loaded, trt_version)
    major = major_of(trt_version)
    if fmt == "qdq":
        data, warnings, summary = int8.export(
            loaded, cal, lambda c: thresholds(c, fmt, algorithm, method), major=major,
            high_precision=high_precision or ("fp16" if major >= 10 else "fp32"),
            weights=weights, exclude=exclude, include=include, bias_correction=options.bias_correction, smooth_quant=smooth_quant)
        summary = {"format": fmt, "trt_version": trt_version, "method": _method(cal, fmt, algorithm, method), **summary}
        return WrittenFile(data, warnings + _plugin_ops(loaded.proto), summary)
    if high_precision is not None or weights != "fp32" or exclude or include or not options.bias_correction or smooth_quant not in ("auto", None):
        raise QtoolError("{high_precision}, {weights}, {exclude}, {include}, {bias_correction} and {smooth_quant} apply to {qdq} only",
                         **opts("high_precision", "weights", "exclude", "include", "bias_correction", "smooth_quant"),
                         qdq=Opt("fmt", "qdq"))
    amax = {name: d.amax for name, d in thresholds(cal, fmt, algorithm, method).items()}
    data, warnings, summary = _ranges_file(loaded, amax, trt_version, algorithm, fmt, unrepresentable(loaded.proto, cal, amax))
    if major == 10:
        warnings.insert(0, TRT10_DEPRECATED)
    return WrittenFile(data, warnings + _plugin_ops(loaded.proto), {"format": fmt, "trt_version": trt_version, "method": _method(cal, fmt, algorithm, method), **summary})


def _plugin_ops(proto) -> list[str]:
    """A warning naming the model's ops outside the ONNX standard (onnxruntime's com.microsoft fused ops that qtool
    does not read as standard ones, ai.onnx.ml): TensorRT's ONNX parser imports none of them; it looks each up as a
    plugin of the op's name (onnx/onnx-tensorrt, the parser's fallback plugin importer), so the build needs one."""
    found = sorted({f"{n.domain}.{n.op_type}" for n in G.all_nodes(proto.graph) if n.domain not in ("", "ai.onnx", "trt.plugins")})
    if not found:
        return []
    return [f"the model has {len(found)} op type(s) outside the ONNX standard ({', '.join(found[:6])}{', ...' if len(found) > 6 else ''}): "
            "TensorRT's ONNX parser imports none of them and builds the engine only with a plugin of each name; "
            "export the model without them (e.g. without onnxruntime's fusions) or register the plugins"]


def _foreign_qdq(loaded, trt_version: str) -> None:
    """A one-line error when the model given already holds Q/DQ nodes that TensorRT does not import (onnxruntime's
    quantize_static writes uint8 activations with zero points and int32 biases): the export keeps a model's own
    nodes, so its file would break TensorRT's rules where the model does (smart-turn v3: 309 breaches, found only
    by `qtool inspect`). Models without Q/DQ nodes are not checked."""
    if not checker.qdq_nodes(loaded.proto):
        return
    broken = [v for v in checker.check(loaded.proto, trt_version) if v.node]
    if broken:
        raise QtoolError("{model} already holds Q/DQ nodes that TensorRT {version} does not import ({count}, e.g. {node}: {rule}); "
                         "give the FP32 model it was made from", model=repr(str(loaded.path)), version=trt_version,
                         count=f"{len(broken)} broken rule{'s' if len(broken) > 1 else ''}", node=broken[0].node, rule=broken[0].rule)


def _method(cal, fmt: str, algorithm: str, method: str | None) -> str:
    """The threshold method the file's activation ranges come from (as `thresholds` picks it)."""
    if method is None and algorithm == "minmax":
        return "max"
    if fmt == "qdq":
        return cal.method_for(TENSORRT, method) or cal.method
    return method or cal.method


def _ranges_file(loaded, amax: dict[str, float], trt_version: str, algorithm: str, fmt: str,
                 left_out: dict[str, str] | None = None) -> tuple[bytes, list[str], dict]:
    """(bytes, warnings, summary) of a cache, dynamic-range file or onnxruntime table; the
    tensors of `left_out` ({tensor: why}) get no entry (not even one inherited from an input)."""
    left_out = left_out or {}
    ranges, report = model_ranges(loaded.proto, {n: v for n, v in amax.items() if n not in left_out})
    kept_out = [n for n in left_out if n in ranges or n in report["missing"]]  # activation tensors of the model
    ranges = {n: v for n, v in ranges.items() if n not in left_out}
    for key in ("missing", "dropped", "inherited"):
        report[key] = [n for n in report[key] if n not in left_out]
    warnings = []
    if kept_out:
        shown = "; ".join(f"{n} ({left_out[n]})" for n in kept_out[:5]) + (f" and {len(kept_out) - 5} more" if len(kept_out) > 5 else "")
        warnings.append(
            f"{len(kept_out)} tensor(s) have a range no 8-bit grid can represent and are left out, so TensorRT runs "
            f"them in FP16/FP32: {shown}"
        )
    if report["missing"]:
        warnings.append(
            f"{len(report['missing'])} activation tensor(s) of the model have no range in the calibration and are left out, "
            f"so TensorRT runs their layers in FP16/FP32: {_listed(report['missing'])}; calibrate the model again"
        )
    if report["dropped"]:
        warnings.append(
            f"{len(report['dropped'])} calibrated tensor(s) are not activation tensors of the model (shape/index or "
            f"unknown tensors) and are left out: {_listed(report['dropped'])}"
        )
    summary: dict = {}
    if fmt == "cache":
        text, more = write_cache(ranges, trt_version, CALIBRATOR_ALGORITHMS[algorithm])
        data = text.encode()
        summary["header"] = text.split("\n", 1)[0]
        entries = text.count("\n") - 1
    elif fmt == "dynamic-range":
        text, more = write_dynamic_range(ranges)
        data = text.encode()
        entries = text.count("\n")
    else:
        data, more = write_ort_table(ranges)
        entries = len(ranges)
    if kept_out:
        summary["unrepresentable"] = {n: left_out[n] for n in kept_out}
    summary.update(entries=entries, coverage={
        "activation_tensors": len(ranges) + len(report["missing"]) + len(kept_out), "written": entries,
        "inherited": len(report["inherited"]), "missing": len(report["missing"]), "dropped": len(report["dropped"]),
    })
    return data, warnings + more, summary


def _resolved(options: ExportOptions, fmt: str | None) -> ExportOptions:
    """`options` with the TensorRT version and format resolved (`fmt`: the format asked for)."""
    own = options.group(TensorRTOptions)
    trt_version, fmt = resolve(own.trt_version, fmt)
    return replace(options, own=replace(own, trt_version=trt_version, fmt=fmt))


def export_options(options: ExportOptions) -> tuple[ExportOptions, dict]:
    """The TensorRT version and format resolved (FP8 is a Q/DQ model on every version), and where
    the version came from, for export's summary."""
    own = options.group(TensorRTOptions)
    fmt = own.fmt or ("qdq" if own.precision == "fp8" else None)
    source = version_source(own.trt_version, fmt)
    return _resolved(options, fmt), {"trt_version_from": source}


def exported(loaded, cal, options: ExportOptions, summary: dict, path: str, model_path: str) -> tuple[dict, list[str], str]:
    """The trtexec line that builds an engine from the file at `path` (summary "build") and the
    line export prints: version (and where it came from), format, precision and thresholds."""
    own = options.group(TensorRTOptions)
    fmt, version = own.fmt, own.trt_version
    build, notes = build_command(loaded, cal, fmt, version, path, model_path)
    fp8 = " FP8" if own.precision == "fp8" else ""
    line = f"TensorRT {version} ({summary['trt_version_from']}), {fmt}{fp8}, thresholds: {summary['method']}"
    return ({"build": build} if build else {}), notes, line + _measured_cores(summary)


def _measured_cores(summary: dict) -> str:
    """The line naming the attention cores kept FP16 for their estimated 8-bit error (qtool.targets.tensorrt.attention)."""
    kept = {n: why for n, why in summary.get("default_exclusions", {}).items() if is_measured(why)}
    if not kept:
        return ""
    first = min(kept)
    return (f"\n{len(set(kept.values()))} attention core(s) kept FP16 ({len(kept)} MatMuls) for their 8-bit error, e.g. {first}: "
            f"{kept[first].removeprefix('attention core with ')}; --include NODE quantizes one anyway")


def evaluation_options(options: ExportOptions, runtime: str | None = None) -> ExportOptions:
    """The export options qtool.checks.evaluation builds the Q/DQ model with (the range files hold no model
    to run). An FP8 model has no runtime to measure beside the simulation: onnxruntime has no FP8
    kernels on CPU (it computes FLOAT8 Q/DQ in float, as the simulation does; and 1.32's optimizer
    above ORT_ENABLE_BASIC removes a Relu in front of an FP8 QuantizeLinear, tests/test_fp8.py)."""
    fmt = options.group(TensorRTOptions).fmt or "qdq"
    if fmt != "qdq":
        raise QtoolError("the tensorrt target is evaluated in its Q/DQ model ({qdq}); a {fmt} file holds ranges, no model to run",
                         qdq=Opt("fmt", "qdq"), fmt=fmt)
    if options.group(TensorRTOptions).precision == "fp8" and runtime is not None:
        raise QtoolError("{runtime} measures int8 kernels; onnxruntime has none for FP8 on CPU and computes FP8 Q/DQ "
                         "in float, as the simulation already does: drop {drop}", runtime=Opt("runtime", runtime), drop=Opt("runtime"))
    return _resolved(options, fmt)


def report_view(loaded, cal, *, method: str | None = None, trt_version: str | None = None):
    """What qtool report shows of the Q/DQ model export writes with default options (the same
    preparation, thresholds and placement: int8.plan), with the scales its `apply` writes (FP16
    when the unquantized part is)."""
    version, fmt = resolve(trt_version, "qdq")
    major = major_of(version)
    high_precision = "fp16" if major >= 10 else "fp32"
    placed = int8.plan(loaded, cal, lambda c: thresholds(c, fmt, "entropy2", method), major=major, high_precision=high_precision)
    used = placed.cal if placed.cal is not None else cal
    floor = np.float32(int8.FP16_SCALE_FLOOR if high_precision == "fp16" else 0.0)
    scales = {}
    for s in placed.plan.activations:
        scale = max(int8.activation_scale(s.range.amax), floor)
        scales[s.tensor] = float(np.float16(scale) if high_precision == "fp16" else scale)  # autocast.py stores an FP16 model's scales in FP16
    notes = [f"scales in {high_precision.upper()}, as a TensorRT {major}.x export writes them"]
    if default_format(version) != "qdq":
        notes.append(f"qtool export --target tensorrt writes a calibration cache for TensorRT {major}.x by default (every "
                     "activation tensor, NVIDIA's entropy thresholds); this page shows its Q/DQ model (--format qdq)")
    return ReportView(f"TensorRT {version}, Q/DQ model", placed.plan, used, used.method_for(TENSORRT, method),
                 thresholds(used, fmt, "entropy2", method), placed.smoothing, scales, notes)
