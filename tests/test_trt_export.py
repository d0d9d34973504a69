"""`qtool export --target tensorrt`: Q/DQ models placed by TensorRT's rules, per TensorRT version."""

from __future__ import annotations

import struct

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from onnx import TensorProto, numpy_helper
from test_openvino import (
    calibrate,
    depthwise_cnn,
    invoke,
    noise_batch,
    noise_images,
    ok,
    sqnr,
    transformer_block,
)
from test_placement import Net, records

from qtool.calibration import load as load_calibration
from qtool.quantizers import placement
from qtool.targets import tensorrt
from qtool.targets.cpu import CPU
from qtool.targets.tensorrt import checker as trtrules
from qtool.targets.tensorrt import files as trtfiles
from qtool.targets.tensorrt.rules import TENSORRT

FLOAT = TensorProto.FLOAT

# name -> (builder, calibrate options, input shape to run, least output SQNR in dB on noise, exact
# arithmetic: the CPU QDQ export of the same calibration measures 73.6, 11.4, 41.8, 41.4, 30.4 and
# 25.1 dB; the TensorRT 8.6 / 10.3 / 11.4 exports yolo 73.6/71.8/71.5, paddle 29.2/31.0/31.8,
# transformer 49.5/43.6/50.5, depthwise 65.7/50.2/61.4, resnet 41.0/43.6/41.9, deconv 25.4/25.5/25.3)
MODELS = {
    "yolo": (lambda: zoo.yolo_like(13), ("--size", "64x64"), (1, 3, 64, 64), 65),
    "paddle": (lambda: zoo.paddle_ocr_like(), ("--size", "32x64"), (1, 3, 32, 64), 10),
    "transformer": (transformer_block, (), (1, 3, 32, 32), 38),
    "depthwise": (depthwise_cnn, (), (1, 3, 32, 32), 40),
    "resnet": (zoo.resnet_like, (), (1, 3, 32, 32), 40),
    "deconv": (zoo.deconv_gemm_like, ("--batch-size", "2"), (2, 3, 16, 16), 23),
}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """name -> (model path, calibration path), each calibrated once on noise images."""
    d = tmp_path_factory.mktemp("trt")
    images = noise_images(d / "images")
    out = {}
    for name, (build, options, _, _) in MODELS.items():
        path = d / f"{name}.onnx"
        onnx.save(build(), str(path))
        out[name] = (path, calibrate(path, images, d / f"{name}.calib.json", *options))
    return out


def export(calib, out, *extra):
    r = ok(invoke("export", "--target", "tensorrt", "--calib", calib, "-o", out, "--json", *extra))
    import json

    return json.loads(r.stdout)


def run(path, x, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    """The model's outputs; by default its exact arithmetic, the one TensorRT performs (int8 products
    accumulated in int32): with graph optimization off, onnxruntime computes Q/DQ as float
    operations and no int8 kernel of this CPU runs (on x86 without VNNI those saturate pair sums)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})


def run_optimized(path, x, fp16):
    """onnxruntime's own optimizations: a file TensorRT parses loads and runs there too (its QDQ
    fusions at the extended level take FP32 scales only (QLinearConcat): FP16 files at the basic
    level). Its numbers are this CPU's int8 kernels: checked finite, not for fidelity."""
    level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if fp16 else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return run(path, x, level)


def qdq_nodes(m):
    return [n for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]


# ----------------------------------------------------------------------------- rules, fidelity, runtime

