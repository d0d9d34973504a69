"""`qtool inspect`: what a calibration file or a TensorRT range file holds, and what it covers
(qtool.api.inspect_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import policy_options


@cli.command(epilog=EPILOG)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--model", "model", type=click.Path(path_type=Path), help="Report which activation tensors of this ONNX model FILE covers; exit 1 if any is missing.")
@click.option("--trt-version", help="FILE is a Q/DQ ONNX model: list every way its QuantizeLinear/DequantizeLinear nodes break this TensorRT version's ONNX parser rules (e.g. 8.6, 10.3, 11.4); exit 1 if any.")
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def inspect(file, model, trt_version, as_json, **policy_flags):
    """Show what FILE holds: a calibration file, a TensorRT cache, a dynamic-range file or an
    onnxruntime TensorRT table (told apart by content).

    Calibration files list min, max, amax, unsigned and method per tensor; caches also show the
    decoded header (version number -> TensorRT X.Y.Z, algorithm) and each entry's hex and scale.
    Tensors are sorted by name.

    With --trt-version X, FILE is an ONNX model with QuantizeLinear/DequantizeLinear nodes: each
    rule of TensorRT X's ONNX parser it breaks is printed as `node: rule: message`.

    With --policy FILE (or the other policy options), FILE is a calibration file: every quantizer
    the openvino/qdq export of its model places is listed with the policy it resolves to.
    """
    finish(call(api.inspect_file, file, model=model, trt_version=trt_version, **policy_flags), as_json, text)


def text(summary: dict, details: dict) -> str:
    return details["text"]
