"""What the default OpenVINO export (`--cpu any`, the overflow guard) costs where the CPU has VNNI,
and what it saves where it has not, per real model.

For each model: calibrate once (`qtool calibrate --data`), export `--target openvino` with the
default (`--cpu any`) and with `--cpu vnni`, and measure against FP32 on held-out inputs:
  vnni-cpu  each file in OpenVINO on this CPU (f32 inference precision) when it has VNNI (the
            header says), and in the file's exact arithmetic (qtool.checks.simulate: what a VNNI
            CPU computes): the output SQNR (dB, mean over the outputs; sentence encoders: the
            token embeddings of the real tokens) and the task metric;
  avx2      the default file in OpenVINO on an AVX2 CPU without VNNI (pair sums saturate at int16):
            this one where it is one, else under `qemu-x86_64 -cpu Haswell-v4` (tests/avx2.py), on the first --avx2 held-out inputs,
            against the same file's exact arithmetic on the same inputs, their gap with its 95 %
            interval as below, and the SQNR of the AVX2 run against the exact output itself (the
            `--cpu vnni` file too with --avx2-vnni, to show what the guard saves). A deep int8
            network is chaotic at code boundaries: a float rounding that flips one code grows
            layer by layer, so any run - on the VNNI CPU too - drifts from the exact output
            (PP-OCRv5 rec's second Q.K^T: run and exact 24-28 dB apart, each 17-25 dB from FP32)
            and one input's SQNR can move by 10 dB either way: judge the gap on many inputs. A
            run can also beat the file's arithmetic: OpenVINO 2026.4 clamps without rounding a
            FakeQuantize it fuses between a Conv and a residual Add (PP-OCRv6 det: +1.5 dB on
            both CPUs; docs/targets/openvino.md);
  gap       default minus `--cpu vnni` (on this CPU when it has VNNI, else exact), dB, with its 95 %
            interval from resampling the held-out inputs (the same draw for both files): on 32
            inputs the gap of a small model swings by half a decibel (MTCNN R-Net: -1.0 on 32
            inputs, -0.4 on 128), so the bound is judged on the interval, not the point;
  guard     the layers the guard changed (P: pair-bounded weights, I: input held to 7-bit codes,
            N: an image's paired input channels negated, W: widened second input, F: FP32).
Image models are scored on their logits: an output computed by a Softmax is cut off the model
before calibration (argmax unchanged; the SQNR of a saturating 2-class softmax (PP-OCR cls, MTCNN)
swings by +-9 dB between runs). --json appends one line per model with every number.
Must hold on every model: default within 0.5 dB of `--cpu vnni` on the VNNI CPU, and default
on AVX2 within 1 dB of its exact arithmetic.

Usage:
  python bench/guard_cost.py [--models ppocrv5_cls,vit_focus,...] [--calib 64] [--eval 128] [--avx2 128] [--dev DIR]
(all 11 models, 2 cores: about an hour, most of it QEMU; --avx2 0 skips it, --avx2-vnni doubles it)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import avx2  # noqa: E402
from fidelity import MODELS, TEXT_DIR, TEXT_MODELS, WHEEL_MODELS, load_feeds, metric, model_inputs, sqnr_db, wheel_model  # noqa: E402

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "guard_cost"
F32 = {"INFERENCE_PRECISION_HINT": "f32"}

# run under qemu: OpenVINO on the feeds in an .npz (key i/name), the outputs into another .npz
WORKER = """
import sys
import numpy as np
import openvino as ov
model, feeds, out = sys.argv[1:]
compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
request = compiled.create_infer_request()
z = np.load(feeds)
n = max(int(k.split("/")[0]) for k in z.files) + 1
got = {}
for i in range(n):
    res = request.infer({k.split("/", 1)[1]: z[k] for k in z.files if k.split("/")[0] == str(i)})
    for j, o in enumerate(compiled.outputs):
        got[f"{i}/{j}"] = np.asarray(res[o])
