"""Slow, literal re-implementations of published algorithms: the yardsticks for qtool's fast code.

Written from the published descriptions, loop for loop, without any algebraic shortcut, in
float64 (the tools' float32 steps are not imitated; see qtool/statistics/thresholds.py). Loops run over
plain Python floats and use the C library's log, as scipy's rel_entr and the C++ tools do.
Each function takes our histogram (counts over equal bins starting at 0, and its edges) and
returns the threshold, mapped onto our histogram as qtool.statistics.thresholds documents.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np


def scipy_entropy(pk, qk) -> float:
    """scipy.stats.entropy(pk, qk): normalise both, sum scipy.special.rel_entr
    (NaN if either is NaN; x log(x/y) if both > 0; 0 if x == 0 <= y; else inf)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        pk = 1.0 * np.asarray(pk) / np.sum(pk)
        qk = 1.0 * np.asarray(qk) / np.sum(qk)
    vec = [0.0] * len(pk)
    for j, (x, y) in enumerate(zip(pk.tolist(), qk.tolist())):
        if math.isnan(x) or math.isnan(y):
            vec[j] = math.nan
        elif x > 0 and y > 0:
            vec[j] = x * math.log(x / y)
        elif x == 0 and y >= 0:
            vec[j] = 0.0
        else:
            vec[j] = math.inf
    return float(np.sum(np.array(vec)))


def nvidia_entropy_amax(calib_hist, calib_bin_edges, num_bits=8, unsigned=False, stride=1, start_bin=128):
    """NVIDIA pytorch_quantization calib/histogram.py `_compute_amax_entropy`, step by step.
    (Its `_normalize_distr` rebinds a local and changes nothing, so it is left out.)"""
    bins = np.array(calib_hist, dtype=np.int64)
    bins[0] = bins[1]
    nbins = 1 << (num_bits - 1 + int(unsigned))
    divergences = []
    for i in range(start_bin, len(bins) + 1, stride):
        new_density_counts = [0.0] * nbins
        space = np.linspace(0, i, num=nbins + 1)
        digitized_space = np.digitize(range(i), space) - 1
        digitized_space[bins[:i] == 0] = -1
        digitized_space = digitized_space.tolist()
        counts = bins[:i].tolist()
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density_counts[digitized] += counts[idx]
        counter = Counter(digitized_space)
        for key, val in counter.items():
            if key != -1:
                new_density_counts[key] = new_density_counts[key] / val
        new_density = [0.0] * i
        for idx, digitized in enumerate(digitized_space):
            if digitized != -1:
                new_density[idx] = new_density_counts[digitized]
        reference_density = np.array(bins[: len(digitized_space)])
        reference_density[-1] += np.sum(bins[i:])
        divergences.append(scipy_entropy(reference_density, np.array(new_density)))
    divergences = np.array(divergences)
    last_argmin = len(divergences) - 1 - np.argmin(divergences[::-1])
    return float(calib_bin_edges[last_argmin * stride + start_bin])


def ncnn_entropy_amax(hist, edges, num_bits=8, unsigned=False):
    """Tencent/ncnn tools/quantize/ncnn2table.cpp `QuantNet::quantize_KL` (2021 rewrite), the
    threshold search for one blob, with num_histogram_bins = len(hist) and
    target_bin = 1 << (num_bits - 1 + unsigned) (ncnn: 2048 and 128)."""
    histogram = [int(c) for c in hist]
    num_histogram_bins = len(histogram)
    total = 0
    for c in histogram:
        total += c
    histogram_normed = [float(c) / float(total) for c in histogram]

    target_bin = 1 << (num_bits - 1 + int(unsigned))
    assert num_histogram_bins > target_bin
    target_threshold = target_bin
    min_kl_divergence = 3.4028234663852886e38  # FLT_MAX
    kl_eps = float(np.float32(0.0001))  # 0.0001f

    for threshold in range(target_bin, num_histogram_bins):
        clip_distribution = [kl_eps] * threshold
        for j in range(threshold):
            clip_distribution[j] += histogram_normed[j]
        for j in range(threshold, num_histogram_bins):
            clip_distribution[threshold - 1] += histogram_normed[j]

        num_per_bin = threshold / target_bin

        quantize_distribution = [0.0] * target_bin
        end = num_per_bin
        right_lower = math.floor(end)
        right_scale = end - right_lower
        if right_scale > 0:
            quantize_distribution[0] += right_scale * histogram_normed[right_lower]
        for k in range(right_lower):
            quantize_distribution[0] += histogram_normed[k]
        quantize_distribution[0] /= right_lower + right_scale
        for j in range(1, target_bin - 1):
            start = j * num_per_bin
            end = (j + 1) * num_per_bin
            left_upper = math.ceil(start)
            left_scale = left_upper - start
            right_lower = math.floor(end)
            right_scale = end - right_lower
            if left_scale > 0:
                quantize_distribution[j] += left_scale * histogram_normed[left_upper - 1]
            if right_scale > 0:
                quantize_distribution[j] += right_scale * histogram_normed[right_lower]
            for k in range(left_upper, right_lower):
                quantize_distribution[j] += histogram_normed[k]
            quantize_distribution[j] /= right_lower - left_upper + left_scale + right_scale
        start = threshold - num_per_bin
        left_upper = math.ceil(start)
        left_scale = left_upper - start
        if left_scale > 0:
            quantize_distribution[target_bin - 1] += left_scale * histogram_normed[left_upper - 1]
        for k in range(left_upper, threshold):
            quantize_distribution[target_bin - 1] += histogram_normed[k]
        quantize_distribution[target_bin - 1] /= threshold - left_upper + left_scale

        expand_distribution = [kl_eps] * threshold
        end = num_per_bin
        right_lower = math.floor(end)
        right_scale = end - right_lower
        if right_scale > 0:
            expand_distribution[right_lower] += right_scale * quantize_distribution[0]
        for k in range(right_lower):
            expand_distribution[k] += quantize_distribution[0]
        for j in range(1, target_bin - 1):
            start = j * num_per_bin
            end = (j + 1) * num_per_bin
            left_upper = math.ceil(start)
            left_scale = left_upper - start
            right_lower = math.floor(end)
            right_scale = end - right_lower
            if left_scale > 0:
                expand_distribution[left_upper - 1] += left_scale * quantize_distribution[j]
            if right_scale > 0:
                expand_distribution[right_lower] += right_scale * quantize_distribution[j]
            for k in range(left_upper, right_lower):
                expand_distribution[k] += quantize_distribution[j]
        start = threshold - num_per_bin
        left_upper = math.ceil(start)
        left_scale = left_upper - start
        if left_scale > 0:
            expand_distribution[left_upper - 1] += left_scale * quantize_distribution[target_bin - 1]
        for k in range(left_upper, threshold):
            expand_distribution[k] += quantize_distribution[target_bin - 1]

        kl_divergence = 0.0  # compute_kl_divergence
        for a, b in zip(clip_distribution, expand_distribution):
            kl_divergence += a * math.log(a / b)

        if kl_divergence < min_kl_divergence:
            min_kl_divergence = kl_divergence
            target_threshold = threshold

    # ncnn: threshold = (target_threshold + 0.5) * absmax / num_histogram_bins
    return float(0.5 * (edges[target_threshold] + edges[target_threshold + 1]))


