"""ModelOpt's attention rules for TensorRT, among placement's default exclusions: INT8 keeps the
attention core FP32 above 512 tokens, FP8 when the head size is outside (8, 256]
(graph_utils.find_nodes_from_mha_to_exclude)."""

from __future__ import annotations

import numpy as np
from test_placement import Net, records

from qtool import api
from qtool.model.graph import Index
from qtool.quantizers import placement
from qtool.targets.tensorrt import fp8
from qtool.targets.tensorrt.rules import FP8, TENSORRT, fp8_exclusions

CORE = {"n_scores", "n_ctx"}


def _attention(seq: int, head: int):
    n = Net()
    q = n.op("MatMul", ["x", n.w("wq", (head, head))], "q")
    k = n.op("MatMul", ["x", n.w("wk", (head, head))], "k")
    v = n.op("MatMul", ["x", n.w("wv", (head, head))], "v")
    kt = n.op("Transpose", [k], "kt", perm=[0, 2, 1])
    s = n.op("Softmax", [n.op("MatMul", [q, kt], "scores")], "probs", axis=-1)
    n.op("MatMul", [s, v], "ctx")
    return n.model(["ctx"], x_shape=(1, seq, head))


def test_fp8_attention_core_by_head_size_not_sequence():
    for head, kept in ((8, True), (16, False), (256, False), (320, True)):
        m = _attention(64, head)
        found = FP8.exclusions(Index(m))  # placement's default exclusions for FP8
        assert (CORE <= set(found)) is kept, (head, found)
        if head > 256:  # a head size of 8 or less is also a small MatMul (K < 16), the reason found first
            assert f"head size {head}" in found["n_scores"]
    long = _attention(600, 32)
    assert not CORE & set(FP8.exclusions(Index(long))) and not CORE & set(fp8_exclusions(long))
    assert CORE <= set(TENSORRT.exclusions(Index(long)))  # INT8: sequence length 600 > 512


def test_fp8_placement_quantizes_a_long_sequence_core_int8_does_not():
    long = _attention(600, 32)
    assert CORE <= set(placement.place(long, records(long), rules=FP8).int8_layers)
    assert CORE <= set(placement.place(long, records(long), rules=TENSORRT).fp32_layers)


def test_include_overrides_the_fp8_attention_rule():
    m = _attention(16, 320)  # head size 320: FP16 by default
    rng = np.random.default_rng(0)
    cal = api.calibrate(m, data=[{"x": rng.standard_normal((1, 16, 320)).astype(np.float32)} for _ in range(3)])
    default, _ = fp8.plan(m, cal)
    assert CORE <= set(default.fp32_layers) and "head size 320" in default.fp32_layers["n_scores"]
    assert default.summary()["default_exclusions"]["n_scores"].startswith("attention core with head size 320")
    included, _ = fp8.plan(m, cal, include=sorted(CORE))
    assert CORE <= set(included.int8_layers)
