"""Calibrate's peak memory against plain onnxruntime inference's, on zoo models.

For each zoo model (bench/zoo_models layout: <zoo>/<name>/model.onnx, calib/NNNN.npz), in CHILD processes run one
after another (never side by side), measured as bench/zoo.py measures them (peak RSS of the whole process tree, polled
every 20 ms):
  - calibrate: `python -m qtool calibrate model.onnx --data calib` (this checkout first on PYTHONPATH),
  - plain:     a default onnxruntime InferenceSession running the same calibration inputs, one file at a time
               (bench/zoo.py's "plain" step),
and prints wall seconds and peak RSS of each, calibrate's CPU seconds (its process tree's user + system time: steadier
than wall time on a shared machine), the ratio calibrate / plain of time and RSS, and the calibration file's SHA-256
(to compare files across commits: the histograms must not change). --repeat alternates the two; the table shows the
lowest time, CPU time and RSS of each (a shared machine only adds to them), and each run's MB beside them
(calibrate's peak moves by up to ~10 % from run to run with its threads' timing).

Usage: python bench/calibrate_memory.py [--zoo DIR] [--models craft,centerface] [--repeat 1] [--json OUT] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoo  # noqa: E402  (bench/zoo.py: its child runner and plain step)


def measure(folder: Path, work: Path, repeat: int, timeout: float) -> dict:
    calib_file = work / f"{folder.name}.calib.json"
    cal, plain = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child and the helpers it waited for
        step = zoo.qtool_step(["calibrate", folder / "model.onnx", "--data", folder / "calib", "-o", calib_file, "-q"],
                              timeout, work)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        step["cpu_s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        if step["status"] != "ok":
            return {"status": step["status"], "error": step["error"]}
        cal.append(step)
        step = zoo.python_step("plain", folder, work, timeout)
        if step["status"] != "ok":
            return {"status": "plain " + step["status"], "error": step["error"]}
        plain.append(step)
    digest = hashlib.sha256(calib_file.read_bytes()).hexdigest()
    row = {"status": "ok", "calibrate_s": min(s["seconds"] for s in cal), "calibrate_mb": min(s["peak_rss_mb"] for s in cal),
           "calibrate_cpu_s": min(s["cpu_s"] for s in cal),
           "plain_s": min(s["seconds"] for s in plain), "plain_mb": min(s["peak_rss_mb"] for s in plain), "sha256": digest,
           "calibrate_mb_runs": [s["peak_rss_mb"] for s in cal], "plain_mb_runs": [s["peak_rss_mb"] for s in plain]}
    row["time_x"] = row["calibrate_s"] / row["plain_s"]
    row["rss_x"] = row["calibrate_mb"] / row["plain_mb"]
    return row


def _spread(values: list[float]) -> str:
    """The lowest and highest of the runs' values ("412" when they are one)."""
    lo, hi = min(values), max(values)
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zoo", type=Path, default=zoo.ZOO)
    ap.add_argument("--models", help="comma-separated model folder names (default: every model in --zoo)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--keep", type=Path, help="copy the calibration files here (<model>.calib.json)")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else sorted(p.parent.name for p in args.zoo.glob("*/model.onnx"))
    missing = [n for n in names if not (args.zoo / n / "model.onnx").exists()]
    if missing:
        sys.exit(f"error: no model.onnx for {', '.join(missing)} in {args.zoo}")
    rows = {}
    print(f"{'model':24s} {'calibrate s':>11s} {'CPU s':>6s} {'MB':>7s} {'plain s':>8s} {'MB':>7s} {'time x':>7s} {'RSS x':>6s}  calibration sha256")
    with tempfile.TemporaryDirectory(prefix="qtool-calmem-") as tmp:
        for name in names:
            row = rows[name] = measure(args.zoo / name, Path(tmp), args.repeat, args.timeout)
            if args.keep and row["status"] == "ok":
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(tmp) / f"{name}.calib.json", args.keep / f"{name}.calib.json")
            if row["status"] != "ok":
                print(f"{name:24s} {row['status']}: {row['error']}", flush=True)
                continue
            print(f"{name:24s} {row['calibrate_s']:11.1f} {row['calibrate_cpu_s']:6.1f} {row['calibrate_mb']:7.0f} {row['plain_s']:8.1f} {row['plain_mb']:7.0f}"
                  f" {row['time_x']:7.2f} {row['rss_x']:6.2f}  {row['sha256'][:16]}  runs' MB: {_spread(row['calibrate_mb_runs'])}"
                  f" / {_spread(row['plain_mb_runs'])}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
