"""`qtool calibrate` end to end: the sample model, invariance, summaries and bad input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from PIL import Image
from runcli import invoke as run

from qtool.calibration import load
from qtool.targets.tensorrt.files import read_cache

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"


@pytest.fixture
def digits(sample_images):
    """The first 24 sample images, in a folder of their own."""
    return sample_images(24)


def test_sample_model_end_to_end(tmp_path):
    out, cache = tmp_path / "d.calib.json", tmp_path / "d.cache"
    r = run("calibrate", SAMPLE, "--images", IMAGES, "-o", out, "--trt-table", cache)
    assert r.exit_code == 0, r.output
    assert "calibrated 21 tensors from 200 images" in r.output
    cal = load(out)
    assert cal.samples == 200 and cal.method == "entropy" and len(cal.tensors) == 21
    assert (tmp_path / cal.model_path).resolve() == SAMPLE.resolve()
    names = [t.name for t in cal.tensors]
    assert names[0] == "input" and names[-1] == "logits"
    for t in cal.tensors:
        assert 0 < t.amax <= max(-t.min, t.max) + t.hist_range / len(t.counts)
        assert sum(t.counts) > 0
    # the input is pixel/255 in [0, 1]: max is exactly 1, histogram top 2 -> 2048 bins of 1/1024
    inp = cal.tensors[0]
    assert (inp.min, inp.max, inp.unsigned) == (0.0, 1.0, True)
    assert inp.hist_range == 1025 / 1024
    assert sum(inp.counts) == 200 * 32 * 32
    header, entries = read_cache(cache.read_text())
    assert header == {"version": 8601, "algorithm": "EntropyCalibration2"}
    assert list(entries) == names
    for t in cal.tensors:  # TensorRT's grid is signed: unsigned tensors are searched again with 128 levels
        expected = t.threshold("entropy", unsigned=False) if t.unsigned else t.amax
        assert entries[t.name] == pytest.approx(expected, rel=1e-6)
    assert sum(t.unsigned for t in cal.tensors) >= 5  # inputs, ReLU and pool outputs


def test_a_command_run_in_process_leaves_the_callers_logging_as_it_was(tmp_path, digits, caplog):
    """The command line gives qtool's logger a handler of its own for the command's run; run in-process (a notebook,
    a test), the caller's logging then sees qtool's warnings again, as before the command."""
    import logging

    logger = logging.getLogger("qtool")
    before = logger.handlers[:], logger.propagate, logger.level
    assert run("calibrate", SAMPLE, "--images", digits, "-o", tmp_path / "d.calib.json").exit_code == 0
    assert (logger.handlers[:], logger.propagate, logger.level) == before
    with caplog.at_level("WARNING"):
        logging.getLogger("qtool.targets").warning("a warning of qtool's")
    assert "a warning of qtool's" in caplog.text


def test_hand_worked_tiny_graph(tmp_path):
    m = zoo.tiny_relu_model()
    model = tmp_path / "relu.onnx"
    onnx.save(m, model)
    folder = tmp_path / "px"
    folder.mkdir()
    # grey 2x2 pixels 0, 1, 128, 255 with --scale 1/85 give inputs 0, 1/85, 128/85, 3
    Image.fromarray(np.array([[0, 1], [128, 255]], np.uint8)).save(folder / "a.png")
    out = tmp_path / "relu.calib.json"
    r = run("calibrate", model, "--images", folder, "--scale", "1/85", "--mean", "0.5", "-o", out, "--method", "max")
    assert r.exit_code == 0, r.output
    cal = {t.name: t for t in load(out).tensors}
    x, y = cal["x"], cal["y"]
    # x = v/85 - 0.5 -> -0.5, -0.488.., 1.0058.., 2.5; |x| max 2.5 -> range [0, 4), width 1/512
    assert (x.min, x.max) == pytest.approx((-0.5, 2.5))
    nz = {i: c for i, c in enumerate(x.counts) if c}
    assert nz == {int(0.5 * 512): 1, int((0.5 - 1 / 85) * 512): 1, int((128 / 85 - 0.5) * 512): 1, int(2.5 * 512): 1}
    assert x.amax == pytest.approx(2.5) and y.amax == pytest.approx(2.5)
    assert y.min == 0.0 and y.unsigned and sum(y.counts) == 4 and y.counts[0] == 2


def test_batch_size_and_order_give_identical_files(tmp_path, digits):
    reversed_dir = tmp_path / "rev"
    reversed_dir.mkdir()
    files = sorted(digits.iterdir())
    for i, p in enumerate(files):  # same images, opposite sort order
        shutil.copy(p, reversed_dir / f"{len(files) - i:03d}.png")
    outs = []
    for folder, bs in ((digits, 1), (digits, 8), (reversed_dir, 5)):
        out = tmp_path / f"c{len(outs)}.calib.json"
        r = run("calibrate", SAMPLE, "--images", folder, "--batch-size", bs, "-o", out)
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]


def test_json_summary(tmp_path, digits):
    out = tmp_path / "s.calib.json"
    r = run("calibrate", SAMPLE, "--images", digits, "-o", out, "--json")
    assert r.exit_code == 0
    summary = json.loads(r.stdout)
    assert summary["tensors"] == 21 and summary["images"] == 24 and summary["outputs"]["calibration"] == str(out)


def test_default_output_name_in_current_directory(tmp_path, digits, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run("calibrate", SAMPLE, "--images", digits, "--limit", "3")
    assert r.exit_code == 0, r.output
    assert load(tmp_path / "digits_cnn.calib.json").samples == 3


def test_console_script_exit_codes(tmp_path):
    qtool = [sys.executable, "-c", "from qtool.cli import main; main()"]
    r = subprocess.run(qtool + ["calibrate", str(tmp_path / "none.onnx"), "--images", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
    r = subprocess.run(qtool + ["calibrate", "--no-such-flag"], capture_output=True, text=True)
    assert r.returncode == 2
    r = subprocess.run(qtool + ["--version"], capture_output=True, text=True)
    assert r.returncode == 0 and "qtool" in r.stdout


def test_calibrating_an_already_quantized_model_warns(tmp_path):
    sample, images = SAMPLE, IMAGES
    assert run("calibrate", sample, "--images", images, "--limit", "8", "-o", tmp_path / "d.calib.json").exit_code == 0
    assert run("export", sample, "--calib", tmp_path / "d.calib.json", "--target", "qdq", "-o", tmp_path / "d.qdq.onnx").exit_code == 0
    r = run("calibrate", tmp_path / "d.qdq.onnx", "--images", images, "--limit", "8", "-o", tmp_path / "q.calib.json", "--json")
    assert r.exit_code == 0
    warnings = json.loads(r.stdout)["warnings"]
    assert any("with its own QuantizeLinear/DequantizeLinear pairs: kept (the OpenVINO file writes each as the FakeQuantize" in w for w in warnings), warnings
