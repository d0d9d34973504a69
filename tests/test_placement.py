"""Quantizer placement (NNCF CPU rules) and the graph helpers it relies on."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import onnx
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper
from required import module

from qtool import model as M
from qtool.calibration import TensorRecord
from qtool.errors import QtoolError
from qtool.model import graph as G
from qtool.quantizers import grids, placement, policy
from qtool.quantizers.quantizer import Range
from qtool.targets.cpu import CPU

FLOAT = TensorProto.FLOAT


class Net:
    """A few-line graph builder: ops named after their output."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def w(self, name, shape):
        self.inits.append(numpy_helper.from_array(self.rng.standard_normal(shape).astype(np.float32), name))
        return name

    def c(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, out, **attrs):
        outs = out if isinstance(out, list) else [out]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"n_{outs[0]}", **attrs))
        return out

    def conv(self, x, out, cin, cout, k=1, **attrs):
        return self.op("Conv", [x, self.w(f"{out}.w", (cout, cin, k, k))], out, kernel_shape=[k, k], pads=[k // 2] * 4, **attrs)

    def model(self, outputs, x_shape=(1, 4, 8, 8), opset=13):
        g = helper.make_graph(self.nodes, "t", [helper.make_tensor_value_info("x", FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(o, FLOAT, None) for o in outputs], initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


def records(proto, amax=2.0, unsigned=(), overrides=None, skip=()):
    """Calibration records for every activation of `proto` (amax 2, signed unless listed)."""
    out = {}
    for name in M.activation_tensors(proto):
        if name in skip:
            continue
        a = (overrides or {}).get(name, amax)
        lo = 0.0 if name in unsigned else -a
        out[name] = TensorRecord(name, lo, a, a, [1, 1], a)
    return out


def sites(plan):
    return {s.tensor: s for s in plan.activations}


def weights(plan):
    return {s.tensor: s for s in plan.weights}


# --------------------------------------------------------------------------
# the rules
# --------------------------------------------------------------------------
def test_conv_input_and_weights_and_range_passes_up_through_maxpool():
    n = Net()
    n.op("Relu", [n.conv("x", "c1", 4, 8, 3)], "r1")
    n.op("MaxPool", ["r1"], "p1", kernel_shape=[2, 2], strides=[2, 2])
    n.conv("p1", "c2", 8, 8)
    m = n.model(["c2"])
    plan = placement.place(m, records(m, unsigned={"r1", "p1"}, overrides={"r1": 3.0, "p1": 2.5}), rules=CPU)
    s = sites(plan)
    assert set(s) == {"x", "r1"}  # the quantizer moved above the MaxPool
    assert s["r1"].readers == [("n_p1", 0)] and s["x"].readers == [("n_c1", 0)]
    assert (s["r1"].range.amax, s["r1"].range.unsigned) == (3.0, True)  # the range of the tensor quantized
    w = weights(plan)
    assert set(w) == {"c1.w", "c2.w"} and w["c1.w"].axis == 0 and w["c1.w"].headroom_bits == 0
    assert plan.int8_layers == ["n_c1", "n_c2"] and not plan.fp32_layers and not plan.warnings


def test_one_quantizer_per_tensor_and_unquantized_readers_keep_the_float_tensor():
    n = Net()
    n.op("Relu", ["x"], "r")
    n.conv("r", "a", 4, 4)
    n.conv("r", "b", 4, 4)
    n.op("MaxPool", ["r"], "p", kernel_shape=[2, 2])  # read by the graph output only
    m = n.model(["a", "b", "p"])
    plan = placement.place(m, records(m, unsigned={"r"}), rules=CPU)
    s = sites(plan)
    assert list(s) == ["r"] and sorted(s["r"].readers) == [("n_a", 0), ("n_b", 0)]


def test_concat_inputs_share_the_concat_output_range():
    n = Net()
    n.op("Relu", [n.conv("x", "c1", 4, 4)], "r1")
    n.op("Relu", [n.conv("x", "c2", 4, 4)], "r2")
    n.op("Concat", ["r1", "r2"], "cat", axis=1)
    n.conv("cat", "head", 8, 4)
    m = n.model(["head"])
    plan = placement.place(m, records(m, unsigned={"r1", "r2", "cat"}, overrides={"r1": 1.0, "r2": 5.0, "cat": 4.0}), rules=CPU)
    s = sites(plan)
    assert {"r1", "r2"} <= set(s) and "cat" not in s
    assert s["r1"].range == s["r2"].range == Range(4.0, True)
    assert s["r1"].readers == [("n_cat", 0)] and s["r2"].readers == [("n_cat", 1)]
    assert "cat" in s["r1"].shared_with


def test_concat_with_a_constant_input_keeps_its_quantizer_below():
    n = Net()
    n.op("Concat", [n.op("Relu", ["x"], "r"), n.w("bias_map", (1, 4, 8, 8))], "cat", axis=1)
    n.conv("cat", "y", 8, 4)
    m = n.model(["y"])
    s = sites(placement.place(m, records(m), rules=CPU))
    assert set(s) == {"cat"}


def test_elementwise_ops_need_two_activations():
    n = Net()
    a = n.conv("x", "a", 4, 4)
    b = n.conv("x", "b", 4, 4)
    n.conv(a, "a2", 4, 4)  # an int8 layer reads a's codes too
    n.op("Add", [a, b], "sum")  # both activations: both quantized
    n.op("Add", ["sum", n.c("bias", np.ones((1, 4, 1, 1), np.float32))], "biased")  # constant: not
    n.op("Mul", ["biased", n.c("k", np.array(2.0, np.float32))], "scaled")
    m = n.model(["scaled", "a2"])
    s = sites(placement.place(m, records(m), rules=CPU))
    assert set(s) == {"x", "a", "b"}
    assert sorted(s["a"].readers) == [("n_a2", 0), ("n_sum", 0)] and s["b"].readers == [("n_sum", 1)]


def test_an_add_whose_quantizers_would_serve_it_alone_reads_float():
    """A linear branch scaled by a constant summed with a Conv branch (an FSMN memory block's x + depthwise(x), x a
    Linear's output), no other int8 reader of either: the Add reads float (placement.moves.lone_sums); rules without
    lone_sums_float keep both. Two Conv branches summed (a ResNet's downsampling Add) keep theirs: OpenVINO fuses each
    into its Convolution, also through the post-ops it fuses into one (a constant scale, a ReLU: an FPN's
    relu(bn(up(x))) + conv1x1(skip), LORE's table detector)."""
    n = Net()
    linear = n.op("MatMul", ["x", n.w("lin.w", (8, 8))], "lin")
    scaled = n.op("Mul", [linear, n.c("half", np.array(0.5, np.float32))], "scaled")
    n.op("Add", [scaled, n.conv("x", "b", 4, 4)], "sum")
    m = n.model(["sum"])
    assert set(sites(placement.place(m, records(m), rules=CPU))) == {"x"}
    assert set(sites(placement.place(m, records(m), rules=replace(CPU, lone_sums_float=False)))) == {"x", "scaled", "b"}
    n = Net()
    n.op("Add", [n.conv("x", "a", 4, 4), n.conv("x", "b", 4, 4)], "sum")
    m = n.model(["sum"])
    assert set(sites(placement.place(m, records(m), rules=CPU))) == {"x", "a", "b"}
    n = Net()
    scaled = n.op("Mul", [n.conv("x", "a", 4, 4), n.c("half", np.array(0.5, np.float32))], "scaled")
    n.op("Add", [scaled, n.op("Relu", [n.conv("x", "b", 4, 4)], "rb")], "sum")
    m = n.model(["sum"])
    assert set(sites(placement.place(m, records(m), rules=CPU))) == {"x", "scaled", "rb"}


def test_activation_patterns_are_not_split_by_quantizers():
    """SiLU, HardSwish (both spellings), GELU and decomposed LayerNorm stay fused; a residual Add
    of two real branches is quantized; the SE gating Mul, whose two quantizers would serve it alone (its pool
    reading the block input aside), reads float (placement.moves.lone_sums; NNCF's default preset quantizes it);
    the SE block's gating convolutions are NNCF's ignored SE_BLOCK pattern and stay FP32."""
    n = Net()
    y = n.conv("x", "c0", 4, 4)
    silu = n.op("Mul", [y, n.op("Sigmoid", [y], "sig")], "silu")
    hs = n.op("Mul", [silu, n.op("HardSigmoid", [silu], "hsig", alpha=1 / 6, beta=0.5)], "hswish")
    t = n.op("Clip", [n.op("Add", [hs, n.c("three", np.array(3.0, np.float32))], "p3"), n.c("lo", np.array(0.0, np.float32)), n.c("hi", np.array(6.0, np.float32))], "clip")
    hs2 = n.op("Div", [n.op("Mul", [hs, t], "hsw2"), n.c("six", np.array(6.0, np.float32))], "hswish2")
    e = n.op("Add", [n.op("Erf", [n.op("Div", [hs2, n.c("sqrt2", np.array(1.41, np.float32))], "gd")], "erf"), n.c("one", np.array(1.0, np.float32))], "e1")
    gelu = n.op("Mul", [hs2, e], "gelu")
    mean = n.op("ReduceMean", [gelu], "mean", axes=[1], keepdims=1)
    d = n.op("Sub", [gelu, mean], "centered")
    var = n.op("ReduceMean", [n.op("Mul", [d, d], "sq")], "var", axes=[1], keepdims=1)
    ln = n.op("Div", [d, n.op("Sqrt", [n.op("Add", [var, n.c("eps", np.array(1e-5, np.float32))], "ve")], "std")], "ln")
    se = n.op("GlobalAveragePool", [ln], "gap")
    se = n.op("Sigmoid", [n.conv(n.op("Relu", [n.conv(se, "se1", 4, 2)], "ser"), "se2", 2, 4)], "gate")
    gated = n.op("Mul", [ln, se], "se_out")
    res = n.op("Add", [gated, n.conv(gated, "branch", 4, 4)], "res")  # residual: quantized
    n.conv(res, "out", 4, 4)
    m = n.model(["out"])
    plan = placement.place(m, records(m), rules=CPU)
    readers = {r for s in plan.activations for r in s.readers}
    for fused in ("n_silu", "n_hswish", "n_hsw2", "n_gelu", "n_ln", "n_sq", "n_var"):
        assert not any(node == fused for node, _ in readers), fused
    # the LayerNorm's mean and its centring Sub read its input float (NNCF's transformer preset; docs/benchmarks.md#ln31)
    assert "gelu" not in {s.tensor for s in plan.activations}
    assert not any(node in ("n_mean", "n_centered") for node, _ in readers)
    assert ("n_res", 0) in readers and ("n_res", 1) in readers
    assert ("n_se_out", 0) not in readers and ("n_se_out", 1) not in readers
    assert ("n_gap", 0) in readers  # the pooling input is quantized as usual
    ln_site = next(s for s in plan.activations if s.tensor == "ln")
    assert ("n_gap", 0) in ln_site.readers and ("n_se_out", 0) not in ln_site.readers  # the Mul reads ln itself
    assert sorted(plan.int8_layers) == ["n_branch", "n_c0", "n_out"]
    assert plan.fp32_layers == {"n_se1": "ignored pattern se_block", "n_se2": "ignored pattern se_block"}
    assert set(plan.ignored) == {"n_se1", "n_ser", "n_se2", "n_gate"} and not plan.warnings
    plain = placement.place(m, records(m), choices=placement.Choices(ignored_patterns=False), rules=CPU)
    assert len(plain.int8_layers) == 5 and not plain.ignored


def test_shape_only_and_input_independent_tensors_are_never_quantized():
    m = zoo.yolo_like()
    plan = placement.place(m, records(m), rules=CPU)
    quantized = set(sites(plan))
    assert not quantized & set(zoo.YOLO_SHAPE_ONLY_FLOATS)
    dependent = M.data_dependent(m)
    assert quantized <= dependent
    assert all(node.startswith("/model.14/level") is False for s in plan.activations for node, _ in s.readers if "Add" in node)
    convs = [n.name for n in m.graph.node if n.op_type == "Conv"]
    assert sorted(plan.int8_layers) == sorted(convs)


def test_split_passes_through_only_when_every_output_is_wanted():
    n = Net()
    n.op("Relu", ["x"], "r")
    n.op("Split", ["r", n.c("sizes", np.array([2, 2], np.int64))], ["s0", "s1"], axis=1)
    n.conv("s0", "a", 2, 2)
    n.conv("s1", "b", 2, 2)
    m = n.model(["a", "b"])
    assert set(sites(placement.place(m, records(m), rules=CPU))) == {"r"}
    n.nodes.pop()  # s1 now goes straight to a graph output
    m = n.model(["a", "s1"])
    assert set(sites(placement.place(m, records(m), rules=CPU))) == {"s0"}


@pytest.mark.parametrize("op,attrs,slot,shape,axis", [
    ("Gemm", {"transB": 1}, 1, (6, 4), 0),
    ("Gemm", {}, 1, (4, 6), 1),
    ("MatMul", {}, 1, (4, 6), 1),
    ("MatMul", {}, 1, (2, 4, 6), 2),
])
def test_weight_axis_is_the_output_channel(op, attrs, slot, shape, axis):
    n = Net()
    n.op(op, [n.op("Relu", ["x"], "r"), n.w("W", shape)], "y", **attrs)
    m = n.model(["y"], x_shape=(3, 4))
    w = weights(placement.place(m, records(m), rules=CPU))["W"]
    assert w.axis == axis and w.readers == [("n_y", slot)]


def test_conv_transpose_weight_axis():
    n = Net()
    n.op("ConvTranspose", ["x", n.w("W", (4, 6, 2, 2))], "y", kernel_shape=[2, 2], strides=[2, 2])
    m = n.model(["y"])
    assert weights(placement.place(m, records(m), rules=CPU))["W"].axis == 1


def test_matmul_of_two_activations_quantizes_both_per_tensor():
    n = Net()
    a = n.op("Relu", ["x"], "a")
    b = n.op("Transpose", [n.op("Sigmoid", ["x"], "b")], "bt", perm=[0, 1, 3, 2])
    n.op("MatMul", [a, b], "y")
    m = n.model(["y"])
    plan = placement.place(m, records(m), rules=CPU)
    assert set(sites(plan)) == {"a", "b"} and not plan.weights and plan.int8_layers == ["n_y"]


# --------------------------------------------------------------------------
# options and bad data
# --------------------------------------------------------------------------
def _chain():
    n = Net()
    n.op("Relu", [n.conv("x", "c1", 4, 4)], "r1")
    n.op("Relu", [n.conv("r1", "c2", 4, 4)], "r2")
    n.conv("r2", "c3", 4, 4)
    return n.model(["c3"])


def test_exclude_nodes_and_tensors():
    m = _chain()
    plan = placement.place(m, records(m), choices=placement.Choices(exclude=["n_c2"]), rules=CPU)
    assert plan.fp32_layers == {"n_c2": "excluded"} and "c2.w" not in weights(plan)
    assert set(sites(plan)) == {"x", "r2"}
    plan = placement.place(m, records(m), choices=placement.Choices(exclude=["r1"]), rules=CPU)
    assert "n_c2" in plan.fp32_layers and "r1" not in sites(plan)
    with pytest.raises(QtoolError, match="did you mean 'n_c2'"):
        placement.place(m, records(m), choices=placement.Choices(exclude=["n_c22"]), rules=CPU)


def test_weights_7bit_first_or_all():
    m = _chain()
    assert {w.tensor: w.headroom_bits for w in placement.place(m, records(m), choices=placement.Choices(weights_7bit="first"), rules=CPU).weights} == {"c1.w": 1, "c2.w": 0, "c3.w": 0}
    assert {w.headroom_bits for w in placement.place(m, records(m), choices=placement.Choices(weights_7bit="all"), rules=CPU).weights} == {1}
    with pytest.raises(QtoolError):
        placement.place(m, records(m), choices=placement.Choices(weights_7bit="some"), rules=CPU)


def test_missing_zero_and_degenerate_calibration_give_warnings_not_crashes():
    m = _chain()
    recs = records(m, skip={"r1"})
    recs["r2"] = TensorRecord("r2", 0.0, 0.0, 0.0, [5], 0.0)  # always zero
    # a threshold below every calibrated value (what the entropy search returns when no value is near 0)
    recs["x"] = TensorRecord("x", 0.5, 0.9, 0.25, [0, 0, 0, 0, 10, 30, 30, 20, 10], 1.0)
    plan = placement.place(m, recs, rules=CPU)
    text = " ".join(plan.warnings)
    assert "not in the calibration file" in text and "r1" in text
    assert "amax 0" in text and "clip more than" in text
    assert "n_c2" in plan.fp32_layers and "n_c2 (an input has no calibrated range)" in text
    s = sites(plan)
    assert s["r2"].range.amax == 1.0 and s["x"].range.amax == pytest.approx(0.9)


def test_nan_weights_leave_the_layer_in_fp32():
    m = _chain()
    w = next(t for t in m.graph.initializer if t.name == "c2.w")
    bad = numpy_helper.to_array(w).copy()
    bad[0, 0, 0, 0] = np.nan
    w.CopyFrom(numpy_helper.from_array(bad, "c2.w"))
    plan = placement.place(m, records(m), rules=CPU)
    assert "n_c2" in plan.fp32_layers and any("NaN" in x for x in plan.warnings)


def test_an_already_quantized_model_is_flagged():
    n = Net()
    q = n.op("QuantizeLinear", ["x", n.c("s", np.array(0.1, np.float32)), n.c("z", np.array(0, np.uint8))], "q")
    n.conv(n.op("DequantizeLinear", [q, "s", "z"], "dq"), "y", 4, 4)
    m = n.model(["y"])
    plan = placement.place(m, records(m), rules=CPU)
    assert any("with its own QuantizeLinear/DequantizeLinear pairs: kept (the OpenVINO file writes each as the FakeQuantize" in w for w in plan.warnings)
    # the conv's input is the model's own pair's: no second quantizer there; its weight the model left float stays float
    assert plan.quantizers == [] and plan.fp32_layers == {"n_y": "left float by the model, shipped quantized with its own "
                                                                 "QuantizeLinear/DequantizeLinear"}, plan.fp32_layers


def test_float16_activations_only_where_the_target_allows():
    m = _chain()
    recs = records(m)
    assert placement.place(m, recs, float_types=(TensorProto.FLOAT16,), rules=CPU).int8_layers == []


# --------------------------------------------------------------------------
# graph helpers
# --------------------------------------------------------------------------
def test_toposort_is_stable_and_finds_cycles():
    m = _chain()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    G.toposort(m.graph)
    assert [n.name for n in m.graph.node] == [n.name for n in nodes]
    m.graph.node[0].input[0] = m.graph.node[-1].output[0]  # c1 reads c3: a cycle
    with pytest.raises(QtoolError, match="cycle"):
        G.toposort(m.graph)


def test_toposort_respects_subgraph_reads():
    m = zoo.control_flow_model()
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(reversed(nodes))
    G.toposort(m.graph)
    onnx.checker.check_model(m)


def test_cleanup_removes_dead_nodes_and_initializers_only():
    n = Net()
    n.conv("x", "used", 4, 4)
    n.conv("x", "dead", 4, 4)
    n.w("orphan", (3,))
    m = n.model(["used"])
    m.graph.input.append(helper.make_tensor_value_info("orphan", FLOAT, [3]))  # initializer that is also an input
    n.w("orphan2", (2,))
    m.graph.initializer.append(n.inits[-1])
    assert G.cleanup(m.graph) == (1, 2)  # node 'dead', initializers 'dead.w' and 'orphan2'
    assert [x.name for x in m.graph.node] == ["n_used"]
    assert {t.name for t in m.graph.initializer} == {"used.w", "orphan"}


def test_namer_and_unique_node_names():
    m = _chain()
    m.graph.node[1].name = m.graph.node[0].name
    m.graph.node[2].name = ""
    namer = G.Namer(m)
    assert namer.fresh("r1") == "r1_1" and namer.fresh("r1") == "r1_2" and namer.fresh("new") == "new"
    assert G.unique_node_names(m.graph, namer) == 2
    names = [x.name for x in m.graph.node]
    assert len(set(names)) == len(names) and all(names)


def test_ensure_opset():
    m = _chain()
    G.ensure_opset(m, "org.openvinotoolkit", 1)
    G.ensure_opset(m, "org.openvinotoolkit", 1)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 13), ("org.openvinotoolkit", 1)]
    assert G.default_opset(m) == 13


def test_se_pattern_follows_nncf_on_the_openvino_graph():
    """Sigmoid and relu6(x + 3) / 6 (OpenVINO's HSigmoid) gates make the SE gating path FP32; an ONNX
    HardSigmoid stays OpenVINO's HardSigmoid, which NNCF's pattern does not match. The bias of a
    gating conv may be an Add of a reshaped constant (paddle2onnx)."""
    def sigmoid(n, x):
        return n.op("Sigmoid", [x], "gate")

    def hardsigmoid(alpha):
        return lambda n, x: n.op("HardSigmoid", [x], "gate", alpha=alpha, beta=0.5)

    def relu6(n, x):
        t = n.op("Clip", [n.op("Add", [x, n.c("three", np.array(3.0, np.float32))], "g3"),
                          n.c("lo", np.array(0.0, np.float32)), n.c("hi", np.array(6.0, np.float32))], "g6")
        return n.op("Div", [t, n.c("six", np.array(6.0, np.float32))], "gate")

    for label, gate, ignored in (("sigmoid", sigmoid, True), ("relu6(x+3)/6", relu6, True),
                                 ("HardSigmoid(1/6)", hardsigmoid(1 / 6), False), ("HardSigmoid(0.2)", hardsigmoid(0.2), False)):
        n = Net()
        y = n.conv("x", "c0", 4, 4)
        pooled = n.op("ReduceMean", [y], "pool", axes=[2, 3], keepdims=1)
        b = n.op("Reshape", [n.c("b1", np.ones(2, np.float32)), n.c("shape", np.array([1, 2, 1, 1], np.int64))], "b1r")
        h = n.op("Relu", [n.op("Add", [n.conv(pooled, "se1", 4, 2), b], "se1b")], "ser")
        g = gate(n, n.conv(h, "se2", 2, 4))
        n.conv(n.op("Mul", [y, g], "gated"), "out", 4, 4)
        m = n.model(["out"])
        plan = placement.place(m, records(m), rules=CPU)
        assert (sorted(plan.fp32_layers) == ["n_se1", "n_se2"]) == ignored, label
        assert ("n_se1b" in plan.ignored) == ignored and ("n_gate" in plan.ignored) == ignored
        assert len(placement.place(m, records(m), choices=placement.Choices(ignored_patterns=False), rules=CPU).int8_layers) == 4


def test_transformer_preset_only_where_attention_and_layernorm_are():
    """NNCF's transformer preset applies to graphs with attention and a LayerNorm, whatever their
    spelling; CNNs (also with a Softmax or a ReduceMean) keep the CNN rules."""
    from qtool.quantizers import patterns as P

    for build in (zoo.yolo_like, zoo.paddle_ocr_like, zoo.resnet_like, zoo.deconv_gemm_like):
        m = build()
        assert P.transformer_structure(G.Index(m)) == {}, build.__name__
        assert placement.place(m, records(m), rules=CPU).transformer == {}
    assert P.transformer_structure(G.Index(zoo.transformer_like()))["attention"] == 1  # the pytorch-style encoder
    for m in (zoo.bert_like(True), zoo.bert_like(False), zoo.vit_like()):
        found = P.transformer_structure(G.Index(m))
        assert found == {"attention": 1, "layer_norm": 3, "gelu": 1, "residual_add": 2}
        plan = placement.place(m, records(m), rules=CPU)
        assert plan.transformer == found and plan.summary()["transformer"] == found
        ops = {n.name: n.op_type for n in m.graph.node}
        readers = {ops[node] for s in plan.activations for node, _ in s.readers}
        assert readers <= {"MatMul", "Gemm", "Conv", "Reshape", "Transpose"}, readers  # the linear layers (through shape ops)
        linear = [n for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
        assert sorted(plan.fp32_layers) == ["/layer.0/attn/MatMul_1"] and len(plan.int8_layers) == len(linear) - 1


def test_transformer_preset_on_tf2onnx_attention_and_pooled_layernorm():
    """tf2onnx lowers Keras' attention Einsums to MatMuls reached through Unsqueeze/Squeeze and writes a Keras
    LayerNorm's moments as GlobalAveragePools of [b, s, d] (the mean of the last axis, OpenVINO's ReduceMean):
    g2p-id's BERT ran 23.2 dB under the CNN rules, 29.4 with NNCF's transformer preset (NNCF's own: 30.8)."""
    from qtool.quantizers import patterns as P

    m = zoo.tf2onnx_bert_like()
    found = P.transformer_structure(G.Index(m))
    assert found["attention"] == 2 and found["layer_norm"] == 4, found
    plan = placement.place(m, records(m), rules=CPU)
    assert plan.transformer == found
    ops = {n.name: n.op_type for n in m.graph.node}
    readers = {ops[node] for s in plan.activations for node, _ in s.readers}
    assert readers <= {"MatMul", "Gemm", "Reshape", "Transpose", "Unsqueeze", "Squeeze"}, readers  # residual stream, norms float


def test_a_shape_reader_does_not_keep_the_quantizer_below_a_pass_through_op():
    """tf2onnx reads the Shape of the tensors it Reshapes (Einsum's lowering: Transpose -> Shape and Reshape): a Shape
    reads no values, so the quantizer moves up through the Transpose as it would without it, onto the Add that
    OpenVINO fuses it into (g2p-id BERT's keys and queries: 9 FakeQuantize ops ran alone, 3 with it; 0.96x NNCF's latency)."""
    net = Net()
    net.op("Add", ["x", net.w("bias", (1, 4, 8, 8))], "a")
    net.op("Transpose", ["a"], "t", perm=[0, 1, 3, 2])
    net.op("Shape", ["t"], "shape")
    net.op("Reshape", ["t", net.c("flat", np.array([1, 4, 64], np.int64))], "r")
    net.op("Transpose", ["x"], "xt", perm=[0, 1, 3, 2])
    net.op("Reshape", ["xt", "flat"], "xr")
    net.op("Transpose", ["xr"], "xrt", perm=[0, 2, 1])
    net.op("MatMul", ["r", "xrt"], "y")
    m = net.model(["y", "shape"])
    plan = placement.place(m, records(m), rules=CPU)
    assert "a" in sites(plan) and "t" not in sites(plan) and "n_y" in plan.int8_layers


def test_graph_index_lookups():
    """One index serves placement, the writers and the editors: nodes, producers, readers with
    their slots, constants (not an overridable input's initializer; Constant nodes' values),
    folded constant values, outputs and the data-dependent activations."""
    net = Net()
    net.op("Constant", [], "k", value=numpy_helper.from_array(np.full((4,), 2.0, np.float32), "kv"))
    net.c("shape", np.array([1, 4, 1, 1], np.int64))
    net.op("Reshape", ["k", "shape"], "k4")
    net.conv("x", "c1", 4, 4)
    net.op("Mul", ["c1", "k4"], "m")
    net.op("Add", ["m", "m"], "y")
    proto = net.model(["y"])
    proto.graph.input.append(helper.make_tensor_value_info("bias", FLOAT, [1]))
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.float32), "bias"))
    index = G.Index(proto)
    assert set(index.nodes) == {"n_k", "n_k4", "n_c1", "n_m", "n_y"}
    assert index.producer["m"].name == "n_m" and "x" not in index.producer
    assert [(n.name, slot) for n, slot in index.readers["m"]] == [("n_y", 0), ("n_y", 1)]
    assert set(index.constants) == {"k", "shape", "c1.w"} and set(index.initializers) == {"shape", "c1.w"}
    assert index.values.value("k4").shape == (1, 4, 1, 1) and index.values.value("m") is None
    assert index.outputs == {"y"} and index.inputs == {"x", "bias"}
    assert index.is_data("c1") and index.is_data("y") and not index.is_data("k4") and not index.is_data("c1.w")
    assert index.types["y"] == FLOAT


