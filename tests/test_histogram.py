"""TensorHistogram: exact bins, exact folding, invariance to batching and order."""

from pathlib import Path

import numpy as np
import pytest

from qtool.statistics.histogram import TensorHistogram


def test_hand_worked_bins():
    h = TensorHistogram(bins=2048)
    h.update(np.array([-1.0, 1 / 512, 3.0, 0.0], np.float32))
    counts, edges = h.trimmed()
    # R = 4 (smallest power of two above 3), width 1/512; |-1| -> bin 512, 3 -> bin 1536
    assert len(counts) == 1537 and edges[-1] == 1537 / 512
    assert dict(zip(*np.nonzero(counts), counts[np.nonzero(counts)])) == {0: 1, 1: 1, 512: 1, 1536: 1}
    assert (h.min, h.max, h.absmax) == (-1.0, 3.0, 3.0)


def test_power_of_two_max_is_not_clamped():
    h = TensorHistogram(bins=256)
    h.update(np.array([4.0, 1.0], np.float32))
    counts, edges = h.trimmed()
    assert h.top == 8.0  # strictly above the max
    assert counts[128] == 1 and counts[32] == 1 and len(counts) == 129


def _fill(parts, bins=512):
    h = TensorHistogram(bins=bins)
    for p in parts:
        h.update(p)
    return h


def test_batching_and_order_do_not_change_the_histogram():
    rng = np.random.default_rng(0)
    data = [rng.standard_normal(1000).astype(np.float32) * s for s in (0.01, 1, 300, 0.5, 1e-4, 40)]
    ref = _fill([np.concatenate(data)])
    for parts in (data, data[::-1], [data[i] for i in (3, 0, 5, 1, 4, 2)]):
        h = _fill(parts)
        assert h.top == ref.top and np.array_equal(h.counts, ref.counts)
        assert (h.min, h.max, h.size) == (ref.min, ref.max, ref.size)


def test_merge_equals_single_pass():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(5000).astype(np.float32), 100 * rng.standard_normal(500).astype(np.float32)
    merged = _fill([a])
    merged.merge(_fill([b]))
    ref = _fill([a, b])
    assert np.array_equal(merged.counts, ref.counts) and merged.top == ref.top


def test_a_range_growing_past_an_int64_fold_folds_everything_into_bin_0():
    # an attention score near 1 then a padded position's score near float32's lowest: the fold
    # (2**128 / 2**1) does not fit an int64; the result is that of one pass over both
    small, huge = np.array([0.75, -0.5], np.float32), np.array([np.finfo(np.float32).min, 1.0], np.float32)
    ref = _fill([np.concatenate([small, huge])])
    h = _fill([small, huge])
    assert h.top == ref.top == 2.0**128 and np.array_equal(h.counts, ref.counts) and h.counts[0] == 3


def test_nonfinite_values_are_counted_not_binned():
    h = _fill([np.array([np.nan, np.inf, -np.inf, 2.0, -0.5], np.float32)])
    assert h.nonfinite == 3 and h.size == 2 and h.counts.sum() == 2
    assert (h.min, h.max) == (-0.5, 2.0)


def test_only_zeros_then_data():
    h = _fill([np.zeros(10, np.float32)])
    counts, edges = h.trimmed()
    assert h.absmax == 0.0 and counts.tolist() == [10] and edges.tolist() == [0.0, 0.0]
    h.update(np.array([1.5], np.float32))
    assert h.counts[0] == 10 and h.counts.sum() == 11


def test_float16_and_float64_inputs():
    h = _fill([np.array([0.25, -3.0], np.float16), np.array([1e-3], np.float64)])
    assert h.size == 3 and h.max == 0.25 and h.min == -3.0


def test_tiny_values_use_an_exact_scale():
    h = _fill([np.array([1e-39, 3e-39], np.float32)])  # subnormal float32: bins/R overflows float32
    assert h.counts.sum() == 2 and np.isfinite(h.trimmed()[1]).all()


