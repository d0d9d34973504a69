"""Is a zoo row's figure the model's, or its few held-out feeds'? K-fold over a zoo model's feeds.

A zoo row scores qtool's OpenVINO file on 8 (or 32) held-out feeds; a range or placement choice that wins there by a
dB may lose it on the next eight. This pools a model's calibration and held-out feeds (bench/zoo.py's layout:
<zoo>/<name>/model.onnx, calib/*.npz, held/*.npz), shuffles them once (seed 0) into --folds folds and, per fold,
calibrates qtool on the other folds (`qtool calibrate`, in a child, this checkout first on PYTHONPATH) and runs
`qtool evaluate --target openvino --runtime openvino` on the fold, once per variant:

  auto         the calibration file as calibrate writes it: the export's default (`auto`) thresholds;
  feed-max     every activation's threshold the mean over the calibration feeds of that feed's max |x| (the range
               NNCF's files showed in docs/benchmarks.md #behind10: MEAN_MINMAX of openvinotoolkit/nncf
               src/nncf/quantization/range_estimator.py, one dataset item = one feed), written into a pinned file;
  method:M     `--method M` (entropy, mse, max, percentile:P, mean-minmax);
  exclude:A+B  `auto` with the nodes A and B kept FP32 (`--exclude A --exclude B`).

Prints, per fold and variant, OpenVINO's run of the file (the worst output's SQNR over the fold, dB; qtool's
accumulator) on stderr, and a table on stdout: per variant the mean over folds and its difference from `auto` per
fold (min..max).

Usage (from the repository root):
  python bench/zoo_folds.py --models silero_v5_encoder[,...] [--variants auto,feed-max,method:mse]
                            [--folds 3] [--zoo DIR] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qtool.calibration import Calibration  # noqa: E402 (after the sys.path line above)

ZOO = Path.home() / ".cache" / "qtool-bench" / "zoo"
WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "zoo-folds"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


class BenchError(Exception):
    """Bad bench input: printed as one `error: ...` line, exit 1."""


def _qtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qtool", *args, "-q"], capture_output=True, text=True, env=ENV)


def _feed_max(model: Path, names: list[str], feeds: list[Path]) -> dict[str, float]:
    """Mean over `feeds` of each feed's max |x| (finite values) of every tensor in `names` onnxruntime can fetch."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(model))
    inputs = {i.name for i in m.graph.input}
    fetched = {o.name for o in m.graph.output}
    for n in names:
        if n not in fetched and n not in inputs:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    maxima: dict[str, list[float]] = {n: [] for n in names}
    for path in feeds:
        with np.load(path) as z:
            feed = {k: z[k] for k in z.files}
        values = dict(zip(outputs, session.run(None, feed)))
        values.update(feed)
        for n in names:
            a = np.asarray(values.get(n, ()), dtype=np.float64)
            a = np.abs(a[np.isfinite(a)])
            if a.size:
                maxima[n].append(float(a.max()))
    return {n: float(np.mean(v)) for n, v in maxima.items() if v}


def _variant_args(variant: str, cal: Calibration, model: Path, train: list[Path], folder: Path) -> list[str]:
    """The evaluate arguments of one variant (writing its calibration file where it needs one)."""
    if variant == "auto":
        return ["--calib", str(folder / "m.calib.json")]
    if variant == "feed-max":
        found = _feed_max(model, [t.name for t in cal.tensors], train)
        tensors = [replace(t, amax=min(found.get(t.name, t.absmax), t.absmax)) for t in cal.tensors]
        pinned = replace(cal, tensors=tensors, method="max", pinned=True)  # "max": exports take the file's amax as it is
        pinned.model_path = str(model)
        pinned.save(folder / "feed-max.calib.json")
        return ["--calib", str(folder / "feed-max.calib.json")]
    if variant.startswith("method:"):
        return ["--calib", str(folder / "m.calib.json"), "--method", variant.split(":", 1)[1]]
    if variant.startswith("exclude:"):
        nodes = [n for n in variant.split(":", 1)[1].split("+") if n]
        return ["--calib", str(folder / "m.calib.json")] + [a for n in nodes for a in ("--exclude", n)]
    raise BenchError(f"unknown variant {variant!r}: auto, feed-max, method:M or exclude:A+B")


def run_model(name: str, zoo: Path, work: Path, folds: int, variants: list[str]) -> dict[str, list[float]]:
    folder = zoo / name
    model = folder / "model.onnx"
    feeds = sorted((folder / "calib").glob("*.npz")) + sorted((folder / "held").glob("*.npz"))
    if not model.is_file() or len(feeds) < 2 * folds:
        raise BenchError(f"{folder}: no model.onnx, or fewer than {2 * folds} feeds in calib/ and held/")
    order = np.random.default_rng(0).permutation(len(feeds))
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for k in range(folds):
        test = {int(i) for i in order[k::folds]}
        fold = work / name / f"fold{k}"
        parts = {"train": [f for i, f in enumerate(feeds) if i not in test], "test": [feeds[i] for i in sorted(test)]}
        for part, files in parts.items():
            (fold / part).mkdir(parents=True, exist_ok=True)
            for old in (fold / part).glob("*.npz"):
                old.unlink()
            for i, f in enumerate(files):
                (fold / part / f"{i:04d}.npz").symlink_to(f)
        done = _qtool("calibrate", str(model), "--data", str(fold / "train"), "-o", str(fold / "m.calib.json"))
        if done.returncode:
            raise BenchError(f"{name} fold {k}: calibrate exited {done.returncode}: {done.stderr.strip()[-300:]}")
        cal = Calibration.load(fold / "m.calib.json")
        row = []
        for v in variants:
            done = _qtool("evaluate", str(model), "--data", str(fold / "test"), "--target", "openvino",
                          "--runtime", "openvino", "--json", *_variant_args(v, cal, model, parts["train"], fold))
            try:
                runs[v].append(float(json.loads(done.stdout)["runtime"]["sqnr_db"]))
            except (ValueError, KeyError, TypeError):
                runs[v].append(float("nan"))
                print(f"  {v}: evaluate exited {done.returncode}: {done.stderr.strip()[-200:]}", file=sys.stderr)
            row.append(f"{v} {runs[v][-1]:.2f}")
        print(f"{name} fold {k} ({len(parts['test'])} feeds): " + ", ".join(row), file=sys.stderr, flush=True)
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated zoo model names")
    ap.add_argument("--variants", default="auto,feed-max")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--zoo", type=Path, default=ZOO)
    ap.add_argument("--work", type=Path, default=WORK)
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    try:
        if args.folds < 2:
            raise BenchError(f"--folds {args.folds}: need at least 2")
        if "auto" not in variants:
            variants.insert(0, "auto")
        for v in variants:  # every variant known before anything runs
            if v not in ("auto", "feed-max") and not v.startswith(("method:", "exclude:")):
                raise BenchError(f"unknown variant {v!r}: auto, feed-max, method:M or exclude:A+B")
        print("| model | " + " | ".join(f"{v} (mean dB; - auto per fold)" for v in variants) + " |")
        print("|---" * (len(variants) + 1) + "|")
        for name in [m for m in args.models.split(",") if m]:
            runs = run_model(name, args.zoo, args.work, args.folds, variants)
            base = np.array(runs["auto"])
            cells = []
            for v in variants:
                r = np.array(runs[v])
                cell = f"{np.mean(r):.2f}"
                if v != "auto":
                    d = r - base
                    cell += f" ({np.nanmin(d):+.2f}..{np.nanmax(d):+.2f})"
                cells.append(cell)
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
