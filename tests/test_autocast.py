"""qtool.targets.tensorrt.autocast.to_fp16: FP16 outside the Q/DQ pairs, guarded against constants and activations
FP16 cannot hold (Paddle BatchNormalization variance ~1e7)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper

from qtool.errors import QtoolError
from qtool.targets.tensorrt.autocast import ACTIVATION_LIMIT, constant_problem, to_fp16

FLOAT = TensorProto.FLOAT


def _model(nodes, inits, inputs, outputs, opset=19, ir_version=9):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="qtool-tests")
    m.ir_version = ir_version
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, shape, t=FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _run(m, feed):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _qdq(nodes, inits, x, scale, name, axis=None):
    """x -> QuantizeLinear -> DequantizeLinear with int8 zero points; returns the DQ output."""
    inits[f"{name}.scale"] = np.asarray(scale, np.float32)
    inits[f"{name}.zp"] = np.zeros(np.shape(scale), np.int8)
    kw = {} if axis is None else {"axis": axis}
    ins = [x, f"{name}.scale", f"{name}.zp"]
    nodes.append(helper.make_node("QuantizeLinear", ins, [f"{name}.q"], name=f"{name}/Q", **kw))
    nodes.append(helper.make_node("DequantizeLinear", [f"{name}.q", *ins[1:]], [f"{name}.dq"], name=f"{name}/DQ", **kw))
    return f"{name}.dq"


def paddle_bn_model():
    """Q/DQ Conv -> BatchNormalization with a ~1e7 variance (as paddle2onnx emits) -> Relu."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32)
    nodes, inits = [], {"w": w}
    xdq = _qdq(nodes, inits, "x", 3.0 / 127, "x")
    wdq = _qdq(nodes, inits, "w", np.abs(w).reshape(8, -1).max(1) / 127, "w", axis=0)
    nodes.append(helper.make_node("Conv", [xdq, wdq], ["c"], name="conv", pads=[1, 1, 1, 1]))
    inits.update({
        "bn.scale": rng.uniform(500, 1500, 8).astype(np.float32),
        "bn.bias": rng.uniform(-1, 1, 8).astype(np.float32),
        "bn.mean": rng.uniform(-0.1, 0.1, 8).astype(np.float32),
        "bn.var": rng.uniform(0.8e7, 1.2e7, 8).astype(np.float32),
    })
    nodes.append(helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b"], name="bn"))
    nodes.append(helper.make_node("Relu", ["b"], ["y"], name="relu"))
    return _model(nodes, inits, [_vi("x", [1, 3, 16, 16])], [_vi("y", [1, 8, 16, 16])])


def plain_model():
    """Conv -> Relu -> Conv, plus a residual Add: no Q/DQ, nothing FP16 cannot hold."""
    rng = np.random.default_rng(1)
    inits = {
        "w1": (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
        "b1": rng.standard_normal(4).astype(np.float32) * 0.1,
        "w2": (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["y"], name="add"),
    ]
    return _model(nodes, inits, [_vi("x", [1, 3, 8, 8])], [_vi("y", [1, 4, 8, 8])])


def _fp16_constants(g):
    out = [t for t in g.initializer if t.data_type == TensorProto.FLOAT16]
    out += [a.t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT16]
    return out


def _io_types(m):
    return [v.type.tensor_type.elem_type for v in list(m.graph.input) + list(m.graph.output)]


def _rel_err(ref, got):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def test_paddle_bn_variance_stays_fp32():
    m = paddle_bn_model()
    res = to_fp16(m)
    out = res.model
    onnx.checker.check_model(out, full_check=True)
    for t in _fp16_constants(out.graph):
        assert np.all(np.isfinite(numpy_helper.to_array(t))), t.name
    assert "bn" in res.kept_fp32 and "bn.var" in res.kept_fp32["bn"] and "65504" in res.kept_fp32["bn"]
    inits = {t.name: t for t in out.graph.initializer}
    assert inits["bn.var"].data_type == FLOAT
    np.testing.assert_array_equal(numpy_helper.to_array(inits["bn.var"]), numpy_helper.to_array(
        next(t for t in m.graph.initializer if t.name == "bn.var")))
    # the Conv and the DequantizeLinears feeding it are FP16; the DQ scales are FP16
    types = {vi.name: vi.type.tensor_type.elem_type for vi in out.graph.value_info}
    assert types["c"] == TensorProto.FLOAT16 and types["w.dq"] == TensorProto.FLOAT16
    assert inits["w.scale"].data_type == TensorProto.FLOAT16
    assert _io_types(out) == [FLOAT, FLOAT]
    x = np.random.default_rng(2).uniform(-3, 3, (1, 3, 16, 16)).astype(np.float32)
    (ref,), (got,) = _run(m, {"x": x}), _run(out, {"x": x})
    assert np.count_nonzero(got) > got.size // 4
    assert _rel_err(ref, got) < 1e-2


def test_unguarded_converter_breaks_the_bn_model():
    """What the guard prevents: onnxruntime's converter clamps the variance to 65504."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = paddle_bn_model()
    bad = convert_float_to_float16(m, keep_io_types=True)
    var = next(t for t in bad.graph.initializer if t.name == "bn.var")
    assert numpy_helper.to_array(var).max() == np.float16(65504)
    assert constant_problem(numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "bn.var")))


def test_plain_model_fully_converted():
    m = plain_model()
    res = to_fp16(m)
    out = res.model
    onnx.checker.check_model(out, full_check=True)
    assert res.kept_fp32 == {} and res.warnings == []
    assert all(t.data_type == TensorProto.FLOAT16 for t in out.graph.initializer)
    assert _io_types(out) == [FLOAT, FLOAT]
    assert [n.op_type for n in out.graph.node].count("Cast") == 2
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (ref,), (got,) = _run(m, {"x": x}), _run(out, {"x": x})
    assert got.dtype == np.float32
    assert _rel_err(ref, got) < 5e-3


def test_large_activation_keeps_producer_and_readers_fp32():
    m = plain_model()
    res = to_fp16(m, activation_absmax={"r1": 1e5, "c1": 10.0, "y": ACTIVATION_LIMIT})
    out = res.model
    onnx.checker.check_model(out, full_check=True)
    assert set(res.kept_fp32) == {"relu1", "conv2", "add"}
    assert all("'r1'" in why for why in res.kept_fp32.values())
    types = {vi.name: vi.type.tensor_type.elem_type for vi in out.graph.value_info}
    assert types["r1"] == FLOAT and types["c1"] == TensorProto.FLOAT16
    # no FP32 -> FP16 -> FP32 round trip between kept nodes, none before the FP32 output
    made_by = {o: n for n in out.graph.node for o in n.output}
    assert made_by["y"].name == "add"
    for n in out.graph.node:
        if n.name in ("conv2", "add"):
            assert all(made_by.get(i) is None or made_by[i].op_type != "Cast" for i in n.input if i != "c2_cast_to_fp32")
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (ref,), (got,) = _run(m, {"x": x}), _run(out, {"x": x})
    assert _rel_err(ref, got) < 5e-3


def test_keep_fp32_nodes_and_unknown_name():
    m = plain_model()
    res = to_fp16(m, keep_fp32_nodes=["conv2"])
    assert list(res.kept_fp32) == ["conv2"]
    with pytest.raises(QtoolError, match="no node named"):
        to_fp16(m, keep_fp32_nodes=["nope"])


def test_deterministic_bytes():
    for make in (paddle_bn_model, plain_model):
        m = make()
        a = to_fp16(m, activation_absmax={"c": 7e4}).model.SerializeToString()
        b = to_fp16(m, activation_absmax={"c": 7e4}).model.SerializeToString()
        assert a == b


def test_input_not_mutated():
    m = paddle_bn_model()
    before = m.SerializeToString()
    to_fp16(m, activation_absmax={"c": 1e6})
    assert m.SerializeToString() == before


def test_int8_weight_dq_and_tiny_scale():
    """INT8 initializer -> DQ converts (FP16 scale, FP16 output); a scale FP16 cannot represent
    keeps its Q/DQ FP32 with an FP32 scale initializer, not a Cast."""
    rng = np.random.default_rng(5)
    wq = rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    inits = {"wq": wq, "w.scale": np.full(4, 0.01, np.float32), "w.zp": np.zeros(4, np.int8)}
    nodes = [helper.make_node("DequantizeLinear", ["wq", "w.scale", "w.zp"], ["w.dq"], name="w/DQ", axis=0)]
    xdq = _qdq(nodes, inits, "x", 1e-9, "x")
    nodes.append(helper.make_node("Conv", [xdq, "w.dq"], ["y"], name="conv"))
    m = _model(nodes, inits, [_vi("x", [1, 3, 5, 5])], [_vi("y", [1, 4, 3, 3])])
    res = to_fp16(m)
    out = res.model
    onnx.checker.check_model(out, full_check=True)
    assert "x.scale" in res.kept_fp32["x/Q"] and "x.scale" in res.kept_fp32["x/DQ"]
    inits_out = {t.name: t.data_type for t in out.graph.initializer}
    assert inits_out["x.scale"] == FLOAT and inits_out["w.scale"] == TensorProto.FLOAT16
    assert inits_out["wq"] == TensorProto.INT8
    x = (rng.standard_normal((1, 3, 5, 5)) * 1e-7).astype(np.float32)
    (ref,), (got,) = _run(m, {"x": x}), _run(out, {"x": x})
    assert _rel_err(ref, got) < 1e-2


def test_constant_problem_rules():
    assert constant_problem(np.array([1e-5, 0.5], np.float32)) is None  # tiny next to a big max
    assert constant_problem(np.array([1e-9, 2e-9], np.float32))  # all tiny: clamped in FP16
    assert constant_problem(np.array([1e-5], np.float32)) is None  # eps-sized scalar is fine
    assert constant_problem(np.array([7e4], np.float32))
    assert constant_problem(np.array([np.inf], np.float32))
    assert constant_problem(np.array([1e-3, 1e-6], np.float32), per_element=True)  # subnormal scale
    assert constant_problem(np.array([0.0, 0.0], np.float32)) is None


def test_shape_computation_stays_fp32():
    """yolo_like's Shape -> Cast(float) -> Mul -> Floor -> Cast(int64) -> Resize sizes stays FP32."""
    m = zoo.yolo_like(opset=19)
    res = to_fp16(m)
    onnx.checker.check_model(res.model)
    for name in ("/model.8/Cast", "/model.8/Mul", "/model.8/Floor"):
        assert name in res.kept_fp32, sorted(res.kept_fp32)
    feed = {i.name: np.random.default_rng(6).standard_normal(
        [d.dim_value or 64 for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in m.graph.input}
    ref, got = _run(m, feed), _run(res.model, feed)
    for r, g in zip(ref, got):
        assert r.shape == g.shape


def test_qdq_concat_runs():
    """DQ -> Concat -> Q (onnxruntime's EXTENDED optimisation would make it QLinearConcat, which
    refuses FP16 scales): the FP16 model is valid and runs, FP16 scales included."""
    nodes, inits = [], {}
    a = _qdq(nodes, inits, "a", 0.05, "a")
    b = _qdq(nodes, inits, "b", 0.05, "b")
    nodes.append(helper.make_node("Concat", [a, b], ["cat"], name="concat", axis=1))
    c = _qdq(nodes, inits, "cat", 0.05, "cat")
    nodes.append(helper.make_node("Relu", [c], ["y"], name="relu"))
    m = _model(nodes, inits, [_vi("a", [1, 2, 4, 4]), _vi("b", [1, 2, 4, 4])], [_vi("y", [1, 4, 4, 4])])
    res = to_fp16(m)
    onnx.checker.check_model(res.model, full_check=True)
    assert {t.name: t.data_type for t in res.model.graph.initializer}["cat.scale"] == TensorProto.FLOAT16
    rng = np.random.default_rng(7)
    feed = {k: rng.standard_normal((1, 2, 4, 4)).astype(np.float32) for k in "ab"}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    got = ort.InferenceSession(res.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, _run(m, feed)[0], atol=0.05)


def _check_runs(m, res, feed):
    onnx.checker.check_model(res.model, full_check=True)
    assert [o.name for o in res.model.graph.output] == [o.name for o in m.graph.output]
    for r, g in zip(_run(m, feed), _run(res.model, feed)):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=1e-2, atol=1e-2)


def test_negative_and_symbolic_input_dims():
    """Paddle's dim_value -1 and symbols: the zero-input check run picks sizes for them."""
    for dims in ([-1, 3, -1, -1], ["N", 3, "H", "W"]):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["y"], name="relu")]
        m = _model(nodes, {"w": np.full((4, 3, 3, 3), 0.1, np.float32)}, [_vi("x", dims)], [_vi("y", [dims[0], 4, *dims[2:]])])
        res = to_fp16(m)
        _check_runs(m, res, {"x": np.random.default_rng(8).standard_normal((2, 3, 5, 7)).astype(np.float32)})


def test_outputs_that_no_node_produces():
    """A graph input and an initializer passed straight out, and a repeated output, keep their
    FP32 values; the converter alone leaves a Cast reading nothing for them."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["m"], name="mul"), helper.make_node("Relu", ["m"], ["y"], name="relu")]
    m = _model(nodes, {"k": np.array([1.5, 2.0, 2.5], np.float32)}, [_vi("x", [1, 3]), _vi("state", [2, 4])],
               [_vi("y", [1, 3]), _vi("state", [2, 4]), _vi("x", [1, 3]), _vi("k", [3])])
    res = to_fp16(m)
    assert _io_types(res.model) == [FLOAT] * 6
    assert {t.name: t.data_type for t in res.model.graph.initializer}["k"] == FLOAT
    rng = np.random.default_rng(9)
    _check_runs(m, res, {"x": rng.standard_normal((1, 3)).astype(np.float32), "state": rng.standard_normal((2, 4)).astype(np.float32)})


def test_blocked_op_inside_if_branch():
    """The converter puts the Casts around a Max inside an If branch into the main graph, where the
    branch's tensors do not exist; they move into the branch."""
    shape = [1, 3, 4, 4]
    then_g = helper.make_graph([helper.make_node("Max", ["r", "lo"], ["t1"], name="then_max"),
                                helper.make_node("Relu", ["t1"], ["t2"], name="then_relu")], "then", [], [_vi("t2", shape)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["r"], ["e1"], name="else_sigmoid")], "else", [], [_vi("e1", shape)])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, {"zero": np.array(0, np.float32), "lo": np.array(0.25, np.float32)}, [_vi("x", shape)], [_vi("y", shape)])
    res = to_fp16(m)
    if_node = next(n for n in res.model.graph.node if n.op_type == "If")
    then_ops = [n.op_type for n in next(a.g for a in if_node.attribute if a.name == "then_branch").node]
    assert then_ops == ["Max", "Cast", "Relu"]  # Max's FP32 output cast back to FP16 inside the branch
    for sign in (1, -1):
        _check_runs(m, res, {"x": sign * np.abs(np.random.default_rng(10).standard_normal(shape)).astype(np.float32)})
    res = to_fp16(zoo.control_flow_model())
    onnx.checker.check_model(res.model, full_check=True)


