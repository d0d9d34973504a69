"""`qtool evaluate`: a target's int8 model (the exact simulation of its file, and on request the
real runtime on this CPU) against FP32 on held-out inputs (qtool.api.evaluate_files)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish, policy_options
from .export import option


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", file=sys.stderr, disable=not (enabled and sys.stderr.isatty()), leave=False)


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--calib", type=click.Path(path_type=Path), help="Calibration file [default: the single *.calib.json here].")
@click.option("--images", "images", type=click.Path(path_type=Path), help="Folder of held-out images (single-input image models).")
@click.option("--data", "data", type=click.Path(path_type=Path), help="Folder of held-out .npy (single-input models) or .npz (keys = input names) files.")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N images or data files.")
@click.option("--size", help="HxW [default: the calibration file's].")
@click.option("--resize", type=click.Choice(api.RESIZE_MODES), help="Image fitting [default: the calibration file's].")
@click.option("--scale", "scale", help="Pixel multiplier [default: the calibration file's].")
@click.option("--mean", help="Per-channel mean [default: the calibration file's].")
@click.option("--std", help="Per-channel std [default: the calibration file's].")
@click.option("--bgr/--rgb", default=None, help="Channel order [default: the calibration file's].")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), help="Input layout [default: the calibration file's].")
@click.option("--batch-size", type=click.IntRange(min=1), help=f"Images per inference [default: the model's fixed batch, else {api.DEFAULT_BATCH}]; results do not depend on it.")
@click.option("--target", type=click.Choice(api.TARGETS), default="qdq", show_default=True, help="Whose export to evaluate: " + ", ".join(f"{t} ({d})" for t, d in api.TARGET_DESCRIPTIONS.items()) + ".")
@click.option("--runtime", type=click.Choice(tuple(api.runtimes())), help="Also run the file in this runtime on this CPU (its int8 kernels): " + " or ".join(f"{r} (--target {' or '.join(ts)})" for r, ts in api.runtimes().items()) + ", and report both; a warning names the likely cause where they differ by more than 1 dB.")
@option("method", "evaluate")
@option("exclude", "evaluate")
@option("include", "evaluate")
@option("cpu", "evaluate")
@option("weights_7bit", "evaluate")
@option("smooth_quant", "evaluate")
@option("ignored_patterns", "evaluate")
@option("bias_correction", "evaluate")
@option("trt_version", "evaluate")
@option("fmt", "evaluate")
@option("high_precision", "evaluate")
@option("precision", "evaluate")
@click.option("--tensors/--no-tensors", "tensors", default=False, show_default=True, help="openvino/qdq: also rank every quantized tensor by the output SQNR of quantizing it alone (one model run over the inputs per tensor: slow on large models).")
@click.option("--fail-below", type=float, metavar="DB", help="Exit 1 when an output's SQNR (of the simulation) is below DB decibels (a quality gate); the results are printed first.")
@policy_options(scale_flag="--scale-kind")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout (infinite SQNR as the string \"inf\").")
@click.pass_context
def evaluate(ctx, model_path, calib, images, data, limit, size, resize, scale, mean, std, bgr, layout,
             batch_size, target, runtime, method, exclude, include, cpu, weights_7bit, smooth_quant, ignored_patterns, bias_correction,
             trt_version, fmt, high_precision, precision, tensors, fail_below, weight_bits, activation_bits, scale_kind, activations,
             rounding, policy, as_json):
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
    with _progress(1, not (ctx.obj["quiet"] or as_json)) as bar:
        outcome = call(api.evaluate_files, model_path, calib=calib, images=images, data=data, limit=limit, size=size,
                       resize=resize, scale=scale, mean=mean, std=std, bgr=bgr, layout=layout, batch_size=batch_size,
                       target=target, runtime=runtime, method=method, exclude=exclude, include=include, cpu=cpu, weights_7bit=weights_7bit,
                       smooth_quant=smooth_quant, ignored_patterns=ignored_patterns, bias_correction=bias_correction,
                       trt_version=trt_version, fmt=fmt, high_precision=high_precision, precision=precision, tensors=tensors,
                       fail_below=fail_below, weight_bits=weight_bits, activation_bits=activation_bits, scale_kind=scale_kind,
                       activations=activations, rounding=rounding, policy=policy, progress=bar)
    finish(outcome, as_json)
