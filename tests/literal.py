"""Slow, literal re-implementations of published algorithms: the yardsticks for qtool's fast code.

Written from the published descriptions, loop for loop, without any algebraic shortcut.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def scipy_entropy(pk, qk) -> float:
    """scipy.stats.entropy(pk, qk): normalise both, sum scipy.special.rel_entr
    (NaN if either is NaN; x log(x/y) if both > 0; 0 if x == 0 <= y; else inf)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pk = 1.0 * np.asarray(pk) / np.sum(pk)
        qk = 1.0 * np.asarray(qk) / np.sum(qk)
    vec = np.zeros(len(pk))
    for j in range(len(pk)):
        x, y = pk[j], qk[j]
        if np.isnan(x) or np.isnan(y):
            vec[j] = np.nan
        elif x > 0 and y > 0:
            vec[j] = x * np.log(x / y)
        elif x == 0 and y >= 0:
            vec[j] = 0.0
        else:
            vec[j] = np.inf
    return float(np.sum(vec))


def nvidia_entropy_amax(calib_hist, calib_bin_edges, num_bits=8, unsigned=False, stride=1, start_bin=128):
    """NVIDIA pytorch_quantization calib/histogram.py `_compute_amax_entropy`, step by step."""
    bins = np.array(calib_hist, dtype=np.int64)
    bins[0] = bins[1]
    nbins = 1 << (num_bits - 1 + int(unsigned))
    divergences = []
    for i in range(start_bin, len(bins) + 1, stride):
        new_density_counts = np.zeros(nbins, dtype=np.float64)
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += bins[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = np.zeros(i, dtype=np.float64)
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[: len(digitized_space)])
        reference_density[-1] += np.sum(bins[i:])
        divergences.append(scipy_entropy(reference_density, new_density))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return float(calib_bin_edges[last_argmin * stride + start_bin])
