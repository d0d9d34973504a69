"""The overflow guard: layers whose u8 x s8 pair sums can saturate on CPUs without VNNI get
uint8 weights (qdq, exact) or weight steps widened just enough, an input held to 7-bit codes or an image's paired
input channels negated (openvino), every such layer int8; the rest keep their int8 weights as they are."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_openvino import compressed_weights
from test_saturation_estimate import _vpmaddubsw

import qtool
from qtool.calibration import TensorRecord
from qtool.provenance import unstamped
from qtool.quantizers import grids, overflow, policy
from qtool.targets import options_for
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
    act = grids.QParams(np.asarray(1 / 255), np.asarray(0), grids.grid(8, signed=False))
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
    act = grids.QParams(np.asarray(1 / 255), np.asarray(0), grids.grid(8, signed=False))
    q = np.full((8, 16, 3, 3), 127)
    sparse = np.where(RNG.random(100000) < 0.01, 0.9, 0.05)
    dims = {"w": list(q.shape)}
    together = overflow.assess(_conv(), 1, q, dims, _record(sparse), act, correlated=True).saturation
    apart = overflow.assess(_conv(), 1, q, dims, _record(sparse), act, correlated=False).saturation
    assert 0 < apart < together / 100


def test_signed_activations_count_from_the_shifted_code():
    """A signed activation is multiplied as q + 128: small positive values already saturate a pair of 127s."""
    act = grids.QParams(np.asarray(1 / 127), np.asarray(0), grids.grid(8, signed=True))
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
    act = grids.QParams(np.asarray(1 / 255), np.asarray(0), grids.grid(8, signed=False))
    q = np.full((16, 1, 3, 3), 127)
    assert overflow.assess(_conv(group=16), 1, q, {"w": list(q.shape)}, _record(np.ones(100)), act, True) is None


# ---------------------------------------------------------------- exports


def _image_model(channels: int = 4) -> onnx.ModelProto:
    """An image stem (4 channels, e.g. RGB + depth, -> 16, positive weights: a brightness detector)
    then a 16 -> 8 Conv whose neighbouring input channels have weights of opposite signs: the stem
    saturates without VNNI, the second Conv cannot. Its own seed: the same weights whatever ran
    before. With 4 input channels both of OpenVINO's pairs per kernel position share a sign."""
    rng = np.random.default_rng(1)
    w1 = (np.abs(rng.standard_normal((16, channels, 3, 3))) * 0.3 + 0.05).astype(np.float32)
    signs = np.where(np.arange(16) % 2 == 0, 1.0, -1.0).reshape(1, 16, 1, 1)
    w2 = (np.abs(rng.standard_normal((8, 16, 3, 3))) * 0.05 * signs).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="head", pads=[1, 1, 1, 1]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _images(n: int, seed: int, channels: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    grey = rng.uniform(0.5, 1.0, (n, 1, 16, 16))  # bright, channels moving together
    return np.clip(grey + rng.normal(0, 0.03, (n, channels, 16, 16)), 0, 1).astype(np.float32)


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
    assert list(ov["overflow_fix"]["layers"]) == ["stem"] and ov["overflow_fix"]["layers"]["stem"]["remedy"] == "pair-bounded weights"
    assert ov["fp32_layer_names"] == [] and ov["int8_layers"] == 2
    assert exporter("openvino").export(loaded, cal, options_for("openvino", weights_7bit="none")).summary["overflow_fix"]["layers"] == {}
    every = exporter("qdq").export(loaded, cal, options_for("qdq", weights_7bit="all")).summary["overflow_fix"]["layers"]
    assert {k: v["remedy"] for k, v in every.items()} == {"head": "7-bit weights", "stem": "7-bit weights"}


def _pair_sums(codes: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(exact, as vpmaddubsw adds them) sums of a 3x3 Conv (no padding) of u8 input codes [N, C, H, W]
    and s8 weights q [O, C, 3, 3], channels paired within a kernel position as oneDNN does (an odd
    count padded with a zero: overflow.reduction_rows)."""
    n, c, h, w = codes.shape
    patches = np.stack([codes[:, :, i:i + 3, j:j + 3] for i in range(h - 2) for j in range(w - 2)], axis=1)
    x = np.moveaxis(patches, 2, -1).reshape(-1, 9, c)  # [N * positions, kernel position, channel]
    x = np.pad(x, ((0, 0), (0, 0), (0, c % 2))).reshape(x.shape[0], -1).astype(np.int64)
    rows = overflow.reduction_rows(_conv(q.shape[0], c), 1, q, {"w": list(q.shape)}, "openvino")[0].astype(np.int64)
    return x @ rows.T, _vpmaddubsw(x, rows)


def test_openvino_keeps_a_stem_int8_where_widening_costs_more_than_its_noise(calibrated):
    """Widening the 4-channel stem's weight steps (all its pairs share a sign; an unsigned, padded
    input: no flip) adds more than its int8 rounding noise (placement.guard.WIDEN_COST): the stem
    stays int8, as NNCF runs it, its weights widened (not its input held to 7-bit codes, whose
    estimate misleads there) short of 7-bit weights, and OpenVINO computes what the file says."""
    from qtool.checks import simulate

    m, cal = calibrated
    data = qtool.export(m, cal, target="openvino")
    fq = onnx.load_model_from_string(data)
    assert "x" in {n.input[0] for n in fq.graph.node if n.op_type == "FakeQuantize"}
    vnni = compressed_weights(onnx.load_model_from_string(qtool.export(m, cal, target="openvino", cpu="vnni")))
    widened, full = compressed_weights(fq)["w1"], vnni["w1"]
    ratio = widened[1].ravel() / full[1].ravel()
    assert ratio.max() > 1.2 and np.abs(widened[0]).max() > 63  # steps widened, not 7-bit weights
    seven = onnx.load_model_from_string(qtool.export(m, cal, target="openvino", weights_7bit="first"))
    assert {k: int(np.abs(q.astype(np.int64)).max()) for k, (q, _) in compressed_weights(seven).items()} == {"w1": 63, "w2": 127}
    xs = _images(8, 2)
    real, exact = simulate.runtime("openvino", data), simulate.simulation(data)
    r, e = (np.concatenate([s.run(None, {"x": x[None]})[0] for x in xs]).astype(np.float64) for s in (real, exact))
    assert float(((r - e) ** 2).sum() / (e ** 2).sum()) < 1e-6


def test_openvino_holds_a_stems_input_to_7bit_codes_where_widening_its_weights_would_cost_more():
    """Widening the 3-channel stem's weight steps (its first two channels' weights pair with their own
    sign) would add more noise than a coarser input: the stem's input moves onto a u8 grid whose codes
    of the calibrated range are 0..127 (twice the step, a zero point), its weights keep their 8-bit
    steps, and no pair can pass int16: the kernel's pair sums are the exact ones, where the --cpu
    vnni file's saturate. OpenVINO on this CPU computes what the file says."""
    from qtool.checks import simulate

    m = _image_model(channels=3)
    xs = _images(40, 1, channels=3)
    cal = qtool.calibrate(m, data=({"x": x[None]} for x in xs[:32]))
    data = qtool.export(m, cal, target="openvino")
    codes = {}
    for name, p in (("any", onnx.load_model_from_string(data)),
                    ("vnni", onnx.load_model_from_string(qtool.export(m, cal, target="openvino", cpu="vnni")))):
        init = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
        fq = next(n for n in p.graph.node if n.op_type == "FakeQuantize" and n.input[0] == "x")
        lo, hi = float(init[fq.input[1]]), float(init[fq.input[2]])
        step = (hi - lo) / 255
        codes[name] = (np.clip(np.rint((xs[32:] - lo) / step), 0, 255), compressed_weights(p)["w1"][0].astype(np.int64))
    assert codes["any"][0].max() <= 128 < codes["vnni"][0].max()  # the input's codes, as the kernel multiplies them
    assert np.abs(codes["any"][1]).max() == 127 and np.array_equal(codes["any"][1], codes["vnni"][1])  # the same weights
    exact, kernel = _pair_sums(*codes["any"])
    np.testing.assert_array_equal(kernel, exact)
    exact, kernel = _pair_sums(*codes["vnni"])
    assert (kernel != exact).mean() > 0.1  # without the guard most of the stem's sums saturate on such a CPU
    real, sim = simulate.runtime("openvino", data), simulate.simulation(data)
    r, e = (np.concatenate([s.run(None, {"x": x[None]})[0] for x in xs[32:]]).astype(np.float64) for s in (real, sim))
    assert float(((r - e) ** 2).sum() / (e ** 2).sum()) < 1e-6


