"""The default `qtool export --target tensorrt` (Q/DQ, FP16 outside the Q/DQ pairs) on tiny
look-alikes of real models whose FP16 step once failed: -1 and symbolic input dims (Paddle, PP-OCR
cls), If/Loop with a float16 block-listed op in a branch (silero VAD), graph outputs that are graph
inputs (a state passed through), an FP16 model with FP32 graph I/O, a model already holding Q/DQ.

Each is calibrated with --data, exported with default options, checked against TensorRT 11.4's
Q/DQ rules and run in onnxruntime: at ORT_ENABLE_BASIC (FP16 Q/DQ files: tests/test_trt_export.py)
for finite outputs, and with graph optimisation off (the exact arithmetic) against the FP32 model.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from runcli import invoke
from test_autocast import _model as checked_model

from qtool.model.graph import toposort
from qtool.targets.tensorrt import checker as trtrules

F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
C = 16  # channels: TensorRT's default exclusions keep smaller Convs FP32 (qtool.targets.tensorrt.rules.MIN_CHANNELS)


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inits, inputs, outputs, opset=17):
    return checked_model(nodes, inits, inputs, outputs, opset=opset, ir_version=8)


def _w(rng, oc, ic, dtype=np.float32):
    return (rng.standard_normal((oc, ic, 3, 3)) * (1.5 / np.sqrt(ic * 9))).astype(dtype)


def _convs(rng, x="x", y="y", prefix=""):
    """x -> Conv(3->16) -> Relu -> Conv(16->16) -> y: nodes and initializers."""
    inits = {f"{prefix}w1": _w(rng, C, 3), f"{prefix}b1": np.full(C, 0.1, np.float32), f"{prefix}w2": _w(rng, C, C)}
    nodes = [
        helper.make_node("Conv", [x, f"{prefix}w1", f"{prefix}b1"], [f"{prefix}c1"], name=f"{prefix}conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [f"{prefix}c1"], [f"{prefix}r1"], name=f"{prefix}relu1"),
        helper.make_node("Conv", [f"{prefix}r1", f"{prefix}w2"], [y], name=f"{prefix}conv2", pads=[1, 1, 1, 1]),
    ]
    return nodes, inits


def dynamic_dims(dims):
    """Conv net with input dims `dims`: Paddle's dim_value -1 or symbols."""
    nodes, inits = _convs(np.random.default_rng(0))
    out = [dims[0], C, *dims[2:]]
    return _model(nodes, inits, [_vi("x", F, dims)], [_vi("y", F, out)])


def negative_dims():
    return dynamic_dims([-1, 3, -1, -1])


def symbolic_dims():
    return dynamic_dims(["N", 3, "H", "W"])


def passthrough():
    """A state input returned as is (silero VAD's state, a KV cache) and the image input itself
    as graph outputs, next to a computed one."""
    nodes, inits = _convs(np.random.default_rng(1))
    nodes.append(helper.make_node("Mul", ["state", "two"], ["state2"], name="state_mul"))
    inits["two"] = np.array(2.0, np.float32)
    return _model(nodes, inits, [_vi("x", F, [1, 3, 16, 16]), _vi("state", F, [2, 8])],
                  [_vi("y", F, [1, C, 16, 16]), _vi("state", F, [2, 8]), _vi("x", F, [1, 3, 16, 16]), _vi("state2", F, [2, 8])])


