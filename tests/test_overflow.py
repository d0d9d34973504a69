"""The overflow guard: layers whose u8 x s8 pair sums can saturate on CPUs without VNNI get
uint8 weights (qdq, exact) or 7-bit weights (openvino); the rest keep int8 weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.calibration import TensorRecord
from qtool.quantizers import overflow, quant
from qtool.targets.cpu import CPU

RNG = np.random.default_rng(7)


def _record(values: np.ndarray, bins: int = 2048) -> TensorRecord:
    a = np.abs(values.ravel().astype(np.float64))
    top = float(a.max())
    counts, _ = np.histogram(a, bins=bins, range=(0, top))
    return TensorRecord("x", float(values.min()), float(values.max()), top, counts.tolist(), top)


def _conv(cout=8, cin=16, k=3, group=1):
    return helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, pads=[1, 1, 1, 1])


def test_pairs_of_opposite_signs_never_saturate():
    rows = np.array([[127, -127, 127, 127, -5, 3]])
    assert overflow._pair_sums(rows).tolist() == [[0, 254, 0]]


def test_saturation_estimate_follows_weights_and_activations():
    bright = np.full(10000, 1.0)  # every code at the top of the u8 grid
    act = quant.QParams(np.asarray(1 / 255), np.asarray(0), quant.grid(8, signed=False))
    q = np.full((8, 16, 3, 3), 127)
    dims = {"w": list(q.shape)}
    for correlated in (True, False):
        risk = overflow.assess(_conv(), 1, q, dims, _record(bright), act, correlated)
        assert risk.saturation > risk.seven_bit > 0 and risk.share == 1.0
        seven = overflow.assess(_conv(), 1, np.full_like(q, 63), dims, _record(bright), act, correlated)
        assert seven.saturation == 0  # 255 * 63 * 2 < 32767
        dark = overflow.assess(_conv(), 1, q, dims, _record(np.full(10000, 0.4)), act, correlated)
        assert dark.saturation == 0  # codes of 102: 102 * 254 < 32767
        alternating = np.where(np.indices(q.shape)[1] % 2 == 0, 127, -127)
        assert overflow.assess(_conv(), 1, alternating, dims, _record(bright), act, correlated).saturation == 0


def test_independent_activations_rarely_saturate_together():
    """A sparse tail (1 % of codes near the top): independent pairs both large 1 % of 1 % of the time."""
    act = quant.QParams(np.asarray(1 / 255), np.asarray(0), quant.grid(8, signed=False))
    q = np.full((8, 16, 3, 3), 127)
    sparse = np.where(RNG.random(100000) < 0.01, 0.9, 0.05)
    dims = {"w": list(q.shape)}
    together = overflow.assess(_conv(), 1, q, dims, _record(sparse), act, correlated=True).saturation
    apart = overflow.assess(_conv(), 1, q, dims, _record(sparse), act, correlated=False).saturation
    assert 0 < apart < together / 100


def test_signed_activations_count_from_the_shifted_code():
    """A signed activation is multiplied as q + 128: small positive values already saturate a pair of 127s."""
    act = quant.QParams(np.asarray(1 / 127), np.asarray(0), quant.grid(8, signed=True))
    q = np.full((8, 16, 1, 1), 127)
    small = RNG.uniform(0.05, 0.1, 10000) * np.where(RNG.random(10000) < 0.5, 1, -1)  # q of about +-6..13
    assert overflow.assess(_conv(k=1), 1, q, {"w": list(q.shape)}, _record(small), act, False).saturation > 0
    negative = -np.abs(small)
    assert overflow.assess(_conv(k=1), 1, q, {"w": list(q.shape)}, _record(negative), act, False).saturation == 0


def test_independent_pairs_closed_form_equals_the_double_sum():
    pmf = RNG.random(256) ** 8
    pmf /= pmf.sum()
    centres = np.arange(overflow._BIN / 2 - 0.5, 128, overflow._BIN)
    brute = np.array([[pmf @ np.maximum(np.add.outer(overflow.CODES * u, overflow.CODES * v) - overflow.LIMIT, 0) ** 2 @ pmf
                       for v in centres] for u in centres])
    np.testing.assert_allclose(overflow._excess_sq_independent(pmf), brute, rtol=1e-9, atol=1e-9 * brute.max())


def test_pairs_run_along_the_reduction_axis():
    kn = np.arange(6).reshape(2, 3)  # [K, N]
    matmul = helper.make_node("MatMul", ["x", "w"], ["y"])
    assert overflow.reduction_rows(matmul, 1, kn, {})[0].tolist() == [[0, 3], [1, 4], [2, 5]]
    assert overflow.reduction_rows(matmul, 0, kn, {})[0].tolist() == [[0, 1, 2], [3, 4, 5]]  # the weight is A: rows M
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"])
    assert overflow.reduction_rows(gemm, 1, kn, {})[0].tolist() == [[0, 3], [1, 4], [2, 5]]
    gemm_t = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    assert overflow.reduction_rows(gemm_t, 1, kn, {})[0].tolist() == [[0, 1, 2], [3, 4, 5]]  # [N, K]
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    w = np.arange(2 * 3 * 1 * 2).reshape(2, 3, 1, 2)  # [O, C, kh, kw]
    mlas, onednn = overflow.reduction_rows(conv, 1, w, {"w": [2, 3, 1, 2]})
    assert mlas[0].tolist() == [0, 2, 4, 1, 3, 5]  # kernel position outer, channel inner
    assert onednn[0].tolist() == [0, 2, 4, 0, 1, 3, 5, 0]  # channels padded to pairs per position


def test_depthwise_convolutions_are_never_at_risk():
    act = quant.QParams(np.asarray(1 / 255), np.asarray(0), quant.grid(8, signed=False))
    q = np.full((16, 1, 3, 3), 127)
    assert overflow.assess(_conv(group=16), 1, q, {"w": list(q.shape)}, _record(np.ones(100)), act, True) is None


# ---------------------------------------------------------------- exports


def _image_model() -> onnx.ModelProto:
    """An image stem (3 -> 16, positive weights: a brightness detector) then a 16 -> 8 Conv whose
    neighbouring input channels have weights of opposite signs: the stem saturates without VNNI,
    the second Conv cannot."""
    w1 = (np.abs(RNG.standard_normal((16, 3, 3, 3))) * 0.3 + 0.05).astype(np.float32)
    signs = np.where(np.arange(16) % 2 == 0, 1.0, -1.0).reshape(1, 16, 1, 1)
    w2 = (np.abs(RNG.standard_normal((8, 16, 3, 3))) * 0.05 * signs).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _images(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grey = rng.uniform(0.5, 1.0, (n, 1, 16, 16))  # bright, channels moving together
    return np.clip(grey + rng.normal(0, 0.03, (n, 3, 16, 16)), 0, 1).astype(np.float32)


@pytest.fixture(scope="module")
def calibrated():
    m = _image_model()
    return m, qtool.calibrate(m, data=({"x": x[None]} for x in _images(32, 1)))


def _run(data: bytes, x: np.ndarray, optimize: bool) -> np.ndarray:
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"x": xi[None]})[0] for xi in x])


def _weights(data: bytes) -> dict[str, np.ndarray]:
    """The dequantized weights of a QDQ model by the node reading them."""
    m = onnx.load_model_from_string(data)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            q, s, z = (inits[i] for i in n.input)
            reader = next(r.name for r in m.graph.node if n.output[0] in r.input)
            out[reader] = (q.dtype, (q.astype(np.float64) - z.reshape(-1, 1, 1, 1)) * s.reshape(-1, 1, 1, 1))
    return out


def test_qdq_stores_the_stem_unsigned_with_the_same_values(calibrated, tmp_path):
    m, cal = calibrated
    auto = qtool.export(m, cal, target="qdq")
    plain = qtool.export(m, cal, target="qdq", weights_7bit="none")
    a, p = _weights(auto), _weights(plain)
    assert a["stem"][0] == np.uint8 and p["stem"][0] == np.int8 and a["head"][0] == np.int8
    np.testing.assert_array_equal(a["stem"][1], p["stem"][1])  # the same weights, stored otherwise
    z = next(numpy_helper.to_array(t) for t in onnx.load_model_from_string(auto).graph.initializer if t.name.startswith("w1/zero_point"))
    assert z.dtype == np.uint8 and set(z.tolist()) == {128}


def test_qdq_default_runs_exactly_in_onnxruntime_on_any_cpu(calibrated):
    """onnxruntime's int8 kernels (this CPU's) agree with the exact arithmetic (Q/DQ as float ops):
    without the guard, a CPU without VNNI saturates the stem's pair sums."""
    m, cal = calibrated
    data = qtool.export(m, cal, target="qdq")
    x = _images(8, 2)
    real, exact = _run(data, x, True), _run(data, x, False)
    noise = float(((real - exact) ** 2).sum()) / float((exact ** 2).sum())
    assert noise < 1e-4, noise


