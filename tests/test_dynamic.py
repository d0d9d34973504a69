"""A model onnxruntime quantized dynamically (quantize_dynamic: DynamicQuantizeLinear + ConvInteger /
MatMulInteger, com.microsoft DynamicQuantizeLSTM), as popular packages ship them (ddddocr's OCR
model), read as the float model it was made from (qtool.model.dynamic): calibrate, every export,
inspect and evaluate work on it as on an FP32 model, evaluate's reference being the model as given;
other quantized models (NhwcQLinearConv, ...) get a one-line error."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from avx2 import saturates_here
from onnx import TensorProto, helper, numpy_helper
from runcli import invoke

from qtool import QtoolError
from qtool.model import dynamic, load_float_model, load_model

H, C = 16, 3  # input [1, 3, 16, W]: a CRNN's strip of text, W varies


def crnn_like() -> onnx.ModelProto:
    """Conv (bias, SiLU) -> Conv -> columns as a sequence -> bidirectional LSTM -> MatMul + Add: the
    layers ddddocr's quantized OCR model has, in float."""
    rng = np.random.default_rng(3)

    def w(name, *shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    hidden, feat = 6, 8 * (H // 2)
    inits = [w("conv1.weight", 8, C, 3, 3), w("conv1.bias", 8, s=0.1), w("conv2.weight", 8, 8, 3, 3, s=0.2),
             w("W", 2, 4 * hidden, feat, s=0.1), w("R", 2, 4 * hidden, hidden), w("B", 2, 8 * hidden, s=0.1),
             w("head.weight", 2 * hidden, 5), w("head.bias", 5, s=0.1),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "seq_shape"),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "out_shape")]
    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], "conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c1"], ["s1"], "sig1"),
        helper.make_node("Mul", ["c1", "s1"], ["a1"], "silu1"),
        helper.make_node("Conv", ["a1", "conv2.weight"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c2"], ["t"], "to_seq", perm=[3, 0, 1, 2]),  # [W/2, 1, 8, H/2]
        helper.make_node("Reshape", ["t", "seq_shape"], ["seq"], "flatten"),
        helper.make_node("LSTM", ["seq", "W", "R", "B"], ["Y"], "lstm", hidden_size=hidden, direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["Yt"], "gather_dirs", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["Yt", "out_shape"], ["Yr"], "join_dirs"),
        helper.make_node("MatMul", ["Yr", "head.weight"], ["mm"], "head"),
        helper.make_node("Add", ["mm", "head.bias"], ["logits"], "head_bias"),
    ]
    graph = helper.make_graph(nodes, "crnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, "width"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["time", 1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def quantized(tmp_path, per_channel=False):
    """(the float model's path, onnxruntime's quantize_dynamic of it)."""
    from onnxruntime.quantization import quantize_dynamic

    src, out = tmp_path / "float.onnx", tmp_path / ("model_pc.onnx" if per_channel else "model.onnx")
    onnx.save(crnn_like(), src)
    quantize_dynamic(str(src), str(out), per_channel=per_channel)
    return src, out


def old_style() -> onnx.ModelProto:
    """One Conv as older onnxruntime wrote it (ddddocr's model, producer onnx.quantize 0.1.0): uint8
    weights, the bias requantized at run time (Cast(int32, Floor(Div(b, Mul(xs, Ws))))) and added
    to ConvInteger's int32 result before the Cast."""
    rng = np.random.default_rng(5)
    wq = rng.integers(0, 256, (4, C, 3, 3)).astype(np.uint8)
    inits = [numpy_helper.from_array(wq, "w_quantized"), numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(121, np.uint8), "w_zero_point"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.5).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, -1, 1, 1], np.int64), "b_shape")]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xzp"]),
        helper.make_node("Mul", ["xs", "w_scale"], ["b_scale"]),
        helper.make_node("Div", ["b", "b_scale"], ["b_tmp"]),
        helper.make_node("Floor", ["b_tmp"], ["b_rounded"]),
        helper.make_node("Cast", ["b_rounded"], ["b_quantized"], to=TensorProto.INT32),
        helper.make_node("ConvInteger", ["xq", "w_quantized", "xzp", "w_zero_point"], ["y_int"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["b_quantized", "b_shape"], ["b_reshaped"]),
        helper.make_node("Add", ["y_int", "b_reshaped"], ["y_biased"]),
        helper.make_node("Cast", ["y_biased"], ["y_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "w_scale"], ["Conv_0_quant_scales_mul:0"]),
        helper.make_node("Mul", ["y_float", "Conv_0_quant_scales_mul:0"], ["y"]),
        helper.make_node("Sigmoid", ["y"], ["out"]),
    ]
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 8, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0].astype(np.float64)


def sqnr(ref, out) -> float:
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - out) ** 2)))


