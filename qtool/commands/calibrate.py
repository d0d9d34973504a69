"""`qtool calibrate`: inputs through the model, histograms, thresholds -> the calibration file (and
the files targets write beside it, qtool.targets.calibrate_files)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import calibration, model, provenance
from ..collection import pipeline
from ..commandinputs import model_json, shown_path
from ..errors import QtoolError
from ..feeds import data as _data
from ..fileio import Outputs, folder_input, model_input, option_file
from ..options import CalibrateOptions, declared_options
from ..results import CalibrateResult
from . import done, path, progress_bar

log = logging.getLogger("qtool")


def calibrated(loaded, options: CalibrateOptions, progress=None):
    """The pipeline's run (qtool.collection.pipeline.run) after the size check (a usage error), with what
    to do when onnxruntime meets feature maps of a size the strides do not divide."""
    why = provenance.unquantizable(loaded.proto)  # before any input runs: no export could use the calibration
    if why is not None:
        raise QtoolError(f"nothing to calibrate in {shown_path(loaded.path)}: {why}; no file written")
    size = options.image.size if options.images is not None else None
    if size:
        problem = _data.size_problem(loaded.proto, model.image_input(loaded.proto).name, size)
        if problem:
            raise problem
    try:
        cal, report = pipeline.run(loaded, options, progress_bar(progress))
    except QtoolError as e:
        text = str(e)
        if size and "onnxruntime failed" in text and "dimension" in text:
            raise _data.size_mismatch(e) from None
        raise
    cal.pinned = options.method is not None  # a method given is kept by every export; else each target picks its best
    return cal, report


def run(model_path, options: CalibrateOptions, *, output=None, files=(), progress=None) -> CalibrateResult:
    """Calibrate the model at `model_path` as `options` say and write the calibration file to
    `output` [default: <model stem>.calib.json here], and a file of `files` (a target's calibrate
    file, qtool.targets.calibrate_files, with its path set) for each target: all files or none, each
    checked before any work against every input read. `progress`: a callback(n) or tqdm bar."""
    started = time.perf_counter()
    model_path, output = map(path, (model_path, output))
    files = [f.checked() for f in files if f.path is not None]
    output = output or Path(f"{model_path.stem}.calib.json")
    outs = Outputs(inputs=(model_input(model_path), folder_input(options.images, option_file("images")),
                           folder_input(options.data_dir, option_file("data"))))
    output = outs.add(output)
    paths = [outs.add(f.path, next(iter(declared_options(type(f))))) for f in files]
    loaded = model.load_float_model(model_path, external_data=False, lazy=True)  # the weights read where they lie
    cal, report = calibrated(loaded, options, progress)
    done(progress)
    cal = calibration.relocate(cal, output)
    warnings = list(report.warnings)
    made = [f.write(loaded, cal, shown_path(model_path)) for f in files]
    for _, file_warnings, _, _ in made:
        warnings.extend(file_warnings)
    written = {"calibration": str(output)}
    with outs:  # every file, or none
        outs.write(output, calibration.json_chunks(cal))  # relocated to `output` above
        for f, where, (data, _, _, _) in zip(files, paths, made):
            outs.write(where, data)
            written[f.OUTPUT] = str(where)
        outs.commit()
    for w in warnings:
        log.warning(w)
    images = data_file = None
    if options.images is not None:
        images = report.inputs - len(report.skipped)  # the images the file's samples come from
    elif options.data_dir is not None and options.data_dir.is_file():
        data_file = str(options.data_dir)  # a file of samples: `inputs` counts its runs
    facts = {}
    for _, _, adds, _ in made:
        notes = adds.pop("notes", [])
        facts.update(adds)
        for note in notes:
            log.warning(note)
        warnings += notes
    return CalibrateResult(
        model=model_json(model_path), outputs=written, tensors=len(cal.tensors), inputs=report.inputs, samples=report.samples,
        skipped=len(report.skipped), batch_size=report.batch_size, method=cal.method, seconds=time.perf_counter() - started,
        warnings=tuple(warnings), images=images, data_file=data_file, target_facts=facts, target_lines=tuple(line for *_, line in made))