def test_quantizer_params_follow_kind_policy_and_channels():
    m = _chain()
    plan = placement.place(m, records(m), rules=CPU)
    act, w = plan.activations[0], plan.weights[0]
    assert (act.kind, w.kind) == ("activation", "weight") and plan.quantizers == [*plan.activations, *plan.weights]
    assert act.params().axis is None and float(act.params().scale) == pytest.approx(2.0 / 127)
    wp = w.params()
    assert wp.axis == 0 and np.shape(wp.scale) == (w.values.shape[0],)
    np.testing.assert_allclose(wp.scale, np.abs(w.values).reshape(w.values.shape[0], -1).max(axis=1) / 127, rtol=1e-6)
    act.channel_amax, act.axis = np.array([1.0, 2.0, 4.0, 8.0]), 1  # a depthwise input per channel
    np.testing.assert_allclose(act.params().scale, [1 / 127, 2 / 127, 4 / 127, 8 / 127])


def _stream(blocks=2):
    """A stream of small residual steps: s0 = Conv(x); per block a Conv of the stream, halved, added back."""
    n = Net()
    s = n.conv("x", "s0", 4, 4)
    for b in range(1, blocks + 1):
        step = n.op("Mul", [n.conv(s, f"c{b}", 4, 4), n.c(f"half{b}", np.array(0.5, np.float32))], f"f{b}")
        s = n.op("Add", [step, s], f"s{b}")
    n.conv(s, "head", 4, 4)
    return n.model(["head"])


