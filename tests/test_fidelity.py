"""Issue 9 features, each shown to change what it should: fast bias correction, NNCF's ignored
patterns, per-sample statistics (mean-minmax), --method auto, backwards-compatible files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from runcli import invoke

from qtool import calibration
from qtool.quantizers import biascorrection
from qtool.statistics import thresholds
from qtool.statistics.histogram import TensorHistogram
from qtool.statistics.stats import UNIT_LOG2, SampleStats
from qtool.targets.cpu import CPU

FLOAT = TensorProto.FLOAT


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    return r


def export(target, calib, out, *extra) -> dict:
    return json.loads(ok("export", "--target", target, "--calib", calib, "-o", out, "--json", *extra).stdout)


def save_model(tmp_path: Path, nodes, inits, x_shape, outputs, name="m.onnx") -> Path:
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(o, FLOAT, None) for o in outputs], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = tmp_path / name
    onnx.save(m, str(path))
    return path


def write_data(folder: Path, arrays) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(arrays):
        np.save(folder / f"{i:03d}.npy", a.astype(np.float32))
    return folder


def run(path, x):
    """The file's exact arithmetic: graph optimization off, so Q/DQ stay float ops and none of this
    CPU's int8 kernels runs (without VNNI those saturate u8 x s8 pair sums)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})


def biased_cnn(tmp_path: Path, rng) -> Path:
    """Two Convs with biases; a few large weights per channel make the weight grid coarse, so
    weight quantization shifts each output channel's mean."""
    def weight(shape):
        w = rng.normal(0, 0.05, shape)
        w.reshape(shape[0], -1)[:, 0] = rng.choice([-1.0, 1.0], shape[0]) * 4.0  # one outlier per channel
        return w.astype(np.float32)

    inits = [numpy_helper.from_array(weight((16, 8, 3, 3)), "w1"), numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "b1"),
             numpy_helper.from_array(weight((4, 16, 1, 1)), "w2"), numpy_helper.from_array(rng.uniform(0.5, 1.5, 4).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2")]
    return save_model(tmp_path, nodes, inits, ("n", 8, 12, 12), ["y"])


def samples(rng, n, shape=(1, 8, 12, 12)):
    offsets = np.linspace(0.2, 2.0, shape[1]).reshape(1, -1, 1, 1)  # channels with different means
    return [rng.uniform(0, 1, shape) * offsets for _ in range(n)]


# ---------------------------------------------------------------- bias correction


def test_bias_correction_removes_the_mean_output_error(tmp_path):
    rng = np.random.default_rng(0)
    model = biased_cnn(tmp_path, rng)
    calib = tmp_path / "m.calib.json"
    ok("-q", "calibrate", model, "--data", write_data(tmp_path / "calib", samples(rng, 24)), "--method", "max", "-o", calib)
    on = export("qdq", calib, tmp_path / "bc.onnx")
    off = export("qdq", calib, tmp_path / "plain.onnx", "--no-bias-correction")
    assert on["bias_corrected_layers"] == 2 and off["bias_corrected_layers"] == 0
    x = np.concatenate(samples(rng, 16)).astype(np.float32)  # held-out
    ref = run(model, x)[0]
    mean_error = {k: np.abs((run(tmp_path / f, x)[0] - ref).mean(axis=(0, 2, 3))).mean() for k, f in (("on", "bc.onnx"), ("off", "plain.onnx"))}
    assert mean_error["on"] < 0.3 * mean_error["off"], mean_error
    # only the biases changed
    a, b = onnx.load(str(tmp_path / "bc.onnx")), onnx.load(str(tmp_path / "plain.onnx"))
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]


