"""qtool.targets.tensorrt.fp8 (TensorRT FP8 E4M3 Q/DQ) and the FP8 rule table of qtool.targets.tensorrt.checker.

The exports run in onnxruntime at ORT_ENABLE_BASIC: onnxruntime 1.32's CPU optimizer at EXTENDED
and above removes a Relu in front of an FP8 QuantizeLinear whose zero point is 0 (it takes the
zero point for an unsigned grid's floor), which changes the result; TensorRT has no such rewrite.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper
from test_transformers import bert_feeds

from qtool import api, provenance
from qtool.errors import QtoolError
from qtool.targets.tensorrt import checker as trtrules
from qtool.targets.tensorrt import fp8 as trt_fp8

LINEAR = ("Conv", "Gemm", "MatMul")
E4M3 = TensorProto.FLOAT8E4M3FN


def _session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def sqnr(ref, out) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - out) ** 2).sum(), 1e-30)))


def _cnn_feeds(name, seed, n=1):
    return {name: np.random.default_rng(seed).uniform(0, 1, (n, 3, 32, 32)).astype(np.float32)}


# name -> (builder, feeds(seed), least output SQNR in dB). Measured with every linear layer in FP8
# (max |x| thresholds, weights per channel): resnet_like 29.4 dB, bert_like 26.8 dB (the INT8 Q/DQ
# export of the same calibration: 31.6 and 39.7). E4M3 keeps 3 mantissa bits (relative step 2^-3,
# about 31 dB for one tensor's rounding), and 7-8 quantized layers add their errors; the bounds
# leave 4-6 dB for calibration noise.
MODELS = {
    "cnn": (zoo.resnet_like, lambda m, seed: _cnn_feeds(m.graph.input[0].name, seed), 25.0),
    "bert": (lambda: zoo.bert_like(True), lambda m, seed: bert_feeds(np.random.default_rng(seed), batch=1), 21.0),
}


@pytest.fixture(scope="module")
def calibrated():
    """name -> (model, loaded model, calibration), calibrated once on 6 inputs."""
    out = {}
    for name, (build, feeds, _) in MODELS.items():
        m = build()
        out[name] = (m, api._loaded(m), api.calibrate(m, data=[feeds(m, seed) for seed in range(6)]))
    return out


def _all_linear(m):
    return [n.name for n in m.graph.node if n.op_type in LINEAR]


def _export(calibrated, name, **options):
    m, loaded, cal = calibrated[name]
    options.setdefault("high_precision", "fp32")
    return trt_fp8.export(loaded, cal, include=_all_linear(m), **options)


def _producers(model):
    return {o: n for n in model.graph.node for o in n.output}


# ----------------------------------------------------------------------------- the writer

@pytest.mark.parametrize("name", MODELS)
def test_fp8_export_runs_in_onnxruntime_close_to_fp32(calibrated, name):
    m, _, _ = calibrated[name]
    feeds = MODELS[name][1](m, 99)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    result = _export(calibrated, name)
    out = _session(result.data).run(None, feeds)[0]
    quality = sqnr(ref, out)
    assert MODELS[name][2] < quality < 60, quality  # close to FP32, and the quantizers do act
    assert result.summary["precision"] == "fp8" and result.summary["fp32_layers"] == 0
    assert result.summary["fp8_layers"] == len(_all_linear(m)) and "int8_layers" not in result.summary


@pytest.mark.parametrize("name", MODELS)
def test_every_linear_input_is_fp8_dequantized(calibrated, name):
    model = onnx.load_from_string(_export(calibrated, name).data)
    made_by = _producers(model)
    inits = {t.name: t for t in model.graph.initializer}
    linear = [n for n in model.graph.node if n.op_type in LINEAR]
    assert len(linear) == len(_all_linear(calibrated[name][0]))
    for n in linear:
        for slot in (0, 1):
            dq = made_by[n.input[slot]]
            assert dq.op_type == "DequantizeLinear", (n.name, slot)
            assert inits[dq.input[2]].data_type == E4M3
            assert not numpy_helper.to_array(inits[dq.input[2]]).astype(np.float32).any()
            scale = numpy_helper.to_array(inits[dq.input[1]])
            assert scale.dtype == np.float32 and np.all(scale > 0) and np.all(np.isfinite(scale))
            if dq.input[0] in inits:  # a weight: an E4M3 initializer, per output channel
                assert inits[dq.input[0]].data_type == E4M3
            else:
                assert made_by[dq.input[0]].op_type == "QuantizeLinear" and scale.ndim == 0
    assert min(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 19


def test_activation_scale_is_max_over_448(calibrated):
    m, _, cal = calibrated["cnn"]
    model = onnx.load_from_string(_export(calibrated, "cnn").data)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    absmax = {t.name: t.absmax for t in cal.tensors}
    checked = 0
    for q in (n for n in model.graph.node if n.op_type == "QuantizeLinear"):
        if q.input[0] in absmax and q.input[0] not in inits:
            assert inits[q.input[1]] == np.float32(absmax[q.input[0]]) / np.float32(448.0)
            checked += 1
    assert checked >= 5


def test_weight_storage_fp8_equals_fp32_with_qdq(calibrated):
    """An E4M3 weight initializer -> DQ computes what the FP32 weight -> Q -> DQ computes in onnxruntime."""
    m, _, _ = calibrated["cnn"]
    feeds = MODELS["cnn"][1](m, 7)
    stored = _export(calibrated, "cnn", weights="fp8")
    qdq = _export(calibrated, "cnn", weights="fp32")
    assert len(stored.data) < len(qdq.data) * 0.5
    np.testing.assert_array_equal(_session(stored.data).run(None, feeds)[0], _session(qdq.data).run(None, feeds)[0])


def test_to_e4m3_matches_onnxruntime_quantize_linear():
    x = np.concatenate([np.random.default_rng(3).normal(0, 3, 500), [0.0, 500.0, -1e4, 448.0, 1e-4]]).astype(np.float32)
    scale = np.float32(0.0173)
    zp = numpy_helper.from_array(np.zeros((), ml_dtypes.float8_e4m3fn), "zp")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
        [numpy_helper.from_array(np.asarray(scale), "s"), zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    got = _session(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, trt_fp8.fake_quantize(x, scale))
    assert got.max() == np.float32(448) * scale  # saturated, not NaN


def test_export_is_deterministic(calibrated):
    for name in MODELS:
        assert _export(calibrated, name).data == _export(calibrated, name).data
        assert _export(calibrated, name, high_precision="fp16").data == _export(calibrated, name, high_precision="fp16").data


def test_modelopt_fp8_conv_rule_keeps_small_convs_fp16(calibrated):
    """ModelOpt's FP8 Conv rule (channels <= 16 or > 32 taps) applies by default; --include lifts it."""
    m, loaded, cal = calibrated["cnn"]
    result = trt_fp8.export(loaded, cal, high_precision="fp32")
    small = result.summary["fp8_exclusions"]
    assert "/layer1/conv1/Conv" in small and "FP8 Conv with 16 input / 16 output" in small["/layer1/conv1/Conv"]
    assert result.summary["fp32_layer_names"] == sorted(set(small) | {"/fc/Gemm"})  # the Gemm: INT8's GEMV rule
    assert all(why.startswith("default exclusion") for why in small.values())
    assert "fp8_exclusions" not in _export(calibrated, "cnn").summary


