"""`qtool merge`: combine calibration files (shards) exactly (qtool.api.merge_files)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import json_option


@cli.command(epilog=EPILOG)
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="The merged calibration file.")
@json_option()
def merge(files, output, as_json):
    """Combine calibration FILES of one model made on different inputs (e.g. --shard K/N runs).

    Histograms add exactly and thresholds are recomputed, so merging the shards of a run gives
    the same file, byte for byte, as calibrating all inputs at once.
    """
    finish(call(api.merge_files, files, output), as_json, text)


def text(result: api.MergeResult) -> str:
    return f"merged {len(result.inputs)} files ({result.samples} samples, {result.tensors} tensors) -> {result.output}"
