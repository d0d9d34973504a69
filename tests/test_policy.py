"""Quantization policies (qtool.quantizers.policy): rounding, power-of-two scales, bit widths, rule files,
and the exports that runtimes run with them."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from runcli import invoke
from test_openvino import IMAGES, SAMPLE, calibrate, heldout, ok, ort_run, ov_compile, ov_exact

from qtool import calibration, model
from qtool.errors import QtoolError
from qtool.provenance import unstamped
from qtool.quantizers import cpu_kinds, grids, policy
from qtool.targets import options_for, qdq

# ----------------------------------------------------------------------------- the maths

@pytest.mark.parametrize("mode,expected", [
    ("half-even", [-2, -2, -1, -0, 0, 1, 2, 2, 3]),
    ("half-up", [-2, -1, -1, 0, 1, 1, 2, 3, 3]),
    ("half-down", [-3, -2, -1, -1, 0, 1, 1, 2, 3]),
    ("half-away", [-3, -2, -1, -1, 1, 1, 2, 3, 3]),
    ("toward-zero", [-2, -1, -1, 0, 0, 1, 1, 2, 2]),
    ("up", [-2, -1, -1, 0, 1, 2, 2, 3, 3]),
    ("down", [-3, -2, -2, -1, 0, 1, 1, 2, 2]),
])
def test_rounding_modes_on_hand_worked_values(mode, expected):
    x = np.array([-2.5, -1.5, -1.2, -0.5, 0.5, 1.2, 1.5, 2.5, 2.7])
    assert policy.round_values(x, mode).tolist() == expected


def test_pow2_scales_are_exact_powers_of_two_and_never_clip_more():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)) * rng.uniform(0.01, 3, (16, 1, 1, 1))
    flt = policy.weight_params(w, 0, policy.WEIGHTS)
    p2 = policy.weight_params(w, 0, policy.Policy(signed=True, per_channel=True, scale="pow2"))
    assert policy.is_pow2(p2.scale) and policy.is_pow2(np.float32(p2.scale)) and not policy.is_pow2(flt.scale)
    assert np.all(p2.scale >= flt.scale) and np.all(p2.scale < 2 * flt.scale)
    assert np.all(np.abs(p2.input_high) >= np.abs(w).max(axis=(1, 2, 3)))  # the range still holds every weight
    for amax, unsigned in ((0.37, True), (5.1, False), (1e-3, False)):
        a = policy.activation_params(amax, unsigned, policy.Policy(scale="pow2"))
        assert policy.is_pow2(a.scale) and a.input_high >= amax


def test_asymmetric_zero_point_is_exactly_on_the_grid():
    pol = policy.Policy(symmetric=False)
    p = policy.activation_params(10.0, False, pol, low=-0.3, high=10.0)
    assert p.grid == grids.Grid(0, 255) and p.zero_point.dtype == np.int64  # u8 with a zero point
    lo, hi = p.input_low, p.input_high
    assert abs(lo + 0.3) <= p.scale / 2 and abs(hi - 10.0) <= p.scale / 2  # moved by under half a step to put zero on the grid
    assert policy.fake_quantize(np.array(0.0), p) == 0.0  # zero survives exactly
    # a symmetric grid spends half its levels below -0.3: the asymmetric step is about half as large
    sym = policy.activation_params(10.0, False, policy.ACTIVATIONS)
    assert p.scale < 0.55 * sym.scale


def test_bit_widths_set_the_grid_and_bad_ones_are_refused():
    assert policy.activation_params(1.0, True, policy.Policy(bits=16)).grid == grids.Grid(0, 65535)
    assert policy.weight_params(np.ones((2, 2)), 0, policy.Policy(bits=4, signed=True)).grid == grids.Grid(-7, 7)
    for bad in (1, 33, 17):
        with pytest.raises(QtoolError, match="bits must be an integer from 2 to 16"):
            policy.Policy(bits=bad)


# ----------------------------------------------------------------------------- rules

def _rules(tmp_path, rules, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"rules": rules}))
    return policy.load_rules(path)


def test_rules_match_by_name_glob_regex_and_op_type_later_wins(tmp_path):
    rules = _rules(tmp_path, [
        {"op_type": "Conv", "bits": 6},
        {"glob": "layer1/*", "bits": 5, "apply_to": "weights"},
        {"regex": "^layer1/conv2", "scale": "pow2"},
        {"name": "layer1/conv2.w", "bits": 4},
    ])
    pols = policy.Policies(rules=rules)
    w = pols.for_quantizer("weights", "layer1/conv2.w", ["layer1/conv2"], ["Conv"])
    assert (w.bits, w.scale, w.per_channel) == (4, "pow2", True)  # every rule matched, the last bits win
    a = pols.for_quantizer("activations", "layer1/x", ["layer1/conv2"], ["Conv"])
    assert (a.bits, a.scale) == (6, "pow2")  # the glob rule is for weights only
    other = pols.for_quantizer("activations", "head/y", ["head/gemm"], ["Gemm"])
    assert other == policy.ACTIVATIONS and pols.unused() == []


def test_toml_rules(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[rules]]\nop_type = "Gemm"\nbits = 4\napply_to = "weights"\n')
    (rule,) = policy.load_rules(path)
    assert (rule.match, rule.pattern, rule.changes, rule.kinds) == ("op_type", "Gemm", {"bits": 4}, ("weights",))


@pytest.mark.parametrize("rules,message", [
    ([{"op_type": "Conv", "bitz": 4}], "unknown key 'bitz'"),
    ([{"op_type": "Conv", "bits": 1}], "bits must be an integer from 2 to 16"),
    ([{"op_type": "Conv", "bits": 33}], "bits must be an integer from 2 to 16"),
    ([{"bits": 4}], "needs exactly one of name, glob, regex, op_type"),
    ([{"regex": "(", "bits": 4}], "bad regex"),
    ([{"op_type": "Conv", "rounding": "stochastic"}], "rounding must be one of"),
    ([{"op_type": "Conv", "apply_to": "biases"}], "apply_to must be activations, weights or both"),
])
def test_bad_rule_files_are_one_line_errors(tmp_path, rules, message):
    with pytest.raises(QtoolError, match=message) as e:
        _rules(tmp_path, rules)
    assert "rule 1 of p.json" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- exports that runtimes run

@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    d = tmp_path_factory.mktemp("digits_policy")
    calib = calibrate(SAMPLE, IMAGES, d / "digits.calib.json", "--limit", "48")
    return d, calib, calibration.load(calib), model.load_model(SAMPLE)


def _simulated_weights(exported: onnx.ModelProto, loaded, cal, pols):
    """Each weight's numpy fake-quant (qtool.quantizers.policy) next to what the export dequantizes it to."""
    prepared = qdq.prepare(loaded, cal, options_for("qdq", policies=pols))
    inits = {t.name: numpy_helper.to_array(t) for t in exported.graph.initializer}
    out = []
    for site in prepared.plan.weights:
        p = site.params()
        # int8/int4, or uint8 with zero point 128 where the overflow guard stores them so (the same values)
        ints = next(v for k, v in inits.items() if k.startswith(f"{site.tensor}/int") or k == f"{site.tensor}/uint8")
        zero = inits[f"{site.tensor}/zero_point"] if ints.dtype == np.uint8 else 0
        axis = p.axis if np.ndim(p.scale) else None
        out.append((policy.fake_quantize(site.values, p, site.policy.rounding), grids.dequantize_linear(ints, p.scale, zero, axis), p))
    return out


