"""A model shipped dynamic-int8: how much of an OpenVINO file's distance from the model as given is its own
quantizers, and how much the static grids at the inputs the model quantizes at run time (docs/benchmarks.md#t5s28).

Every figure is OpenVINO's run (f32 inference precision) of a file on the zoo model's held-out feeds against
OpenVINO running the model as given (what bench/zoo.py scores NNCF against; the "vs_own_fp32_sqnr_db" of
`qtool evaluate --runtime openvino --json`), worst output's SQNR in dB. The variants rewrite qtool's file:
- "dynamic at S": the FakeQuantize on each input of S the model quantizes by DynamicQuantizeLinear becomes
  DynamicQuantizeLinear -> DequantizeLinear (the model's own run-time grid; the layer then runs in f32);
- "no other FakeQuantize": the FakeQuantize nodes on tensors the model does not quantize (the attention's Q and K)
  become Identity;
- "exact": every FakeQuantize as float ops (clip, round, rescale), so OpenVINO computes the file's arithmetic in f32
  with no int8 kernel (no u8 x s8 pair saturation on a CPU without VNNI);
- "model grid where the runs' range spreads <= X": the FakeQuantize of those inputs on the model's own asymmetric
  uint8 grid over the median of the calibration runs' [min, max] (zero point rounded as DynamicQuantizeLinear does);
- "the model, weights x (1 + eps)": the model as given, its MatMulInteger as float MatMul of its integers with every
  weight scaled by 1 + eps: how far a perturbation that small moves the model's own output (its rounding's chaos).

Usage: python bench/dynamic_sites.py ZOO_FOLDER QTOOL_OPENVINO_FILE [--vnni-file F] [--nncf XML ...]
(QTOOL_OPENVINO_FILE: `qtool export --target openvino` of the folder's model.onnx; --vnni-file: the same with
`--cpu vnni`, no overflow guard, scored "exact" only; --nncf: NNCF's IR files, scored as they are.)
"""

from __future__ import annotations

import argparse
import glob
import tempfile
from pathlib import Path

import numpy as np
import onnx
import openvino as ov
from onnx import helper, numpy_helper

CORE = ov.Core()
F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def feeds(folder: Path, kind: str) -> list[dict]:
    return [dict(np.load(f)) for f in sorted(glob.glob(str(folder / kind / "*.npz")))]


def outputs(model, fs: list[dict]) -> list[np.ndarray]:
    compiled = CORE.compile_model(CORE.read_model(model) if isinstance(model, (str, Path)) else model, "CPU", F32)
    return [np.asarray(list(compiled(f).values())[0], dtype=np.float64) for f in fs]


