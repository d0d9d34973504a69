"""A model shipped quantized in onnxruntime's QDQ format (quantize_static: smart-turn v3, tests/zoo.py
whisper_encoder_like through ort_static_qdq) is quantized once: its own QuantizeLinear -> DequantizeLinear pairs
are its activations' quantizers (qtool.model.prequantized), kept in every export and in the reference; what the model
left float stays float."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import zoo

import qtool
from qtool.model import graph as G
from qtool.model import prequantized

LINEAR = {"Conv", "MatMul", "Gemm"}


def _feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input_features": rng.standard_normal((1, 8, 32)).astype(np.float32)} for _ in range(n)]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    feeds = _feeds(24)
    model = zoo.ort_static_qdq(zoo.whisper_encoder_like(), feeds[:16], str(tmp_path_factory.mktemp("qdq")))
    return model, feeds, qtool.calibrate(model, data=feeds[:16])


def _added(model: onnx.ModelProto, data: bytes) -> list[onnx.NodeProto]:
    """The nodes of an exported file that the model does not have (by name, op and inputs)."""
    given = {(n.name, n.op_type, tuple(n.input)) for n in model.graph.node}
    return [n for n in onnx.load_from_string(data).graph.node if (n.name, n.op_type, tuple(n.input)) not in given]


def test_the_model_s_own_quantizers_are_found(shipped):
    model = shipped[0]
    own = prequantized.own_quantizers(G.Index(model))
    acts = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert own.pairs == len(acts) > 0 and own.quantized == {n.input[0] for n in acts}
    # every linear layer reads its weight through a DequantizeLinear of an int8 constant, its data on a pair's grid
    # (the Transposes of K and the heads' Reshapes pass the grid through)
    for n in model.graph.node:
        if n.op_type in LINEAR:
            assert all(own.reads_own(t) for t in n.input[:2]), n.name
    assert prequantized.own_quantizers(G.Index(zoo.whisper_encoder_like())) == prequantized.NONE


def test_no_second_quantizer_on_what_the_model_quantizes(shipped):
    """Every export keeps the model as it is: no FakeQuantize or Q/DQ pair on a tensor its own pairs quantize
    (before: 13 FakeQuantizes after its DequantizeLinears, the attention's inputs rounded twice), every linear
    layer counted int8 as the model runs it."""
    model, feeds, cal = shipped
    own = prequantized.own_quantizers(G.Index(model))
    for target in ("openvino", "qdq"):
        added = _added(model, qtool.export(model, cal, target=target))
        assert not [n.name for n in added if set(n.input) & own.tensors], target
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    linear = sum(n.op_type in LINEAR for n in model.graph.node)
    assert result.plan_summary["int8_layers"] == linear and result.plan_summary["fp32_layers"] == 0, result.plan_summary
    assert result.plan_summary["activation_quantizers"] == 0


def test_openvino_runs_the_export_as_it_runs_the_model(shipped):
    """The reference is the model's own arithmetic (its Q/DQ as float operations, not onnxruntime's int8 kernels):
    the export's simulation is exact, and OpenVINO (f32 float layers) runs the file exactly as it runs the model as
    shipped; the run's distance from the arithmetic is OpenVINO's own on that model (its floor: the model's
    dequantization scales reassociated in float, a code flipped here and there), within 1 dB (before: the file 4 dB
    below that floor, its simulation 44 dB)."""
    model, feeds, cal = shipped
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino", runtime="openvino")
    run = result.runtime
    assert run.float_precision == "f32"
    assert result.worst_sqnr_db > 100, result.worst_sqnr_db
    own = min(o.sqnr_db for o in run.own)
    floor = min(o.sqnr_db for o in run.fp32)
    assert own > 100 and abs(run.worst_sqnr_db - floor) < 1.0 and floor > 30, (own, run.worst_sqnr_db, floor)


def test_what_the_model_left_float_stays_float(tmp_path):
    """The head Gemm left float by quantize_static (nodes_to_exclude) stays float, named in the summary: the model's
    author chose it, and a quantizer of qtool's there took the look-alike from its own arithmetic to 46 dB (before:
    its input and weight quantized)."""
    feeds = _feeds(20, seed=1)
    model = zoo.ort_static_qdq(zoo.whisper_encoder_like(), feeds[:16], str(tmp_path), exclude=["/head/Gemm"])
    cal = qtool.calibrate(model, data=feeds[:16])
    own = prequantized.own_quantizers(G.Index(model))
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert not own.reads_own(gemm.input[0]) and not own.reads_own(gemm.input[1])
    for target in ("openvino", "qdq"):
        assert not _added(model, qtool.export(model, cal, target=target)), target
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary["fp32_layer_names"] == [gemm.name] and result.worst_sqnr_db > 100, result.plan_summary


def test_its_int8_weights_stay_its_own(tmp_path):
    """At opset 21 (where onnx's reference evaluator computes DequantizeLinear) the model's dequantized int8 weights
    are not folded into float ones to quantize again (before: 15 weight quantizers of qtool's own replaced them):
    every export keeps them, and the model as it is."""
    feeds = _feeds(20, seed=2)
    model = zoo.ort_static_qdq(zoo.whisper_encoder_like(opset=21), feeds[:16], str(tmp_path))
    cal = qtool.calibrate(model, data=feeds[:16])
    own = prequantized.own_quantizers(G.Index(model))
    for target in ("openvino", "qdq"):
        out = onnx.load_from_string(qtool.export(model, cal, target=target))
        made = {o for n in out.graph.node for o in n.output}
        assert own.weights <= made and not _added(model, out.SerializeToString()), target
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary["weight_quantizers"] == 0 and result.worst_sqnr_db > 100, result.plan_summary


def test_evaluate_says_what_its_reference_is(shipped, tmp_path, monkeypatch):
    """evaluate's heading names the reference of a model shipped with its own Q/DQ pairs (the model as given, its
    pairs as float ops), not "FP32", and --json carries it; a float model's heading still says FP32 (before: "vs
    FP32" for both, and no reference in the JSON)."""
    import json

    from runcli import invoke

    model, feeds, cal = shipped
    monkeypatch.chdir(tmp_path)
    for name, proto in (("shipped", model), ("float", zoo.whisper_encoder_like())):
        onnx.save(proto, f"{name}.onnx")
        (tmp_path / name).mkdir()
        for i, f in enumerate(feeds):
            np.savez(tmp_path / name / f"{i}.npz", **f)
        r = invoke("calibrate", f"{name}.onnx", "--data", name, "--output", f"{name}.calib.json")
        assert r.exit_code == 0, r.output
        r = invoke("evaluate", f"{name}.onnx", "--data", name, "--calib", f"{name}.calib.json", "--target", "openvino")
        assert r.exit_code == 0, r.output
        heading = r.stdout.splitlines()[0]
        r = invoke("evaluate", f"{name}.onnx", "--data", name, "--calib", f"{name}.calib.json", "--target", "openvino", "--json")
        reference = json.loads(r.stdout).get("reference")
        if name == "shipped":
            assert " vs the model as given " in heading and "FP32" not in heading, heading
            assert "QuantizeLinear/DequantizeLinear pair(s) computed as float ops" in reference["model"], reference
        else:
            assert " vs FP32 " in heading and reference is None, (heading, reference)