def test_int4_weights_and_16bit_activations_run_in_onnxruntime_and_match_numpy(digits, tmp_path):
    d, calib, cal, loaded = digits
    out = tmp_path / "w4a16.onnx"
    summary = json.loads(ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out, "--json",
                                   "--weight-bits", "4", "--activation-bits", "16")).stdout)
    assert summary["opset"] == 21
    m = onnx.load(str(out))
    types = {t.data_type for t in m.graph.initializer}
    assert TensorProto.INT4 in types and ({TensorProto.UINT16, TensorProto.INT16} & types)
    for simulated, exported, p in _simulated_weights(m, loaded, cal, policy.from_options(4, 16)):
        assert p.grid == grids.Grid(-7, 7)
        np.testing.assert_array_equal(simulated, exported)
    x, _ = heldout()
    ref = ort_run(SAMPLE, {"input": x[:32]})[0]
    got = ort_run(out, {"input": x[:32]})[0]
    assert np.isfinite(got).all() and np.abs(got - ref).max() < np.abs(ref).max()  # a working, coarser model


def test_4bit_weight_fakequantize_runs_in_openvino_as_numpy_simulates(digits, tmp_path):
    """OpenVINO runs the 4-bit weight FakeQuantize (levels 15) and its output equals the FP32
    model with qtool's numpy fake-quantized weights, within one quantization step of the output."""
    d, calib, cal, loaded = digits
    out = tmp_path / "w4.openvino.onnx"
    ok(invoke("export", "--target", "openvino", "--calib", calib, "-o", out, "--weight-bits", "4", "--activation-bits", "16",
              "--no-bias-correction"))
    m = onnx.load(str(out))
    levels = sorted({a.i for n in m.graph.node if n.op_type == "FakeQuantize" for a in n.attribute if a.name == "levels"})
    assert levels == [15, 65536]
    # numpy: the weights fake-quantized by qtool.quantizers.policy, activations left in FP32 (16 bits: below the noise)
    prepared = qdq.prepare(loaded, cal, options_for("qdq", policies=policy.from_options(4, 16)))
    sim = onnx.ModelProto()
    sim.CopyFrom(loaded.proto)
    by_name = {t.name: t for t in sim.graph.initializer}
    for site in prepared.plan.weights:
        values = policy.fake_quantize(site.values, site.params(), site.policy.rounding).astype(np.float32)
        by_name[site.tensor].CopyFrom(numpy_helper.from_array(values, site.tensor))
    x, _ = heldout()
    want = ort_run(sim.SerializeToString(), {"input": x[:16]})[0]
    got = ov_compile(out)({"input": x[:16]})[0]
    step = (np.abs(want).max()) / 2 ** 15 * 64  # 16-bit activation noise through the network, generously
    assert np.abs(got - want).max() <= max(step, 0.05 * np.abs(want).max()), np.abs(got - want).max()


