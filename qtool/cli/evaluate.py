"""`qtool evaluate`: a target's int8 model (the exact simulation of its file, and on request the
real runtime on this CPU) against FP32 on held-out inputs."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

import click

from .. import calibration, data
from .. import evaluation as ev
from ..api import EXPORT_OPTIONS
from ..errors import QtoolError
from ..inputs import DEFAULT_BATCH, find_calibration, held_out_runs, load_checked_model, model_json
from ..targets import TARGETS, get, runtimes
from . import EPILOG, cli, emit, policies_from, policy_options
from .export import check_target_options, option

log = logging.getLogger("qtool")

_FLAGS = ("size", "resize", "scale", "mean", "std", "bgr", "layout")


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", file=sys.stderr, disable=not (enabled and sys.stderr.isatty()), leave=False)


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--calib", type=click.Path(path_type=Path), help="Calibration file [default: the single *.calib.json here].")
@click.option("--images", "images_dir", type=click.Path(path_type=Path), help="Folder of held-out images (single-input image models).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), help="Folder of held-out .npy (single-input models) or .npz (keys = input names) files.")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N images or data files.")
@click.option("--size", help="HxW [default: the calibration file's].")
@click.option("--resize", type=click.Choice(data.RESIZE_MODES), help="Image fitting [default: the calibration file's].")
@click.option("--scale", "scale_text", help="Pixel multiplier [default: the calibration file's].")
@click.option("--mean", help="Per-channel mean [default: the calibration file's].")
@click.option("--std", help="Per-channel std [default: the calibration file's].")
@click.option("--bgr/--rgb", default=None, help="Channel order [default: the calibration file's].")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), help="Input layout [default: the calibration file's].")
@click.option("--batch-size", type=click.IntRange(min=1), help=f"Images per inference [default: the model's fixed batch, else {DEFAULT_BATCH}]; results do not depend on it.")
@click.option("--target", type=click.Choice(TARGETS), default="qdq", show_default=True, help="Whose export to evaluate: " + ", ".join(f"{t} ({get(t).description})" for t in TARGETS) + ".")
@click.option("--runtime", type=click.Choice(tuple(runtimes())), help="Also run the file in this runtime on this CPU (its int8 kernels): " + " or ".join(f"{r} (--target {' or '.join(ts)})" for r, ts in runtimes().items()) + ", and report both; a warning names the likely cause where they differ by more than 1 dB.")
@option("method", "evaluate")
@option("exclude", "evaluate")
@option("include", "evaluate")
@option("weights_7bit", "evaluate")
@option("smooth_quant", "evaluate")
@option("ignored_patterns", "evaluate")
@option("bias_correction", "evaluate")
@option("trt_version", "evaluate")
@option("fmt", "evaluate")
@option("high_precision", "evaluate")
@option("precision", "evaluate")
@click.option("--tensors/--no-tensors", "per_tensor", default=False, show_default=True, help="openvino/qdq: also rank every quantized tensor by the output SQNR of quantizing it alone (one model run over the inputs per tensor: slow on large models).")
@click.option("--fail-below", type=float, metavar="DB", help="Exit 1 when an output's SQNR (of the simulation) is below DB decibels (a quality gate); the results are printed first.")
@policy_options(scale_flag="--scale-kind")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (infinite SQNR as the string \"inf\").")
@click.pass_context
def evaluate(ctx, model_path, calib, images_dir, data_dir, limit, size, resize, scale_text, mean, std, bgr, layout,
             batch_size, target, runtime, method, exclude, include, weights_7bit, smooth_quant, no_ignored_patterns, no_bias_correction,
             trt_version, fmt, high_precision, precision, per_tensor, fail_below, weight_bits, activation_bits, scale_kind, activation_mode,
             rounding, policy_file, as_json):
    """Compare a target's int8 model with FP32 on held-out inputs.

    The int8 model is the target's export (as qtool export --target writes it, built in memory),
    run as an exact simulation of the file's arithmetic: onnxruntime with graph optimization off
    (Q/DQ as float operations; OpenVINO's FakeQuantize rewritten into float ops), the same number
    on every CPU. --runtime also runs the file in that runtime on this CPU: on x86 CPUs without
    VNNI its int8 kernels can saturate. Images are preprocessed as the calibration file records
    unless flags override it. Use inputs the calibration did not see.

    Per model output: SQNR in dB (10 log10 of signal power over error power, over all
    samples; +inf when identical), cosine similarity, and for outputs shaped [N, classes] the
    share of samples whose top-1 class agrees. With --tensors, per quantized tensor (activation
    or weight quantizer): the output SQNR when only that tensor is quantized, worst first, with
    the layers reading it (qtool export --keep-fp32 N keeps the layers of the N worst in FP32;
    --exclude them yourself to use this ranking on your data).
    """
    started = time.perf_counter()
    check_target_options(target, trt_version=trt_version, fmt=fmt, high_precision=high_precision, precision=precision, weights_7bit=weights_7bit, smooth_quant=smooth_quant,
                         no_ignored_patterns=no_ignored_patterns, weight_bits=weight_bits, activation_bits=activation_bits,
                         scale=scale_kind, activations=activation_mode, rounding=rounding, policy=policy_file)
    try:
        ev.check_request(target, runtime, per_tensor)
    except QtoolError as e:
        raise click.UsageError(str(e)) from None
    if (images_dir is None) == (data_dir is None):
        raise QtoolError("give exactly one of --images DIR or --data DIR")
    if fail_below is not None and not math.isfinite(fail_below):
        raise QtoolError(f"--fail-below {fail_below} must be a finite number of decibels")
    given = {name for name, value in zip(_FLAGS, (size, resize, scale_text, mean, std, bgr, layout)) if value is not None}
    if data_dir is not None and given:
        raise QtoolError(f"--{min(given)} applies to --images; .npy/.npz data is fed as it is")
    calib_path = find_calibration(calib)
    cal = calibration.load(calib_path)
    loaded = load_checked_model(model_path, calib_path, cal)

    inputs, runs = held_out_runs(loaded, cal, images_dir, data_dir, limit, batch_size, size=size, resize=resize,
                                 scale_text=scale_text, mean=mean, std=std, bgr=bgr, layout=layout)

    options = {k: v for k, v in dict(
        exclude=list(exclude), include=list(include), weights_7bit=weights_7bit, smooth_quant=smooth_quant or "auto", method=method,
        ignored_patterns=not no_ignored_patterns, bias_correction=not no_bias_correction,
        trt_version=trt_version, fmt=fmt, high_precision=high_precision, precision=precision or "int8",
        policies=policies_from(weight_bits, activation_bits, scale_kind, activation_mode, rounding, policy_file),
    ).items() if k in EXPORT_OPTIONS[target]}
    with _progress(1, not (ctx.obj["quiet"] or as_json)) as bar:
        result = ev.evaluate(loaded, cal, runs, target=target, runtime=runtime, per_tensor=per_tensor, progress=bar, **options)
    for w in result.warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    failing = [o for o in result.outputs if fail_below is not None and not o.sqnr_db >= fail_below]
    summary = {
        "command": "evaluate", "model": model_json(loaded.path), "model_sha256": loaded.sha256, "calibration": str(calib_path),
        "inputs": len(inputs), **ev.to_json(result),
        "fail_below": fail_below, "passed": None if fail_below is None else not failing,
        "seconds": round(seconds, 3), "warnings": result.warnings,
    }
    emit(as_json, summary, _text(result, len(inputs), "images" if images_dir is not None else "data files", seconds))
    if failing:
        worst = min(failing, key=lambda o: (o.sqnr_db if not math.isnan(o.sqnr_db) else -math.inf))
        raise QtoolError(
            f"output {worst.name!r} SQNR {ev.format_db(worst.sqnr_db)} dB is below --fail-below {fail_below:g} dB"
            + (f" ({len(failing)} outputs fail)" if len(failing) > 1 else "")
        )


def _text(result: ev.Evaluation, inputs: int, what: str, seconds: float) -> str:
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
        lines[0] += f"; also run by {rt.name} on this CPU ({_vnni(rt.vnni)})"
        head += f"  {rt.name + ' dB':>16}  {rt.name + ' top-1':>17}"
    lines.append(head)
    for i, o in enumerate(result.outputs):
        cos = "nan" if math.isnan(o.cosine) else f"{o.cosine:.5f}"
        line = f"{o.name:<{width}}  {ev.format_db(o.sqnr_db):>8}  {cos:>8}  {_top1(o):>11}"
        if rt is not None:
            line += f"  {ev.format_db(rt.outputs[i].sqnr_db):>16}  {_top1(rt.outputs[i]):>17}"
        lines.append(line)
    if result.tensors:
        lines.append("quantized tensors, most harmful first (output SQNR dB with only that tensor quantized):")
        for i, t in enumerate(result.tensors, 1):
            lines.append(f"{i:>4}  {ev.format_db(t.sqnr_db):>8}  {t.kind:<10}  {t.tensor}  -> {', '.join(t.layers) or '-'}")
    return "\n".join(lines)


def _top1(o: ev.OutputMetrics) -> str:
    return f"{o.top1_agreement * 100:.2f} %" if o.top1_agreement is not None else "-"


def _vnni(has: bool | None) -> str:
    return "VNNI" if has else "no VNNI" if has is False else "VNNI unknown"