@pytest.mark.parametrize("version,extra", [("8.6.1", ("--format", "qdq")), ("10.3", ()), ("11.4", ("--weights", "int8"))],
                         ids=["8.6-fp32", "10.3-fp16", "11.4-fp16-int8w"])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_qdq_node_obeys_tensorrt_rules_and_onnxruntime_runs_it(calibrated, tmp_path, name, version, extra):
    path, calib = calibrated[name]
    out = tmp_path / "m.trt.onnx"
    summary = export(calib, out, "--trt-version", version, *extra)
    assert summary["format"] == "qdq" and summary["int8_layers"] > 0
    m = onnx.load(str(out))
    assert trtrules.check(m, version) == []
    fp16 = summary["high_precision"] == "fp16"
    assert summary["opset"] == (19 if fp16 else max(13, summary["source_opset"]))
    outputs = {o.name for o in m.graph.output}
    producers = {o: n for n in m.graph.node for o in n.output}
    assert not any(producers[o].op_type == "DequantizeLinear" for o in outputs)  # no graph output behind a Q/DQ
    for t in m.graph.initializer:
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16):
            assert np.isfinite(numpy_helper.to_array(t)).all(), t.name
    assert [i.type.tensor_type.elem_type for i in m.graph.input] == [FLOAT]
    assert all(o.type.tensor_type.elem_type == FLOAT for o in m.graph.output)
    x = noise_batch(*MODELS[name][2][2:], n=MODELS[name][2][0])
    ref, got = run(path, x)[0], run(out, x)[0]  # FP16 files run with graph optimization off too
    assert got.dtype == np.float32 and np.isfinite(got).all()
    assert sqnr(ref, got) > MODELS[name][3], sqnr(ref, got)
    optimized = run_optimized(out, x, fp16)[0]
    assert optimized.dtype == np.float32 and optimized.shape == ref.shape and np.isfinite(optimized).all()


