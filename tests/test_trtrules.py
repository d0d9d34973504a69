"""qtool.targets.tensorrt.checker: each TensorRT Q/DQ parser rule fires on a model that breaks it and stays quiet on
one that obeys it; onnxruntime's default quantize_static output is flagged; `qtool inspect
MODEL.onnx --trt-version X` prints the violations and exits 1 (0 on a clean model)."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from runcli import invoke as run
from zoo import tiny_relu_model

from qtool.errors import QtoolError
from qtool.targets.tensorrt import checker as trtrules

VERSIONS = ("8.6", "10.3", "11.4")
FLOAT, INT8 = TensorProto.FLOAT, TensorProto.INT8


# ----------------------------------------------------------------------------- model builders

def _model(nodes, inits, inputs, outputs, opset=13, domains=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in domains)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="qtool-tests")
    model.ir_version = max(7, helper.find_min_ir_version_for(opsets, True))
    return model


def _init(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def qdq_pair(tensor, scale, zero, prefix, axis=None, zero_type=np.int8):
    """FP32 tensor -> QuantizeLinear -> DequantizeLinear, with its scale and zero-point initializers."""
    inits = [_init(f"{prefix}_scale", scale), _init(f"{prefix}_zp", zero, zero_type)]
    kw = {} if axis is None else {"axis": axis}
    nodes = [
        helper.make_node("QuantizeLinear", [tensor, f"{prefix}_scale", f"{prefix}_zp"], [f"{prefix}_q"], name=f"{prefix}_Q", **kw),
        helper.make_node("DequantizeLinear", [f"{prefix}_q", f"{prefix}_scale", f"{prefix}_zp"], [f"{prefix}_dq"], name=f"{prefix}_DQ", **kw),
    ]
    return nodes, inits


def trt_conv_model(opset=13):
    """TensorRT-style Q/DQ conv: activation per tensor (int8, zero point 0), FP32 weight -> Q -> DQ
    per channel along axis 0, FP32 bias, Relu."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    x_nodes, x_inits = qdq_pair("x", 3.0 / 127, 0, "x")
    w_nodes, w_inits = qdq_pair("W", np.abs(w).reshape(4, -1).max(axis=1) / 127, np.zeros(4), "W", axis=0)
    nodes = x_nodes + w_nodes + [
        helper.make_node("Conv", ["x_dq", "W_dq", "B"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    inits = x_inits + w_inits + [_init("W", w), _init("B", rng.normal(0, 0.1, 4))]
    return _model(nodes, inits, [helper.make_tensor_value_info("x", FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", FLOAT, [1, 4, 8, 8])], opset)


def weight_model(op, w_shape, axis, x_shape, out_shape, **attrs):
    """x (FP32, no Q/DQ) times a per-channel Q/DQ FP32 weight through `op` (Gemm, MatMul, ConvTranspose)."""
    w = np.random.default_rng(1).normal(0, 0.3, w_shape).astype(np.float32)
    channels = w_shape[axis]
    w_nodes, w_inits = qdq_pair("W", np.full(channels, 0.01), np.zeros(channels), "W", axis=axis)
    nodes = w_nodes + [helper.make_node(op, ["x", "W_dq"], ["y"], name=op.lower(), **attrs)]
    return _model(nodes, w_inits + [_init("W", w)], [helper.make_tensor_value_info("x", FLOAT, x_shape)],
                  [helper.make_tensor_value_info("y", FLOAT, out_shape)])


def node(model, name):
    return next(n for n in model.graph.node if n.name == name)


def set_init(model, name, value, dtype=np.float32):
    """Replace the initializer `name` (same name, new values and type)."""
    inits = model.graph.initializer
    i = next(i for i, t in enumerate(inits) if t.name == name)
    inits[i].CopyFrom(_init(name, value, dtype))


def set_attr(n, name, value):
    for i, a in enumerate(n.attribute):
        if a.name == name:
            del n.attribute[i]
            break
    if value is not None:
        n.attribute.append(helper.make_attribute(name, value))


def rules(model, version):
    return [(v.node, v.rule) for v in trtrules.check(model, version)]


def rule_ids(model, version):
    return {v.rule for v in trtrules.check(model, version)}


# ----------------------------------------------------------------------------- the clean model

@pytest.mark.parametrize("version", VERSIONS)
def test_tensorrt_style_conv_passes(version):
    assert trtrules.check(trt_conv_model(), version) == []


def test_tensorrt_style_conv_is_valid_and_runs_in_onnxruntime():
    model = trt_conv_model()
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(2).uniform(-3, 3, (1, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, {"x": x})[0]).all()  # onnxruntime's int8 kernels load and run it
    exact = ort.SessionOptions()  # the arithmetic TensorRT performs (int32 sums): Q/DQ as float ops, the same on any CPU
    exact.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (y,) = ort.InferenceSession(model.SerializeToString(), exact, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    fp32 = model_without_qdq()
    (ref,) = ort.InferenceSession(fp32.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert y.shape == (1, 4, 8, 8) and np.isfinite(y).all()
    assert np.abs(y - ref).max() < 0.1 * np.abs(ref).max()  # int8 error, not a different function
    assert not np.array_equal(y, ref)  # the Q/DQ nodes did quantize


def model_without_qdq():
    model = trt_conv_model()
    conv = node(model, "conv")
    conv.input[:] = ["x", "W", "B"]
    keep = [n for n in model.graph.node if n.op_type not in trtrules.QDQ_OPS]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def test_scales_through_constant_and_identity_are_constant():
    model = trt_conv_model()
    scale = next(t for t in model.graph.initializer if t.name == "x_scale")
    model.graph.initializer.remove(scale)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["x_scale_c"], name="c", value=scale))
    model.graph.node.insert(1, helper.make_node("Identity", ["x_scale_c"], ["x_scale"], name="id"))
    for version in VERSIONS:
        assert trtrules.check(model, version) == []


def test_results_are_in_graph_order_and_deterministic():
    model = trt_conv_model()
    set_init(model, "x_zp", 5, np.int8)
    set_attr(node(model, "W_Q"), "axis", 1)
    set_attr(node(model, "W_DQ"), "axis", 1)
    found = trtrules.check(model, "10.3")
    assert [v.node for v in found] == ["x_Q", "x_DQ", "W_Q", "W_DQ"]
    assert found == trtrules.check(model, "10.3")
    assert all(isinstance(v, trtrules.Violation) and v.message and "\n" not in v.message for v in found)


# ----------------------------------------------------------------------------- one rule each

@pytest.mark.parametrize("version", VERSIONS)
def test_asymmetric_zero_point(version):
    model = trt_conv_model()
    set_init(model, "x_zp", 3, np.int8)
    assert rules(model, version) == [("x_Q", "zero-point"), ("x_DQ", "zero-point")]
    assert "symmetric" in trtrules.check(model, version)[0].message


def test_zero_point_must_match_the_scale_size():
    model = trt_conv_model()
    set_init(model, "W_zp", [0], np.int8)
    assert rules(model, "10.3") == [("W_Q", "zero-point"), ("W_DQ", "zero-point")]


@pytest.mark.parametrize("zero_type,dtype", [(np.uint8, TensorProto.UINT8), (np.int16, TensorProto.INT16)])
def test_int8_only(zero_type, dtype):
    model = trt_conv_model(opset=21)  # INT16 Q/DQ needs opset 21
    set_init(model, "x_zp", 0, zero_type)
    for version in ("10.3", "11.4"):
        found = [v for v in trtrules.check(model, version) if v.rule == "int8-only"]
        assert [v.node for v in found] == ["x_Q", "x_DQ"]
        assert TensorProto.DataType.Name(dtype) in found[0].message


def test_two_input_qdq_needs_the_zero_point_on_8x_and_is_uint8_elsewhere():
    model = trt_conv_model()
    for name in ("x_Q", "x_DQ"):
        del node(model, name).input[2]
    assert rules(model, "8.6") == [("x_Q", "int8-only"), ("x_Q", "zero-point-input"),
                                   ("x_DQ", "int8-only"), ("x_DQ", "zero-point-input")]
    assert rules(model, "10.3") == [("x_Q", "int8-only"), ("x_DQ", "int8-only")]
    assert "UINT8" in trtrules.check(model, "10.3")[0].message


def test_two_input_qdq_with_int8_output_dtype_passes_on_11():
    model = trt_conv_model(opset=21)
    for name in ("x_Q", "x_DQ"):
        del node(model, name).input[2]
    set_attr(node(model, "x_Q"), "output_dtype", INT8)
    assert trtrules.check(model, "11.4") == []
    assert rules(model, "8.6") == [("", "opset"), ("x_Q", "zero-point-input"), ("x_DQ", "zero-point-input")]


@pytest.mark.parametrize("bad", [0.0, -0.5, np.nan, np.inf])
def test_scale_must_be_finite_and_positive(bad):
    model = trt_conv_model()
    set_init(model, "W_scale", [0.01, bad, 0.01, 0.01])
    for version in VERSIONS:
        assert rules(model, version) == [("W_Q", "scale"), ("W_DQ", "scale")]


def test_scale_must_be_constant():
    model = trt_conv_model()
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "x_scale"))
    model.graph.input.append(helper.make_tensor_value_info("x_scale", FLOAT, []))
    assert rules(model, "10.3") == [("x_Q", "scale"), ("x_DQ", "scale")]
    assert "not a constant" in trtrules.check(model, "10.3")[0].message


@pytest.mark.parametrize("axis", [1, None, -3])
def test_conv_weight_axis_must_be_0(axis):
    model = trt_conv_model()
    for name in ("W_Q", "W_DQ"):
        set_attr(node(model, name), "axis", axis)  # None: ONNX's default axis 1
    found = trtrules.check(model, "10.3")
    assert [(v.node, v.rule) for v in found if v.rule == "per-channel-axis"] == [("W_Q", "per-channel-axis"), ("W_DQ", "per-channel-axis")]
    assert "set axis=0" in found[-1].message
    set_attr(node(model, "W_Q"), "axis", -4)  # the same as 0
    set_attr(node(model, "W_DQ"), "axis", 0)
    assert trtrules.check(model, "10.3") == []


@pytest.mark.parametrize("op,w_shape,good,bad,x_shape,out_shape,attrs", [
    ("ConvTranspose", (3, 5, 3, 3), 1, 0, (1, 3, 4, 4), (1, 5, 6, 6), {}),
    ("Gemm", (6, 5), 0, 1, (2, 5), (2, 6), {"transB": 1}),
    ("Gemm", (5, 6), 1, 0, (2, 5), (2, 6), {}),
    ("MatMul", (5, 6), 1, 0, (2, 5), (2, 6), {}),
], ids=["convtranspose", "gemm-transB", "gemm", "matmul"])
def test_per_channel_axis_per_weight_op(op, w_shape, good, bad, x_shape, out_shape, attrs):
    model = weight_model(op, w_shape, good, x_shape, out_shape, **attrs)
    onnx.checker.check_model(model, full_check=True)
    for version in VERSIONS:
        assert trtrules.check(model, version) == []
    wrong = weight_model(op, w_shape, bad, x_shape, out_shape, **attrs)
    found = [v for v in trtrules.check(wrong, "10.3") if v.rule == "per-channel-axis"]
    assert [v.node for v in found] == ["W_Q", "W_DQ"] and f"set axis={good}" in found[0].message


@pytest.mark.parametrize("axis", [2, 1])
def test_batched_matmul_weight_takes_one_scale(axis):
    """TensorRT takes per-channel MatMul weights only as a 2-D [K, N] (the export's own rule,
    qtool.targets.tensorrt.rules.weight_axis, writes a batched weight per tensor)."""
    wrong = weight_model("MatMul", (2, 5, 6), axis, (2, 3, 5), (2, 3, 6))
    found = [v for v in trtrules.check(wrong, "10.3") if v.rule == "per-channel-axis"]
    assert [v.node for v in found] == ["W_Q", "W_DQ"] and "use one scalar scale" in found[0].message


def test_per_channel_weight_only_on_weight_inputs():
    model = weight_model("Add", (2, 5), 0, (2, 5), (2, 5))
    assert rules(model, "10.3") == [("W_Q", "per-channel-axis"), ("W_DQ", "per-channel-axis")]


def test_activations_per_tensor_only():
    model = trt_conv_model()
    set_init(model, "x_scale", [0.02, 0.02, 0.02])
    set_init(model, "x_zp", [0, 0, 0], np.int8)
    for name in ("x_Q", "x_DQ"):
        set_attr(node(model, name), "axis", 1)
    assert rules(model, "10.3") == [("x_Q", "activation-per-tensor"), ("x_DQ", "activation-per-tensor")]
    set_init(model, "x_scale", [0.02])  # one element: per tensor
    set_init(model, "x_zp", [0], np.int8)
    assert trtrules.check(model, "10.3") == []


@pytest.mark.parametrize("opset,failing", [(12, VERSIONS), (18, ("8.6",)), (21, ("8.6", "10.3")), (26, VERSIONS)])
def test_opset_range_per_version(opset, failing):
    model = trt_conv_model(opset=opset)
    for version in VERSIONS:
        opset_rules = [r for r in rules(model, version) if r[1] == "opset"]
        assert (("", "opset") in opset_rules) == (version in failing), (opset, version)
    if opset == 12:  # and the axis attribute is flagged where it sits
        assert ("W_Q", "opset") in rules(model, "10.3")


def test_fp16_scales_need_opset_19_and_tensorrt_10():
    def fp16_model(opset):
        nodes, inits = qdq_pair("x", np.float16(0.02), 0, "x")
        inits[0] = _init("x_scale", 0.02, np.float16)
        nodes.append(helper.make_node("Relu", ["x_dq"], ["y"], name="relu"))
        return _model(nodes, inits, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])], opset)

    assert rules(fp16_model(17), "10.3") == [("x_Q", "fp16-scale-opset"), ("x_DQ", "fp16-scale-opset")]
    assert trtrules.check(fp16_model(19), "10.3") == [] and trtrules.check(fp16_model(19), "11.4") == []
    assert rules(fp16_model(19), "8.6") == [("", "opset"), ("x_Q", "scale"), ("x_DQ", "scale")]


def test_int8_weight_initializer_needs_tensorrt_10():
    model = trt_conv_model()
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    scales = np.abs(w).reshape(4, -1).max(axis=1) / 127
    q = np.round(w / scales[:, None, None, None]).astype(np.int8)
    model.graph.node.remove(node(model, "W_Q"))
    node(model, "W_DQ").input[0] = "W_int8"
    model.graph.initializer.append(_init("W_int8", q, np.int8))
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == "W"))
    onnx.checker.check_model(model, full_check=True)
    assert rules(model, "8.6") == [("W_DQ", "weight-int8-initializer")]
    assert trtrules.check(model, "10.3") == [] and trtrules.check(model, "11.4") == []