def _side_reader(m: onnx.ModelProto, channels: int = 4) -> onnx.ModelProto:
    """`m` whose input also feeds a 1x1 Conv whose neighbouring channels' weights alternate in sign
    (it cannot saturate), an output of its own: the stem's input is no longer the stem's alone."""
    side = (np.abs(RNG.standard_normal((2, channels, 1, 1))) * np.where(np.arange(channels) % 2, -1.0, 1.0).reshape(1, channels, 1, 1))
    m.graph.initializer.append(numpy_helper.from_array(side.astype(np.float32), "ws"))
    m.graph.node.append(helper.make_node("Conv", ["x", "ws"], ["s"], name="side"))
    m.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, 16, 16]))
    return m


def test_openvino_pairs_a_3_channel_stem_once_per_kernel_position(tmp_path):
    """OpenVINO's kernels pair channels within a kernel position, the third of an RGB stem with a
    zero: of each position's three same-sign weights only the first two can saturate, so the stem
    stays int8 with its steps widened for that pair (a 4-channel stem, both pairs at risk, stays
    FP32: test above), and OpenVINO on this CPU computes what the file says. onnxruntime's MLAS
    pairs across kernel positions too: the QDQ file stores the stem as uint8 as before."""
    import avx2

    from qtool.checks import simulate
    from qtool.targets import exporter

    # its input also read by another layer: no 7-bit input (which the stem alone would take, test below), widened weights
    m = _side_reader(_image_model(channels=3), channels=3)
    xs = _images(40, 1, channels=3)
    cal = qtool.calibrate(m, data=({"x": x[None]} for x in xs[:32]))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    loaded = qtool.api._checked(str(path), cal)
    fixes = exporter("openvino").export(loaded, cal).summary["overflow_fix"]["layers"]
    assert {k: v["remedy"] for k, v in fixes.items()} == {"stem": "pair-bounded weights"}
    assert exporter("qdq").export(loaded, cal).summary["overflow_fix"]["layers"]["stem"]["remedy"] == "uint8 weights"
    noise = {}
    for cpu in ("any", "vnni"):
        data = qtool.export(m, cal, target="openvino", cpu=cpu)
        real, exact = simulate.runtime("openvino", data), simulate.simulation(data)
        r, e = (np.concatenate([s.run(None, {"x": x[None]})[0] for x in xs[32:]]).astype(np.float64) for s in (real, exact))
        noise[cpu] = float(((r - e) ** 2).sum() / (e ** 2).sum())
    assert noise["any"] < 1e-6, noise  # float rounding (measured 3e-9)
    if avx2.host_is_avx2_only():
        assert noise["vnni"] > 1e-4, noise  # the unguarded stem saturates (measured 6e-4)
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    w = np.ones((1, 3, 1, 2))
    assert [r.tolist() for r in overflow.reduction_rows(conv, 1, w, {"w": [1, 3, 1, 2]}, "openvino")] == [[[1, 1, 1, 0] * 2]]
    # one pair of two per position: the step widens to 2 * 255 / (32767 - 255) of |w|, not 7-bit weights' 2 / 127
    assert overflow.pair_step(overflow.reduction_rows(conv, 1, w, {"w": [1, 3, 1, 2]}, "openvino")[0])[0] == 2 * 255 / (32767 - 255)