def test_bins_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        TensorHistogram(bins=1000)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_and_numpy_paths_count_identically(dtype):
    from qtool.statistics.histogram import KERNEL_MIN_SIZE, _numpy_add_bins, _run_kernel
    from qtool.statistics.kernels import add_bins

    rng = np.random.default_rng(3)
    a = np.minimum(np.abs(rng.standard_normal(KERNEL_MIN_SIZE * 3 + 7)), 3.99).astype(dtype)  # not whole chunks
    a[:100] = 0.0
    a[100:200] = np.nextafter(dtype(4.0), dtype(0.0))  # just below the top: last bin
    factor = 2048 / 4.0
    fast, slow = np.zeros(2048, np.int64), np.zeros(2048, np.int64)
    a[300] = -2.5
    over, (lo, hi) = _run_kernel(add_bins, a.reshape(1, -1), factor, fast)
    assert over == 0 and (lo[0], hi[0]) == (a.min(), a.max()) == (-2.5, a[100])
    _numpy_add_bins(a, factor, slow)
    assert np.array_equal(fast, slow) and fast.sum() == a.size and fast[-1] >= 100
    a[5] = 4.0  # at the top: nothing counted
    assert _run_kernel(add_bins, a.reshape(1, -1), factor, fast)[0] == 1 and np.array_equal(fast, slow)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_extrema_are_those_of_the_ordered_keys(dtype):
    # each row's min and max key, for rows of every sign mix, zeros of both signs, infinities
    # and NaNs of both signs (the kernel finds them from reductions of the raw bits)
    from qtool.statistics.histogram import _KEYS, _keys, _run_kernel
    from qtool.statistics.kernels import add_bins

    ints, shift, mask = _KEYS[np.dtype(dtype)]
    rng = np.random.default_rng(8)
    n = 1100  # two chunks and a bit
    base = rng.standard_normal(n).astype(dtype)
    rows = [base, np.abs(base), -np.abs(base), np.zeros(n, dtype), np.full(n, -0.0, dtype)]
    for special in (-0.0, 0.0, np.inf, -np.inf, np.nan, -np.nan):
        for row in (np.abs(base), -np.abs(base)):
            r = row.copy()
            r[rng.integers(n)] = special
            rows.append(r)
    a = np.stack(rows)
    _, ends = _run_kernel(add_bins, a, 1.0, np.zeros(8, np.int64))
    b = a.view(ints)
    keys = b ^ ((b >> shift) & mask)  # written out here, not taken from _keys
    assert ends.dtype == a.dtype
    assert np.array_equal(_keys(ends)[0], keys.min(axis=1)) and np.array_equal(_keys(ends)[1], keys.max(axis=1))
    assert np.array_equal(_keys(_keys(ends).view(a.dtype)), ends.view(ints))  # keys back to the floats' bits


def _one_pass_disabled(monkeypatch):
    from qtool.statistics import histogram

    monkeypatch.setattr(histogram.TensorHistogram, "_in_range", lambda self, a, rows, segments=1: None)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_pass_path_matches_the_separate_passes(dtype, monkeypatch):
    # the kernel bins and finds extrema together once the range is known; a batch beyond the
    # range, NaN/inf, and zeros of both signs at an extremum fall back or defer to numpy
    from qtool.statistics import histogram

    histogram.start_loading()
    histogram.wait_for_kernel()
    rng = np.random.default_rng(5)
    n = histogram.KERNEL_MIN_SIZE * 2 + 3
    batches = [np.maximum(rng.standard_normal(n), 0).astype(dtype), rng.standard_normal(n).astype(dtype),
               (rng.standard_normal((3, n)) * 50).astype(dtype), rng.standard_normal((3, n)).astype(dtype)]
    zeros = np.abs(rng.standard_normal(n)).astype(dtype)
    zeros[:2] = [0.0, -0.0]
    negative = -zeros
    odd = rng.standard_normal(n).astype(dtype)
    odd[7] = np.nan
    batches += [zeros, negative, -np.abs(batches[1]), odd, batches[1][::2].copy()[None].repeat(2, 0)]

    def run():
        h, got = TensorHistogram(bins=2048), []
        for b in batches:
            e = h.update(b, rows=b.shape[0] if b.ndim == 2 else 1)
            got.append([[(v, np.copysign(1.0, v)) for v in vs] for vs in (e.lo, e.hi)] + [e.nonfinite])
        return h, got

    fast, fast_extrema = run()
    _one_pass_disabled(monkeypatch)
    slow, slow_extrema = run()
    assert fast_extrema == slow_extrema
    assert np.array_equal(fast.counts, slow.counts) and fast.top == slow.top
    assert (fast.min, fast.max, fast.size, fast.nonfinite) == (slow.min, slow.max, slow.size, slow.nonfinite)