def test_model_the_converter_made_converts_again():
    """An FP16 model with FP32 I/O from onnxruntime's converter (and qtool's own output) already
    holds graph_input_cast_0, graph_output_cast0, x_cast_to_fp32: a second conversion renames them."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from qtool.model.graph import toposort

    for make, block in ((plain_model, ["relu1"]), (paddle_bn_model, ["bn"])):
        once = convert_float_to_float16(make(), keep_io_types=True, node_block_list=block)
        toposort(once.graph)
        x = np.random.default_rng(11).standard_normal([d.dim_value for d in once.graph.input[0].type.tensor_type.shape.dim])
        feed = {"x": x.astype(np.float32)}
        _check_runs(once, to_fp16(once), feed)
        ours = to_fp16(make()).model
        _check_runs(ours, to_fp16(ours), feed)


def test_node_onnxruntime_refuses_in_fp16_stays_fp32():
    """Celu is float-only (ONNX spec): onnxruntime refuses the FP16 model, names the node, and
    that node alone stays FP32, with a warning naming it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Celu", ["r"], ["c"], name="celu"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid")]
    m = _model(nodes, {}, [_vi("x", [2, 4])], [_vi("y", [2, 4])], opset=20)
    res = to_fp16(m)
    assert list(res.kept_fp32) == ["celu"] and "onnxruntime refuses it in FP16" in res.kept_fp32["celu"]
    assert len(res.warnings) == 1 and "'celu' (Celu) stays FP32" in res.warnings[0]
    types = {vi.name: vi.type.tensor_type.elem_type for vi in res.model.graph.value_info}
    assert types["r"] == types["c"] == TensorProto.FLOAT16
    _check_runs(m, res, {"x": np.random.default_rng(12).standard_normal((2, 4)).astype(np.float32)})


