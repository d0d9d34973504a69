"""`qtool export --target qdq`: QuantizeLinear/DequantizeLinear ONNX that onnxruntime runs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import zoo
from onnx import numpy_helper
from test_openvino import (
    IMAGES,
    SAMPLE,
    accuracy,
    calibrate,
    depthwise_cnn,
    export,
    heldout,
    invoke,
    linear_precisions,
    noise_batch,
    noise_images,
    ort_run,
    ov_compile,
    sqnr,
    transformer_block,
)

from qtool import calibration
from qtool.quantizers import grids, placement, policy
from qtool.targets import qdq
from qtool.targets.cpu import CPU


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    d = tmp_path_factory.mktemp("digits_qdq")
    calib = calibrate(SAMPLE, IMAGES, d / "digits.calib.json", "--limit", "48")
    out = d / "digits.qdq.onnx"
    return calib, out, export("qdq", calib, out, "--activations", "symmetric")  # zero points 0, as checked below


def _inits(m):
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_digits_qdq_accuracy_in_onnxruntime(digits):
    _, out, summary = digits
    assert summary["int8_layers"] == 7 and summary["warnings"] == [] and summary["opset"] == 13
    x, y = heldout()
    fp32 = accuracy(ort_run(SAMPLE, {"input": x})[0], y)
    int8 = accuracy(ort_run(out, {"input": x})[0], y)
    assert abs(int8 - fp32) <= 1.0, (fp32, int8)


def test_qdq_structure_and_same_placement_as_openvino(digits, tmp_path):
    calib, out, summary = digits
    guarded = set(summary["overflow_fix"]["layers"])
    assert summary["overflow_fix"]["mode"] == "auto" and "/stem/stem.0/Conv" in guarded  # the image's first layer
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    inits = _inits(m)
    cal = calibration.load(calib)
    rec = {t.name: t for t in cal.tensors}
    plan = {s.tensor: s.range for s in placement.place(onnx.load(str(SAMPLE)), rec, thresholds=cal.for_target(CPU), rules=CPU).activations}
    q_inputs = set()
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            q_inputs.add(n.input[0])
            scale, zp = inits[n.input[1]], inits[n.input[2]]
            r = plan[n.input[0]]
            if r.unsigned:
                assert zp.dtype == np.uint8 and float(scale) == pytest.approx(r.amax / 255, rel=1e-6)
            else:
                assert zp.dtype == np.int8 and float(scale) == pytest.approx(r.amax / 127, rel=1e-6)
            assert int(zp) == 0
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:  # a weight
            w, zp = inits[n.input[0]], inits[n.input[2]]
            reader = next(r.name for r in m.graph.node if n.output[0] in r.input)
            if reader in guarded:  # the overflow guard: the same values as uint8 with zero point 128
                assert w.dtype == np.uint8 and set(zp.tolist()) == {128}
                w = w.astype(np.int16) - 128
            else:
                assert w.dtype == np.int8 and set(zp.tolist()) == {0}
            assert w.min() >= -127 and w.max() <= 127
            axis = next(a.i for a in n.attribute if a.name == "axis")
            assert inits[n.input[1]].shape == (w.shape[axis],)
            assert np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis)).max() == 127
    assert q_inputs == set(plan)
    assert plan["input"].unsigned and not plan["/Mul_output_0"].unsigned
    fq = tmp_path / "fq.onnx"
    export("openvino", calib, fq, "--weights-7bit", "none")  # the guard keeps the first layer FP32 in OpenVINO
    fq_inputs = {n.input[0] for n in onnx.load(str(fq)).graph.node if n.op_type == "FakeQuantize"}
    assert fq_inputs & set(rec) == q_inputs  # the same activation quantizers as the OpenVINO target
    assert "onnx::Conv_66" not in inits  # float weights replaced by int8 ones
    assert not any(n.op_type == "Gemm" and n.input[1] == "fc.weight" for n in m.graph.node)


def test_qdq_equals_the_grid_maths(digits):
    """The int8 weights are grids.quantize_linear of the float weights, per output channel."""
    _, out, _ = digits
    inits = _inits(onnx.load(str(out)))
    original = _inits(onnx.load(str(SAMPLE)))
    w = original["onnx::Conv_69"]
    p = policy.weight_params(w, axis=0)
    stored = inits.get("onnx::Conv_69/int8")
    if stored is None:  # guarded against overflow: the same values as uint8 with zero point 128
        stored = inits["onnx::Conv_69/uint8"].astype(np.int16) - 128
    np.testing.assert_array_equal(stored, grids.quantize_linear(w, p.scale.reshape(-1, 1, 1, 1), 0, p.grid))
    np.testing.assert_allclose(inits["onnx::Conv_69/scale"], p.scale.astype(np.float32))


def test_openvino_also_runs_the_qdq_model(digits, tmp_path):
    """OpenVINO runs the QDQ model's int8 weights in int8 and the Convs with the overflow guard's
    uint8 weights (which its int8 convolutions do not take) in FP32; without the guard, every layer in int8."""
    calib, out, summary = digits
    guarded = set(summary["overflow_fix"]["layers"])
    precisions = linear_precisions(ov_compile(out))
    assert len(precisions) == 7 and 0 < len(guarded) < 7
    assert {k.removesuffix("/WithoutBiases") for k, v in precisions.items() if v == "f32"} == {g for g in guarded if "Conv" in g}
    plain = tmp_path / "plain.qdq.onnx"
    export("qdq", calib, plain, "--activations", "symmetric", "--weights-7bit", "none")
    assert set(linear_precisions(ov_compile(plain)).values()) <= {"u8", "i8"}


def test_weights_7bit_in_qdq(digits, tmp_path):
    calib, _, _ = digits
    out = tmp_path / "w7.onnx"
    export("qdq", calib, out, "--weights-7bit", "first")
    inits = _inits(onnx.load(str(out)))
    assert np.abs(inits["onnx::Conv_66/int8"]).max() == 63  # the first layer
    assert np.abs(inits["onnx::Conv_69/int8"]).max() == 127


@pytest.mark.parametrize("build,size", [(lambda: zoo.paddle_ocr_like(), "32x64"), (lambda: zoo.yolo_like(11), "64x64")], ids=["paddle_opset11", "yolo_opset11"])
def test_old_opsets_are_converted_to_13(tmp_path, build, size):
    proto = build()
    assert proto.opset_import[0].version == 11
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    calib = calibrate(path, noise_images(tmp_path / "images"), tmp_path / "m.calib.json", "--size", size)
    out = tmp_path / "m.qdq.onnx"
    summary = export("qdq", calib, out, "--no-ignored-patterns")
    assert summary["opset"] == 13 and summary["fp32_layers"] == 0
    assert any("converted from opset 11 to opset 13" in w for w in summary["warnings"])
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert any(n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute) for n in m.graph.node)
    h, w = (int(v) for v in size.split("x"))
    x = noise_batch(h, w, n=2)
    ref, got = ort_run(path, {m.graph.input[0].name: x})[0], ort_run(out, {m.graph.input[0].name: x})[0]
    assert got.shape == ref.shape and np.isfinite(got).all()
    assert onnx.load(str(path)).opset_import[0].version == 11  # the input file is untouched


def test_failed_opset_conversion_is_a_clear_error(tmp_path, monkeypatch):
    proto = zoo.yolo_like(11)
    path = tmp_path / "m.onnx"
    onnx.save(proto, str(path))
    calib = calibrate(path, noise_images(tmp_path / "images"), tmp_path / "m.calib.json", "--size", "32x32")

    def broken(model, target):
        raise RuntimeError("no adapter for SomeOp")

    from onnx import version_converter
    monkeypatch.setattr(version_converter, "convert_version", broken)
    r = invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "out.onnx")
    assert r.exit_code == 1 and "opset 11" in r.output and "no adapter for SomeOp" in r.output
    assert not (tmp_path / "out.onnx").exists()


# the transformer block's Q.K^T (two activations whose pairs saturate without VNNI) stays int8 for --cpu any,
# its second input's step widened so that no pair of calibrated per-channel maxima passes int16
@pytest.mark.parametrize("build,layers", [(transformer_block, 9), (depthwise_cnn, 13)], ids=["transformer", "depthwise"])
def test_real_world_blocks_run_in_onnxruntime(tmp_path, build, layers):
    path = tmp_path / "m.onnx"
    onnx.save(build(), str(path))
    calib = calibrate(path, noise_images(tmp_path / "images"), tmp_path / "m.calib.json")
    out = tmp_path / "m.qdq.onnx"
    summary = export("qdq", calib, out)
    assert summary["int8_layers"] == layers
    x = noise_batch(32, 32)
    assert sqnr(ort_run(path, {"x": x})[0], ort_run(out, {"x": x})[0]) > 15


def test_upgrade_opset_leaves_new_models_alone():
    m = zoo.yolo_like(17)
    same, warnings = qdq.upgrade_opset(m)
    assert same is m and warnings == []
    assert qdq.suffix() == ".qdq.onnx"


def _relu_depthwise(ch=8, seed=5):
    """x -> Conv -> Relu -> depthwise Conv -> Relu -> Conv: the depthwise input non-negative (a uint8 grid)."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w = lambda name, shape: numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0", pads=[1] * 4, kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
             helper.make_node("Conv", ["r0", "wd"], ["dw"], name="dw", group=ch, pads=[1] * 4, kernel_shape=[3, 3]),
             helper.make_node("Relu", ["dw"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "w1"], ["y"], name="c1", kernel_shape=[1, 1])]
    g = helper.make_graph(nodes, "relu_depthwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [w("w0", (ch, 3, 3, 3)), w("wd", (ch, 1, 3, 3)), w("w1", (4, ch, 1, 1))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_a_depthwise_input_is_per_tensor_in_the_qdq_file(tmp_path):
    """onnxruntime's QLinearConv takes one input scale and zero point: a depthwise Conv's input quantized per channel
    (OpenVINO's file does so, as NNCF) on a uint8 grid was fused by onnxruntime and failed at run time ("input zero
    point must be a scalar", DeepFilterNet3's ERB decoder), on an int8 grid left a float Conv. The qdq file quantizes
    it per tensor: onnxruntime runs it, the depthwise layer as a QLinearConv."""
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    onnx.save(_relu_depthwise(), str(path))
    calib = calibrate(path, noise_images(tmp_path / "images"), tmp_path / "m.calib.json")
    fq = tmp_path / "m.openvino.onnx"
    export("openvino", calib, fq)
    ranges = {n.input[0]: _inits(onnx.load(str(fq)))[n.input[1]].shape for n in onnx.load(str(fq)).graph.node if n.op_type == "FakeQuantize"}
    assert ranges["r0"] == (1, 8, 1, 1)  # per channel in OpenVINO's file
    out = tmp_path / "m.qdq.onnx"
    export("qdq", calib, out)
    m = onnx.load(str(out))
    inits = _inits(m)
    acts = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    assert acts and all(inits[n.input[1]].ndim == 0 for n in acts)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    x = noise_batch(32, 32)[:1]
    assert sqnr(ort_run(path, {"x": x})[0], session.run(None, {"x": x})[0]) > 20
    fused = [n for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node if n.op_type == "QLinearConv"]
    assert len(fused) >= 2, [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def test_a_layer_after_a_node_the_opset_converter_replaces_keeps_its_range():
    """An opset-9 model's Upsample becomes a Resize when the qdq export converts it to opset 13, and onnx's converter
    names that Resize's output anew: the Conv reading it found no calibrated range and stayed FP32. The converted
    model keeps the model's names, so the Conv reads a DequantizeLinear."""
    from onnx import TensorProto, helper

    import qtool

    rng = np.random.default_rng(0)
    w = {"w1": rng.normal(0, 0.3, (16, 3, 3, 3)), "sc": np.array([1, 1, 2, 2]), "w2": rng.normal(0, 0.1, (16, 16, 3, 3))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Upsample", ["r", "sc"], ["u"], mode="nearest"),
             helper.make_node("Conv", ["u", "w2"], ["y"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 7
    cal = qtool.calibrate(m, data=[{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])
    out = onnx.load_from_string(qtool.export(m, cal, target="qdq"))
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    assert [producers.get(n.input[0]) for n in out.graph.node if n.op_type == "Conv"] == ["DequantizeLinear"] * 2
    assert "u" in producers  # the model's own name
