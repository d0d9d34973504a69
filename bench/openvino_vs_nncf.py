"""OpenVINO int8 from qtool vs NNCF's nncf.quantize, on a detector-sized model.

For the YOLOv8n-sized detector of bench/detector.py at 320x320 (random weights, smooth random
photos), prints, measured in this run on this machine:
  - OpenVINO latency (batch 1, LATENCY hint, median) of the FP32 model (f32 and the CPU's default
    inference precision, which is bf16 on CPUs that have it), of qtool's FakeQuantize export and
    of NNCF's quantized model;
  - the int8 layer count OpenVINO reports (runtimePrecision u8/i8) for each;
  - the SQNR of each int8 model against FP32 (f32) on held-out photos: of the model output
    (sigmoid scores, so the errors are small next to the values) and of the six raw head
    convolutions (the logits, a stricter measure);
  - the time each tool took to quantize.
The int8 models run at --precision (default f32: the layers left in FP32 run in f32 on every CPU;
`default` leaves it to OpenVINO, bf16 on CPUs with AVX-512 BF16 or AMX: qtool.quantizers.cpu_kinds.KINDS).
Both tools see the same calibration images, preprocessed by qtool.feeds.data (stretch to 320x320,
RGB, /255, NCHW). nncf is a bench-only dependency: pip install nncf.

Usage: python bench/openvino_vs_nncf.py [--images 200] [--eval 32] [--runs 200] [--method entropy,mse]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "openvino_vs_nncf"
LINEAR = ("Convolution", "MatMul", "FullyConnected")


def preprocess(paths, size):
    from qtool.feeds.data import Preprocess, load_image

    pre = Preprocess(height=size, width=size, channels=3, layout="nchw")
    return [load_image(p, pre)[None] for p in paths]


def int8_layers(compiled, layer_types=LINEAR) -> tuple[int, int]:
    """(int8 layers, all layers of `layer_types`) in OpenVINO's runtime model."""
    total = int8 = 0
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if str(info["layerType"].astype(str)) in layer_types:
            total += 1
            int8 += str(info["runtimePrecision"].astype(str)) in ("u8", "i8")
    return int8, total