def test_openvino_widens_only_the_channels_whose_pairs_can_saturate():
    """An inner layer whose pairs of large same-sign weights saturate on large codes: OpenVINO's
    remedy keeps it int8 and widens the weight step of those output channels only, just enough
    (channels whose neighbouring weights alternate in sign keep theirs). Its input also feeds a Conv
    that cannot saturate ("c"), so a 7-bit input is no remedy here."""
    from qtool.quantizers import placement

    alternating = np.where(np.arange(16) % 2, -1, 1).reshape(1, 16, 1, 1)
    w_a = (np.abs(RNG.standard_normal((16, 16, 1, 1))) * 0.1 * alternating).astype(np.float32)
    w_b = RNG.uniform(0.2, 0.5, (8, 16, 1, 1)).astype(np.float32)
    w_b[4:] *= alternating  # alternating signs: no pair can saturate
    w_c = (RNG.uniform(0.2, 0.5, (2, 16, 1, 1)) * alternating).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["t"], name="a"), helper.make_node("Conv", ["t", "wb"], ["y"], name="b"),
             helper.make_node("Conv", ["t", "wc"], ["z"], name="c")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [numpy_helper.from_array(w_a, "wa"), numpy_helper.from_array(w_b, "wb"), numpy_helper.from_array(w_c, "wc")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    t = RNG.uniform(0, 1, 100000)
    records = {"x": _record(RNG.uniform(0, 0.4, 100000)), "t": _record(t)}
    plan = placement.place(m, records, overflow_remedy="pairs", rules=CPU)
    assert {k: v["remedy"] for k, v in plan.overflow["layers"].items()} == {"b": "pair-bounded weights"}
    wb = next(w for w in plan.weights if w.tensor == "wb")
    codes = np.abs(policy.quantize(w_b, wb.params())).reshape(8, 16)
    plain = np.abs(w_b).reshape(8, 16).max(axis=1) / 127
    scale = np.asarray(wb.params().scale).reshape(-1)
    assert (scale[:4] > plain[:4] * 1.2).all() and np.allclose(scale[4:], plain[4:])
    bound = overflow.pair_step(w_b.reshape(8, 16)[:4].astype(np.float64))  # where no pair can saturate
    assert (scale[:4] <= bound * (1 + 1e-9)).all()  # never past the bound: only as far as the expected noise asks
    pairs = codes[:4, 0::2] + codes[:4, 1::2]
    before = np.abs(policy.quantize(w_b, policy.weight_params(w_b, 0))).reshape(8, 16)[:4]
    assert pairs.max() < (before[:, 0::2] + before[:, 1::2]).max()
    assert placement.place(m, records, choices=placement.Choices(weights_7bit="none"), overflow_remedy="pairs", rules=CPU).overflow["layers"] == {}


def test_pair_bound_keeps_every_same_sign_pair_within_int16():
    """Quantized on the step pair_step (or the 8-bit one where larger), no same-sign pair of codes times the largest codes
    its input channels reach passes 32767; rows without same-sign pairs ask for nothing."""
    w = RNG.standard_normal((64, 33))
    w[0] = np.where(np.arange(33) % 2, -1.0, 1.0) * np.abs(w[0])
    for codes in (None, RNG.integers(0, 256, 33).astype(np.float64)):
        step = overflow.pair_step(w, codes)
        assert step[0] == 0
        amax = np.maximum(np.abs(w).max(axis=1), 127 * step)
        q = np.rint(w / (amax[:, None] / 127))
        a = np.full(33, 255.0) if codes is None else codes
        qa, wa = np.concatenate([q, np.zeros((64, 1))], axis=1), np.concatenate([a, [0]])
        sums = np.abs(qa[:, 0::2]) * wa[0::2] + np.abs(qa[:, 1::2]) * wa[1::2]
        same = qa[:, 0::2] * qa[:, 1::2] > 0
        assert sums[same].max() <= overflow.LIMIT


def _chain(seed: int = 3):
    """x -> 1x1 Conv (identity: no pair at risk) -> Relu -> 1x1 Conv of Gaussian weights: the second
    layer's independent u8 inputs saturate its pairs without VNNI."""
    rng = np.random.default_rng(seed)
    c = 64
    wa = np.eye(c, dtype=np.float32).reshape(c, c, 1, 1)
    wb = (rng.standard_normal((16, c, 1, 1)) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["t0"], name="a"), helper.make_node("Relu", ["t0"], ["t"], name="r"),
             helper.make_node("Conv", ["t", "wb"], ["y"], name="b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])],
                          [numpy_helper.from_array(wa, "wa"), numpy_helper.from_array(wb, "wb")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m, rng.uniform(0, 1, (40, 1, c, 4, 4)).astype(np.float32)


def test_openvino_default_export_runs_exactly_where_the_vnni_export_saturates():
    """OpenVINO on this CPU runs the default export (--cpu any) as its exact simulation, every layer
    int8; the --cpu vnni file has no guard (the same bytes as --weights-7bit none), and on a CPU
    without VNNI OpenVINO's int8 convolution saturates it."""
    import avx2

    from qtool.checks import simulate

    m, xs = _chain()
    cal = qtool.calibrate(m, data=({"x": x} for x in xs[:32]))
    default = qtool.export(m, cal, target="openvino")
    vnni = qtool.export(m, cal, target="openvino", cpu="vnni")
    # the writer's bytes (the provenance records the flags given)
    assert unstamped(vnni) == unstamped(qtool.export(m, cal, target="openvino", weights_7bit="none")) != unstamped(default)
    gaps = {}
    for name, data in (("any", default), ("vnni", vnni)):
        real, exact = simulate.runtime("openvino", data), simulate.simulation(data)
        gaps[name] = max(float(np.abs(real.run(None, {"x": x})[0] - exact.run(None, {"x": x})[0]).max()) for x in xs[32:])
    assert gaps["any"] < 1e-4, gaps
    if avx2.host_is_avx2_only():
        assert gaps["vnni"] > 0.01, gaps


def test_cpu_option_in_the_summary_api_and_command_line(tmp_path):
    from runcli import invoke

    from qtool.targets import exporter

    m, xs = _chain()
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    cal = qtool.calibrate(m, data=({"x": x} for x in xs[:32]))
    loaded = qtool.api._checked(str(path), cal)
    summary = exporter("openvino").export(loaded, cal).summary
    assert summary["cpu"] == "any" and summary["int8_layers"] == 2 and list(summary["overflow_fix"]["layers"]) == ["b"]
    summary = exporter("qdq").export(loaded, cal, options_for("qdq", cpu="vnni")).summary
    assert summary["cpu"] == "vnni" and "overflow_fix" not in summary
    assert exporter("openvino").export(loaded, cal, options_for("openvino", cpu="vnni", weights_7bit="all")).summary["overflow_fix"]["mode"] == "all"
    cal.model_path = "m.onnx"
    cal.save(str(tmp_path / "m.calib.json"))
    data = tmp_path / "held"
    data.mkdir()
    for i, x in enumerate(xs[32:]):
        np.save(data / f"{i}.npy", x)
    r = invoke("export", "--target", "openvino", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "a.onnx")
    assert r.exit_code == 0 and ("overflow guard: 1 layer(s) int8 with the input's codes held to 0..127 (twice its step) where int8 "
                                 "pair sums can saturate on CPUs without VNNI: b") in r.output
    r = invoke("export", "--target", "openvino", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "v.onnx", "--cpu", "vnni", "--json")
    assert r.exit_code == 0 and '"cpu": "vnni"' in r.output
    assert "overflow guard" not in r.output
    r = invoke("export", "--target", "tensorrt", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "t.onnx", "--cpu", "vnni")
    assert r.exit_code == 2 and "--cpu applies to --target openvino or qdq" in r.output
    scores = {}
    for cpu in ("any", "vnni"):
        r = invoke("evaluate", path, "--calib", tmp_path / "m.calib.json", "--data", data, "--target", "openvino", "--cpu", cpu, "--json")
        assert r.exit_code == 0, r.output
        scores[cpu] = r.stdout
    assert scores["any"] != scores["vnni"]  # each scores the file its choice writes


def test_export_says_which_layers_the_guard_changed(calibrated, tmp_path):
    from runcli import invoke

    m, cal = calibrated
    onnx.save(m, str(tmp_path / "m.onnx"))
    cal.model_path = "m.onnx"
    cal.save(str(tmp_path / "m.calib.json"))
    r = invoke("export", "--target", "openvino", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "m.fq.onnx")
    assert r.exit_code == 0 and ("overflow guard: 1 layer(s) int8 with weight steps widened just enough where int8 pair sums can "
                                 "saturate on CPUs without VNNI: stem") in r.output
    r = invoke("export", "--target", "qdq", "--calib", tmp_path / "m.calib.json", "-o", tmp_path / "m.qdq.onnx", "--weights-7bit", "none")
    assert r.exit_code == 0 and "overflow guard" not in r.output


def test_matmul_of_two_activations_saturates_only_with_large_codes_on_both_sides():
    """A's u8 codes times B's s8 codes: B within [-64, 64] cannot pass int16 (255 x 64 x 2 < 32767);
    large codes on both sides do; small A codes never (127 x 127 x 2 < 32767)."""
    unsigned = grids.QParams(np.asarray(1 / 255), np.asarray(0), grids.grid(8, signed=False))
    signed = grids.QParams(np.asarray(1 / 127), np.asarray(0), grids.grid(8, signed=True))
    big_a, small_a = _record(RNG.uniform(0.9, 1.0, 10000)), _record(RNG.uniform(0, 0.45, 10000))
    big_b, small_b = _record(RNG.uniform(-1, 1, 10000)), _record(RNG.uniform(-0.5, 0.5, 10000))
    assert overflow.assess_activations(big_a, unsigned, big_b, signed).saturation > 0.1 * overflow.assess_activations(
        big_a, unsigned, big_b, signed).noise
    assert overflow.assess_activations(big_a, unsigned, small_b, signed).saturation == 0
    assert overflow.assess_activations(small_a, unsigned, big_b, signed).saturation == 0
    assert overflow.assess_activations(big_a, unsigned, big_b, unsigned) is None  # an unsigned B is not the s8 side


def test_a_matmul_of_two_activations_that_can_saturate_stays_fp32_for_any_cpu():
    from qtool.quantizers import placement

    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="qk")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 16]),
                                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [16, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    b = _record(RNG.uniform(-1, 1, 10000))
    for a, guarded in ((RNG.uniform(0.9, 1.0, 10000), True), (RNG.uniform(-1.0, 0.0, 10000), False)):  # A <= 0: codes <= 128
        records = {"a": _record(a), "b": b}
        plan = placement.place(m, records, overflow_remedy="pairs", rules=CPU)
        assert (plan.int8_layers, list(plan.overflow["layers"])) == (([], ["qk"]) if guarded else (["qk"], []))
        assert placement.place(m, records, rules=CPU).int8_layers == ["qk"]  # no guard (--cpu vnni)


def _cut(model: onnx.ModelProto, tensor: str) -> bytes:
    """The part of `model` that computes `tensor`, with it as the only output."""
    want, nodes = {tensor}, []
    for n in reversed(list(model.graph.node)):
        if any(o in want for o in n.output):
            nodes.insert(0, n)
            want |= set(n.input)
    g = helper.make_graph(nodes, "cut", list(model.graph.input), [helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None)],
                          [i for i in model.graph.initializer if i.name in want])
    return helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version).SerializeToString()