# ------------------------------------------------------------------ decomposed LayerNorm (guard e)

LN_OPS = ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div"]


def _big_bert(scale):
    """zoo.bert_like with decomposed LayerNorms and the word embedding scaled by `scale`: the
    embedding LayerNorm's deviations reach |x| of several hundred (BERT's outlier channels)."""
    m = zoo.bert_like(fused_layernorm=False)
    for i, t in enumerate(m.graph.initializer):
        if t.name == "embeddings.word.weight":
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(scale), t.name))
    return m


def _absmax(m, feed):
    """Max |x| of every float tensor of the main graph on `feed` (what calibration records)."""
    work = onnx.ModelProto()
    work.CopyFrom(m)
    inferred = onnx.shape_inference.infer_shapes(work)
    floats = [vi.name for vi in inferred.graph.value_info if vi.type.tensor_type.elem_type == FLOAT]
    work.graph.output.extend([helper.make_tensor_value_info(n, FLOAT, None) for n in floats])
    values = _run(work, feed)
    return {o.name: float(np.max(np.abs(v))) for o, v in zip(work.graph.output, values) if v.size}


def _bert_feed():
    from test_transformers import bert_feeds

    return bert_feeds(np.random.default_rng(3), batch=2)


def test_decomposed_layernorm_squaring_above_255_stays_fp32_as_a_whole():
    m, feed = _big_bert(60.0), _bert_feed()
    absmax = _absmax(m, feed)
    dev = "/embeddings/ln/Sub_output_0"
    assert 255 < absmax[dev] < ACTIVATION_LIMIT  # the deviation itself fits FP16, its square does not
    res = to_fp16(m, activation_absmax=absmax)
    ln = [n for n in m.graph.node if n.name.startswith("/embeddings/ln/") and n.op_type in LN_OPS][:len(LN_OPS)]
    assert [n.op_type for n in ln] == LN_OPS  # then the gamma Mul and beta Add, on normalised values
    for n in ln:
        assert "decomposed LayerNorm" in res.kept_fp32[n.name], (n.name, res.kept_fp32.get(n.name))
    # the layers' LayerNorms see normalised values: only their eps constants keep nodes FP32 there
    assert not [k for k, why in res.kept_fp32.items() if "decomposed LayerNorm" in why and not k.startswith("/embeddings/ln/")]
    ref = _run(m, feed)[0]
    got = _run(res.model, feed)[0].astype(np.float32)
    assert np.isfinite(got).all() and _rel_err(ref, got) < 1e-2, _rel_err(ref, got)
    # only the deviation's range known (the squares not calibrated): the guard still fires
    only = to_fp16(m, activation_absmax={dev: absmax[dev]})
    assert all("decomposed LayerNorm" in only.kept_fp32[n.name] for n in ln)


def test_decomposed_layernorm_of_small_values_is_fp16():
    m, feed = _big_bert(1.0), _bert_feed()
    absmax = _absmax(m, feed)
    assert absmax["/embeddings/ln/Sub_output_0"] < 255
    res = to_fp16(m, activation_absmax=absmax)
    assert not [k for k, why in res.kept_fp32.items() if "decomposed LayerNorm" in why]
    assert "/embeddings/ln/Pow" not in res.kept_fp32 and "/embeddings/ln/Div" not in res.kept_fp32
