"""`qtool calibrate`: inputs through the model, histograms, thresholds, calibration file
(qtool.api.calibrate_files), and what it prints."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish, progress
from .declared import option


def target_files(command):
    """The options of the files targets write beside the calibration file (qtool.api.COMMAND_OPTIONS["calibrate"])."""
    for key in reversed(list(api.COMMAND_OPTIONS["calibrate"])):
        command = option(key, "calibrate")(command)
    return command


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--images", type=click.Path(path_type=Path), help="Folder of calibration images (JPEG/PNG/BMP, sorted by name, searched recursively).")
@click.option("--data", type=click.Path(path_type=Path), help="Folder of .npy (single-input models) or .npz (keys = input names) files, one run each; or one such file of samples along the first axis.")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N images, data files or samples of a data file.")
@click.option("--on-bad-image", type=click.Choice(["fail", "skip"]), default="fail", show_default=True, help="An unreadable image stops the run, or is skipped with a warning.")
@click.option("--shard", help="K/N: calibrate only every N-th input starting with the K-th; combine shards with qtool merge.")
@click.option("--size", help="HxW to resize to; needed only when the model's height/width are dynamic.")
@click.option("--resize", type=click.Choice(api.RESIZE_MODES), default="stretch", show_default=True, help="How images are fitted to HxW (letterbox pads with grey 114).")
@click.option("--scale", default="1/255", show_default=True, help="Pixel multiplier, a number or fraction.")
@click.option("--mean", help="Per-channel mean subtracted after scaling, e.g. 0.485,0.456,0.406.")
@click.option("--std", help="Per-channel std divided by after the mean, e.g. 0.229,0.224,0.225.")
@click.option("--bgr", is_flag=True, help="Feed channels in BGR order (OpenCV-trained models).")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), help="Input layout [default: inferred from the model input].")
@click.option("--batch-size", type=click.IntRange(min=1), help="Images per inference [default: the model's fixed batch, else as many as fit 64 MB of activations]; results do not depend on it.")
@click.option("--bins", type=int, default=2048, show_default=True, help="Histogram bins per tensor (a power of two).")
@click.option("--method", help="Threshold method kept by every export (as qtool export --method) [default: entropy; each export picks its own].")
@click.option("--kl-variant", type=click.Choice(api.KL_VARIANTS), default="nvidia", show_default=True, help="Whose entropy search to reproduce.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Calibration file [default: <model stem>.calib.json here].")
@target_files
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.pass_context
def calibrate(ctx, model_path, as_json, **options):
    """Run MODEL on calibration inputs and write per-tensor INT8 ranges.

    Inputs are images (--images, single-input image models) or arrays (--data, any model).
    Every float activation tensor is histogrammed (|x|, --bins bins) while the inputs stream
    through onnxruntime, and its clipping threshold is chosen by --method. The calibration file
    keeps the histograms, so thresholds can be recomputed without running the model again.
    """
    with progress(0, not (ctx.obj["quiet"] or as_json)) as bar:
        outcome = call(api.calibrate_files, model_path, progress=bar, **options)
    finish(outcome, as_json, text)


def text(result: api.CalibrateResult) -> str:
    """What calibrate prints: tensors, inputs, time and method, the files written."""
    what = "images" if result.images is not None else "data files"
    used, samples, skipped = result.inputs - result.skipped, result.samples, result.skipped
    counted = f"{used} {what}" + (f" ({samples} samples)" if what == "data files" and samples != used else "")
    if result.data_file is not None:
        counted = f"{samples} samples in {result.data_file!r}"
    if skipped:
        counted += f", {skipped} unreadable skipped"
    line = f"calibrated {result.tensors} tensors from {counted} in {result.seconds:.1f} s ({result.method}) -> {result.outputs['calibration']}"
    return "\n".join([line, *result.target_lines])
