"""qtool's TensorRT Q/DQ export vs NVIDIA ModelOpt's ONNX INT8 PTQ, on real trained models.

For each model that `fetch_dev_models.sh` downloads (PP-OCRv5 det/rec/cls, PP-OCRv6 det/rec
small, MTCNN P-/R-/O-Net), prints one row per tool, measured in this run on this machine:
  - the wall time and peak RSS of quantization (qtool: `qtool calibrate --data` + `qtool export
    --target tensorrt --format qdq` with its defaults, two processes, times added, RSS the larger;
    ModelOpt: one `python -m modelopt.onnx.quantization --quantize_mode int8 --calibration_eps cpu`
    process per row: --calibration_method entropy, max, and max on the model with its Constant
    nodes turned into initializers ("max+init": PP-OCR's exports keep every weight in a Constant
    node, which ModelOpt quantizes per tensor like an activation). RSS is the process's own peak
    (getrusage in a small wrapper process). Both start a Python interpreter, ModelOpt's also imports
    torch, so small models are dominated by start-up;
  - fidelity in onnxruntime (CPUExecutionProvider) against the FP32 model on held-out inputs:
    bench/fidelity.py's task metric (mask IoU@0.3, CTC step argmax agreement, top-1 agreement,
    or output SQNR for MTCNN) and the output SQNR (dB, per output over the held-out set, mean over
    the outputs). Both tools write FP16 outside the Q/DQ pairs by default for TensorRT 10.x;
    onnxruntime's CPU provider runs the FP16 nodes it has no kernel for in FP32 behind inserted
    Casts, so FP16 rounding of weights and activations is part of the error, as in TensorRT;
  - TensorRT Q/DQ parser rule violations of each output (`qtool.targets.tensorrt.checker.check`, counted per
    rule; "n/a" until that module exists);
  - "Q/DQ in": how many inputs of the original model's nodes read a DequantizeLinear, directly or
    through Cast/Identity/Transpose/Reshape/Flatten/Squeeze/Unsqueeze/MaxPool (which TensorRT moves Q/DQ
    across; the inputs of those ops are not counted), and the placement difference against qtool:
    such inputs quantized in one output and not in the other, counted by the reading node's op type
    ("Conv.w": a weight; "+N": only ModelOpt quantizes them, "-N": only qtool); -v lists them.
Both tools get the same calibration inputs (bench/fidelity.py's generator and preprocessing:
qtool as .npy files for --data, ModelOpt as one .npz keyed by the input name) and are evaluated on
other inputs (mirrored crops; 10x --eval for the 2-class orientation classifier, as fidelity.py).

ModelOpt lives in its own virtualenv (default ~/.cache/qtool-bench/modelopt-venv), created on first
run: `python3 -m venv`, `pip install torch==2.13.0` (the CPU wheel), then
`pip install 'nvidia-modelopt[onnx]' torch==2.13.0`; it never touches qtool's environment.
Until qtool's export has `--target tensorrt --format qdq`, qtool's row uses `--target qdq`
(the header says which). The defaults (64 calibration inputs, 50 held-out, all eight models) take
about 12 minutes on 2 cores, most of it ModelOpt's calibration. Usage:
  bash ../shared/tools/fetch_dev_models.sh        # models and photos into ~/.cache/qtool-dev
  python bench/tensorrt_vs_modelopt.py [--models ppocrv5_det,...] [--calib 64] [--eval 50]
                                       [--trt-version 10.13] [--export-args "..."] [--json F] [-v]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import MODELS, make_input, metric  # same models, inputs and metrics

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "tensorrt_vs_modelopt"
VENV = Path.home() / ".cache" / "qtool-bench" / "modelopt-venv"
TORCH = "torch==2.13.0"  # the local CPU wheel; a bare `torch` would fetch a multi-GB CUDA build
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
PASS_THROUGH = ("Identity", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "MaxPool")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


# runs the command and writes "seconds peak-RSS-KiB" of it; a small process of its own, because a child's
# ru_maxrss starts from the RSS of the process that forked it (this bench holds models and inputs)
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); r = subprocess.run(sys.argv[2:]); "
           "open(sys.argv[1], 'w').write(f'{time.perf_counter() - t} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}'); "
           "sys.exit(r.returncode)")


def run_measured(cmd: list[str], log_path: Path) -> tuple[float, float]:
    """Run cmd with stdout/stderr to log_path; (wall seconds, peak RSS MiB of that process)."""
    stats = log_path.with_suffix(".rusage")
    with open(log_path, "w") as out:
        code = subprocess.run([sys.executable, "-c", MEASURE, str(stats), *cmd], stdout=out, stderr=subprocess.STDOUT,
                              check=False).returncode
    if code:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {code}:\n{tail}")
    seconds, kib = stats.read_text().split()
    return float(seconds), int(kib) / 1024


def ensure_modelopt(venv: Path) -> Path:
    """The venv's python, creating the venv with ModelOpt on first use."""
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import modelopt.onnx.quantization"]
    if py.exists() and subprocess.run(check, check=False, capture_output=True).returncode == 0:
        return py
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [["python3", "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "-q", TORCH],
             [str(py), "-m", "pip", "install", "-q", "nvidia-modelopt[onnx]", TORCH]]
    for step in steps:
        log(f"[modelopt venv] {' '.join(step)}")
        subprocess.run(step, check=True, stdout=sys.stderr)
    subprocess.run(check, check=True)
    return py


def modelopt_version(py: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('nvidia-modelopt'), m.version('onnxruntime-gpu'))"
    r = subprocess.run([str(py), "-c", code], check=False, capture_output=True, text=True)
    return r.stdout.strip().replace(" ", ", onnxruntime ")


def qtool_trt_qdq() -> bool:
    """Whether `qtool export` has landed the TensorRT Q/DQ format."""
    r = subprocess.run([sys.executable, "-m", "qtool", "export", "--help"], check=False, capture_output=True,
                       text=True)
    text = " ".join(r.stdout.split())
    fmt = text.split("--format", 1)[1].split(" --", 1)[0] if "--format" in text else ""
    return "--high-precision" in text or "qdq" in fmt


# ---------------------------------------------------------------- the two tools


def run_qtool(model: Path, data_dir: Path, out_dir: Path, args, trt_qdq: bool) -> dict:
    calib = out_dir / "qtool.calib.json"
    out = out_dir / "qtool.trt.onnx"
    q = [sys.executable, "-m", "qtool", "-q"]
    t1, r1 = run_measured([*q, "calibrate", str(model), "--data", str(data_dir), "-o", str(calib), "--json",
                           *shlex.split(args.calib_args)], out_dir / "qtool.calibrate.log")
    target = (["--target", "tensorrt", "--trt-version", args.trt_version, "--format", "qdq"] if trt_qdq
              else ["--target", "qdq"])
    t2, r2 = run_measured([*q, "export", str(model), "--calib", str(calib), *target, "-o", str(out), "--json",
                           *shlex.split(args.export_args)], out_dir / "qtool.export.log")
    return {"path": out, "seconds": t1 + t2, "rss_mb": max(r1, r2)}


def with_initializers(model: Path, out: Path) -> Path:
    """The model with its Constant-node tensors as initializers (PP-OCR's exports keep every weight in a
    Constant node, which onnxruntime's quantizer, and so ModelOpt, treats as an activation: per-tensor
    weight scales)."""
    import onnx

    proto = onnx.load(str(model))
    keep = []
    for node in proto.graph.node:
        value = [a for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR]
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value[0].t)
            tensor.name = node.output[0]
            proto.graph.initializer.append(tensor)
        else:
            keep.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    onnx.save(proto, str(out))
    return out


