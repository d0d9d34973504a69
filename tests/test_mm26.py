"""minimol's standalone FakeQuantizes in OpenVINO's runtime graph (docs/benchmarks.md#mm26): lone sums to a fixed
point, and an element-wise op a scatter feeds read float."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from required import module

import qtool
from qtool.quantizers import cpu_kinds

ov = module("openvino")
CORE = ov.Core()


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
