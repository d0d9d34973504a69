"""As fast as NNCF? OpenVINO int8 speed-up and fidelity of qtool's default export, its `--cpu vnni`
export and NNCF's model, per real model, measured in one run.

For each model of bench/fidelity.py (PP-OCRv5/v6, MTCNN; the sentence encoders MiniLM and MPNet),
from the same calibration inputs: qtool (`calibrate --data`, `export --target openvino` with no
options: `--cpu any`, and with `--cpu vnni`) and NNCF 3.4 (`nncf.quantize` with its defaults;
`model_type=TRANSFORMER` for the sentence encoders). Columns:
  - speed-up over FP32 in OpenVINO on this CPU (batch 1, LATENCY hint, f32 inference precision,
    the four models taking turns inference by inference in one process; each one's median over
    --rounds of its median latency in the round), and qtool's default latency over NNCF's, the
    median of the rounds' ratios and their range (1.00: as fast; below: faster; the range shows
    what the machine's load leaves of the comparison);
  - fidelity against FP32 (the model's task metric, as bench/fidelity.py; sentence encoders: SQNR of
    the token embeddings), in OpenVINO on this CPU ("run") and, for qtool's files, in the exact
    arithmetic of the file ("exact", qtool.checks.simulate: what a CPU with VNNI computes, up to
    float rounding);
  - linear layers (Convolution/MatMul/FullyConnected) OpenVINO runs int8, and how many of those
    NNCF runs int8 the file leaves in float ("!N8").
The header says whether this CPU has VNNI. Without it (AVX2 only) the "run" columns are the
saturating AVX2 kernels, and the speed is AVX2 speed: a VNNI CPU's speed cannot be measured here.

Usage: python bench/speed.py [--models ...] [--calib 64] [--eval 50] [--runs 50] [--rounds 3] [--dev DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity import MODELS, TEXT_MODELS, batched, load_feeds, metric, model_inputs, qtool, run_all, text_data, text_metrics

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "speed"
LINEAR = ("Convolution", "MatMul", "FullyConnected", "Deconvolution")
F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def latencies_ms(core, models: dict, sample, runs: int, rounds: int) -> dict[str, list[float]]:
    """Per model its median latency in each of `rounds` rounds (batch 1, LATENCY hint), the models
    taking turns inference by inference (`runs` each per round; the order of the turn rotates, so
    no model always follows the same one), so the load other processes put on the machine falls on
    all of them alike."""
    import time

    feed = sample if isinstance(sample, dict) else [sample]
    requests = {}
    for label, (path, config) in models.items():
        requests[label] = core.compile_model(str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", **config}).create_infer_request()
        for _ in range(10):
            requests[label].infer(feed)
    medians: dict[str, list[float]] = {label: [] for label in models}
    labels = list(requests)
    for _ in range(rounds):
        times: dict[str, list[float]] = {label: [] for label in models}
        for run in range(runs):
            for label in labels[run % len(labels):] + labels[:run % len(labels)]:  # each model in each place of the turn alike
                t = time.perf_counter()
                requests[label].infer(feed)
                times[label].append(time.perf_counter() - t)
        for label, t in times.items():
            medians[label].append(float(np.median(t) * 1000))
    return medians


def int8_names(core, path) -> tuple[set[str], int]:
    """(the original names of the linear layers OpenVINO runs int8, all linear layers)."""
    names, total = set(), 0
    for op in core.compile_model(str(path), "CPU", F32).get_runtime_model().get_ops():
        info = op.get_rt_info()
        if str(info["layerType"].astype(str)) in LINEAR:
            total += 1
            if str(info["runtimePrecision"].astype(str)) in ("u8", "i8"):
                names.add(str(info["originalLayersNames"].astype(str)))
    return names, total


def linear_nodes(model_path) -> list[str]:
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    return [n.name for n in proto.graph.node if n.op_type in ("Conv", "ConvTranspose", "MatMul", "Gemm") and n.name]


def covers(names: set[str], node: str) -> bool:
    """Whether one of OpenVINO's original-layer-name lists names ONNX node `node` (itself, or a name derived from it)."""
    return any(node in n.split(",") or any(part.startswith(node + "/") for part in n.split(",")) for n in names)


def simulated_image(path, held) -> list[list[np.ndarray]]:
    import onnx

    from qtool.checks import simulate

    s = simulate.simulation(onnx.load(str(path)))
    name = s.get_inputs()[0].name
    return [[np.asarray(o, dtype=np.float64) for o in s.run(None, {name: x})] for x in held]


