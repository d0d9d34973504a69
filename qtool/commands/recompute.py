"""`qtool recompute`: new thresholds from the histograms a calibration file keeps, no model run."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import calibration
from ..errors import Opt, QtoolError
from ..fileio import Outputs, model_input
from ..options import method as checked_method
from ..results import RecomputeResult
from ..statistics import thresholds
from . import path

log = logging.getLogger("qtool")


def run(file, *, method: str | None = None, kl_variant: str | None = None, output=None) -> RecomputeResult:
    """Every threshold of the calibration `file` searched again from the histograms it keeps, with
    `method` [default: the file's]; written to `output` [default: `file` itself, atomically], which
    records the model relative to itself."""
    started = time.perf_counter()
    calib_path = Path(file)
    method = checked_method(method)  # fails before any reading
    if kl_variant is not None and method not in (None, "entropy"):
        raise QtoolError("{kl_variant} chooses whose entropy search to use; it does not apply to {method}", kl_variant=Opt("kl_variant"),
                         method=Opt("method", method))
    cal = calibration.load(calib_path)  # refuses unknown recorded methods and variants
    method = method or thresholds.parse_method(cal.method)
    if kl_variant is not None and method != "entropy":
        raise QtoolError("{kl_variant} chooses whose entropy search to use; {file!r} uses {method} (add {entropy})",
                         kl_variant=Opt("kl_variant"), file=str(calib_path), method=method, entropy=Opt("method", "entropy"))
    variant = kl_variant or cal.kl_variant
    outs = Outputs(inputs=(model_input(calib_path.parent / cal.model_path, "the calibrated model"),))  # FILE itself may be rewritten
    out = outs.add(path(output) or calib_path)
    new = calibration.recompute(cal, method, variant)
    with outs:
        # the model path, recorded relative to FILE, is written relative to the output
        outs.write(out, calibration.json_chunks(calibration.relocate(new, out, source=calib_path)))
        outs.commit()
    changed = sum(a.amax != b.amax for a, b in zip(cal.tensors, new.tensors))
    zero = [t.name for t in new.tensors if t.amax == 0]
    warnings = [f"{len(zero)} tensor(s) have amax 0 (everything quantizes to 0): {', '.join(zero[:5])}"] if zero else []
    for w in warnings:
        log.warning(w)
    return RecomputeResult(calibration=str(calib_path), output=str(out), tensors=len(new.tensors), changed=changed, method=method,
                           kl_variant=variant, seconds=time.perf_counter() - started, warnings=tuple(warnings))