def test_summary_names_the_guarded_layers_and_why(calibrated, tmp_path):
    from qtool.targets import exporter

    m, cal = calibrated
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    loaded = qtool.api._checked(str(path), cal)
    qdq_fix = exporter("qdq").export(loaded, cal).summary["overflow_fix"]
    assert qdq_fix["mode"] == "auto" and list(qdq_fix["layers"]) == ["stem"]
    assert qdq_fix["layers"]["stem"]["remedy"] == "uint8 weights" and "saturat" in qdq_fix["layers"]["stem"]["why"]
    ov = exporter("openvino").export(loaded, cal).summary
    assert list(ov["overflow_fix"]["layers"]) == ["stem"] and ov["overflow_fix"]["layers"]["stem"]["remedy"] == "fp32"
    assert ov["fp32_layer_names"] == ["stem"] and ov["int8_layers"] == 1
    assert exporter("openvino").export(loaded, cal, weights_7bit="none").summary["overflow_fix"]["layers"] == {}
    every = exporter("qdq").export(loaded, cal, weights_7bit="all").summary["overflow_fix"]["layers"]
    assert {k: v["remedy"] for k, v in every.items()} == {"head": "7-bit weights", "stem": "7-bit weights"}


def test_openvino_keeps_the_stem_fp32_where_7bit_weights_would_cost_accuracy(calibrated):
    """The stem's 7-bit weights would add more noise than its int8 rounding: it stays FP32 (exact);
    an inner layer whose 7-bit weights cost little gets them (placement.SEVEN_BIT_COST)."""
    m, cal = calibrated
    fq = onnx.load_model_from_string(qtool.export(m, cal, target="openvino"))
    assert {n.input[0] for n in fq.graph.node if n.op_type in ("FakeQuantize", "Cast")} & {"x", "w1", "w1/int8"} == set()
    seven = onnx.load_model_from_string(qtool.export(m, cal, target="openvino", weights_7bit="first"))
    inits = {t.name: numpy_helper.to_array(t) for t in seven.graph.initializer}
    # the weights are stored in int8 (a Cast and a Mul by the scale): their largest code is the grid's end
    steps = {n.input[0].removesuffix("/int8"): int(np.abs(inits[n.input[0]]).max()) for n in seven.graph.node
             if n.op_type == "Cast" and n.input[0] in ("w1/int8", "w2/int8")}
    assert steps == {"w1": 63, "w2": 127}


