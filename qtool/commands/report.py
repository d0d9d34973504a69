"""`qtool report`: one self-contained HTML page of a calibration file as one target's export uses it."""

from __future__ import annotations

import time
from pathlib import Path

from .. import calibration
from ..checks import report as rep
from ..errors import Opt, QtoolError
from ..fileio import Outputs, file_input, model_input, option_file
from ..inputs import load_checked_model
from . import Outcome, path


def run(file, *, output=None, target: str | None = None, trt_version: str | None = None, method: str | None = None,
        model=None, evaluation=None) -> Outcome:
    """The page of the calibration `file` as `target`'s export uses it, written to `output` [default:
    FILE's name with .report.html, here]; `evaluation`: JSON from qtool evaluate --json. Needs matplotlib."""
    started = time.perf_counter()
    calib_path, model_path, evaluation = Path(file), path(model), path(evaluation)
    if target is not None and target not in rep.TARGETS:
        raise QtoolError("{target} is not one of {targets}", target=Opt("target", target, quoted=True), targets=", ".join(rep.TARGETS))
    rep.require_matplotlib()
    name = calib_path.name.removesuffix(".json").removesuffix(".calib")
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    outs = Outputs(inputs=(file_input(calib_path, "the calibration file"), file_input(evaluation, option_file("evaluation", "the")),
                           model_input(source, "the calibrated model")))
    out = outs.add(path(output) or Path(f"{name}.report.html"))
    evaluated = rep.load_evaluation(evaluation, cal) if evaluation is not None else None
    chosen, why = (target, "given with --target") if target else rep.default_target(evaluated)
    if model_path is None and not source.exists():
        raise QtoolError("the calibrated model {source!r} (recorded in {file!r}) is missing; pass it with {model}", source=str(source),
                         file=str(calib_path), model=Opt("model"))
    loaded = load_checked_model(model_path, calib_path, cal)
    options = {"trt_version": trt_version} if trt_version is not None else {}
    plan = rep.target_plan(loaded, cal, chosen, why=why, method=method, **options)
    page = rep.render(cal, calib_path.name, plan, evaluated)
    with outs:
        outs.write(out, page)
        outs.commit()
    seconds = time.perf_counter() - started
    summary = {
        "command": "report", "calibration": str(calib_path), "evaluation": str(evaluation) if evaluation else None,
        "target": chosen, "target_from": why, "outputs": {"report": str(out)}, "tensors": len(cal.tensors),
        "quantized": len(plan.sites), "bytes": len(page), "seconds": round(seconds, 3),
    }
    return Outcome(summary, details={"seconds": seconds})
