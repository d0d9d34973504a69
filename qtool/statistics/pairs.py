"""Joint histograms of the channel pairs a CPU's int8 convolution adds in one int16 (the overflow
guard's statistics of an image's first layer, qtool.quantizers.overflow.joint_saturation).

Without VNNI, oneDNN adds the products of input channels 2p and 2p + 1 at one pixel in a
saturating int16 (qtool.quantizers.overflow). Whether such a pair saturates depends on both
values together: neighbouring channels of an image move together, and where they part (colour)
decides whether flipping one channel's sign removes the risk. So calibration keeps, for the data
input of a Conv with at most MAX_CHANNELS input channels, the 2-D histogram of (x[2p], x[2p + 1])
over every pixel, per pair p.

Invariance, as histogram.TensorHistogram's: both axes cover [-R, R) with BINS equal bins, R a
power of two strictly above the largest |x| seen; a value's bin is BINS/2 + floor(x * BINS / (2R))
(scaling by a power of two is exact), and when R doubles the bins fold exactly (floor(floor(t) / 2)
== floor(t / 2)). Counts are exact integers, so the result depends on neither batch size nor
order, and shards add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

BINS = 128  # per axis: over [-R, R), an 8-bit grid over R/2..R has 2-4 codes per bin; at most 16k non-empty bins a pair
MAX_CHANNELS = 4  # channel pairs kept for inputs of at most this many channels (images: 3 or 4)
_HALF = BINS // 2


@dataclass
class ChannelPairs:
    """2-D histograms of the adjacent channel pairs (2p, 2p + 1) of a tensor along `axis`."""

    axis: int = 1
    log2_range: int | None = None  # R = 2 ** log2_range; None before any finite value
    counts: np.ndarray | None = field(default=None, repr=False)  # int64 [pairs, BINS, BINS]

    def update(self, value: np.ndarray) -> bool:
        """Add every position of `value` (any rank, channels along `axis`). Non-finite positions are
        left out. False (and nothing added) when the channel count is not 2..MAX_CHANNELS. Each
        channel is read as its own (strided) plane: no transposed copy of the tensor."""
        v = np.asarray(value)
        if v.ndim == 0:
            return False
        axis = self.axis % v.ndim
        channels = v.shape[axis]
        if not 2 <= channels <= MAX_CHANNELS or (self.counts is not None and self.counts.shape[0] != channels // 2):
            return False
        planes = [np.take(v, c, axis=axis) for c in range(channels // 2 * 2)]
        if not planes[0].size:
            return True
        peaks = [float(np.abs(p).max()) for p in planes]
        if not all(math.isfinite(q) for q in peaks):  # a NaN or inf somewhere: keep the positions finite in every channel
            finite = np.logical_and.reduce([np.isfinite(p) for p in planes])
            planes = [p[finite] for p in planes]
            if not planes[0].size:
                return True
            peaks = [float(np.abs(p).max()) for p in planes]
        peak = max(peaks)
        need = math.frexp(peak)[1] if peak > 0 else -1074  # the least k with 2 ** k > peak
        if self.counts is None:
            self.log2_range = need
            self.counts = np.zeros((channels // 2, BINS, BINS), np.int64)
        elif need > self.log2_range:
            self._fold(need)
        scale = int(math.log2(_HALF)) - self.log2_range
        idx = [np.clip(np.floor(np.ldexp(p.astype(np.float64), scale)) + _HALF, 0, BINS - 1).astype(np.int64).ravel() for p in planes]
        for p in range(self.counts.shape[0]):
            self.counts[p] += np.bincount(idx[2 * p] * BINS + idx[2 * p + 1], minlength=BINS * BINS).reshape(BINS, BINS)
        return True

    def _fold(self, log2_range: int) -> None:
        """Re-bin onto [-2^log2_range, 2^log2_range): each doubling maps bin i to BINS/2 + floor((i - BINS/2) / 2)."""
        while self.log2_range < log2_range:
            target = _HALF + (np.arange(BINS) - _HALF) // 2
            folded = np.zeros_like(self.counts)
            np.add.at(folded, (slice(None), target[:, None], target[None, :]), self.counts)
            self.counts = folded
            self.log2_range += 1

    def merge(self, other: ChannelPairs) -> ChannelPairs:
        if other.counts is None:
            return self
        if self.counts is None:
            return other
        if self.counts.shape != other.counts.shape:
            raise ValueError("channel pair histograms of different channel counts")
        a, b = ChannelPairs(self.axis, self.log2_range, self.counts.copy()), ChannelPairs(other.axis, other.log2_range, other.counts.copy())
        top = max(a.log2_range, b.log2_range)
        a._fold(top)
        b._fold(top)
        return ChannelPairs(self.axis, top, a.counts + b.counts)

    def repeat(self, times: int) -> None:
        if self.counts is not None:
            self.counts = self.counts * times

    def fresh(self) -> ChannelPairs:
        return ChannelPairs(self.axis)

    def pair_count(self) -> int:
        return 0 if self.counts is None else self.counts.shape[0]

    def centres(self) -> np.ndarray:
        """The value at the centre of each bin, [BINS]."""
        return (np.arange(BINS) - _HALF + 0.5) * math.ldexp(1.0, self.log2_range - int(math.log2(_HALF)))

    def to_json(self) -> dict:
        """{"axis", "log2_range", "pairs": per pair a flat list [bin index i * BINS + j, count, ...] of the non-empty bins}."""
        out: dict = {"axis": self.axis, "bins": BINS, "log2_range": self.log2_range, "pairs": []}
        if self.counts is not None:
            for c in self.counts:
                flat = c.reshape(-1)
                nz = np.flatnonzero(flat)
                out["pairs"].append(np.stack([nz, flat[nz]], axis=1).reshape(-1).tolist())
        return out


def from_json(doc: dict) -> ChannelPairs:
    """A ChannelPairs from its to_json form, checked."""
    if not isinstance(doc, dict) or doc.get("bins") != BINS:
        raise ValueError(f"channel_pairs must be an object with bins {BINS}")
    axis, log2_range, pairs = doc.get("axis"), doc.get("log2_range"), doc.get("pairs")
    if not isinstance(axis, int) or not isinstance(pairs, list) or len(pairs) > MAX_CHANNELS // 2:
        raise ValueError("channel_pairs needs an integer axis and at most 2 pairs")
    if not pairs:
        return ChannelPairs(axis)
    if not isinstance(log2_range, int) or isinstance(log2_range, bool):
        raise ValueError("channel_pairs needs an integer log2_range")
    counts = np.zeros((len(pairs), BINS * BINS), np.int64)
    for p, flat in enumerate(pairs):
        if not isinstance(flat, list) or len(flat) % 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in flat):
            raise ValueError("channel_pairs entries must be lists of integer (bin, count) pairs")
        idx, cnt = np.asarray(flat[0::2], np.int64), np.asarray(flat[1::2], np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= BINS * BINS or cnt.min() < 0):
            raise ValueError("channel_pairs bin out of range or negative count")
        np.add.at(counts[p], idx, cnt)
    return ChannelPairs(axis, log2_range, counts.reshape(len(pairs), BINS, BINS))