def sqnr(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """qtool's accumulator (qtool.checks.evaluation._Acc, as bench/zoo.py scores): float64, NaN-safe, guarded."""
    from qtool.checks.evaluation import _Acc

    acc = _Acc()
    for r, g in zip(ref, got):
        acc.update(r, g)
    return acc.sqnr()


def dynamic_inputs(model: onnx.ModelProto) -> list[str]:
    return [n.input[0] for n in model.graph.node if n.op_type == "DynamicQuantizeLinear"]


def rewritten(model: onnx.ModelProto, dynamic=(), identity=lambda n: False, exact=False, grids=None) -> onnx.ModelProto:
    """A copy of qtool's file with its FakeQuantize nodes rewritten (the module's docstring)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        t = n.input[0] if n.input else ""
        if n.op_type != "FakeQuantize":
            nodes.append(n)
        elif t in dynamic:
            y = [f"{t}/dyn/{k}" for k in ("y", "scale", "zp")]
            nodes += [helper.make_node("DynamicQuantizeLinear", [t], y), helper.make_node("DequantizeLinear", y, [n.output[0]])]
        elif identity(n):
            nodes.append(helper.make_node("Identity", [t], [n.output[0]]))
        else:
            if grids and t in grids:
                for k, v in zip((1, 2, 3, 4), (grids[t][0], grids[t][1]) * 2):
                    shape = numpy_helper.to_array(inits[n.input[k]]).shape
                    name = f"{n.input[k]}/model_grid/{k}"
                    m.graph.initializer.append(numpy_helper.from_array(np.full(shape, v, np.float32), name))
                    n.input[k] = name
                for a in n.attribute:
                    if a.name == "levels":
                        a.i = 256
            nodes += _as_float_ops(n) if exact else [n]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _as_float_ops(n: onnx.NodeProto) -> list[onnx.NodeProto]:
    levels = next(a.i for a in n.attribute if a.name == "levels")
    x, il, ih, ol, oh = n.input
    p = f"{n.name or n.output[0]}/float"
    const = helper.make_node("Constant", [], [f"{p}/steps"], value=numpy_helper.from_array(np.array(levels - 1, np.float32)))
    ops = [("Max", [x, il], "a"), ("Min", ["a", ih], "b"), ("Sub", ["b", il], "c"), ("Sub", [ih, il], "w"),
           ("Div", ["c", "w"], "d"), ("Mul", ["d", "steps"], "e"), ("Round", ["e"], "f"), ("Div", ["f", "steps"], "g"),
           ("Sub", [oh, ol], "ow"), ("Mul", ["g", "ow"], "h"), ("Add", ["h", ol], None)]
    def named(s: str) -> str:
        return s if s in (x, il, ih, ol, oh) else f"{p}/{s}"
    return [const] + [helper.make_node(op, [named(i) for i in ins], [named(out) if out else n.output[0]]) for op, ins, out in ops]


def runs_ranges(model_path: Path, tensors: list[str], fs: list[dict]) -> dict[str, np.ndarray]:
    """Per tensor, the [min(0, min x), max(0, max x)] of each calibration run (DynamicQuantizeLinear's range)."""
    m = onnx.load(model_path)
    m.graph.output.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in tensors)
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(m, f"{tmp}/m.onnx")
        compiled = CORE.compile_model(CORE.read_model(f"{tmp}/m.onnx"), "CPU", F32)
        found = {t: [] for t in tensors}
        for f in fs:
            result = compiled(f)
            for o in compiled.outputs:
                for t in tensors:
                    if t in o.get_names():
                        v = np.asarray(result[o])
                        found[t].append((min(0.0, float(v.min())), max(0.0, float(v.max()))))
    return {t: np.array(v) for t, v in found.items()}


def model_grid(ranges: np.ndarray) -> tuple[float, float]:
    lo, hi = np.median(ranges[:, 0]), np.median(ranges[:, 1])
    scale = (hi - lo) / 255
    zp = round(-lo / scale)
    return -zp * scale, (255 - zp) * scale


def perturbed_model(model_path: Path, eps: float) -> onnx.ModelProto:
    m = onnx.load(model_path)
    nodes = []
    for i, n in enumerate(m.graph.node):
        if n.op_type != "MatMulInteger":
            nodes.append(n)
            continue
        a, w = n.input[0], n.input[1]
        p = f"perturbed/{i}"
        nodes += [helper.make_node("Cast", [a], [f"{p}/a"], to=1), helper.make_node("Cast", [w], [f"{p}/w"], to=1)]
        if len(n.input) > 2 and n.input[2]:
            nodes += [helper.make_node("Cast", [n.input[2]], [f"{p}/zp"], to=1),
                      helper.make_node("Sub", [f"{p}/a", f"{p}/zp"], [f"{p}/x"])]
        else:
            nodes.append(helper.make_node("Identity", [f"{p}/a"], [f"{p}/x"]))
        nodes += [helper.make_node("Constant", [], [f"{p}/eps"], value=numpy_helper.from_array(np.array(1 + eps, np.float32))),
                  helper.make_node("Mul", [f"{p}/w", f"{p}/eps"], [f"{p}/we"]),
                  helper.make_node("MatMul", [f"{p}/x", f"{p}/we"], [n.output[0]])]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.graph.value_info[:]
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("qtool_file", type=Path)
    ap.add_argument("--vnni-file", type=Path)
    ap.add_argument("--nncf", nargs="*", default=[])
    args = ap.parse_args()
    model_path = args.folder / "model.onnx"
    held = feeds(args.folder, "held")
    ref = outputs(model_path, held)
    own = dynamic_inputs(onnx.load(model_path, load_external_data=False))
    qfile = onnx.load(args.qtool_file)

    def score(m) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            onnx.save(m, f"{tmp}/v.onnx")
            return sqnr(ref, outputs(f"{tmp}/v.onnx", held))

    def show(label: str, value: float) -> None:
        print(f"| {label} | {value:.2f} |", flush=True)

    print(f"{len(own)} inputs the model quantizes at run time; {len(held)} held-out feeds; against OpenVINO's run of the model")
    print("| file | dB |\n|---|---:|")
    for xml in args.nncf:
        show(f"NNCF {Path(xml).stem}", sqnr(ref, outputs(xml, held)))
    show("qtool's file", score(qfile))
    show("qtool's file, exact", score(rewritten(qfile, exact=True)))
    def others(n: onnx.NodeProto) -> bool:
        return n.input[0] not in own
    show("qtool's file, no other FakeQuantize", score(rewritten(qfile, identity=others)))
    show("dynamic at all the model's inputs", score(rewritten(qfile, dynamic=set(own))))
    show("dynamic at all, no other FakeQuantize", score(rewritten(qfile, dynamic=set(own), identity=others)))
    groups: dict[str, set[str]] = {}
    for t in own:  # the inputs grouped by the name's last two parts (T5: layer_norm/Mul_1 ..., DenseReluDense/Mul ...)
        groups.setdefault("/".join(t.split("/")[-3:-1]), set()).add(t)
    for key, members in groups.items():
        show(f"dynamic at the {len(members)} inputs `.../{key}/...`", score(rewritten(qfile, dynamic=members)))
    ranges = runs_ranges(model_path, own, feeds(args.folder, "calib"))
    spread = {t: float(np.ptp(r, axis=1).max() / np.ptp(r, axis=1).min()) for t, r in ranges.items()}
    if args.vnni_file:
        vnni = onnx.load(args.vnni_file)
        show("`--cpu vnni` file, exact", score(rewritten(vnni, exact=True)))
        for limit in (1.06, 1.10):
            chosen = {t for t in own if spread[t] <= limit}
            show(f"`--cpu vnni` exact, model grid where the runs' range spreads <= {limit} ({len(chosen)} inputs)",
                 score(rewritten(vnni, exact=True, grids={t: model_grid(ranges[t]) for t in chosen})))
            show(f"`--cpu vnni` exact, dynamic at those {len(chosen)} inputs", score(rewritten(vnni, exact=True, dynamic=chosen)))
        show("`--cpu vnni` exact, model grid at all", score(rewritten(vnni, exact=True, grids={t: model_grid(ranges[t]) for t in own})))
    for eps in (1e-6, 1e-4):
        show(f"the model, weights x (1 + {eps:g})", score(perturbed_model(model_path, eps)))


if __name__ == "__main__":
    main()
