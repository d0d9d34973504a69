"""Calibration's joint histograms of an image's channel pairs (qtool.statistics.pairs): exact
bins, and a result that depends on neither batch size, order nor sharding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from qtool.statistics import pairs
from qtool.statistics.pairs import BINS, ChannelPairs


def _images(n: int, seed: int, channels: int = 3, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.uniform(-0.8, 0.8, (n, 1, 6, 5))
    return ((base + rng.normal(0, 0.1, (n, channels, 6, 5))) * scale).astype(np.float32)


def test_hand_worked_bins():
    """Values up to 0.75: R = 1, bins of 2 / BINS; (0.5, -0.25) lands in bin (BINS/2 + BINS/4, BINS/2 - BINS/8)."""
    h = ChannelPairs(axis=1)
    assert h.update(np.array([[0.5, -0.25, 0.75]], np.float32))
    assert h.log2_range == 0 and h.pair_count() == 1 and h.counts.sum() == 1
    assert h.counts[0, BINS // 2 + BINS // 4, BINS // 2 - BINS // 8] == 1
    np.testing.assert_allclose(h.centres()[[BINS // 2, BINS // 2 - 1]], [1 / BINS, -1 / BINS])


def test_batching_order_and_shards_do_not_change_the_histograms():
    """Small values first, then a batch 4x larger: the range doubles twice and the bins fold; the
    same counts as one pass in any order, in any batches, or as shards merged."""
    x = np.concatenate([_images(20, 1, scale=0.2), _images(20, 2, scale=0.8)])
    one = ChannelPairs(axis=1)
    one.update(x)
    batched = ChannelPairs(axis=1)
    for i in range(0, len(x), 3):
        batched.update(x[i:i + 3])
    backwards = ChannelPairs(axis=1)
    for xi in x[::-1]:
        backwards.update(xi[None])
    a, b = ChannelPairs(axis=1), ChannelPairs(axis=1)
    a.update(x[:20])
    b.update(x[20:])
    for h in (batched, backwards, a.merge(b), b.merge(a)):
        assert h.log2_range == one.log2_range
        np.testing.assert_array_equal(h.counts, one.counts)
    assert one.counts.sum() == x.size // 3


def test_four_channels_keep_two_pairs_and_other_counts_none():
    h = ChannelPairs(axis=1)
    assert h.update(_images(4, 3, channels=4)) and h.pair_count() == 2
    assert not ChannelPairs(axis=1).update(_images(2, 3, channels=5))  # not an image's few channels
    assert not ChannelPairs(axis=1).update(_images(2, 3, channels=1))


def test_nonfinite_pixels_are_left_out():
    x = _images(2, 4)
    x[0, 1, 0, 0] = np.nan
    x[1, 0, 2, 2] = np.inf
    h = ChannelPairs(axis=1)
    h.update(x)
    assert np.abs(x[np.isfinite(x)]).max() < 1 and h.counts.sum() == 2 * 30 - 2 and h.log2_range == 0  # inf sets no range


def test_json_round_trip_and_checks():
    h = ChannelPairs(axis=1)
    h.update(_images(8, 5, channels=4))
    back = pairs.from_json(json.loads(json.dumps(h.to_json())))
    assert back.log2_range == h.log2_range and back.axis == 1
    np.testing.assert_array_equal(back.counts, h.counts)
    doc = h.to_json()
    for bad in ({**doc, "bins": BINS * 2}, {**doc, "pairs": [[BINS * BINS, 1]]}, {**doc, "pairs": [[0, -1]]}, {**doc, "pairs": [[0]]}):
        with pytest.raises(ValueError):
            pairs.from_json(bad)
