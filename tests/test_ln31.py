"""Session 31, helper ln31 (docs/benchmarks.md#ln31): a decomposed LayerNorm's input stays float in models without
attention too, as a LayerNormalization op's does and as NNCF's transformer preset leaves it.

Before, on the CPU targets (openvino, qdq), the centring's ReduceMean asked its input x quantized (NNCF's default
preset quantizes OpenVINO's MVN input) and the Sub x - mean(x) read that quantized x; now neither asks, and x keeps a
quantizer only where another op asks for it (a linear layer reading x too). TensorRT's rules never asked there.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qtool import model as M
from qtool.calibration import TensorRecord
from qtool.model import graph as G
from qtool.quantizers import patterns as P
from qtool.quantizers import placement
from qtool.targets.cpu import OPENVINO, QDQ
from qtool.targets.tensorrt.rules import TENSORRT

RNG = np.random.default_rng(31)


def _init(name: str, value):
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def ln_head(second_reader: bool = False):
    """x [8, 16] -> Gemm -> Relu -> h -> decomposed LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul,
    Add) -> Gemm -> y, as openWakeWord's heads are; `second_reader`: a Gemm reads h too (its output a second output)."""
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w1", "b1"], ["g"], name="gemm1", transB=1), n("Relu", ["g"], ["h"], name="relu"),
             n("ReduceMean", ["h"], ["mean"], name="mean", axes=[-1]), n("Sub", ["h", "mean"], ["d"], name="centre"),
             n("Pow", ["d", "two"], ["d2"], name="square"), n("ReduceMean", ["d2"], ["var"], name="var", axes=[-1]),
             n("Add", ["var", "eps"], ["ve"], name="add_eps"), n("Sqrt", ["ve"], ["std"], name="sqrt"),
             n("Div", ["d", "std"], ["z"], name="scale"), n("Mul", ["z", "gamma"], ["zg"], name="gamma"),
             n("Add", ["zg", "beta"], ["ln"], name="beta"), n("Gemm", ["ln", "w2", "b2"], ["y"], name="gemm2", transB=1)]
    inits = [_init("w1", RNG.standard_normal((16, 16))), _init("b1", RNG.standard_normal(16)),
             _init("two", 2.0), _init("eps", 1e-5), _init("gamma", RNG.standard_normal(16)),
             _init("beta", RNG.standard_normal(16)), _init("w2", RNG.standard_normal((4, 16))), _init("b2", np.zeros(4))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])]
    if second_reader:
        nodes.append(n("Gemm", ["h", "w3"], ["y3"], name="gemm3", transB=1))
        inits.append(_init("w3", RNG.standard_normal((2, 16))))
        outputs.append(helper.make_tensor_value_info("y3", TensorProto.FLOAT, [8, 2]))
    g = helper.make_graph(nodes, "ln_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])], outputs,
                          initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def records(proto) -> dict:
    return {name: TensorRecord(name, -2.0, 2.0, 2.0, [1, 1], 2.0) for name in M.activation_tensors(proto)}


def quantized(proto, rules) -> set[str]:
    return {s.tensor for s in placement.place(proto, records(proto), rules=rules).activations}


def test_the_centring_mean_is_found_and_the_model_is_no_transformer():
    m = G.Index(ln_head())
    nodes = {n.name: n for n in m.graph.node}
    assert P.is_centring_mean(m, nodes["mean"]) and not P.is_centring_mean(m, nodes["var"])
    assert P.is_normalization(m, nodes["centre"]) and P.is_normalization(m, nodes["scale"])
    assert P.transformer_structure(m) == {}  # a LayerNorm but no attention: placed as a CNN


def test_a_layernorm_input_has_no_quantizer_on_the_cpu_targets():
    """The LayerNorm's input h was quantized (for its ReduceMean and the Sub reading the same x); now the LayerNorm
    computes in float on h and only the linear layers' inputs are quantized."""
    proto = ln_head()
    for rules in (OPENVINO, QDQ):
        q = quantized(proto, rules)
        assert "h" not in q and "g" not in q, (rules.name, q)
        assert {"x", "ln"} <= q, (rules.name, q)  # the two Gemms stay int8
        assert not {"d", "mean", "z"} & q, (rules.name, q)


def test_a_layernorm_input_a_linear_layer_also_reads_keeps_its_quantizer_for_that_layer():
    proto = ln_head(second_reader=True)
    plan = placement.place(proto, records(proto), rules=OPENVINO)
    assert "h" in {s.tensor for s in plan.activations} and "gemm3" in plan.int8_layers
    # the LayerNorm's own ops read the float h: its quantizer serves gemm3 alone
    assert [s.readers for s in plan.activations if s.tensor == "h"] == [[("gemm3", 0)]]


def test_tensorrt_placement_is_unchanged():
    """TensorRT's rules never asked for a LayerNorm's input (gemm2, K=16 N=4, is TensorRT's small-GEMM exclusion)."""
    assert quantized(ln_head(), TENSORRT) == {"x"}


def test_a_layernormalization_op_reads_its_input_float_too():
    """The same head with the LayerNorm as one LayerNormalization op (opset 17): no rule asks for its input, which
    the decomposed LayerNorm now matches."""
    n = helper.make_node
    nodes = [n("Gemm", ["x", "w1", "b1"], ["g"], name="gemm1", transB=1), n("Relu", ["g"], ["h"], name="relu"),
             n("LayerNormalization", ["h", "gamma", "beta"], ["ln"], name="ln", axis=-1),
             n("Gemm", ["ln", "w2", "b2"], ["y"], name="gemm2", transB=1)]
    inits = [_init("w1", RNG.standard_normal((16, 16))), _init("b1", RNG.standard_normal(16)),
             _init("gamma", RNG.standard_normal(16)), _init("beta", RNG.standard_normal(16)),
             _init("w2", RNG.standard_normal((4, 16))), _init("b2", np.zeros(4))]
    g = helper.make_graph(nodes, "ln_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])], initializer=inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    assert quantized(proto, OPENVINO) == {"x", "ln"}
