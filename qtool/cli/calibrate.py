"""`qtool calibrate`: inputs through the model, histograms, thresholds, calibration file
(qtool.api.calibrate_files), and what it prints."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish, progress
from .declared import json_option, options

CALIBRATE = tuple(k for k in api.COMMAND_OPTIONS["calibrate"] if k not in api.CALIBRATE_FILES)  # qtool.options.CalibrateOptions'


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@options("calibrate", CALIBRATE)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Calibration file [default: <model stem>.calib.json here].")
@options("calibrate", api.CALIBRATE_FILES)
@json_option()
@click.pass_context
def calibrate(ctx, model_path, as_json, **keywords):
    """Run MODEL on calibration inputs and write per-tensor INT8 ranges.

    Inputs are images (--images, single-input image models) or arrays (--data, any model).
    Every float activation tensor is histogrammed (|x|, --bins bins) while the inputs stream
    through onnxruntime, and its clipping threshold is chosen by --method. The calibration file
    keeps the histograms, so thresholds can be recomputed without running the model again.
    """
    with progress(0, not (ctx.obj["quiet"] or as_json)) as bar:
        outcome = call(api.calibrate_files, model_path, progress=bar, **keywords)
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
