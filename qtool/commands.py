"""What each command does, over files: one function per command, taking keywords named like its
flags and returning an Outcome (what --json prints, the text, a failed check). Their messages name
the flags; qtool.api exposes each with the messages naming its keywords instead (and `.with_flags`,
these functions, for the command line, which calls nothing else)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import calibration, model, targets
from .checks import evaluation as _evaluate
from .collection import pipeline
from .errors import QtoolError, UsageError
from .feeds import data as _data
from .statistics import thresholds
from .targets import TARGETS, exporter

log = logging.getLogger("qtool")

OPTIONS = targets.OPTIONS
POLICY_FLAGS = targets.POLICY_FLAGS

# The options each target's writer reads (anything else is an error, as on the command line): qtool.targets.
EXPORT_OPTIONS = {name: set(targets.get(name).options) for name in TARGETS}


@dataclass
class Outcome:
    """What a command over files did: `summary`, the dict its --json prints; `text`, what it prints
    otherwise; `failure`, a check that failed (the command line reports it after the output, exit 1)."""

    summary: dict
    text: str
    failure: str | None = None


class _Progress:
    """What the pipeline calls on a tqdm bar (update, total, refresh) over a plain callback(n)."""

    def __init__(self, callback: Callable[[int], None]):
        self.callback = callback
        self.total = None

    def update(self, n: int = 1) -> None:
        self.callback(n)

    def refresh(self) -> None:
        pass


def progress_bar(progress):
    """A tqdm bar as it is (the pipeline also sets its total), a plain callback(n) wrapped."""
    if progress is None or hasattr(progress, "update"):
        return progress
    return _Progress(progress)


def _done(progress) -> None:
    """A tqdm bar closed once the inputs are done, before any warning is logged under it."""
    if hasattr(progress, "close"):
        progress.close()


def channels_text(values) -> str | None:
    if values is None or isinstance(values, str):
        return values
    return ",".join(repr(float(v)) for v in values)


def size_pair(size) -> tuple[int, int] | None:
    if size is None or isinstance(size, tuple):
        return size
    return _data.parse_size(str(size))


def calibrated(loaded, *, image_options, method, **run):
    """The pipeline's run (qtool.collection.pipeline.run) after the --size check (a usage error), with what
    to do when onnxruntime meets feature maps of a --size the strides do not divide."""
    size = image_options["size"] if image_options else None
    if size:
        problem = _data.size_problem(loaded.proto, model.image_input(loaded.proto).name, size)
        if problem:
            raise UsageError(problem)
    try:
        cal, report = pipeline.run(loaded, image_options=image_options, method=method or "entropy", **run)
    except QtoolError as e:
        text = str(e)
        if size and "onnxruntime failed" in text and "dimension" in text:
            raise QtoolError(text + _data.SIZE_MISMATCH_HINT) from None
        raise
    cal.pinned = method is not None  # a method given is kept by every export; else each target picks its best
    return cal, report


def shard_pair(shard) -> tuple[int, int] | None:
    return shard if shard is None or isinstance(shard, tuple) else _data.parse_shard(str(shard))


def _path(value) -> Path | None:
    return None if value is None else Path(value)


def _scale(value) -> float:
    return _data.parse_scale(value) if isinstance(value, str) else float(value)


def calibrate_files(model_path, *, images=None, data=None, limit: int | None = None, on_bad_image: str = "fail", shard=None,
                    size=None, resize: str = "stretch", scale="1/255", mean=None, std=None, bgr: bool = False,
                    layout: str | None = None, batch_size: int | None = None, bins: int = 2048, method: str | None = None,
                    kl_variant: str = "nvidia", output=None, trt_table=None, trt_version: str | None = None,
                    progress=None) -> Outcome:
    """`qtool calibrate`: calibrate the model at `model_path` on a folder of `images` or `data`
    files and write the calibration file to `output` [default: <model stem>.calib.json here], and
    with `trt_table` a TensorRT calibration cache for `trt_version` too: both files or neither,
    each checked before any work against every input read. `progress`: a callback(n) or tqdm bar."""
    from .fileio import Outputs, folder_input, model_input
    from .inputs import model_json, shown_path
    from .targets import tensorrt
    from .targets.tensorrt import files as trtfiles

    started = time.perf_counter()
    model_path, images, data, output, trt_table = map(_path, (model_path, images, data, output, trt_table))
    if (images is None) == (data is None):
        raise QtoolError("give exactly one of --images DIR or --data DIR")
    if bins > calibration.MAX_BINS:
        raise QtoolError(f"--bins {bins} is too many: the maximum is {calibration.MAX_BINS} (default 2048)")
    shard_kn = shard_pair(shard)
    trt_version = trt_version or tensorrt.CACHE_VERSION
    trt_number = None
    if trt_table:
        trt_version = trtfiles.canonical_version(trt_version)
        trt_number = trtfiles.version_number(trt_version)
    output = output or Path(f"{model_path.stem}.calib.json")
    outs = Outputs(inputs=(model_input(model_path), folder_input(images, "a --images file"),
                           folder_input(data, "a --data file")))
    output = outs.add(output, "-o")
    if trt_table:
        trt_table = outs.add(trt_table, "--trt-table")
    image_options = None
    if images is not None:
        image_options = dict(size=size_pair(size), layout=layout, resize=resize, scale=_scale(scale), mean=channels_text(mean),
                             std=channels_text(std), bgr=bgr)
    loaded = model.load_model(model_path, external_data=False)
    cal, report = calibrated(loaded, images=images, data_dir=data, loader=None, limit=limit, shard=shard_kn,
                             on_bad_image=on_bad_image, batch_size=batch_size, image_options=image_options, bins=bins, method=method,
                             kl_variant=kl_variant, progress=progress_bar(progress))
    _done(progress)
    cal = calibration.relocate(cal, output)
    warnings = list(report.warnings)
    if trt_table:
        cache = tensorrt.export(loaded, cal, trt_version=trt_version, fmt="cache")
        warnings.extend(cache.warnings)
    written = {"calibration": str(output)}
    with outs:  # both files, or neither
        outs.write(output, calibration.to_json(cal).encode())  # relocated to `output` above
        if trt_table:
            outs.write(trt_table, cache.data)
            written["tensorrt_cache"] = str(trt_table)
        outs.commit()
    for w in warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    what = "images" if images is not None else "data files"
    summary = {
        "command": "calibrate", "model": model_json(model_path), "outputs": written, "tensors": len(cal.tensors),
        "inputs": report.inputs, "samples": report.samples, "skipped": len(report.skipped), "batch_size": report.batch_size, "method": cal.method,
        "seconds": round(seconds, 3), "warnings": warnings,
    }
    used = report.inputs - len(report.skipped)  # the images or files the file's samples come from
    if images is not None:
        summary["images"] = used
    if trt_number is not None:
        summary["tensorrt_header"] = f"TRT-{trt_number}-EntropyCalibration2"
        summary["build"], notes = tensorrt.build_command(loaded, cal, "cache", trt_version, str(trt_table), shown_path(model_path))
        for note in notes:
            log.warning(note)
        summary["warnings"] = warnings + notes
    counted = f"{used} {what}" + (f" ({report.samples} samples)" if images is None and report.samples != used else "")
    if report.skipped:
        counted += f", {len(report.skipped)} unreadable skipped"
    text = f"calibrated {len(cal.tensors)} tensors from {counted} in {seconds:.1f} s ({cal.method}) -> {output}"
    if trt_table:
        text += f"\nTensorRT {trt_version} cache TRT-{trt_number}-EntropyCalibration2 -> {trt_table}\nbuild it with: {summary['build']}"
    return Outcome(summary, text)


def merge_files(files, *, output) -> Outcome:
    """`qtool merge`: calibration files of one model made on different inputs (shards) combined
    exactly into `output`, which records the model relative to itself."""
    from .fileio import Outputs, file_input, model_input, same_file

    started = time.perf_counter()
    files = [Path(f) for f in files]
    if not files:
        raise QtoolError("merge needs at least one calibration file")
    for i, f in enumerate(files):  # a file given twice would silently count its inputs twice
        twice = next((g for g in files[:i] if same_file(f, g)), None)
        if twice is not None:
            what = f"{str(f)!r} is given twice" if str(f) == str(twice) else f"{str(twice)!r} and {str(f)!r} are the same file"
            raise QtoolError(f"cannot merge: {what} (its inputs would count twice); give each file once")
    cals = [calibration.load(f) for f in files]
    models = {str(f.parent / c.model_path): f.parent / c.model_path for f, c in zip(files, cals)}
    outs = Outputs(inputs=[file_input(f, "a calibration file being merged") for f in files]
                   + [model_input(m, "the calibrated model") for m in models.values()])
    output = outs.add(Path(output))
    merged = calibration.merge(cals)
    with outs:
        # the model path, recorded relative to the first file, is written relative to the output
        outs.write(output, calibration.to_json(calibration.relocate(merged, output, source=files[0])).encode())
        outs.commit()
    seconds = time.perf_counter() - started
    summary = {"command": "merge", "inputs": [str(f) for f in files], "outputs": {"calibration": str(output)},
               "samples": merged.samples, "tensors": len(merged.tensors), "seconds": round(seconds, 3), "warnings": []}
    return Outcome(summary, f"merged {len(files)} files ({merged.samples} samples, {len(merged.tensors)} tensors) -> {output}")


def _method(text: str) -> str:
    try:
        return thresholds.parse_method(text)
    except ValueError as e:
        raise QtoolError(f"--method: {e}") from None


def recompute_file(file, *, method: str | None = None, kl_variant: str | None = None, output=None) -> Outcome:
    """`qtool recompute`: every threshold of the calibration `file` searched again from the
    histograms it keeps, with `method` [default: the file's]; written to `output` [default: `file`
    itself, atomically], which records the model relative to itself."""
    from .fileio import Outputs, model_input

    started = time.perf_counter()
    calib_path = Path(file)
    method = _method(method) if method is not None else None  # fails before any reading
    if kl_variant is not None and method not in (None, "entropy"):
        raise QtoolError(f"--kl-variant chooses whose entropy search to use; it does not apply to --method {method}")
    cal = calibration.load(calib_path)  # refuses unknown recorded methods and variants
    method = method or thresholds.parse_method(cal.method)
    if kl_variant is not None and method != "entropy":
        raise QtoolError(f"--kl-variant chooses whose entropy search to use; {str(calib_path)!r} uses {method} (add --method entropy)")
    variant = kl_variant or cal.kl_variant
    outs = Outputs(inputs=(model_input(calib_path.parent / cal.model_path, "the calibrated model"),))  # FILE itself may be rewritten
    out = outs.add(_path(output) or calib_path)
    new = calibration.recompute(cal, method, variant)
    with outs:
        # the model path, recorded relative to FILE, is written relative to the output
        outs.write(out, calibration.to_json(calibration.relocate(new, out, source=calib_path)).encode())
        outs.commit()
    changed = sum(a.amax != b.amax for a, b in zip(cal.tensors, new.tensors))
    zero = [t.name for t in new.tensors if t.amax == 0]
    warnings = [f"{len(zero)} tensor(s) have amax 0 (everything quantizes to 0): {', '.join(zero[:5])}"] if zero else []
    for w in warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    label = f"entropy/{variant}" if method == "entropy" else method
    summary = {
        "command": "recompute", "calibration": str(calib_path), "outputs": {"calibration": str(out)},
        "tensors": len(new.tensors), "changed": changed, "method": method, "kl_variant": variant,
        "seconds": round(seconds, 3), "warnings": warnings,
    }
    return Outcome(summary, f"recomputed {len(new.tensors)} thresholds ({label}; {changed} changed) in {seconds:.2f} s -> {out}")


def report_file(file, *, output=None, target: str | None = None, trt_version: str | None = None, method: str | None = None,
                model=None, evaluation=None) -> Outcome:
    """`qtool report`: one self-contained HTML page of the calibration `file` as `target`'s export
    uses it, written to `output` [default: FILE's name with .report.html, here]; `evaluation`: JSON
    from qtool evaluate --json. Needs matplotlib."""
    from .checks import report as rep
    from .fileio import Outputs, file_input, model_input
    from .inputs import load_checked_model

    started = time.perf_counter()
    calib_path, model_path, evaluation = Path(file), _path(model), _path(evaluation)
    if target is not None and target not in rep.TARGETS:
        raise QtoolError(f"--target {target!r} is not one of {', '.join(rep.TARGETS)}")
    rep.require_matplotlib()
    name = calib_path.name.removesuffix(".json").removesuffix(".calib")
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    outs = Outputs(inputs=(file_input(calib_path, "the calibration file"), file_input(evaluation, "the --evaluation file"),
                           model_input(source, "the calibrated model")))
    out = outs.add(_path(output) or Path(f"{name}.report.html"))
    evaluated = rep.load_evaluation(evaluation, cal) if evaluation is not None else None
    chosen, why = (target, "given with --target") if target else rep.default_target(evaluated)
    if model_path is None and not source.exists():
        raise QtoolError(f"the calibrated model {str(source)!r} (recorded in {str(calib_path)!r}) is missing; pass it with --model")
    loaded = load_checked_model(model_path, calib_path, cal)
    options = {"trt_version": trt_version} if trt_version is not None else {}
    plan = rep.target_plan(loaded, cal, chosen, why=why, method=method, **options)
    page = rep.render(cal, calib_path.name, plan, evaluated)
    with outs:
        outs.write(out, page)
        outs.commit()
    seconds = time.perf_counter() - started
    summary = {
        "command": "report", "calibration": str(calib_path), "evaluation": str(evaluation) if evaluation else None,
        "target": chosen, "target_from": why, "outputs": {"report": str(out)}, "tensors": len(cal.tensors),
        "quantized": len(plan.sites), "bytes": len(page), "seconds": round(seconds, 3),
    }
    return Outcome(summary, f"report of {len(cal.tensors)} tensors for {chosen} ({len(plan.sites)} quantized) in {seconds:.1f} s -> {out}")


def _only() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Command-line parameter -> (flag, the targets that read it), from qtool.targets."""
    only = {o.param or k: (o.flag, targets.taking(k)) for k, o in OPTIONS.items() if k != "policies"}
    only.update({k: (flag, targets.taking("policies")) for k, flag in POLICY_FLAGS.items()})
    only.update(keep_fp32=("--keep-fp32", targets.ranked()), max_drop=("--max-drop", targets.ranked()))
    return only


def _check_target_options(target: str, flags: dict | None = None, **given) -> None:
    """A usage error for an option that the chosen target does not read (`flags`: the command's own
    flag for an option, where it is not export's)."""
    for key, value in given.items():
        flag, readers = _only()[key]
        flag = (flags or {}).get(key, flag)
        if value and value != "auto" and target not in readers:
            raise UsageError(f"{flag} applies to --target {' or '.join(readers)}, not {target}")


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise QtoolError(f"target {target!r} is not one of {', '.join(TARGETS)}")


def _policies(weight_bits, activation_bits, scale_kind, activations, rounding, policy):
    """The policies the policy flags choose (qtool.quantizers.policy); `policy`: a JSON or TOML rules file."""
    from .quantizers import policy as policies

    rules = policies.load_rules(Path(policy)) if policy else None
    return policies.from_options(weight_bits, activation_bits, scale_kind, rounding, rules, activations)


def _names(values) -> list[str]:
    return [values] if isinstance(values, str) else list(values or ())


def export_file(model_path=None, *, target: str, calib=None, output=None, trt_version: str | None = None, fmt: str | None = None,
                algorithm: str | None = None, method: str | None = None, high_precision: str | None = None,
                precision: str | None = None, weights: str | None = None, include=(), exclude=(), cpu: str | None = None,
                weights_7bit: str | None = None, smooth_quant: str | None = None, keep_fp32: int | None = None, max_drop: str | None = None, max_fp32: int = 20,
                images=None, data=None, limit: int | None = None, ignored_patterns: bool = True, bias_correction: bool = True,
                weight_bits: int | None = None, activation_bits: int | None = None, scale_kind: str | None = None,
                activations: str | None = None, rounding: str | None = None, policy=None) -> Outcome:
    """`qtool export`: the calibration file `calib` [default: the single *.calib.json here] of the
    model at `model_path` [default: the one it records] written for `target` to `output` [default:
    the model's stem + the target's suffix, here]. The keywords are export's flags (qtool.targets.OPTIONS;
    the policy flags as in qtool.quantizers.policy.from_options, `policy` a rules file); `keep_fp32` N or
    `max_drop` BUDGET keep layers in FP32, measured on held-out `images` or `data`."""
    from .fileio import check_output_path, file_input, folder_input, model_input, write_atomic
    from .inputs import find_calibration, load_checked_model, model_json, shown_path

    started = time.perf_counter()
    model_path, calib, output, images, data, policy = map(_path, (model_path, calib, output, images, data, policy))
    _check_target(target)
    chosen = targets.get(target)
    if method is not None and method not in chosen.own_methods({"precision": precision}):
        _method(method)
    _check_target_options(target, trt_version=trt_version, fmt=fmt, algorithm=algorithm, precision=precision,
                          high_precision=high_precision, weights=weights, cpu=cpu, weights_7bit=weights_7bit, smooth_quant=smooth_quant,
                          keep_fp32=keep_fp32, max_drop=max_drop, no_ignored_patterns=not ignored_patterns, weight_bits=weight_bits,
                          activation_bits=activation_bits, scale=scale_kind, activations=activations, rounding=rounding,
                          policy=policy)
    module = exporter(target)
    calib_path = find_calibration(calib)
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    options = dict(trt_version=trt_version, algorithm=algorithm or "entropy2", fmt=fmt, method=method, high_precision=high_precision,
                   precision=precision or "int8", weights=weights, exclude=_names(exclude), include=_names(include),
                   cpu=cpu or "any", weights_7bit=weights_7bit, smooth_quant=smooth_quant or "auto",
                   ignored_patterns=bool(ignored_patterns), bias_correction=bool(bias_correction),
                   policies=_policies(weight_bits, activation_bits, scale_kind, activations, rounding, policy))
    options, said = chosen.export_options(options)
    out = output or Path(Path(cal.model_path).stem + module.suffix(**options))
    out = check_output_path(out, inputs=(model_input(source), file_input(calib_path, "the calibration file"),
                                         file_input(policy, "the --policy file"), folder_input(images, "a --images file"),
                                         folder_input(data, "a --data file")), model=True)
    if keep_fp32 and max_drop:
        raise QtoolError("--keep-fp32 N and --max-drop BUDGET both choose the layers kept in FP32: give one")
    budget_ = None
    if max_drop:
        from .checks.budget import parse_budget

        budget_ = parse_budget(max_drop)
    if (keep_fp32 or budget_) and (images is None) == (data is None):
        raise QtoolError(f"{'--keep-fp32' if keep_fp32 else '--max-drop'} measures on real inputs: give exactly one of --images DIR or --data DIR")
    if not (keep_fp32 or budget_) and (images or data or limit):
        raise QtoolError("--images, --data and --limit are only used with --keep-fp32 or --max-drop")
    loaded = load_checked_model(model_path, calib_path, cal)
    mixed = None
    if keep_fp32 or budget_:
        mixed = _mixed_precision(loaded, cal, target, keep_fp32, budget_, max_fp32, options, images, data, limit)
        options["exclude"] = options["exclude"] + mixed["exclude"]
    result = module.export(loaded, cal, **options)
    if mixed is not None:
        result.warnings[:0] = mixed.pop("warnings")
        mixed.pop("exclude")
        if "latency" in mixed:
            mixed["budget"]["latency_ms"] = _latency(target, result.data, *mixed.pop("latency"))
        result.summary.update(mixed)
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
    text = f"exported {target} from {calib_path} in {seconds:.1f} s -> {out}"
    text += f"\n{line}" if line else ""
    text += _overflow_text(summary.get("overflow_fix"))
    return Outcome(summary, text + (f"\nbuild it with: {summary['build']}" if "build" in summary else ""))


def _mixed_precision(loaded, cal, target, keep_fp32, budget_, max_fp32, options, images, data, limit) -> dict:
    """keep_fp32 N or a max_drop budget: the layers to keep in FP32 and what the summary says."""
    from .checks import budget
    from .inputs import held_out_runs

    _, runs = held_out_runs(loaded, cal, images, data, limit)
    # the export's own options: the layers are ranked and measured on the target's model exported (its exact simulation)
    shared = {k: options[k] for k in ("exclude", "include", "cpu", "weights_7bit", "smooth_quant", "ignored_patterns", "policies", "method", "bias_correction")}
    if keep_fp32:
        kept = _evaluate.keep_fp32(loaded, cal, keep_fp32, runs, target=target, **shared)
        return {"exclude": kept.exclude, "warnings": kept.warnings, "kept_fp32": kept.tensors}
    found = budget.meet(loaded, cal, runs, budget_, max_fp32, target=target, **shared)
    if not found.met:
        raise QtoolError(f"no set of at most {max_fp32} layer group(s) kept in FP32 meets {budget_.describe()} (best reached: "
                         f"{budget_.describe(found.value)}); allow more with --max-fp32, relax --max-drop, or calibrate on more inputs")
    feeds = budget.one_sample(loaded.proto, next(iter(runs()))[0])
    before = budget.latency_ms(target, exporter(target).export(loaded, cal, **options).data, feeds) if found.exclude else None
    return {"exclude": found.exclude, "warnings": [], "kept_fp32": found.tensors, "latency": (feeds, before), "budget": {
        "required": budget_.describe(), "reached": budget_.describe(found.value), "trials": found.trials}}


def _latency(target: str, data: bytes, feeds: dict, before: float | None) -> dict | None:
    """The budget's latency cost: the exported model against the all-int8 one (`before`, None when
    no layer was kept in FP32: the same model); None without the target's runtime."""
    from .checks import budget

    after = budget.latency_ms(target, data, feeds)
    before = after if before is None else before
    return None if after is None else {"all_int8": round(before, 3), "with_fp32_layers": round(after, 3)}


def _overflow_text(fix: dict | None) -> str:
    """One line per remedy of the overflow guard: which layers, and why (the summary's overflow_fix)."""
    if not fix or not fix["layers"]:
        return ""
    by_remedy: dict[str, list[str]] = {}
    for name, layer in fix["layers"].items():
        by_remedy.setdefault(layer["remedy"], []).append(name)
    what = {"fp32": "kept FP32", "7-bit weights": "7-bit weights", "uint8 weights": "uint8 weights (the same values)",
            "pair-bounded weights": "int8 with weight steps widened just enough",
            "widened second input": "int8 with the second input's step widened"}
    why = "where int8 pair sums can saturate on CPUs without VNNI" if fix["mode"] == "auto" else f"(--weights-7bit {fix['mode']})"
    return "".join(f"\noverflow guard: {len(names)} layer(s) {what[remedy]} {why}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                   for remedy, names in by_remedy.items())


_IMAGE_FLAGS = ("size", "resize", "scale", "mean", "std", "bgr", "layout")


def _text_value(value) -> str | None:
    """A size, scale, mean or std given as numbers, as its flag's text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    return repr(float(value)) if isinstance(value, (int, float)) else channels_text(value)


def evaluate_files(model_path, *, calib=None, images=None, data=None, limit: int | None = None, size=None, resize: str | None = None,
                   scale=None, mean=None, std=None, bgr: bool | None = None, layout: str | None = None, batch_size: int | None = None,
                   target: str = "qdq", runtime: str | None = None, method: str | None = None, exclude=(), include=(),
                   cpu: str | None = None, weights_7bit: str | None = None, smooth_quant: str | None = None,
                   ignored_patterns: bool = True, bias_correction: bool = True, trt_version: str | None = None, fmt: str | None = None,
                   high_precision: str | None = None, precision: str | None = None, tensors: bool = False,
                   fail_below: float | None = None, weight_bits: int | None = None, activation_bits: int | None = None,
                   scale_kind: str | None = None, activations: str | None = None, rounding: str | None = None, policy=None,
                   progress=None) -> Outcome:
    """`qtool evaluate`: `target`'s int8 model of the calibration file `calib` [default: the single
    *.calib.json here] against FP32 on held-out `images` (preprocessed as the file records, each
    image keyword overriding its part) or `data`; the keywords are evaluate's flags. With
    `fail_below` DB, an output below it is the Outcome's failure. `progress`: a tqdm bar or a
    callback(n) per model pass over the inputs."""
    from .inputs import find_calibration, held_out_runs, load_checked_model, model_json

    started = time.perf_counter()
    calib, images, data, policy = map(_path, (calib, images, data, policy))
    _check_target(target)
    _check_target_options(target, {"scale": "--scale-kind"}, trt_version=trt_version, fmt=fmt, high_precision=high_precision,
                          precision=precision, cpu=cpu, weights_7bit=weights_7bit, smooth_quant=smooth_quant,
                          no_ignored_patterns=not ignored_patterns,
                          weight_bits=weight_bits, activation_bits=activation_bits, scale=scale_kind, activations=activations,
                          rounding=rounding, policy=policy)
    try:
        _evaluate.check_request(target, runtime, tensors)
    except QtoolError as e:
        raise UsageError(str(e)) from None
    if (images is None) == (data is None):
        raise QtoolError("give exactly one of --images DIR or --data DIR")
    if fail_below is not None and not math.isfinite(fail_below):
        raise QtoolError(f"--fail-below {fail_below} must be a finite number of decibels")
    given = {name for name, value in zip(_IMAGE_FLAGS, (size, resize, scale, mean, std, bgr, layout)) if value is not None}
    if data is not None and given:
        raise QtoolError(f"--{min(given)} applies to --images; .npy/.npz data is fed as it is")
    calib_path = find_calibration(calib)
    cal = calibration.load(calib_path)
    loaded = load_checked_model(_path(model_path), calib_path, cal)
    inputs, runs = held_out_runs(loaded, cal, images, data, limit, batch_size, size=_text_value(size), resize=resize,
                                 scale_text=_text_value(scale), mean=_text_value(mean), std=_text_value(std), bgr=bgr, layout=layout)
    options = {k: v for k, v in dict(
        exclude=_names(exclude), include=_names(include), cpu=cpu or "any", weights_7bit=weights_7bit,
        smooth_quant=smooth_quant or "auto", method=method,
        ignored_patterns=bool(ignored_patterns), bias_correction=bool(bias_correction),
        trt_version=trt_version, fmt=fmt, high_precision=high_precision, precision=precision or "int8",
        policies=_policies(weight_bits, activation_bits, scale_kind, activations, rounding, policy),
    ).items() if k in EXPORT_OPTIONS[target]}
    result = _evaluate.evaluate(loaded, cal, runs, target=target, runtime=runtime, per_tensor=tensors, progress=progress_bar(progress),
                                **options)
    _done(progress)
    for w in result.warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    failing = [o for o in result.outputs if fail_below is not None and not o.sqnr_db >= fail_below]
    summary = {
        "command": "evaluate", "model": model_json(loaded.path), "model_sha256": loaded.sha256, "calibration": str(calib_path),
        "inputs": len(inputs), **_evaluate.to_json(result),
        "fail_below": fail_below, "passed": None if fail_below is None else not failing,
        "seconds": round(seconds, 3), "warnings": result.warnings,
    }
    failure = None
    if failing:
        worst = min(failing, key=lambda o: (o.sqnr_db if not math.isnan(o.sqnr_db) else -math.inf))
        failure = (f"output {worst.name!r} SQNR {_evaluate.format_db(worst.sqnr_db)} dB is below --fail-below {fail_below:g} dB"
                   + (f" ({len(failing)} outputs fail)" if len(failing) > 1 else ""))
    text = _evaluation_text(result, len(inputs), "images" if images is not None else "data files", seconds)
    return Outcome(summary, text, failure)


def _evaluation_text(result: _evaluate.Evaluation, inputs: int, what: str, seconds: float) -> str:
    format_db = _evaluate.format_db
    q = result.plan_summary
    lines = [(
        f"int8 ({result.target} export, exact simulation: {q.get('int8_layers', 0)} int8 layers, {q.get('activation_quantizers', 0)} "
        f"activation and {q.get('weight_quantizers', 0)} weight quantizers) vs FP32 on {result.samples} samples from {inputs} {what} "
        f"in {seconds:.1f} s"
    )]
    rt = result.runtime
    width = max([len("output")] + [len(o.name) for o in result.outputs])
    head = f"{'output':<{width}}  {'SQNR dB':>8}  {'cosine':>8}  {'top-1 agree':>11}"
    if rt is not None:
        lines[0] += f"; also run by {rt.name} on this CPU ({_runtime_cpu(rt)})"
        head += f"  {rt.name + ' dB':>16}  {rt.name + ' top-1':>17}"
    lines.append(head)
    for i, o in enumerate(result.outputs):
        cos = "nan" if math.isnan(o.cosine) else f"{o.cosine:.5f}"
        line = f"{o.name:<{width}}  {format_db(o.sqnr_db):>8}  {cos:>8}  {_top1(o):>11}"
        if rt is not None:
            line += f"  {format_db(rt.outputs[i].sqnr_db):>16}  {_top1(rt.outputs[i]):>17}"
        lines.append(line)
    if result.tensors:
        lines.append("quantized tensors, most harmful first (output SQNR dB with only that tensor quantized):")
        for i, t in enumerate(result.tensors, 1):
            lines.append(f"{i:>4}  {format_db(t.sqnr_db):>8}  {t.kind:<10}  {t.tensor}  -> {', '.join(t.layers) or '-'}")
    return "\n".join(lines)


def _top1(o) -> str:
    return f"{o.top1_agreement * 100:.2f} %" if o.top1_agreement is not None else "-"


def _runtime_cpu(rt) -> str:
    """What the runtime's numbers depend on: the CPU's int8 instructions and the float precision of the layers left unquantized."""
    text = "VNNI" if rt.vnni else "no VNNI" if rt.vnni is False else "VNNI unknown"
    text = f"{rt.cpu_kind} kind, {text}" if rt.cpu_kind else text
    text += f"; unquantized layers in {rt.float_precision}"
    if rt.default_float and rt.default_float != rt.float_precision:
        text += f" (pinned: {rt.name} alone would run them in {rt.default_float} on this CPU)"
    return text


def inspect_file(file, *, model=None, trt_version: str | None = None, weight_bits: int | None = None,
                 activation_bits: int | None = None, scale_kind: str | None = None, activations: str | None = None,
                 rounding: str | None = None, policy=None) -> Outcome:
    """`qtool inspect`: what `file` holds (a calibration file, TensorRT cache, dynamic-range file or
    onnxruntime table, told apart by content), with `model` the activation tensors of that model it
    covers; with `trt_version`, `file` is a Q/DQ ONNX model checked against that TensorRT's rules;
    with a policy keyword (as export's), each quantizer of the calibration's model and its policy.
    A missing range, an unusable scale or a broken rule is the Outcome's failure."""
    from . import inspection
    from .targets.tensorrt import checker
    from .targets.tensorrt import files as trtfiles

    file, model_path, policy = Path(file), _path(model), _path(policy)
    given = (weight_bits, activation_bits, scale_kind, activations, rounding, policy)
    if any(v is not None for v in given):
        if trt_version is not None or model_path is not None:
            raise UsageError("the policy options go with a calibration file alone (not with --trt-version or --model)")
        return Outcome(*inspection.inspect_policies(file, _policies(*given)))
    if trt_version is not None:
        if model_path is not None:
            raise UsageError("--trt-version checks the ONNX model given as FILE; it does not go with --model")
        trt_version = trtfiles.canonical_version(trt_version)
        checker.parse_version(trt_version)
        if not inspection.is_onnx_file(file):  # missing or unreadable: bad input; another kind of file: a usage error
            raise UsageError(f"--trt-version checks an ONNX model's Q/DQ nodes, and {str(file)!r} is not an ONNX model")
        return Outcome(*inspection.inspect_onnx(file, trt_version))
    return Outcome(*inspection.inspect_file(file, model_path))