def run_modelopt(py: Path, model: Path, npz: Path, method: str, out_dir: Path, args) -> dict:
    """method: entropy or max, '+init' to quantize the model with its Constant nodes as initializers."""
    tag = method.replace("+", ".")
    if method.endswith("+init"):
        model, method = with_initializers(model, out_dir / "model.init.onnx"), method.removesuffix("+init")
    out = out_dir / f"modelopt.{tag}.onnx"
    cmd = [str(py), "-m", "modelopt.onnx.quantization", "--onnx_path", str(model), "--quantize_mode", "int8",
           "--calibration_method", method, "--calibration_data_path", str(npz), "--output_path", str(out),
           "--calibration_eps", "cpu", *shlex.split(args.modelopt_args)]
    seconds, rss = run_measured(cmd, out_dir / f"modelopt.{tag}.log")
    return {"path": out, "seconds": seconds, "rss_mb": rss}


# ---------------------------------------------------------------- evaluation


def ort_outputs(path: Path, samples: list[np.ndarray]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return [[np.asarray(o, dtype=np.float64) for o in sess.run(None, {name: s})] for s in samples]


def fidelity(task: str, ref, out) -> dict:
    """fidelity.py's task metric and the output SQNR (mean over outputs, dB)."""
    name, value = metric(task, ref, out)
    _, sqnr = metric("sqnr", ref, out)
    zero = [i for i in range(len(out[0])) if all(not np.any(o[i]) for o in out)]
    return {"metric": name, "value": value, "sqnr_db": sqnr, "all_zero_outputs": zero}


def rule_counts(path: Path, trt_version: str) -> dict | None:
    """Violations of TensorRT's Q/DQ parser rules per rule, or None without qtool.targets.tensorrt.checker."""
    try:
        from qtool.targets.tensorrt import checker as trtrules
    except ImportError:
        return None
    import onnx

    return dict(Counter(v.rule for v in trtrules.check(onnx.load(str(path)), trt_version)))


# ---------------------------------------------------------------- placement


def _key(node) -> str:
    return node.name or f"out:{node.output[0]}"


def quantized_edges(path: Path) -> set[tuple[str, int]]:
    """(node key, input index) of every input that reads a DequantizeLinear, directly or through ops a
    DequantizeLinear moves across (Cast and the PASS_THROUGH data-movement ops, as TensorRT propagates
    it); inputs of those ops themselves are not listed, so DQ->MaxPool->Conv and MaxPool->DQ->Conv agree."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    producer = {o: n for n in graph.node for o in n.output}
    edges = set()
    for node in graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast", *PASS_THROUGH):
            continue
        for i, name in enumerate(node.input):
            src = producer.get(name)
            while src is not None and src.op_type in ("Cast", *PASS_THROUGH):
                src = producer.get(src.input[0])
            if src is not None and src.op_type == "DequantizeLinear":
                edges.add((_key(node), i))
    return edges


def original_nodes(path: Path) -> dict[str, tuple[str, list[str], set[str]]]:
    """node key -> (op type, input names, initializer names) of the FP32 model."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return {_key(n): (n.op_type, list(n.input), inits) for n in graph.node}


def placement_diff(nodes: dict, ours: set, theirs: set) -> tuple[dict, list[str]]:
    """Per reading op type [only theirs, only ours] and the edges listed; weights as 'Op.w'."""
    counts: dict[str, list[int]] = {}
    listed = []
    for sign, edges in (("+", theirs - ours), ("-", ours - theirs)):
        for key, i in sorted(edges):
            op, inputs, inits = nodes.get(key, ("?", [], set()))
            tensor = inputs[i] if i < len(inputs) else "?"
            label = f"{op}.w" if op in WEIGHTED and tensor in inits else op
            counts.setdefault(label, [0, 0])[sign == "-"] += 1
            listed.append(f"{sign} {label:14s} {tensor} -> {key}")
    return counts, listed


def diff_text(counts: dict) -> str:
    if not counts:
        return "same"
    return " ".join(f"{op}:" + "/".join(f"{s}{n}" for s, n in zip("+-", c) if n) for op, c in sorted(counts.items()))


# ---------------------------------------------------------------- one model


def make_sets(name: str, photos: list[Path], out_dir: Path, n_calib: int, n_eval: int) -> tuple[Path, Path, list]:
    """Calibration inputs as .npy files (qtool) and one .npz (ModelOpt); the held-out inputs."""
    import onnx

    _, task, shape, pre = MODELS[name]
    calib_rng, eval_rng = np.random.default_rng(1000), np.random.default_rng(2000)
    calib = [make_input(task, shape, pre, photos, calib_rng, held_out=False) for _ in range(n_calib)]
    held = [make_input(task, shape, pre, photos, eval_rng, held_out=True)
            for _ in range(n_eval * (10 if task == "cls" else 1))]
    data_dir = out_dir / "calib"
    data_dir.mkdir(parents=True, exist_ok=True)
    for old in data_dir.glob("*.npy"):
        old.unlink()
    for i, x in enumerate(calib):
        np.save(data_dir / f"{i:04d}.npy", x)
    model = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)
    npz = out_dir / "calib.npz"
    np.savez(npz, **{model.graph.input[0].name: np.concatenate(calib)})
    return data_dir, npz, held