def _flat(name, amax, counts=None):
    """A record whose |x| is spread evenly over [0, amax] (or over `counts`' bins)."""
    counts = counts or [1] * 64
    return TensorRecord(name, -amax, amax, amax, counts, amax)


def test_a_stream_of_small_steps_sums_in_float_where_it_sets_the_error():
    """Residual Adds whose branch carries 1/16 of the stream's power (placement.moves.STREAM_SHARE) read float when
    their requantizations, summed (two at ~48 dB: 45 dB), are noisier than every other quantizer (48 dB); with a
    noisier quantizer elsewhere (the input's, most of its values in the first of 64 bins) they keep theirs."""
    m = _stream()
    recs = {t: _flat(t, 4.0 if t.startswith("s") else 1.0) for t in M.activation_tensors(m)}
    recs["x"] = _flat("x", 4.0)
    floated = sites(placement.place(m, recs, rules=CPU))
    assert set(floated) == {"x", "s0", "s1", "s2"}  # the halved branches f1, f2 have no quantizer
    assert sorted(floated["s1"].readers) == [("n_c2", 0)]
    recs["x"] = _flat("x", 4.0, [10000] + [0] * 62 + [1])
    kept = sites(placement.place(m, recs, rules=CPU))
    assert {"f1", "f2"} <= set(kept) and ("n_s2", 1) in kept["s1"].readers
    assert set(sites(placement.place(m, recs | {"x": _flat("x", 4.0)}, rules=replace(CPU, lone_sums_float=False)))) \
        == {"x", "s0", "s1", "s2", "f1", "f2"}