def test_pow2_scales_in_the_exported_bits(digits, tmp_path):
    d, calib, cal, loaded = digits
    out = tmp_path / "p2.onnx"
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out, "--scale-kind", "pow2"))
    scales = [numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer if t.name.endswith("/scale")]
    assert scales and all(s.dtype == np.float32 and policy.is_pow2(s) for s in scales)
    bits = np.concatenate([s.ravel().view(np.uint32) for s in scales])
    assert np.all(bits & 0x7FFFFF == 0)  # mantissa all zero: exact powers of two


def test_rounding_other_than_half_even_rounds_the_weights_and_warns_for_activations(digits, tmp_path):
    d, calib, cal, loaded = digits
    out = tmp_path / "up.onnx"
    summary = json.loads(ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out, "--json", "--rounding", "up")).stdout)
    assert any("rounds activations half to even" in w for w in summary["warnings"])
    for simulated, exported, _ in _simulated_weights(onnx.load(str(out)), loaded, cal, policy.from_options(rounding="up")):
        np.testing.assert_array_equal(simulated, exported)


def test_default_policies_change_nothing(digits, tmp_path):
    d, calib, _, _ = digits
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "a.onnx"))
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "b.onnx", "--weight-bits", "8", "--rounding", "half-even"))
    # the writer's bytes are the same; the provenance records the flags given
    assert unstamped((tmp_path / "a.onnx").read_bytes()) == unstamped((tmp_path / "b.onnx").read_bytes())


def test_policy_cli_errors_and_inspect(digits, tmp_path):
    d, calib, _, _ = digits
    (tmp_path / "p.json").write_text(json.dumps({"rules": [{"op_type": "Gemm", "apply_to": "weights", "bits": 4},
                                                          {"name": "nothing_here", "bits": 6}]}))
    r = invoke("inspect", calib, "--policy", tmp_path / "p.json", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    gemm = [q for q in doc["quantizers"] if q["kind"] == "weight" and q["read_by"] == ["Gemm"]]
    assert gemm and all(q["bits"] == 4 for q in gemm)
    assert all(q["bits"] == 8 for q in doc["quantizers"] if q not in gemm)
    assert any("rule 2 of p.json (name 'nothing_here') matches no quantizer" in w for w in doc["warnings"])
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "-o", tmp_path / "x.onnx", "--weight-bits", "4")
    assert r.exit_code == 2 and "--weight-bits applies to --target openvino or qdq" in r.stderr
    r = invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "x.onnx", "--activation-bits", "6")
    assert r.exit_code == 1 and "need a FakeQuantize target" in r.stderr and not (tmp_path / "x.onnx").exists()
    (tmp_path / "bad.json").write_text('{"rules": [{"op_type": "Conv", "bits": 33}]}')
    r = invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "x.onnx", "--policy", tmp_path / "bad.json")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "bits must be an integer" in r.stderr


# ----------------------------------------------------------------------------- asymmetric activations

