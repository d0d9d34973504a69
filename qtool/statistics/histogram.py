"""Streaming histogram of |x| whose result does not depend on batch size or order.

Design (why it is invariant): the histogram covers [0, R) with `bins` equal bins, where R is
always a power of two strictly greater than the largest |x| seen so far, and `bins` is a power
of two. Binning is floor(|x| * bins / R); multiplying by a power of two is exact in floating
point, so the bin of every value is its exact mathematical bin. When a batch brings a larger
|x|, R doubles (possibly several times) and pairs of bins are summed: floor(floor(y) / 2) ==
floor(y / 2), so the folded histogram equals the one a single pass over all data with the
final R would give. The final R therefore depends only on the global max, never on which
batch came first. At the end the histogram is trimmed after the bin holding max|x|, so the
stored histogram has between bins/2 + 1 and bins bins over [0, n * R / bins].
Counts are int64 (never float32: no saturation). NaN/inf values are counted, not binned.
"""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# The kernel beats numpy from a few thousand values on (0.7 ns/value against 2.1 at 4096; on
# real activations 3-4x, bench/binning.py), but starting it (numba import and cache load or
# compile, ~0.5 s once per process) only pays for a run that bins hundreds of MB: whoever runs
# one calls start_loading() (calibrate: pipeline.KERNEL_BYTES; collect waits for it before
# its first histograms), numpy bins everything until the kernel is ready, and from then on the
# kernel takes every tensor of KERNEL_MIN_SIZE values or more. Both count identically.
KERNEL_MIN_SIZE = 1 << 12
KERNEL_MAX_BINS = 1 << 24  # its uint32 indices address 8 counters per bin (kernels.add_bins)
_ready = None  # the kernel, once loaded
_loading = threading.Lock()
_loader: threading.Thread | None = None
# Set by processes qtool owns (the command line, helper processes): numba's first load imports
# scipy.linalg, when installed, only to learn whether its np.dot may call BLAS (0.1 s of a
# 0.45 s load on a Zen 5); the kernels use none. A library caller's process keeps numba's answer.
WITHOUT_BLAS_PROBE = False


def _load_kernel() -> None:
    global _ready
    probe_off = WITHOUT_BLAS_PROBE and "scipy.linalg" not in sys.modules
    if probe_off:
        sys.modules["scipy.linalg"] = None  # importing it fails at once: numba takes it as no BLAS
    try:
        from . import kernels  # imports numba

        # the pages numba's import ran (LLVM's initialisation) go before the load runs its own:
        # the load's peak is then the load's pages alone (+110 -> +92 MB of peak RSS over the imports)
        drop_clean_pages(COMPILER_LIBRARY)
        kernel, sums = kernels.add_bins, kernels.ordered_sums
        # numba compiles (or loads) a signature at its first call: float32, as activations nearly
        # always are (a float64 model's first call pays its own)
        _run_kernel(kernel, np.zeros((1, 1), np.float32), 1.0, np.zeros(2, np.int64))
        sums(np.zeros((1, 1, 1, 1, 1), np.float32), np.zeros((1, 1, 1)), *np.zeros((2, 1, 1), np.float32), True)
    finally:
        if probe_off and sys.modules.get("scipy.linalg", 0) is None:
            del sys.modules["scipy.linalg"]
    drop_clean_pages(COMPILER_LIBRARY)
    _ready = kernel, sums


# The compiler's library (llvmlite's LLVM): numba's import and the kernel's load (from its cache)
# run 65-70 MB of its code and read-only data, which the loaded kernel never runs again.
COMPILER_LIBRARY = "libllvmlite"
MADV_DONTNEED = 4  # Linux's madvise advice