def quantize_all(name: str, model: Path, out_dir: Path, args, py: Path | None, trt_qdq: bool) -> dict:
    """{tool label: {path, seconds, rss_mb} or {error}}."""
    data_dir, npz, held = make_sets(name, args.photos, out_dir, args.calib, args.eval)
    runs: dict[str, dict] = {}
    try:
        runs["qtool"] = run_qtool(model, data_dir, out_dir, args, trt_qdq)
    except RuntimeError as e:
        runs["qtool"] = {"error": str(e)}
    for method in args.modelopt_methods:
        label = f"ModelOpt {method}"
        if py is None:
            runs[label] = {"error": "ModelOpt venv unavailable"}
            continue
        try:
            runs[label] = run_modelopt(py, model, npz, method, out_dir, args)
        except RuntimeError as e:
            runs[label] = {"error": str(e)}
    runs["_held"] = held
    return runs


def evaluate_model(name: str, model: Path, runs: dict, args) -> dict:
    """Fidelity, rule check and placement of every tool's output; the results for JSON."""
    task = MODELS[name][1]
    held = runs.pop("_held")
    ref = ort_outputs(model, held)
    nodes = original_nodes(model)
    ours = quantized_edges(runs["qtool"]["path"]) if "path" in runs["qtool"] else None
    rows = {}
    for label, run in runs.items():
        row = {k: v for k, v in run.items() if k != "path"}
        if "path" in run:
            try:
                row.update(fidelity(task, ref, ort_outputs(run["path"], held)))
            except Exception as e:  # onnxruntime refusing the model is a result
                row["ort_error"] = str(e).splitlines()[0][:200]
            row["rules"] = rule_counts(run["path"], args.trt_version)
            edges = quantized_edges(run["path"])
            row["quantized_inputs"] = len(edges)
            if ours is not None and label != "qtool":
                row["placement"], row["placement_list"] = placement_diff(nodes, ours, edges)
        rows[label] = row
    return rows


