"""What each quantization policy costs: output fidelity of qtool's QDQ export, run in onnxruntime,
per policy, on real models from fetch_dev_models.sh (bench/fidelity.py's models, inputs, metrics).

Per model, one calibration (--calib inputs), then one QDQ export per row, each compared with the
FP32 model on held-out inputs (--eval): output SQNR (dB, mean over outputs) and the task metric.
Rows:
  w8a8         the default policy (8-bit weights per channel, 8-bit activations)
  w4a8         4-bit weights per channel (INT4 initializers, opset 21)
  w8a16-worstN 16-bit activations on the N activation tensors `qtool evaluate` ranks most harmful
               (a --policy file of name rules), 8 bits elsewhere
  w8a16        16-bit activations everywhere
  pow2         power-of-two scales (weights and activations)
Measured in this run on this machine. Usage:
  bash ../shared/tools/fetch_dev_models.sh
  python bench/policies.py [--models ppocrv5_rec,mtcnn_onet] [--calib 64] [--eval 32] [--worst 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import MODELS, make_input, metric, sqnr_db

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "policies"


def qtool(*args) -> str:
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exit_code:
        raise RuntimeError(f"qtool {' '.join(map(str, args[:2]))} failed: {r.output}")
    return r.stdout


def run_onnx(path: Path, samples: list[np.ndarray]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return [[np.asarray(o, dtype=np.float64) for o in s.run(None, {name: x})] for x in samples]


def inputs(name: str, dev: Path, n: int, held_out: bool, seed: int) -> list[np.ndarray]:
    _, task, shape, pre = MODELS[name]
    photos = sorted((dev / "photos").glob("*.jpg"))
    rng = np.random.default_rng(seed)
    return [make_input(task, shape, pre, photos, rng, held_out) for _ in range(n)]


def bench_model(name: str, dev: Path, n_calib: int, n_eval: int, worst: int) -> list[dict]:
    rel, task, _, _ = MODELS[name]
    path = dev / "models" / rel
    work = WORK / name
    (work / "calib").mkdir(parents=True, exist_ok=True)
    (work / "held").mkdir(exist_ok=True)
    for i, x in enumerate(inputs(name, dev, n_calib, False, 1)):
        np.save(work / "calib" / f"{i:04d}.npy", x)
    held = inputs(name, dev, n_eval, True, 2)
    for i, x in enumerate(held[: min(16, n_eval)]):
        np.save(work / "held" / f"{i:04d}.npy", x)
    calib = work / "m.calib.json"
    qtool("-q", "calibrate", path, "--data", work / "calib", "-o", calib)
    ranking = json.loads(qtool("evaluate", path, "--calib", calib, "--data", work / "held", "--json", "--tensors"))["tensors"]
    names = [t["tensor"] for t in ranking if t["kind"] == "activation"][:worst]
    (work / "worst.json").write_text(json.dumps({"rules": [{"name": t, "apply_to": "activations", "bits": 16} for t in names]}))
    rows = {"w8a8": [], "w4a8": ["--weight-bits", "4"], f"w8a16-worst{worst}": ["--policy", work / "worst.json"],
            "w8a16": ["--activation-bits", "16"], "pow2": ["--scale-kind", "pow2"]}
    ref = run_onnx(path, held)
    results = []
    for label, extra in rows.items():
        out = work / f"{label}.onnx"
        qtool("-q", "export", "--target", "qdq", "--calib", calib, "-o", out, *extra)
        got = run_onnx(out, held)
        sq = float(np.mean([sqnr_db(np.concatenate([r[i].ravel() for r in ref]), np.concatenate([o[i].ravel() for o in got]))
                            for i in range(len(ref[0]))]))
        what, value = metric(task, ref, got)
        results.append({"model": name, "policy": label, "sqnr_db": round(sq, 2), "metric": what, "value": round(value, 4),
                        "bytes": out.stat().st_size})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ppocrv5_rec,ppocrv5_cls,mtcnn_onet", help="comma-separated subset of: " + ", ".join(MODELS))
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--eval", type=int, default=32)
    ap.add_argument("--worst", type=int, default=5, help="activation tensors given 16 bits in the w8a16-worstN row")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"{'model':<12} {'policy':<14} {'SQNR dB':>8}  {'metric':<18} {'value':>7}  {'file MB':>7}")
    for name in args.models.split(","):
        for r in bench_model(name, args.dev, args.calib, args.eval, args.worst):
            rows.append(r)
            print(f"{r['model']:<12} {r['policy']:<14} {r['sqnr_db']:>8.2f}  {r['metric']:<18} {r['value']:>7.4f}  {r['bytes'] / 1e6:>7.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