def simulated_text(path, batches, outs) -> list[np.ndarray]:
    import onnx

    from qtool.checks import simulate

    s = simulate.simulation(onnx.load(str(path)))
    inputs = {i.name for i in s.get_inputs()}
    got = [[] for _ in outs]
    for b in batches:
        for g, o in zip(got, s.run(outs, {k: v for k, v in b.items() if k in inputs})):
            g.append(np.asarray(o, dtype=np.float64))
    return [np.concatenate(g) for g in got]


def ov_text(core, path, batches, outs) -> list[np.ndarray]:
    compiled = core.compile_model(str(path), "CPU", F32)
    request = compiled.create_infer_request()
    got = [[] for _ in outs]
    for b in batches:
        res = request.infer(b)
        for g, o in zip(got, outs):
            g.append(np.array(res[compiled.output(o)], dtype=np.float64))
    return [np.concatenate(g) for g in got]


def one_model(name: str, args, core, photos) -> dict:
    import nncf
    import openvino as ov

    out = WORK / name
    out.mkdir(parents=True, exist_ok=True)
    text = name in TEXT_MODELS
    if text:
        rel, token_out, sentence_out = TEXT_MODELS[name]
        data = args.text_dir if args.text_dir and (args.text_dir / "mpnet.onnx").exists() else text_data(args)
        model_path = (args.dev / rel) if rel.startswith("models/") else data / rel
        calib_dir = data / name / "calib"
        calib, held = load_feeds(calib_dir), load_feeds(data / name / "eval")
        batches = batched(held, 16)
        mask = np.concatenate([f["attention_mask"] for f in held])
        outs = [token_out, sentence_out]
        sample = held[0]
    else:
        rel, task, shape, pre = MODELS[name]
        model_path = args.dev / "models" / rel
        calib, held = model_inputs(task, shape, pre, photos, args.calib, args.eval)
        calib_dir = out / "calib"
        calib_dir.mkdir(exist_ok=True)
        for old in calib_dir.glob("*.npy"):
            old.unlink()
        for i, x in enumerate(calib):
            np.save(calib_dir / f"{i:04d}.npy", x)
        sample = held[0]
    cal = out / "qtool.calib.json"
    qtool("-q", "calibrate", model_path, "--data", calib_dir, "-o", cal)
    paths = {"fp32": model_path}
    for label, extra in (("qtool", []), ("qtool vnni", ["--cpu", "vnni"])):
        paths[label] = out / f"{label.replace(' ', '.')}.openvino.onnx"
        qtool("-q", "export", model_path, "--calib", cal, "--target", "openvino", "-o", paths[label], *extra)
    kwargs = {"model_type": nncf.ModelType.TRANSFORMER} if text else {}
    quantized = nncf.quantize(ov.convert_model(str(model_path)), nncf.Dataset(calib), subset_size=len(calib), **kwargs)
    paths["NNCF"] = out / "nncf.xml"
    ov.save_model(quantized, str(paths["NNCF"]), compress_to_fp16=False)

    row: dict = {"fidelity": {}}
    if text:
        ref = ov_text(core, model_path, batches, outs)
        for label in ("qtool", "qtool vnni", "NNCF"):
            run = text_metrics(ref, ov_text(core, paths[label], batches, outs), mask)[1]
            exact = None if label == "NNCF" else text_metrics(ref, simulated_text(paths[label], batches, outs), mask)[1]
            row["fidelity"][label] = (run, exact)
        row["metric"] = "token SQNR dB"
    else:
        ref = run_all(core, model_path, held, F32)
        for label in ("qtool", "qtool vnni", "NNCF"):
            what, run = metric(task, ref, run_all(core, paths[label], held, F32))
            exact = None if label == "NNCF" else metric(task, ref, simulated_image(paths[label], held))[1]
            row["fidelity"][label] = (run, exact)
        row["metric"] = what
    nodes = linear_nodes(model_path)
    int8 = {}
    for label in ("qtool", "qtool vnni", "NNCF"):
        names, total = int8_names(core, paths[label])
        int8[label] = {n for n in nodes if covers(names, n)}
        row.setdefault("int8", {})[label] = len(names)
        row["linear"] = total
    row["not_int8_of_nncf"] = {label: sorted(int8["NNCF"] - int8[label]) for label in ("qtool", "qtool vnni")}
    lat = latencies_ms(core, {label: (path, F32) for label, path in paths.items()}, sample, args.runs, rounds=args.rounds)
    row["latency_ms"] = lat
    return row


