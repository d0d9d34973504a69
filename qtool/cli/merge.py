"""`qtool merge`: combine calibration files (shards) exactly."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .. import calibration
from ..errors import QtoolError
from ..fileio import Outputs, file_input, model_input, same_file
from . import EPILOG, cli, emit


@cli.command(epilog=EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="The merged calibration file.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def merge(files, output, as_json):
    """Combine calibration FILES of one model made on different inputs (e.g. --shard K/N runs).

    Histograms add exactly and thresholds are recomputed, so merging the shards of a run gives
    the same file, byte for byte, as calibrating all inputs at once.
    """
    started = time.perf_counter()
    for i, f in enumerate(files):  # a file given twice would silently count its inputs twice
        twice = next((g for g in files[:i] if same_file(f, g)), None)
        if twice is not None:
            what = f"{str(f)!r} is given twice" if str(f) == str(twice) else f"{str(twice)!r} and {str(f)!r} are the same file"
            raise QtoolError(f"cannot merge: {what} (its inputs would count twice); give each file once")
    cals = [calibration.load(f) for f in files]
    models = {str(f.parent / c.model_path): f.parent / c.model_path for f, c in zip(files, cals)}
    outs = Outputs(inputs=[file_input(f, "a calibration file being merged") for f in files]
                   + [model_input(m, "the calibrated model") for m in models.values()])
    output = outs.add(output)
    merged = calibration.merge(cals)
    with outs:
        # the model path, recorded relative to the first file, is written relative to the output
        outs.write(output, calibration.to_json(calibration.relocate(merged, output, source=files[0])).encode())
        outs.commit()
    seconds = time.perf_counter() - started
    summary = {"command": "merge", "inputs": [str(f) for f in files], "outputs": {"calibration": str(output)},
               "samples": merged.samples, "tensors": len(merged.tensors), "seconds": round(seconds, 3), "warnings": []}
    emit(as_json, summary, f"merged {len(files)} files ({merged.samples} samples, {len(merged.tensors)} tensors) -> {output}")
