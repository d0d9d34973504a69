"""Look-alikes for the SmoothQuant tests (built from tests/zoo.py's pieces)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper
from zoo import _conv_w, _encoder_layer, _Graph, _layer_norm, _make_model

FLOAT = TensorProto.FLOAT


def vit_decomposed(d=32, heads=2, patch=8, classes=10, opset=17):
    """zoo.vit_like with its LayerNorms decomposed (ReduceMean, Sub, Pow, Sqrt, Div, then Mul by
    gamma and Add of beta), the [CLS] token taken first (no Concat) and an outlier channel in the
    position embeddings: pre-norm, so each LayerNorm's output feeds linear layers only."""
    g = _Graph(34)
    t = g.op("Conv", ["pixel_values", g.init("patch.weight", _conv_w(g.rng, d, 3, patch)), g.init("patch.bias", np.zeros(d, np.float32))],
             "/patch", kernel_shape=[patch, patch], strides=[patch, patch])
    x = g.op("Transpose", [g.op("Reshape", [t, g.init("tokens_shape", np.array([0, d, -1], np.int64))], "/patch")], "/patch", perm=[0, 2, 1])
    tokens = (32 // patch) ** 2
    pos = (g.rng.standard_normal((1, tokens, d)) * 0.2).astype(np.float32)
    pos[..., 5] += 6.0
    x = g.op("Add", [x, g.init("position_embeddings", pos)], "/embeddings")
    x = _encoder_layer(g, x, d, heads, "/layer.0", False, "tanh", pre_norm=True)
    gain = np.ones(d, np.float32)
    gain[7] = 9.0  # an outlier channel of the final LayerNorm's output
    x = _layer_norm(g, x, d, "/ln_f", False, gain)
    x = g.op("Gather", [x, g.init("cls_index", np.array(0, np.int64))], "/pool", axis=1)
    w = g.init("head.weight", (g.rng.standard_normal((classes, d)) / np.sqrt(d)).astype(np.float32))
    y = g.op("Gemm", [x, w, g.init("head.bias", np.zeros(classes, np.float32))], "/head", outputs=["logits"], transB=1)
    graph = g.graph("vit_decomposed", [helper.make_tensor_value_info("pixel_values", FLOAT, ["n", 3, 32, 32])],
                    [helper.make_tensor_value_info(y, FLOAT, ["n", classes])])
    return _make_model(graph, opset, producer="pytorch")
