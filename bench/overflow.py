"""The overflow guard on real models: each `--weights-7bit` mode of both CPU targets, in this CPU's
int8 kernels and in the exact arithmetic of the file (what a CPU with VNNI computes).

Without VNNI (x86 with AVX2 only), onnxruntime's and OpenVINO's int8 kernels add u8 x s8 products
in pairs into a saturating int16 (qtool.quantizers.overflow). For each model that `fetch_dev_models.sh`
downloads: calibrate once (`qtool calibrate --data`), export `--target openvino` and `--target qdq`
with `--weights-7bit none|first|all` and the default (auto), and measure each against FP32 on
held-out inputs, in one run:
  - the task metric (as bench/fidelity.py: mask IoU, step/top-1 agreement, output SQNR) and the
    worst output SQNR (dB), in the real runtime here (OpenVINO CPU with f32 inference precision;
    onnxruntime with its default optimizations) and in qtool's exact simulation
    (qtool.checks.simulate.simulation: on a CPU with VNNI the runtime computes this);
  - the layers the guard changed (F: kept FP32, 7: 7-bit weights, U: uint8 weights, P: pair-bounded weights);
  - latency of each file relative to FP32 in the real runtime (batch 1, median of --runs).
The header says whether this CPU has VNNI: the runtime columns show saturation only where it has not.

Usage:
  bash ../shared/tools/fetch_dev_models.sh        # models and photos into ~/.cache/qtool-dev
  python bench/overflow.py [--models mtcnn_onet,...] [--calib 64] [--eval 100] [--runs 30] [--dev DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import MODELS, metric, model_inputs

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "overflow"
MODES = ("none", "first", "all", "auto")


def qtool(*args) -> dict:
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exit_code:
        raise RuntimeError(f"qtool {args[0]} failed: {r.output}")
    return json.loads(r.stdout) if "--json" in args else {}


def outputs(session, samples: list[np.ndarray]) -> list[list[np.ndarray]]:
    name = session.get_inputs()[0].name if hasattr(session, "get_inputs") else None
    return [[np.asarray(o, dtype=np.float64) for o in session.run(None, {name: x} if name else [x])] for x in samples]


def worst_sqnr(ref, out) -> float:
    worst = np.inf
    for i in range(len(ref[0])):
        a = np.concatenate([r[i].ravel() for r in ref])
        b = np.concatenate([o[i].ravel() for o in out])
        noise = float(((a - b) ** 2).sum())
        worst = min(worst, 10 * np.log10(float((a * a).sum()) / noise) if noise > 0 else np.inf)
    return worst


def latency_ms(session, sample: np.ndarray, runs: int) -> float:
    name = session.get_inputs()[0].name if hasattr(session, "get_inputs") else None
    feeds = {name: sample} if name else [sample]
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


class _OpenVINO:
    """OpenVINO on CPU with f32 inference precision, with onnxruntime's run(None, feeds)."""

    def __init__(self, path: Path):
        import openvino as ov

        core = ov.Core()
        self.compiled = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"})
        self.request = self.compiled.create_infer_request()

    def run(self, _names, feeds):
        result = self.request.infer(feeds)
        return [result[o] for o in self.compiled.outputs]


def guarded(summary: dict) -> str:
    letters = {"fp32": "F", "7-bit weights": "7", "uint8 weights": "U", "pair-bounded weights": "P", "widened second input": "W"}
    counts: dict[str, int] = {}
    for fix in summary.get("overflow_fix", {}).get("layers", {}).values():
        key = letters[fix["remedy"]]
        counts[key] = counts.get(key, 0) + 1
    return " ".join(f"{n}{k}" for k, n in sorted(counts.items())) or "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
    ap.add_argument("--calib", type=int, default=64, help="calibration inputs")
    ap.add_argument("--eval", type=int, default=100, help="held-out inputs")
    ap.add_argument("--runs", type=int, default=30, help="timed inferences per file")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev", help="fetch_dev_models.sh folder")
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort
    import openvino as ov

    from qtool.checks import simulate
    from qtool.quantizers import cpu_kinds

    photos = sorted((args.dev / "photos").glob("*.jpg"))
    if not photos:
        sys.exit(f"no photos in {args.dev / 'photos'}: run bash ../shared/tools/fetch_dev_models.sh (needs scikit-image)")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        sys.exit(f"unknown model {unknown[0]!r}: choose from {', '.join(MODELS)}")
    vnni = cpu_kinds.vnni()
    print(f"CPU VNNI: {'yes' if vnni else 'no' if vnni is False else 'unknown'} (runtime columns saturate only without it); "
          f"onnxruntime {ort.__version__}, OpenVINO {ov.__version__}; {args.calib} calibration / {args.eval} held-out inputs", flush=True)
    print(f"{'model':12s} {'target':8s} {'mode':5s} {'metric run/sim':>17s} {'worst dB run/sim':>17s} {'guard':>9s} {'latency/FP32':>12s}")
    for name in names:
        rel, task, shape, pre = MODELS[name]
        model_path = args.dev / "models" / rel
        if not model_path.exists():
            print(f"{name:12s} missing {model_path}: run fetch_dev_models.sh")
            continue
        out = WORK / name
        data = out / "calib"
        data.mkdir(parents=True, exist_ok=True)
        for old in data.glob("*.npy"):
            old.unlink()
        calib_inputs, held = model_inputs(task, shape, pre, photos, args.calib, args.eval)
        for i, x in enumerate(calib_inputs):
            np.save(data / f"{i:04d}.npy", x)
        calib = out / "c.calib.json"
        qtool("-q", "calibrate", model_path, "--data", data, "-o", calib)
        fp32 = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        ref = outputs(fp32, held)
        base = {"qdq": latency_ms(fp32, held[0], args.runs), "openvino": latency_ms(_OpenVINO(model_path), held[0], args.runs)}
        for target in ("openvino", "qdq"):
            for mode in MODES:
                path = out / f"{target}.{mode}.onnx"
                summary = qtool("-q", "export", model_path, "--calib", calib, "--target", target, "-o", path,
                                *(["--weights-7bit", mode] if mode != "auto" else []), "--json")
                run = _OpenVINO(path) if target == "openvino" else ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                sim = simulate.simulation(onnx.load(str(path)))
                real, exact = outputs(run, held), outputs(sim, held)
                (label, m_run), (_, m_sim) = metric(task, ref, real), metric(task, ref, exact)
                fmt = "{:8.2f}" if "SQNR" in label else "{:8.4f}"
                print(f"{name:12s} {target:8s} {mode:5s} {fmt.format(m_run)}/{fmt.format(m_sim).strip():<8s} "
                      f"{worst_sqnr(ref, real):8.2f}/{worst_sqnr(ref, exact):<8.2f} {guarded(summary):>9s} "
                      f"{latency_ms(run, held[0], args.runs) / base[target]:12.2f}", flush=True)


if __name__ == "__main__":
    main()
