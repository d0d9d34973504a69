"""Behaviour in scripts: determinism across processes, signals, logging levels, progress bars."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from qtool.cli import cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"
QTOOL = [sys.executable, "-m", "qtool"]


def qtool(*args, cwd=None):
    return subprocess.run(QTOOL + [str(a) for a in args], capture_output=True, text=True, cwd=cwd)


def test_outputs_are_byte_identical_across_processes(tmp_path):
    files = []
    for run in (1, 2):
        folder = tmp_path / f"r{run}"  # the same names in each (an export records its calibration file's name)
        folder.mkdir()
        out, cache = folder / "r.calib.json", folder / "r.cache"
        r = qtool("calibrate", SAMPLE, "--images", IMAGES, "--limit", "40", "-o", out, "--trt-table", cache)
        assert r.returncode == 0, r.stderr
        produced = [out.read_bytes(), cache.read_bytes()]
        for target, extra in (("tensorrt", ["--format", "dynamic-range"]), ("openvino", []), ("qdq", [])):
            exported = folder / f"r.{target}.out"
            r = qtool("export", "--target", target, "--calib", out, "-o", exported, *extra)
            assert r.returncode == 0, r.stderr
            produced.append(exported.read_bytes())
        files.append(produced)
    assert files[0] == files[1]


def _slow_model(path: Path) -> Path:
    """Big convolutions: about a second per 256x256 image on two cores."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((64, 3, 7, 7)) * 0.05).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((64, 64, 7, 7)) * 0.01).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[3, 3, 3, 3]),
             helper.make_node("Conv", ["a", "w2"], ["b"], pads=[3, 3, 3, 3]),
             helper.make_node("Conv", ["b", "w2"], ["y"], pads=[3, 3, 3, 3])]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 256, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 256, 256])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_run_leaves_nothing_and_exits_with_the_signal_code(tmp_path, sig, code):
    """Interrupted while it calibrates: the signal goes once the run says (-v) that it has started,
    not after a fixed delay. Python takes ~1.3 s on an idle 2-core machine to import qtool, and far
    longer on a loaded one; a signal before qtool's main() has installed its handlers kills the
    interpreter as Python's defaults do (SIGTERM: -15; SIGINT: a KeyboardInterrupt traceback, -2),
    which is what the former `sleep(3)` met whenever the machine was busy."""
    model = _slow_model(tmp_path / "slow.onnx")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(QTOOL + ["-v", "calibrate", str(model), "--images", str(IMAGES), "--limit", "60",
                                         "-o", str(out_dir / "s.calib.json"), "--trt-table", str(out_dir / "s.cache")],
                                stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 120  # the run itself takes over a minute
        while "debug: calibrating " not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # inside the calibration loop (helper processes started)
        assert proc.poll() is None, ("the run ended before it could be interrupted", log.read_text())
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert list(out_dir.iterdir()) == []


def _log_model(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_quiet_verbose_and_json(tmp_path):
    model = _log_model(tmp_path / "log.onnx")
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "0.npy", np.array([[0.0, 1.0, 2.0, 3.0]], np.float32))  # log(0) = -inf: a warning
    args = ["calibrate", model, "--data", tmp_path / "d", "-o", tmp_path / "l.calib.json"]
    normal, quiet, verbose = qtool(*args), qtool("-q", *args), qtool("-v", *args)
    assert normal.returncode == quiet.returncode == verbose.returncode == 0
    assert "warning: " in normal.stderr and "NaN/inf" in normal.stderr
    assert quiet.stderr == ""
    assert "debug: " in verbose.stderr
    as_json = qtool(*args, "--json")
    summary = json.loads(as_json.stdout)  # stdout holds exactly one JSON document
    assert summary["command"] == "calibrate" and summary["warnings"] and summary["outputs"]["calibration"].endswith("l.calib.json")


def test_no_progress_bar_off_a_terminal(tmp_path):
    r = qtool("calibrate", SAMPLE, "--images", IMAGES, "--limit", "40", "-o", tmp_path / "p.calib.json")
    assert r.returncode == 0 and r.stderr == "" and "\r" not in r.stdout


def test_version_and_help():
    r = qtool("--version")
    assert r.returncode == 0 and r.stdout.startswith("qtool, version ")
    r = qtool("--help")
    assert r.returncode == 0 and "Exit codes" in r.stdout
    for command in ("calibrate", "export", "merge", "inspect"):
        assert CliRunner().invoke(cli, [command, "--help"]).exit_code == 0