def test_exports_are_byte_identical_across_runs(calibrated, tmp_path):
    _, calib = calibrated["yolo"]
    export(calib, tmp_path / "a.onnx", "--trt-version", "10.3")
    export(calib, tmp_path / "b.onnx", "--trt-version", "10.3")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_activation_scales_equal_the_cache_bit_for_bit(calibrated, tmp_path):
    """With --method entropy (the Q/DQ default is mse), except where the cache's threshold is
    degenerate (clips > 10 %: the noise input here)."""
    _, calib = calibrated["resnet"]
    cal = load_calibration(calib)
    degenerate = {name for name, d in cal.decide(signed=True, fallback=False).items() if d.degenerate}
    assert degenerate == {"input"}
    export(calib, tmp_path / "m.onnx", "--trt-version", "10.3", "--high-precision", "fp32", "--method", "entropy")
    export(calib, tmp_path / "m.cache", "--trt-version", "10.3", "--format", "cache")
    cache = trtfiles.read_cache_hex((tmp_path / "m.cache").read_text())
    m = onnx.load(str(tmp_path / "m.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    compared = 0
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in cache:  # activations (weights are initializers)
            assert inits[n.input[1]].dtype == np.float32 and inits[n.input[1]].shape == ()
            assert inits[n.input[2]].dtype == np.int8 and inits[n.input[2]] == 0
            same = struct.pack(">f", float(inits[n.input[1]])).hex() == cache[n.input[0]]
            assert same != (n.input[0] in degenerate), n.input[0]
            compared += 1
    assert compared >= 6


def test_weights_per_channel_on_the_axis_tensorrt_reads(calibrated, tmp_path):
    _, calib = calibrated["deconv"]
    export(calib, tmp_path / "m.onnx", "--trt-version", "11.4", "--include", "/out/MatMul", "--weights", "int8")
    m = onnx.load(str(tmp_path / "m.onnx"))
    readers = {i: n for n in m.graph.node for i in n.input}
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    axes = {}
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:  # an INT8 weight
            assert inits[n.input[0]].dtype == np.int8 and np.abs(inits[n.input[0]]).max() == 127
            axes[readers[n.output[0]].op_type] = next((a.i for a in n.attribute if a.name == "axis"), None)
    assert axes == {"Conv": 0, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}


# ----------------------------------------------------------------------------- placement rules

def plan_sites(plan):
    return {s.tensor: s for s in plan.activations}


def test_residual_add_quantizes_the_skip_input_only():
    m = zoo.resnet_like()
    plan = placement.place(m, records(m), rules=TENSORRT)
    sites = plan_sites(plan)
    readers = {r for s in plan.activations for r in s.readers}
    # layer1: Add(conv2-BN output, block input): the BN branch fuses into its Conv; the skip (MaxPool's
    # output, wanted by conv1 too) is quantized above the MaxPool, which commutes with Q/DQ
    assert ("/layer1/Add", 0) not in readers and sites["/stem/Relu_output_0"].readers == [("/stem/MaxPool", 0)]
    # layer2: Add(downsample-BN, conv2-BN): the longer branch (conv1 -> conv2) is the fused one
    assert ("/layer2/Add", 0) in readers and ("/layer2/Add", 1) not in readers
    ops = {n.name: n.op_type for n in m.graph.node}
    assert {ops[node] for s in plan.activations for node, _ in s.readers} <= {"Conv", "Add", "Gemm", "MaxPool"}
    assert all(not s.range.unsigned for s in plan.activations)  # TensorRT: signed INT8 only
    assert "/stem/MaxPool_output_0" not in sites


def test_default_exclusions_and_include():
    m = zoo.resnet_like()
    plan = placement.place(m, records(m), rules=TENSORRT)
    assert plan.fp32_layers["/narrow/Conv"].startswith("default exclusion: Conv with 12 input / 6 output")
    assert plan.fp32_layers["/fc/Gemm"].startswith("default exclusion: GEMV-shaped")  # [1, 10] output
    assert "/pool/GlobalAveragePool" not in {n for s in plan.activations for n, _ in s.readers}  # no quantized neighbour
    assert "default_exclusions" in plan.summary()
    included = placement.place(m, records(m), choices=placement.Choices(include=["/fc/Gemm"]), rules=TENSORRT)
    assert "/fc/Gemm" in included.int8_layers
    # the pool now feeds a quantized Gemm (through Flatten): it gets a quantizer on its input
    assert ("/pool/GlobalAveragePool", 0) in {r for s in included.activations for r in s.readers}
    cpu = placement.place(m, records(m), rules=CPU)
    assert "/narrow/Conv" in cpu.int8_layers and "/fc/Gemm" in cpu.int8_layers  # the CPU rules have no such exclusions


def _attention(seq: int) -> onnx.ModelProto:
    n = Net()
    q = n.op("MatMul", ["x", n.w("wq", (16, 16))], "q")
    k = n.op("MatMul", ["x", n.w("wk", (16, 16))], "k")
    v = n.op("MatMul", ["x", n.w("wv", (16, 16))], "v")
    kt = n.op("Transpose", [k], "kt", perm=[0, 2, 1])
    s = n.op("Softmax", [n.op("MatMul", [q, kt], "scores")], "probs", axis=-1)
    n.op("MatMul", [s, v], "ctx")
    return n.model(["ctx"], x_shape=(1, seq, 16))


def test_attention_core_above_512_tokens_stays_fp32():
    long, short = _attention(600), _attention(64)
    plan = placement.place(long, records(long), rules=TENSORRT)
    assert {"n_scores", "n_ctx"} <= set(plan.fp32_layers) and "sequence length 600" in plan.fp32_layers["n_scores"]
    assert {"n_q", "n_k", "n_v"} <= set(plan.int8_layers)
    plan = placement.place(short, records(short), rules=TENSORRT)
    assert {"n_scores", "n_ctx", "n_q"} <= set(plan.int8_layers)


def test_concat_output_and_inputs_quantized_elsewhere_share_one_range():
    n = Net()
    a = n.conv("x", "a", 4, 16)
    b = n.conv("x", "b", 4, 16)
    cat = n.op("Concat", [a, b], "cat", axis=1)
    n.conv(cat, "c", 32, 16)
    n.conv(a, "d", 16, 16)
    m = n.model(["c", "d", "cat"])  # cat is also a graph output: the quantizer cannot move above the Concat
    recs = records(m, overrides={"a": 1.0, "cat": 3.0})
    trt = plan_sites(placement.place(m, recs, rules=TENSORRT))
    assert trt["a"].range.amax == trt["cat"].range.amax == 3.0 and "cat" in trt["a"].shared_with
    cpu = plan_sites(placement.place(m, recs, rules=CPU))
    assert cpu["a"].range.amax == 1.0 and cpu["cat"].range.amax == 3.0


def test_concat_quantizer_moves_to_its_inputs_with_the_outputs_range(calibrated):
    m = zoo.deconv_gemm_like()
    recs = records(m, overrides={"/cat/Concat_output_0": 5.0})
    sites = plan_sites(placement.place(m, recs, rules=TENSORRT))
    assert "/cat/Concat_output_0" not in sites
    assert sites["/up/Relu_output_0"].range.amax == sites["/skip/Relu_output_0"].range.amax == 5.0


# ----------------------------------------------------------------------------- versions, formats, bad input

def test_version_defaults_and_formats(calibrated, tmp_path, monkeypatch):
    _, calib = calibrated["resnet"]
    monkeypatch.chdir(tmp_path)
    summary = export(calib, tmp_path / "a.onnx")
    assert summary["trt_version"] == tensorrt.default_version() == tensorrt.LATEST_VERSION  # no tensorrt here
    assert summary["format"] == "qdq" and summary["build"] == f"trtexec --onnx={tmp_path / 'a.onnx'}"
    assert export(calib, tmp_path / "b.onnx", "--trt-version", "10.3")["build"].endswith("--stronglyTyped")
    eight = export(calib, tmp_path / "c.cache", "--trt-version", "8.6.1")
    assert eight["format"] == "cache" and eight["header"] == "TRT-8601-EntropyCalibration2"
    ten = export(calib, tmp_path / "d.cache", "--trt-version", "10.3", "--format", "cache")
    assert ten["header"] == "TRT-100300-EntropyCalibration2" and "deprecate" in ten["warnings"][0]
    r = export(calib, tmp_path / "e.onnx", "--trt-version", "8.6", "--format", "qdq")
    assert r["build"].endswith("--int8 --fp16") and r["opset"] == 13 and r["high_precision"] == "fp32"
    # a range format without a version names the cache default, never 11.x
    assert export(calib, tmp_path / "f.cache", "--format", "cache")["header"] == "TRT-8601-EntropyCalibration2"
    r = ok(invoke("export", "--target", "tensorrt", "--calib", calib, "--trt-version", "10.3"))
    assert (tmp_path / "resnet.trt.onnx").exists() and "trtexec --onnx=resnet.trt.onnx --stronglyTyped" in r.stdout


@pytest.mark.parametrize("args,message", [
    (("--format", "cache", "--trt-version", "11.4"), "TensorRT 11 removed implicit INT8"),
    (("--format", "dynamic-range", "--trt-version", "11.0"), "TensorRT 11 removed implicit INT8"),
    (("--trt-version", "12.0"), "give MAJOR (e.g. 10"),
    (("--trt-version", "banana"), "is not a TensorRT release qtool knows"),
    (("--trt-version", "7.2.3", "--format", "qdq"), "builds INT8 from a calibration cache only"),
    (("--trt-version", "8.6", "--format", "qdq", "--weights", "int8"), "needs TensorRT 10 or later"),
    (("--trt-version", "8.6", "--format", "qdq", "--high-precision", "fp16"), "use --high-precision fp32"),
    (("--trt-version", "10.3", "--include", "no_such_node"), "--include: no node or tensor named"),
], ids=["cache-11", "dynamic-range-11", "unknown-version", "not-a-version", "qdq-7x", "int8-weights-8x", "fp16-8x", "include-unknown"])
def test_bad_requests_are_one_line_errors_without_output(calibrated, tmp_path, args, message):
    _, calib = calibrated["resnet"]
    out = tmp_path / "out.file"
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "-o", out, *args)
    assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


def test_options_of_other_targets_are_usage_errors(calibrated, tmp_path):
    _, calib = calibrated["resnet"]
    r = invoke("export", "--target", "openvino", "--calib", calib, "-o", tmp_path / "x.onnx", "--trt-version", "10.3")
    assert r.exit_code == 2 and "--trt-version applies to --target tensorrt" in r.stderr
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "-o", tmp_path / "x.onnx", "--weights-7bit", "all")
    assert r.exit_code == 2 and not (tmp_path / "x.onnx").exists()
    r = invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "x.onnx", "--algorithm", "minmax")
    assert r.exit_code == 2 and "--algorithm applies to --target tensorrt" in r.stderr
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "-o", tmp_path / "x.onnx", "--no-ignored-patterns")
    assert r.exit_code == 2 and "--no-ignored-patterns applies to --target openvino or qdq" in r.stderr
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "-o", tmp_path / "x.cache", "--trt-version", "8.6",
               "--no-bias-correction")
    assert r.exit_code == 1 and "apply to --format qdq only" in r.stderr and not (tmp_path / "x.cache").exists()


