"""Run the model batch by batch and stream every exposed tensor into its histogram.

At most two batches' activations are alive at any time (the one being histogrammed while
the next runs), plus the next batch's decoded inputs, prepared in the background: memory
does not grow with the number of inputs. Histograms of different tensors are filled in
parallel threads (the binning kernel and numpy's reductions release the GIL); each tensor's
histogram has one writer at a time, and its result does not depend on how the work was split.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator

import numpy as np
import onnx
import onnxruntime as ort

from .errors import QtoolError
from .histogram import TensorHistogram

Feeds = dict[str, np.ndarray]


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    # onnxruntime prefixes messages with "[ONNXRuntimeError] : 1 : FAIL : "
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", text)
    return text.splitlines()[0] if text else type(e).__name__


def make_session(model: onnx.ModelProto, external_folder: str | os.PathLike | None = None) -> ort.InferenceSession:
    """A CPU onnxruntime session for an in-memory model; no file is written anywhere.

    `external_folder`: where weights the proto keeps in external files live (the original
    model's folder); onnxruntime reads them from there, so models over 2 GB work.
    """
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # onnxruntime's idle threads spin between runs; calibration fills histograms in between,
    # so spinning would only steal those cores
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if external_folder is not None:
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_folder))
    try:
        data = model.SerializeToString()
    except ValueError as e:  # protobuf refuses messages over 2 GB: weights must stay external
        raise QtoolError(f"model is too large to run in memory ({_first_line(e)})") from None
    try:
        # onnxruntime prints an "EP Error ... falling back" banner on stdout before retrying
        with contextlib.redirect_stdout(io.StringIO()):
            return ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        msg = _first_line(e)
        m = re.search(r"([\w.]+:)?(\w+)\(-?\d+\) is not a registered function/op", msg)
        if m:
            raise QtoolError(f"onnxruntime cannot load the model: unknown operator {m.group(0).split('(')[0]!r}") from None
        raise QtoolError(f"onnxruntime cannot load the model: {msg}") from None


def run(session: ort.InferenceSession, names: list[str], feeds: Feeds) -> list[np.ndarray]:
    """session.run, with a failure turned into a one-line QtoolError naming the input shapes."""
    try:
        return session.run(names, feeds)
    except Exception as e:
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        raise QtoolError(f"onnxruntime failed on inputs of shape {shapes}: {_first_line(e)}") from None


def prefetch(items: Iterable) -> Iterator:
    """Yield from `items`, preparing the next item in a background thread (image decoding
    overlaps inference). Exceptions raised while preparing surface at the same position."""
    it = iter(items)
    done = object()
    with ThreadPoolExecutor(1, thread_name_prefix="qtool-prefetch") as pool:
        pending = pool.submit(next, it, done)
        while True:
            item = pending.result()
            if item is done:
                return
            pending = pool.submit(next, it, done)
            yield item


def collect(
    session: ort.InferenceSession,
    names: list[str],
    runs: Iterable[tuple[Feeds, int]],
    bins: int,
    progress=None,
    static: frozenset[str] = frozenset(),
    probe_size: int = 1,
    workers: int | None = None,
    stats: dict | None = None,
) -> tuple[dict[str, TensorHistogram], int]:
    """Histograms of every tensor in `names` over all runs, and the number of samples seen.

    `runs` yields (feeds, samples). Tensors in `static` do not depend on input values (only on
    the input shape: decode grids and the like, with fixed-size batched inputs). Their
    histogram comes from one run on the first `probe_size` samples, counted once per
    `probe_size` samples seen, so it does not depend on the batch size.
    `stats`: {tensor: biascorrection.SampleStats} also updated (per-sample statistics).
    """
    hists = {n: TensorHistogram(bins=bins) for n in names}
    varying = [n for n in names if n not in static]
    fixed = [n for n in names if n in static]
    seen = 0

    def fill(pairs, samples):
        for name, value in pairs:
            extrema = hists[name].update(value)
            if stats is not None and name in stats:
                stats[name].update(value, samples, extrema)

    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers, thread_name_prefix="qtool-hist") as pool:
        pending: list = []  # the previous batch's histogram tasks, running during this inference
        for feeds, count in prefetch(runs):
            if fixed and seen == 0:
                probe = {k: v[:probe_size] for k, v in feeds.items()}
                fill(zip(fixed, run(session, fixed, probe)), probe_size)
            outputs = run(session, varying, feeds) if varying else []
            for f in pending:  # one batch in flight at most: each histogram has one writer
                f.result()
            # largest tensors first, dealt round-robin: balanced shares without a scheduler
            pairs = sorted(zip(varying, outputs), key=lambda p: -p[1].size)
            pending = [pool.submit(fill, pairs[w::workers], count) for w in range(workers)]
            outputs = pairs = None  # the tasks hold the only references now
            seen += count
            if progress is not None:
                progress.update(count)
        for f in pending:
            f.result()
    if fixed:
        if seen % probe_size:
            raise ValueError("the number of samples must be a multiple of probe_size")
        for name in fixed:
            hists[name].repeat(seen // probe_size)
            if stats is not None and name in stats:
                stats[name].repeat(seen // probe_size)
    return hists, seen
