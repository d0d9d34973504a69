"""OpenVINO's placement leaves element-wise Max/Min float: its CPU plugin runs no Max in int8, so the quantizers on a
Max's inputs and output only round (thai_deepcut, docs/benchmarks.md#vnni25)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import zoo
from required import module

import qtool
from qtool.quantizers import cpu_kinds

ov = module("openvino")


def _bank():
    model = zoo.max_of_banks_like()
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (8, 21, 16)).astype(np.float32)} for _ in range(24)]
    return model, qtool.calibrate(model, data=feeds[:16]), feeds[16:]


def test_a_max_of_dense_outputs_stays_float_in_openvino_files(tmp_path):
    """A Keras Maximum of 12 Dense outputs (tests/zoo.max_of_banks_like, tf2onnx's chain of 11 Max): no FakeQuantize
    writes a Max's input and only the last Max's output, fc1's input, is quantized (before: 22, on the Dense outputs and
    every Max output), every Conv and MatMul still int8 in
    OpenVINO's run, the Max chain f32 there as before, and the file 3.9 dB nearer FP32 (29.0 -> 32.9)."""
    model, cal, held = _bank()
    data = qtool.export(model, cal, target="openvino")
    m = onnx.load_from_string(data)
    producers = {o: n for n in m.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in m.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    maxes = [n for n in m.graph.node if n.op_type == "Max"]
    assert len(maxes) == 11
    fq_in = [n.name for n in maxes for t in n.input if t in producers and producers[t].op_type == "FakeQuantize"]
    fq_out = [n.name for n in maxes for r in readers.get(n.output[0], ()) if r.op_type == "FakeQuantize"]
    assert fq_in == [] and fq_out == ["/maximum/Max_10"], (fq_in, fq_out)  # the last: fc1's input, moved up the Reshape
    (tmp_path / "bank.onnx").write_bytes(data)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(tmp_path / "bank.onnx")), "CPU", cpu_kinds.PINNED_F32)
    info = [op.get_rt_info() for op in compiled.get_runtime_model().get_ops()]
    kinds = [(i["layerType"].astype(str), i["runtimePrecision"].astype(str), i["originalLayersNames"].astype(str)) for i in info]
    linear = [p for t, p, _ in kinds if t in ("Convolution", "FullyConnected")]
    assert len(linear) == 26 and set(linear) <= {"u8", "i8"}, kinds
    assert {p for t, p, names in kinds if "/maximum/" in names and t == "Eltwise"} == {"f32"}, kinds
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino")
    exact, run = result.worst_sqnr_db, result.runtime.worst_sqnr_db
    assert exact > 31.5 and abs(run - exact) < 0.5, (exact, run)


def test_a_max_chain_shares_one_grid_in_qdq_files():
    """onnxruntime runs no int8 Max (DequantizeLinear -> Max -> QuantizeLinear stay three nodes): the qdq file keeps the
    Dense outputs' quantizers (its QGemms need them) and gives the chain's inputs and outputs one grid, so no Max rounds
    again, on the last Max's range (a value below it never comes out of the chain). Before, 21 grids on the 11 Maxes'
    inputs and onnxruntime's run 29.0 dB; one grid over every member's range 32.1 dB; over the last Max's, 33.5."""
    from onnx import numpy_helper

    model, cal, held = _bank()
    m = onnx.load_from_string(qtool.export(model, cal, target="qdq"))
    init = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    producers = {o: n for n in m.graph.node for o in n.output}
    grids = {(float(init[producers[t].input[1]]), int(init[producers[t].input[2]]))
             for n in m.graph.node if n.op_type == "Max" for t in n.input if producers[t].op_type == "DequantizeLinear"}
    assert len(grids) == 1, grids
    assert sum(n.op_type == "Max" and all(producers[t].op_type == "DequantizeLinear" for t in n.input) for n in m.graph.node) == 11
    result = qtool.evaluate(model, cal, data=held, target="qdq", runtime="onnxruntime")
    assert result.runtime.worst_sqnr_db > 33.0 and abs(result.runtime.worst_sqnr_db - result.worst_sqnr_db) < 0.5


def test_the_cpu_placement_still_quantizes_a_max():
    """The change is OpenVINO's: the generic CPU rules (NNCF's default preset, which quantizes Maximum) keep the Max's
    quantizers, and TensorRT's rules never had them."""
    from qtool.targets.cpu import CPU, OPENVINO

    assert "Max" in CPU.elementwise and "Min" in CPU.elementwise
    assert "Max" not in OPENVINO.elementwise and "Min" not in OPENVINO.elementwise
    assert {"Add", "Mul", "Sub", "Div"} <= OPENVINO.elementwise


@pytest.mark.skipif(cpu_kinds.vnni() is not True, reason="needs a CPU with VNNI (int32-accumulating int8 kernels)")
def test_the_max_bank_runs_as_evaluated_on_vnni():
    """On a VNNI CPU (the issue's acceptance machine) the `--cpu vnni` file runs as its simulation too."""
    model, cal, held = _bank()
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino", cpu="vnni")
    assert result.worst_sqnr_db > 31.5 and abs(result.runtime.worst_sqnr_db - result.worst_sqnr_db) < 0.5