def inits(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("per_channel", [False, True])
def test_read_as_the_float_model_it_was_made_from(tmp_path, per_channel):
    src, path = quantized(tmp_path, per_channel)
    given = onnx.load(path)
    loaded = load_float_model(path)
    assert loaded.given is not None and loaded.sha256 == load_model(path).sha256  # calibrations record the file as given
    assert loaded.rewritten == "2 ConvInteger -> Conv, 1 DynamicQuantizeLSTM -> LSTM, 1 MatMulInteger -> MatMul"
    f = loaded.proto
    onnx.checker.check_model(f)
    ops = sorted(n.op_type for n in f.graph.node)
    assert ops == sorted(n.op_type for n in crnn_like().graph.node), ops  # no integer op, Cast or scale Mul left
    assert [n.name for n in f.graph.node if n.op_type in ("Conv", "LSTM", "MatMul")] == ["conv1", "conv2", "lstm", "head"]
    q, w = inits(given), inits(f)
    by = {n.name: n for n in f.graph.node}
    # each weight (Wq - zp) * scale in float32, exactly; the float bias as the model had it
    conv = by["conv1"]
    expect = (q["conv1.weight_quantized"].astype(np.int32) - q["conv1.weight_zero_point"].astype(np.int32)).astype(np.float32)
    np.testing.assert_array_equal(w[conv.input[1]], expect * q["conv1.weight_scale"])
    np.testing.assert_array_equal(w[conv.input[2]], inits(crnn_like())["conv1.bias"])
    lstm = by["lstm"]
    wq, ws, wz = q["W_quantized"], q["W_scale"], q["W_zero_point"]
    dq = (wq.astype(np.int32) - wz.reshape(2, 1, -1)).astype(np.float32) * ws.reshape(2, 1, -1)
    np.testing.assert_array_equal(w[lstm.input[1]], dq.transpose(0, 2, 1))
    assert w[lstm.input[1]].shape == (2, 24, 64) and w[lstm.input[2]].shape == (2, 24, 6)
    head = by["head"]
    hz = q["head.weight_zero_point"]
    np.testing.assert_array_equal(w[head.input[1]], (q["head.weight_quantized"].astype(np.int32) - hz).astype(np.float32)
                                  * q["head.weight_scale"])
    # the float reading is close to both the model quantized and the float model it came from
    x = np.random.default_rng(0).random((1, C, H, 20)).astype(np.float32)
    ref_float, ref_given, out = run(crnn_like(), x), run(given, x), run(f, x)
    assert out.shape == ref_given.shape == (10, 1, 5)
    assert sqnr(ref_float, out) > 30, sqnr(ref_float, out)
    if not saturates_here():  # the model as given is onnxruntime's u8 x s8 kernels, whose pair sums saturate on AVX2-only CPUs
        assert sqnr(ref_given, out) > 30, sqnr(ref_given, out)


def test_older_onnxruntime_bias_requantised_at_run_time():
    model = old_style()
    f, done = dynamic.as_float(model)
    assert done.describe() == "1 ConvInteger -> Conv"
    assert [n.op_type for n in f.graph.node] == ["Conv", "Sigmoid"]
    conv = f.graph.node[0]
    assert conv.name == "Conv_y" and list(conv.input[2:]) == ["b"] and list(conv.output) == ["y"]
    w = inits(f)[conv.input[1]]
    np.testing.assert_array_equal(w, (inits(model)["w_quantized"].astype(np.int32) - 121).astype(np.float32) * np.float32(0.01))
    x = np.random.default_rng(1).standard_normal((1, C, 8, 8)).astype(np.float32)
    assert sqnr(run(model, x), run(f, x)) > 35


def test_other_quantized_models_are_refused(tmp_path):
    """A statically quantized QOperator model with an op qtool does not read (NhwcQLinearConv) and a ConvInteger outside the pattern:
    one line naming the op and what to do, no file written."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    src = tmp_path / "float.onnx"
    onnx.save(crnn_like(), src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": np.random.default_rng(i).random((1, C, H, 12)).astype(np.float32)} for i in range(2)])

        def get_next(self):
            return next(self.items, None)

    static = tmp_path / "static.onnx"
    quantize_static(str(src), str(static), Reader(), quant_format=QuantFormat.QOperator, op_types_to_quantize=["Conv"])
    model = onnx.load(static)  # QLinearConv is read (tests/test_qoperator.py); onnxruntime's NHWC kernel of it is not
    for n in model.graph.node:
        if n.op_type == "QLinearConv":
            n.op_type, n.domain = "NhwcQLinearConv", "com.microsoft"
    onnx.save(model, static)
    folder = tmp_path / "calib"
    folder.mkdir()
    np.savez(folder / "0.npz", x=np.random.default_rng(0).random((1, C, H, 12)).astype(np.float32))
    r = invoke("calibrate", static, "--data", folder, "-o", tmp_path / "s.calib.json")
    assert r.exit_code == 1 and "NhwcQLinearConv" in r.output and "give the FP32 model it was made from" in r.output, r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output and not (tmp_path / "s.calib.json").exists()

    model = old_style()
    model.graph.node[0].op_type = "Identity"  # ConvInteger's input no longer quantized by a DynamicQuantizeLinear
    del model.graph.node[0].output[1:]
    model.graph.node.insert(0, helper.make_node("DynamicQuantizeLinear", ["x"], ["unused", "xs", "xzp"]))
    with pytest.raises(QtoolError, match="ConvInteger node 'y_int' is not in the pattern onnxruntime's quantize_dynamic writes"):
        dynamic.as_float(model)
    model = old_style()  # weight scales [C] multiply the output [N, C, H, W] along W, not per channel: not read as per channel
    scale = next(t for t in model.graph.initializer if t.name == "w_scale")
    scale.CopyFrom(numpy_helper.from_array(np.full(4, 0.01, np.float32), "w_scale"))
    with pytest.raises(QtoolError, match="one weight scale and zero point, or one per output channel"):
        dynamic.as_float(model)


def test_calibrate_export_inspect_evaluate(tmp_path, monkeypatch):
    """Before: calibrate and every export exited 0, but the TensorRT file kept ConvInteger
    (inspect: broken), and evaluate took the model for an export without provenance (exit 1)."""
    monkeypatch.chdir(tmp_path)
    _, path = quantized(tmp_path)
    for kind, count, seed in (("calib", 8, 0), ("held", 4, 100)):
        (tmp_path / kind).mkdir()
        for i in range(count):
            width = 12 + 4 * (i % 3)
            np.savez(tmp_path / kind / f"{i}.npz", x=np.random.default_rng(seed + i).random((1, C, H, width)).astype(np.float32))
    r = invoke("calibrate", path, "--data", tmp_path / "calib")
    assert r.exit_code == 0, r.output
    assert "read as the float model it was made from (2 ConvInteger -> Conv, 1 DynamicQuantizeLSTM -> LSTM" in r.output
    for target in ("tensorrt", "openvino", "qdq"):
        r = invoke("export", path, "--target", target)
        assert r.exit_code == 0, r.output
    trt = onnx.load(tmp_path / "model.trt.onnx")
    assert not {n.op_type for n in trt.graph.node} & {"ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeLSTM"}
    r = invoke("inspect", tmp_path / "model.trt.onnx", "--trt-version", "10.3")
    assert r.exit_code == 0, r.output
    r = invoke("inspect", "model.calib.json", "--model", path)  # coverage of the float reading's tensors
    assert r.exit_code == 0, r.output

    r = invoke("evaluate", path, "--data", tmp_path / "held", "--target", "openvino", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    ref = doc["reference"]
    assert ref["model"].startswith("as given: quantized dynamically by onnxruntime")
    assert float(ref["float_reading_sqnr_db"]) < 80  # the float reading is not the model as given: its own error, measured
    assert saturates_here() or float(ref["float_reading_sqnr_db"]) > 30  # far less where onnxruntime's int8 pair sums saturate
    assert doc["quantization"]["int8_layers"] >= 3 and (saturates_here() or float(doc["sqnr_db"]) > 15)
    # the exported file against its recorded model (as given): the same numbers
    r = invoke("evaluate", "model.openvino.onnx", "--data", tmp_path / "held", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sqnr_db"] == doc["sqnr_db"]
    r = invoke("evaluate", path, "--data", tmp_path / "held", "--target", "qdq")
    assert r.exit_code == 0 and "quantized dynamically by onnxruntime" in r.output and " dB from it" in r.output, r.output


def test_python_api_and_tensors(tmp_path):
    """qtool.evaluate on the model as given (a path or its ModelProto): the reference is that model, and
    per_tensor ranks the float reading's quantizers."""
    import qtool

    _, path = quantized(tmp_path)
    calib = [{"x": np.random.default_rng(i).random((1, C, H, 12 + 4 * (i % 2))).astype(np.float32)} for i in range(6)]
    held = [{"x": np.random.default_rng(50 + i).random((1, C, H, 16)).astype(np.float32)} for i in range(3)]
    cal = qtool.calibrate(path, data=calib)
    assert not any("already contains" in w for w in cal.warnings)
    by_path = qtool.evaluate(path, cal, data=held, target="openvino", per_tensor=True)
    assert by_path.tensors and all(t.kind in ("activation", "weight") for t in by_path.tensors)
    by_proto = qtool.evaluate(onnx.load(path), qtool.calibrate(onnx.load(path), data=calib), data=held, target="openvino")
    assert by_proto.worst_sqnr_db == pytest.approx(by_path.worst_sqnr_db, abs=1e-9)
    # the reference is the model as given: the file qtool exports, scored against it by hand, gives the same number
    data = qtool.export(path, cal, target="openvino")
    from qtool.checks import simulate

    sim = simulate.simulation(data)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    refs = [ref.run(None, h)[0].astype(np.float64) for h in held]
    outs = [sim.run(None, h)[0].astype(np.float64) for h in held]
    signal = sum(float(np.sum(r ** 2)) for r in refs)
    noise = sum(float(np.sum((r - o) ** 2)) for r, o in zip(refs, outs))
    assert by_path.worst_sqnr_db == pytest.approx(10 * np.log10(signal / noise), abs=1e-3)


def test_a_lazily_loaded_model_s_dequantized_weights_are_computed_when_read(tmp_path, monkeypatch):
    """Loaded lazily (as calibrate loads every model), the float weights a dynamically quantized model is read with
    are computed from its integer weights each time they are read, not held in the graph beside them
    (tashkeel_bilstm: 17 MB of float32 from 4 MB of int8, in the proto and in each serialization of it for
    onnxruntime's sessions: calibrate 190 -> 140 MB); the same values, calibration and exports as the model
    read whole. Past bigmodel.LAZY_BYTES of lazy weights (where nchwc would give up the blocked layout) they are lazy
    all the same but count as held in the graph (test_memt23)."""
    import qtool
    from qtool import calibration
    from qtool.model import bigmodel, lazy

    _, path = quantized(tmp_path)
    whole, read = load_float_model(path), load_float_model(path, lazy=True)
    given = {t.name for t in whole.given.graph.initializer}
    made = {t.name: numpy_helper.to_array(t) for t in whole.proto.graph.initializer
            if t.name not in given and t.ByteSize() >= lazy.INLINE_BYTES}
    assert len(made) == 3  # conv2's weight, the LSTM's W and R (conv1's, 864 bytes, stays in the graph)
    weights = [t for t in read.proto.graph.initializer if t.name in made]
    assert len(weights) == 3 and all(lazy.is_lazy(t) for t in weights)  # before: float copies in the graph
    assert all(isinstance(lazy.entry(t), lazy.Computed) and np.array_equal(lazy.value(t), made[t.name]) for t in weights)
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 8 << 10)  # the integer weights as float32 (16.9 KB) pass it: held
    beyond = load_float_model(path, lazy=True)  # held: its store lives as long as it
    assert all(lazy.held(t) for t in beyond.proto.graph.initializer if t.name in made)
    monkeypatch.undo()
    calib = [{"x": np.random.default_rng(i).random((1, C, H, 12 + 4 * (i % 2))).astype(np.float32)} for i in range(4)]
    cal = qtool.calibrate(path, data=calib)
    assert json.loads(calibration.to_json(cal))["tensors"] == json.loads(calibration.to_json(qtool.calibrate(onnx.load(path), data=calib)))["tensors"]
    exports = {t: qtool.export(path, cal, target=t) for t in ("openvino", "qdq", "tensorrt")}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)  # export reads the model lazily too
    for target, data in exports.items():
        assert qtool.export(path, cal, target=target) == data, target


