"""TensorHistogram: exact bins, exact folding, invariance to batching and order."""

import numpy as np
import pytest

from qtool.histogram import TensorHistogram


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
    from qtool.histogram import KERNEL_MIN_SIZE, _kernel, _numpy_add_bins

    rng = np.random.default_rng(3)
    a = np.minimum(np.abs(rng.standard_normal(KERNEL_MIN_SIZE * 3 + 7)), 3.99).astype(dtype)  # not whole chunks
    a[:100] = 0.0
    a[100:200] = np.nextafter(dtype(4.0), dtype(0.0))  # just below the top: last bin
    factor = 2048 / 4.0
    fast, slow = np.zeros(2048, np.int64), np.zeros(2048, np.int64)
    assert _kernel()(a, a.dtype.type(factor), fast) == 0
    _numpy_add_bins(a, factor, slow)
    assert np.array_equal(fast, slow) and fast.sum() == a.size and fast[-1] >= 100