def test_convtranspose_and_pooling_are_not_fp8():
    """ModelOpt's FP8 op types are Conv, Gemm, MatMul and the residual Add: no ConvTranspose or AveragePool."""
    assert "ConvTranspose" not in trt_fp8.RULES.linear and not trt_fp8.RULES.pooling
    assert trt_fp8.RULES.residual_input is not None


def test_e4m3_mse_threshold_is_no_worse_than_max(calibrated):
    _, _, cal = calibrated["cnn"]
    for record in cal.tensors[:8]:
        amax = trt_fp8.e4m3_mse_amax(record)
        assert 0 < amax <= record.absmax
    decided = trt_fp8.thresholds(cal, "e4m3-mse")
    assert set(decided) == {t.name for t in cal.tensors}
    assert trt_fp8.thresholds(cal)[cal.tensors[0].name].amax == cal.tensors[0].absmax  # default: max |x|


@pytest.mark.parametrize(("options", "text"), [
    ({"trt_version": "8.6"}, "TensorRT 8.x"),
    ({"weights": "int8"}, "weights= for FP8"),
    ({"high_precision": "bf16"}, "high_precision="),
])
def test_bad_options_are_refused(calibrated, options, text):
    _, loaded, cal = calibrated["cnn"]
    with pytest.raises(QtoolError, match=text):
        trt_fp8.export(loaded, cal, **options)