def latencies_ms(core, models: dict, sample, runs: int, rounds: int = 5) -> dict:
    """Median latency per model (batch 1, LATENCY hint); models alternate over `rounds` rounds
    and each keeps its best round, so a noisy moment on the machine hits every model alike.
    `sample`: the one input's array, or {input name: array} for a multi-input model."""
    feed = sample if isinstance(sample, dict) else [sample]
    requests = {}
    for label, (path, config) in models.items():
        compiled = core.compile_model(str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", **(config or {})})
        requests[label] = compiled.create_infer_request()
        for _ in range(max(10, runs // 10)):
            requests[label].infer(feed)
    best = {label: float("inf") for label in models}
    for _ in range(rounds):
        for label, request in requests.items():
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                request.infer(feed)
                times.append(time.perf_counter() - t)
            best[label] = min(best[label], float(np.median(times) * 1000))
    return best


def head_logits(proto) -> list[str]:
    """The detector's raw head outputs: Conv outputs read only by the final Softmax/Sigmoid."""
    readers: dict[str, list[str]] = {}
    for n in proto.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    return [n.output[0] for n in proto.graph.node
            if n.op_type == "Conv" and readers.get(n.output[0]) in (["Softmax"], ["Sigmoid"])]


def outputs(core, path, samples, extra, config=None) -> tuple[np.ndarray, np.ndarray]:
    """(the model output, the `extra` tensors) over all samples, flattened."""
    model = core.read_model(path)
    model.add_outputs(extra)
    compiled = core.compile_model(model, "CPU", config or {})
    main, side = [], []
    for s in samples:
        res = compiled(s)
        main.append(res[0].ravel())
        side.extend(res[i].ravel() for i in range(1, len(extra) + 1))
    return np.concatenate(main).astype(np.float64), np.concatenate(side).astype(np.float64)


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - out) ** 2).sum(), 1e-30)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200, help="calibration images (both tools)")
    ap.add_argument("--eval", type=int, default=32, help="held-out images for SQNR")
    ap.add_argument("--runs", type=int, default=200, help="timed inferences per model")
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--precision", default="f32", choices=("f32", "bf16", "f16", "default"),
                    help="OpenVINO inference precision of the int8 models (default: OpenVINO's choice for this CPU)")
    ap.add_argument("--method", default="entropy,mse", help="qtool threshold methods, comma-separated (entropy, max, mse, percentile:P)")
    args = ap.parse_args()

    import onnx
    import openvino as ov
    from click.testing import CliRunner

    sys.path.insert(0, str(HERE))
    from detector import detector, photos

    from qtool import calibration
    from qtool.cli import cli

    try:
        import nncf
    except ImportError:
        sys.exit("nncf is not installed: pip install nncf (bench-only dependency)")

    WORK.mkdir(parents=True, exist_ok=True)
    model_path = WORK / f"detector{args.size}.onnx"
    onnx.save(detector(args.size), str(model_path))
    calib_dir, eval_dir = WORK / "calib", WORK / "eval"
    calib_paths = photos(calib_dir, args.images, seed=0)
    eval_paths = photos(eval_dir, args.eval, seed=1)
    calib_samples = preprocess(calib_paths, args.size)
    eval_samples = preprocess(eval_paths, args.size)
    core = ov.Core()
    results: dict[str, dict] = {}

    # qtool: calibrate once (the CLI, as a user runs it), then one export per threshold method;
    # other methods are recomputed from the histograms the calibration file keeps
    methods = [m.strip() for m in args.method.split(",") if m.strip()]
    calib_file = WORK / "detector.calib.json"
    t = time.perf_counter()
    r = CliRunner().invoke(cli, ["-q", "calibrate", str(model_path), "--images", str(calib_dir), "--limit", str(args.images),
                                 "--method", methods[0], "-o", str(calib_file)])
    t_cal = time.perf_counter() - t
    assert r.exit_code == 0, r.output
    exports = {}
    for method in methods:
        this = calib_file
        if method != methods[0]:
            this = WORK / f"detector.{method.replace(':', '')}.calib.json"
            calibration.save(calibration.recompute(calibration.load(calib_file), method), this)
        fq_path = WORK / f"detector.{method.replace(':', '')}.openvino.onnx"
        t = time.perf_counter()
        r = CliRunner().invoke(cli, ["-q", "export", "--target", "openvino", "--calib", str(this), "-o", str(fq_path)])
        assert r.exit_code == 0, r.output
        exports[method] = (fq_path, time.perf_counter() - t)

    # NNCF: post-training quantization of the OpenVINO model on the same samples
    # ov.convert_model, NNCF's documented entry point, fuses x*sigmoid(x) into Swish first.
    # Default settings (fast bias correction on), and once without bias correction, which
    # isolates the effect of its range estimation.
    nncf_runs = {}
    for label, fbc in (("NNCF int8 (defaults)", True), ("NNCF int8 (no bias corr.)", False)):
        t = time.perf_counter()
        nncf_model = nncf.quantize(ov.convert_model(str(model_path)), nncf.Dataset(calib_samples),
                                   subset_size=len(calib_samples), fast_bias_correction=fbc)
        nncf_runs[label] = (WORK / f"detector.nncf{'' if fbc else '.nobc'}.xml", time.perf_counter() - t)
        ov.save_model(nncf_model, str(nncf_runs[label][0]), compress_to_fp16=False)

    from qtool.quantizers import cpu_kinds

    f32 = cpu_kinds.PINNED_F32
    run = None if args.precision == "default" else {"INFERENCE_PRECISION_HINT": args.precision}
    heads = head_logits(onnx.load(str(model_path)))
    reference, ref_heads = outputs(core, str(model_path), eval_samples, heads, f32)
    rows = [
        ("FP32 (f32)", str(model_path), f32, None),
        ("FP32 (default precision)", str(model_path), None, None),
        *((f"qtool int8 ({m})", str(path), run, f"calibrate {t_cal:.1f} s + export {t_exp:.1f} s")
          for m, (path, t_exp) in exports.items()),
        *((label, str(path), run, f"nncf.quantize {t_nncf:.1f} s") for label, (path, t_nncf) in nncf_runs.items()),
    ]
    latency = latencies_ms(core, {label: (path, config) for label, path, config, _ in rows}, eval_samples[0], args.runs)
    base = latency[rows[0][0]]
    print(f"detector {args.size}x{args.size}, {args.images} calibration images, SQNR on {args.eval} held-out images, "
          f"OpenVINO {ov.__version__} (int8 models at {args.precision} precision), nncf {nncf.__version__}; this CPU: {cpu_kinds.describe()}")
    print(f"{'model':32s} {'latency ms':>10s} {'speedup':>8s} {'int8 layers':>12s} {'SQNR dB':>8s} {'heads dB':>8s}  quantization time")
    for label, path, config, note in rows:
        ms = latency[label]
        compiled = core.compile_model(path, "CPU", config or {})
        n8, total = int8_layers(compiled)
        if config is f32:
            quality = head_quality = None
        else:
            out, out_heads = outputs(core, path, eval_samples, heads, config)
            quality, head_quality = sqnr_db(reference, out), sqnr_db(ref_heads, out_heads)
        results[label] = {"latency_ms": round(ms, 3), "speedup": round(base / ms, 3), "int8_layers": n8, "layers": total,
                          "sqnr_db": quality and round(quality, 2), "head_sqnr_db": head_quality and round(head_quality, 2)}
        q = "-" if quality is None else f"{quality:.2f}"
        hq = "-" if head_quality is None else f"{head_quality:.2f}"
        print(f"{label:32s} {ms:10.2f} {base / ms:7.2f}x {n8:5d} / {total:<5d} {q:>8s} {hq:>8s}  {note or ''}")
    (WORK / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