def test_per_channel_extrema_of_the_one_pass_give_the_same_statistics():
    # depthwise-conv inputs in NCHW: the per-channel max |x| comes from the binning pass
    from qtool.statistics import histogram
    from qtool.statistics.stats import SampleStats

    histogram.start_loading()
    histogram.wait_for_kernel()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 70, 70)).astype(np.float32)
    x[1, 2] = 0.0  # a dead channel in one sample
    x[:, 4] = 0.0  # and in all: its peak is numpy's
    x[0, 4, 0, :3] = [-0.0, 0.0, -0.0]
    h = TensorHistogram()
    assert h.update(x, 2, 6).parts is None  # the first batch fixes the range: no one pass yet
    e = h.update(x, 2, 6)
    lo, hi = e.parts
    assert np.array_equal(lo, x.reshape(12, -1).min(axis=1)) and np.array_equal(hi, x.reshape(12, -1).max(axis=1))
    assert e.lo == x.reshape(2, -1).min(axis=1).tolist() and e.hi == x.reshape(2, -1).max(axis=1).tolist()
    with_parts, without = SampleStats(axis=1, track_absmax=True), SampleStats(axis=1, track_absmax=True)
    assert with_parts.segments(x, 2, None) == 6 and with_parts.segments(x, 2, 8) == 1
    with_parts.update([x], 2, e)
    without.update([x], 2, e._replace(parts=None))
    assert with_parts.to_json() == without.to_json()
    assert [np.copysign(1, v) for v in with_parts.channel_absmax] == [np.copysign(1, v) for v in without.channel_absmax]


def test_kernel_counts_runs_of_one_bin_past_its_16_bit_counters():
    # 8 interleaved 16-bit counters per bin: a million equal values (and a row of 5 after
    # them) must move to the 64-bit total before any counter wraps
    from qtool.statistics.histogram import _run_kernel
    from qtool.statistics.kernels import add_bins

    a = np.full((2, 600_005), 1.5, np.float32)
    a[1, :5] = 0.25
    counts = np.zeros(2048, np.int64)
    assert _run_kernel(add_bins, a, 2048 / 2.0, counts)[0] == 0
    assert counts[1536] == a.size - 5 and counts[256] == 5 and counts.sum() == a.size


def test_too_many_bins_for_the_kernel_bin_in_numpy(monkeypatch):
    from qtool.statistics import histogram

    histogram.start_loading()
    histogram.wait_for_kernel()
    rng = np.random.default_rng(2)
    batches = [rng.standard_normal(histogram.KERNEL_MIN_SIZE * 2).astype(np.float32) * s for s in (1, 3, 2)]
    expected = TensorHistogram(bins=2048)
    for b in batches:
        expected.update(b)

    def refuse(*args):
        raise AssertionError("kernel called")

    monkeypatch.setattr(histogram, "KERNEL_MAX_BINS", 1024)
    monkeypatch.setattr(histogram, "_run_kernel", refuse)
    h = TensorHistogram(bins=2048)
    for b in batches:
        h.update(b)
    assert np.array_equal(h.counts, expected.counts) and (h.top, h.min, h.max) == (expected.top, expected.min, expected.max)


