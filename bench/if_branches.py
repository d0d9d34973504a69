"""Models whose layers live inside If branches (Silero VAD: Equal(sr, 16000) -> If, a whole network per branch),
quantized by qtool's qdq export and run by onnxruntime: accuracy and latency against FP32, measured in one run.

For each zoo model named (bench/zoo_models lays them out: <zoo>/<name>/model.onnx, calib/*.npz, held/*.npz):
`qtool calibrate` on calib, `qtool export --target qdq`, then onnxruntime (default CPU session, 1 intra-op
thread, graph optimizations on: its int8 kernels) runs the FP32 model and the qdq file on every held-out feed.
Prints per model how many Q/DQ nodes sit inside If branches, the worst output's SQNR (10 log10 sum ref^2 / sum
(ref - q)^2 over all held-out values, float64) of the qdq file run by onnxruntime against FP32 run by
onnxruntime, and the latency ratio qdq / FP32: the two sessions take turns in --rounds rounds of --slices slices
each (A,B then B,A ...; so a change in the machine's load falls on both alike), each slice running the held-out
feeds in turn for ~--slice-seconds; per round the ratio of the two medians of per-run times; the median ratio
over rounds (min and max beside it).

Usage (from the repository root):
  python bench/if_branches.py [--zoo ~/.cache/qtool-bench/zoo] [--models silero_vad,...] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MODELS = ("silero_vad", "silero_vad_v5_spox", "oww_silero_vad_v4")


def qtool(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "qtool", "-q", *args], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def feeds(folder: Path) -> list[dict]:
    return [dict(np.load(p)) for p in sorted(folder.glob("*.npz"))]


def sqnr(ref: list[np.ndarray], out: list[np.ndarray]) -> float:
    ref64, out64 = (np.concatenate([np.asarray(a, np.float64).ravel() for a in x]) for x in (ref, out))
    keep = np.isfinite(ref64)
    noise = float(((ref64[keep] - out64[keep]) ** 2).sum())
    return float("inf") if noise == 0 else float(10 * np.log10(float((ref64[keep] ** 2).sum()) / noise))


def session(path: Path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def slice_ms(sess, held: list[dict], seconds: float) -> list[float]:
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        for f in held:
            t = time.perf_counter()
            sess.run(None, f)
            times.append((time.perf_counter() - t) * 1e3)
    return times


def ratios(a, b, held: list[dict], rounds: int, slices: int, seconds: float) -> list[float]:
    out = []
    for _ in range(rounds):
        ta, tb = [], []
        for k in range(slices):
            for sess, into in ((a, ta), (b, tb)) if k % 2 == 0 else ((b, tb), (a, ta)):
                into += slice_ms(sess, held, seconds)
        out.append(float(np.median(ta) / np.median(tb)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=Path.home() / ".cache" / "qtool-bench" / "zoo")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--slices", type=int, default=6)
    ap.add_argument("--slice-seconds", type=float, default=0.25)
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort

    print(f"onnxruntime {ort.__version__}, {os.cpu_count()} cores; 1 thread per session")
    print("| model | Q/DQ nodes in If branches | SQNR dB (qdq, onnxruntime vs FP32) | latency qdq / FP32 (median [min, max]) |")
    print("| --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="qtool-if-") as tmp:
        for name in args.models.split(","):
            folder, work = args.zoo / name, Path(tmp) / name
            work.mkdir()
            cal, qdq = work / "model.calib.json", work / "model.qdq.onnx"
            qtool("calibrate", str(folder / "model.onnx"), "--data", str(folder / "calib"), "-o", str(cal))
            qtool("export", str(folder / "model.onnx"), "--calib", str(cal), "--target", "qdq", "-o", str(qdq))
            inside = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in _branch_nodes(onnx.load(str(qdq)).graph))
            held = feeds(folder / "held")
            fp32, int8 = session(folder / "model.onnx"), session(qdq)
            ref, got = zip(*[(fp32.run(None, f), int8.run(None, f)) for f in held])
            worst = min(sqnr([r[k] for r in ref], [g[k] for g in got]) for k in range(len(ref[0]))
                        if np.issubdtype(np.asarray(ref[0][k]).dtype, np.floating))
            r = ratios(int8, fp32, held, args.rounds, args.slices, args.slice_seconds)
            print(f"| {name} | {inside} | {worst:.2f} | {np.median(r):.3f} [{min(r):.3f}, {max(r):.3f}] |", flush=True)


def _branch_nodes(graph, depth: int = 0):
    for n in graph.node:
        if depth:
            yield n
        for a in n.attribute:
            if a.type == a.GRAPH:
                yield from _branch_nodes(a.g, depth + 1)


if __name__ == "__main__":
    main()