def test_bias_shift_is_the_weight_error_applied_to_the_input_means():
    """correct() shifts a Conv bias by sum over the kernel of (W - Wq) * mean input, per group."""
    from qtool.model import graph as G
    from qtool.quantizers import placement

    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (6, 2, 3, 3)).astype(np.float32)  # 3 groups of 2 input channels
    b = np.ones(6, np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", group=3, pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", FLOAT, [1, 6, 5, 5])], [helper.make_tensor_value_info("y", FLOAT, None)],
                          initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    means = np.array([0.5, 1.0, -2.0, 0.25, 3.0, 1.5])
    stats = SampleStats(axis=1)
    x = np.broadcast_to(means.reshape(1, 6, 1, 1), (1, 6, 5, 5))
    stats.update([x], 1, TensorHistogram().update(x))
    records = {"x": calibration.TensorRecord("x", -3.0, 3.0, 3.0, [1, 1], 3.0, stats=stats),
               "y": calibration.TensorRecord("y", -9.0, 9.0, 9.0, [1, 1], 9.0)}
    plan = placement.place(m, records, rules=CPU)
    result = biascorrection.correct(m, G.Namer(m), plan, records, threshold=None)
    assert result.layers == ["conv"]
    new = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == m.graph.node[0].input[2]))
    wq = plan.weights[0].params()
    scale = np.asarray(wq.scale).reshape(6, 1, 1, 1)
    d = (w - np.clip(np.rint(w / scale), -127, 127) * scale).reshape(6, 2, 9).sum(axis=2)
    expected = b + (d * means.reshape(3, 2)[np.arange(6) // 2]).sum(axis=1)
    np.testing.assert_allclose(new, expected, rtol=1e-5, atol=1e-6)
    # NNCF's magnitude rule (optional) leaves a layer with a zero bias element alone
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(6, np.float32), "b0"))
    m.graph.node[0].input[2] = "b0"
    nncf_rule = biascorrection.correct(m, G.Namer(m), plan, records, threshold=biascorrection.NNCF_THRESHOLD)
    assert nncf_rule.layers == [] and "zero bias" in nncf_rule.skipped["conv"]


