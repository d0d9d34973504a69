"""`qtool export`: a calibration (and its model) to a target format (qtool.api.export_file)."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import Grouped, calib_option, json_option, option, options, policy_options, target_option

MIXED = tuple(api.COMMAND_OPTIONS["export"])  # the layers kept FP32 by measurement


@cli.command(cls=Grouped, epilog=EPILOG, sections={f"Mixed precision ({'/'.join(api.ranked())})": MIXED})
@click.argument("model_path", metavar="[MODEL]", required=False, type=click.Path(path_type=Path))
@target_option(required=True, help=f"Output format: {', '.join(api.TARGETS)}.")
@calib_option()
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output file [default: <model stem> + the target's suffix, here].")
@option("trt_version")
@option("fmt")
@option("algorithm")
@option("method")
@option("high_precision")
@option("precision")
@option("weights")
@option("include")
@option("exclude")
@option("cpu")
@option("weights_7bit")
@option("smooth_quant")
@options("export")  # MIXED
@option("ignored_patterns")
@option("bias_correction")
@policy_options
@json_option()
def export(model_path, target, as_json, **options):
    """Write the calibrated ranges of MODEL in a target format.

    With no MODEL, the model recorded in the calibration file is used; either way it must be
    byte-identical (SHA-256) to the one calibrated.
    """
    finish(call(api.export_file, model_path, target=target, **options), as_json, text)


def text(result: api.ExportResult) -> str:
    """What export prints: the file written, the target's own lines, the overflow guard, the build command."""
    lines = [f"exported {result.target} from {result.calibration} in {result.seconds:.1f} s -> {result.output}", *result.target_lines]
    words = "\n".join(lines) + overflow_text(result.overflow_fix)
    return words + (f"\nbuild it with: {result.build}" if result.build is not None else "")


def overflow_text(fix: dict | None) -> str:
    """One line per remedy of the overflow guard: which layers, and why (the summary's overflow_fix)."""
    if not fix or not fix["layers"]:
        return ""
    by_remedy: dict[str, list[str]] = {}
    for name, layer in fix["layers"].items():
        by_remedy.setdefault(layer["remedy"], []).append(name)
    what = {"fp32": "kept FP32", "7-bit weights": "7-bit weights", "uint8 weights": "uint8 weights (the same values)",
            "pair-bounded weights": "int8 with weight steps widened just enough",
            "widened second input": "int8 with the second input's step widened",
            "7-bit input": "int8 with the input's codes held to 0..127 (twice its step)",
            "flipped input channels": "int8 with input channels negated (and their weights) so that fewer pairs share a sign"}
    why = "where int8 pair sums can saturate on CPUs without VNNI" if fix["mode"] == "auto" else f"(--weights-7bit {fix['mode']})"
    return "".join(f"\noverflow guard: {len(names)} layer(s) {what[remedy]} {why}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                   for remedy, names in by_remedy.items())