def test_int32_bias_dequantize_is_not_imported():
    model = trt_conv_model()
    model.graph.initializer.extend([_init("B_int32", [5, -3, 0, 7], np.int32), _init("B_scale", 1e-4),
                                    _init("B_zp", 0, np.int32)])
    model.graph.node.insert(0, helper.make_node("DequantizeLinear", ["B_int32", "B_scale", "B_zp"], ["B_dq"], name="B_DQ"))
    node(model, "conv").input[2] = "B_dq"
    for version in VERSIONS:
        assert rules(model, version) == [("B_DQ", "int32-bias")]


def test_block_quantization_is_not_supported():
    model = trt_conv_model(opset=21)
    for name in ("W_Q", "W_DQ"):
        set_attr(node(model, name), "block_size", 3)
    assert rules(model, "11.4") == [("W_Q", "block-quantization"), ("W_DQ", "block-quantization")]


@pytest.mark.parametrize("op,domain", [("QLinearConv", ""), ("MatMulInteger", ""), ("ConvInteger", ""),
                                       ("QLinearAdd", "com.microsoft"), ("QuantizeLinear", "com.microsoft")])
def test_qoperator_nodes_are_not_imported(op, domain):
    model = trt_conv_model()
    model.graph.node.append(helper.make_node(op, ["y", "x_scale", "x_zp"], ["z"], name="qop", domain=domain))
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    assert rules(model, "10.3") == [("qop", "qoperator")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_model_without_qdq_is_reported_once(version):
    found = trtrules.check(tiny_relu_model(), version)
    assert [(v.node, v.rule) for v in found] == [("", "no-qdq")]
    assert ("TensorRT 11" in found[0].message) == version.startswith("11")


def test_qdq_inside_a_subgraph_is_checked():
    inner, inits = qdq_pair("x", 0.02, 7, "in")
    body = helper.make_graph(inner, "then", [], [helper.make_tensor_value_info("in_dq", FLOAT, [2])], initializer=inits)
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o"], name="id")], "else", [],
                              [helper.make_tensor_value_info("o", FLOAT, [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], name="if", then_branch=body, else_branch=other)], [],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", FLOAT, [2])],
                   [helper.make_tensor_value_info("y", FLOAT, [2])])
    assert rules(model, "10.3") == [("in_Q", "zero-point"), ("in_DQ", "zero-point")]
    assert trtrules.qdq_nodes(model) == 2