def test_a_quantized_embedding_table_is_read_as_the_float_table(tmp_path, monkeypatch):
    """text2tashkeel's rawi/bilstm models: quantize_dynamic also quantizes the embedding Gather (a uint8
    table, its rows dequantized after the Gather and again after the Transpose to time-first). Before:
    those DequantizeLinears (uint8, zero point 155) were copied into the TensorRT file, and `qtool
    inspect` of qtool's own export failed (int8-only, zero-point: 4 violations)."""
    import zoo
    from onnxruntime.quantization import quantize_dynamic

    monkeypatch.chdir(tmp_path)
    src, path = tmp_path / "float.onnx", tmp_path / "tagger.onnx"
    onnx.save(zoo.embedding_bilstm_tagger_like(), src)
    quantize_dynamic(str(src), str(path))
    given = onnx.load(path)
    table = next(t for t in given.graph.initializer if t.name == "embedding.weight_quantized")
    assert table.data_type == TensorProto.UINT8 and sum(n.op_type == "DequantizeLinear" for n in given.graph.node) == 2

    loaded = load_float_model(path)
    ops = [n.op_type for n in loaded.proto.graph.node]
    assert "DequantizeLinear" not in ops and "Gather of the float table" in loaded.rewritten
    onnx.checker.check_model(loaded.proto, full_check=True)
    gather = next(n for n in loaded.proto.graph.node if n.op_type == "Gather" and n.input[1] == "ids")
    floats = {t.name: numpy_helper.to_array(t) for t in loaded.proto.graph.initializer}
    scale = numpy_helper.to_array(next(t for t in given.graph.initializer if t.name == "embedding.weight_scale"))
    zp = numpy_helper.to_array(next(t for t in given.graph.initializer if t.name == "embedding.weight_zero_point"))
    expect = (numpy_helper.to_array(table).astype(np.int32) - int(zp)).astype(np.float32) * scale
    np.testing.assert_array_equal(floats[gather.input[0]], expect)  # DequantizeLinear's values, exactly
    # the tensors keep the float model's names: the embedding rows and the time-first sequence
    assert {"e", "et"} <= {o for n in loaded.proto.graph.node for o in n.output}
    ids = np.random.default_rng(1).integers(0, 40, (2, 9)).astype(np.int64)
    ref = ort.InferenceSession(str(path)).run(None, {"ids": ids})[0]
    out = ort.InferenceSession(loaded.proto.SerializeToString()).run(None, {"ids": ids})[0]
    assert saturates_here() or sqnr(ref, out) > 30  # the model as given: onnxruntime's int8 kernels (AVX2-only: saturating)

    for kind, count, seed in (("calib", 8, 0), ("held", 4, 100)):
        (tmp_path / kind).mkdir()
        for i in range(count):
            rng = np.random.default_rng(seed + i)
            np.savez(tmp_path / kind / f"{i}.npz", ids=rng.integers(0, 40, (1, 6 + i)).astype(np.int64))
    r = invoke("calibrate", path, "--data", tmp_path / "calib")
    assert r.exit_code == 0, r.output
    r = invoke("export", path, "--target", "tensorrt", "--trt-version", "11.4")
    assert r.exit_code == 0, r.output
    trt = onnx.load(tmp_path / "tagger.trt.onnx")
    assert all(numpy_helper.to_array(t).dtype != np.uint8 for t in trt.graph.initializer)
    r = invoke("inspect", tmp_path / "tagger.trt.onnx", "--trt-version", "11.4")
    assert r.exit_code == 0, r.output
    r = invoke("evaluate", path, "--data", tmp_path / "held", "--target", "openvino", "--json")
    assert r.exit_code == 0, r.output