def test_a_qtool_process_loads_the_kernel_without_scipy_and_leaves_it_importable(tmp_path):
    # numba's first load would import scipy.linalg to probe for BLAS; a process qtool owns skips
    # the probe, and scipy.linalg imports normally afterwards. A stand-in scipy (first on the
    # path) tells whether it was imported, whether or not the real one is installed.
    import os
    import subprocess
    import sys

    (tmp_path / "scipy" / "linalg").mkdir(parents=True)
    (tmp_path / "scipy" / "__init__.py").write_text("__version__ = \"1.14.0\"\n")
    (tmp_path / "scipy" / "linalg" / "__init__.py").write_text("def norm(v):\n    return sum(x * x for x in v) ** 0.5\n")
    code = (
        "import sys\n"
        "from qtool.statistics import histogram\n"
        "histogram.WITHOUT_BLAS_PROBE = {flag}\n"
        "histogram.start_loading(); histogram.wait_for_kernel()\n"
        "print(histogram._ready is not None, 'scipy.linalg' in sys.modules)\n"
        "import scipy.linalg\n"
        "print(scipy.linalg.norm([3.0, 4.0]))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    for flag, imported in ((True, False), (False, True)):
        out = subprocess.run([sys.executable, "-c", code.format(flag=flag)], capture_output=True, text=True, check=True,
                             env=env).stdout
        assert out.split() == ["True", str(imported), "5.0"], (flag, out)


def test_numpy_bins_in_chunks_with_the_same_counts(monkeypatch):
    """numpy's path bins NUMPY_CHUNK values at a time (its temporaries stay small): counts add
    exactly, so a chunk of any size gives the counts of one pass."""
    from qtool.statistics import histogram

    a = np.abs(np.random.default_rng(4).standard_normal(10_007)).astype(np.float32)
    whole = np.zeros(2048, np.int64)
    monkeypatch.setattr(histogram, "NUMPY_CHUNK", 1 << 30)
    histogram._numpy_add_bins(a, 256.0, whole)
    for chunk in (1, 1000, 4096):
        parts = np.zeros(2048, np.int64)
        monkeypatch.setattr(histogram, "NUMPY_CHUNK", chunk)
        histogram._numpy_add_bins(a, 256.0, parts)
        assert np.array_equal(parts, whole) and parts.sum() == a.size


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux's /proc")
def test_the_loaded_kernel_leaves_the_compilers_code_pages_to_the_page_cache():
    """Once the kernel is loaded, LLVM's code and read-only data (llvmlite: 65-70 MB of RSS that
    numba's import and the kernel's load touched) are let go; the kernel counts as before, and a
    float64 array, which numba compiles for then, reads the compiler back."""
    import subprocess
    import sys

    code = (
        "import os\n"
        "import numpy as np\n"
        "from qtool.statistics import histogram\n"
        "def llvm():\n"
        "    total, mine = 0, False\n"
        "    for line in open('/proc/self/smaps'):\n"
        "        f = line.split()\n"
        "        if len(f) >= 5 and '-' in f[0] and not f[0].endswith(':'):\n"
        "            mine = len(f) > 5 and os.path.basename(f[5]).startswith('libllvmlite')\n"
        "        elif mine and f[0] == 'Rss:':\n"
        "            total += int(f[1]) << 10\n"
        "    return total\n"
        "histogram.start_loading(); histogram.wait_for_kernel()\n"
        "a = np.abs(np.random.default_rng(0).standard_normal(1 << 16))\n"
        "counts = []\n"
        "for x in (a.astype(np.float32), a):\n"
        "    c = np.zeros(2048, np.int64); histogram.add_bins(x, 256.0, c)\n"
        "    n = np.zeros(2048, np.int64); histogram._numpy_add_bins(x, 256.0, n)\n"
        "    counts.append(bool((c == n).all()))\n"
        "    if x.dtype == np.float32: after = llvm()\n"
        "print(after >> 20, counts)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(maxsplit=1)
    assert int(out[0]) < 8 and out[1].strip() == "[True, True]", out


@pytest.mark.parametrize("shape", [(1, 1, 4, 62500, 16), (2, 3, 2, 50, 8), (1, 1000, 4, 1, 8), (3, 7, 5, 300, 16), (1, 1, 1, 1, 1)])
def test_ordered_sums_with_numpy_add_in_order_a_part_at_a_time(shape, monkeypatch):
    """histogram.ordered_sums without the kernel (calibrations under KERNEL_BYTES): the sums of one accumulate
    over the whole axis, bit for bit, from parts of about NUMPY_CHUNK values; that accumulate held the tensor
    transposed and twice its bytes of float64 running sums (4x the tensor: dfn3_enc's calibrate peaked there)."""
    import tracemalloc

    from qtool.statistics import histogram

    monkeypatch.setattr(histogram, "_ready", None)
    rng = np.random.default_rng(0)
    v = (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape) * 3)).astype(np.float32)
    rows, outer, groups, inner, lanes = shape
    whole = np.add.accumulate(v.transpose(0, 2, 1, 3, 4).reshape(rows, groups, outer * inner, lanes), axis=2, dtype=np.float64)[:, :, -1]
    tracemalloc.start()
    try:
        sums, peaks = histogram.ordered_sums(v, peaks=True)
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sums.dtype == np.float64 and np.array_equal(sums, whole)
    assert np.array_equal(peaks, np.abs(v).max(axis=(0, 1, 3)).reshape(-1).astype(np.float64))
    if v.nbytes > 8 * histogram.NUMPY_CHUNK * 4:
        assert held < v.nbytes / 2, (held, v.nbytes)  # before: 4x v.nbytes
