"""What onnxruntime needs to run a model with lazy weights: its bytes, each lazy tensor pointing at a file.

onnxruntime reads external data by path from a folder; `runnable` gives it the folder "/" and each
lazy tensor (lazy.py) the path from the root of the file its bytes lie in (the model's .onnx or
external data file), at their offset. Values computed in memory (SmoothQuant's, FP16's) have no file:
they are written to a Spill file in qtool's scratch folder, kept until the session is made.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto

from .. import scratch
from . import lazy, wire
from .writer import DATA_ALIGNMENT


class Spill:
    """The lazy tensors computed in memory, written to a file onnxruntime can open (in qtool's
    temporary directory, qtool.scratch); removed by close()."""

    def __init__(self):
        self.fd: int | None = None
        self.size = 0
        self.path = ""

    def put(self, data: np.ndarray) -> tuple[str, int]:
        if self.fd is None:
            self.fd, self.path = scratch.open_file("weights.bin")
        offset = -(-self.size // DATA_ALIGNMENT) * DATA_ALIGNMENT
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.size = offset + len(view)
        return self.path, offset

    def close(self) -> None:
        if self.fd is not None:
            scratch.close_file(self.fd, self.path)
            self.fd = None


def _by_path(t: TensorProto, spill: Spill) -> TensorProto:
    """Lazy tensor `t` as external data at a path from the root (its file's, or `spill`'s)."""
    what = lazy.entry(t)
    out = TensorProto()
    out.CopyFrom(t)
    if isinstance(what, lazy.Source):
        path, offset, length = what.path, what.offset, what.length
    else:
        data = lazy.array(t, what)
        path, offset = spill.put(data)
        length = data.nbytes
    del out.external_data[:]
    for key, v in (("location", os.path.relpath(path, "/")), ("offset", str(offset)), ("length", str(length))):
        e = out.external_data.add()
        e.key, e.value = key, v
    return out


def runnable(model: onnx.ModelProto) -> tuple[bytes, Spill | None]:
    """The model's bytes for onnxruntime, with its external-data folder "/" when it has lazy
    tensors: each refers to its file by a path from the root (the .onnx or external data file it
    lies in, or, for one computed in memory, the Spill file, to keep open until the session is
    made). (bytes, None) for a model without lazy tensors."""
    if not lazy.lazy_tensors(model):
        return model.SerializeToString(), None
    spill = Spill()
    try:
        return wire.spliced(model, lazy.is_lazy, lambda t: _by_path(t, spill)), spill
    except BaseException:
        spill.close()
        raise
