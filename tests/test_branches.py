"""Layers inside If branches (qtool.model.branches, qtool.targets.branches): Silero VAD's shape, the main graph
Equal(sr, 16000) -> If with a whole network in each branch and Ifs nested in them (tests/zoo.py
if_branches_vad_like). calibrate records the branch tensors, the qdq and openvino exports quantize inside the
branches at every depth, onnxruntime and OpenVINO run those files as the simulation computes them, tensorrt
refuses naming If."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo

import qtool
from qtool.checks import simulate
from qtool.errors import QtoolError
from qtool.model import branches
from qtool.model.graph import all_nodes
from qtool.quantizers import cpu_kinds

QUANTIZERS = {"qdq": "QuantizeLinear", "openvino": "FakeQuantize"}
# (If node, branch) paths from the main graph to each branch of the look-alike
PATHS = [(("If_0", w),) for w in branches.BRANCHES] + [
    (("If_0", w), (f"{'If_0_then' if w == 'then_branch' else 'If_0_else'}/decoder/If", v)) for w in branches.BRANCHES for v in branches.BRANCHES]


def sqnr(ref, out) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - out) ** 2).sum(), 1e-30)))


def _feeds(srs=(16000, 8000), modes=(0, 1), n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{"input": rng.normal(0, 1, (1, 64)).astype(np.float32), "sr": np.array(sr, np.int64), "mode": np.array(mode, np.int64)}
            for sr in srs for mode in modes for _ in range(n)]


@pytest.fixture(scope="module")
def calibrated():
    model = zoo.if_branches_vad_like()
    return model, qtool.calibrate(model, data=_feeds())


def _branch(model: onnx.ModelProto, path) -> onnx.GraphProto:
    graph = model.graph
    for node_name, which in path:
        node = next(n for n in graph.node if n.name == node_name)
        graph = branches.branch(node, which)
    return graph


def test_exposed_model_computes_the_same_and_gives_branch_tensors():
    """The If nodes give each branch tensor as an extra output (empty from the branch that does not hold it), the
    model's own outputs unchanged."""
    model = zoo.if_branches_vad_like()

    def catalogue(proto):
        types = qtool.model.tensor_types(proto)
        return qtool.model.activation_tensors(proto, types), types
    exposed, inside = branches.exposed(model, catalogue)
    onnx.checker.check_model(exposed, full_check=True)
    assert "If_0_then/conv1/out" + branches.ALIAS in inside
    nested = "If_0_else/decoder/b/MatMul_output_0" + branches.ALIAS * 2
    assert nested in inside and branches.original(nested) == "If_0_else/decoder/b/MatMul_output_0"
    names = ["features", "enc", "If_0_then/conv1/out" + branches.ALIAS, nested]
    exposed = qtool.model.with_outputs(exposed, names, {**qtool.model.tensor_types(exposed), **inside})
    run, ref = ort.InferenceSession(exposed.SerializeToString()), ort.InferenceSession(model.SerializeToString())
    for feed in _feeds(n=1):
        got, want = run.run(names, feed), ref.run(["features", "enc"], feed)
        assert all(np.array_equal(a, b) for a, b in zip(got[:2], want))
        assert (got[2].size > 0) == (feed["sr"] == 16000)
        assert (got[3].size > 0) == (feed["sr"] != 16000 and feed["mode"] != 1)


def test_calibrate_records_the_tensors_inside_branches_at_every_depth(calibrated):
    model, cal = calibrated
    records = {t.name: t for t in cal.tensors}
    for name in ("If_0_then/conv1/out", "If_0_else/relu1", "If_0_then/decoder/a/MatMul_output_0", "If_0_else/decoder/b/MatMul_output_0"):
        assert name in records, name
    # a branch's tensor has the range of the values that branch computed, and only those
    ref = ort.InferenceSession(model.SerializeToString())
    enc = [ref.run(["enc"], f)[0] for f in _feeds() if f["sr"] == 16000]
    assert records["If_0_then/enc"].max == pytest.approx(max(float(e.max()) for e in enc))
    assert records["enc"].max >= records["If_0_then/enc"].max


def test_a_branch_no_input_took_stays_float():
    model = zoo.if_branches_vad_like()
    cal = qtool.calibrate(model, data=_feeds(srs=(16000,)))
    names = {t.name for t in cal.tensors}
    assert "If_0_then/conv1/out" in names and not any(n.startswith("If_0_else/") for n in names)
    assert any("inside If branches that no calibration input took" in w for w in cal.warnings), cal.warnings
    q = onnx.load_from_string(bytes(qtool.export(model, cal, target="qdq")))
    assert any(n.op_type == "QuantizeLinear" for n in _branch(q, PATHS[0]).node)
    assert not any(n.op_type == "QuantizeLinear" for n in all_nodes(_branch(q, PATHS[1])))


@pytest.mark.parametrize("target", sorted(QUANTIZERS))
def test_each_cpu_target_quantizes_inside_branches_at_every_depth(calibrated, target):
    model, cal = calibrated
    q = onnx.load_from_string(bytes(qtool.export(model, cal, target=target)))
    onnx.checker.check_model(q, full_check=True)
    for path in PATHS:
        assert any(n.op_type == QUANTIZERS[target] for n in _branch(q, path).node), path
    # the weights are 8-bit in their branch
    assert any(t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for t in _branch(q, PATHS[0]).initializer)
    assert not any(n.op_type == QUANTIZERS[target] for n in q.graph.node)  # the main graph has nothing to quantize


