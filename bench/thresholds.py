"""Threshold searches: qtool's time per 2048-bin tensor next to its literal yardstick.

    python bench/thresholds.py [--histograms 3] [--repeat 200]

For each method/variant, qtool's function (best of --repeat calls per histogram) and the slow,
literal transcription in tests/literal.py (one call per histogram) run on the same 2048-bin
histograms of |x| (Laplace, ReLU'd Gaussian, Student-t, ...), in one run, and the ratio is
printed with whether both chose the same bin every time. A last table times a 300-tensor
recompute (histograms of 1025..2048 bins, as qtool stores them). Numbers depend on the machine
and its load; the ratio is the figure to quote.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import literal  # noqa: E402 (after the sys.path lines above)

from qtool.statistics import thresholds  # noqa: E402
from qtool.statistics.histogram import TensorHistogram  # noqa: E402

CASES = [
    # label, qtool function, literal yardstick, keyword arguments
    ("entropy/nvidia", thresholds.entropy_amax, literal.nvidia_entropy_amax, {}),
    ("entropy/nvidia unsigned", thresholds.entropy_amax, literal.nvidia_entropy_amax, {"unsigned": True}),
    ("entropy/ncnn", thresholds.ncnn_entropy_amax, literal.ncnn_entropy_amax, {}),
    ("entropy/ppq", thresholds.ppq_entropy_amax, literal.ppq_entropy_amax, {}),
    ("mse", thresholds.mse_amax, literal.mse_amax, {}),
    ("mse unsigned", thresholds.mse_amax, literal.mse_amax, {"unsigned": True}),
    ("percentile:99.99", thresholds.percentile_amax, literal.percentile_amax, {"percentile": 99.99}),
]


def histograms(count: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    samples = [
        lambda: rng.laplace(0, 1, 400_000),
        lambda: np.maximum(rng.standard_normal(400_000), 0),
        lambda: rng.standard_t(3, 400_000),
        lambda: rng.exponential(1, 400_000) * (rng.random(400_000) < 0.3),
    ]
    out = []
    for k in range(count):
        x = np.abs(samples[k % len(samples)]())
        counts, edges = np.histogram(x, bins=2048, range=(0, x.max()))
        out.append((counts, edges))
    return out


def best_time(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(max(3, repeat // 20)):
        start = time.perf_counter()
        for _ in range(20):
            fn()
        best = min(best, (time.perf_counter() - start) / 20)
    return best


def stored_histograms(n: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """Histograms as qtool stores them: trimmed at the bin holding max|x| (1025..2048 bins)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        hist = TensorHistogram(2048)
        x = rng.laplace(0, rng.uniform(0.1, 5), 20_000).astype(np.float32)
        if k % 3 == 0:
            x = np.maximum(x, 0)
        hist.update(x)
        counts, edges = hist.trimmed()
        out.append((counts, edges, bool(x.min() >= 0)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histograms", type=int, default=3, help="histograms per method (default 3)")
    parser.add_argument("--repeat", type=int, default=200, help="qtool calls per histogram (default 200)")
    args = parser.parse_args()
    hists = histograms(args.histograms)
    print(f"time per 2048-bin tensor, {len(hists)} histograms; qtool: best of {args.repeat} calls, literal: one call each")
    print(f"{'method':<26}{'qtool':>11}{'literal':>12}{'ratio':>10}  same bin")
    for label, fast, slow, kw in CASES:
        t_fast, t_slow, same = [], [], 0
        for counts, edges in hists:
            t_fast.append(best_time(lambda fast=fast, counts=counts, edges=edges, kw=kw: fast(counts, edges, **kw), args.repeat))
            start = time.perf_counter()
            want = slow(counts, edges, **kw)
            t_slow.append(time.perf_counter() - start)
            same += fast(counts, edges, **kw) == want
        f, s = float(np.mean(t_fast)), float(np.mean(t_slow))
        print(f"{label:<26}{f * 1e3:>8.3f} ms{s * 1e3:>9.1f} ms{s / f:>9.0f}x  {same}/{len(hists)}")

    stored = stored_histograms(300)
    print("\n300 stored tensors (1025..2048 bins, a third unsigned), all thresholds recomputed:")
    for method, variant in [("entropy", "nvidia"), ("entropy", "ncnn"), ("entropy", "ppq"), ("mse", "nvidia"), ("percentile:99.99", "nvidia")]:
        start = time.perf_counter()
        for counts, edges, unsigned in stored:
            thresholds.amax_for(method, counts, edges, absmax=float(edges[-1]), unsigned=unsigned, kl_variant=variant)
        label = f"{method}/{variant}" if method == "entropy" else method
        print(f"{label:<26}{time.perf_counter() - start:>8.3f} s")


if __name__ == "__main__":
    main()
