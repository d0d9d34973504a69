"""onnxruntime's fused ops read as the standard ONNX ops they fuse (qtool.model.contrib): each form computes what
onnxruntime's kernel computes, and a BERT as onnxruntime's transformer optimizer writes it (tests/zoo.py
ort_optimized_bert_like) is quantized as its unfused export is."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.model import contrib

F = TensorProto.FLOAT
RNG = np.random.default_rng(5)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _same(model, feeds, ops_left=()):
    """The model read as standard ops runs as onnxruntime runs the model: no com.microsoft node left (but
    `ops_left`), every output within float rounding."""
    read = contrib.as_standard(model)
    assert read is not None
    proto, done = read
    assert sorted(n.op_type for n in proto.graph.node if n.domain == "com.microsoft") == sorted(ops_left)
    assert sum(done.values()) > 0
    a = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    b = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    checked = onnx.ModelProto()
    checked.CopyFrom(proto)
    for o, y in zip(checked.graph.output, b):  # onnx's checker wants each output's shape (these tests leave some out)
        o.CopyFrom(helper.make_tensor_value_info(o.name, o.type.tensor_type.elem_type, list(y.shape)))
    onnx.checker.check_model(checked, full_check=True)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)
    return proto


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("mask", ["none", "lengths", "raw2d", "raw3d"])
@pytest.mark.parametrize("sizes", [None, [16, 16, 8]])
def test_attention(mask, sizes):
    d, heads, b, s = 16, 4, 2, 6
    out = sum(sizes) if sizes else 3 * d
    attrs = {"num_heads": heads}
    if sizes:
        attrs.update(qkv_hidden_sizes=sizes, scale=0.3, mask_filter_value=-1e9)
    inputs = [_vi("x", F, ["b", "s", d])]
    feeds = {"x": _f(b, s, d)}
    names = ["x", "w", "bias"]
    nodes = []
    if mask != "none":
        names.append("m")
        if mask == "lengths":  # the key length per row, as onnxruntime's optimizer makes it: ReduceSum of the raw mask
            inputs.append(_vi("raw", TensorProto.INT32, ["b", "s"]))
            feeds["raw"] = np.array([[1] * s, [1] * 3 + [0] * (s - 3)], np.int32)
            nodes.append(helper.make_node("ReduceSum", ["raw", "one_axis"], ["m"], keepdims=0))
        else:
            shape = [b, s] if mask == "raw2d" else [b, s, s]
            inputs.append(_vi("m", TensorProto.INT32, shape))
            feeds["m"] = (RNG.random(shape) > 0.3).astype(np.int32)
            feeds["m"][..., 0] = 1
    nodes.append(helper.make_node("Attention", names, ["y"], domain="com.microsoft", **attrs))
    model = _model(nodes, inputs, [_vi("y", F, None)], [("w", _f(d, out)), ("bias", _f(out)), ("one_axis", np.array([1], np.int64))])
    _same(model, feeds)


def test_attention_with_past_state_is_kept():
    d = 8
    node = helper.make_node("Attention", ["x", "w", "bias", "", "past"], ["y", "present"], domain="com.microsoft", num_heads=2)
    model = _model([node], [_vi("x", F, [1, 3, d]), _vi("past", F, [2, 1, 2, 2, 4])], [_vi("y", F, None), _vi("present", F, None)],
                   [("w", _f(d, 3 * d)), ("bias", _f(3 * d))])
    assert contrib.as_standard(model) is None


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("mask", [True, False])
def test_embed_layer_norm_feeding_attention(opset, mask):
    """EmbedLayerNormalization (with and without segments and a mask) and its mask index read by an Attention."""
    d, vocab = 8, 20
    ids = RNG.integers(0, vocab, (2, 5)).astype(np.int32)
    feeds = {"ids": ids, "seg": (ids % 2).astype(np.int32)}
    names = ["ids", "seg", "word", "pos", "segt", "g", "be"]
    inputs = [_vi("ids", TensorProto.INT32, ["b", "s"]), _vi("seg", TensorProto.INT32, ["b", "s"])]
    if mask:
        names.append("mask")
        inputs.append(_vi("mask", TensorProto.INT32, ["b", "s"]))
        feeds["mask"] = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    nodes = [helper.make_node("EmbedLayerNormalization", names, ["e", "idx", "sum"], domain="com.microsoft", epsilon=1e-5),
             helper.make_node("Attention", ["e", "w", "bias", "idx"], ["y"], domain="com.microsoft", num_heads=2)]
    inits = [("word", _f(vocab, d)), ("pos", _f(16, d)), ("segt", _f(2, d)), ("g", _f(d)), ("be", _f(d)),
             ("w", _f(d, 3 * d)), ("bias", _f(3 * d))]
    model = _model(nodes, inputs, [_vi("y", F, None), _vi("idx", TensorProto.INT32, None), _vi("sum", F, None)], inits, opset)
    _same(model, feeds)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("opset", [13, 17])
def test_skip_layer_norm(op, opset):
    d = 8
    simplified = op == "SkipSimplifiedLayerNormalization"
    names = ["x", "skip", "g"] + ([] if simplified else ["be"]) + ["bias"]
    outs = ["y", "", "", "sum"]
    node = helper.make_node(op, names, outs, domain="com.microsoft", epsilon=1e-6)
    model = _model([node], [_vi("x", F, [2, 3, d]), _vi("skip", F, [2, 3, d])], [_vi("y", F, None), _vi("sum", F, None)],
                   [("g", _f(d)), ("be", _f(d)), ("bias", _f(d))], opset)
    _same(model, {"x": _f(2, 3, d), "skip": _f(2, 3, d)})


def test_onnxruntime_s_own_layer_norm_before_opset_17():
    d = 8
    node = helper.make_node("LayerNormalization", ["x", "g", "be"], ["y"], axis=-1, epsilon=1e-5)
    model = _model([node], [_vi("x", F, [2, 3, d])], [_vi("y", F, None)], [("g", _f(d)), ("be", _f(d))], 13)
    proto = _same(model, {"x": _f(2, 3, d)})
    assert "LayerNormalization" not in {n.op_type for n in proto.graph.node}


@pytest.mark.parametrize("op,inputs", [("Gelu", ["x"]), ("BiasGelu", ["x", "b"]), ("FastGelu", ["x"]), ("FastGelu", ["x", "b"]),
                                       ("QuickGelu", ["x"])])
def test_gelus(op, inputs):
    node = helper.make_node(op, inputs, ["y"], domain="com.microsoft")
    model = _model([node], [_vi("x", F, [2, 3, 8])], [_vi("y", F, None)], [("b", _f(8))])
    _same(model, {"x": 3 * _f(2, 3, 8)})


@pytest.mark.parametrize("activation,params,z", [("Relu", [], False), ("LeakyRelu", [0.2], False), ("Clip", [-1.0, 2.0], False),
                                                 ("Relu", [], True)])
def test_fused_conv(activation, params, z):
    names = ["x", "w", "b"] + (["z"] if z else [])
    attrs = {"activation": activation, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    if params:
        attrs["activation_params"] = params
    node = helper.make_node("FusedConv", names, ["y"], domain="com.microsoft", **attrs)
    inputs = [_vi("x", F, [1, 3, 8, 8])] + ([_vi("z", F, [1, 4, 8, 8])] if z else [])
    feeds = {"x": _f(1, 3, 8, 8)} | ({"z": _f(1, 4, 8, 8)} if z else {})
    model = _model([node], inputs, [_vi("y", F, None)], [("w", _f(4, 3, 3, 3)), ("b", _f(4))])
    _same(model, feeds)


def test_fused_gemm_and_matmul():
    nodes = [helper.make_node("FusedGemm", ["x", "w", "c"], ["h"], domain="com.microsoft", transB=1, alpha=0.5, activation="LeakyRelu",
                              activation_alpha=0.1),
             helper.make_node("FusedMatMul", ["h", "h"], ["y"], domain="com.microsoft", transB=1, alpha=0.25)]
    model = _model(nodes, [_vi("x", F, [4, 8])], [_vi("y", F, None)], [("w", _f(6, 8)), ("c", _f(6))])
    _same(model, {"x": _f(4, 8)})


def _text_feeds(n, seed, vocab=60):
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        length = int(rng.integers(6, 20))
        ids = rng.integers(1, vocab, (1, length)).astype(np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    return feeds


def test_an_optimized_bert_is_quantized_as_its_float_layers(tmp_path):
    """Before: calibrate recorded no tensor after EmbedLayerNormalization (onnx's shape inference does not type
    com.microsoft outputs) and every export refused ("would quantize nothing"); the Q/K/V projections sat inside
    Attention. Now every linear layer is int8, and OpenVINO runs the file as evaluate's simulation says."""
    model = zoo.ort_optimized_bert_like()
    feeds = _text_feeds(40, 1)
    cal = qtool.calibrate(model, data=feeds[:24])
    linear = 2 * 6  # per layer: Q, K, V, the attention output, the two MLP layers
    result = qtool.evaluate(model, cal, data=feeds[24:], target="openvino", runtime="openvino")
    assert result.plan_summary["int8_layers"] >= linear, result.plan_summary
    assert result.runtime.float_precision == "f32"
    assert result.worst_sqnr_db > 25, result.worst_sqnr_db
    assert abs(result.runtime.worst_sqnr_db - result.worst_sqnr_db) < 1.0, (result.runtime.worst_sqnr_db, result.worst_sqnr_db)
    for target in ("qdq", "tensorrt"):
        data = qtool.export(model, cal, target=target)
        assert not [n for n in onnx.load_from_string(data).graph.node if n.domain == "com.microsoft"], target