def test_a_softmax_written_out_reads_float_logits():
    """trueocr's line reader (tests/zoo.py max_subtracted_confidence_like): its confidence is 1 / sum(exp(logits -
    max(logits))). Quantized on two grids, the logits' (whose range clips the rare top logit) and the max's own, the
    difference at the max was -13 instead of 0 and the confidence 4e5 where the model says 1 (-88 dB; NNCF's default
    preset 24). The Sub of the max asks for nothing, as a Softmax's input: the confidence within 30 dB of FP32 on both
    CPU targets (8.6 dB before), the head Conv still int8, nothing the Sub or the ReduceMax reads quantized."""
    import qtool

    model = zoo.max_subtracted_confidence_like()
    rng = np.random.default_rng(3)
    feeds = [{"features": (np.cumsum(rng.normal(0, 0.4, (2, 8, int(t))), axis=2)
                           + rng.normal(0, 1, (2, 8, int(t)))).astype(np.float32)} for t in rng.integers(20, 60, 24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    for target in ("openvino", "qdq"):
        assert qtool.evaluate(model, cal, data=feeds[16:], target=target).worst_sqnr_db > 30, target
    plan = placement.place(G.copy_model(model), {t.name: t for t in cal.tensors}, rules=CPU)
    assert sorted(plan.int8_layers) == ["/rec/Conv", "/rec/head/Conv"], plan.int8_layers
    assert not [q for q in plan.quantizers if any(node in ("/Sub", "/ReduceMax") for node, _ in q.readers)], plan.quantizers


def test_an_asymmetric_grid_spends_its_finer_step_on_its_tail():
    """A tensor whose negative side is short and whose positive tail runs past the threshold searched for a symmetric
    grid (lore_detect's heads' input: [-5.4, 15.9] calibrated, threshold 10.6): --activations auto picks the
    asymmetric grid for its finer step, and its top is searched again (least expected squared error, rounding plus
    clipping, from the |x| histogram, whose bins above -min are the positive tail alone), so the grid clips less
    (before: [-5.4, 10.6], its heatmap output 13.4 dB in OpenVINO's run, 16.0 with the tail). A tensor with no tail
    past the threshold, or a symmetric one, keeps its range."""
    n = Net()
    n.conv(n.conv("x", "c1", 4, 8), "c2", 8, 4)
    m = n.model(["c2"])
    rec = records(m)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.abs(rng.normal(0, 2.0, 200_000)), rng.uniform(10.6, 15.9, 2_000)])  # bulk, then a tail
    counts, _ = np.histogram(x, bins=2048, range=(0, 16.0))
    rec["c1"] = TensorRecord("c1", -3.0, 15.9, 10.6, counts.tolist(), 16.0)
    flat = np.histogram(np.abs(rng.normal(0, 2.0, 200_000)), bins=2048, range=(0, 16.0))[0].tolist()
    rec["x"] = TensorRecord("x", -1.0, 9.0, 9.0, flat, 16.0)  # its threshold is its maximum: no tail to spend on
    plan = placement.place(m, rec, rules=CPU, policies=policy.Policies())  # --activations auto, export's default
    site = sites(plan)["c1"]
    assert site.policy.symmetric is False
    lo, hi = (float(v) for v in grids.range_from_scale(site.params().scale, site.params().zero_point, site.params().grid))
    assert lo == pytest.approx(-3.0, abs=0.05) and 12.0 < hi <= 15.9, (lo, hi)
    assert sites(plan)["x"].range.amax == 9.0
    assert placement.sites.asymmetric_top(rec["c1"], -3.0, 10.6, 15.9) == pytest.approx(hi, rel=1e-3)


