"""onnx's checker on qtool's models, lazy weights included.

onnx.checker.check_model as it is for a model in memory; a model with lazy tensors (lazy.py) is
checked from a file in qtool's scratch folder holding the graph without the data of its
initializers of INLINE_BYTES or more: the checker only asks that an external data file exists, so
each reference names an empty one beside it.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from .. import scratch
from . import lazy, wire


def check(model: onnx.ModelProto | bytes) -> None:
    """onnx.checker.check_model(model) (raising as it does); a model with lazy tensors is checked
    without the data of its initializers of INLINE_BYTES or more (module doc)."""
    if isinstance(model, bytes) or not lazy.lazy_tensors(model):
        onnx.checker.check_model(model)
        return
    folder = Path(scratch.directory()) / f"check-{os.urandom(4).hex()}"
    folder.mkdir()
    try:
        (folder / "data").touch()
        data = wire.spliced(model, lambda t: lazy.is_lazy(t) or lazy.big(t), lambda t: lazy.placeholder(t, "data"))
        (folder / "model.onnx").write_bytes(data)
        onnx.checker.check_model(str(folder / "model.onnx"))
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
