"""`qtool export`: a calibration (and its model) written for a target, optionally with the layers
that measure worst on held-out inputs kept FP32 (mixed precision)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import calibration, provenance, targets
from ..checks import budget
from ..checks import evaluation as _evaluate
from ..commandinputs import find_calibration, held_out_runs, load_checked_model, model_json, shown_path
from ..errors import QtoolError, opts
from ..fileio import check_output_path, file_input, folder_input, model_input, option_file, write_atomic
from ..options import ExportOptions, MixedPrecision
from ..results import ExportResult
from ..targets import exporter
from . import path

log = logging.getLogger("qtool")


def run(model_path, options: ExportOptions, mixed: MixedPrecision | None = None, *, calib=None, output=None,
        policy_file=None) -> ExportResult:
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
    options, resolved = chosen.export_options(options)
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
        options = replace(options, exclude=options.exclude + kept.exclude)
    written = provenance.exported(loaded, cal, options, out)  # the writer's file, with its provenance
    warnings = list(written.warnings)
    measured = None
    if kept is not None:
        warnings[:0] = kept.warnings
        if kept.budget is not None:
            measured = {**kept.budget, "latency_ms": _latency(target, written.data, kept.feeds, kept.all_int8_ms)}
    added, notes, line = chosen.exported(loaded, cal, options, {**written.summary, **resolved}, str(out), shown_path(loaded.path))
    warnings.extend(notes)
    write_atomic(out, written.data)
    for w in warnings:
        log.warning(w)
    return ExportResult(
        target=target, model=model_json(loaded.path), calibration=str(calib_path), output=str(out), seconds=time.perf_counter() - started,
        warnings=tuple(warnings), written=written.summary, kept_fp32=None if kept is None else tuple(kept.tensors), budget=measured,
        resolved={**resolved, **{k: v for k, v in added.items() if k != "build"}}, build=added.get("build"), target_lines=tuple(line.split("\n")) if line else ())


@dataclass(frozen=True)
class _Kept:
    """The layers --keep-fp32/--max-drop keep in FP32: the nodes excluded, the quantized tensors
    they read, and for --max-drop the budget met and what its latency is measured on."""

    exclude: tuple[str, ...]
    tensors: list[str]
    warnings: list[str] = field(default_factory=list)
    budget: dict | None = None  # required, reached, trials
    feeds: dict | None = None  # one sample, for the latency
    all_int8_ms: float | None = None  # the all-int8 model's latency (None: no layer kept, the same model)


def _mixed_precision(loaded, cal, options: ExportOptions, mixed: MixedPrecision, wanted: budget.Budget | None) -> _Kept:
    """keep_fp32 N or a max_drop budget: the layers to keep in FP32. The layers are ranked and
    measured on the target's model exported with `options` (its exact simulation)."""
    _, runs = held_out_runs(loaded, cal, mixed.images, mixed.data, mixed.limit)
    measured, scored = _evaluate.with_label_scores(loaded)  # integer outputs: ranked and measured on the float tensors they come from
    notes = [_evaluate.scored_warning(scored, "the exports measured")] if scored else []
    if mixed.keep_fp32:
        kept = _evaluate.keep_fp32(measured, cal, mixed.keep_fp32, runs, options)
        return _Kept(tuple(kept.exclude), kept.tensors, notes + list(kept.warnings))
    found = budget.meet(measured, cal, runs, wanted, mixed.max_fp32, options)
    if not found.met:
        raise QtoolError("no set of at most {most} layer group(s) kept in FP32 meets {budget} (best reached: {reached}); allow more "
                         "with {max_fp32}, relax {max_drop}, or calibrate on more inputs", most=mixed.max_fp32, budget=wanted.describe(),
                         reached=wanted.describe(found.value), **opts("max_fp32", "max_drop"))
    feeds = budget.one_sample(loaded.proto, next(iter(runs()))[0])
    target = options.target
    before = budget.latency_ms(target, exporter(target).export(loaded, cal, options).data, feeds) if found.exclude else None
    return _Kept(tuple(found.exclude), found.tensors, notes, budget={"required": wanted.describe(), "reached": wanted.describe(found.value),
                                                              "trials": found.trials}, feeds=feeds, all_int8_ms=before)


def _latency(target: str, data: bytes, feeds: dict, before: float | None) -> dict | None:
    """The budget's latency cost: the exported model against the all-int8 one (`before`, None when
    no layer was kept in FP32: the same model); None without the target's runtime."""
    after = budget.latency_ms(target, data, feeds)
    before = after if before is None else before
    return None if after is None else {"all_int8": round(before, 3), "with_fp32_layers": round(after, 3)}