def test_a_layer_left_fp32_says_why_its_input_cannot_be_quantized():
    """A decoder's cross-attention reads learned queries broadcast to the batch (Expand(queries, Shape(x))): no model
    input reaches them, so the MatMul stays FP32, and the reason says so; an integer input says its type."""
    n = Net()
    shape = n.op("Shape", ["x"], "shape")
    queries = n.op("Expand", [n.w("queries", (4, 16)), shape], "broadcast")
    n.op("MatMul", [queries, n.w("wq", (16, 8))], "cross")
    n.op("MatMul", ["x", n.w("wx", (16, 8))], "direct")
    ids = n.op("Cast", ["x"], "ids", to=onnx.TensorProto.INT32)
    n.op("MatMul", [ids, n.c("wi", np.ones((16, 8), np.int32))], "integer")
    m = n.model(["cross", "direct", "integer"], x_shape=(1, 4, 16))
    plan = placement.place(m, records(m), rules=CPU)
    assert "n_direct" in plan.int8_layers
    assert "no model input reaches it" in plan.fp32_layers["n_cross"], plan.fp32_layers
    assert "of type INT32" in plan.fp32_layers["n_integer"], plan.fp32_layers


def _uniform_images(count, hw=32, seed=0):
    rng = np.random.default_rng(seed)
    return [{"images": rng.uniform(0, 1, (1, 3, hw, hw)).astype(np.float32)} for _ in range(count)]


