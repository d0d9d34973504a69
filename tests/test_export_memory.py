"""What an export holds in memory besides its model: shape inference is sent the graph, never the weights.

qtool.model.shapes.weightless leaves the weights' data out of what onnx's shape inference reads (and what
qtool.model.shapes.INFERENCES keeps); an export that asked for the types of its finished model with the 8-bit
weights' data in it copied them four times over (BERT-large's OpenVINO export: 433 MB of int8 weights, peak RSS
2.1 -> 3.07 GB in its last seconds, docs/benchmarks.md #big18)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper

import qtool
from qtool.model import lazy, shapes


def _mlp() -> onnx.ModelProto:
    """x [N, 16, 64] -> MatMul 64x256 -> Relu -> MatMul 256x64: 8-bit weights of 16 KB each."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 256)) * 0.1).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((256, 64)) * 0.1).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16, 64])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights_sent(monkeypatch) -> list[str]:
    """Every initializer holding INLINE_BYTES or more of data in a model sent to shape inference from now on."""
    sent: list[str] = []
    infer = shapes.INFERENCES.of

    def of(data: bytes):
        m = onnx.ModelProto.FromString(data)
        sent.extend(f"{t.name} ({TensorProto.DataType.Name(t.data_type)}, {len(t.raw_data)} bytes)"
                    for t in m.graph.initializer if lazy.big(t))
        return infer(data)

    monkeypatch.setattr(shapes.INFERENCES, "of", of)
    return sent


@pytest.mark.parametrize("target", ["openvino", "qdq", "tensorrt"])
def test_export_sends_no_weight_data_to_shape_inference(target, monkeypatch):
    rng = np.random.default_rng(1)
    model = _mlp()
    cal = qtool.calibrate(model, data=[{"x": rng.standard_normal((2, 16, 64)).astype(np.float32)} for _ in range(8)])
    sent = _weights_sent(monkeypatch)
    data = qtool.export(model, cal, target=target)
    written = onnx.load_from_string(data)
    assert sum(len(t.raw_data) for t in written.graph.initializer) >= 2 * 64 * 256  # the weights (8-bit; TensorRT's FP16)
    assert sent == []


def test_prequantized_export_sends_no_weight_data_to_shape_inference(tmp_path, monkeypatch):
    """A model shipped Q/DQ-quantized (int8 weights in it): the OpenVINO export writes its pairs as FakeQuantize
    nodes, asking for the types of the finished model (qtool.targets.openvino._own_pairs_as_fake_quantize)."""
    rng = np.random.default_rng(2)
    feeds = [{"input_features": rng.standard_normal((1, 8, 32)).astype(np.float32)} for _ in range(12)]
    model = zoo.ort_static_qdq(zoo.whisper_encoder_like(), feeds, str(tmp_path))
    assert any(t.data_type == TensorProto.INT8 and lazy.big(t) for t in model.graph.initializer)
    cal = qtool.calibrate(model, data=feeds)
    sent = _weights_sent(monkeypatch)
    data = qtool.export(model, cal, target="openvino")
    assert any(n.op_type == "FakeQuantize" for n in onnx.load_from_string(data).graph.node)
    assert sent == []


def test_tensorrt_fp16_check_runs_the_model_as_written(monkeypatch):
    """The TensorRT export runs its FP16 model once in onnxruntime (autocast._verify) with no optimisation:
    BASIC's constant folding adds an int8 copy of every weight a QuantizeLinear reads, and its runs keep the
    dequantized weights (BERT-large: the export's peak 2.99 GB, 2.22x the model, about 1 GB of it this session)."""
    from qtool.runtime import onnxruntime as ort_runtime
    from qtool.targets.tensorrt import autocast

    levels: list[str | None] = []
    opened = ort_runtime.raw_session

    def raw_session(model, **kw):
        levels.append(kw.get("optimization"))
        return opened(model, **kw)

    monkeypatch.setattr(autocast.onnxruntime, "raw_session", raw_session)
    rng = np.random.default_rng(2)
    model = _mlp()
    cal = qtool.calibrate(model, data=[{"x": rng.standard_normal((2, 16, 64)).astype(np.float32)} for _ in range(8)])
    written = onnx.load_from_string(qtool.export(model, cal, target="tensorrt"))
    assert any(n.op_type == "QuantizeLinear" for n in written.graph.node)
    assert levels and set(levels) == {"none"}