def show(name: str, row: dict) -> None:
    rounds, fid = row["latency_ms"], row["fidelity"]
    lat = {label: float(np.median(v)) for label, v in rounds.items()}
    ratios = np.asarray(rounds["qtool"]) / np.asarray(rounds["NNCF"])  # per round: the spread the machine's load leaves
    fmt = (lambda v: "-" if v is None else f"{v:.2f}") if "SQNR" in row["metric"] else (lambda v: "-" if v is None else f"{v:.4f}")
    speed = " ".join(f"{lat['fp32'] / lat[label]:5.2f}x" for label in ("qtool", "qtool vnni", "NNCF"))
    fidelity = " ".join(f"{fmt(fid[label][0]):>7s}/{fmt(fid[label][1]):<7s}" for label in ("qtool", "qtool vnni")) + f" {fmt(fid['NNCF'][0]):>7s}"
    missing = "/".join(str(len(row["not_int8_of_nncf"][label])) for label in ("qtool", "qtool vnni"))
    int8 = "/".join(str(row["int8"][label]) for label in ("qtool", "qtool vnni", "NNCF")) + f" of {row['linear']}"
    spread = f"{np.median(ratios):.3f} ({ratios.min():.2f}-{ratios.max():.2f})"
    print(f"{name:12s} {speed} {spread:>17s} | {row['metric']:17s} {fidelity} | {int8:>16s} {missing:>5s}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    everything = [*MODELS, *TEXT_MODELS]
    ap.add_argument("--models", default=",".join(everything), help="comma-separated subset of: " + ", ".join(everything))
    ap.add_argument("--calib", type=int, default=64, help="calibration inputs (image models; both tools)")
    ap.add_argument("--eval", type=int, default=50, help="held-out inputs (image models)")
    ap.add_argument("--runs", type=int, default=50, help="timed inferences per model and round")
    ap.add_argument("--rounds", type=int, default=9, help="rounds of --runs turns")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev", help="fetch_dev_models.sh folder")
    ap.add_argument("--text-calib", type=int, default=64, help="sentence encoders: calibration sentences")
    ap.add_argument("--text-eval", type=int, default=128, help="sentence encoders: held-out sentences")
    ap.add_argument("--seq", type=int, default=64, help="sentence encoders: tokens per sentence")
    ap.add_argument("--text-dir", type=Path, help="sentence encoders: a folder bench/transformers_data.py wrote (default: "
                    "fidelity.py's cache, made on first use)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.set_defaults(pack=False)  # fidelity.text_data's option: the default (unpacked) sentence sets
    args = ap.parse_args()

    import openvino as ov

    from qtool.quantizers import cpu_kinds

    try:
        import nncf
    except ImportError:
        sys.exit("nncf is not installed: pip install nncf (bench-only dependency)")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    for name in names:
        if name not in MODELS and name not in TEXT_MODELS:
            sys.exit(f"unknown model {name!r}: choose from {', '.join([*MODELS, *TEXT_MODELS])}")
    photos = sorted((args.dev / "photos").glob("*.jpg"))
    if not photos and any(n in MODELS for n in names):
        sys.exit(f"no photos in {args.dev / 'photos'}: run bash ../shared/tools/fetch_dev_models.sh")
    vnni = cpu_kinds.vnni()
    print(f"OpenVINO {ov.__version__}, nncf {nncf.__version__}; this CPU: {'VNNI' if vnni else 'no VNNI (AVX2 kernels: run = saturating, speed = AVX2 speed)' if vnni is False else 'VNNI unknown'}; "
          f"{args.calib} calibration / {args.eval} held-out inputs (sentence encoders {args.text_calib} / {args.text_eval})", flush=True)
    print(f"{'model':12s} {'speed-up over FP32: q, q vnni, NNCF':>36s} {'q/NNCF (rounds)':>17s} | {'metric':17s} "
          f"{'q run/exact':>15s} {'vnni run/exact':>15s} {'NNCF run':>7s} | {'int8 q/vnni/NNCF':>16s} {'!N8':>5s}", flush=True)
    core = ov.Core()
    results = {}
    for name in names:
        results[name] = one_model(name, args, core, photos)
        show(name, results[name])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
