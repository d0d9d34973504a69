"""Quantization noise estimated from a histogram of |x|: the one estimate behind the auto threshold
method (thresholds.quantization_error), the report's tensor SQNR (qtool.checks.report_data) and
a target's attention rule (qtool.targets). Pure functions, float64, no I/O.

A histogram's values are taken to lie at SUBSAMPLES points spread evenly inside each bin
(bin_points), each carrying 1/SUBSAMPLES of its bin's count; a quantizer maps a point x to q(x),
and every figure of HistogramError is a count-weighted mean over the points: E[x], E[x^2],
E[x - q(x)], E[(x - q(x))^2] (rounding inside the range, x - q above it) and the part of the last
from values beyond a clipping threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cached_property

import numpy as np

SUBSAMPLES = 8  # points per bin at which a quantizer's error is evaluated

Quantize = Callable[[np.ndarray], np.ndarray]  # |x| values -> their quantized values


def bin_points(edges: np.ndarray) -> np.ndarray:
    """[bins, 8] points spread evenly inside each histogram bin (float64): where a histogram's
    values are taken to lie when a quantizer's error is estimated from it."""
    edges = np.asarray(edges, dtype=np.float64)
    frac = (np.arange(SUBSAMPLES) + 0.5) / SUBSAMPLES
    return edges[:-1, None] + (edges[1:] - edges[:-1])[:, None] * frac


def lattice(step: float, *, top: float | None = None, limit: float | None = None) -> Quantize:
    """q(|x|) on the lattice k * step (zero lies on every qtool grid), saturating either at `top`
    steps (k <= top: the grid's last code) or at the value `limit` (a grid whose far end on the
    clipped side is not a whole number of steps from zero, e.g. an asymmetric one)."""
    if (top is None) == (limit is None):
        raise ValueError("give exactly one of top (in steps) and limit (a value)")
    if limit is None:
        return lambda x: np.minimum(np.rint(x / step), top) * step
    return lambda x: np.minimum(np.rint(x / step) * step, limit)


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) in dB; +inf without noise."""
    return math.inf if noise <= 0 else 10.0 * math.log10(signal / noise)


class HistogramError:
    """A histogram's values (bin_points weighted by their bin's count) and their error under one
    quantizer (None: the values themselves, no error); each figure is computed when first read."""

    def __init__(self, counts: np.ndarray, total: float, x: np.ndarray, quantize: Quantize | None, clip: float):
        self._counts, self._total, self.x, self._clip = counts, total, x, clip
        self.err = x - quantize(x) if quantize is not None else np.zeros_like(x)

    def _average(self, values: np.ndarray) -> float:
        return float(np.dot(self._counts, values.mean(axis=1)) / self._total)

    @cached_property
    def mean(self) -> float:
        """E[x]"""
        return self._average(self.x)

    @cached_property
    def power(self) -> float:
        """E[x^2]"""
        return self._average(self.x * self.x)

    @cached_property
    def error(self) -> float:
        """E[x - q(x)]"""
        return self._average(self.err)

    @cached_property
    def noise(self) -> float:
        """E[(x - q(x))^2]"""
        return self._average(self.err * self.err)

    @cached_property
    def clipped(self) -> float:
        """The part of `noise` from values beyond the clipping threshold `clip`."""
        return self._average(np.where(self.x > self._clip, self.err * self.err, 0.0))

    @property
    def sqnr_db(self) -> float | None:
        """10 log10(E[x^2] / E[(x - q(x))^2]); None when every value is zero."""
        return None if self.power <= 0 else sqnr_db(self.power, self.noise)


def histogram_error(counts: np.ndarray, edges: np.ndarray, quantize: Quantize | None, *, clip: float = math.inf) -> HistogramError | None:
    """The error of `quantize` on the values of the histogram `counts` over `edges` (clip: the
    threshold beyond which HistogramError.clipped counts the error); None when it holds no value."""
    counts = np.asarray(counts, dtype=np.float64)
    total = float(counts.sum())
    if total <= 0:
        return None
    return HistogramError(counts, total, bin_points(edges), quantize, clip)