def drop_clean_pages(library: str) -> int:
    """Let go of this process's resident pages of the shared library whose file name starts with
    `library`, in the mappings nothing wrote (not writable, no private dirty or anonymous page):
    those pages are the file's, they stay in the page cache, and a later use of that code reads
    them back (a minor fault), as after the kernel evicted them under memory pressure. Bytes let
    go (of the mappings' RSS); 0 where /proc or madvise are not there (not Linux)."""
    try:
        import ctypes
        import os

        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        mappings, current = [], None
        with open("/proc/self/smaps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 5 and "-" in fields[0] and not fields[0].endswith(":"):
                    current = {"range": fields[0], "perms": fields[1], "path": fields[5] if len(fields) > 5 else ""}
                    mappings.append(current)
                elif current is not None and len(fields) >= 2 and fields[0].endswith(":") and fields[1].isdigit():
                    current[fields[0][:-1]] = int(fields[1]) << 10
    except (OSError, AttributeError, TypeError):  # no /proc, no C library to load this way (Windows)
        return 0
    dropped = 0
    for m in mappings:
        if (os.path.basename(m["path"]).startswith(library) and "w" not in m["perms"]
                and m.get("Private_Dirty", 1) == 0 and m.get("Anonymous", 1) == 0 and m.get("Rss", 0)):
            start, end = (int(x, 16) for x in m["range"].split("-"))
            if madvise(start, end - start, MADV_DONTNEED) == 0:
                dropped += m["Rss"]
    return dropped


def wait_for_kernel() -> None:
    """Return once the kernel is ready, if something started loading it."""
    if _loader is not None:
        _loader.join()


def start_loading() -> None:
    """Start loading the kernel in a background thread (once)."""
    global _loader
    with _loading:
        if _loader is None:
            _loader = threading.Thread(target=_load_kernel, name="qtool-kernel-load")
            _loader.start()


def _kernel_takes(size: int, bins: int = 0) -> bool:
    """Whether the loaded kernel takes an array of `size` values (into `bins` bins)."""
    return _ready is not None and size >= KERNEL_MIN_SIZE and bins <= KERNEL_MAX_BINS


# numpy bins this many values at a time: its temporaries (|x| and the intp indices, 12 bytes a
# float32 value) stay a few MB, not three times the tensor (counts add exactly: the same result)
NUMPY_CHUNK = 1 << 18


def _numpy_add_bins(a: np.ndarray, factor: float, counts: np.ndarray) -> None:
    f = a.dtype.type(factor)
    for start in range(0, a.size, NUMPY_CHUNK):
        idx = np.abs(a[start:start + NUMPY_CHUNK])
        idx *= f
        counts += np.bincount(idx.astype(np.intp), minlength=counts.size)


_KEYS = {np.dtype(np.float32): (np.int32, np.int32(31), np.int32(0x7FFFFFFF)),
         np.dtype(np.float64): (np.int64, np.int64(63), np.int64(0x7FFFFFFFFFFFFFFF))}
_UNSIGNED = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}


def _run_kernel(kernel, a: np.ndarray, factor: float, counts: np.ndarray) -> tuple[int, np.ndarray]:
    """The kernel on a C-contiguous float [rows, cols] array: (values not counted, since at or
    beyond the top or not finite, in which case counts is untouched; [2, rows] of a's dtype:
    each row's min, then its max, in the order of _keys)."""
    ints = _KEYS[a.dtype][0]
    ends = np.empty((2, a.shape[0]), a.dtype)
    over = kernel(a, a.view(ints), a.view(_UNSIGNED[a.dtype]), a.dtype.type(factor), counts, ends.view(ints))
    return over, ends


def _keys(floats: np.ndarray) -> np.ndarray:
    """Integer keys that order as the floats do (-0.0 just below +0.0), and back: the map is
    its own inverse on the bits, floats in, keys out (as integers) or keys in (viewed as the
    floats' dtype), floats out."""
    ints, shift, mask = _KEYS[floats.dtype]
    bits = floats.view(ints)
    return bits ^ ((bits >> shift) & mask)


def add_bins(a: np.ndarray, factor: float, counts: np.ndarray) -> None:
    """counts[floor(|a| * factor)] += 1 for every value of the finite, contiguous 1-D array `a`.

    Both paths compute the same product in a's dtype and truncate it, so they give identical
    counts; the caller guarantees every index is below len(counts).
    """
    if not _kernel_takes(a.size, counts.size):
        _numpy_add_bins(a, factor, counts)
    elif _run_kernel(_ready[0], a.reshape(1, -1), factor, counts)[0]:
        raise AssertionError("histogram kernel: a value outside [0, top)")


def binned_extrema(a: np.ndarray, factor: float, counts: np.ndarray, segments: int = 1
                   ) -> tuple[list[float], list[float], tuple[np.ndarray, np.ndarray] | None] | None:
    """Bin the C-contiguous [rows, cols] float array `a` with `factor` (a power of two in a's
    dtype) and return each row's min and max, in one pass, when every value is finite and
    |x| * factor < len(counts); otherwise None, with counts untouched. With `segments` > 1,
    also the min and max of each of the equal parts every row splits into (arrays [rows *
    segments]; a zero among them may have either sign). The caller checks that the kernel is
    ready."""
    over, ends = _run_kernel(_ready[0], a.reshape(a.shape[0] * segments, -1), factor, counts)
    if over:
        return None
    parts = None
    if segments > 1:  # extrema of the keys, which order -0.0 below +0.0: exact
        parts = tuple(ends)
        keys = _keys(ends)
        keys = np.stack((keys[0].reshape(-1, segments).min(axis=1), keys[1].reshape(-1, segments).max(axis=1)))
        ends = _keys(keys.view(a.dtype)).view(a.dtype)
    lo, hi = ends.tolist()
    for r in range(len(lo)):
        # a zero extremum of either sign may come with the other: take the one numpy picks
        if lo[r] == 0.0 and math.copysign(1.0, lo[r]) < 0:
            lo[r] = float(np.minimum.reduce(a[r]))
        if hi[r] == 0.0 and math.copysign(1.0, hi[r]) > 0:
            hi[r] = float(np.maximum.reduce(a[r]))
    return lo, hi, parts


