"""A model onnxruntime quantized statically in its QOperator format (QLinearConv, QGemm, QLinearAdd ...), read in the
Q/DQ form of the same arithmetic (qtool.model.qoperator) and then kept as its own quantizers (qtool.model.prequantized):
calibrate, the exports and evaluate work on it. Before, every command refused it ("already quantized")."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from runcli import invoke
from zoo import qoperator_float_like, qoperator_quantized

from qtool.model import load_float_model, qoperator


def sqnr(ref, y) -> float:
    ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
    noise = float(((ref - y) ** 2).sum())
    return float("inf") if noise == 0 else 10 * np.log10(float((ref ** 2).sum()) / noise)


def run(model, x, optimized=True):
    opts = ort.SessionOptions()
    if not optimized:  # Q/DQ as the float arithmetic they state
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("qop")
    onnx.save(qoperator_float_like(), d / "float.onnx")
    out = {}
    for per_channel, act in ((False, "uint8"), (True, "int8")):
        path = d / f"q_{act}_{'pc' if per_channel else 'pt'}.onnx"
        qoperator_quantized(d / "float.onnx", path, per_channel=per_channel, activation=act)
        out[(per_channel, act)] = path
    return d, out


@pytest.mark.parametrize("key", [(False, "uint8"), (True, "int8")])
def test_reading_is_the_models_arithmetic(models, key):
    """Every QLinear layer becomes its float op between the model's own grids: no quantized operator is left, every
    QuantizeLinear carries a grid the model states, and the reading computes what onnxruntime computes from the model
    (up to its int8 kernels' own rounding) and stays as close to the float model as they do."""
    folder, paths = models
    given = onnx.load(paths[key])
    found = qoperator.as_qdq(given)
    assert found is not None
    reading, done = found
    assert done["QLinearConv"] == 5 and done["QGemm"] == 1 and done["QLinearMatMul"] == 1 and done["QLinearConcat"] == 1
    ops = {n.op_type for n in reading.graph.node}
    assert not any(op.startswith("QLinear") or op == "QGemm" for op in ops)
    assert {"Conv", "Gemm", "MatMul", "Concat", "AveragePool", "Softmax"} <= ops
    assert all(o.domain != "com.microsoft" for o in reading.opset_import)
    onnx.checker.check_model(reading)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in given.graph.initializer}
    stated = {(float(inits[n.input[i]]), int(inits[n.input[i + 1]])) for n in given.graph.node if n.op_type.startswith("QLinear")
              for i in range(len(n.input) - 1) if n.input[i].endswith("_scale") and n.input[i] in inits and inits[n.input[i]].size == 1}
    r_inits = {t.name: onnx.numpy_helper.to_array(t) for t in reading.graph.initializer}
    grids = {(float(r_inits[n.input[1]]), int(r_inits[n.input[2]])) for n in reading.graph.node if n.op_type == "QuantizeLinear"}
    assert grids <= stated | {(float(inits[n.input[1]]), int(inits[n.input[2]])) for n in given.graph.node
                              if n.op_type == "QuantizeLinear"}
    x = np.random.default_rng(7).random((6, 3, 16, 16)).astype(np.float32)
    ours, theirs, fp32 = run(reading, x, optimized=False), run(str(paths[key]), x), run(str(folder / "float.onnx"), x)
    assert sqnr(theirs, ours) > 28  # onnxruntime's u8 x s8 kernels may saturate on a CPU without VNNI
    assert sqnr(fp32, ours) > 30 and sqnr(fp32, ours) > sqnr(fp32, theirs) - 1


def test_padded_codes_quantized_again(models):
    """A Pad of codes is followed by its grid's Q/DQ pair, as onnxruntime's Q/DQ format writes it (OpenVINO's CPU plugin
    pads FakeQuantize -> Pad(0) -> AveragePool on a shifted u8 grid with code 0, not the zero point: 6.9 dB there)."""
    _, paths = models
    reading, _ = qoperator.as_qdq(onnx.load(paths[(False, "uint8")]))
    made = {o: n for n in reading.graph.node for o in n.output}
    pool = next(n for n in reading.graph.node if n.op_type == "AveragePool")
    chain = [made[pool.input[0]].op_type, made[made[pool.input[0]].input[0]].op_type]
    assert chain == ["DequantizeLinear", "QuantizeLinear"]
    assert made[made[made[pool.input[0]].input[0]].input[0]].op_type == "Pad"