def test_a_concat_input_read_elsewhere_keeps_its_own_range_for_that_reader(monkeypatch):
    """captcha_slider-like (tests/zoo.py csp_concat_branch_like): `small` is read by a Concat with an 8x louder tensor
    and by the Conv of a branch no Concat reads. Moved up through the Concat, one quantizer served both with the
    Concat's range, 8x `small`'s own: the branch's output 23.3 dB. Not moved (the Concat's range over CONCAT_SPREAD x
    `small`'s threshold), the Concat reads `small` float and quantizes its output on the same range as before (the
    head's figure unchanged), and the branch reads `small` on its own grid: 35.6 dB, exact and in OpenVINO's run
    (captcha_slider's mask prototypes 16.4 -> 20.1 dB in OpenVINO's run, NNCF's better preset 17.0;
    docs/benchmarks.md#fid18-concat). TensorRT's file is unchanged, and so is OpenVINO's where the Concat's inputs
    are alike."""
    import qtool
    from qtool.quantizers.placement import moves

    module("openvino")
    model = zoo.csp_concat_branch_like()
    feeds = _uniform_images(24)
    cal = qtool.calibrate(model, data=feeds[:16])
    own = qtool.evaluate(model, cal, data=feeds[16:], target="openvino", runtime="openvino")
    assert [o.name for o in own.outputs] == ["head", "proto"]
    assert own.outputs[1].sqnr_db > 33 and own.runtime.outputs[1].sqnr_db > 33, own
    trt = qtool.export(model, cal, target="tensorrt")
    monkeypatch.setattr(moves, "CONCAT_SPREAD", math.inf)  # moved up into both inputs: the Concat's range for both
    shared = qtool.evaluate(model, cal, data=feeds[16:], target="openvino", runtime="openvino")
    assert qtool.export(model, cal, target="tensorrt") == trt
    assert shared.outputs[1].sqnr_db < 26 and shared.runtime.outputs[1].sqnr_db < 26, shared
    assert own.outputs[0].sqnr_db >= shared.outputs[0].sqnr_db - 0.05
    monkeypatch.undo()
    alike = zoo.csp_concat_branch_like(gain=1.5)
    cal = qtool.calibrate(alike, data=feeds[:16])
    data = qtool.export(alike, cal, target="openvino")
    monkeypatch.setattr(moves, "CONCAT_SPREAD", math.inf)
    assert qtool.export(alike, cal, target="openvino") == data