def test_bias_shift_of_a_gemm_without_c_goes_to_the_add_after_it(recwarn):
    """tf2onnx's Dense: Gemm(alpha, beta=0) without C, its bias in the Add after it. The Add's bias takes alpha
    times the shift (C, scaled by beta, is not there): the shift was divided by beta, inf, with a numpy warning
    printed by qtool export."""
    from qtool.model import graph as G
    from qtool.quantizers import placement

    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (5, 4)).astype(np.float32)  # [cout, cin], transB
    b = np.full(5, 0.5, np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="dense", alpha=2.0, beta=0.0, transB=1),
             helper.make_node("Add", ["g", "b"], ["y"], name="bias")]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", FLOAT, [3, 4])], [helper.make_tensor_value_info("y", FLOAT, None)],
                          initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    means = np.array([0.5, 1.0, -2.0, 0.25])
    stats = SampleStats(axis=1)
    x = np.broadcast_to(means.reshape(1, 4), (3, 4))
    stats.update([x], 1, TensorHistogram().update(x))
    records = {"x": calibration.TensorRecord("x", -3.0, 3.0, 3.0, [1, 1], 3.0, stats=stats),
               "g": calibration.TensorRecord("g", -9.0, 9.0, 9.0, [1, 1], 9.0),
               "y": calibration.TensorRecord("y", -9.0, 9.0, 9.0, [1, 1], 9.0)}
    plan = placement.place(m, records, rules=CPU)
    result = biascorrection.correct(m, G.Namer(m), plan, records, threshold=None)
    assert result.layers == ["dense"] and not [r for r in recwarn if issubclass(r.category, RuntimeWarning)]
    new = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == m.graph.node[1].input[1]))
    wq = plan.weights[0].params()
    d = w - np.clip(np.rint(w / np.asarray(wq.scale).reshape(5, 1)), -127, 127) * np.asarray(wq.scale).reshape(5, 1)
    np.testing.assert_allclose(new, b + 2.0 * (d @ means), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- ignored patterns


def test_ignored_patterns_leave_the_se_gating_path_fp32(tmp_path):
    rng = np.random.default_rng(2)

    def w(name, shape):
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    inits = [w("w0", (8, 3, 3, 3)), w("w1", (4, 8, 1, 1)), w("w2", (8, 4, 1, 1)), w("w3", (8, 8, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
             helper.make_node("GlobalAveragePool", ["r0"], ["p"], name="se_pool"),
             helper.make_node("Conv", ["p", "w1"], ["s1"], name="se_reduce"),
             helper.make_node("Relu", ["s1"], ["s1r"], name="se_relu"),
             helper.make_node("Conv", ["s1r", "w2"], ["s2"], name="se_expand"),
             helper.make_node("Sigmoid", ["s2"], ["gate"], name="se_gate"),
             helper.make_node("Mul", ["r0", "gate"], ["gated"], name="se_mul"),
             helper.make_node("Conv", ["gated", "w3"], ["y"], name="project")]
    model = save_model(tmp_path, nodes, inits, ("n", 3, 8, 8), ["y"])
    calib = tmp_path / "m.calib.json"
    ok("-q", "calibrate", model, "--data", write_data(tmp_path / "d", [rng.uniform(0, 1, (1, 3, 8, 8)) for _ in range(8)]), "-o", calib)

    def dequantized_inputs(path):
        m = onnx.load(str(path))
        dq = {n.output[0] for n in m.graph.node if n.op_type == "DequantizeLinear"}
        return {n.name: [i in dq for i in n.input[:2]] for n in m.graph.node if n.op_type in ("Conv", "Mul")}

    default = export("qdq", calib, tmp_path / "default.onnx")
    assert default["fp32_layer_names"] == ["se_expand", "se_reduce"] and default["int8_layers"] == 2
    assert default["ignored_pattern_nodes"] == {"se_block": 4}  # reduce, relu, expand, gate; not the pool or the Mul
    q = dequantized_inputs(tmp_path / "default.onnx")
    assert q["se_reduce"] == [False, False] and q["se_expand"] == [False, False]
    # the gating Mul reads float: its two quantizers would serve it alone, the pool reading r0 aside
    # (placement.moves.lone_sums; NNCF's default preset quantizes it, its transformer preset not)
    assert q["se_mul"] == [False, False] and q["stem"] == q["project"] == [True, True]

    everything = export("qdq", calib, tmp_path / "all.onnx", "--no-ignored-patterns")
    assert everything["int8_layers"] == 4 and everything["fp32_layers"] == 0
    assert dequantized_inputs(tmp_path / "all.onnx")["se_reduce"] == [True, True]


# ---------------------------------------------------------------- per-sample statistics, mean-minmax


def test_mean_minmax_is_the_mean_of_per_sample_maxima_and_shards_merge_exactly(tmp_path):
    rng = np.random.default_rng(3)
    model = biased_cnn(tmp_path, rng)
    data = samples(rng, 12)
    data[3] = data[3] * 5  # one sample with a far larger range
    folder = write_data(tmp_path / "d", data)
    full = tmp_path / "all.calib.json"
    ok("-q", "calibrate", model, "--data", folder, "--method", "mean-minmax", "-o", full)
    cal = calibration.load(full)
    x = next(t for t in cal.tensors if t.name == "x")
    expected = np.mean([np.abs(a.astype(np.float32)).max() for a in data])
    assert x.amax == pytest.approx(expected, rel=1e-9) and x.amax < x.absmax / 2
    # per-channel means of each Conv input, along the channel axis
    np.testing.assert_allclose(x.stats.channel_means(), np.mean([a.astype(np.float32).mean(axis=(0, 2, 3)) for a in data], axis=0), rtol=1e-6)
    assert x.stats.axis == 1 and next(t for t in cal.tensors if t.name == "r1").stats.axis == 1
    assert next(t for t in cal.tensors if t.name == "y").stats.channel_sums is None  # read by no layer
    parts = []
    for k in (1, 2, 3):
        parts.append(tmp_path / f"p{k}.calib.json")
        ok("-q", "calibrate", model, "--data", folder, "--method", "mean-minmax", "--shard", f"{k}/3", "-o", parts[-1])
    ok("-q", "merge", parts[1], parts[2], parts[0], "-o", tmp_path / "merged.calib.json")
    assert (tmp_path / "merged.calib.json").read_bytes() == full.read_bytes()


def test_per_sample_statistics_do_not_depend_on_the_batch():
    """A batch of four gives the same sums as four batches of one (channel rows longer than numpy's
    8192-value buffers, a NaN in one sample), and the sums are exact integers."""
    rng = np.random.default_rng(2)
    x = rng.normal(0.3, 2.0, (4, 3, 100, 100)).astype(np.float32)
    x[2, 1, 5, 5] = np.nan
    whole, parts = SampleStats(axis=1, track_absmax=True), SampleStats(axis=1, track_absmax=True)
    whole.update([x], 4, TensorHistogram().update(x, 4))
    for i in range(4):
        parts.update([x[i : i + 1]], 1, TensorHistogram().update(x[i : i + 1]))
    assert whole.to_json() == parts.to_json()
    assert whole.count == 4 and all(isinstance(v, int) for v in whole.to_json()["channel_sums"])
    clean = np.where(np.isfinite(x), x, 0).astype(np.float64)
    np.testing.assert_allclose(whole.channel_means(), clean.mean(axis=(2, 3)).mean(axis=0), rtol=1e-9)
    assert whole.mean_min == pytest.approx(clean.min(axis=(1, 2, 3)).mean(), abs=1e-9)


def test_version_1_files_without_statistics_still_work(tmp_path):
    rng = np.random.default_rng(4)
    model = biased_cnn(tmp_path, rng)
    calib = tmp_path / "m.calib.json"
    ok("-q", "calibrate", model, "--data", write_data(tmp_path / "d", samples(rng, 6)), "-o", calib)
    doc = json.loads(calib.read_text())
    assert doc["version"] == 1 and doc["per_sample_unit_log2"] == UNIT_LOG2
    doc.pop("per_sample_unit_log2")
    for t in doc["tensors"].values():
        t.pop("per_sample")
    old = tmp_path / "old.calib.json"
    old.write_text(json.dumps(doc))
    assert all(t.stats is None for t in calibration.load(old).tensors)
    summary = export("openvino", old, tmp_path / "o.onnx")
    assert summary["bias_corrected_layers"] == 0 and any("no per-channel means" in w for w in summary["warnings"])
    r = invoke("recompute", old, "--method", "mean-minmax", "-o", tmp_path / "mm.json")
    assert r.exit_code == 1 and "per-sample statistics" in r.output and not (tmp_path / "mm.json").exists()
    ok("recompute", old, "--method", "auto", "-o", tmp_path / "auto.json")  # histogram methods need nothing new


# ---------------------------------------------------------------- auto


def _histograms():
    rng = np.random.default_rng(5)
    edges = np.arange(2049) / 2048 * 8.0
    out = {}
    gauss = np.abs(rng.normal(0, 0.5, 200_000))
    out["gaussian"] = np.histogram(gauss, edges)[0]
    out["uniform"] = np.histogram(rng.uniform(0, 7.9, 200_000), edges)[0]
    out["spike + outliers"] = np.histogram(np.concatenate([np.abs(rng.normal(0, 0.05, 200_000)), rng.uniform(3, 7.9, 30)]), edges)[0]
    out["two modes"] = np.histogram(np.concatenate([np.abs(rng.normal(0, 0.2, 100_000)), rng.normal(5, 0.3, 2_000)]), edges)[0]
    return out, edges


def test_auto_picks_the_lowest_error_method_per_tensor():
    hists, edges = _histograms()
    chosen = set()
    for (label, h), unsigned in ((item, u) for item in hists.items() for u in (False, True)):
        absmax = float(edges[np.flatnonzero(h)[-1] + 1])
        errors = {m: thresholds.quantization_error(h, edges, thresholds.amax_for(m, h, edges, absmax=absmax, unsigned=unsigned), unsigned=unsigned)
                  for m in thresholds.AUTO_CANDIDATES}
        method, amax = thresholds.auto_choice(h, edges, absmax=absmax, unsigned=unsigned)
        assert errors[method] == min(errors.values()), (label, errors)
        assert amax == thresholds.amax_for(method, h, edges, absmax=absmax, unsigned=unsigned)
        assert thresholds.amax_for("auto", h, edges, absmax=absmax, unsigned=unsigned) == amax
        chosen.add(method)
    assert len(chosen) >= 2  # the choice really is per tensor


def test_quantization_error_counts_rounding_and_clipping():
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    h = np.array([0, 0, 0, 10])  # all values in [3, 4): clipped at 2 they lose x - 2
    assert thresholds.quantization_error(h, edges, 2.0, unsigned=True) == pytest.approx(1.5 ** 2 + 1 / 12 * 1 / 1, rel=0.02)
    assert thresholds.quantization_error(h, edges, 4.0, unsigned=True) < 1e-4  # step 4/255: rounding only


def test_calibrate_auto_records_the_per_tensor_choice(tmp_path):
    rng = np.random.default_rng(6)
    model = biased_cnn(tmp_path, rng)
    calib = tmp_path / "m.calib.json"
    ok("-q", "calibrate", model, "--data", write_data(tmp_path / "d", samples(rng, 8)), "--method", "auto", "-o", calib)
    cal = calibration.load(calib)
    assert cal.method == "auto"
    for t in cal.tensors:
        h, e = np.asarray(t.counts), t.edges()
        errors = [thresholds.quantization_error(h, e, t.threshold(m), unsigned=t.unsigned) for m in thresholds.AUTO_CANDIDATES]
        assert thresholds.quantization_error(h, e, t.amax, unsigned=t.unsigned) == min(errors)
