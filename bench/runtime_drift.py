"""How far OpenVINO's run of an openvino export is from the file's exact simulation, and how far an
equally exact simulation is: is a gap the runtime's kernels, or float rounding drifting across layers?

For each zoo model (~/.cache/qtool-bench/zoo/<name>/{model.onnx, calib/*.npz, held/*.npz}) it calibrates
(qtool calibrate --data calib) and exports (--target openvino, defaults) once into --work, then runs on the
held-out inputs, and with --sets held,calib on the calibration inputs too:
  - sim      qtool's exact simulation of the file (qtool.checks.simulate: FakeQuantize as
             round((x - il) / (ih - il) * (levels - 1)) / (levels - 1) * (oh - ol) + ol, float32);
  - sim_cpu  the same arithmetic in the form OpenVINO's CPU plugin computes it, its input scale and shift
             precomputed (x * isc + ish, isc = (levels - 1) / (ih - il), ish = -il * isc; output
             round(.) * osc + ol, osc = (oh - ol) / (levels - 1); openvinotoolkit/openvino
             src/plugins/intel_cpu/src/nodes/fake_quantize.h: INPUT_SCALE, INPUT_SHIFT, OUTPUT_SCALE): equal to
             sim in exact arithmetic, different in float32's last bit;
  - run      OpenVINO's CPU plugin on the file (INFERENCE_PRECISION_HINT f32, qtool.runtime.openvino);
  - run_fp32 OpenVINO's CPU plugin on the FP32 model (the same pin);
each against onnxruntime's FP32 (default session). Prints per model and input set: each one's SQNR (dB,
float64 sums over every sample), sim_cpu - sim and run - sim with their 95 % intervals (2000 resamplings
of the inputs, seed 0), sim_cpu against sim and run against sim (dB), on how many inputs run's error is
larger than sim's, the share of the input-by-input swaps of run's and sim's errors with a gap as large (evaluate's
swap test), and the share of run's error power the 5 worst inputs carry. The first float output
of each model is compared, or with --outputs all each float output in turn.

Usage: python bench/runtime_drift.py [--models open_nsfw_pt,open_nsfw_tf] [--sets held,calib] [--work DIR]
       [--zoo DIR (a folder of zoo-shaped entries; a set is any subfolder of an entry)] [--outputs first|all]
       [--flips N [--flip-inputs K]]: instead, at the input of each of the file's first N FakeQuantize nodes (file
       order), OpenVINO's run against the simulation on the first set's first K inputs: the codes that differ on the
       FakeQuantize's own grid, and the run against the simulation (dB); each tensor fetched from OpenVINO alone
"""

from __future__ import annotations

import argparse
import glob
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qtool.checks import simulate
from qtool.model import graph as G
from qtool.runtime import onnxruntime, openvino
from qtool.targets.qdq import upgrade_opset

ZOO = Path.home() / ".cache" / "qtool-bench" / "zoo"