np.savez(out, **got)
"""


def qtool_cli(*args) -> dict:
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exit_code:
        raise RuntimeError(f"qtool {args[0]} failed: {r.output}")
    return json.loads(r.stdout) if "--json" in args else {}


def inputs_of(name: str, args) -> tuple[Path, str, list[dict], list[dict]]:
    """(model file, task, calibration feeds, held-out feeds) of one model; feeds {input name: array}."""
    import onnxruntime as ort

    if name in TEXT_MODELS:
        rel = TEXT_MODELS[name][0]
        path = args.dev / rel if rel.startswith("models/") else TEXT_DIR / rel
        return path, "text", load_feeds(TEXT_DIR / name / "calib")[:args.calib], load_feeds(TEXT_DIR / name / "eval")[:args.eval]
    if name in WHEEL_MODELS:
        path, (_, _, task, shape, pre) = wheel_model(name), WHEEL_MODELS[name]
    else:
        rel, task, shape, pre = MODELS[name]
        path = args.dev / "models" / rel
    photos = sorted((args.dev / "photos").glob("*.jpg"))
    calib, held = model_inputs(task, shape, pre, photos, args.calib, args.eval)
    first = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()[0].name
    path = without_softmax(path, args.work / name)
    return path, task, [{first: x} for x in calib], [{first: x} for x in held]  # cls: 10x the held-out inputs (fidelity.py)


def without_softmax(path: Path, folder: Path) -> Path:
    """A copy of the model whose outputs computed by a Softmax are that Softmax's input (the logits)."""
    import onnx

    proto = onnx.load(str(path))
    producer = {o: n for n in proto.graph.node for o in n.output}
    read = {i for n in proto.graph.node for i in n.input}
    soft = [o for o in proto.graph.output if o.name in producer and producer[o.name].op_type == "Softmax" and o.name not in read]
    if not soft:
        return path
    for o in soft:
        node = producer[o.name]
        proto.graph.node.remove(node)
        o.name = node.input[0]
        del o.type.tensor_type.shape.dim[:]
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, str(folder / "logits.onnx"))
    return folder / "logits.onnx"


def run_feeds(session, feeds: list[dict], first: int = 0) -> list[list[np.ndarray]]:
    """Every output per feed, output `first` moved to the front."""
    got = [[np.asarray(o, dtype=np.float64) for o in session.run(None, f)] for f in feeds]
    return [[o[first], *o[:first], *o[first + 1:]] for o in got]


class OpenVINO:
    """OpenVINO on this CPU, f32 inference precision, with onnxruntime's run(None, feeds)."""

    def __init__(self, path: Path):
        import openvino as ov

        self.compiled = ov.Core().compile_model(str(path), "CPU", F32)
        self.request = self.compiled.create_infer_request()

    def run(self, _names, feeds):
        res = self.request.infer(feeds)
        return [res[o] for o in self.compiled.outputs]


def scores(task: str, ref, out, feeds) -> tuple[float, str, float]:
    """(output SQNR dB, metric label, metric) of `out` against `ref` (text: the token embeddings first)."""
    if task == "text":
        real = np.concatenate([f["attention_mask"].ravel() for f in feeds]).astype(bool) if "attention_mask" in feeds[0] else None
        a = np.concatenate([r[0].reshape(-1, r[0].shape[-1]) for r in ref])
        b = np.concatenate([o[0].reshape(-1, o[0].shape[-1]) for o in out])
        db = sqnr_db(a[real], b[real]) if real is not None and len(real) == len(a) else sqnr_db(a, b)
        return db, "token SQNR", db
    _, db = metric("sqnr", ref, out)
    label, value = metric(task, ref, out)
    return db, label, value


def qemu_outputs(path: Path, feeds: list[dict], folder: Path) -> list[list[np.ndarray]]:
    """The file in OpenVINO on an AVX2 CPU without VNNI on `feeds`: this one where it is one (natively), else
    under qemu's Haswell (tests/avx2.py)."""
    np.savez(folder / "feeds.npz", **{f"{i}/{k}": v for i, f in enumerate(feeds) for k, v in f.items()})
    (folder / "worker.py").write_text(WORKER)
    avx2.run_python(folder / "worker.py", path, folder / "feeds.npz", folder / "out.npz", timeout=3600)
    z = np.load(folder / "out.npz")
    n_out = max(int(k.split("/")[1]) for k in z.files) + 1
    return [[np.asarray(z[f"{i}/{j}"], dtype=np.float64) for j in range(n_out)] for i in range(len(feeds))]


