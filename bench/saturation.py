"""Which layers really saturate in OpenVINO's int8 kernels on this CPU, layer by layer.

For one exported FakeQuantize file (qtool export --target openvino), OpenVINO runs the whole model
on held-out inputs, once per quantized layer, with the layer's float inputs (the tensors its
FakeQuantize nodes read) and its output added as outputs (one layer at a time: with many outputs
added at once OpenVINO 2026.4 returned zeros for some). Each layer's exact int8 result is then
computed from those very inputs: the layer and the FakeQuantize nodes (and pass-through ops) in
front of it, cut out of the file and run as qtool's exact simulation (qtool.checks.simulate: the
arithmetic a CPU with VNNI computes). So each layer is measured on its own, with the errors of the
layers before it not counted:
  sat dB   the runtime's error against the exact int8 result, relative to the layer's own
           quantization noise (exact int8 vs the same layer in float on the same inputs);
           -inf where the runtime is exact; near 0 dB or above: saturation as large as the int8
           rounding itself;
  share    the share of output values the runtime gets wrong by more than 1 % of the output range.
On a CPU without VNNI (this one, if the header says so) these are OpenVINO's AVX2 kernels; with
VNNI the runtime should match the simulation up to float rounding everywhere.

Usage (the held-out inputs as .npy/.npz files, e.g. bench/fidelity.py's eval folders):
  python bench/saturation.py FILE.openvino.onnx DATA_DIR [--limit 8] [--layers 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

LINEAR = ("Conv", "ConvTranspose", "MatMul", "Gemm")
PASS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "MaxPool", "Slice", "Split", "Concat", "Identity")


def quantized_layers(proto) -> dict[str, list[str]]:
    """{linear node: the tensors its FakeQuantize nodes read} for every linear layer whose float
    inputs all come from FakeQuantize nodes (directly or through pass-through ops)."""
    from qtool.checks.simulate import is_fake_quantize

    producer = {o: n for n in proto.graph.node for o in n.output}
    inits = {i.name for i in proto.graph.initializer}
    for n in proto.graph.node:  # tensors computed from constants only: int8 weights stored as Cast x scale, shapes
        if all(i in inits for i in n.input if i):
            inits.update(n.output)

    def sources(t: str, seen=()) -> list[str] | None:
        n = producer.get(t)
        if n is None:
            return None
        if is_fake_quantize(n):
            return [n.input[0]]
        if n.op_type in PASS and n.input:
            found = []
            for i in (n.input if n.op_type == "Concat" else n.input[:1]):
                s = sources(i)
                if s is None:
                    return None
                found += s
            return found
        return None

    out = {}
    for n in proto.graph.node:
        if n.op_type not in LINEAR:
            continue
        got = []
        for t in n.input[:2]:
            if t in inits:
                continue
            s = sources(t)
            if s is None:
                got = None
                break
            got += s
        if got:
            out[n.name] = got
    return out


def _feeds(folder: Path, limit: int, names: list[str]) -> list[dict]:
    feeds = []
    for f in sorted(folder.iterdir())[:limit]:
        if f.suffix == ".npz":
            with np.load(f) as z:
                feeds.append({k: z[k] for k in z.files if k in names})
        elif f.suffix == ".npy":
            feeds.append({names[0]: np.load(f)})
    return feeds


def measure(path: Path, data: Path, limit: int = 8, max_layers: int | None = None) -> list[dict]:
    import onnx
    import onnxruntime as ort
    import openvino as ov
    from onnx import helper

    from qtool.checks import simulate

    proto = onnx.load(str(path))
    layers = quantized_layers(proto)
    if max_layers:
        layers = dict(list(layers.items())[:max_layers])
    node = {n.name: n for n in proto.graph.node}
    core = ov.Core()
    input_names = [i.get_any_name() for i in core.read_model(str(path)).inputs]
    feeds = _feeds(data, limit, input_names)
    captured: list[dict] = [{} for _ in feeds]
    for name, srcs in layers.items():
        wanted = sorted({*srcs, node[name].output[0]})
        model = core.read_model(str(path))
        model.add_outputs(wanted)
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        request = compiled.create_infer_request()
        port = {n: o for o in compiled.outputs for n in o.get_names()}
        for f, cap in zip(feeds, captured):
            r = request.infer(f)
            cap.update({t: np.array(r[port[t]]) for t in wanted if t in port})

    # the simulation of the whole file: values of the tensors the cut-out layers need besides the captured ones (shapes...)
    sim_proto = onnx.load(str(path))
    inter = {vi.name for vi in sim_proto.graph.output}
    for n in sim_proto.graph.node:
        for o in n.output:
            if o and o not in inter:
                sim_proto.graph.output.append(helper.make_empty_tensor_value_info(o))
                inter.add(o)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    whole = ort.InferenceSession(simulate.fake_quantize_as_float_ops(sim_proto).SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
    names = [o.name for o in whole.get_outputs()]
    ref = [dict(zip(names, whole.run(None, f))) for f in feeds]

    rows = []
    for name, srcs in layers.items():
        out = node[name].output[0]
        if out not in captured[0] or any(s not in captured[0] for s in srcs):
            rows.append({"layer": name, "op": node[name].op_type, "error": "not captured"})
            continue
        sample = {**ref[0], **captured[0]}
        sub = _cut(proto, srcs, out, {t: helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype) for t, v in sample.items()})
        if sub is None:
            rows.append({"layer": name, "op": node[name].op_type, "error": "cannot cut"})
            continue
        sub_inputs = [i.name for i in sub.graph.input]
        exact_s = _session(simulate.fake_quantize_as_float_ops(_copy(sub)))
        float_s = _session(_without_fq(_copy(sub)))
        sat = noise = signal = 0.0
        wrong = total = 0
        for cap, r in zip(captured, ref):
            feed = {i: (cap[i] if i in cap else r[i]) for i in sub_inputs}
            exact = exact_s.run(None, feed)[0].astype(np.float64)
            flt = float_s.run(None, feed)[0].astype(np.float64)
            real = cap[out].astype(np.float64).reshape(exact.shape)
            sat += float(((real - exact) ** 2).sum())
            noise += float(((exact - flt) ** 2).sum())
            signal += float((exact ** 2).sum())
            span = float(exact.max() - exact.min()) or 1.0
            wrong += int((np.abs(real - exact) > 0.01 * span).sum())
            total += exact.size
        rows.append({"layer": name, "op": node[name].op_type, "quantized_inputs": len(srcs),
                     "sat_db": 10 * np.log10(sat / noise) if sat > 0 and noise > 0 else (-np.inf if sat == 0 else np.inf),
                     "sqnr_exact_db": 10 * np.log10(signal / sat) if sat > 0 else np.inf, "share": wrong / max(total, 1)})
    return rows


def _copy(m):
    import onnx

    c = onnx.ModelProto()
    c.CopyFrom(m)
    return c


def _session(m):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _without_fq(m):
    """The model with every FakeQuantize an Identity (the layer in float)."""
    from onnx import helper

    from qtool.checks.simulate import is_fake_quantize

    nodes = [helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name) if is_fake_quantize(n) else n for n in m.graph.node]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def _cut(proto, sources: list[str], output: str, types: dict):
    """The part of `proto` computing `output` from `sources` (plus whatever else it reads that no
    node of the part computes: graph inputs, shape tensors), as a model whose inputs are those."""
    from onnx import helper

    producer = {o: n for n in proto.graph.node for o in n.output}
    inits = {i.name: i for i in proto.graph.initializer}
    keep, stack, inputs, seen = [], [output], [], set()
    while stack:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in sources or t not in producer:
            if t not in inits:
                inputs.append(t)
            continue
        n = producer[t]
        if n not in keep:
            keep.append(n)
        stack.extend(n.input)
    order = {id(n): i for i, n in enumerate(proto.graph.node)}
    keep.sort(key=lambda n: order[id(n)])
    used = {i for n in keep for i in n.input}
    g = helper.make_graph(keep, "cut", [helper.make_tensor_value_info(t, types[t], None) for t in inputs],
                          [helper.make_tensor_value_info(output, types[output], None)], [inits[t] for t in used if t in inits])
    m = helper.make_model(g, opset_imports=list(proto.opset_import))
    m.ir_version = proto.ir_version
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from qtool.quantizers import cpu_kinds

    print(f"{args.file.name}: OpenVINO on this CPU (VNNI: {cpu_kinds.vnni()}) vs the exact int8 arithmetic, per layer, {args.limit} inputs",
          flush=True)
    rows = measure(args.file, args.data, args.limit, args.layers)
    for r in rows:
        if "error" in r:
            print(f"{r['layer'][:60]:60s} {r['op']:8s} {r['error']}")
        else:
            print(f"{r['layer'][:60]:60s} {r['op']:8s} inputs={r['quantized_inputs']} sat {r['sat_db']:7.1f} dB  "
                  f"exact-vs-run {r['sqnr_exact_db']:6.1f} dB  wrong {r['share']:.2%}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    sys.exit(main())
