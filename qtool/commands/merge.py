"""`qtool merge`: calibration files of one model made on different inputs (shards) combined exactly."""

from __future__ import annotations

import time
from pathlib import Path

from .. import calibration
from ..errors import QtoolError
from ..fileio import Outputs, file_input, model_input, same_file
from ..results import MergeResult


def run(files, output) -> MergeResult:
    """The calibration `files` combined exactly into `output`, which records the model relative to itself."""
    started = time.perf_counter()
    files = [Path(f) for f in files]
    if not files:
        raise QtoolError("merge needs at least one calibration file")
    for i, f in enumerate(files):  # a file given twice would silently count its inputs twice
        twice = next((g for g in files[:i] if same_file(f, g)), None)
        if twice is not None:
            what = f"{str(f)!r} is given twice" if str(f) == str(twice) else f"{str(twice)!r} and {str(f)!r} are the same file"
            raise QtoolError("cannot merge: {what} (its inputs would count twice); give each file once", what=what)
    cals = [calibration.load(f) for f in files]
    models = {str(f.parent / c.model_path): f.parent / c.model_path for f, c in zip(files, cals)}
    outs = Outputs(inputs=[file_input(f, "a calibration file being merged") for f in files]
                   + [model_input(m, "the calibrated model") for m in models.values()])
    output = outs.add(Path(output))
    merged = calibration.merge(cals)
    with outs:
        # the model path, recorded relative to the first file, is written relative to the output
        outs.write(output, calibration.json_chunks(calibration.relocate(merged, output, source=files[0])))
        outs.commit()
    return MergeResult(inputs=tuple(str(f) for f in files), output=str(output), samples=merged.samples, tensors=len(merged.tensors),
                       seconds=time.perf_counter() - started)
