"""The binning kernel's speed on real activations: ns per value, per model.

For each model of bench/calibrate_vs_inference.py, runs one photo through the session qtool
calibrate uses and bins every fetched tensor of 4096 values or more (the kernel's share), with
the histogram range each one's max |x| gives, as calibrate does after its first batch:
  - cold: each tensor once, in the order calibrate takes them (memory as onnxruntime left it),
  - hot: the same tensor a second time right after (in the caches when it fits),
  - the numpy path (what runs before the kernel loads, or when a run is too small for it),
and, for scale, the same number of random normal values binned hot. The figures are ratios of
one run on this machine (the kernel's ns/value against numpy's), not absolute promises.

Usage: python bench/binning.py [--models yolov8n,ppocrv5_det,...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def outputs(name: str) -> list[np.ndarray]:
    """One photo's fetched activations of `name`, as calibrate gets them, last computed first."""
    import onnx
    from calibrate_vs_inference import _plan, images, model_path, preprocess

    from qtool import model as qmodel
    from qtool.feeds import data
    from qtool.runtime import nchwc

    proto = onnx.load(str(model_path(name)))
    pre, feed = preprocess(name, proto), proto.graph.input[0].name
    _, static, _, _, fetched, types = _plan(proto, name)
    sess, blocked = nchwc.fetching_session(qmodel.with_outputs(proto, fetched, types), fetched, static, threads=1)
    varying = [t for t in fetched if t not in static]
    x = data.load_image(sorted(images(1).glob("*.jpg"))[0], pre)[None]
    got = sess.run([blocked[t].source if t in blocked else t for t in varying], {feed: x})
    return [np.ascontiguousarray(v).reshape(1, -1) for v in reversed(got) if v.size >= 4096]


def factor(a: np.ndarray, bins: int = 2048) -> float:
    """bins / R for R the smallest power of two above max |x| (as TensorHistogram picks it)."""
    peak = float(np.abs(a).max())
    return bins / math.ldexp(1.0, math.frexp(peak)[1]) if peak > 0 else 1.0


def measure(arrays: list[np.ndarray], repeat: int) -> dict:
    from qtool.statistics import histogram

    factors = [factor(a) for a in arrays]
    values = sum(a.size for a in arrays)
    best = {"cold": math.inf, "hot": math.inf, "numpy": math.inf}
    for _ in range(repeat):
        cold = hot = 0.0
        for a, f in zip(arrays, factors):
            counts = np.zeros(2048, np.int64)
            t = time.perf_counter()
            histogram.binned_extrema(a, f, counts)
            t1 = time.perf_counter()
            histogram.binned_extrema(a, f, counts)
            hot += time.perf_counter() - t1
            cold += t1 - t
        t = time.perf_counter()
        for a, f in zip(arrays, factors):
            histogram._numpy_add_bins(a.reshape(-1), f, np.zeros(2048, np.int64))
        best["numpy"] = min(best["numpy"], time.perf_counter() - t)
        best["cold"], best["hot"] = min(best["cold"], cold), min(best["hot"], hot)
    return {k: v / values * 1e9 for k, v in best.items()} | {"values": values, "tensors": len(arrays)}


def main() -> None:
    from calibrate_vs_inference import MODELS, model_path

    from qtool.statistics import histogram

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    histogram.start_loading()
    histogram.wait_for_kernel()
    rng = np.random.default_rng(0)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if MODELS[name][0] is not None and not model_path(name).exists():
            print(f"{name}: missing {model_path(name)}: run ../shared/tools/fetch_dev_models.sh")
            continue
        arrays = outputs(name)
        got = measure(arrays, args.repeat)
        noise = measure([rng.standard_normal(a.size).astype(np.float32).reshape(1, -1) for a in arrays], args.repeat)
        print(f"{name}: {got['tensors']} tensors, {got['values'] / 1e6:.1f} M values; ns/value: kernel cold {got['cold']:.2f}, "
              f"hot {got['hot']:.2f}, numpy {got['numpy']:.2f} ({got['numpy'] / got['cold']:.1f}x the kernel); "
              f"random normal, hot: {noise['hot']:.2f}", flush=True)


if __name__ == "__main__":
    main()
