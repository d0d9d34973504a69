"""qtool.thresholds.entropy_amax against a literal re-implementation of NVIDIA's search."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from literal import nvidia_entropy_amax
from qtool.thresholds import entropy_amax, max_amax


def _edges(n, width=0.01):
    return np.arange(n + 1) * width


def _random_hist(rng, n):
    kind = rng.integers(0, 8)
    if kind == 0:
        return rng.integers(0, 1000, n)
    if kind == 1:
        return np.histogram(np.abs(rng.standard_normal(20000)), bins=n)[0]
    if kind == 2:  # a few isolated spikes
        h = np.zeros(n, np.int64)
        h[rng.integers(0, n, rng.integers(1, 6))] = rng.integers(1, 100, 1)[0]
        return h
    if kind == 3:  # heavy tail
        return np.histogram(np.abs(rng.standard_cauchy(20000)), bins=n)[0]
    if kind == 4:  # all-zero tail before a last outlier bin
        h = np.histogram(rng.exponential(1, 5000), bins=n)[0]
        h[n // 3 : n - 1] = 0
        return h
    if kind == 5:  # very wide dynamic range of counts
        return (10.0 ** rng.uniform(0, 12, n)).astype(np.int64) * (rng.random(n) < 0.7)
    if kind == 6:  # empty bins everywhere
        return rng.integers(0, 3, n) * (rng.random(n) < 0.2)
    h = np.histogram(rng.exponential(1, 8000), bins=n)[0]  # ReLU-like, mass at zero
    h[0] += 5000
    return h


def test_matches_literal_on_many_random_histograms():
    rng = np.random.default_rng(2026)
    for case in range(250):
        n = int(rng.integers(129, 330))
        h = _random_hist(rng, n)
        unsigned = bool(case % 3 == 0)
        start = int(rng.choice([128, 100, 64]))
        stride = int(rng.choice([1, 1, 3]))
        args = dict(num_bits=8, unsigned=unsigned, start_bin=start, stride=stride)
        assert entropy_amax(h, _edges(n), **args) == nvidia_entropy_amax(h, _edges(n), **args), (case, h.tolist())


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_literal_on_full_size_histograms(seed):
    rng = np.random.default_rng(seed)
    h = np.histogram(np.abs(rng.laplace(0, 1, 200000)), bins=2048)[0]
    edges = np.linspace(0, 12.5, 2049)
    assert entropy_amax(h, edges) == nvidia_entropy_amax(h, edges)


def test_adversarial_shapes():
    n = 200
    cases = {
        "one spike at the end": np.r_[np.zeros(n - 1, int), 7],
        "zero and one bins only": np.r_[[5, 5], np.zeros(n - 2, int)],
        "uniform": np.ones(n, int),
        "spike in the middle": np.r_[np.zeros(150, int), 3, np.zeros(49, int)],
        "two far spikes": np.r_[[0, 4], np.zeros(n - 3, int), 4],
        "huge counts": np.full(n, 10**13),
    }
    for name, h in cases.items():
        assert entropy_amax(h, _edges(n)) == nvidia_entropy_amax(h, _edges(n)), name


def test_hand_worked_example():
    # bins 0 and 1 equal (h[0] is replaced by h[1]), outlier at 1536: only i = 1537 keeps the
    # outlier in a non-empty last bin with Q == P, so KL = 0 and amax is that bin's upper edge.
    h = np.zeros(1537, np.int64)
    h[0], h[1], h[512], h[1536] = 3, 1, 1, 1
    edges = np.arange(1538) / 512
    assert entropy_amax(h, edges) == 1537 / 512


def test_empty_and_zero_histograms_give_zero():
    assert entropy_amax(np.zeros(300), _edges(300)) == 0.0
    assert entropy_amax(np.r_[9, np.zeros(299)], _edges(300)) == 0.0
    assert entropy_amax(np.zeros(0), np.zeros(1)) == 0.0


def test_fewer_bins_than_start_bin_gives_last_edge():
    assert entropy_amax(np.ones(50), _edges(50)) == _edges(50)[-1]


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        entropy_amax(np.ones(10), np.arange(10))
    with pytest.raises(ValueError):
        entropy_amax(np.r_[1, -1, 1], np.arange(4))
    with pytest.raises(ValueError):
        entropy_amax(np.r_[1, np.nan, 1], np.arange(4))


def test_max_amax():
    assert max_amax(np.ones(4), np.arange(5), 3.5) == 3.5
    assert max_amax(np.ones(4), np.arange(5), 0.0) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**9), min_size=129, max_size=260), st.integers(1, 1000))
def test_properties(counts, factor):
    h = np.array(counts, dtype=np.int64)
    edges = _edges(len(h))
    amax = entropy_amax(h, edges)
    assert np.isfinite(amax)
    assert edges[0] <= amax <= edges[-1]
    assert entropy_amax(h * factor, edges) == amax  # only the shape of the distribution matters
