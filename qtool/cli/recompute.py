"""`qtool recompute`: new thresholds from the histograms a calibration file keeps, no model run
(qtool.api.recompute_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import json_option, options


@cli.command(epilog=EPILOG)
@click.argument("calib_path", metavar="FILE", type=click.Path(path_type=Path))
@options("recompute")  # calibrate's --method and --kl-variant, defaulting to the file's
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result here [default: rewrite FILE in place].")
@json_option()
def recompute(calib_path, method, kl_variant, output, as_json):
    """Recompute every threshold of FILE (a .calib.json) from the histograms it keeps.

    The model is not run: each tensor's stored histogram is searched again with --method
    (and --kl-variant for entropy). FILE is our own output, so it is rewritten in place,
    atomically, unless -o names another file.
    """
    finish(call(api.recompute_file, calib_path, method=method, kl_variant=kl_variant, output=output), as_json, text)


def text(result: api.RecomputeResult) -> str:
    label = f"entropy/{result.kl_variant}" if result.method == "entropy" else result.method
    return f"recomputed {result.tensors} thresholds ({label}; {result.changed} changed) in {result.seconds:.2f} s -> {result.output}"
