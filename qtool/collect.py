"""Run the model batch by batch and stream every exposed tensor into its histogram.

Only the current batch's activations are alive at any time: memory does not grow with the
number of images.
"""

from __future__ import annotations

import re
from typing import Iterable

import numpy as np
import onnx
import onnxruntime as ort

from .errors import QtoolError
from .histogram import TensorHistogram


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    # onnxruntime prefixes messages with "[ONNXRuntimeError] : 1 : FAIL : "
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    return text.splitlines()[0] if text else type(e).__name__


def make_session(proto: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU onnxruntime session for an in-memory model (no file is written anywhere)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        data = proto.SerializeToString()
    except ValueError as e:  # protobuf refuses messages over 2 GB
        raise QtoolError(f"model is too large to run in memory ({_first_line(e)})") from None
    try:
        return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        msg = _first_line(e)
        m = re.search(r"([\w.]+:)?(\w+)\(-?\d+\) is not a registered function/op", msg)
        if m:
            raise QtoolError(f"onnxruntime cannot load the model: unknown operator {m.group(0).split('(')[0]!r}") from None
        raise QtoolError(f"onnxruntime cannot load the model: {msg}") from None


def _run(session: ort.InferenceSession, names: list[str], feeds: dict) -> list[np.ndarray]:
    try:
        return session.run(names, feeds)
    except Exception as e:
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        raise QtoolError(f"onnxruntime failed on inputs of shape {shapes}: {_first_line(e)}") from None


def collect(
    session: ort.InferenceSession,
    input_name: str,
    names: list[str],
    batches: Iterable[tuple[np.ndarray, int]],
    bins: int,
    progress=None,
    static: frozenset[str] = frozenset(),
    probe_size: int = 1,
) -> dict[str, TensorHistogram]:
    """Histograms of every tensor in `names` over all batches.

    Tensors in `static` do not depend on input values (only on the input shape: decode grids
    and the like). Their histogram comes from one run on the first `probe_size` samples, counted
    once per `probe_size` samples seen, so it does not depend on the batch size.
    """
    hists = {n: TensorHistogram(bins=bins) for n in names}
    varying = [n for n in names if n not in static]
    fixed = [n for n in names if n in static]
    seen = 0
    for batch, count in batches:
        if fixed and seen == 0:
            for name, value in zip(fixed, _run(session, fixed, {input_name: batch[:probe_size]})):
                hists[name].update(value)
        outputs = _run(session, varying, {input_name: batch}) if varying else []
        for name, value in zip(varying, outputs):
            hists[name].update(value)
        del outputs
        seen += count
        if progress is not None:
            progress.update(count)
    if seen % probe_size:
        raise ValueError("the number of samples must be a multiple of probe_size")
    for name in fixed:
        hists[name].repeat(seen // probe_size)
    return hists
