"""`qtool report`: one self-contained HTML page of a calibration file as one target's export uses it."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .. import calibration, model, provenance, targets
from ..checks import report as rep
from ..commandinputs import load_checked_model
from ..errors import Opt, QtoolError
from ..fileio import Outputs, file_input, model_input, option_file
from ..results import ReportResult
from ..targets import branches
from . import path

log = logging.getLogger("qtool")


def run(file, *, output=None, target: str | None = None, trt_version: str | None = None, method: str | None = None,
        model=None, evaluation=None) -> ReportResult:
    """The page of the calibration `file` as `target`'s export uses it, written to `output` [default:
    FILE's name with .report.html, here]; `evaluation`: JSON from qtool evaluate --json. Needs matplotlib.
    `file` may be an ONNX file qtool export wrote: the page of the calibration file it records (found
    beside it or here, checked by SHA-256) as its target and options use it (`exported_calibration`)."""
    started = time.perf_counter()
    calib_path, model_path, evaluation = Path(file), path(model), path(evaluation)
    name = calib_path.name.removesuffix(".json").removesuffix(".calib")
    why = "given with --target"
    if calib_path.suffix == ".onnx" and calib_path.is_file():
        calib_path, target, trt_version, method = exported_calibration(calib_path, target, trt_version, method)
        name, why = Path(file).name.removesuffix(".onnx"), f"recorded in {Path(file).name}"
    if target is not None and target not in rep.TARGETS:
        raise QtoolError("{target} is not one of {targets}", target=Opt("target", target, quoted=True), targets=", ".join(rep.TARGETS))
    rep.require_matplotlib()
    cal = calibration.load(calib_path)
    source = model_path if model_path is not None else calib_path.parent / cal.model_path
    outs = Outputs(inputs=(file_input(Path(file), "the exported file"), file_input(calib_path, "the calibration file"),
                           file_input(evaluation, option_file("evaluation", "the")), model_input(source, "the calibrated model")))
    out = outs.add(path(output) or Path(f"{name}.report.html"))
    evaluated = rep.load_evaluation(evaluation, cal) if evaluation is not None else None
    chosen, why = (target, why) if target else rep.default_target(evaluated)
    if model_path is None and not source.exists():
        raise QtoolError("the calibrated model {source!r} (recorded in {file!r}) is missing; pass it with {model}", source=str(source),
                         file=str(calib_path), model=Opt("model"))
    loaded = load_checked_model(model_path, calib_path, cal)
    options = {"trt_version": trt_version} if trt_version is not None else {}
    plan = rep.target_plan(loaded, cal, chosen, why=why, method=method, **options)
    inside = branches.layers_inside(loaded.proto)
    if inside:  # the plan is the main graph's (qtool.targets.branches places each branch at export)
        log.warning(f"the page shows the main graph's quantizers only: the layers inside If branches ({', '.join(inside[:2])}"
                    f"{f' and {len(inside) - 2} more' if len(inside) > 2 else ''}), which the export quantizes, are not on it")
    page = rep.render(cal, calib_path.name, plan, evaluated)
    with outs:
        outs.write(out, page)
        outs.commit()
    return ReportResult(calibration=str(calib_path), evaluation=str(evaluation) if evaluation else None, target=chosen,
                        target_from=why, output=str(out), tensors=len(cal.tensors), quantized=len(plan.sites), bytes=len(page),
                        seconds=time.perf_counter() - started)


def exported_calibration(file: Path, target: str | None, trt_version: str | None, method: str | None) -> tuple:
    """(the calibration file, target, its recorded trt_version, method) of the ONNX `file` qtool export wrote,
    as its provenance records them (qtool.provenance): the calibration file by its recorded name
    beside `file` or here, with the recorded SHA-256. The page shows an export with the target's
    default options but the method and that version: a file made with others is refused, as are
    flags that say otherwise than the file."""
    found = provenance.read(provenance.header(file), file)
    if found is None:
        raise QtoolError("{file!r} is an ONNX model without qtool provenance ({key}); report takes a calibration file or a file "
                         "qtool export wrote", file=str(file), key=provenance.KEY)
    given = {"target": target, "trt_version": trt_version, "method": method}
    recorded = {"target": found.target, "trt_version": found.options.get("trt_version"), "method": found.options.get("method")}
    for key, value in given.items():
        if value is not None and value != recorded[key]:
            raise QtoolError("{option}: {file!r} records {recorded!r}", option=Opt(key, value), file=str(file), recorded=recorded[key])
    shown = provenance.export_options(found)
    plain = targets.options_for(found.target, **{k: v for k, v in recorded.items() if k != "target" and v is not None})
    plain = targets.get(found.target).export_options(plain)[0]
    wanted, made = provenance.options_record(plain), provenance.options_record(targets.get(found.target).export_options(shown)[0])
    made["policies"] = found.options.get("policies")
    other = [k for k in made if made[k] != wanted.get(k)]
    if other:
        raise QtoolError("{file!r} was exported with {key}={value!r}; the report shows an export with the default options but "
                         "{method} and {trt_version}: report its calibration file", file=str(file), key=other[0],
                         value=made[other[0]], method=Opt("method"), trt_version=Opt("trt_version"))
    if found.calibration_name is None:
        raise QtoolError("{file!r} was exported from a calibration in memory, never saved: report that calibration's file", file=str(file))
    candidates = []
    for candidate in (file.parent / found.calibration_name, Path(found.calibration_name)):
        if all(os.path.realpath(candidate) != os.path.realpath(c) for c in candidates):
            candidates.append(candidate)
    for candidate in candidates:
        if candidate.is_file() and model.file_sha256(candidate) == found.calibration_sha256:
            return candidate, found.target, recorded["trt_version"], recorded["method"]
    raise QtoolError("the calibration file {file!r} was exported with, {name!r} with its recorded SHA-256, is not beside it or here "
                     "(looked for {looked}); report that file", file=str(file), name=found.calibration_name,
                     looked=" and ".join(repr(str(c)) for c in candidates))