# ---------------------------------------------------------------- table


HEADER = (f"{'model':12s} {'tool':17s} {'time s':>7s} {'RSS MB':>7s} {'metric':17s} {'value':>7s} {'SQNR dB':>8s} "
          f"{'Q/DQ in':>7s}  {'TRT rule violations':22s} placement vs qtool (+ModelOpt only / -qtool only)")


def rules_text(rules: dict | None) -> str:
    if rules is None:
        return "n/a"
    return " ".join(f"{r}:{n}" for r, n in sorted(rules.items())) or "0"


def print_rows(name: str, rows: dict, verbose: bool) -> None:
    for label, row in rows.items():
        if "error" in row:
            print(f"{name:12s} {label:17s} FAILED: {row['error'].splitlines()[-1][:120]}", flush=True)
            continue
        head = f"{name:12s} {label:17s} {row['seconds']:7.1f} {row['rss_mb']:7.0f}"
        if "ort_error" in row:
            fid = f"{'onnxruntime CPU cannot run it':34s}"
        else:
            fmt = "{:7.2f}" if "SQNR" in row["metric"] else "{:7.4f}"
            fid = f"{row['metric']:17s} {fmt.format(row['value'])} {row['sqnr_db']:8.2f}"
            if row["all_zero_outputs"]:
                fid += f" ALL-ZERO outputs {row['all_zero_outputs']}"
        diff = "-" if label == "qtool" else diff_text(row["placement"]) if "placement" in row else "n/a"
        print(f"{head} {fid} {row['quantized_inputs']:7d}  {rules_text(row['rules']):22s} {diff}", flush=True)
        if verbose and "ort_error" in row:
            print(f"    onnxruntime: {row['ort_error']}")
        if verbose and row.get("placement_list"):
            print("\n".join(f"    {line}" for line in row["placement_list"]))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated subset of: " + ", ".join(MODELS))
    ap.add_argument("--calib", type=int, default=64, help="calibration inputs, the same for both tools (default 64: "
                    "keeps the default run near 12 min on 2 cores; ModelOpt's calibration is the slow part)")
    ap.add_argument("--eval", type=int, default=50, help="held-out inputs for the metrics (10x for the classifier)")
    ap.add_argument("--trt-version", default="10.13", help="TensorRT version for qtool's export and the rule check")
    ap.add_argument("--methods", default="entropy,max,max+init",
                    help="ModelOpt --calibration_method values, one row each; '+init': on the model with its Constant "
                         "nodes turned into initializers (as shipped, PP-OCR's weights are Constant nodes, which "
                         "ModelOpt quantizes per tensor like activations)")
    ap.add_argument("--calib-args", default="", help="extra qtool calibrate options")
    ap.add_argument("--export-args", default="", help="extra qtool export options, e.g. '--high-precision fp16'")
    ap.add_argument("--modelopt-args", default="", help="extra ModelOpt options, e.g. '--high_precision_dtype fp32'")
    ap.add_argument("--venv", type=Path, default=VENV, help="ModelOpt's virtualenv (created if missing)")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev", help="fetch_dev_models.sh folder")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("-v", "--verbose", action="store_true", help="list the placement differences and errors")
    args = ap.parse_args()
    args.modelopt_methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.photos = sorted((args.dev / "photos").glob("*.jpg"))
    if not args.photos:
        sys.exit(f"no photos in {args.dev / 'photos'}: run bash ../shared/tools/fetch_dev_models.sh")
    args.names = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in args.names:
        if name not in MODELS:
            sys.exit(f"unknown model {name!r}: choose from {', '.join(MODELS)}")
    return args