@pytest.mark.parametrize("target,runtime", [("openvino", "openvino"), ("qdq", "onnxruntime")])
def test_a_vit_block_runs_as_its_exact_arithmetic_on_this_cpu(target, runtime, tmp_path):
    """The ViT-like block (patch Conv, attention, MLP, head): every pair the default file leaves int8,
    Q.K^T included, stays within int16, so the runtime on this CPU gives the simulation's output;
    the --cpu vnni file, on a CPU without VNNI, does not (15-25 dB against FP32 instead of 42).
    But one layer by design: OpenVINO's patch embedding, its channels flipped and its weight steps
    widened only as far as the saturation noise left (counted twice) pays for the widening's rounding
    noise. On a CPU without VNNI that layer's saturation must be what the guard weighed, in dB of the
    noise it weighs against (overflow.assess: K E[q^2] / 12 + sum(w^2) / 12, the layer's rounding noise
    without bias correction: measured at its output in the --cpu vnni --no-bias-correction file),
    on the calibration inputs the estimate read: weighed -17.0 dB, measured -16.6 (the lead's -6.4 was
    against the input's rounding noise alone; the noise the file has, bias-corrected, is 5 dB below
    this yardstick). Downstream any difference there flips codes: the output's SQNR on these 8 inputs
    then moves by up to +-0.8 dB whatever the difference's size (a Gaussian one 40 dB weaker moved it
    -0.44 dB), so the rest of the file is checked exact with that layer kept FP32."""
    import re

    import avx2
    from test_openvino import transformer_block

    from qtool.checks import simulate

    m = transformer_block()
    xs = np.random.default_rng(0).uniform(0, 1, (40, 1, 3, 32, 32)).astype(np.float32)
    cal = qtool.calibrate(m, data=({"x": x} for x in xs[:32]))
    fp32 = simulate.simulation(m.SerializeToString())
    ref = np.concatenate([fp32.run(None, {"x": x})[0] for x in xs[32:]]).astype(np.float64)

    def sqnr(data: bytes, session) -> float:
        out = np.concatenate([session(data).run(None, {"x": x})[0] for x in xs[32:]]).astype(np.float64)
        return float(10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum()))

    def run(d):
        return simulate.runtime(runtime, d)

    cal.save(tmp_path / "m.calib.json")
    onnx.save(m, tmp_path / "m.onnx")
    written = qtool.api.export_file(tmp_path / "m.onnx", target=target, calib=tmp_path / "m.calib.json", output=tmp_path / "d.onnx")
    default, vnni = (tmp_path / "d.onnx").read_bytes(), qtool.export(m, cal, target=target, cpu="vnni")
    exact = sqnr(default, simulate.simulation)
    assert exact > 35 and sqnr(vnni, simulate.simulation) > exact - 1  # the guard costs the exact arithmetic under 1 dB here
    left = {name: float(found[-1]) for name, fix in written.overflow_fix["layers"].items()
            if (found := re.findall(r"(-?\d+\.\d) dB of saturation left", fix["why"]))}
    assert set(left) == ({"/patch/Conv"} if target == "openvino" else set()), written.overflow_fix
    if not avx2.host_is_avx2_only() or not left:
        assert abs(sqnr(default, run) - exact) < 0.1, (sqnr(default, run), exact)
    if not avx2.host_is_avx2_only():
        return
    assert sqnr(vnni, run) < exact - 10
    if not left:
        return
    conv = "/patch/Conv_output_0"
    yardstick = qtool.export(m, cal, target=target, cpu="vnni", bias_correction=False)
    cut, plain, float_cut = _cut(onnx.load_from_string(default), conv), _cut(onnx.load_from_string(yardstick), conv), _cut(m, conv)
    sessions = (run(cut), simulate.simulation(cut), simulate.simulation(plain), simulate.simulation(float_cut))
    sums = np.zeros(2)
    for x in xs[:32]:
        a, e, p, f = (np.asarray(s.run(None, {"x": x})[0], np.float64) for s in sessions)
        sums += [((a - e) ** 2).sum(), ((p - f) ** 2).sum()]
    measured = 10 * np.log10(sums[0] / sums[1])
    assert abs(measured - left["/patch/Conv"]) < 2, (measured, left)
    rest = qtool.export(m, cal, target=target, exclude=["/patch/Conv"])
    assert abs(sqnr(rest, run) - sqnr(rest, simulate.simulation)) < 0.1  # no other layer saturates