# ----------------------------------------------------------------------------- versions

@pytest.mark.parametrize("text,parsed", [("10.3", (10, 3, 0)), ("8.6.1", (8, 6, 1)), (" 11.4.0 ", (11, 4, 0)), ("8.6.1.6", (8, 6, 1))])
def test_parse_version(text, parsed):
    assert trtrules.parse_version(text) == parsed


@pytest.mark.parametrize("text", ["", "10", "ten", "10.x", "7.2", "12.0", "v10.3", "10.3-rc1"])
def test_parse_version_refuses_the_rest(text):
    with pytest.raises(QtoolError):
        trtrules.parse_version(text)
    with pytest.raises(QtoolError):
        trtrules.check(trt_conv_model(), text)


# ----------------------------------------------------------------------------- onnxruntime's quantizer

@pytest.fixture(scope="module")
def ort_quantized(tmp_path_factory):
    """trt_conv_model's FP32 graph quantized by onnxruntime's quantize_static, default settings and
    with the TensorRT-friendly ones (symmetric int8 activations, per-channel weights, FP32 bias)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(4)
            self.batches = iter([{"x": rng.uniform(-1, 3, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    d = tmp_path_factory.mktemp("ortq")
    onnx.save(model_without_qdq(), d / "fp32.onnx")
    quantize_static(d / "fp32.onnx", d / "default.onnx", Reader())
    quantize_static(d / "fp32.onnx", d / "symmetric.onnx", Reader(), per_channel=True, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True, "QuantizeBias": False})
    return d


@pytest.mark.parametrize("version", VERSIONS)
def test_onnxruntime_default_quantization_is_flagged(ort_quantized, version):
    model = onnx.load(ort_quantized / "default.onnx")
    zero_points = [numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("zero_point")]
    assert any(np.any(z != 0) for z in zero_points)  # what ORT writes: asymmetric activations
    found = rule_ids(model, version)
    assert {"zero-point", "int32-bias"} <= found
    assert ("weight-int8-initializer" in found) == version.startswith("8")


def test_onnxruntime_symmetric_per_channel_quantization_passes_10_and_11(ort_quantized):
    model = onnx.load(ort_quantized / "symmetric.onnx")
    assert trtrules.check(model, "10.3") == [] and trtrules.check(model, "11.4") == []
    assert rule_ids(model, "8.6") == {"weight-int8-initializer"}


# ----------------------------------------------------------------------------- the command line

def test_cli_lists_violations_and_exits_1(ort_quantized):
    r = run("inspect", ort_quantized / "default.onnx", "--trt-version", "10.3")
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    expected = trtrules.check(onnx.load(ort_quantized / "default.onnx"), "10.3")
    assert lines[:-1] == [f"{v.node}: {v.rule}: {v.message}" for v in expected]
    assert f"{len(expected)} violation(s) of the TensorRT 10.3.0 Q/DQ rules" in lines[-1]
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in r.output


def test_cli_json(ort_quantized):
    r = run("inspect", ort_quantized / "default.onnx", "--trt-version", "8.6.1", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["command"] == "inspect" and doc["kind"] == "onnx" and doc["trt_version"] == "8.6.1"
    model = onnx.load(ort_quantized / "default.onnx")
    assert doc["qdq_nodes"] == sum(n.op_type in trtrules.QDQ_OPS for n in model.graph.node) > 0 and doc["opset"] == 13
    rules_seen = {v["rule"] for v in doc["violations"]}
    assert {"zero-point", "int32-bias", "weight-int8-initializer"} <= rules_seen
    assert all(set(v) == {"node", "rule", "message"} for v in doc["violations"])


@pytest.mark.parametrize("version", VERSIONS)
def test_cli_clean_model_exits_0(tmp_path, version):
    onnx.save(trt_conv_model(), tmp_path / "clean.onnx")
    r = run("inspect", tmp_path / "clean.onnx", "--trt-version", version)
    assert r.exit_code == 0, r.output
    assert "no violation" in r.stdout and "4 Q/DQ nodes" in r.stdout
    doc = json.loads(run("inspect", tmp_path / "clean.onnx", "--trt-version", version, "--json").stdout)
    assert doc["violations"] == [] and doc["qdq_nodes"] == 4


def test_cli_model_level_violation_is_printed_as_model(tmp_path):
    onnx.save(tiny_relu_model(), tmp_path / "plain.onnx")
    r = run("inspect", tmp_path / "plain.onnx", "--trt-version", "11.4")
    assert r.exit_code == 1 and r.stdout.startswith("<model>: no-qdq: ")


# ----------------------------------------------------------------------------- the FP8 table

def fp8_conv_model(opset=19, zero_type=None):
    """trt_conv_model with FLOAT8 zero points (E4M3 unless `zero_type`), scales amax / 448."""
    import ml_dtypes

    zero_type = zero_type or ml_dtypes.float8_e4m3fn
    model = trt_conv_model(opset)
    for t in model.graph.initializer:
        if t.name.endswith("_zp"):
            t.CopyFrom(numpy_helper.from_array(np.zeros(tuple(t.dims), zero_type), t.name))
        elif t.name.endswith("_scale"):
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(127 / 448), t.name))
    return model


@pytest.mark.parametrize("version", ("10.3", "11.4"))
def test_fp8_conv_passes_the_fp8_table_and_fails_the_int8_one(version):
    model = fp8_conv_model()
    assert trtrules.check(model, version) == [] == trtrules.check(model, version, precision="fp8")
    assert {v.rule for v in trtrules.check(model, version, precision="int8")} == {"int8-only"}
    assert {v.rule for v in trtrules.check(trt_conv_model(19), version, precision="fp8")} == {"fp8-e4m3-only"}
    assert trtrules.check(trt_conv_model(19), version, precision="int8") == []


def test_fp8_rules_by_type_version_and_opset():
    import ml_dtypes

    assert {v.rule for v in trtrules.check(fp8_conv_model(zero_type=ml_dtypes.float8_e5m2), "11.4")} == {"fp8-e4m3-only"}
    assert {v.rule for v in trtrules.check(fp8_conv_model(17), "10.3")} == {"fp8-opset"}
    assert {"fp8-version", "opset"} <= {v.rule for v in trtrules.check(fp8_conv_model(), "8.6")}
    x = np.random.default_rng(2).uniform(-3, 3, (1, 3, 8, 8)).astype(np.float32)
    assert np.isfinite(ort.InferenceSession(fp8_conv_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]).all()
