"""The TensorRT attention core by measured error (qtool.targets.tensorrt.attention): the 8-bit error of
Q.K^T and softmax.V estimated from the calibration histograms, checked against the error measured with
numpy on held-out inputs; the core stays FP16 where it is large, --include forces it, FP8 keeps it where
E4M3 holds the probabilities."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from test_placement import Net

from qtool import api
from qtool.cli import cli
from qtool.model.graph import Index
from qtool.quantizers import patterns as P
from qtool.targets.tensorrt import attention, fp8
from qtool.targets.tensorrt import thresholds as trt_thresholds

CORE = {"n_scores", "n_ctx"}
HEAD = 32


def _attention(seq: int, sink: float, seed: int = 0):
    """One attention head over `seq` tokens: Q.K^T / sqrt(d) + a constant bias giving token 0 `sink`
    more logit (an attention sink, as ViTs and BERTs learn them) -> Softmax -> .V (V with a bias, so
    its tokens share a mean, as in trained models) -> a linear layer."""
    n = Net(seed)
    q = n.op("MatMul", ["x", n.c("wq", (0.05 * n.rng.standard_normal((HEAD, HEAD))).astype(np.float32))], "q")
    k = n.op("MatMul", ["x", n.c("wk", (0.05 * n.rng.standard_normal((HEAD, HEAD))).astype(np.float32))], "k")
    v = n.op("Add", [n.op("MatMul", ["x", n.w("wv", (HEAD, HEAD))], "xv"), n.c("bv", 3 * n.rng.standard_normal(HEAD).astype(np.float32))], "v")
    kt = n.op("Transpose", [k], "kt", perm=[0, 2, 1])
    scaled = n.op("Div", [n.op("MatMul", [q, kt], "scores"), n.c("sqrt_d", np.float32(np.sqrt(HEAD)))], "scaled")
    bias = np.zeros((1, 1, seq), np.float32)
    bias[..., 0] = sink
    probs = n.op("Softmax", [n.op("Add", [scaled, n.c("bias", bias)], "biased")], "probs", axis=-1)
    ctx = n.op("MatMul", [probs, v], "ctx")
    n.op("MatMul", [ctx, n.w("wo", (HEAD, HEAD))], "out")
    return n.model(["out"], x_shape=(1, seq, HEAD))


def _inputs(seq: int, count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, seq, HEAD)).astype(np.float32)} for _ in range(count)]


def _measured_context_db(model, cal, held: list[dict]) -> float:
    """SQNR at the .V output with its two inputs on the INT8 Q/DQ grid (the export's thresholds), in numpy."""
    import onnxruntime as ort

    from qtool import model as M

    amax = {n: t.amax for n, t in trt_thresholds(cal, "qdq").items()}
    exposed = M.with_outputs(model, ["probs", "v", "ctx"], M.tensor_types(model))
    sess = ort.InferenceSession(exposed.SerializeToString(), providers=["CPUExecutionProvider"])
    signal = noise = 0.0
    for feed in held:
        p, v, ctx = (a.astype(np.float64) for a in sess.run(["probs", "v", "ctx"], feed))
        qp = np.sign(p) * attention.int8_grid(np.abs(p), amax["probs"])
        qv = np.sign(v) * attention.int8_grid(np.abs(v), amax["v"])
        signal += float((ctx ** 2).sum())
        noise += float(((qp @ qv - ctx) ** 2).sum())
    return 10 * np.log10(signal / noise)


@pytest.fixture(scope="module")
def sink():
    m = _attention(128, sink=6.0)
    return m, api.calibrate(m, data=_inputs(128, 8, 1))


@pytest.fixture(scope="module")
def spread():
    m = _attention(32, sink=0.0)
    return m, api.calibrate(m, data=_inputs(32, 8, 1))


def _estimate(model, cal, grid=attention.int8_grid, method=None):
    m = Index(model)
    core = P.attention_core(m, next(n for n in model.graph.node if n.op_type == "Softmax"))
    chosen = trt_thresholds(cal, "qdq", method=method) if grid is attention.int8_grid else fp8.thresholds(cal, method)
    return attention.core_sqnr(m, core, {t.name: t for t in cal.tensors}, {n: t.amax for n, t in chosen.items()}, grid)


def test_attention_core_is_found_with_its_scale():
    m = _attention(16, sink=0.0)
    index = Index(m)
    core = P.attention_core(index, index.nodes["n_probs"])
    assert core.scores.name == "n_scores" and [(c.name, slot) for c, slot in core.contexts] == [("n_ctx", 0)]
    assert core.scale == pytest.approx(1 / np.sqrt(HEAD))  # the Div by sqrt(d); the bias Add does not scale
    assert P.transformer_structure(index) == {}  # attention without LayerNorm is no transformer (unchanged)


def test_a_sink_rounds_the_other_probabilities_to_zero_and_the_estimate_says_so(sink):
    model, cal = sink
    found = _estimate(model, cal)
    measured = _measured_context_db(model, cal, _inputs(128, 4, 2))
    # 127 tokens share ~25 % of the mass at ~0.002 each, below half the int8 step (amax ~0.8 / 127): lost
    assert measured < 20 and found["context_db"] < 20
    assert found["context_db"] <= measured + 1.0  # the estimate errs low (toward FP16), not high
    assert found["sqnr_db"] <= min(found["context_db"], found["scores_db"])


def test_spread_attention_without_a_sink_keeps_int8_and_the_estimate_is_close(spread):
    model, cal = spread
    found = _estimate(model, cal)
    measured = _measured_context_db(model, cal, _inputs(32, 4, 2))
    assert measured > attention.MIN_SQNR_DB and found["sqnr_db"] >= attention.MIN_SQNR_DB
    assert measured - 6.0 <= found["context_db"] <= measured + 1.0


def test_fp8_holds_the_probabilities_int8_loses(sink):
    model, cal = sink
    int8, e4m3 = _estimate(model, cal), _estimate(model, cal, fp8.e4m3_grid)
    assert e4m3["context_db"] > attention.MIN_SQNR_DB > int8["context_db"] + 10
    placed, _ = fp8.plan(model, cal)
    assert CORE <= set(placed.int8_layers)  # the FP8 layers: the core stays FP8


def _files(tmp_path, model, seq: int):
    path = tmp_path / "attn.onnx"
    onnx.save(model, path)
    data = tmp_path / "data"
    data.mkdir()
    for i, feed in enumerate(_inputs(seq, 8, 1)):
        np.save(data / f"{i:02d}.npy", feed["x"])
    return path, data


def test_cli_keeps_the_core_fp16_lists_it_and_include_forces_it(tmp_path):
    path, data = _files(tmp_path, _attention(128, sink=6.0), 128)
    run = CliRunner()
    r = run.invoke(cli, ["calibrate", str(path), "--data", str(data), "-o", str(tmp_path / "a.calib.json")])
    assert r.exit_code == 0, r.output
    out = tmp_path / "a.trt.onnx"
    r = run.invoke(cli, ["export", "--target", "tensorrt", "--calib", str(tmp_path / "a.calib.json"), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert CORE <= set(summary["fp32_layer_names"])
    why = summary["default_exclusions"]["n_ctx"]
    assert why.startswith("attention core with int8 error") and "softmax.V" in why and "< 30 dB" in why
    assert summary["default_exclusions"]["n_scores"] == why  # the core goes as one
    r = run.invoke(cli, ["export", "--target", "tensorrt", "--calib", str(tmp_path / "a.calib.json"), "-o", str(out)])
    assert "attention core(s) kept FP16" in r.output and "n_ctx" in r.output
    r = run.invoke(cli, ["inspect", str(out), "--trt-version", "11.4"])
    assert r.exit_code == 0, r.output
    r = run.invoke(cli, ["export", "--target", "tensorrt", "--calib", str(tmp_path / "a.calib.json"), "-o", str(out), "--json",
                         "--include", "n_scores", "--include", "n_ctx"])
    forced = json.loads(r.stdout)
    assert not CORE & set(forced["fp32_layer_names"]) and "default_exclusions" not in forced
    assert forced["int8_layers"] == summary["int8_layers"] + 2


def test_cli_keeps_a_faithful_core_int8(tmp_path):
    path, data = _files(tmp_path, _attention(32, sink=0.0), 32)  # 32 tokens: ModelOpt's small-GEMM rule (K, N < 16) keeps out shorter ones
    run = CliRunner()
    assert run.invoke(cli, ["calibrate", str(path), "--data", str(data), "-o", str(tmp_path / "a.calib.json")]).exit_code == 0
    r = run.invoke(cli, ["export", "--target", "tensorrt", "--calib", str(tmp_path / "a.calib.json"), "-o", str(tmp_path / "a.onnx"),
                         "--json"])
    summary = json.loads(r.stdout)
    assert not CORE & set(summary["fp32_layer_names"]) and "default_exclusions" not in summary
