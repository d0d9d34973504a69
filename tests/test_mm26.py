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