# ----------------------------------------------------------------------------- the FP8 rule table

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("high_precision", ["fp32", "fp16"])
def test_fp8_export_passes_tensorrt_fp8_rules(calibrated, name, high_precision):
    model = onnx.load_from_string(_export(calibrated, name, high_precision=high_precision).data)
    for version in ("10.3", "11.4"):
        assert trtrules.check(model, version) == []
        assert trtrules.check(model, version, precision="fp8") == []
    assert {v.rule for v in trtrules.check(model, "11.4", precision="int8")} == {"int8-only"}
    assert "fp8-version" in {v.rule for v in trtrules.check(model, "8.6")}


def _broken(calibrated, edit):
    model = onnx.load_from_string(_export(calibrated, "cnn").data)
    edit(model)
    return {v.rule for v in trtrules.check(model, "11.4")}


def _first_activation_q(model):
    inits = {t.name for t in model.graph.initializer}
    return next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits)


def _replace_init(model, name, tensor):
    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            tensor.name = name
            model.graph.initializer[i].CopyFrom(tensor)
            return
    raise KeyError(name)


def test_e5m2_zero_point_breaks_the_fp8_rules(calibrated):
    def edit(model):
        q = _first_activation_q(model)
        _replace_init(model, q.input[2], numpy_helper.from_array(np.zeros((), ml_dtypes.float8_e5m2)))
    assert "fp8-e4m3-only" in _broken(calibrated, edit)


def test_negative_scale_breaks_the_fp8_rules(calibrated):
    def edit(model):
        q = _first_activation_q(model)
        _replace_init(model, q.input[1], numpy_helper.from_array(np.asarray(-0.01, np.float32)))
    assert "scale" in _broken(calibrated, edit)


def test_nonzero_fp8_zero_point_and_saturate_0_break_the_rules(calibrated):
    def edit(model):
        q = _first_activation_q(model)
        _replace_init(model, q.input[2], numpy_helper.from_array(np.asarray(1.0, ml_dtypes.float8_e4m3fn)))
        q.attribute.append(helper.make_attribute("saturate", 0))
    assert {"zero-point", "fp8-saturate"} <= _broken(calibrated, edit)


def test_per_channel_fp8_activation_breaks_the_rules(calibrated):
    def edit(model):
        q = _first_activation_q(model)
        _replace_init(model, q.input[1], numpy_helper.from_array(np.full(3, 0.01, np.float32)))
        _replace_init(model, q.input[2], numpy_helper.from_array(np.zeros(3, ml_dtypes.float8_e4m3fn)))
    assert "activation-per-tensor" in _broken(calibrated, edit)


def test_fp8_below_opset_19_breaks_the_rules(calibrated):
    def edit(model):
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = 17
    assert "fp8-opset" in _broken(calibrated, edit)


def test_unknown_precision_is_refused():
    with pytest.raises(QtoolError, match="precision"):
        trtrules.check(zoo.tiny_relu_model(), "11.4", precision="fp4")