def test_commands_run_on_it(models, tmp_path):
    """calibrate says what it read; the OpenVINO and qdq exports keep the model's arithmetic (the qdq file is the model's
    Q/DQ reading: exact); evaluate --runtime openvino gives a figure; TensorRT refuses onnxruntime's uint8 Q/DQ in one line."""
    folder, paths = models
    model = paths[(False, "uint8")]
    data = tmp_path / "data"
    data.mkdir()
    for i in range(8):
        np.savez(data / f"{i}.npz", x=np.random.default_rng(50 + i).random((1, 3, 16, 16)).astype(np.float32))
    calib = tmp_path / "m.calib.json"
    r = invoke("calibrate", model, "--data", data, "-o", calib)
    assert r.exit_code == 0, r.output
    assert "QOperator format" in r.output and "5 QLinearConv" in r.output
    for target in ("openvino", "qdq"):
        r = invoke("export", "--calib", calib, "--target", target, "-o", tmp_path / f"m.{target}.onnx", "-q")
        assert r.exit_code == 0, r.output
    r = invoke("evaluate", model, "--calib", calib, "--data", data, "--target", "qdq", "--json", "-q")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sqnr_db"] in ("inf", float("inf")) or json.loads(r.stdout)["sqnr_db"] > 100
    r = invoke("evaluate", model, "--calib", calib, "--data", data, "--target", "openvino", "--runtime", "openvino",
               "--json", "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sqnr_db"] > 40 and doc["runtime"]["sqnr_db"] > 30
    r = invoke("export", "--calib", calib, "--target", "tensorrt", "-o", tmp_path / "m.trt.onnx")
    assert r.exit_code == 1 and r.output.count("error:") == 1 and not (tmp_path / "m.trt.onnx").exists()
    assert load_float_model(model).proto.graph.node  # the reading is what every command loads


def test_what_is_not_read_is_refused(models, tmp_path):
    """A QOperator model with an op the reading does not cover (an NHWC kernel of onnxruntime's saved optimizations)
    is left as it is and refused in one line naming it, as before."""
    _, paths = models
    model = onnx.load(paths[(False, "uint8")])
    conv = next(n for n in model.graph.node if n.op_type == "QLinearConv")
    conv.op_type, conv.domain = "NhwcQLinearConv", "com.microsoft"
    assert qoperator.as_qdq(model) is None
    path = tmp_path / "nhwc.onnx"
    onnx.save(model, path)
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "0.npz", x=np.zeros((1, 3, 16, 16), np.float32))
    r = invoke("calibrate", path, "--data", tmp_path / "data", "-o", tmp_path / "n.calib.json")
    assert r.exit_code == 1 and "NhwcQLinearConv" in r.output and "give the FP32 model it was made from" in r.output
    assert r.output.count("\n") == 1 and not (tmp_path / "n.calib.json").exists()
    # a layer whose scale the graph computes: not read either
    model = onnx.load(paths[(False, "uint8")])
    conv = next(n for n in model.graph.node if n.op_type == "QLinearConv")
    model.graph.node.insert(0, helper.make_node("Identity", [conv.input[1]], ["computed_scale"]))
    conv.input[1] = "computed_scale"
    assert qoperator.as_qdq(model) is None


def test_before_opset_13(models):
    """Per-channel weights in a model before opset 13 (a per-axis DequantizeLinear needs 13): read at opset 13 (onnx's
    version converter); a QLinearSoftmax of opset 11's semantics (over the input flattened at `axis`) read as that."""
    _, paths = models
    model = onnx.load(paths[(True, "int8")])
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = 12
    softmax = next(n for n in model.graph.node if n.op_type == "QLinearSoftmax")
    del softmax.attribute[:]
    softmax.attribute.extend([helper.make_attribute("axis", 1), helper.make_attribute("opset", 11)])
    found = qoperator.as_qdq(model)
    assert found is not None
    reading, done = found
    assert done["QLinearSoftmax"] == 1 and next(o.version for o in reading.opset_import if o.domain == "") == 13
    assert "Flatten" in {n.op_type for n in reading.graph.node if "softmax" in n.name.lower()}
    x = np.random.default_rng(3).random((4, 3, 16, 16)).astype(np.float32)
    ours, theirs = run(reading, x, optimized=False), run(model.SerializeToString(), x)
    assert sqnr(theirs, ours) > 30
    probs = ours.reshape(4, -1).sum(axis=1)  # opset 11's softmax: each sample's 9 values sum to 1, not each row of 3
    np.testing.assert_allclose(probs, 1.0, atol=0.03)