def test_seven_bit_input_cost_comes_from_the_inputs_own_values():
    """The noise a 7-bit input adds is the input's rounding error at both steps, from its histogram
    (times sum(q^2) of the integer weights): for values spread evenly, about (255/127)^2 - 1 times
    sum(q^2) / 12; for values sitting on the 7-bit grid's own levels (a two-tone image, text on a
    white page), next to nothing."""
    from qtool.quantizers.placement import guard
    from qtool.quantizers.quantizer import Quantizer, Range

    w = RNG.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    wsite = Quantizer.weight("w", TensorProto.FLOAT, 0, 0, w, [("conv", 1)])
    q = policy.quantize(w, wsite.params()).astype(np.float64)
    site = Quantizer.activation("x", TensorProto.FLOAT, Range(1.0, True), [("conv", 0)], [])
    risk = overflow.Risk(0.0, 0.0, 0.0, 0.0, float((q ** 2).sum()))
    spread = guard._seven_bit_input(site, _record(RNG.uniform(0, 1, 200000)), risk)
    assert spread == pytest.approx(((255 / 127) ** 2 - 1) * (q ** 2).sum() / 12, rel=0.05)
    two_tone = guard._seven_bit_input(site, _record(RNG.choice([0.0, 1.0], 200000)), risk)
    assert two_tone < 0.01 * spread
    seven = policy.seven_bit_codes(site.params())  # [0, 1] on codes 0..127: 1.0 on the grid, codes <= 127
    assert seven.zero_point == 0 and np.rint(1.0 / float(seven.scale)) == 127
    signed = policy.seven_bit_codes(Quantizer.activation("x", TensorProto.FLOAT, Range(1.0, False), [], []).params())
    codes = np.rint(np.array([-128 / 127, 0.0, 1.0]) / float(signed.scale)) + int(signed.zero_point)
    assert codes.min() >= 0 and codes.max() <= 128 and codes[1] == signed.zero_point  # zero on the grid, the range on 0..128


