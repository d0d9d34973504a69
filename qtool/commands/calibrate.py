"""`qtool calibrate`: inputs through the model, histograms, thresholds -> the calibration file (and a
TensorRT cache beside it)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .. import calibration, model
from ..collection import pipeline
from ..errors import QtoolError
from ..feeds import data as _data
from ..fileio import Outputs, folder_input, model_input, option_file
from ..inputs import model_json, shown_path
from ..options import CalibrateOptions, ExportOptions, TensorRTOptions
from ..results import CalibrateResult
from ..targets import tensorrt
from ..targets.tensorrt import files as trtfiles
from . import done, path, progress_bar

log = logging.getLogger("qtool")


def calibrated(loaded, options: CalibrateOptions, progress=None):
    """The pipeline's run (qtool.collection.pipeline.run) after the size check (a usage error), with what
    to do when onnxruntime meets feature maps of a size the strides do not divide."""
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


def run(model_path, options: CalibrateOptions, *, output=None, trt_table=None, trt_version: str | None = None,
        progress=None) -> CalibrateResult:
    """Calibrate the model at `model_path` as `options` say and write the calibration file to
    `output` [default: <model stem>.calib.json here], and with `trt_table` a TensorRT calibration
    cache for `trt_version` too: both files or neither, each checked before any work against every
    input read. `progress`: a callback(n) or tqdm bar."""
    started = time.perf_counter()
    model_path, output, trt_table = map(path, (model_path, output, trt_table))
    trt_version = trt_version or tensorrt.CACHE_VERSION
    trt_number = None
    if trt_table:
        trt_version = trtfiles.canonical_version(trt_version)
        trt_number = trtfiles.version_number(trt_version)
    output = output or Path(f"{model_path.stem}.calib.json")
    outs = Outputs(inputs=(model_input(model_path), folder_input(options.images, option_file("images")),
                           folder_input(options.data_dir, option_file("data"))))
    output = outs.add(output)
    if trt_table:
        trt_table = outs.add(trt_table, "trt_table")
    loaded = model.load_model(model_path, external_data=False)
    cal, report = calibrated(loaded, options, progress)
    done(progress)
    cal = calibration.relocate(cal, output)
    warnings = list(report.warnings)
    if trt_table:
        cache = tensorrt.export(loaded, cal, ExportOptions("tensorrt", tensorrt=TensorRTOptions(trt_version=trt_version, fmt="cache")))
        warnings.extend(cache.warnings)
    written = {"calibration": str(output)}
    with outs:  # both files, or neither
        outs.write(output, calibration.to_json(cal).encode())  # relocated to `output` above
        if trt_table:
            outs.write(trt_table, cache.data)
            written["tensorrt_cache"] = str(trt_table)
        outs.commit()
    for w in warnings:
        log.warning(w)
    images = data_file = header = build = None
    if options.images is not None:
        images = report.inputs - len(report.skipped)  # the images the file's samples come from
    elif options.data_dir is not None and options.data_dir.is_file():
        data_file = str(options.data_dir)  # a file of samples: `inputs` counts its runs
    if trt_number is not None:
        header = f"TRT-{trt_number}-EntropyCalibration2"
        build, notes = tensorrt.build_command(loaded, cal, "cache", trt_version, str(trt_table), shown_path(model_path))
        for note in notes:
            log.warning(note)
        warnings += notes
    return CalibrateResult(
        model=model_json(model_path), outputs=written, tensors=len(cal.tensors), inputs=report.inputs, samples=report.samples,
        skipped=len(report.skipped), batch_size=report.batch_size, method=cal.method, seconds=time.perf_counter() - started,
        warnings=tuple(warnings), images=images, data_file=data_file, cache_version=trt_version if trt_table else None,
        cache_header=header, build=build)