def test_calibrate_refuses_an_11x_cache_header(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(zoo.resnet_like(), str(path))
    r = invoke("calibrate", path, "--images", noise_images(tmp_path / "i", n=2), "--trt-table", tmp_path / "m.cache",
               "--trt-version", "11.0")
    assert r.exit_code == 1 and "TensorRT 11 removed implicit INT8" in r.stderr
    assert not (tmp_path / "m.cache").exists() and not (tmp_path / "m.calib.json").exists()


def test_a_model_above_the_parsers_opset_is_refused(tmp_path):
    m = zoo.resnet_like(opset=21)
    m.ir_version = 10
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    calib = calibrate(path, noise_images(tmp_path / "i", n=2), tmp_path / "m.calib.json")
    r = invoke("export", "--target", "tensorrt", "--calib", calib, "--trt-version", "8.6", "--format", "qdq", "-o", tmp_path / "o.onnx")
    assert r.exit_code == 1 and "the model is opset 21" in r.stderr and "up to opset 17" in r.stderr
    assert not (tmp_path / "o.onnx").exists()
    ok(invoke("export", "--target", "tensorrt", "--calib", calib, "--trt-version", "11.4", "-o", tmp_path / "o.onnx"))


# ----------------------------------------------------------------------------- FP16 guard, inspect

def test_fp16_keeps_a_huge_batchnorm_constant_in_fp32(tmp_path):
    """The Paddle case: a BatchNormalization variance of ~1e7 would overflow FP16 (ModelOpt's
    conversion made it inf and the model output zeros)."""
    n = Net()
    c = n.conv("x", "c", 4, 16, k=3)
    scale, bias, mean = (n.c(name, np.full(16, v, np.float32)) for name, v in (("s", 3000.0), ("b", 0.1), ("mu", 0.0)))
    var = n.c("var", np.full(16, 1.2e7, np.float32))
    bn = n.op("BatchNormalization", [c, scale, bias, mean, var], "bn")
    n.conv(n.op("Relu", [bn], "r"), "y", 16, 16, k=3)
    path = tmp_path / "bn.onnx"
    onnx.save(n.model(["y"], x_shape=(1, 4, 16, 16)), str(path))
    data = tmp_path / "d"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.save(data / f"{i}.npy", rng.standard_normal((1, 4, 16, 16)).astype(np.float32))
    calib = tmp_path / "bn.calib.json"
    ok(invoke("-q", "calibrate", path, "--data", data, "-o", calib))
    summary = export(calib, tmp_path / "bn.trt.onnx", "--trt-version", "11.4")
    assert "n_bn" in summary["kept_fp32_for_fp16"]
    m = onnx.load(str(tmp_path / "bn.trt.onnx"))
    var_init = next(t for t in m.graph.initializer if t.name == "var")
    assert var_init.data_type == TensorProto.FLOAT and np.all(numpy_helper.to_array(var_init) == np.float32(1.2e7))
    x = rng.standard_normal((1, 4, 16, 16)).astype(np.float32)
    ref, got = run(path, x)[0], run(tmp_path / "bn.trt.onnx", x)[0]
    assert np.abs(got).max() > 0 and sqnr(ref, got) > 15
    assert np.isfinite(run_optimized(tmp_path / "bn.trt.onnx", x, fp16=True)[0]).all()


def test_inspect_passes_qtools_own_tensorrt_output(calibrated, tmp_path):
    _, calib = calibrated["yolo"]
    export(calib, tmp_path / "m.onnx", "--trt-version", "11.4")
    r = invoke("inspect", tmp_path / "m.onnx", "--trt-version", "11.4")
    assert r.exit_code == 0, r.output
    plain = tmp_path / "cpu.onnx"
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", plain))
    r = invoke("inspect", plain, "--trt-version", "11.4")
    assert r.exit_code == 1 and "int8-only" in r.output  # the CPU target's UINT8 activations


def test_helper_model_builders_are_valid():
    for build in (zoo.resnet_like, zoo.deconv_gemm_like):
        onnx.checker.check_model(build(), full_check=True)


def test_fp16_scales_of_dead_weight_channels_stay_fp16_and_fused(tmp_path):
    """Real PP-OCR weights have output channels with max |w| near 1e-20: their scales are floored
    at 2^-16 (exact in FP16) instead of keeping the Q/DQ and its Conv in FP32 behind a Cast."""
    n = Net()
    n.conv("x", "c", 4, 16, k=3)
    m = n.model(["c"], x_shape=(1, 4, 8, 8))
    w = next(t for t in m.graph.initializer if t.name == "c.w")
    values = numpy_helper.to_array(w).copy()
    values[3] *= 1e-20
    w.CopyFrom(numpy_helper.from_array(values, "c.w"))
    path = tmp_path / "dead.onnx"
    onnx.save(m, str(path))
    data = tmp_path / "d"
    data.mkdir()
    np.save(data / "0.npy", np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32))
    ok(invoke("-q", "calibrate", path, "--data", data, "-o", tmp_path / "dead.calib.json"))
    summary = export(tmp_path / "dead.calib.json", tmp_path / "dead.trt.onnx", "--trt-version", "11.4")
    assert summary["kept_fp32_for_fp16"] == {}
    out = onnx.load(str(tmp_path / "dead.trt.onnx"))
    scale = next(numpy_helper.to_array(t) for t in out.graph.initializer if t.name == "c.w/scale")
    assert scale.dtype == np.float16 and scale[3] == np.float16(2.0 ** -16) and np.all(scale >= np.float16(2.0 ** -16))
    conv = next(x for x in out.graph.node if x.op_type == "Conv")
    producers = {o: x.op_type for x in out.graph.node for o in x.output}
    assert [producers[i] for i in conv.input[:2]] == ["DequantizeLinear", "DequantizeLinear"]