def test_openvino_gives_7bit_weights_where_they_cost_little():
    """An inner layer (not reading the image) whose signed input is small but whose pairs of large
    weights saturate on any positive value: 7-bit weights add little noise there, so it gets them
    (the first layer's pairs have opposite signs: never at risk)."""
    from qtool.quantizers import placement

    w_a = (np.abs(RNG.standard_normal((16, 16, 1, 1))) * np.where(np.arange(16) % 2, -0.1, 0.1).reshape(1, 16, 1, 1)).astype(np.float32)
    w_b = np.full((8, 16, 1, 1), 0.5, np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["t"], name="a"), helper.make_node("Conv", ["t", "wb"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
                          [numpy_helper.from_array(w_a, "wa"), numpy_helper.from_array(w_b, "wb")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    small = RNG.uniform(-0.05, 0.05, 100000)
    t = np.where(RNG.random(100000) < 0.01, 0.9, small)
    records = {"x": _record(RNG.uniform(0, 0.4, 100000)), "t": _record(t)}
    plan = placement.place(m, records, overflow_remedy="7bit", rules=CPU)
    assert {k: v["remedy"] for k, v in plan.overflow["layers"].items()} == {"b": "7-bit weights"}
    assert {w.tensor: w.headroom_bits for w in plan.weights} == {"wa": 0, "wb": 1}
    assert placement.place(m, records, overflow_remedy="7bit", weights_7bit="none", rules=CPU).overflow["layers"] == {}


def test_export_says_which_layers_the_guard_changed(calibrated, tmp_path):
    from runcli import invoke

    m, cal = calibrated
    onnx.save(m, str(tmp_path / "m.onnx"))
    cal.model_path = "m.onnx"
    cal.save(str(tmp_path / "m.calib.json"))
    r = invoke("export", "--target", "openvino", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "m.fq.onnx")
    assert r.exit_code == 0 and "overflow guard: 1 layer(s) kept FP32 where int8 pair sums can saturate on CPUs without VNNI: stem" in r.output
    r = invoke("export", "--target", "qdq", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "m.qdq.onnx", "--weights-7bit", "none")
    assert r.exit_code == 0 and "overflow guard" not in r.output