def main() -> None:
    args = parse_args()
    try:
        py = ensure_modelopt(args.venv)
        versions = f"ModelOpt {modelopt_version(py)}"
    except (subprocess.CalledProcessError, OSError) as e:
        py, versions = None, f"ModelOpt unavailable ({e})"
    import onnxruntime as ort

    trt_qdq = qtool_trt_qdq()
    qexport = (f"--target tensorrt --trt-version {args.trt_version} --format qdq" if trt_qdq
               else "--target qdq (stand-in: no tensorrt Q/DQ export yet)")
    print(f"{args.calib} calibration inputs, {args.eval} held-out inputs; fidelity in onnxruntime {ort.__version__} CPU; "
          f"qtool export {qexport} {args.export_args}; {versions}, --calibration_eps cpu {args.modelopt_args}", flush=True)
    print(HEADER, flush=True)
    results = {}
    for name in args.names:
        model = args.dev / "models" / MODELS[name][0]
        if not model.exists():
            print(f"{name:12s} missing {model}: run fetch_dev_models.sh", flush=True)
            continue
        out_dir = WORK / name
        out_dir.mkdir(parents=True, exist_ok=True)
        link = out_dir / "model.onnx"
        link.unlink(missing_ok=True)
        link.symlink_to(model)
        runs = quantize_all(name, model, out_dir, args, py, trt_qdq)
        results[name] = evaluate_model(name, model, runs, args)
        print_rows(name, results[name], args.verbose)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