_MEMORY_CHILD = """
import sys
import onnx
from qtool.model import as_float, load_model

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

loaded = load_model(sys.argv[1])
before = rss()
float_model = as_float(loaded).proto
print(rss() - before, float_model.ByteSize())
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_the_float_model_holds_its_weights_once(tmp_path):
    """The float model read from a dynamically quantized one takes about its own size in memory:
    protobuf keeps everything a message ever held until the whole message goes, so the rewritten
    model also held the int8 weights, the node lists rebuilt per layer and the float weights' copies
    (ddddocr's CRNN: 120 MB for a 54 MB model, kept for the whole calibration)."""
    import subprocess
    import sys

    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    width, layers = 768, 12  # 28 MB of float weights, 7 MB as int8
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) * 0.05).astype(np.float32), f"w{k}")
             for k in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k - 1}", f"w{k}"], [f"h{k}" if k < layers - 1 else "y"], f"mm{k}")
             for k in range(layers)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    src, out = tmp_path / "float.onnx", tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    quantize_dynamic(str(src), str(out))
    child = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(out)], capture_output=True, text=True, check=True)
    grown, size = map(int, child.stdout.split())
    assert size > 28e6
    assert grown < 1.3 * size, (grown, size)  # 1.02x; was 2.4x (69 MB for a 28 MB model)