def cpu_form(data: bytes):
    """An onnxruntime session (graph optimization off) of the file with every FakeQuantize computed in
    OpenVINO's CPU form (see the module docstring)."""
    model = onnx.load_model_from_string(data)
    if G.default_opset(model) < simulate.ROUND_OPSET:
        model, _ = upgrade_opset(model, simulate.ROUND_OPSET, why="FakeQuantize as float ops (Round)")
    namer = G.Namer(model)
    nodes = []
    for node in model.graph.node:
        if not simulate.is_fake_quantize(node):
            nodes.append(node)
            continue
        base, made = node.output[0], []

        def op(kind, *inputs, base=base, node=node, made=made):
            out = namer.fresh(f"{base}/cpu_{kind}")
            made.append(helper.make_node(kind, list(inputs), [out], name=namer.fresh(f"{node.name}/Cpu{kind}")))
            return out

        x, il, ih, ol, oh = node.input
        steps = namer.fresh(f"{base}/cpu_levels")
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(G.attr(node, "levels") - 1, np.float32), steps))
        isc = op("Div", steps, op("Sub", ih, il))
        q = op("Add", op("Mul", op("Round", op("Add", op("Mul", x, isc), op("Neg", op("Mul", il, isc)))),
                         op("Div", op("Sub", oh, ol), steps)), ol)
        lo = op("Min", il, ih)
        below = op("Or", op("Less", x, lo), op("Equal", x, lo))
        op("Where", below, ol, op("Where", op("Greater", x, op("Max", il, ih)), oh, q))
        made[-1].output[0] = base
        nodes += made
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [o for o in model.opset_import if o.domain != simulate.DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return onnxruntime.session(model, optimization="none")


def exported(name: str, work: Path, zoo: Path = ZOO) -> tuple[Path, bytes]:
    folder, out = zoo / name, work / f"{name}.openvino.onnx"
    calib = work / f"{name}.calib.json"
    if not out.exists():
        for args in (["calibrate", folder / "model.onnx", "--data", folder / "calib", "-o", calib, "-q"],
                     ["export", folder / "model.onnx", "--calib", calib, "--target", "openvino", "-o", out, "-q"]):
            subprocess.run([sys.executable, "-m", "qtool", *map(str, args)], check=True)
    return folder / "model.onnx", out.read_bytes()


def db(signal: float, noise: float) -> float:
    return math.inf if noise == 0 else 10.0 * math.log10(signal / noise)


def interval(sig: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles of SQNR(b) - SQNR(a) over resamplings of the inputs."""
    idx = np.random.default_rng(0).integers(0, len(sig), (2000, len(sig)))
    gaps = 10 * np.log10(a[idx].sum(1) / b[idx].sum(1))  # the signal cancels out of the difference
    return tuple(float(v) for v in np.percentile(gaps, [2.5, 97.5]))


def swaps_as_large(sig: np.ndarray, a: np.ndarray, b: np.ndarray, draws: int = 4000) -> float:
    """The share of the input-by-input swaps of a's and b's errors with |SQNR(b) - SQNR(a)| at least the measured
    one (evaluate's paired permutation test, qtool.checks.evaluation.gap_exchange: every swap up to 16 inputs,
    `draws` seeded ones beyond)."""
    n = len(sig)
    if n <= 16:
        swaps = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(bool)
    else:
        swaps = np.random.default_rng(0).integers(0, 2, (draws, n)).astype(bool)
        swaps[0] = False
    with np.errstate(divide="ignore"):
        gaps = np.log10(np.where(swaps, b, a).sum(1)) - np.log10(np.where(swaps, a, b).sum(1))
        measured = abs(math.log10(a.sum()) - math.log10(b.sum())) if a.sum() > 0 and b.sum() > 0 else math.inf
    return float(np.mean(np.abs(gaps) >= measured - 1e-12))


def flips(data: bytes, files: list[str], count: int) -> None:
    """Per FakeQuantize input (the first `count`), the codes OpenVINO's run and the simulation put on its grid
    that differ, and the run against the simulation (dB), over `files`."""
    model = onnx.load_model_from_string(data)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    consts.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"})
    fqs = [n for n in model.graph.node if simulate.is_fake_quantize(n)][:count]
    sim = simulate.simulation(data, outputs=[n.input[0] for n in fqs])
    for fq in fqs:
        t = fq.input[0]
        alone = onnx.ModelProto()
        alone.CopyFrom(model)
        run = openvino.Session(simulate.with_outputs(alone, [t]).SerializeToString())
        lo, hi = float(consts[fq.input[1]]), float(consts[fq.input[2]])
        steps = next(a.i for a in fq.attribute if a.name == "levels") - 1
        differ = size = 0
        sig = noise = 0.0
        for f in files:
            feeds = dict(np.load(f))
            a = onnxruntime.run(sim, [t], feeds)[0].astype(np.float64)
            b = run.run([t], feeds)[0].astype(np.float64)
            codes = [np.round((np.clip(v, lo, hi) - lo) / (hi - lo) * steps) for v in (a, b)]
            differ += int((codes[0] != codes[1]).sum())
            size += a.size
            sig += float((a * a).sum())
            noise += float(((a - b) ** 2).sum())
        print(f"{t} ({fq.name}, {size // len(files)} values): codes differing {differ} of {size} "
              f"({1e6 * differ / size:.1f} ppm), run vs sim {db(sig, noise):.1f} dB", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="open_nsfw_pt,open_nsfw_tf")
    p.add_argument("--sets", default="held")
    p.add_argument("--work", type=Path, default=Path("/tmp/qtool-bench/runtime_drift"))
    p.add_argument("--zoo", type=Path, default=ZOO)
    p.add_argument("--outputs", choices=("first", "all"), default="first")
    p.add_argument("--save", type=Path, help="an .npz of every input's sums per model, set and output")
    p.add_argument("--flips", type=int, default=0)
    p.add_argument("--flip-inputs", type=int, default=4)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort
    import openvino as ov

    print(f"openvino {ov.__version__}, onnxruntime {ort.__version__}")
    for name in args.models.split(","):
        model_path, data = exported(name, args.work, args.zoo)
        if args.flips:
            first = args.sets.split(",")[0]
            flips(data, sorted(glob.glob(str(args.zoo / name / first / "*.npz")))[:args.flip_inputs], args.flips)
            continue
        fp32 = model_path.read_bytes()
        proto = onnx.load_model_from_string(fp32)
        floats = [o.name for o in proto.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
        outs = floats if args.outputs == "all" else floats[:1]
        ref = onnxruntime.session(proto)
        runs = {"sim": simulate.simulation(data), "sim_cpu": cpu_form(data), "run": openvino.Session(data),
                "run_fp32": openvino.Session(fp32)}
        rows = {(s, o): [] for s in args.sets.split(",") for o in outs}
        for s in args.sets.split(","):
            for f in sorted(glob.glob(str(args.zoo / name / s / "*.npz"))):
                feeds = dict(np.load(f))
                refs = [v.astype(np.float64) for v in onnxruntime.run(ref, outs, feeds)]
                got = {k: [v.astype(np.float64) for v in onnxruntime.run(sess, outs, feeds)] for k, sess in runs.items()}
                for j, (o, r) in enumerate(zip(outs, refs)):
                    g = {k: v[j] for k, v in got.items()}
                    row = [float((r * r).sum())] + [float(((r - g[k]) ** 2).sum()) for k in runs]
                    row += [float(((g["sim"] - g[k]) ** 2).sum()) for k in ("sim_cpu", "run")] + [float((g["sim"] ** 2).sum())]
                    rows[s, o].append(row)
        if args.save:
            np.savez(args.save.with_name(f"{args.save.stem}_{name}.npz"),
                     **{f"{s}|{o}": np.array(v) for (s, o), v in rows.items()})
        sets = dict(rows)
        if len(args.sets.split(",")) > 1:
            for o in outs:
                sets["+".join(args.sets.split(",")), o] = [r for (_, oo), v in rows.items() if oo == o for r in v]
        for (s, o), v in sets.items():
            a = np.array(v)
            sig, n_sim, n_cpu, n_run, n_fp32 = (a[:, i] for i in range(5))
            figures = " ".join(f"{k} {db(sig.sum(), a[:, i + 1].sum()):.2f}" for i, k in enumerate(runs))
            lo_c, hi_c = interval(sig, n_sim, n_cpu)
            lo_r, hi_r = interval(sig, n_sim, n_run)
            top5 = np.sort(n_run)[-5:].sum() / n_run.sum() if n_run.sum() > 0 else 0.0
            label = name if len(outs) == 1 else f"{name} {o}"
            print(f"{label} {s} ({len(a)} inputs): {figures}; sim_cpu - sim {db(sig.sum(), n_cpu.sum()) - db(sig.sum(), n_sim.sum()):+.2f} "
                  f"({lo_c:+.2f}..{hi_c:+.2f}), run - sim {db(sig.sum(), n_run.sum()) - db(sig.sum(), n_sim.sum()):+.2f} "
                  f"({lo_r:+.2f}..{hi_r:+.2f}); sim_cpu vs sim {db(a[:, 7].sum(), a[:, 5].sum()):.2f}, run vs sim "
                  f"{db(a[:, 7].sum(), a[:, 6].sum()):.2f}; as large in {100 * swaps_as_large(sig, n_sim, n_run):.0f} % of the "
                  f"swaps; run's error larger than sim's on {(n_run > n_sim).sum()} of {len(a)}; "
                  f"5 worst inputs carry {100 * top5:.0f} % of run's", flush=True)

if __name__ == "__main__":
    main()