def _numpy_peaks(v: np.ndarray) -> np.ndarray:
    return np.maximum(v.max(axis=(0, 1, 3)), -v.min(axis=(0, 1, 3))).reshape(-1).astype(np.float64)


def ordered_sums(v: np.ndarray, peaks: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """float64 sums of `v` [samples, outer, groups, inner, lanes] over axes 1 and 3, each summed
    in order (outer-major, the first value as the start): [samples, groups, lanes]. The kernel
    and numpy add the same values in the same order: identical results, and each sample's and
    each lane's sums depend on nothing else in the array. With `peaks` (v finite), also max |x|
    over axes 0, 1 and 3, flattened: (sums, peaks), from the same read of v."""
    rows, outer, groups, inner, lanes = v.shape
    if _kernel_takes(v.size):
        out = np.empty((rows, groups, lanes))
        hi, lo = np.empty((groups, lanes), v.dtype), np.empty((groups, lanes), v.dtype)
        _ready[1](np.ascontiguousarray(v), out, hi, lo, peaks)
        if not peaks:
            return out
        peak = np.maximum(hi, -lo).reshape(-1)
        # max and min are exact, but which zero numpy returns where both signs meet is its own
        return out, (peak.astype(np.float64) if peak.all() else _numpy_peaks(v))
    out = _numpy_ordered_sums(v)
    return (out, _numpy_peaks(v)) if peaks else out


def _numpy_ordered_sums(v: np.ndarray) -> np.ndarray:
    """ordered_sums' sums with numpy, about NUMPY_CHUNK values at a time, each part's running sums
    started from the last part's (float64: the same additions in the same order as one accumulate
    over the whole axis, which held the tensor transposed and twice its bytes of float64 running sums
    beside it: dfn3_enc's calibrate peaked there)."""
    rows, outer, groups, inner, lanes = v.shape
    width = max(1, NUMPY_CHUNK // max(1, rows * groups * lanes))  # values summed per part
    total = None

    def add(part: np.ndarray) -> None:  # [rows, groups, values, lanes]
        nonlocal total
        if total is not None:
            part = np.concatenate((total[:, :, None], part), axis=2)
        total = np.add.accumulate(part, axis=2, dtype=np.float64)[:, :, -1]

    if inner >= width:
        for o in range(outer):
            for start in range(0, inner, width):
                add(v[:, o, :, start:start + width])
    else:
        step = width // inner
        for start in range(0, outer, step):
            add(v[:, start:start + step].transpose(0, 2, 1, 3, 4).reshape(rows, groups, -1, lanes))
    return total


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _range_above(value: float) -> float:
    """Smallest power of two strictly greater than `value` (> 0)."""
    _, exp = math.frexp(value)  # value = m * 2**exp with 0.5 <= m < 1
    return math.ldexp(1.0, exp)


class Extrema(NamedTuple):
    """Per part of an array: min and max of its finite values (inf and -inf when it has none),
    and how many of its values are NaN or infinite."""

    lo: list[float]
    hi: list[float]
    nonfinite: list[int]
    # when asked for and known: min and max of each of the equal parts every sample splits into
    parts: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class TensorHistogram:
    """Histogram of |x| plus min/max of x, built from a stream of arrays."""

    bins: int = 2048
    counts: np.ndarray | None = None  # int64[bins] over [0, top)
    top: float = 0.0  # R: a power of two, 0.0 while only zeros were seen
    min: float = math.inf
    max: float = -math.inf
    nonfinite: int = 0
    size: int = 0

    def __post_init__(self) -> None:
        if not is_power_of_two(self.bins):
            raise ValueError(f"bins must be a power of two, got {self.bins}")
        if self.counts is None:
            self.counts = np.zeros(self.bins, dtype=np.int64)

    def update(self, x: np.ndarray, rows: int = 1, segments: int = 1) -> Extrema | None:
        """Add all values of `x` (any shape, any float dtype). Returns the extrema of each of
        the `rows` equal parts x splits into along its first axis, for callers that keep
        per-sample statistics (rows=1: x is one part), and, when they come at no cost, those
        of the `segments` equal parts each of them splits into (Extrema.parts)."""
        a = x if type(x) is np.ndarray else np.asarray(x)
        if a.size == 0:
            return None
        if a.dtype != np.float32 and a.dtype != np.float64:
            a = a.astype(np.float32)
        fast = self._in_range(a, rows, segments)
        if fast is not None:
            return fast
        if rows == 1:  # the common case, without per-row arrays
            flat = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
            lo, hi = float(np.minimum.reduce(flat)), float(np.maximum.reduce(flat))
            if -math.inf < lo and hi < math.inf:  # finite (NaN fails both): nothing to leave out
                self._add(flat, lo, hi)
                return Extrema([lo], [hi], [0])
            a, lo, hi = flat.reshape(1, -1), [lo], [hi]
        else:
            a = np.ascontiguousarray(a).reshape(rows, -1)
            lo, hi = np.minimum.reduce(a, axis=1).tolist(), np.maximum.reduce(a, axis=1).tolist()
        nonfinite = [0] * rows
        flat = a.ravel()
        if not all(map(math.isfinite, lo + hi)):
            finite = np.isfinite(a)
            nonfinite = (a.shape[1] - np.count_nonzero(finite, axis=1)).tolist()
            for r, bad in enumerate(nonfinite):
                if bad:
                    row = a[r][finite[r]]
                    lo[r], hi[r] = (float(row.min()), float(row.max())) if row.size else (math.inf, -math.inf)
            self.nonfinite += sum(nonfinite)
            flat = flat[finite.ravel()]
        if flat.size:
            self._add(flat, min(lo), max(hi))
        return Extrema(lo, hi, nonfinite)

    def _in_range(self, a: np.ndarray, rows: int, segments: int = 1) -> Extrema | None:
        """Bins and extrema in one pass of the kernel, when the range is already known and the
        values turn out finite and inside it (the common case after the first batches); None,
        with nothing counted, otherwise."""
        if not _kernel_takes(a.size, self.bins) or self.top == 0.0 or self.nonfinite:
            return None
        factor = self.bins / self.top
        if a.dtype == np.float32 and not factor <= 2.0**127:  # not a float32: _add's float64 path
            return None
        a = np.ascontiguousarray(a).reshape(rows, -1)
        got = binned_extrema(a, factor, self.counts, segments if a.shape[1] % segments == 0 else 1)
        if got is None:
            return None
        lo, hi, parts = got
        self.size += int(a.size)
        self.min = min(self.min, min(lo))
        self.max = max(self.max, max(hi))
        return Extrema(lo, hi, [0] * rows, parts)

    def _add(self, a: np.ndarray, lo: float, hi: float) -> None:
        """Bin the finite values `a`, whose min and max are lo and hi."""
        self.size += int(a.size)
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)
        absmax = max(-lo, hi)
        if absmax > 0 and absmax >= self.top:
            self._grow(_range_above(absmax))
        if self.top == 0.0:  # only zeros so far
            self.counts[0] += a.size
            return
        factor = self.bins / self.top  # a power of two: exact scaling
        if not (factor <= 2.0**127 and a.dtype == np.float32):  # factor not a float32: compute in float64
            a = a.astype(np.float64)
        add_bins(a, factor, self.counts)

    def _grow(self, new_top: float) -> None:
        if self.top > 0.0:
            # a fold of `bins` or more sends every bin to bin 0 (and may not fit an int64: 2**128 / 2**-3)
            fold = min(int(round(new_top / self.top)), self.bins)
            src = np.arange(self.bins) // fold
            self.counts = np.bincount(src, weights=self.counts, minlength=self.bins).astype(np.int64)
        self.top = new_top

    def merge(self, other: TensorHistogram) -> None:
        """Add another histogram of the same bin count (e.g. from another shard)."""
        if other.bins != self.bins:
            raise ValueError("cannot merge histograms with different bin counts")
        if other.top > self.top:
            self._grow(other.top)
        theirs = other.counts
        if 0.0 < other.top < self.top:
            fold = min(int(round(self.top / other.top)), self.bins)  # beyond `bins` every bin folds into bin 0 alike
            theirs = np.bincount(np.arange(self.bins) // fold, weights=theirs, minlength=self.bins).astype(np.int64)
        self.counts = self.counts + theirs
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self.nonfinite += other.nonfinite
        self.size += other.size

    def repeat(self, times: int) -> None:
        """Count everything `times` times, as if the same data had been seen again."""
        self.counts = self.counts * times
        self.size *= times
        self.nonfinite *= times

    @property
    def absmax(self) -> float:
        if self.size == 0:
            return 0.0
        return max(-self.min, self.max, 0.0)

    def trimmed(self) -> tuple[np.ndarray, np.ndarray]:
        """(counts, edges) ending at the bin that holds max|x|: what thresholds are searched on."""
        if self.top == 0.0:
            # only zeros (or nothing): one bin [0, 0] keeps every consumer finite
            return self.counts[:1].copy(), np.array([0.0, 0.0])
        width = self.top / self.bins
        n = int(np.flatnonzero(self.counts)[-1]) + 1
        return self.counts[:n].copy(), np.arange(n + 1, dtype=np.float64) * width
