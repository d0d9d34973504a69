"""`qtool report`: a self-contained HTML page of a calibration file as one target's export uses it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from .. import calibration
from .. import report as rep
from ..errors import QtoolError
from ..fileio import Outputs, file_input, model_input
from ..inputs import load_checked_model
from . import EPILOG, cli, emit

log = logging.getLogger("qtool")


@cli.command(epilog=EPILOG)
@click.argument("calib_path", metavar="FILE", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="HTML file [default: FILE's name with .report.html, here].")
@click.option("--target", type=click.Choice(rep.TARGETS),
              help=f"Whose export to show: its quantized tensors, thresholds and scales [default: the --evaluation file's target, else {rep.DEFAULT_TARGET}, qtool evaluate's default].")
@click.option("--trt-version", help="--target tensorrt: the TensorRT version, as qtool export takes it [default: the installed one, else the newest qtool knows].")
@click.option("--method", help="The threshold method, as qtool export --method takes it [default: what export uses].")
@click.option("--model", "model_path", type=click.Path(path_type=Path), help="The calibrated model [default: the path FILE records].")
@click.option("--evaluation", type=click.Path(path_type=Path), help="JSON from qtool evaluate --json (--tensors) for the same model and target: adds each tensor's output SQNR and the output metrics.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def report(calib_path, output, target, trt_version, method, model_path, evaluation, as_json):
    """Write one HTML page showing FILE (a .calib.json) as a target's export uses it: a plot of the
    error per quantized tensor in graph order, then the tensors the target quantizes with the
    threshold and scale the export writes (a histogram of |x| with every method's threshold on
    each), sortable; the tensors it leaves float, the FP32 layers and the weights folded. Self-contained
    (inline SVG plots, no network). Needs matplotlib: pip install 'qtool[report]'.
    """
    started = time.perf_counter()
    rep.require_matplotlib()
    name = calib_path.name.removesuffix(".json").removesuffix(".calib")
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    outs = Outputs(inputs=(file_input(calib_path, "the calibration file"), file_input(evaluation, "the --evaluation file"),
                           model_input(source, "the calibrated model")))
    out = outs.add(output or Path(f"{name}.report.html"))
    evaluated = rep.load_evaluation(evaluation, cal) if evaluation is not None else None
    chosen, why = (target, "given with --target") if target else rep.default_target(evaluated)
    if model_path is None and not source.exists():
        raise QtoolError(f"the calibrated model {str(source)!r} (recorded in {str(calib_path)!r}) is missing; pass it with --model")
    loaded = load_checked_model(model_path, calib_path, cal)
    plan = rep.target_plan(loaded, cal, chosen, why=why, trt_version=trt_version, method=method)
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
    emit(as_json, summary, f"report of {len(cal.tensors)} tensors for {chosen} ({len(plan.sites)} quantized) in {seconds:.1f} s -> {out}")
