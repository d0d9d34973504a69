"""`qtool export`: a calibration (and its model) written for a target, optionally with the layers
that measure worst on held-out inputs kept FP32 (mixed precision)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

from .. import calibration, targets
from ..checks import budget
from ..checks import evaluation as _evaluate
from ..errors import QtoolError, opts
from ..fileio import check_output_path, file_input, folder_input, model_input, option_file, write_atomic
from ..inputs import find_calibration, held_out_runs, load_checked_model, model_json, shown_path
from ..model import already_quantized
from ..options import ExportOptions, MixedPrecision
from ..targets import exporter
from . import Outcome, path

log = logging.getLogger("qtool")


def run(model_path, options: ExportOptions, mixed: MixedPrecision | None = None, *, calib=None, output=None,
        policy_file=None) -> Outcome:
    """The calibration file `calib` [default: the single *.calib.json here] of the model at
    `model_path` [default: the one it records] written for options.target to `output` [default: the
    model's stem + the target's suffix, here]; `mixed`: layers kept FP32 as measured on its held-out
    inputs; `policy_file`: the rules file the policies were read from (an input, not to overwrite)."""
    started = time.perf_counter()
    mixed = mixed or MixedPrecision()
    model_path, calib, output = map(path, (model_path, calib, output))
    target = options.target
    chosen = targets.get(target)
    module = exporter(target)
    calib_path = find_calibration(calib)
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    options, said = chosen.export_options(options)
    out = output or Path(Path(cal.model_path).stem + module.suffix(options))
    out = check_output_path(out, inputs=(model_input(source), file_input(calib_path, "the calibration file"),
                                         file_input(policy_file, option_file("policy", "the")),
                                         folder_input(mixed.images, option_file("images")),
                                         folder_input(mixed.data, option_file("data"))), model=True)
    wanted = budget.parse_budget(mixed.max_drop) if mixed.max_drop else None
    loaded = load_checked_model(model_path, calib_path, cal)
    kept = None
    if mixed.wanted:
        kept = _mixed_precision(loaded, cal, options, mixed, wanted)
        options = replace(options, exclude=options.exclude + tuple(kept["exclude"]))
    result = module.export(loaded, cal, options)
    nothing = quantizes_nothing(loaded.proto, target, result.summary)
    if nothing is not None:
        raise nothing
    if kept is not None:
        result.warnings[:0] = kept.pop("warnings")
        kept.pop("exclude")
        if "latency" in kept:
            kept["budget"]["latency_ms"] = _latency(target, result.data, *kept.pop("latency"))
        result.summary.update(kept)
    result.summary.update(said)
    more, notes, line = chosen.exported(loaded, cal, options, result.summary, str(out), shown_path(loaded.path))
    result.summary.update(more)
    result.warnings.extend(notes)
    write_atomic(out, result.data)
    for w in result.warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    summary = {
        "command": "export", "target": target, "model": model_json(loaded.path), "calibration": str(calib_path),
        "outputs": {target: str(out)}, "seconds": round(seconds, 3), "warnings": result.warnings, **result.summary,
    }
    return Outcome(summary, details={"seconds": seconds, "line": line})


def quantizes_nothing(proto, target: str, summary: dict) -> QtoolError | None:
    """The error for a model export that places no quantizer (no Q/DQ or FakeQuantize node: the
    file would be the FP32 model, which TensorRT 11 builds without INT8 and `qtool inspect`
    refuses), naming why; None when it places some, writes a range file (no quantizer counts), or
    the model holds quantization nodes already (qtool's own export, exported again)."""
    if summary.get("activation_quantizers", 1) or summary.get("weight_quantizers", 1) or already_quantized(proto):
        return None
    kept = list(summary.get("fp32_layer_names", ()))
    if kept:
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        why = f"every layer it could quantize stays FP32 ({len(kept)}: {shown}), by the exclusions asked for or the target's own"
    else:
        ops = sorted({n.op_type for n in proto.graph.node if n.op_type != "Constant"})
        shown = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
        why = f"no op of the model is one {target} quantizes under its rules (its ops: {shown or 'none'})"
    return QtoolError(f"the {target} export would quantize nothing: {why}; no file written")


def _mixed_precision(loaded, cal, options: ExportOptions, mixed: MixedPrecision, wanted: budget.Budget | None) -> dict:
    """keep_fp32 N or a max_drop budget: the layers to keep in FP32 and what the summary says. The
    layers are ranked and measured on the target's model exported with `options` (its exact simulation)."""
    _, runs = held_out_runs(loaded, cal, mixed.images, mixed.data, mixed.limit)
    if mixed.keep_fp32:
        kept = _evaluate.keep_fp32(loaded, cal, mixed.keep_fp32, runs, options)
        return {"exclude": kept.exclude, "warnings": kept.warnings, "kept_fp32": kept.tensors}
    found = budget.meet(loaded, cal, runs, wanted, mixed.max_fp32, options)
    if not found.met:
        raise QtoolError("no set of at most {most} layer group(s) kept in FP32 meets {budget} (best reached: {reached}); allow more "
                         "with {max_fp32}, relax {max_drop}, or calibrate on more inputs", most=mixed.max_fp32, budget=wanted.describe(),
                         reached=wanted.describe(found.value), **opts("max_fp32", "max_drop"))
    feeds = budget.one_sample(loaded.proto, next(iter(runs()))[0])
    target = options.target
    before = budget.latency_ms(target, exporter(target).export(loaded, cal, options).data, feeds) if found.exclude else None
    return {"exclude": found.exclude, "warnings": [], "kept_fp32": found.tensors, "latency": (feeds, before), "budget": {
        "required": wanted.describe(), "reached": wanted.describe(found.value), "trials": found.trials}}


def _latency(target: str, data: bytes, feeds: dict, before: float | None) -> dict | None:
    """The budget's latency cost: the exported model against the all-int8 one (`before`, None when
    no layer was kept in FP32: the same model); None without the target's runtime."""
    after = budget.latency_ms(target, data, feeds)
    before = after if before is None else before
    return None if after is None else {"all_int8": round(before, 3), "with_fp32_layers": round(after, 3)}
