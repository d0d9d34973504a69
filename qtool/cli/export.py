"""`qtool export`: a calibration (and its model) to a target format."""

from __future__ import annotations

import difflib
import logging
import time
from pathlib import Path

import click

from .. import budget, calibration, targets, thresholds
from ..budget import parse_budget
from ..errors import QtoolError
from ..fileio import check_output_path, file_input, folder_input, model_input, write_atomic
from ..inputs import find_calibration, held_out_runs, load_checked_model, model_json, shown_path
from ..targets import OPTIONS, POLICY_FLAGS, TARGETS, exporter, tensorrt
from . import EPILOG, cli, emit, policies_from, policy_options

log = logging.getLogger("qtool")


def _only() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Command-line parameter -> (flag, the targets that read it), from qtool.targets."""
    only = {o.param or k: (o.flag, targets.taking(k)) for k, o in OPTIONS.items() if k != "policies"}
    only.update({k: (flag, targets.taking("policies")) for k, flag in POLICY_FLAGS.items()})
    only.update(keep_fp32=("--keep-fp32", targets.ranked()), max_drop=("--max-drop", targets.ranked()))
    return only


def option(keyword: str, command: str = "export"):
    """The click option of the export option `keyword`, as qtool.targets.OPTIONS declares it
    (`command` "evaluate": with evaluate's help)."""
    o = OPTIONS[keyword]
    kwargs: dict = {"help": (o.help if command == "export" else o.evaluate).format(latest=tensorrt.LATEST_VERSION)}
    if o.negated:
        kwargs["is_flag"] = True
    if o.choices:
        kwargs["type"] = click.Choice(o.choices)
    if o.multiple:
        kwargs["multiple"] = True
    if o.metavar:
        kwargs["metavar"] = o.metavar
    return click.option(o.flag, o.param or keyword, **kwargs)


def _mixed_precision(loaded, cal, target, keep_fp32, budget_, max_fp32, options, images_dir, data_dir, limit) -> dict:
    """--keep-fp32 N or --max-drop BUDGET: the layers to keep in FP32 and what the summary says."""
    _, runs = held_out_runs(loaded, cal, images_dir, data_dir, limit)
    # the export's own options: the layers are ranked and measured on the target's model exported (its exact simulation)
    shared = {k: options[k] for k in ("exclude", "include", "weights_7bit", "smooth_quant", "ignored_patterns", "policies", "method", "bias_correction")}
    if keep_fp32:
        from ..evaluation import keep_fp32 as rank_and_keep

        kept = rank_and_keep(loaded, cal, keep_fp32, runs, target=target, **shared)
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
    after = budget.latency_ms(target, data, feeds)
    before = after if before is None else before
    return None if after is None else {"all_int8": round(before, 3), "with_fp32_layers": round(after, 3)}


def check_target_options(target: str, **given) -> None:
    """A usage error for an option that the chosen target does not read."""
    for key, value in given.items():
        flag, readers = _only()[key]
        if value and value != "auto" and target not in readers:
            raise click.UsageError(f"{flag} applies to --target {' or '.join(readers)}, not {target}")


def complete_targets(incomplete: str) -> list:
    """Shell completion of --target (the option stays free text so a typo gets a did-you-mean)."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(t) for t in TARGETS if t.startswith(incomplete.lower())]


def parse_target(text: str) -> str:
    target = text.strip().lower()
    if target not in TARGETS:
        near = difflib.get_close_matches(target, TARGETS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise click.BadParameter(f"{text!r} is not one of {', '.join(TARGETS)}{hint}", param_hint="'--target'")
    return target


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="[MODEL]", required=False, type=click.Path(path_type=Path))
@click.option("--target", "target_text", required=True, help=f"Output format: {', '.join(TARGETS)}.", shell_complete=lambda ctx, param, incomplete: complete_targets(incomplete))
@click.option("--calib", type=click.Path(path_type=Path), help="Calibration file [default: the single *.calib.json here].")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output file [default: <model stem> + the target's suffix, here].")
@option("trt_version")
@option("fmt")
@option("algorithm")
@option("method")
@option("high_precision")
@option("precision")
@option("weights")
@option("include")
@option("exclude")
@option("weights_7bit")
@option("smooth_quant")
@click.option("--keep-fp32", type=click.IntRange(min=1), metavar="N", help="openvino/qdq: also keep in FP32 the layers reading the N quantized tensors that qtool evaluate --tensors ranks most harmful on the inputs of --images/--data (preprocessed as the calibration file records), in the target's own model, simulated exactly.")
@click.option("--max-drop", metavar="BUDGET", help="openvino/qdq: keep in FP32 the fewest layers, worst ranked first, that bring the int8 model within BUDGET on --images/--data: a worst output SQNR (e.g. 30dB) or a top-1 agreement drop (e.g. 1%); each step measures the target's model exactly (simulated: the same on every CPU); exit 1 when --max-fp32 tensors are not enough.")
@click.option("--max-fp32", type=click.IntRange(min=1), default=20, show_default=True, help="With --max-drop: the most quantized tensors whose layers may be kept in FP32.")
@click.option("--images", "images_dir", type=click.Path(path_type=Path), help="With --keep-fp32/--max-drop: held-out images to rank and measure on.")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), help="With --keep-fp32/--max-drop: held-out .npy/.npz files.")
@click.option("--limit", type=click.IntRange(min=1), help="With --keep-fp32/--max-drop: use only the first N images or data files.")
@option("ignored_patterns")
@option("bias_correction")
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def export(model_path, target_text, calib, output, trt_version, fmt, algorithm, method, high_precision, precision, weights, include,
           exclude, weights_7bit, smooth_quant, keep_fp32, max_drop, max_fp32, images_dir, data_dir, limit, no_ignored_patterns, no_bias_correction,
           weight_bits, activation_bits, scale_kind, activation_mode, rounding, policy_file, as_json):
    """Write the calibrated ranges of MODEL in a target format.

    With no MODEL, the model recorded in the calibration file is used; either way it must be
    byte-identical (SHA-256) to the one calibrated.
    """
    started = time.perf_counter()
    target = parse_target(target_text)
    if method is not None and not (method == "e4m3-mse" and precision == "fp8"):  # FP8's own search (targets/tensorrt/fp8.py)
        try:
            thresholds.parse_method(method)
        except ValueError as e:
            raise QtoolError(f"--method: {e}") from None
    check_target_options(target, trt_version=trt_version, fmt=fmt, algorithm=algorithm, precision=precision,
                         high_precision=high_precision, weights=weights, weights_7bit=weights_7bit, smooth_quant=smooth_quant,
                         keep_fp32=keep_fp32, max_drop=max_drop, no_ignored_patterns=no_ignored_patterns, weight_bits=weight_bits,
                         activation_bits=activation_bits, scale=scale_kind, activations=activation_mode, rounding=rounding,
                         policy=policy_file)
    module = exporter(target)
    calib_path = find_calibration(calib)
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    version_from = None
    if target == "tensorrt":
        fmt = fmt or ("qdq" if precision == "fp8" else None)  # FP8 is a Q/DQ model on every version
        version_from = tensorrt.version_source(trt_version, fmt)
        trt_version, fmt = tensorrt.resolve(trt_version, fmt)
    options = dict(trt_version=trt_version, algorithm=algorithm or "entropy2", fmt=fmt, method=method, high_precision=high_precision,
                   precision=precision or "int8", weights=weights, exclude=list(exclude), include=list(include), weights_7bit=weights_7bit, smooth_quant=smooth_quant or "auto",
                   ignored_patterns=not no_ignored_patterns, bias_correction=not no_bias_correction,
                   policies=policies_from(weight_bits, activation_bits, scale_kind, activation_mode, rounding, policy_file))
    out = output or Path(Path(cal.model_path).stem + module.suffix(**options))
    out = check_output_path(out, inputs=(model_input(source), file_input(calib_path, "the calibration file"), file_input(policy_file, "the --policy file"), folder_input(images_dir, "a --images file"), folder_input(data_dir, "a --data file")))
    if keep_fp32 and max_drop:
        raise QtoolError("--keep-fp32 N and --max-drop BUDGET both choose the layers kept in FP32: give one")
    budget_ = parse_budget(max_drop) if max_drop else None
    if (keep_fp32 or budget_) and (images_dir is None) == (data_dir is None):
        raise QtoolError(f"{'--keep-fp32' if keep_fp32 else '--max-drop'} measures on real inputs: give exactly one of --images DIR or --data DIR")
    if not (keep_fp32 or budget_) and (images_dir or data_dir or limit):
        raise QtoolError("--images, --data and --limit are only used with --keep-fp32 or --max-drop")
    loaded = load_checked_model(model_path, calib_path, cal)
    mixed = None
    if keep_fp32 or budget_:
        mixed = _mixed_precision(loaded, cal, target, keep_fp32, budget_, max_fp32, options, images_dir, data_dir, limit)
        options["exclude"] = options["exclude"] + mixed["exclude"]
    result = module.export(loaded, cal, **options)
    if mixed is not None:
        result.warnings[:0] = mixed.pop("warnings")
        mixed.pop("exclude")
        if "latency" in mixed:
            mixed["budget"]["latency_ms"] = _latency(target, result.data, *mixed.pop("latency"))
        result.summary.update(mixed)
    if target == "tensorrt":
        result.summary["trt_version_from"] = version_from
        build, notes = tensorrt.build_command(loaded, cal, fmt, trt_version, str(out), shown_path(loaded.path))
        if build:
            result.summary["build"] = build
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
    if target == "tensorrt":
        text += (f"\nTensorRT {trt_version} ({summary['trt_version_from']}), {fmt}{' FP8' if precision == 'fp8' else ''}, "
                 f"thresholds: {summary['method']}")
    text += _overflow_text(summary.get("overflow_fix"))
    emit(as_json, summary, text + (f"\nbuild it with: {summary['build']}" if "build" in summary else ""))


def _overflow_text(fix: dict | None) -> str:
    """One line per remedy of the overflow guard: which layers, and why (the summary's overflow_fix)."""
    if not fix or not fix["layers"]:
        return ""
    by_remedy: dict[str, list[str]] = {}
    for name, layer in fix["layers"].items():
        by_remedy.setdefault(layer["remedy"], []).append(name)
    what = {"fp32": "kept FP32", "7-bit weights": "7-bit weights", "uint8 weights": "uint8 weights (the same values)"}
    why = "where int8 pair sums can saturate on CPUs without VNNI" if fix["mode"] == "auto" else f"(--weights-7bit {fix['mode']})"
    return "".join(f"\noverflow guard: {len(names)} layer(s) {what[remedy]} {why}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                   for remedy, names in by_remedy.items())