def test_asymmetric_fakequantize_in_openvino_equals_numpy(tmp_path):
    """OpenVINO's FakeQuantize on the asymmetric range qtool writes gives qtool's numpy values."""
    from onnx import helper

    p = policy.activation_params(6.0, False, policy.Policy(symmetric=False), low=-0.4, high=6.0)
    assert p.grid == grids.Grid(0, 255) and 0 < int(p.zero_point) < 255  # u8 with a zero point
    lo, hi = np.float32(p.input_low), np.float32(p.input_high)
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", lo), ("hi", hi))]
    node = helper.make_node("FakeQuantize", ["x", "lo", "hi", "lo", "hi"], ["y"], domain="org.openvinotoolkit", levels=p.levels)
    g = helper.make_graph([node], "fq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("org.openvinotoolkit", 1)])
    onnx.save(m, str(tmp_path / "fq.onnx"))
    x = np.random.default_rng(3).uniform(-1.0, 7.0, (1, 4096)).astype(np.float32)
    got = ov_compile(tmp_path / "fq.onnx")({"x": x})[0]
    want = policy.fake_quantize(x, grids.QParams(np.float64(p.scale), p.zero_point, p.grid), "half-even")
    assert np.abs(got - want).max() <= 1e-5 * 6  # float32 arithmetic in the runtime
    assert np.all(np.isin(np.round((want - lo) / p.scale), np.arange(256)))  # every value on the u8 grid


def test_asymmetric_activations_run_int8_in_openvino_and_agree_with_onnxruntime(digits, tmp_path):
    """The FakeQuantize and the Q/DQ file of one calibration, every layer int8 (--weights-7bit none:
    the overflow guard would keep different layers FP32 in the two), describe the same arithmetic:
    OpenVINO's (FakeQuantize as float ops) and onnxruntime's (Q/DQ as float ops) agree on any CPU.
    Their real int8 kernels are compared only on a CPU with VNNI (checked): without it, u8 x s8 pair
    sums saturate, onnxruntime's on the first layer (raw pixel codes up to 255 by per-channel
    weights of 127: 45 % top-1 agreement with FP32 on an AVX2 EPYC), and the two differ by more
    than FP32's largest logit."""
    d, calib, _, _ = digits
    for target, name in (("openvino", "a.openvino.onnx"), ("qdq", "a.qdq.onnx")):
        ok(invoke("export", "--target", target, "--calib", calib, "-o", tmp_path / name, "--activations", "asymmetric", "--weights-7bit", "none"))
    m = onnx.load(str(tmp_path / "a.qdq.onnx"))
    zps = [numpy_helper.to_array(t) for t in m.graph.initializer if t.name.endswith("/zero_point") and t.data_type == TensorProto.UINT8]
    assert any(int(z) != 0 for z in zps)  # some activation has a zero point
    compiled = ov_compile(tmp_path / "a.openvino.onnx")
    from test_openvino import linear_precisions

    assert set(linear_precisions(compiled).values()) == {"u8"}  # every int8 layer still is
    x, _ = heldout()
    fp32 = ort_run(SAMPLE, {"input": x[:32]})[0]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_exact = ort.InferenceSession(str(tmp_path / "a.qdq.onnx"), options, providers=["CPUExecutionProvider"]).run(None, {"input": x[:32]})[0]
    ov_out = ov_exact(tmp_path / "a.openvino.onnx")({"input": x[:32]})[0]
    assert np.abs(ov_out - ort_exact).max() < 0.02 * np.abs(fp32).max()  # the two files hold the same quantizers
    if cpu_kinds.has_vnni():
        ov_out = np.concatenate([compiled({"input": x[i:i + 1]})[0] for i in range(32)])
        ort_out = ort_run(tmp_path / "a.qdq.onnx", {"input": x[:32]})[0]
        assert np.abs(ov_out - ort_out).max() < 0.1 * np.abs(fp32).max()  # the two runtimes run the same quantizers


def test_auto_symmetry_picks_asymmetric_only_where_the_step_shrinks():
    assert policy.choose_symmetry(10.0, -0.3, 10.0) is False  # a SiLU-like output: half the levels unused
    assert policy.choose_symmetry(10.0, -9.5, 10.0) is True  # nearly symmetric: nothing to gain
    assert policy.choose_symmetry(4.0, 0.0, 4.0) is True  # never negative: [0, amax] already
    r = invoke("export", "--target", "tensorrt", "--calib", "x.calib.json", "--activations", "asymmetric")
    assert r.exit_code == 2 and "--activations applies to --target openvino or qdq" in r.stderr


def test_opset21_exports_load_in_onnxruntime_with_its_default_optimizations(tmp_path):
    """A PP-OCR-like model with 4-bit weights: every activation Q/DQ is written unsigned at opset 21
    (onnxruntime's optimizer breaks signed QuantizeLinear-21 there), the same quantizers."""
    import zoo
    from test_openvino import noise_batch, noise_images

    path = tmp_path / "p.onnx"
    onnx.save(zoo.paddle_ocr_like(), str(path))
    calib = calibrate(path, noise_images(tmp_path / "i"), tmp_path / "p.calib.json", "--size", "32x64")
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "w4.onnx", "--weight-bits", "4", "--no-ignored-patterns"))
    m = onnx.load(str(tmp_path / "w4.onnx"))
    inits = {t.name: t for t in m.graph.initializer}
    assert m.opset_import[0].version == 21
    assert {inits[n.input[2]].data_type for n in m.graph.node if n.op_type == "QuantizeLinear"} == {TensorProto.UINT8}
    x = noise_batch(32, 64, n=2)
    got = ort_run(tmp_path / "w4.onnx", {m.graph.input[0].name: x})[0]  # default session options
    assert np.isfinite(got).all()