def test_a_model_with_q_dq_tensorrt_cannot_import_is_refused_by_the_tensorrt_export(tmp_path):
    """onnxruntime's QDQ format (uint8 activations with zero points, int32 biases: smart-turn v3) calibrates and
    exports to OpenVINO as it is, with a warning; the TensorRT export keeps the model's own Q/DQ nodes, which
    TensorRT does not import: one error line, exit 1, no file (it wrote a file breaking 309 rules)."""
    from runcli import invoke, ok

    onnx.save(zoo.ort_qdq_conv_like(), tmp_path / "m.onnx")
    (tmp_path / "d").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.save(tmp_path / "d" / f"{i}.npy", rng.uniform(0, 2, (1, 3, 8, 8)).astype(np.float32))
    ok(invoke("-q", "calibrate", tmp_path / "m.onnx", "--data", tmp_path / "d", "-o", tmp_path / "m.calib.json"))
    ok(invoke("-q", "export", "--calib", tmp_path / "m.calib.json", "--target", "openvino", "-o", tmp_path / "ov.onnx"))
    for extra in ((), ("--precision", "fp8"), ("--format", "cache", "--trt-version", "8.6")):
        r = invoke("export", "--calib", tmp_path / "m.calib.json", "--target", "tensorrt", "-o", tmp_path / "trt.onnx", *extra)
        assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "already holds Q/DQ nodes that TensorRT" in r.stderr, r.output
        assert "give the FP32 model" in r.stderr and not (tmp_path / "trt.onnx").exists()

