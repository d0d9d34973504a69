"""`qtool report`: a self-contained HTML page of a calibration file as one target's export uses it
(qtool.api.report_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import json_option, option, target_option


@cli.command(epilog=EPILOG)
@click.argument("calib_path", metavar="FILE", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="HTML file [default: FILE's name with .report.html, here].")
@target_option(help=f"Whose export to show [default: the one FILE or the --evaluation file records, else {api.DEFAULT_TARGET}].")
@option("trt_version", "report")
@option("method", "report")
@click.option("--model", "model", type=click.Path(path_type=Path), help="The calibrated model [default: the path FILE records].")
@click.option("--evaluation", type=click.Path(path_type=Path), help="JSON from qtool evaluate --json (--tensors) for the same model and target: adds each tensor's output SQNR and the output metrics.")
@json_option()
def report(calib_path, output, target, trt_version, method, model, evaluation, as_json):
    """Write one HTML page showing FILE (a .calib.json) as a target's export uses it: a plot of the
    error per quantized tensor in graph order, then the tensors the target quantizes with the
    threshold and scale the export writes (a histogram of |x| with every method's threshold on
    each), sortable; the tensors it leaves float, the FP32 layers and the weights folded. Self-contained
    (inline SVG plots, no network). Needs matplotlib: pip install 'qtool[report]'.

    FILE may be an ONNX file qtool export wrote: the calibration file, target, method and target
    version it records (the calibration file found beside it or here, checked by SHA-256).
    """
    finish(call(api.report_file, calib_path, output=output, target=target, trt_version=trt_version, method=method,
                model=model, evaluation=evaluation), as_json, text)


def text(result: api.ReportResult) -> str:
    return (f"report of {result.tensors} tensors for {result.target} ({result.quantized} quantized) in {result.seconds:.1f} s "
            f"-> {result.output}")