def ppq_entropy_amax(hist, edges, num_bits=8, unsigned=False):
    """OpenPPL/ppq ppq/quantization/observer/range.py `TorchHistObserver.hist_to_scale_offset`
    with torch_KL_divergence (ppq/quantization/measure/statistic.py), on our histogram padded
    with empty bins to a multiple of quant_bins (PPQ's reshape needs whole groups)."""
    quant_bins = 1 << (num_bits - 1 + int(unsigned))  # PPQ: 2 ** (num_of_bits - 1)
    n = len(hist)
    hist_bins = -(-n // quant_bins) * quant_bins
    histogram = [float(c) for c in hist] + [0.0] * (hist_bins - n)

    # following code is curcial, do not move (PPQ's comment)
    for j in range(int(hist_bins * 0.002)):
        histogram[j] = 0.0
    histogram[int(hist_bins * 0.002)] = 1.0

    hist_sum = 0.0
    for c in histogram:
        hist_sum += c
    losses = []
    for bin_range in range(quant_bins, hist_bins + quant_bins - 1, quant_bins):
        p_hist = histogram[:bin_range]
        outliers = 0.0
        for c in histogram[bin_range:]:
            outliers += c
        p_hist[bin_range - 1] += outliers
        p_hist = [x / hist_sum for x in p_hist]

        expand_ratio = int(bin_range / quant_bins)
        q_hist = []
        for g in range(quant_bins):
            group = histogram[g * expand_ratio : (g + 1) * expand_ratio]
            positive_cnt = sum(1 for x in group if x > 0)
            if positive_cnt == 0:
                positive_cnt = 1
            group_sum = 0.0
            for x in group:
                group_sum += x
            value = group_sum / positive_cnt
            q_hist.extend(value * (1.0 if x > 0 else 0.0) for x in group)
        q_sum = 0.0
        for x in q_hist:
            q_sum += x
        if q_sum == 0:  # PPQ divides 0 by 0 here: a NaN divergence, never the minimum
            continue
        q_hist = [x / q_sum for x in q_hist]

        kl = 0.0
        for p, q in zip(p_hist, q_hist):
            kl += p * (math.log10(p + 1e-30) - math.log10(q + 1e-30))
        losses.append({"kl": kl, "bin_range": bin_range})

    best_bin_range = sorted(losses, key=lambda x: x["kl"])[0]["bin_range"]
    # PPQ: scale = best_bin_range * hist_scale / quant_bins, i.e. amax = best_bin_range * w
    return float(edges[min(best_bin_range, n)])


def mse_amax(hist, edges, num_bits=8, unsigned=False, stride=1, start_bin=128):
    """qtool's mse: NVIDIA's `_compute_amax_mse` loop (bin centres, fake quantization, first
    argmin) in float64 with the counts normalised, on the signed or unsigned grid."""
    counts = np.asarray(hist, dtype=np.float64)
    p = counts / counts.sum()
    edges = np.asarray(edges, dtype=np.float64)
    centers = (edges[1:] + edges[:-1]) / 2
    max_bound = (1 << (num_bits - 1 + int(unsigned))) - 1
    min_bound = 0 if unsigned else -(max_bound + 1)
    mses = []
    arguments = []
    for i in range(start_bin, len(centers), stride):
        amax = centers[i]
        scale = max_bound / amax  # fake_tensor_quant
        quant_centers = np.clip(np.round(centers * scale), min_bound, max_bound) / scale
        mses.append(float(np.sum((quant_centers - centers) ** 2 * p)))
        arguments.append(i)
    argmin = int(np.argmin(mses))
    return float(centers[arguments[argmin]])


def percentile_amax(calib_hist, calib_bin_edges, percentile):
    """NVIDIA pytorch_quantization calib/histogram.py `_compute_amax_percentile`."""
    calib_hist = np.asarray(calib_hist)
    total = calib_hist.sum()
    cdf = np.cumsum(calib_hist / total)
    idx = np.searchsorted(cdf, percentile / 100)
    return float(calib_bin_edges[idx])
