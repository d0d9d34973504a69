"""`qtool inspect`: what a calibration file or a TensorRT range file holds, and what it covers
(qtool.api.inspect_file)."""

from __future__ import annotations

from collections import Counter
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


KINDS = {
    "calibration": "qtool calibration file",
    "tensorrt-cache": "TensorRT calibration cache",
    "dynamic-range": "TensorRT sampleINT8API dynamic-range file",
    "ort-trt": "onnxruntime TensorRT EP calibration table",
}


def text(result: api.InspectResult) -> str:
    """What inspect prints: the violations of an ONNX model, each quantizer's policy, or a file's
    header, tensors (a table) and coverage."""
    if result.kind == "onnx":
        return _violations(result)
    if result.kind == "policies":
        lines = [f"{len(result.quantizers)} quantizers of {result.model} (openvino/qdq placement):"]
        lines += [f"  {r['kind']:<10} {r['tensor']}  [{', '.join(r['read_by'])}]  {described}"
                  for r, described in zip(result.quantizers, result.policies)]
        return "\n".join(lines)
    kind, header, tensors, cov = result.kind, result.header, result.tensors, result.coverage
    title = f"{result.file}: {KINDS[kind]}, {len(tensors)} tensors"
    if kind == "calibration":
        title += f", method {tensors[0]['method'] if tensors else header['method']}, {header['samples']} samples, model {header['model']}"
        columns = ["name", "min", "max", "amax", "unsigned", "method"]
    elif kind == "tensorrt-cache":
        version = f"TensorRT {header['tensorrt']}" if header["tensorrt"] else f"unknown TensorRT version number {header['version']}"
        title += f"\nheader {header['line']}: {version}, {header['algorithm']}"
        columns = ["name", "hex", "scale", "amax"]
    else:
        columns = ["name", "amax"]
    lines = [title]
    if tensors:
        lines.append(_table(tensors, columns))
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


def _violations(result: api.InspectResult) -> str:
    found, version = result.violations, result.rules_version
    lines = [f"{v['node'] or '<model>'}: {v['rule']}: {v['message']}" for v in found]
    if found:
        counts = ", ".join(f"{rule} {n}" for rule, n in sorted(Counter(v["rule"] for v in found).items()))
        lines.append(f"{result.file}: {len(found)} violation(s) of the TensorRT {version} Q/DQ rules, {result.qdq_nodes} Q/DQ nodes ({counts})")
    else:
        lines.append(f"{result.file}: no violation of the TensorRT {version} Q/DQ rules, {result.qdq_nodes} Q/DQ nodes")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _table(rows, columns: list[str]) -> str:
    """Rows as aligned columns: the first left-aligned, the others right-aligned."""
    cells = [columns] + [[_cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        for row in cells
    )