def _coloured_stem(layout: str = "nchw", shift: float = 0.0) -> tuple[onnx.ModelProto, np.ndarray]:
    """A 3-channel stem (no padding) on signed images whose channel 0 runs brighter than channel
    1: its even output channels add all three channels (a brightness detector), its odd ones take
    channel 1 from channel 0 (a colour detector), all weights near the largest int8 code. The
    first pair of channels shares a sign in the even outputs and not in the odd ones; the head's
    pairs cannot saturate (alternating signs). "nhwc": the
    images channel-last, a Transpose before the stem (as MTCNN's). `shift` moves the images' values
    (an asymmetric range: an asymmetric input grid)."""
    rng = np.random.default_rng(11)
    w = np.abs(rng.normal(1.0, 0.05, (8, 3, 3, 3)))
    w[1::2, 1] *= -1
    # the head's neighbouring input channels take weights of opposite signs: no pair of it can saturate on any CPU
    head = np.abs(rng.standard_normal((4, 8, 1, 1))) * 0.1 * np.where(np.arange(8) % 2, -1.0, 1.0).reshape(1, 8, 1, 1)
    nchw = layout == "nchw"
    nodes = [helper.make_node("Conv", ["x" if nchw else "xt", "w1"], ["c1"], name="stem"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"), helper.make_node("Conv", ["r1", "w2"], ["y"], name="head")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H2", "W2"])]
    if not nchw:
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["xt"], name="to_nchw", perm=[0, 3, 1, 2]))
    shape = ["N", 3, "H", "W"] if nchw else ["N", "H", "W", 3]  # dynamic, as real models' inputs
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], outputs,
                          [numpy_helper.from_array(w.astype(np.float32), "w1"), numpy_helper.from_array(head.astype(np.float32), "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    base = rng.uniform(-0.7, 0.7, (48, 1, 1, 12, 12)) + rng.normal(0, 0.05, (48, 1, 3, 12, 12))
    xs = (np.clip(base + np.array([0.3, -0.3, 0.0]).reshape(1, 1, 3, 1, 1), -1, 1) + shift).astype(np.float32)
    return m, (xs if nchw else np.ascontiguousarray(xs.transpose(0, 1, 3, 4, 2)))


@pytest.mark.parametrize("layout, shift", [("nchw", 0.0), ("nhwc", 0.0), ("nchw", 0.8)])
def test_openvino_flips_the_input_channel_whose_pairs_leave_no_saturation(tmp_path, layout, shift):
    """Without VNNI, oneDNN adds channels 0 and 1 of a stem's input in one int16. Negating one of
    them (and its weights) makes the brightness detector's pairs opposite in sign; which one decides
    the colour detector's: negating channel 1 pairs bright channel-0 codes with the negated dark
    channel 1 (both large), negating channel 0 pairs two small codes. The guard reads that from
    calibration's joint histograms of the pair: channel 0 is negated, the stem keeps its 8-bit
    weights (the --cpu vnni file's, channel 0 negated) and input grid, its pair sums on held-out
    images are the exact ones, where negating channel 1 would saturate, and it computes what the
    --cpu vnni file's stem does. On an asymmetric grid (shifted images) channel 0 becomes
    offset - x, offset = input_low + input_high, and the bias takes the offset's share. OpenVINO
    on this CPU computes what the file says (channel-last images too: the signs before their
    Transpose)."""
    from qtool.checks import simulate
    from qtool.targets import exporter

    m, xs = _coloured_stem(layout, shift)
    cal = qtool.calibrate(m, data=({"x": x} for x in xs[:32]))
    stats = {t.name: t for t in cal.tensors}["x" if layout == "nchw" else "xt"].stats
    assert stats.pairs is not None and stats.pairs.pair_count() == 1 and stats.pairs.counts.sum() == 32 * 144
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    result = exporter("openvino").export(qtool.api._checked(str(path), cal), cal)
    assert result.summary["overflow_fix"]["layers"]["stem"]["remedy"] == "flipped input channels"
    data = qtool.export(m, cal, target="openvino")
    p = onnx.load_model_from_string(data)
    init = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    flip = next(n for n in p.graph.node if n.op_type == "Mul" and n.input[0] == "x")
    signs = init[next(n for n in p.graph.node if n.op_type == "Cast" and n.output[0] == flip.input[1]).input[0]]
    assert signs.dtype == np.int8 and signs.ravel().tolist() == [-1, 1, 1]
    assert signs.shape == ((1, 1, 1, 3) if layout == "nhwc" else (1, 3, 1, 1))
    shifted = next((n for n in p.graph.node if n.op_type == "Add" and n.input[0] == flip.output[0]), None)
    fq = next(n for n in p.graph.node if n.op_type == "FakeQuantize" and n.input[0] == (shifted or flip).output[0])
    lo, hi = float(init[fq.input[1]]), float(init[fq.input[2]])
    vnni_data = qtool.export(m, cal, target="openvino", cpu="vnni")
    vnni = onnx.load_model_from_string(vnni_data)
    vnni_init = {t.name: numpy_helper.to_array(t) for t in vnni.graph.initializer}
    vnni_fq = next(n for n in vnni.graph.node if n.op_type == "FakeQuantize" and n.input[0] == "x")
    assert (float(vnni_init[vnni_fq.input[1]]), float(vnni_init[vnni_fq.input[2]])) == (lo, hi)  # the input's own 8-bit grid
    if shift:  # asymmetric: offset - x on the negated channel
        assert abs(lo + hi) > 0.5 and init[shifted.input[1]].ravel().tolist() == pytest.approx([lo + hi, 0.0, 0.0])
    else:  # symmetric: -x lands on -code
        assert shifted is None and lo == pytest.approx(-hi * 128 / 127)
    q, q_vnni = compressed_weights(p)["w1"][0].astype(np.int64), compressed_weights(vnni)["w1"][0].astype(np.int64)
    np.testing.assert_array_equal(q, q_vnni * np.array([-1, 1, 1]).reshape(1, 3, 1, 1))  # 8-bit steps kept
    held = (xs[32:, 0] if layout == "nchw" else xs[32:, 0].transpose(0, 3, 1, 2)).astype(np.float64)
    step, offset = (hi - lo) / 255, (lo + hi if shift else 0.0)

    def codes(negated):
        x = held.copy()
        x[:, negated] = offset - x[:, negated]
        return np.clip(np.rint((x - lo) / step), 0, 255)

    exact, kernel = _pair_sums(codes(0), q)
    np.testing.assert_array_equal(kernel, exact)
    exact, kernel = _pair_sums(codes(1), q_vnni * np.array([1, -1, 1]).reshape(1, 3, 1, 1))
    assert (kernel != exact).any()  # the other channel would have saturated
    exact, kernel = _pair_sums(np.clip(np.rint((held - lo) / step), 0, 255), q_vnni)
    assert (kernel != exact).mean() > 0.05  # as they are, the brightness detector saturates
    real, sim = simulate.runtime("openvino", data), simulate.simulation(data)
    r, e = (np.concatenate([s.run(None, {"x": x})[0] for x in xs[32:]]).astype(np.float64) for s in (real, sim))
    assert float(((r - e) ** 2).sum() / (e ** 2).sum()) < 1e-6
    stems = []  # the stem's output in each file's exact arithmetic
    for proto in (p, vnni):
        proto.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, None))
        stem = simulate.simulation(proto.SerializeToString())
        stems.append(np.concatenate([stem.run(["c1"], {"x": x})[0] for x in xs[32:]]).astype(np.float64))
    assert float(((stems[0] - stems[1]) ** 2).sum() / (stems[1] ** 2).sum()) < 1e-9  # what the unguarded file's stem computes


