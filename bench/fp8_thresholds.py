"""FP8 (E4M3) vs INT8 TensorRT Q/DQ exports, run in onnxruntime, per FP8 threshold method.

For each real dev model: calibrate once (qtool.api.calibrate on N_CAL inputs: bench/fidelity.py's
model_inputs for the image models, random token ids for MiniLM), export the INT8 Q/DQ model (its
default mse thresholds, and max) and the FP8 one (qtool.targets.tensorrt.fp8: max, percentile:99.99,
mse and entropy searched on the INT8 grid, e4m3-mse searched on the E4M3 grid; also with ModelOpt's
FP8 Conv rule lifted, and with FP16 for the unquantized part), the rest FP32 unless said, and run
them in onnxruntime at ORT_ENABLE_BASIC (onnxruntime 1.32's EXTENDED level removes a Relu in front
of an FP8 QuantizeLinear, see tests/test_fp8.py). Prints the output SQNR (mean over the outputs, dB)
and fidelity.py's task metric against FP32 on N_EVAL held-out inputs.

Usage: python bench/fp8_thresholds.py [mtcnn_onet,minilm,ppocrv5_rec,ppocrv5_det] [N_CAL] [N_EVAL]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import metric, model_inputs, sqnr_db

from qtool import api
from qtool.targets import tensorrt
from qtool.targets.tensorrt import fp8 as trt_fp8

DEV = Path.home() / ".cache" / "qtool-dev"
IMAGE_MODELS = {  # name -> (file, task, input shape, preprocessing), as bench/fidelity.py
    "ppocrv5_det": ("ppocrv5_det/det.onnx", "det", (1, 3, 480, 480), "imagenet"),
    "ppocrv5_rec": ("ppocrv5_rec/rec.onnx", "rec", (1, 3, 48, 320), "half"),
    "mtcnn_onet": ("onet.onnx", "sqnr", (1, 48, 48, 3), "mtcnn"),
}
MINILM = "paraphrase-MiniLM-L3-v2.onnx"
MINILM_OUTPUTS = (2, 3)  # token embeddings and the sentence embedding (0 and 1 echo the inputs)


def minilm_feeds(rng, n: int, length: int = 32) -> list[dict]:
    out = []
    for _ in range(n):
        used = int(rng.integers(8, length))
        ids = rng.integers(1000, 20000, (1, length)).astype(np.int64)
        ids[0, 0], ids[0, used - 1] = 101, 102
        ids[0, used:] = 0
        mask = np.zeros((1, length), np.int64)
        mask[0, :used] = 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def run(data: bytes, feeds: list[dict], outputs) -> list[list[np.ndarray]]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    results = [[np.asarray(o, np.float64) for o in session.run(None, f)] for f in feeds]
    return [[r[i] for i in outputs] for r in results] if outputs else results


def inputs(name: str, n_cal: int, n_eval: int):
    """(model path, task, calibration feeds, held-out feeds, outputs compared or None: all)."""
    if name == "minilm":
        return DEV / "models" / MINILM, "sqnr", minilm_feeds(np.random.default_rng(1), n_cal), \
            minilm_feeds(np.random.default_rng(2), n_eval), MINILM_OUTPUTS
    rel, task, shape, pre = IMAGE_MODELS[name]
    path = DEV / "models" / rel
    photos = sorted((DEV / "photos").glob("*.jpg")) + sorted((DEV / "photos").glob("*.png"))
    calib, held = model_inputs(task, shape, pre, photos, n_cal, n_eval)
    first = onnx.load(str(path), load_external_data=False).graph.input[0].name
    return path, task, [{first: x} for x in calib], [{first: x} for x in held], None


def measure(name: str, n_cal: int, n_eval: int) -> dict:
    path, task, calib, held, outputs = inputs(name, n_cal, n_eval)
    cal = api.calibrate(str(path), data=calib)
    loaded = api._loaded(str(path))
    ref = run(loaded.proto.SerializeToString(), held, outputs)
    exports = {
        "int8 (mse, default)": lambda: tensorrt.export(loaded, cal, high_precision="fp32"),
        "int8 max": lambda: tensorrt.export(loaded, cal, high_precision="fp32", method="max"),
        **{f"fp8 {m}": (lambda m=m: trt_fp8.export(loaded, cal, high_precision="fp32", method=m))
           for m in ("max", "percentile:99.99", "mse", "entropy", "e4m3-mse")},
    }
    small = sorted(trt_fp8.fp8_exclusions(loaded.proto))
    if small:
        for m in ("max", "e4m3-mse"):
            exports[f"fp8 {m}, FP8 Conv rule off"] = lambda m=m: trt_fp8.export(loaded, cal, high_precision="fp32", method=m, include=small)
    exports["fp8 max, rest FP16"] = lambda: trt_fp8.export(loaded, cal, method="max")
    rows = {}
    for label, make in exports.items():
        result = make()
        out = run(result.data, held, outputs)
        per = [sqnr_db(np.concatenate([r[i].ravel() for r in ref]), np.concatenate([o[i].ravel() for o in out])) for i in range(len(ref[0]))]
        what, value = metric(task, ref, out)
        layers = result.summary.get("fp8_layers", result.summary.get("int8_layers", 0))
        rows[label] = {"sqnr_db": round(float(np.mean(per)), 2), what: round(value, 4), "quantized_layers": f"{layers}/{layers + result.summary['fp32_layers']}"}
        print(name, label, rows[label], flush=True)
    return rows


def main() -> None:
    names = (sys.argv[1] if len(sys.argv) > 1 else "mtcnn_onet,minilm,ppocrv5_rec,ppocrv5_det").split(",")
    n_cal = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    n_eval = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    for name in names:
        started = time.time()
        measure(name, n_cal, n_eval)
        print(name, f"done in {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
