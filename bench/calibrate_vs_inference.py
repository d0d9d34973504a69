"""Calibration cost vs plain inference, and memory, on a detector-sized model.

Prints, measured in this run on this machine:
  - plain onnxruntime inference of N images incl. decoding (a simple decode-and-run loop),
  - `qtool calibrate` on the same images, and the ratio calibrate / plain,
  - onnxruntime alone with every tensor exposed, run as qtool runs it: the floor of the ratio,
  - peak RSS of qtool at 100 and at 400 images (flat memory means these agree),
  - onnxruntime's own entropy calibrator on 32 images, time and peak RSS, for comparison.
Each measurement runs in a fresh process so peak RSS is its own.

Usage: python bench/calibrate_vs_inference.py [--images 400] [--repeat 3] [--skip-ort]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = Path(tempfile.gettempdir()) / "qtool-bench"


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def setup(n_images: int) -> tuple[Path, Path]:
    sys.path.insert(0, str(HERE))
    import onnx

    from detector import detector, photos

    WORK.mkdir(exist_ok=True)
    model = WORK / "detector.onnx"
    if not model.exists():
        onnx.save(detector(), model)
    folder = WORK / "images"
    photos(folder, n_images)
    return model, folder


def worker(mode: str, n: int, model: Path, folder: Path) -> dict:

    images = sorted(folder.glob("*.jpg"))[:n]
    if mode == "plain":
        import onnxruntime as ort

        from qtool import data

        pre = data.Preprocess(height=320, width=320, channels=3, layout="nchw")
        started = time.perf_counter()
        sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        for p in images:
            sess.run(None, {"images": data.load_image(p, pre)[None]})
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    if mode == "exposed":
        # onnxruntime alone with every tensor qtool fetches exposed as an output, run the way
        # qtool runs it (one thread per run, one run per core side by side, decoding included),
        # outputs dropped: what calibration would cost if histograms were free
        import threading

        import onnx

        from qtool import biascorrection, collect, data
        from qtool import model as qmodel

        pre = data.Preprocess(height=320, width=320, channels=3, layout="nchw")
        started = time.perf_counter()
        proto = onnx.load(str(model))
        types = qmodel.tensor_types(proto)
        names = qmodel.activation_tensors(proto, types)
        static = frozenset(names) - qmodel.data_dependent(proto)
        derived = collect.derivations(proto, names, types, static, biascorrection.new_stats(proto, names))
        names = [n for n in names if n not in derived]
        sess, blocked = collect.fetching_session(qmodel.with_outputs(proto, names, types), names, static, threads=1)
        names = [blocked[n].source if n in blocked else n for n in names]
        todo, lock = iter(images), threading.Lock()

        def work():
            while True:
                with lock:
                    p = next(todo, None)
                    if p is None:
                        return
                    x = data.load_image(p, pre)[None]
                sess.run(names, {"images": x})

        threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    if mode == "qtool":
        from click.testing import CliRunner

        from qtool.cli import cli

        sub = WORK / f"imgs{n}"
        sub.mkdir(exist_ok=True)
        for p in images:
            if not (sub / p.name).exists():
                os.symlink(p, sub / p.name)
        started = time.perf_counter()
        r = CliRunner().invoke(cli, ["calibrate", str(model), "--images", str(sub), "-o", str(WORK / f"q{n}.calib.json"), "--json"])
        seconds = time.perf_counter() - started
        assert r.exit_code == 0, r.output
        return {"seconds": seconds, "rss_mb": peak_rss_mb(), "batch_size": json.loads(r.stdout)["batch_size"]}
    if mode == "ort":
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator

        from qtool import data

        pre = data.Preprocess(height=320, width=320, channels=3, layout="nchw")

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(images)

            def get_next(self):
                p = next(self.it, None)
                return None if p is None else {"images": data.load_image(p, pre)[None]}

        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cal = create_calibrator(str(model), augmented_model_path=str(Path(tmp) / "aug.onnx"),
                                    calibrate_method=CalibrationMethod.Entropy)
            cal.collect_data(Reader())
            cal.compute_data()
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    raise ValueError(mode)


def measure(mode: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", mode, "--images", str(n)], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--worker")
    ap.add_argument("--skip-ort", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of plain and qtool runs (medians compared)")
    args = ap.parse_args()
    model, folder = setup(max(args.images, 400))
    if args.worker:
        print(json.dumps(worker(args.worker, args.images, model, folder)))
        return
    import onnx

    from qtool import model as qmodel

    proto = onnx.load(str(model))
    print(f"model: {len(qmodel.activation_tensors(proto))} float activation tensors, 320x320 input, {os.cpu_count()} CPUs")
    n = args.images
    # plain and qtool alternate, --repeat times each: the machine's drift hits both alike, and
    # the medians are compared
    rounds = [(measure("plain", n), measure("qtool", n)) for _ in range(args.repeat)]
    plain = sorted((r[0] for r in rounds), key=lambda m: m["seconds"])[len(rounds) // 2]
    ours = sorted((r[1] for r in rounds), key=lambda m: m["seconds"])[len(rounds) // 2]
    exposed = measure("exposed", n)
    small = measure("qtool", 100)
    print(f"plain inference, {n} images incl. decoding: {plain['seconds']:.2f} s (median of {args.repeat})")
    print(f"qtool calibrate, {n} images:               {ours['seconds']:.2f} s (median of {args.repeat}, batch {ours['batch_size']})")
    each = ", ".join(f"{q['seconds'] / p['seconds']:.2f}" for p, q in rounds)
    print(f"ratio calibrate / plain inference:         {ours['seconds'] / plain['seconds']:.2f}  (goal <= 2.0; each round: {each})")
    print(f"floor: tensors exposed, no histograms:     {exposed['seconds']:.2f} s, "
          f"ratio {exposed['seconds'] / plain['seconds']:.2f}")
    print(f"qtool peak RSS: 100 images {small['rss_mb']:.0f} MB, {n} images {ours['rss_mb']:.0f} MB "
          f"({(ours['rss_mb'] / small['rss_mb'] - 1) * 100:+.1f} %)")
    if not args.skip_ort:
        ort_r = measure("ort", 32)
        q32 = measure("qtool", 32)
        print(f"onnxruntime entropy calibrator, 32 images: {ort_r['seconds']:.2f} s, peak RSS {ort_r['rss_mb']:.0f} MB")
        print(f"qtool calibrate, 32 images:                {q32['seconds']:.2f} s, peak RSS {q32['rss_mb']:.0f} MB "
              f"({ort_r['seconds'] / q32['seconds']:.1f}x faster, {ort_r['rss_mb'] / q32['rss_mb']:.1f}x less memory)")


if __name__ == "__main__":
    main()