def _dynamic_mlp(tmp_path, width=256, layers=4) -> tuple:
    """(the float model's path, onnxruntime's quantize_dynamic of it): a chain of `layers` MatMuls of width x width."""
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((width, width)) * 0.05).astype(np.float32), f"w{k}")
             for k in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if k == 0 else f"h{k - 1}", f"w{k}"], [f"h{k}" if k < layers - 1 else "y"], f"mm{k}")
             for k in range(layers)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])], inits)
    src, out = tmp_path / "float.onnx", tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), src)
    quantize_dynamic(str(src), str(out))
    return src, out


def test_a_lazily_loaded_dynamic_model_keeps_its_integers_where_they_lie(tmp_path, monkeypatch):
    """Loaded lazily (as calibrate loads every model), a model onnxruntime quantized dynamically keeps its int8 weights
    in its file, as the float weights computed from them are: held in the graph of the model as given (LoadedModel.given,
    alive for the whole calibration), they stood beside the session's (t5_title_decoder: 58 MB). The same float
    reading, calibration, exports and evaluation reference; a model not quantized dynamically keeps its integers in its
    graph, as before."""
    import qtool
    from qtool import calibration
    from qtool.model import bigmodel, lazy

    _, path = _dynamic_mlp(tmp_path)
    whole, read = load_float_model(path), load_float_model(path, lazy=True)
    integers = sum(t.ByteSize() for t in whole.given.graph.initializer if t.data_type == TensorProto.INT8)
    assert integers > 4 * 256 * 256
    assert read.given.ByteSize() < integers / 50, (read.given.ByteSize(), integers)  # before: the integers in the graph
    weights = [t for t in read.given.graph.initializer if t.data_type == TensorProto.INT8 and t.dims]
    assert len(weights) == 4 and all(isinstance(lazy.entry(t), lazy.Source) for t in weights)
    assert all(np.array_equal(lazy.value(t), numpy_helper.to_array(w)) for t, w in zip(weights, (
        next(w for w in whole.given.graph.initializer if w.name == t.name) for t in weights)))
    assert all(np.array_equal(lazy.value(a), lazy.value(b)) for a, b in zip(read.proto.graph.initializer, whole.proto.graph.initializer))
    # the reading evaluate's reference makes of the model as given (its int8 weights as uint8), from lazy integers
    lazy_pairs, pairs = dynamic.without_pair_saturation(read.given), dynamic.without_pair_saturation(whole.given)
    assert lazy_pairs[1] == pairs[1] == 4
    shifted = {t.name: lazy.value(t) for t in pairs[0].graph.initializer if t.data_type == TensorProto.UINT8}
    lazy_shifted = {t.name: lazy.value(t) for t in lazy_pairs[0].graph.initializer if t.data_type == TensorProto.UINT8}
    assert len(shifted) == 8 and shifted.keys() == lazy_shifted.keys()  # 4 weights and their zero points
    assert all(np.array_equal(lazy_shifted[n], v) for n, v in shifted.items())
    calib = [{"x": np.random.default_rng(i).standard_normal((2, 256)).astype(np.float32)} for i in range(3)]
    cal = qtool.calibrate(path, data=calib)
    assert json.loads(calibration.to_json(cal))["tensors"] == json.loads(calibration.to_json(qtool.calibrate(onnx.load(path), data=calib)))["tensors"]
    exports = {t: qtool.export(path, cal, target=t) for t in ("openvino", "qdq")}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)  # export reads it lazily too
    for target, data in exports.items():
        assert qtool.export(path, cal, target=target) == data, target
    monkeypatch.undo()
    held = tmp_path / "held"
    held.mkdir()
    np.savez(held / "0.npz", x=calib[0]["x"])
    calibration.save(cal, tmp_path / "m.calib.json")
    from qtool.quantizers import cpu_kinds

    monkeypatch.setattr(cpu_kinds, "is_x86", lambda: True)  # evaluate's reference reads the integers again (as uint8)
    monkeypatch.setattr(cpu_kinds, "vnni", lambda: False)

    def reference():
        r = invoke("evaluate", path, "--calib", tmp_path / "m.calib.json", "--data", held, "--target", "qdq", "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["reference"]
    whole_reference = reference()
    assert whole_reference["unsaturated_layers"] == 4
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)  # and so does evaluate
    assert reference() == whole_reference
    monkeypatch.undo()
    src = tmp_path / "float.onnx"  # a model not quantized dynamically: its integers in its graph
    model = onnx.load(src)
    model.graph.initializer.append(numpy_helper.from_array(np.arange(4096, dtype=np.int64).astype(np.int8), "table"))
    onnx.save(model, src)
    assert not any(lazy.is_lazy(t) for t in load_model(src, lazy=True).proto.graph.initializer if t.data_type == TensorProto.INT8)


