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
larger than sim's, and the share of run's error power the 5 worst inputs carry. The first float output
of each model is compared.

Usage: python bench/runtime_drift.py [--models open_nsfw_pt,open_nsfw_tf] [--sets held,calib] [--work DIR]
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


def exported(name: str, work: Path) -> tuple[Path, bytes]:
    folder, out = ZOO / name, work / f"{name}.openvino.onnx"
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="open_nsfw_pt,open_nsfw_tf")
    p.add_argument("--sets", default="held")
    p.add_argument("--work", type=Path, default=Path("/tmp/qtool-bench/runtime_drift"))
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort
    import openvino as ov

    print(f"openvino {ov.__version__}, onnxruntime {ort.__version__}")
    for name in args.models.split(","):
        model_path, data = exported(name, args.work)
        fp32 = model_path.read_bytes()
        out = onnx.load_model_from_string(fp32).graph.output[0].name
        ref = onnxruntime.session(onnx.load_model_from_string(fp32))
        runs = {"sim": simulate.simulation(data), "sim_cpu": cpu_form(data), "run": openvino.Session(data),
                "run_fp32": openvino.Session(fp32)}
        rows = {s: [] for s in args.sets.split(",")}
        for s in rows:
            for f in sorted(glob.glob(str(ZOO / name / s / "*.npz"))):
                feeds = dict(np.load(f))
                r = onnxruntime.run(ref, [out], feeds)[0].astype(np.float64)
                got = {k: onnxruntime.run(v, [out], feeds)[0].astype(np.float64) for k, v in runs.items()}
                row = [float((r * r).sum())] + [float(((r - got[k]) ** 2).sum()) for k in runs]
                row += [float(((got["sim"] - got[k]) ** 2).sum()) for k in ("sim_cpu", "run")] + [float((got["sim"] ** 2).sum())]
                rows[s].append(row)
        sets = dict(rows)
        if len(rows) > 1:
            sets["+".join(rows)] = [r for v in rows.values() for r in v]
        for s, v in sets.items():
            a = np.array(v)
            sig, n_sim, n_cpu, n_run, n_fp32 = (a[:, i] for i in range(5))
            figures = " ".join(f"{k} {db(sig.sum(), a[:, i + 1].sum()):.2f}" for i, k in enumerate(runs))
            lo_c, hi_c = interval(sig, n_sim, n_cpu)
            lo_r, hi_r = interval(sig, n_sim, n_run)
            top5 = np.sort(n_run)[-5:].sum() / n_run.sum()
            print(f"{name} {s} ({len(a)} inputs): {figures}; sim_cpu - sim {db(sig.sum(), n_cpu.sum()) - db(sig.sum(), n_sim.sum()):+.2f} "
                  f"({lo_c:+.2f}..{hi_c:+.2f}), run - sim {db(sig.sum(), n_run.sum()) - db(sig.sum(), n_sim.sum()):+.2f} "
                  f"({lo_r:+.2f}..{hi_r:+.2f}); sim_cpu vs sim {db(a[:, 7].sum(), a[:, 5].sum()):.2f}, run vs sim "
                  f"{db(a[:, 7].sum(), a[:, 6].sum()):.2f}; run's error larger than sim's on {(n_run > n_sim).sum()} of {len(a)}; "
                  f"5 worst inputs carry {100 * top5:.0f} % of run's")


if __name__ == "__main__":
    main()
