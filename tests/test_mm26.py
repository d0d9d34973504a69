"""OpenVINO's MatMuls of two computed tensors run in int8 only on grids without a zero point
(bench/openvino_quirks.py case 16; qtool.targets.cpu._zero_point_free)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from required import module

import qtool
from qtool.quantizers import cpu_kinds

ov = module("openvino")
CORE = ov.Core()


def _skewed_attention_like() -> onnx.ModelProto:
    """x [N, 16, 32] -> two Linear layers -> q (a GELU's output: a small negative tail, mostly positive, as every FFN's
    second MatMul reads) and k -> q k^T, a MatMul of two computed tensors (an attention score) -> Linear -> out."""
    rng = np.random.default_rng(0)
    d = 32
    inits = [numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(d), (d, d)).astype(np.float32), "wq"),
             numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(d), (d, d)).astype(np.float32), "wk"),
             numpy_helper.from_array(np.full(d, 0.8, np.float32), "bq"),
             numpy_helper.from_array(rng.normal(0, 1 / 4, (16, 8)).astype(np.float32), "wo")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"], name="q/MatMul"), helper.make_node("Add", ["q0", "bq"], ["q1"], name="q/Add"),
             helper.make_node("Gelu", ["q1"], ["q"], name="q/Gelu", domain="com.microsoft"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k/MatMul"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="k/Transpose"),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores/MatMul"),
             helper.make_node("MatMul", ["s", "wo"], ["out"], name="out/MatMul")]
    g = helper.make_graph(nodes, "skewed_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, d])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 16, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_a_matmul_of_two_activations_runs_int8_in_openvino():
    """A GELU's output read by a MatMul of two computed tensors takes an asymmetric grid under --activations auto (its
    negative tail), on which OpenVINO's CPU plugin dequantizes both inputs and runs the MatMul in f32: the score MatMul
    keeps a grid without a zero point and runs in int8 (u8 or i8 inputs in OpenVINO's runtime graph); asked for,
    asymmetric stays asymmetric (and f32 there)."""
    model = _skewed_attention_like()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (2, 16, 32)).astype(np.float32)} for _ in range(20)]
    cal = qtool.calibrate(model, data=feeds[:14])

    def scores(data: bytes) -> tuple[list[str], list[str]]:
        m = onnx.load_from_string(data)
        fq = {n.output[0]: n for n in m.graph.node if n.op_type == "FakeQuantize"}
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        node = next(n for n in m.graph.node if n.op_type == "MatMul" and n.name.startswith("scores"))
        grids = []
        for t in node.input:
            while t not in fq:  # through the Transpose
                t = next(n for n in m.graph.node if t in n.output).input[0]
            low, high = (float(inits[fq[t].input[i]]) for i in (1, 2))
            grids.append("zero point" if low < 0 and not np.isclose(low, -high * 128 / 127) else "none")
        compiled = CORE.compile_model(CORE.read_model(data, b""), "CPU", dict(cpu_kinds.PINNED_F32))
        held = [str(op.get_rt_info()["runtimePrecision"].astype(str)) for op in compiled.get_runtime_model().get_ops()
                if str(op.get_rt_info()["layerType"].astype(str)) == "MatMul"
                and "scores/MatMul" in str(op.get_rt_info()["originalLayersNames"].astype(str)).split(",")]
        return grids, held

    grids, held = scores(qtool.export(model, cal, target="openvino"))
    assert grids == ["none", "none"], grids
    assert held and all(p in ("u8", "i8") for p in held), held
    grids, held = scores(qtool.export(model, cal, target="openvino", activations="asymmetric"))
    assert "zero point" in grids, grids  # asked for: kept
    assert held == ["f32"], held  # what the rule avoids (bench/openvino_quirks.py case 16)
    result = qtool.evaluate(model, cal, data=feeds[14:], target="openvino", runtime="openvino")
    assert result.outputs[0].sqnr_db > 30 and result.runtime.outputs[0].sqnr_db > 30, result


def _gated_stream_like(blocks: int = 8, d: int = 32) -> onnx.ModelProto:
    """A graph transformer's residual stream (minimol's, 16 blocks): h -> Tanh stem; per block a small step
    h' = h + 0.05 * Tanh(MatMul(h / 2)) (a stream step: placement.moves._stream_step), and a message Add h + Sigmoid(
    MatMul(x)) read by its own MatMul; the stream's end and every message summed by a head."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.float32(2), "two")]
    nodes = []

    def w(name: str, a: int, b: int) -> str:
        inits.append(numpy_helper.from_array((rng.normal(0, 1, (a, b)) / np.sqrt(a)).astype(np.float32), name))
        return name

    def op(kind: str, ins: list[str], out: str, name: str) -> str:
        nodes.append(helper.make_node(kind, ins, [out], name=name))
        return out

    h = op("Tanh", [op("MatMul", ["x", w("w0", d, d)], "h0", "stem/MatMul")], "s0", "stem/Tanh")
    acc = None
    for i in range(blocks):
        step = op("Mul", [op("Tanh", [op("MatMul", [op("Div", [h, "two"], f"hd{i}", f"b{i}/Div"), w(f"w1_{i}", d, d)], f"b0_{i}",
                                                   f"b{i}/MatMul")], f"b1_{i}", f"b{i}/Tanh"), "s"], f"st{i}", f"b{i}/Mul")
        gate = op("Sigmoid", [op("MatMul", ["x", w(f"w2_{i}", d, d)], f"g0_{i}", f"m{i}/MatMul")], f"g{i}", f"m{i}/Sigmoid")
        message = op("MatMul", [op("Add", [h, gate], f"a{i}", f"m{i}/Add"), w(f"w4_{i}", d, 8)], f"o{i}", f"m{i}/out")
        acc = message if acc is None else op("Add", [acc, message], f"acc{i}", f"sum{i}/Add")
        h = op("Add", [h, step], f"h{i + 1}", f"b{i}/Add")
    op("Add", [acc, op("MatMul", [h, w("w3", d, 8)], "oh", "head/MatMul")], "out", "head/Add")
    g = helper.make_graph(nodes, "gated_stream", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", d])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_sums_freed_by_a_float_sum_read_float_too():
    """placement.moves.lone_sums to a fixed point: the stream steps read float (their Adds), which leaves each message
    Add's two quantizers serving it alone, so it reads float too (one pass left them: OpenVINO ran 8 standalone
    FakeQuantizes before those Adds; minimol 23, its runtime graph 50 -> 27 standalone, NNCF's 25). OpenVINO's runtime
    graph has no FakeQuantize left of its own before an element-wise op, and runs the file's numbers."""
    model = _gated_stream_like()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (16, 32)).astype(np.float32)} for _ in range(16)]
    cal = qtool.calibrate(model, data=feeds[:12])
    data = qtool.export(model, cal, target="openvino")
    m = onnx.load_from_string(data)
    quantized = {n.output[0] for n in m.graph.node if n.op_type == "FakeQuantize"}
    for n in m.graph.node:
        if n.name.startswith(("m", "b")) and n.op_type == "Add":
            assert not quantized & set(n.input), (n.name, list(n.input))
    compiled = CORE.compile_model(CORE.read_model(data, b""), "CPU", dict(cpu_kinds.PINNED_F32))
    alone = [str(op.get_rt_info()["originalLayersNames"].astype(str)) for op in compiled.get_runtime_model().get_ops()
             if str(op.get_rt_info()["layerType"].astype(str)) == "FakeQuantize"
             and any(str(t.get_node().get_rt_info()["layerType"].astype(str)) == "Eltwise" for t in op.output(0).get_target_inputs())]
    assert not alone, alone
    result = qtool.evaluate(model, cal, data=feeds[12:], target="openvino", runtime="openvino")
    assert result.outputs[0].sqnr_db > 35 and abs(result.runtime.outputs[0].sqnr_db - result.outputs[0].sqnr_db) < 0.5, result


