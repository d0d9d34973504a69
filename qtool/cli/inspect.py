"""`qtool inspect`: what a calibration file or a target's range file holds, and what it covers
(qtool.api.inspect_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import json_option, options, policy_options

HELP = """Show what FILE holds: a calibration file or a target's range file (told apart by content).

Calibration files list min, max, amax, unsigned and method per tensor. Tensors are sorted by name.

""" + "\n\n".join(api.INSPECT_HELP) + """

With --policy FILE (or the other policy options), FILE is a calibration file: every quantizer
the openvino/qdq export of its model places is listed with the policy it resolves to."""


@cli.command(epilog=EPILOG, help=HELP)
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--model", "model", type=click.Path(path_type=Path), help="Report which activation tensors of this ONNX model FILE covers; exit 1 if any is missing.")
@options("inspect")  # each target's check (qtool.api.COMMAND_OPTIONS["inspect"])
@policy_options
@json_option("JSON")
def inspect(file, model, as_json, **keywords):
    finish(call(api.inspect_file, file, model=model, **keywords), as_json, text)


def text(result: api.InspectResult) -> str:
    """What inspect prints: a target's check of a model, each quantizer's policy, or a file's header,
    tensors (a table) and coverage."""
    if result.check is not None:
        return "\n".join(result.target_lines)
    if result.kind == "policies":
        lines = [f"{len(result.quantizers)} quantizers of {result.model} (openvino/qdq placement):"]
        lines += [f"  {r['kind']:<10} {r['tensor']}  [{', '.join(r['read_by'])}]  {described}"
                  for r, described in zip(result.quantizers, result.policies)]
        return "\n".join(lines)
    header, tensors, cov = result.header, result.tensors, result.coverage
    title = f"{result.file}: {result.kind_name}, {len(tensors)} tensors"
    if result.kind == "calibration":
        title += f", method {tensors[0]['method'] if tensors else header['method']}, {header['samples']} samples, model {header['model']}"
    lines = [title, *result.target_lines]
    if tensors:
        lines.append(_table(tensors, result.columns))
    if cov is not None:
        lines.append(
            f"coverage of {cov['model']}: {cov['covered']}/{cov['activation_tensors']} activation tensors "
            f"({cov['percent']:g} %); {len(cov['missing'])} missing, {len(cov['extra'])} extra, "
            f"{len(cov['nonfinite'])} non-finite" + (f", {len(cov['nonpositive'])} zero or negative" if cov["nonpositive"] else "")
        )
        for key, label in (("missing", "missing"), ("nonfinite", "non-finite"), ("nonpositive", "zero or negative"), ("extra", "extra")):
            if cov[key]:
                lines.append(f"{label}: " + ", ".join(cov[key]))
    if result.unusable:
        lines.append("NaN, infinite, zero or negative scale: " + ", ".join(result.unusable))
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _table(rows, columns) -> str:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    cells = [list(columns)] + [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in cells
    )