def test_qdq_file_runs_in_onnxruntime_as_simulated(calibrated):
    model, cal = calibrated
    data = bytes(qtool.export(model, cal, target="qdq"))
    ref, real, sim = ort.InferenceSession(model.SerializeToString()), ort.InferenceSession(data), simulate.simulation(data)
    for feed in _feeds(n=1, seed=1):
        want, got, exact = ref.run(None, feed), real.run(None, feed), sim.run(None, feed)
        assert all(sqnr(w, e) > 25 for w, e in zip(want, exact)), [sqnr(w, e) for w, e in zip(want, exact)]
        assert all(sqnr(e, g) > 40 for e, g in zip(exact, got))


def test_openvino_file_runs_in_openvino_as_simulated(calibrated, tmp_path):
    """OpenVINO compiles the If and computes the FakeQuantize nodes inside its branches as the simulation does
    (which rewrites them into float ops inside the branches)."""
    import openvino as ov
    model, cal = calibrated
    data = bytes(qtool.export(model, cal, target="openvino"))
    path = tmp_path / "m.openvino.onnx"
    path.write_bytes(data)
    core = ov.Core()
    real = core.compile_model(core.read_model(str(path)), "CPU", cpu_kinds.PINNED_F32)
    ref, sim = ort.InferenceSession(model.SerializeToString()), simulate.simulation(data)
    for feed in _feeds(n=1, seed=2):
        want, exact = ref.run(None, feed), sim.run(None, feed)
        got = list(real(feed).values())
        assert all(sqnr(w, e) > 25 for w, e in zip(want, exact))
        assert all(sqnr(e, g) > 40 for e, g in zip(exact, got)), [sqnr(e, g) for e, g in zip(exact, got)]


@pytest.mark.parametrize("target", sorted(QUANTIZERS))
def test_evaluate_scores_the_quantizers_inside_branches(calibrated, target):
    """evaluate's simulation computes the branches' quantizers (FakeQuantize rewritten inside them: not FP32's
    +inf); onnxruntime agrees (OpenVINO's run of the file: test_openvino_file_runs_in_openvino_as_simulated)."""
    model, cal = calibrated
    runtime = "onnxruntime" if target == "qdq" else None
    result = qtool.evaluate(model, cal, data=_feeds(n=2, seed=3), target=target, runtime=runtime)
    assert 20 < result.worst_sqnr_db < 100, result.worst_sqnr_db
    if runtime:
        assert abs(result.worst_sqnr_db - result.runtime.worst_sqnr_db) < 0.5


def test_tensorrt_refuses_naming_if(calibrated):
    model, cal = calibrated
    with pytest.raises(QtoolError, match="inside If branches"):
        qtool.export(model, cal, target="tensorrt")


def test_the_rankings_refuse_a_model_whose_layers_are_inside_branches(calibrated):
    """--tensors, --keep-fp32 and --max-drop build models of the main graph's quantizers: a one-line refusal, not a
    ranking of none."""
    model, cal = calibrated
    with pytest.raises(QtoolError, match="inside If branches"):
        qtool.evaluate(model, cal, data=_feeds(n=1), target="qdq", per_tensor=True)


def _loop_matmul_model() -> onnx.ModelProto:
    """x -> MatMul -> Loop (3 trips; its body: acc -> MatMul with a main-graph weight -> Relu) -> y."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array((rng.normal(0, 1, (8, 8)) / np.sqrt(8)).astype(np.float32), "w")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("MatMul", ["acc_in", "w"], ["mm"], name="/body/MatMul"),
         helper.make_node("Relu", ["mm"], ["acc_out"], name="/body/Relu")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 8])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="/MatMul"), helper.make_node("Loop", ["trips", "keep", "h"], ["y"], name="/Loop", body=body)],
        "loop_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w, numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "keep")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_export_warns_of_layers_inside_loop_bodies():
    import logging

    class Kept(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())
    model = _loop_matmul_model()
    rng = np.random.default_rng(6)
    cal = qtool.calibrate(model, data=[{"x": rng.normal(0, 1, (1, 8)).astype(np.float32)} for _ in range(8)])
    kept, logger = Kept(), logging.getLogger("qtool")  # the logger's own handler: other tests' set-ups may stop propagation
    level = logger.level  # and a quiet (-q) command before this one leaves the logger at ERROR
    logger.addHandler(kept)
    logger.setLevel(logging.WARNING)
    try:
        qtool.export(model, cal, target="qdq")
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    assert any("inside Loop/Scan bodies stay float (/body/MatMul)" in m for m in kept.messages), kept.messages


def test_report_says_its_page_leaves_out_the_layers_inside_branches(calibrated, tmp_path):
    """qtool report plots the main graph's quantizers: for a model whose layers are inside If branches it said
    "0 quantized" and nothing else. It now warns that the branches' layers, which the export quantizes, are not on it."""
    from runcli import invoke

    model, _ = calibrated
    onnx.save(model, tmp_path / "vad.onnx")
    (tmp_path / "data").mkdir()
    for i, feeds in enumerate(_feeds(n=2)):
        np.savez(tmp_path / "data" / f"{i:02d}.npz", **feeds)
    r = invoke("-q", "calibrate", tmp_path / "vad.onnx", "--data", tmp_path / "data", "-o", tmp_path / "vad.calib.json")
    assert r.exit_code == 0, r.output
    r = invoke("report", tmp_path / "vad.calib.json", "--target", "qdq", "-o", tmp_path / "vad.html")
    assert r.exit_code == 0 and (tmp_path / "vad.html").exists(), r.output
    assert "the page shows the main graph's quantizers only: the layers inside If branches (" in r.stderr, r.stderr
