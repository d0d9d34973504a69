"""Temporary files, signals and the global flags: nothing is left in the temporary folder on any
exit path (SIGTERM, SIGINT, SIGHUP, SIGKILL then the next run), Ctrl-C at start is quiet,
-q/-v work after the command, and onnxruntime writes nothing on stderr."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from click.testing import CliRunner
from onnx import TensorProto, helper
from PIL import Image

from qtool import scratch
from qtool.cli import cli
from qtool.cli import main as qtool_main
from qtool.runtime import nchwc, onnxruntime

ROOT = Path(__file__).resolve().parents[1]


def _env(tmpdir: Path) -> dict:
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLUMNS", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a hang's stacks: see _ended
    return env


@pytest.fixture
def work(tmp_path):
    """A YOLO-like model, 120 noise pictures and a private, empty temporary folder. At --size 64x96
    a whole calibration takes under a second; the tests that interrupt one ask LONG_SIZE (~3 s),
    so that the signal lands before it is over."""
    onnx.save(zoo.yolo_like(), tmp_path / "y.onnx")
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(120):
        Image.fromarray(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp_path, tmp


LONG_SIZE = "480x640"


def _left(tmp: Path) -> list[str]:
    """What is in the temporary folder but onnxruntime's telemetry file (`.ses`, written when it is
    imported, kept and reused by every later process: not a temporary file)."""
    return sorted(p.name for p in tmp.iterdir() if p.name != ".ses")


def _start(work, *argv) -> subprocess.Popen:
    d, tmp = work
    return subprocess.Popen([sys.executable, "-m", "qtool", *argv], cwd=d, env=_env(tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ended(proc: subprocess.Popen, seconds: float = 60) -> str:
    """Its stderr once it ended; if it hangs, the stacks of its threads (faulthandler, SIGABRT)."""
    try:
        return proc.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"it hangs:\n{proc.communicate()[1][-8000:]}")


def _calibrating(work) -> subprocess.Popen:
    """`qtool -v calibrate`, returned once it is calibrating (its debug line says so)."""
    d, _ = work
    proc = _start(work, "-v", "calibrate", "y.onnx", "--images", "imgs", "--size", LONG_SIZE, "-o", "out.calib.json")
    for line in proc.stderr:
        if line.startswith("debug: calibrating"):
            return proc
    proc.wait()
    pytest.fail(f"calibrate ended before calibrating: exit {proc.returncode}")


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signal_mid_calibration_leaves_nothing(work, sig, code):
    d, tmp = work
    proc = _calibrating(work)
    proc.send_signal(sig)
    err = _ended(proc)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert not (d / "out.calib.json").exists() and _left(tmp) == []


def test_sigkill_leaves_nothing_and_the_next_run_sweeps(work):
    """Killed outright nothing is on disk (onnxruntime's optimized model is in memory); what an
    older or fallback run left (a dead pid's directory) the next command removes."""
    d, tmp = work
    proc = _calibrating(work)
    proc.kill()
    proc.communicate(timeout=60)
    assert _left(tmp) == []
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp / f"qtool-{dead.pid}-abcd1234"
    stale.mkdir()
    (stale / "optimized.onnx").write_bytes(b"x" * 1000)
    alive = tmp / f"qtool-{os.getpid()}-abcd1234"  # a running process's: kept
    alive.mkdir()
    other = tmp / "qtool-notes"  # not qtool's pattern: kept
    other.mkdir()
    older = tmp / "qtool-k3j_9x0a"  # what an earlier qtool left (no pid): removed once an hour old
    recent = tmp / "qtool-a8f2b0c1"  # ... kept while it may be a running one's
    busy = tmp / "qtool-zz00yy11"  # ... kept: holds more than that file
    for folder in (older, recent, busy):
        folder.mkdir()
        (folder / "optimized.onnx").write_bytes(b"x" * 1000)
    (busy / "other.txt").write_text("mine")
    hour_ago = time.time() - 3700
    os.utime(older, (hour_ago, hour_ago))
    os.utime(busy, (hour_ago, hour_ago))
    r = subprocess.run([sys.executable, "-m", "qtool", "--version"], env=_env(tmp), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _left(tmp) == sorted([alive.name, other.name, recent.name, busy.name])


HOLDS_A_DIRECTORY = """
import signal, time
from qtool import scratch
from qtool.cli import _terminated
signal.signal(signal.SIGTERM, _terminated)
signal.signal(signal.SIGHUP, _terminated)
print(scratch.directory(), flush=True)
(scratch.directory() / "f").write_bytes(b"x")
{end}
"""


@pytest.mark.parametrize("end, sig", [("time.sleep(60)", signal.SIGTERM), ("time.sleep(60)", signal.SIGINT),
                                      ("time.sleep(60)", signal.SIGHUP), ("raise ValueError('boom')", None),
                                      ("pass", None)])
def test_the_temporary_directory_goes_on_every_exit_path(tmp_path, end, sig):
    """The fallback directory (systems without memfd): removed at a normal exit, an exception
    and the signals the CLI turns into exits."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDS_A_DIRECTORY.format(end=end)], env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    made = Path(proc.stdout.readline().strip())
    assert made.parent == tmp_path and made.name.startswith(f"qtool-{proc.pid}-")
    if sig is not None:
        time.sleep(0.2)
        proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert not made.exists() and _left(tmp_path) == []


def test_onnxruntimes_optimized_model_is_not_written_to_disk(tmp_path, monkeypatch):
    """While onnxruntime writes the optimized graph, the temporary folder stays empty."""
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    seen = []
    session = onnxruntime.raw_session

    def watching(*args, **kwargs):
        got = session(*args, **kwargs)
        seen.append(sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")))
        return got

    monkeypatch.setattr(onnxruntime, "raw_session", watching)
    graph = nchwc.optimized(zoo.yolo_like())
    assert len(graph.graph.node) > 0 and seen == [[]]


def test_without_memfd_the_file_lives_in_qtools_directory(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_memfd", lambda name: None)
    monkeypatch.setattr(scratch, "_dir", None)
    seen = []
    session = onnxruntime.raw_session

    def watching(*args, **kwargs):
        got = session(*args, **kwargs)
        seen.append(sorted(p.name for p in tmp_path.rglob("*")))
        return got

    monkeypatch.setattr(onnxruntime, "raw_session", watching)
    expected = nchwc.optimized(zoo.yolo_like())
    assert len(expected.graph.node) > 0
    assert len(seen) == 1 and len(seen[0]) == 2
    folder = tmp_path / next(n for n in seen[0] if n.startswith(f"qtool-{os.getpid()}-"))
    assert any(n.endswith("-optimized.onnx") for n in seen[0])
    assert list(folder.iterdir()) == []  # the file is gone once read
    scratch.remove()
    assert not folder.exists()


def test_ctrl_c_while_starting_is_quiet(work):
    """SIGINT while the modules still import: exit 130, no traceback (the console script and
    `python -m qtool` both start in qtool.launch)."""
    d, tmp = work
    for delay in (0.15, 0.4, 0.8):
        # after the interpreter's own start (its site import, before any code of qtool's runs: a SIGINT there is
        # Python's "Fatal Python error: init_import_site", exit 1), which a loaded machine stretches past 0.15 s
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        startup = time.monotonic() - start
        proc = _start(work, "calibrate", "y.onnx", "--images", "imgs", "--size", LONG_SIZE, "-o", "out.calib.json")
        time.sleep(startup + delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, (delay, err)
        assert not (d / "out.calib.json").exists()


def test_ctrl_c_inside_an_import_is_delivered_after_it(tmp_path):
    """A C extension interrupted in its initialisation fails as ImportError or aborts the process:
    qtool.launch holds the signal back until the import is over, then raises KeyboardInterrupt."""
    (tmp_path / "slowmod.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.2)\n"
        "FINISHED = True\n")
    script = (
        "import signal, sys\n"
        "from qtool import launch\n"
        "signal.signal(signal.SIGINT, launch._on_ctrl_c)\n"
        "try:\n"
        "    import slowmod\n"
        "    import time; time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after import', slowmod.FINISHED)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "interrupted after import True", done.stderr


def test_an_import_failed_by_ctrl_c_is_an_interruption(monkeypatch):
    """onnxruntime reports a Ctrl-C during its initialisation as ImportError("initialization failed")
    raised from the KeyboardInterrupt: exit 130, not "a bug in qtool"."""
    def failing(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    monkeypatch.setattr("qtool.calibration.read_input", failing)
    monkeypatch.setattr(os, "_exit", lambda code: sys.exit(code))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # leave pytest's handlers alone
    with pytest.raises(SystemExit) as ended:
        qtool_main(["inspect", "whatever.json"])
    assert ended.value.code == 130


def test_the_console_script_starts_in_launch():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["qtool"] == "qtool.launch:main"


def test_quiet_and_verbose_after_the_command(work):
    """-q/-v after the command mean what they mean before it, for every command; the logger is as the caller had it
    once the command is over."""
    d, _ = work
    caller = logging.getLogger("qtool").level
    before = CliRunner().invoke(cli, ["-v", "calibrate", str(d / "y.onnx"), "--images", str(d / "imgs"), "--limit", "4",
                                      "--size", "64x96", "-o", str(d / "a.calib.json")])
    after = CliRunner().invoke(cli, ["calibrate", str(d / "y.onnx"), "--images", str(d / "imgs"), "--limit", "4",
                                     "--size", "64x96", "-o", str(d / "b.calib.json"), "-v"])
    assert before.exit_code == after.exit_code == 0, (before.output, after.output)
    assert "debug: calibrating" in before.stderr and "debug: calibrating" in after.stderr
    for flag in ("-q", "--quiet"):
        r = CliRunner().invoke(cli, ["calibrate", str(d / "y.onnx"), "--images", str(d / "imgs"), "--limit", "4",
                                     "--size", "64x96", "-o", str(d / "c.calib.json"), flag])
        assert r.exit_code == 0 and r.stderr == "" and "calibrated" in r.stdout, r.output
        assert logging.getLogger("qtool").level == caller
        r = CliRunner().invoke(cli, ["inspect", str(d / "c.calib.json"), flag])
        assert r.exit_code == 0 and r.stderr == "" and logging.getLogger("qtool").level == caller, r.output
    plain = CliRunner().invoke(cli, ["calibrate", str(d / "y.onnx"), "--images", str(d / "imgs"), "--limit", "4",
                                     "--size", "64x96", "-o", str(d / "d.calib.json")])
    assert plain.exit_code == 0 and "calibrated" in plain.stdout and "debug:" not in plain.stderr
    assert logging.getLogger("qtool").level == caller
    for command in cli.list_commands(None):
        names = {o for p in cli.get_command(None, command).params for o in p.opts}
        assert {"-q", "--quiet", "-v", "--verbose"} <= names, command


def _failing_model(path: Path) -> None:
    """Runs at 8x8, fails in onnxruntime at any other size (a Reshape to a fixed shape)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 192])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])],
                              "g", [x], [y], [shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


def test_onnxruntime_prints_nothing(work):
    """A normal calibrate + export run: stderr holds qtool's lines only."""
    d, tmp = work
    r = subprocess.run([sys.executable, "-m", "qtool", "calibrate", "y.onnx", "--images", "imgs", "--limit", "8",
                        "--size", "64x96", "-o", "y.calib.json"], cwd=d, env=_env(tmp), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    for target in ("tensorrt", "openvino"):
        r = subprocess.run([sys.executable, "-m", "qtool", "export", "y.onnx", "--calib", "y.calib.json", "--target", target,
                            "-o", f"y.{target}.onnx"], cwd=d, env=_env(tmp), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and all(line.startswith(("warning: ", "info: ")) for line in r.stderr.splitlines()), r.stderr


def test_a_run_onnxruntime_fails_is_one_line(work):
    """onnxruntime logs a failed run in colour before raising it: qtool's one line only."""
    d, tmp = work
    _failing_model(d / "f.onnx")
    r = subprocess.run([sys.executable, "-m", "qtool", "calibrate", "f.onnx", "--images", "imgs", "--limit", "2",
                        "--size", "16x16", "-o", "f.calib.json"], cwd=d, env=_env(tmp), capture_output=True, text=True, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "\x1b[" not in r.stderr and not (d / "f.calib.json").exists()