def test_openvino_flips_a_caffe_stem_behind_an_explicit_zero_pad(tmp_path):
    """Caffe models converted to ONNX (open_nsfw's ResNet-50-thin) feed their stem through Casts, an explicit
    zero Pad and a Transpose of the NHWC image: negating a channel commutes with all three, so the guard flips
    it there as on a bare input (it widened 54 of 64 output channels' steps there before, 5 dB of the model's
    35), and OpenVINO computes what the file says."""
    from qtool.checks import simulate
    from qtool.targets import exporter

    m, xs = _coloured_stem("nhwc")
    g = m.graph
    pads = numpy_helper.from_array(np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64), "pads")
    g.initializer.append(pads)
    head = [helper.make_node("Cast", ["x"], ["x_cast"], name="cast_in", to=TensorProto.FLOAT),
            helper.make_node("Pad", ["x_cast", "pads"], ["x_pad"], name="pad"),
            helper.make_node("Cast", ["x_pad"], ["x_pad_cast"], name="cast_pad", to=TensorProto.FLOAT)]
    transpose = next(n for n in g.node if n.op_type == "Transpose")
    transpose.input[0] = "x_pad_cast"
    nodes = head + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    cal = qtool.calibrate(m, data=({"x": x} for x in xs[:32]))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    result = exporter("openvino").export(qtool.api._checked(str(path), cal), cal)
    assert result.summary["overflow_fix"]["layers"]["stem"]["remedy"] == "flipped input channels"
    data = qtool.export(m, cal, target="openvino")
    real, sim = simulate.runtime("openvino", data), simulate.simulation(data)
    r, e = (np.concatenate([s.run(None, {"x": x})[0] for x in xs[32:]]).astype(np.float64) for s in (real, sim))
    assert float(((r - e) ** 2).sum() / (e ** 2).sum()) < 1e-6


