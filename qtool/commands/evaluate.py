"""`qtool evaluate`: a target's int8 model (the exact simulation of its file, and on request the real
runtime on this CPU) against FP32 on held-out inputs."""

from __future__ import annotations

import logging
import math
import time

from .. import calibration
from ..checks import evaluation as _evaluate
from ..errors import Opt, QtoolError, UsageError
from ..inputs import find_calibration, held_out_runs, load_checked_model, model_json
from ..options import EvaluateOptions, exactly_one
from . import Outcome, done, path, progress_bar

log = logging.getLogger("qtool")


def check_request(options: EvaluateOptions) -> None:
    """A usage error for a target qtool cannot evaluate so, or a runtime that does not run its file;
    then the one source of inputs."""
    try:
        _evaluate.check_request(options.target, options.runtime, options.tensors)
    except QtoolError as e:
        raise UsageError(e.words.template, **e.words.fields) from None
    exactly_one(options.images, options.data)


def run(model_path, options: EvaluateOptions, *, calib=None, progress=None) -> Outcome:
    """options.target's int8 model of the calibration file `calib` [default: the single *.calib.json
    here] against FP32 on held-out images (preprocessed as the file records, options.image overriding
    its parts) or data. With options.fail_below DB, an output below it (the worse of the simulation and, with
    options.runtime, the runtime's run: evaluation.judged) is the Outcome's failure.
    `progress`: a tqdm bar or a callback(n) per model pass over the inputs."""
    started = time.perf_counter()
    check_request(options)
    calib_path = find_calibration(path(calib))
    cal = calibration.load(calib_path)
    loaded = load_checked_model(path(model_path), calib_path, cal)
    inputs, runs = held_out_runs(loaded, cal, options.images, options.data, options.limit, options.batch_size, options.image)
    result = _evaluate.evaluate(loaded, cal, runs, options.export, runtime=options.runtime, per_tensor=options.tensors,
                                progress=progress_bar(progress))
    done(progress)
    for w in result.warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    fail_below = options.fail_below
    failing = [(o, who) for o, who in _evaluate.judged(result) if fail_below is not None and not o.sqnr_db >= fail_below]
    summary = {
        "command": "evaluate", "model": model_json(loaded.path), "model_sha256": loaded.sha256, "calibration": str(calib_path),
        "inputs": len(inputs), **_evaluate.to_json(result),
        "fail_below": fail_below, "passed": None if fail_below is None else not failing,
        "seconds": round(seconds, 3), "warnings": result.warnings,
    }
    failure = None
    if failing:
        worst, who = min(failing, key=lambda f: (f[0].sqnr_db if not math.isnan(f[0].sqnr_db) else -math.inf))
        failure = QtoolError("output {name!r} SQNR {db} dB{by} is below {fail_below} dB{count}", name=worst.name,
                             db=_evaluate.format_db(worst.sqnr_db), by=f" ({who} on this CPU)" if who else "",
                             fail_below=Opt("fail_below", float(fail_below)),
                             count=f" ({len(failing)} outputs fail)" if len(failing) > 1 else "")
    what = "images" if options.images is not None else "data files"
    return Outcome(summary, failure, {"evaluation": result, "inputs": len(inputs), "what": what, "seconds": seconds})
