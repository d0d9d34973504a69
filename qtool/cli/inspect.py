"""`qtool inspect`: what a calibration file or a target's range file holds, and what it covers
(qtool.api.inspect_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import option, policy_options

HELP = """Show what FILE holds: a calibration file or a target's range file (told apart by content).

Calibration files list min, max, amax, unsigned and method per tensor. Tensors are sorted by name.

""" + "\n\n".join(api.INSPECT_HELP) + """

With --policy FILE (or the other policy options), FILE is a calibration file: every quantizer
the openvino/qdq export of its model places is listed with the policy it resolves to."""


def _checks(command):
    """Each target's check option (qtool.api.COMMAND_OPTIONS["inspect"])."""
    for key in reversed(list(api.COMMAND_OPTIONS["inspect"])):
        command = option(key, "inspect")(command)
    return command


@cli.command(epilog=EPILOG, help=HELP)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--model", "model", type=click.Path(path_type=Path), help="Report which activation tensors of this ONNX model FILE covers; exit 1 if any is missing.")
@_checks
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def inspect(file, model, as_json, **keywords):
    finish(call(api.inspect_file, file, model=model, **keywords), as_json, text)


def text(summary: dict, details: dict) -> str:
    return details["text"]
