"""`qtool report`: a self-contained HTML page of a calibration file's histograms and thresholds."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from .. import calibration
from .. import report as rep
from ..fileio import Outputs, file_input, model_input
from . import EPILOG, cli, emit

log = logging.getLogger("qtool")


@cli.command(epilog=EPILOG)
@click.argument("calib_path", metavar="FILE", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="HTML file [default: FILE's name with .report.html, here].")
@click.option("--evaluation", type=click.Path(path_type=Path), help="JSON from qtool evaluate --json for the same model: adds each tensor's SQNR (sortable) and the output metrics.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def report(calib_path, output, evaluation, as_json):
    """Write one HTML page showing FILE (a .calib.json): per tensor a histogram of |x| (log
    counts) with the threshold of every method drawn on it, and its min, max, amax, clipped
    fraction and KL divergence, sortable by column. Self-contained (inline SVG plots, no
    network). Needs matplotlib: pip install 'qtool[report]'.
    """
    started = time.perf_counter()
    rep.require_matplotlib()
    name = calib_path.name.removesuffix(".json").removesuffix(".calib")
    cal = calibration.load(calib_path)
    outs = Outputs(inputs=(file_input(calib_path, "the calibration file"), file_input(evaluation, "the --evaluation file"),
                           model_input(calib_path.parent / cal.model_path, "the calibrated model")))
    out = outs.add(output or Path(f"{name}.report.html"))
    evaluated = rep.load_evaluation(evaluation, cal) if evaluation is not None else None
    page = rep.render(cal, calib_path.name, evaluated)
    with outs:
        outs.write(out, page)
        outs.commit()
    seconds = time.perf_counter() - started
    summary = {
        "command": "report", "calibration": str(calib_path), "evaluation": str(evaluation) if evaluation else None,
        "outputs": {"report": str(out)}, "tensors": len(cal.tensors), "bytes": len(page), "seconds": round(seconds, 3),
    }
    emit(as_json, summary, f"report of {len(cal.tensors)} tensors in {seconds:.1f} s -> {out}")