def test_an_unreadable_fused_op_is_left_as_it_is():
    """An Attention with a past state stays onnxruntime's (its other fused ops are read)."""
    model = zoo.ort_optimized_bert_like(layers=1)
    att = next(n for n in model.graph.node if n.op_type == "Attention")
    att.input.extend(["", "past"])
    model.graph.input.append(_vi("past", F, [2, "batch", 4, 0, 8]))
    read = contrib.as_standard(model)
    assert read is not None
    assert [n.op_type for n in read[0].graph.node if n.domain == "com.microsoft"] == ["Attention"]


@pytest.mark.parametrize("mask", ["none", "raw2d"])
@pytest.mark.parametrize("bias", [True, False])
def test_multi_head_attention(mask, bias):
    """Separate query/key/value (cross-attention: other key length), the bias per projection, a key padding mask."""
    d, heads, b, s, t = 16, 4, 2, 5, 7
    names = ["q", "k", "v", "bias" if bias else "", "m" if mask != "none" else ""]
    inputs = [_vi("q", F, ["b", "s", d]), _vi("k", F, ["b", "t", d]), _vi("v", F, ["b", "t", d])]
    feeds = {"q": _f(b, s, d), "k": _f(b, t, d), "v": _f(b, t, d)}
    if mask != "none":
        inputs.append(_vi("m", TensorProto.INT32, ["b", "t"]))
        feeds["m"] = np.array([[1] * t, [1] * 4 + [0] * (t - 4)], np.int32)
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain="com.microsoft", num_heads=heads)
    model = _model([node], inputs, [_vi("y", F, ["b", "s", d])], [("bias", _f(3 * d))])
    _same(model, feeds)


def test_a_float16_model_stays_float16():
    """The constants a reading adds take the node's float type (a float16 model's BiasGelu and SkipLayerNormalization
    would not load otherwise)."""
    d = 8
    nodes = [helper.make_node("BiasGelu", ["x", "b"], ["h"], domain="com.microsoft"),
             helper.make_node("SkipLayerNormalization", ["h", "x", "g", "be"], ["y"], domain="com.microsoft", epsilon=1e-5)]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT16, [2, 3, d])], [_vi("y", TensorProto.FLOAT16, [2, 3, d])],
                   [("b", _f(d).astype(np.float16)), ("g", _f(d).astype(np.float16)), ("be", _f(d).astype(np.float16))])
    read = contrib.as_standard(model)
    assert read is not None
    consts = [t for t in read[0].graph.initializer if t.data_type == TensorProto.FLOAT]
    assert not consts, [t.name for t in consts]
    x = _f(2, 3, d).astype(np.float16)
    b = ort.InferenceSession(read[0].SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert b.dtype == np.float16 and np.isfinite(b).all()