def test_openvino_flips_a_padded_stem_on_an_asymmetric_grid(tmp_path):
    """A torchvision ResNet's stem (anime-or-not's ResNet-18) pads an ImageNet-normalised image, whose range
    (-2.1 .. 2.6) takes the asymmetric input grid. Negating a channel there is offset - x, and the Conv's own
    padding (zeros) would stand for offset on that channel: the writer pads the input explicitly before the flip
    (a padded 0 becomes offset like every other 0 of the channel) and takes the pads off the Conv. The stem keeps
    its 8-bit weights and input grid instead of widening its weight steps (anime-or-not: 25.6 -> 31.0 dB,
    --cpu vnni 30.7), computes exactly what the --cpu vnni file's stem does, its pair sums on held-out images
    (the border too) are the exact ones on an AVX2 CPU, and OpenVINO on this CPU computes what the file says."""
    from zoo import imagenet_images, imagenet_stem_like

    from qtool.checks import simulate
    from qtool.model import graph as G
    from qtool.targets import exporter

    m, xs = imagenet_stem_like(), imagenet_images(48)
    cal = qtool.calibrate(m, data=({"input": x} for x in xs[:32]))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    result = exporter("openvino").export(qtool.api._checked(str(path), cal), cal)
    assert result.summary["overflow_fix"]["layers"]["Conv_0"]["remedy"] == "flipped input channels"
    data = qtool.export(m, cal, target="openvino")
    p = onnx.load_model_from_string(data)
    init = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    pad = next(n for n in p.graph.node if n.op_type == "Pad" and n.input[0] == "input")
    assert list(G.attr(pad, "pads")) == [0, 0, 3, 3, 0, 0, 3, 3] and float(G.attr(pad, "value", 0.0)) == 0.0  # opset 10
    assert list(G.attr(next(n for n in p.graph.node if n.name == "Conv_0"), "pads")) == [0, 0, 0, 0]
    flip = next(n for n in p.graph.node if n.op_type == "Mul" and n.input[0] == pad.output[0])
    shifted = next(n for n in p.graph.node if n.op_type == "Add" and n.input[0] == flip.output[0])
    fq = next(n for n in p.graph.node if n.op_type == "FakeQuantize" and n.input[0] == shifted.output[0])
    lo, hi = float(init[fq.input[1]]), float(init[fq.input[2]])
    assert lo < -2 and hi > 2.5 and init[shifted.input[1]].ravel().tolist() == pytest.approx([lo + hi, 0.0, 0.0])
    vnni = onnx.load_model_from_string(qtool.export(m, cal, target="openvino", cpu="vnni"))
    q, q_vnni = compressed_weights(p)["conv1.weight"][0].astype(np.int64), compressed_weights(vnni)["conv1.weight"][0].astype(np.int64)
    np.testing.assert_array_equal(q, q_vnni * np.array([-1, 1, 1]).reshape(1, 3, 1, 1))  # 8-bit steps kept
    stems = []  # the stem's output in each file's exact arithmetic
    for proto in (p, vnni):
        proto.graph.output.append(helper.make_tensor_value_info("c1", TensorProto.FLOAT, ["N", 8, 16, 16]))
        stem = simulate.simulation(proto.SerializeToString())
        stems.append(np.concatenate([stem.run(["c1"], {"input": x})[0] for x in xs[32:]]).astype(np.float64))
    assert float(((stems[0] - stems[1]) ** 2).sum() / (stems[1] ** 2).sum()) < 1e-9  # what the unguarded file's stem computes
    # the padded codes as the int8 kernel reads them, stride 1 (every position the stride-2 stem reads, and more)
    step = (hi - lo) / 255
    held = np.pad(xs[32:, 0].astype(np.float64), ((0, 0), (0, 0), (3, 3), (3, 3)))
    rows = overflow.reduction_rows(_conv(8, 3), 1, q, {"w": list(q.shape)}, "openvino")[0].astype(np.int64)

    def saturated(x, rows):  # the share of the stem's pair-sum power vpmaddubsw loses
        codes = np.clip(np.rint((x - lo) / step), 0, 255).astype(np.int64)
        size = codes.shape[-1] - 6
        patches = np.stack([codes[:, :, i:i + 7, j:j + 7] for i in range(size) for j in range(size)], axis=1)
        rx = np.pad(np.moveaxis(patches, 2, -1).reshape(-1, 49, 3), ((0, 0), (0, 0), (0, 1))).reshape(-1, 49 * 4)
        exact = (rx @ rows.T).astype(np.float64)
        return float(((_vpmaddubsw(rx, rows) - exact) ** 2).sum() / (exact ** 2).sum())

    flipped = held.copy()
    flipped[:, 0] = lo + hi - flipped[:, 0]  # the border too: a padded 0 becomes the offset
    as_they_are = saturated(held, rows * np.tile([-1, 1, 1, 1], 49))
    assert saturated(flipped, rows) < 1e-4 * as_they_are and as_they_are > 1e-3, (saturated(flipped, rows), as_they_are)
    real, sim = simulate.runtime("openvino", data), simulate.simulation(data)
    r, e = (np.concatenate([s.run(None, {"input": x})[0] for x in xs[32:]]).astype(np.float64) for s in (real, sim))
    assert float(((r - e) ** 2).sum() / (e ** 2).sum()) < 1e-6
