"""qtool export --max-drop: the fewest FP32 layers that meet an accuracy budget, measured on the
target's own model (its exact simulation: onnxruntime with graph optimization off, the same on
every CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from runcli import invoke
from test_openvino import HELDOUT, IMAGES, SAMPLE, ok, ort_run, sqnr

from qtool.checks import simulate
from qtool.checks.budget import Budget, parse_budget
from qtool.errors import QtoolError


def exact(path, feeds):
    """The file's own arithmetic (FakeQuantize as float ops, Q/DQ as float ops), on any CPU."""
    return simulate.simulation(path.read_bytes()).run(None, feeds)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "--limit", "48", "-o", d / "c.calib.json"))
    x = np.load(HELDOUT)["x"][:200]
    (d / "held").mkdir()
    for i in range(0, 200, 50):
        np.save(d / "held" / f"h{i:03d}.npy", x[i:i + 50])
    return d, x


def test_parse_budget():
    assert parse_budget("30dB") == Budget("sqnr", 30.0) == parse_budget("30")
    assert parse_budget("1%") == Budget("top1", 0.99)
    for bad in ("thirty", "-3dB", "100%", "5 dBm"):
        with pytest.raises(QtoolError, match="max_drop="):
            parse_budget(bad)


def test_max_drop_meets_its_budget_with_the_fewest_layers(setup, tmp_path):
    d, x = setup
    base = json.loads(ok(invoke("evaluate", SAMPLE, "--calib", d / "c.calib.json", "--data", d / "held", "--json", "--no-tensors")).stdout)
    goal = base["sqnr_db"] + 6  # well above what the all-int8 model reaches
    out = tmp_path / "m.qdq.onnx"
    summary = json.loads(ok(invoke("export", "--target", "qdq", "--calib", d / "c.calib.json", "-o", out, "--json",
                                   "--max-drop", f"{goal}dB", "--data", d / "held")).stdout)
    kept = summary["kept_fp32"]
    assert kept and summary["fp32_layers"] >= 1
    reached = sqnr(ort_run(SAMPLE, {"input": x})[0], exact(out, {"input": x})[0])
    assert reached >= goal - 1e-4  # confirmed on the written file
    trials = {t["fp32_tensors"]: t["value"] for t in summary["budget"]["trials"]}
    assert trials[0] < goal and trials[len(kept)] >= goal
    assert len(kept) == 1 or trials[len(kept) - 1] < goal  # one tensor fewer does not meet it
    assert summary["budget"]["latency_ms"]["with_fp32_layers"] > 0


def test_a_budget_already_met_keeps_everything_int8(setup, tmp_path):
    d, _ = setup
    summary = json.loads(ok(invoke("export", "--target", "openvino", "--calib", d / "c.calib.json", "-o", tmp_path / "m.onnx",
                                   "--json", "--max-drop", "1%", "--data", d / "held")).stdout)
    assert summary["kept_fp32"] == [] and summary["budget"]["reached"] == "100.00 %"


def test_an_unreachable_budget_fails_cleanly(setup, tmp_path):
    d, _ = setup
    out = tmp_path / "m.onnx"
    r = invoke("export", "--target", "qdq", "--calib", d / "c.calib.json", "-o", out, "--max-drop", "90dB", "--max-fp32", "2",
               "--data", d / "held")
    assert r.exit_code == 1 and "no set of at most 2 layer group(s)" in r.stderr and r.stderr.count("\n") == 1
    assert not out.exists()
    r = invoke("export", "--target", "qdq", "--calib", d / "c.calib.json", "-o", out, "--max-drop", "1%", "--keep-fp32", "2",
               "--data", d / "held")
    assert r.exit_code == 1 and "give one" in r.stderr
    r = invoke("export", "--target", "qdq", "--calib", d / "c.calib.json", "-o", out, "--max-drop", "1%")
    assert r.exit_code == 1 and "--images DIR or --data DIR" in r.stderr


def test_an_openvino_budget_is_measured_on_the_openvino_file(setup, tmp_path):
    """--target openvino ranks and measures the FakeQuantize model (its placement, its 7-bit
    weights), not the QDQ one (another number: test_evaluate): the all-int8 trial is evaluate
    --target openvino's number."""
    d, x = setup
    common = ("--calib", d / "c.calib.json", "--data", d / "held", "--json")
    ov = json.loads(ok(invoke("evaluate", SAMPLE, *common, "--target", "openvino")).stdout)["sqnr_db"]
    goal = ov + 3
    out = tmp_path / "m.openvino.onnx"
    summary = json.loads(ok(invoke("export", "--target", "openvino", "-o", out, *common, "--max-drop", f"{goal}dB")).stdout)
    trials = {t["fp32_tensors"]: t["value"] for t in summary["budget"]["trials"]}
    assert abs(trials[0] - ov) < 1e-3 and trials[len(summary["kept_fp32"])] >= goal
    assert sqnr(ort_run(SAMPLE, {"input": x})[0], exact(out, {"input": x})[0]) >= goal - 1e-4


def test_integer_output_models_rank_and_measure_on_the_float_tensors_they_come_from(tmp_path):
    """A tagger whose only output is its ArgMax labels (zoo.char_tagger_argmax_like): evaluate scores its logits, but
    --keep-fp32 and --max-drop refused it ("no float outputs"). They now rank and measure the same logits: a budget
    above the all-int8 figure keeps a layer FP32, and the written file meets it on those logits."""
    from test_evaluate import calibrated_tagger, exposed_sqnr

    model, calib = calibrated_tagger(tmp_path, 11)
    base = json.loads(ok(invoke("evaluate", model, "--calib", calib, "--data", tmp_path / "held", "--target", "qdq", "--json",
                                "--no-tensors")).stdout)["sqnr_db"]
    out = tmp_path / "tagger.qdq.onnx"
    summary = json.loads(ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out, "--json", "--max-drop",
                                   f"{base + 3}dB", "--data", tmp_path / "held")).stdout)
    assert summary["kept_fp32"] and any("computed from (labels: /head/Add_output_0)" in w for w in summary["warnings"])
    kept = json.loads(ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", tmp_path / "k.onnx", "--json",
                                "--keep-fp32", "1", "--data", tmp_path / "held")).stdout)
    assert len(kept["kept_fp32"]) == 1
    assert exposed_sqnr(model, out, ["/head/Add_output_0"], tmp_path / "held")[0] >= base + 3 - 1e-3
