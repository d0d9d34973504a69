"""`qtool recompute`: new thresholds from the histograms a calibration file keeps (no model run)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from .. import calibration, thresholds
from ..errors import QtoolError
from ..fileio import Outputs, model_input
from . import EPILOG, cli, emit

log = logging.getLogger("qtool")


def _parse_method(text: str) -> str:
    try:
        return thresholds.parse_method(text)
    except ValueError as e:
        raise QtoolError(f"--method: {e}") from None


@cli.command(epilog=EPILOG)
@click.argument("calib_path", metavar="FILE", type=click.Path(path_type=Path))
@click.option("--method", "method_text", help=f"Threshold method: {', '.join(thresholds.METHODS + thresholds.SAMPLE_METHODS)} [default: the file's].")
@click.option("--kl-variant", type=click.Choice(thresholds.KL_VARIANTS), help="Whose entropy search to reproduce [default: the file's].")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result here [default: rewrite FILE in place].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def recompute(calib_path, method_text, kl_variant, output, as_json):
    """Recompute every threshold of FILE (a .calib.json) from the histograms it keeps.

    The model is not run: each tensor's stored histogram is searched again with --method
    (and --kl-variant for entropy). FILE is our own output, so it is rewritten in place,
    atomically, unless -o names another file.
    """
    started = time.perf_counter()
    method = _parse_method(method_text) if method_text is not None else None  # fails before any reading
    if kl_variant is not None and method not in (None, "entropy"):
        raise QtoolError(f"--kl-variant chooses whose entropy search to use; it does not apply to --method {method}")
    cal = calibration.load(calib_path)  # refuses unknown recorded methods and variants
    method = method or thresholds.parse_method(cal.method)
    if kl_variant is not None and method != "entropy":
        raise QtoolError(f"--kl-variant chooses whose entropy search to use; {str(calib_path)!r} uses {method} (add --method entropy)")
    variant = kl_variant or cal.kl_variant
    outs = Outputs(inputs=(model_input(calib_path.parent / cal.model_path, "the calibrated model"),))  # FILE itself may be rewritten
    out = outs.add(output or calib_path)
    new = calibration.recompute(cal, method, variant)
    with outs:
        # the model path, recorded relative to FILE, is written relative to the output
        outs.write(out, calibration.to_json(calibration.relocate(new, out, source=calib_path)).encode())
        outs.commit()
    changed = sum(a.amax != b.amax for a, b in zip(cal.tensors, new.tensors))
    zero = [t.name for t in new.tensors if t.amax == 0]
    warnings = [f"{len(zero)} tensor(s) have amax 0 (everything quantizes to 0): {', '.join(zero[:5])}"] if zero else []
    for w in warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    label = f"entropy/{variant}" if method == "entropy" else method
    summary = {
        "command": "recompute", "calibration": str(calib_path), "outputs": {"calibration": str(out)},
        "tensors": len(new.tensors), "changed": changed, "method": method, "kl_variant": variant,
        "seconds": round(seconds, 3), "warnings": warnings,
    }
    text = f"recomputed {len(new.tensors)} thresholds ({label}; {changed} changed) in {seconds:.2f} s -> {out}"
    emit(as_json, summary, text)
