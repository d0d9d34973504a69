"""`--json` on every exit: exactly one JSON document on stdout, `{"error": ..., "exit": N}` on a
failure (bad input 1, bad command line 2, a bug 3), the command's summary with "error" on a failed check."""

import json
from pathlib import Path

import pytest
from runcli import invoke

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"


def _document(r, code: int) -> dict:
    assert r.exit_code == code, r.output
    doc = json.loads(r.stdout)  # one document, nothing else on stdout
    assert doc["exit"] == code and doc["error"]
    assert "\n" not in doc["error"]
    return doc


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("json")
    images = sorted((ROOT / "calib_images").glob("*.png"))[:8]
    r = invoke("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", len(images), "-o", folder / "d.calib.json")
    assert r.exit_code == 0, r.output
    return folder / "d.calib.json"


def test_each_command_with_bad_input_prints_one_error_document(tmp_path, calibrated):
    missing = tmp_path / "missing"
    runs = {
        "calibrate": ("calibrate", missing / "m.onnx", "--images", ROOT / "calib_images"),
        "recompute": ("recompute", missing / "m.calib.json"),
        "merge": ("merge", calibrated, missing / "m.calib.json", "-o", tmp_path / "all.calib.json"),
        "export": ("export", SAMPLE, "--calib", missing / "m.calib.json", "--target", "qdq"),
        "inspect": ("inspect", missing / "m.cache"),
        "evaluate": ("evaluate", SAMPLE, "--calib", calibrated, "--data", missing),
        "report": ("report", missing / "m.calib.json", "-o", tmp_path / "r.html"),
    }
    for command, args in runs.items():
        r = invoke(*args, "--json")
        doc = _document(r, 1)
        assert set(doc) == {"schema", "error", "exit"} and doc["schema"] == 1, command
        assert r.stderr.strip() == f"error: {doc['error']}", command  # the same line as without --json
        assert str(missing) in doc["error"] or "missing" in doc["error"], (command, doc)


def test_a_usage_error_prints_one_document_with_exit_2(calibrated):
    doc = _document(invoke("export", SAMPLE, "--calib", calibrated, "--target", "opnvino", "--json"), 2)
    assert "did you mean 'openvino'" in doc["error"]
    doc = _document(invoke("evaluate", SAMPLE, "--calib", calibrated, "--no-such-flag", "--json"), 2)
    assert "--no-such-flag" in doc["error"]


def test_a_bug_prints_one_document_with_exit_3_and_the_traceback(monkeypatch, calibrated):
    from qtool import api

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a planted bug")

    monkeypatch.setattr(api, "recompute_file", broken)
    doc = _document(invoke("recompute", calibrated, "--json"), 3)
    assert "a planted bug" in doc["error"] and Path(doc["traceback"]).is_file()
    Path(doc["traceback"]).unlink()


def test_a_failed_check_is_one_summary_with_the_error(tmp_path, calibrated):
    import numpy as np

    held = tmp_path / "held"
    held.mkdir()
    x = np.load(ROOT / "sample_models" / "digits_heldout.npz")["x"]
    for i in range(4):
        np.save(held / f"{i}.npy", x[i])
    r = invoke("evaluate", SAMPLE, "--calib", calibrated, "--data", held, "--fail-below", "1000", "--json")
    doc = _document(r, 1)
    assert doc["command"] == "evaluate" and doc["passed"] is False and "below 1000" in doc["error"]


def test_without_json_stdout_stays_empty_on_error(tmp_path):
    r = invoke("recompute", tmp_path / "m.calib.json")
    assert r.exit_code == 1 and r.stdout == "" and r.stderr.startswith("error: ")