def test_unrepresentable_ranges_stay_float(calibrated):
    """The additive attention mask (qtool.quantizers.patterns.unrepresentable) gets no FP8 quantizer either."""
    result = _export(calibrated, "bert")
    masks = result.summary["unrepresentable"]
    assert masks and all("additive mask" in why for why in masks.values())
    model = onnx.load_from_string(result.data)
    quantized = {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & set(masks)


# ----------------------------------------------------------------------------- through the registry and the command line

def test_cli_export_precision_fp8_is_the_writer_and_inspect_checks_it(calibrated, tmp_path):
    """qtool export --target tensorrt --precision fp8 writes what the FP8 writer writes (the API's
    precision="fp8" too); qtool inspect holds it to the FP8 rules: it passes, and a broken scale fails."""
    import json

    from runcli import invoke

    m, loaded, cal = calibrated["cnn"]
    onnx.save(m, tmp_path / "cnn.onnx")
    loaded = api._loaded(str(tmp_path / "cnn.onnx"))
    cal.model_sha256 = loaded.sha256
    cal.save(tmp_path / "cnn.calib.json")
    r = invoke("export", tmp_path / "cnn.onnx", "--calib", tmp_path / "cnn.calib.json", "--target", "tensorrt",
               "--precision", "fp8", "--trt-version", "10.3", "-o", tmp_path / "cnn.fp8.trt.onnx", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["precision"] == "fp8" and summary["format"] == "qdq" and summary["fp8_layers"] > 0
    written = (tmp_path / "cnn.fp8.trt.onnx").read_bytes()
    assert provenance.unstamped(written) == trt_fp8.export(loaded, cal, trt_version="10.3.0").data  # the writer's, with its provenance
    # a ModelProto in memory: the same file but for the model's name in the provenance
    assert provenance.unstamped(written) == provenance.unstamped(api.export(loaded.proto, cal, target="tensorrt", precision="fp8",
                                                                             trt_version="10.3"))
    types = {t.data_type for t in onnx.load_from_string(written).graph.initializer}
    assert E4M3 in types and TensorProto.INT8 not in types
    r = invoke("inspect", tmp_path / "cnn.fp8.trt.onnx", "--trt-version", "10.3")
    assert r.exit_code == 0, r.output
    model = onnx.load_from_string(written)
    q = _first_activation_q(model)
    _replace_init(model, q.input[1], numpy_helper.from_array(np.asarray(-0.01, np.float32)))
    onnx.save(model, tmp_path / "broken.onnx")
    r = invoke("inspect", tmp_path / "broken.onnx", "--trt-version", "10.3")
    assert r.exit_code == 1 and "scale" in r.output


@pytest.mark.parametrize(("args", "text"), [
    (("--precision", "fp8", "--format", "cache"), "--precision fp8 writes a Q/DQ model"),
    (("--precision", "fp8", "--trt-version", "8.6"), "TensorRT 8.x"),
    (("--precision", "fp8", "--smooth-quant", "on"), "--smooth-quant and --algorithm apply to --precision int8 only"),
])
def test_cli_fp8_refuses_what_it_cannot_write(calibrated, tmp_path, args, text):
    from runcli import invoke

    m, _, cal = calibrated["cnn"]
    onnx.save(m, tmp_path / "cnn.onnx")
    cal.model_sha256 = api._loaded(str(tmp_path / "cnn.onnx")).sha256
    cal.save(tmp_path / "cnn.calib.json")
    r = invoke("export", tmp_path / "cnn.onnx", "--calib", tmp_path / "cnn.calib.json", "--target", "tensorrt", *args)
    assert r.exit_code == 1 and text in r.output and not list(tmp_path.glob("*.trt.onnx")), r.output


def test_precision_applies_to_tensorrt_only(calibrated, tmp_path):
    from runcli import invoke

    m, _, cal = calibrated["cnn"]
    onnx.save(m, tmp_path / "cnn.onnx")
    cal.model_sha256 = api._loaded(str(tmp_path / "cnn.onnx")).sha256
    cal.save(tmp_path / "cnn.calib.json")
    r = invoke("export", tmp_path / "cnn.onnx", "--calib", tmp_path / "cnn.calib.json", "--target", "qdq", "--precision", "fp8")
    assert r.exit_code == 2 and "--precision applies to --target tensorrt, not qdq" in r.output
    with pytest.raises(QtoolError, match=r"^precision= applies to target='tensorrt', not qdq$"):
        api.export(m, cal, target="qdq", precision="fp8")


def test_cli_evaluate_precision_fp8_simulates_the_fp8_export(calibrated, tmp_path):
    """qtool evaluate --target tensorrt --precision fp8 measures the file export writes: its SQNR
    is the one of that file run in onnxruntime (ORT_ENABLE_BASIC); --runtime is refused (no FP8
    kernels on CPU)."""
    import json

    from runcli import invoke

    m, _, cal = calibrated["cnn"]
    onnx.save(m, tmp_path / "cnn.onnx")
    cal.save(tmp_path / "cnn.calib.json")
    (tmp_path / "held").mkdir()
    feeds = [_cnn_feeds(m.graph.input[0].name, seed) for seed in (100, 101, 102)]
    for i, f in enumerate(feeds):
        np.save(tmp_path / "held" / f"{i}.npy", next(iter(f.values())))
    common = ("--calib", tmp_path / "cnn.calib.json", "--target", "tensorrt", "--precision", "fp8", "--trt-version", "10.3")
    r = invoke("evaluate", tmp_path / "cnn.onnx", *common, "--high-precision", "fp32", "--data", tmp_path / "held", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["quantization"]["precision"] == "fp8" and result["quantization"]["fp8_layers"] > 0
    r2 = invoke("export", tmp_path / "cnn.onnx", *common, "--high-precision", "fp32", "-o", tmp_path / "m.onnx")
    assert r2.exit_code == 0, r2.output
    fp32 = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    fp8 = _session((tmp_path / "m.onnx").read_bytes())
    ref = np.concatenate([fp32.run(None, f)[0] for f in feeds])
    out = np.concatenate([fp8.run(None, f)[0] for f in feeds])
    assert result["outputs"][0]["sqnr_db"] == pytest.approx(sqnr(ref, out), abs=0.05)
    r = invoke("evaluate", tmp_path / "cnn.onnx", *common, "--runtime", "onnxruntime", "--data", tmp_path / "held")
    assert r.exit_code == 1 and "has none for FP8 on CPU" in r.output


def test_tiny_weight_scales_keep_their_dequantize_in_fp16(monkeypatch):
    """FP16 scales get the INT8 writer's floor (2^-16): a Conv whose weights are all below
    448 * 2^-16 would otherwise have its weight DequantizeLinear kept FP32 by the FP16 step, behind
    a Cast, which TensorRT's parser takes as per-channel scales on an activation."""
    m = zoo.resnet_like()
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    for i, t in enumerate(m.graph.initializer):
        if t.name == conv.input[1]:
            w = numpy_helper.to_array(t)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array((w / np.abs(w).max() * 1e-3).astype(np.float32), t.name))
    loaded = api._loaded(m)
    cal = api.calibrate(m, data=[_cnn_feeds(m.graph.input[0].name, seed) for seed in range(4)])
    include = _all_linear(m)

    def violations():
        model = onnx.load_from_string(trt_fp8.export(loaded, cal, include=include, high_precision="fp16").data)
        return {v.rule for v in trtrules.check(model, "11.4")}

    assert violations() == set()
    monkeypatch.setattr(trt_fp8, "FP16_SCALE_FLOOR", 0.0)
    assert "per-channel-axis" in violations()


def test_cli_takes_fp8s_own_method_for_fp8_only(calibrated, tmp_path):
    """--method e4m3-mse (the help lists it for --precision fp8) reaches the FP8 writer; INT8 refuses it."""
    from runcli import invoke

    m, loaded, cal = calibrated["cnn"]
    onnx.save(m, tmp_path / "cnn.onnx")
    loaded = api._loaded(str(tmp_path / "cnn.onnx"))
    cal.model_sha256 = loaded.sha256
    cal.save(tmp_path / "cnn.calib.json")
    common = ("export", tmp_path / "cnn.onnx", "--calib", tmp_path / "cnn.calib.json", "--target", "tensorrt", "--trt-version", "10.3")
    r = invoke(*common, "--precision", "fp8", "--method", "e4m3-mse", "-o", tmp_path / "a.onnx")
    assert r.exit_code == 0, r.output
    assert provenance.unstamped((tmp_path / "a.onnx").read_bytes()) == trt_fp8.export(loaded, cal, trt_version="10.3.0", method="e4m3-mse").data
    r = invoke(*common, "--method", "e4m3-mse", "-o", tmp_path / "b.onnx")
    assert r.exit_code == 1 and "unknown method 'e4m3-mse'" in r.output and not (tmp_path / "b.onnx").exists()