@pytest.mark.parametrize("gain", [400.0, 40.0])
def test_a_model_whose_own_grids_crush_its_channels_is_not_smoothed(tmp_path, monkeypatch, gain):
    """A model shipped dynamic-int8 whose own grids round most MLP channels to a few codes (t5_title_encoder's class:
    2.4 dB from its float reading) is scored against its own arithmetic: SmoothQuant rounds the MLP's input otherwise,
    nearer the float reading and away from the model. Before: smoothed, 21.2 dB from the model as given (its float
    reading 23.9); now unsmoothed and its per-tensor int8 weights as they are, 24.3. At gain 40 (nothing crushed, the
    model 28 dB from its float reading) SmoothQuant stays, as for any transformer (27.6 dB both)."""
    import zoo

    monkeypatch.chdir(tmp_path)
    onnx.save(zoo.dynamic_outlier_encoder_like(gain=gain), tmp_path / "model.onnx")
    for kind, count, seed in (("calib", 16, 0), ("held", 8, 100)):
        (tmp_path / kind).mkdir()
        for i in range(count):
            r = np.random.default_rng(seed + i)
            np.savez(tmp_path / kind / f"{i}.npz", input_ids=r.integers(0, 200, (2, 24)).astype(np.int64),
                     attention_mask=np.ones((2, 24), np.int64))
    assert invoke("calibrate", "model.onnx", "--data", "calib").exit_code == 0
    r = invoke("export", "model.onnx", "--target", "openvino", "--json")
    assert r.exit_code == 0, r.output
    smoothed = json.loads(r.stdout).get("smooth_quant")
    assert all(p.key != dynamic.GRIDS_KEY for p in onnx.load(tmp_path / "model.openvino.onnx").metadata_props)  # the reading's note
    r = invoke("evaluate", "model.onnx", "--data", "held", "--target", "openvino", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    own = float(doc["reference"]["float_reading_sqnr_db"])
    if gain == 400.0:
        assert smoothed is None
        if not saturates_here():  # the model as given computed by onnxruntime's int8 kernels without saturating pair sums
            assert own < 25 and float(doc["sqnr_db"]) > own  # nearer the model than its own float reading is (before: 21.2 against 23.9)
    else:
        assert own > 27 and smoothed is not None and float(doc["sqnr_db"]) > 27
    # the text names how far the model as given is from its own float reading when that is far (t5_title_encoder: 2.4 dB)
    import qtool.cli.evaluate as cli_evaluate

    monkeypatch.setattr(cli_evaluate, "FAR_FROM_FLOAT_DB", 25.0)  # between this model's two readings (23.9, 28.4 dB)
    r = invoke("evaluate", "model.onnx", "--data", "held", "--target", "openvino")
    assert r.exit_code == 0, r.output
    assert ("from its own float reading: its dynamic int8 loses that much" in r.output) == (own < 25), r.output


def test_the_note_names_pair_saturation_where_it_is_this_cpus(tmp_path, monkeypatch):
    """A MatMul whose products are all large (inputs in [0, 1), weights near the top of their grid), quantized
    dynamically: on an x86 CPU without VNNI onnxruntime's u8 x s8 kernel adds pairs of them in int16 with saturation,
    and the model as given is far from its float reading for that reason alone (t5_title_encoder on this AVX2 EPYC:
    -18.6 dB, 2.6 from the same integers computed without saturating). evaluate measures it against the same integers
    with the weights stored uint8 (zero point + 128: no saturation) and its note names the CPU; on a CPU with VNNI,
    or not x86, nothing is measured and the note does not name it."""
    ref = _saturating_matmul_reference(tmp_path, monkeypatch)
    r = invoke("evaluate", "model.onnx", "--data", "held", "--target", "qdq")
    named = "onnxruntime's u8 x s8 kernels add pairs of products in int16 with saturation" in r.output
    if saturates_here():
        assert ref["unsaturated_layers"] == 1 and float(ref["float_reading_sqnr_db"]) < 20, ref
        assert float(ref["unsaturated_sqnr_db"]) < 20 and float(ref["float_reading_vs_unsaturated_sqnr_db"]) > 30, ref
        assert named, r.output
    else:
        assert "unsaturated_sqnr_db" not in ref and not named, r.output


def test_the_unsaturated_integers_are_measured_on_any_cpu_said_to_lack_vnni(tmp_path, monkeypatch):
    """The measurement behind that note, on every CPU: said to be an x86 one without VNNI, evaluate runs the model with
    its int8 weights stored uint8 (dynamic.without_pair_saturation), whose u8 x u8 kernels saturate nowhere; its float
    reading is then near those integers (only the dynamic rounding apart), wherever the model as given saturates."""
    from qtool.quantizers import cpu_kinds

    monkeypatch.setattr(cpu_kinds, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_kinds, "vnni", lambda: False)
    ref = _saturating_matmul_reference(tmp_path, monkeypatch)
    assert ref["unsaturated_layers"] == 1, ref
    assert float(ref["float_reading_vs_unsaturated_sqnr_db"]) > 30, ref


def _saturating_matmul_reference(tmp_path, monkeypatch) -> dict:
    """evaluate --json's "reference" for a one-MatMul model quantized dynamically whose products are all large (inputs
    in [0, 1), weights near the top of their grid), calibrated in `tmp_path` (the working folder from now on)."""
    from onnxruntime.quantization import quantize_dynamic

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    k, n = 64, 16
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], "fc")], "fc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
                              [numpy_helper.from_array(rng.uniform(0.8, 1.0, (k, n)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "float.onnx")
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "model.onnx"))
    for kind, count, seed in (("calib", 8, 0), ("held", 4, 100)):
        (tmp_path / kind).mkdir()
        for i in range(count):
            np.savez(tmp_path / kind / f"{i}.npz", x=np.random.default_rng(seed + i).uniform(0, 1, (4, k)).astype(np.float32))
    assert invoke("calibrate", "model.onnx", "--data", "calib").exit_code == 0
    r = invoke("evaluate", "model.onnx", "--data", "held", "--target", "qdq", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["reference"]