def test_an_op_a_scatter_feeds_reads_both_inputs_float():
    """A graph net's scatter-add -> Add with its node's gated features (tests/zoo.py scatter_gnn_like; minimol's 48
    scatters): the scatter's output reads float (no FakeQuantize fuses into OpenVINO's scatter), so the Add runs in f32;
    the quantizer on its other input only rounded it, alone in OpenVINO's runtime graph (minimol: 14). Neither input
    is quantized now."""
    import zoo

    model = zoo.scatter_gnn_like()
    rng = np.random.default_rng(11)
    feeds = []
    for _ in range(16):
        nodes, edges = int(rng.integers(12, 30)), int(rng.integers(30, 80))
        feeds.append({"x": rng.normal(0, 1, (nodes, 16)).astype(np.float32),
                      "src": rng.integers(0, nodes, edges).astype(np.int64), "dst": rng.integers(0, nodes, edges).astype(np.int64)})
    cal = qtool.calibrate(model, data=feeds[:12])
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    quantized = {n.output[0] for n in m.graph.node if n.op_type == "FakeQuantize"}
    producers = {o: n for n in m.graph.node for o in n.output}
    for n in m.graph.node:
        if n.op_type == "Add" and any(t in producers and producers[t].op_type == "ScatterElements" for t in n.input):
            assert not quantized & set(n.input), (n.name, list(n.input))
    result = qtool.evaluate(model, cal, data=feeds[12:], target="openvino", runtime="openvino")
    assert result.plan_summary["int8_layers"] == 5, result.plan_summary