def _powers(task: str, ref, out, feeds) -> tuple[np.ndarray, np.ndarray]:
    """Per held-out input and output, (sum of ref^2, sum of (ref - out)^2): what `scores`' SQNR adds
    up (text: the token embeddings of the real tokens)."""
    sig, err = [], []
    for r, o, f in zip(ref, out, feeds):
        if task == "text":
            a, b = r[0].reshape(-1, r[0].shape[-1]), o[0].reshape(-1, o[0].shape[-1])
            real = f["attention_mask"].ravel().astype(bool) if "attention_mask" in f else None
            if real is not None and len(real) == len(a):
                a, b = a[real], b[real]
            pairs = [(a, b)]
        else:
            pairs = list(zip(r, o))
        sig.append([float((a ** 2).sum()) for a, _ in pairs])
        err.append([float(((a - b) ** 2).sum()) for a, b in pairs])
    return np.asarray(sig), np.asarray(err)


def gap_interval(task: str, ref, a, b, feeds, draws: int = 1000) -> tuple[float, float, float]:
    """(SQNR of `a` minus that of `b` as `scores` computes it, and the 2.5 and 97.5 percentiles of
    that difference over `draws` resamplings of the held-out inputs with replacement, the same
    inputs for both), dB."""
    sig, err_a = _powers(task, ref, a, feeds)
    _, err_b = _powers(task, ref, b, feeds)

    def gap(idx):
        s = sig[idx].sum(axis=0)
        return float(np.mean(10 * np.log10(s / np.maximum(err_a[idx].sum(axis=0), 1e-30)))
                     - np.mean(10 * np.log10(s / np.maximum(err_b[idx].sum(axis=0), 1e-30))))

    rng = np.random.default_rng(0)
    n = len(ref)
    lo, hi = np.percentile([gap(rng.integers(0, n, n)) for _ in range(draws)], [2.5, 97.5])
    return gap(np.arange(n)), float(lo), float(hi)


def guard_summary(summary: dict) -> str:
    layers = summary.get("overflow_fix", {}).get("layers", {})
    counts: dict[str, int] = {}
    for fix in layers.values():
        key = {"fp32": "F", "pair-bounded weights": "P", "7-bit input": "I", "flipped input channels": "N",
               "widened second input": "W"}.get(fix["remedy"], fix["remedy"])
        counts[key] = counts.get(key, 0) + 1
    return " ".join(f"{n}{k}" for k, n in sorted(counts.items())) or "-"


def bench_model(name: str, args, vnni: bool) -> None:
    import onnxruntime as ort

    from qtool.checks import simulate

    path, task, calib, held = inputs_of(name, args)
    out = args.work / name
    data = out / "calib"
    data.mkdir(parents=True, exist_ok=True)
    for old in [*data.glob("*.npy"), *data.glob("*.npz")]:
        old.unlink()
    for i, f in enumerate(calib):
        np.savez(data / f"{i:04d}.npz", **f)
    cal = out / "c.calib.json"
    qtool_cli("-q", "calibrate", path, "--data", data, "-o", cal)
    import onnx

    names = [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
    first = names.index(TEXT_MODELS[name][1]) if name in TEXT_MODELS else 0
    ref = run_feeds(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), held, first)
    row, outputs = {}, {}
    for cpu_kind in ("any", "vnni"):
        f = out / f"openvino.{cpu_kind}.onnx"
        summary = qtool_cli("-q", "export", path, "--calib", cal, "--target", "openvino", "--cpu", cpu_kind, "-o", f, "--json")
        sim = simulate.simulation(onnx.load(str(f)))
        exact = run_feeds(sim, held, first)
        row[cpu_kind] = {"exact": scores(task, ref, exact, held), "guard": guard_summary(summary)}
        outputs[cpu_kind] = exact
        if vnni:
            outputs[cpu_kind] = run_feeds(OpenVINO(f), held, first)
            row[cpu_kind]["run"] = scores(task, ref, outputs[cpu_kind], held)
        if args.avx2 and (cpu_kind == "any" or args.avx2_vnni):
            few = held[:args.avx2]
            q = out / f"qemu.{cpu_kind}"
            q.mkdir(exist_ok=True)
            got = [[o[first], *o[:first], *o[first + 1:]] for o in qemu_outputs(f, few, q)]
            n = len(few)
            row[cpu_kind]["avx2"] = (scores(task, ref[:n], got, few)[0], scores(task, ref[:n], exact[:n], few)[0],
                                     scores(task, exact[:n], got, few)[0], *gap_interval(task, ref[:n], got, exact[:n], few))
    row["gap"] = gap_interval(task, ref, outputs["any"], outputs["vnni"], held)
    report(name, row)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"model": name, **row}) + "\n")