def control_flow():
    """Conv -> If (a branch with Max, on onnxruntime's float16 block list, reading the outer
    activation) and Loop over it -> Conv; the If condition is computed from the input."""
    rng = np.random.default_rng(2)
    nodes, inits = _convs(rng, y="act")
    shape = [1, C, 16, 16]
    then_g = helper.make_graph([
        helper.make_node("Max", ["act", "floor"], ["t1"], name="then_max"),
        helper.make_node("Relu", ["t1"], ["t2"], name="then_relu"),
    ], "then", [], [_vi("t2", F, shape)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["act"], ["e1"], name="else_sigmoid")], "else", [], [_vi("e1", F, shape)])
    body = helper.make_graph([
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_id"),
        helper.make_node("Mul", ["branch", "half"], ["scaled"], name="body_mul"),
        helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"], name="body_add"),
    ], "body", [_vi("i", I64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("acc_in", F, shape)],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", F, shape)])
    inits.update({"floor": np.array(0.05, np.float32), "zero": np.array(0.0, np.float32), "half": np.array(0.5, np.float32),
                  "trip": np.array(2, np.int64), "keep": np.array(True), "w3": _w(rng, C, C)})
    nodes += [
        helper.make_node("ReduceSum", ["x"], ["s"], name="cond_sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["cond"], name="cond_gt"),
        helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trip", "keep", "act"], ["looped"], name="loop", body=body),
        helper.make_node("Conv", ["looped", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, inits, [_vi("x", F, [1, 3, 16, 16])], [_vi("y", F, shape)])


def fp16_inside():
    """FP32 graph I/O, a Conv in FP32, then Cast -> FP16 Convs -> Cast back (a model exported
    half in FP16 with FP32 edges)."""
    rng = np.random.default_rng(3)
    nodes, inits = _convs(rng, y="a")
    inits.update({"h1": _w(rng, C, C, np.float16), "h2": _w(rng, C, C, np.float16)})
    nodes += [
        helper.make_node("Cast", ["a"], ["ah"], name="to_fp16", to=H),
        helper.make_node("Conv", ["ah", "h1"], ["hc"], name="hconv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["hc"], ["hr"], name="hrelu"),
        helper.make_node("Conv", ["hr", "h2"], ["hy"], name="hconv2", pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["hy"], ["y"], name="to_fp32", to=F),
    ]
    return _model(nodes, inits, [_vi("x", F, [1, 3, 16, 16])], [_vi("y", F, [1, C, 16, 16])])


def already_qdq():
    """x and conv1's weight already behind Q/DQ pairs (a model quantized before)."""
    rng = np.random.default_rng(4)
    nodes, inits = _convs(rng, x="x_dq")
    w = inits["w1"]
    inits.update({"x_s": np.array(1 / 127, np.float32), "x_z": np.array(0, np.int8),
                  "w_s": (np.abs(w).reshape(C, -1).max(1) / 127).astype(np.float32), "w_z": np.zeros(C, np.int8)})
    nodes[0].input[1] = "w1_dq"
    nodes[:0] = [
        helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], name="x_Q"),
        helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], name="x_DQ"),
        helper.make_node("QuantizeLinear", ["w1", "w_s", "w_z"], ["w1_q"], name="w1_Q", axis=0),
        helper.make_node("DequantizeLinear", ["w1_q", "w_s", "w_z"], ["w1_dq"], name="w1_DQ", axis=0),
    ]
    return _model(nodes, inits, [_vi("x", F, [1, 3, 16, 16])], [_vi("y", F, [1, C, 16, 16])])


def converter_fp16():
    """What onnxruntime's converter makes (keep_io_types, conv1 blocked): its Casts named
    graph_input_cast_0, graph_output_cast0, c1_cast_to_fp16, ... that a second conversion would make again."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    rng = np.random.default_rng(5)
    nodes, inits = _convs(rng, y="a")
    inits["w3"] = _w(rng, C, C)
    nodes.append(helper.make_node("Conv", ["a", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1]))
    m = _model(nodes, inits, [_vi("x", F, [1, 3, 16, 16])], [_vi("y", F, [1, C, 16, 16])])
    m = convert_float_to_float16(m, keep_io_types=True, node_block_list=["conv1", "relu1", "conv2"])
    toposort(m.graph)  # the converter appends its Casts
    onnx.checker.check_model(m, full_check=True)
    return m


MODELS = {
    "negative_dims": negative_dims, "symbolic_dims": symbolic_dims, "passthrough": passthrough,
    "control_flow": control_flow, "fp16_inside": fp16_inside, "already_qdq": already_qdq, "converter_fp16": converter_fp16,
}


def _feeds(m, n=4, seed=0):
    """n feeds of the model's inputs, unknown dims 16 (batch 1)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feed = {}
        for i in m.graph.input:
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (1 if k == 0 else 16)
                    for k, d in enumerate(i.type.tensor_type.shape.dim)]
            feed[i.name] = rng.uniform(-1, 1, dims).astype(np.float32)
        out.append(feed)
    return out


def _run(model, feed, level):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(None, feed)


def _ok(r):
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    return r


def _export(tmp_path, m, name, int8_layers=True):
    """Calibrate `m` with --data, export it with the default options and check the file; returns it."""
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    feeds = _feeds(m)
    data = tmp_path / "data"
    data.mkdir()
    for k, feed in enumerate(feeds[:3]):
        np.savez(data / f"{k}.npz", **feed)
    calib = tmp_path / "c.calib.json"
    _ok(invoke("-q", "calibrate", path, "--data", data, "-o", calib))
    out = tmp_path / "m.trt.onnx"
    summary = json.loads(_ok(invoke("export", "--target", "tensorrt", "--calib", calib, "-o", out, "--json")).stdout)
    assert summary["high_precision"] == "fp16" and (summary["int8_layers"] > 0) == int8_layers, summary
    assert not any("FP16 conversion failed" in w for w in summary["warnings"]), summary["warnings"]
    q = onnx.load(str(out))
    assert trtrules.check(q, "11.4") == []
    assert any(t.data_type == H for t in q.graph.initializer)  # the FP16 step did convert something
    assert [o.name for o in q.graph.output] == [o.name for o in m.graph.output]
    assert all(o.type.tensor_type.elem_type == F for o in q.graph.output)
    feed = feeds[3]
    ref = _run(m, feed, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    exact = _run(q, feed, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    basic = _run(q, feed, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    for r, e, b in zip(ref, exact, basic):
        assert e.dtype == np.float32 and e.shape == r.shape and np.isfinite(e).all() and np.isfinite(b).all()
        err = float(np.abs(e - r).max() / max(np.abs(r).max(), 1e-6))
        assert err < 0.1, (name, err)
        np.testing.assert_allclose(b, e, atol=0.02 * float(np.abs(r).max()) + 1e-6)
    return q


@pytest.mark.parametrize("name", list(MODELS))
def test_default_tensorrt_export(tmp_path, name):
    _export(tmp_path, MODELS[name](), name)


def test_exported_model_exported_again(tmp_path):
    """qtool's own TensorRT file (Q/DQ, FP16 with FP32 I/O, the converter's Cast names) goes
    through calibrate and export again."""
    first = _export(tmp_path / "a", passthrough(), "first")
    assert any(n.name.startswith("graph_input_cast") for n in first.graph.node)
    # its Convs already behind its own Q/DQ count int8 as they are (qtool.model.prequantized), with no second quantizer
    second = _export(tmp_path / "b", first, "second")
    assert sum(n.op_type == "QuantizeLinear" for n in second.graph.node) == sum(n.op_type == "QuantizeLinear" for n in first.graph.node)


def test_fp16_failure_falls_back_to_fp32(tmp_path, monkeypatch):
    """Whatever the FP16 step cannot do (here: it raises) gives an FP32 file and a warning, not an
    internal error; with If/Loop nodes those are kept FP32 first and the rest tried again."""
    from qtool.targets.tensorrt import autocast

    real = autocast.to_fp16
    calls = []

    def flaky(model, *, activation_absmax=None, keep_fp32_nodes=()):
        calls.append(sorted(keep_fp32_nodes))
        if not keep_fp32_nodes:
            raise RuntimeError("simulated converter bug")
        return real(model, activation_absmax=activation_absmax, keep_fp32_nodes=keep_fp32_nodes)

    monkeypatch.setattr(autocast, "to_fp16", flaky)
    m = control_flow()
    onnx.save(m, str(tmp_path / "cf.onnx"))
    data = tmp_path / "data"
    data.mkdir()
    for k, feed in enumerate(_feeds(m, 2)):
        np.save(data / f"{k}.npy", feed["x"])
    _ok(invoke("-q", "calibrate", tmp_path / "cf.onnx", "--data", data, "-o", tmp_path / "c.calib.json"))
    summary = json.loads(_ok(invoke("export", "--target", "tensorrt", "--calib", tmp_path / "c.calib.json",
                                    "-o", tmp_path / "m.onnx", "--json")).stdout)
    assert calls == [[], ["if", "loop"]]
    assert any("simulated converter bug" in w and "'if', 'loop'" in w for w in summary["warnings"]), summary["warnings"]
    assert summary["high_precision"] == "fp16"
    assert trtrules.check(onnx.load(str(tmp_path / "m.onnx")), "11.4") == []

    monkeypatch.setattr(autocast, "to_fp16", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("always")))
    summary = json.loads(_ok(invoke("export", "--target", "tensorrt", "--calib", tmp_path / "c.calib.json",
                                    "-o", tmp_path / "m32.onnx", "--json")).stdout)
    assert summary["high_precision"] == "fp32" and "always" in summary["fp16_failed"]
    q = onnx.load(str(tmp_path / "m32.onnx"))
    assert trtrules.check(q, "11.4") == []
    assert not any(t.data_type == H for t in q.graph.initializer)
    ref, got = _run(m, _feeds(m, 1)[0], ort.GraphOptimizationLevel.ORT_DISABLE_ALL), _run(
        q, _feeds(m, 1)[0], ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert np.isfinite(got[0]).all() and float(np.abs(got[0] - ref[0]).max() / np.abs(ref[0]).max()) < 0.1