def report(name: str, row: dict) -> None:
    a, v = row["any"], row["vnni"]
    run = f"{a['run'][0]:6.2f} {v['run'][0]:6.2f}" if "run" in a else "     -      -"
    avx = (f"{a['avx2'][0]:6.2f}/{a['avx2'][1]:6.2f} {a['avx2'][3]:+5.2f} ({a['avx2'][4]:+5.2f}..{a['avx2'][5]:+5.2f}) {a['avx2'][2]:5.1f}"
           if "avx2" in a else f"{'-':>37s}")
    avx_v = f"{v['avx2'][0]:6.2f}/{v['avx2'][1]:6.2f}" if "avx2" in v else "     -/     -"
    gap, lo, hi = row["gap"]
    print(f"{name:12s} {run}  {a['exact'][0]:6.2f} {v['exact'][0]:6.2f}  {gap:+5.2f} ({lo:+5.2f}..{hi:+5.2f})  {a['exact'][1]:>16s}"
          f" {a['exact'][2]:.4f} {v['exact'][2]:.4f}  {avx}  {avx_v}  {a['guard']:>8s}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ppocrv5_det,ppocrv5_rec,ppocrv5_cls,ppocrv6_det,ppocrv6_rec,mtcnn_pnet,mtcnn_rnet,mtcnn_onet,"
                                        "minilm,mpnet,vit_focus")
    ap.add_argument("--calib", type=int, default=64, help="calibration inputs")
    ap.add_argument("--eval", type=int, default=128, help="held-out inputs (text: at most the 128 stored)")
    ap.add_argument("--avx2", type=int, default=128, help="held-out inputs run under qemu's Haswell (0: none)")
    ap.add_argument("--avx2-vnni", action="store_true", help="also run the --cpu vnni file under qemu")
    ap.add_argument("--json", type=Path, help="append each model's numbers to this file (one JSON line each)")
    ap.add_argument("--work", type=Path, default=WORK, help="folder for the calibration, files and outputs")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev", help="fetch_dev_models.sh folder")
    args = ap.parse_args()
    import openvino as ov

    from qtool.quantizers import cpu_kinds

    vnni = bool(cpu_kinds.vnni())
    try:
        where = "this CPU" if not avx2.how() else f"qemu -cpu {avx2.QEMU_CPU}"
    except avx2.Unavailable as e:
        where = f"none: {e}"
    print(f"CPU VNNI: {'yes' if vnni else 'no'}; OpenVINO {ov.__version__} (f32); {args.calib} calibration / {args.eval} held-out "
          f"inputs, {args.avx2} on AVX2 ({where}); output SQNR dB against FP32", flush=True)
    print(f"{'model':12s} {'VNNI-run any/vnni':>13s}  {'exact any/vnni':>13s}  {'gap (95 %)':>20s}  {'metric':>16s} {'any':>6s} {'vnni':>6s}"
          f"  {'AVX2 any run/exact gap (95 %) vs-exact':>37s}  {'AVX2 vnni run/exact':>13s}  guard")
    for name in args.models.split(","):
        try:
            bench_model(name.strip(), args, vnni)
        except (FileNotFoundError, subprocess.CalledProcessError) as e:
            print(f"{name:12s} failed: {e}", flush=True)


if __name__ == "__main__":
    main()
