"""Helper processes (qtool.collection.procs): a large calibration takes its images in this process and in
helpers, with the same file as one process, whichever process meets an unreadable image."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from click.testing import CliRunner
from PIL import Image

from qtool.cli import cli
from qtool.collection import pipeline, procs

N = 12


@pytest.fixture
def setup(tmp_path) -> tuple[Path, Path]:
    """The YOLO-like exporter graph (decode grids counted per image, Concat and Add/Mul outputs
    computed, blocked layouts) and noise pictures of varying sizes."""
    model = tmp_path / "yolo.onnx"
    onnx.save(zoo.yolo_like(), model)
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(N):
        Image.fromarray(rng.integers(0, 256, (40 + 4 * i, 60 - 2 * i, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")
    return model, folder


def _calibrate(monkeypatch, model: Path, folder: Path, out: Path, helpers: bool, *extra, workers: int = 2, kernel: bool = True):
    """`qtool calibrate` in this process, with helper processes for any size of run (`workers`
    workers: one helper, the others threads here) or with none; with helpers this process waits
    for the helper to take an image before taking its second, so that both take some; this
    process bins with the compiled kernel or (`kernel` False) with numpy. Returns (result,
    images each helper took)."""
    monkeypatch.setattr(pipeline, "KERNEL_BYTES", 0 if kernel else 1 << 60)
    monkeypatch.setattr(pipeline, "_kernel_fits", lambda plain: True)  # whatever its memory beside this small model's
    monkeypatch.setattr(pipeline, "HELPER_BYTES", 0 if helpers else 1 << 60)
    monkeypatch.setattr(pipeline, "MAX_HELPERS", 1)
    monkeypatch.setattr(pipeline, "_parallelism", lambda batches, size: (workers, 1))
    took: list[int] = []
    started = threading.Event()
    take, finish = procs.Claims.take, procs.Helper.finish

    def waiting_take(self, who=None):
        if who is None and self.next > 0:
            started.wait(60)
        got = take(self, who)
        if who is not None:
            started.set()
        return got

    def counting_finish(self):
        took.append(self.claims.taken.get(self, 0))
        return finish(self)

    monkeypatch.setattr(procs.Claims, "take", waiting_take)
    monkeypatch.setattr(procs.Helper, "finish", counting_finish)
    result = CliRunner().invoke(cli, ["-q", "calibrate", str(model), "--images", str(folder), "--size", "64x96",
                                      "-o", str(out), "--json", *extra])
    return result, took


@pytest.mark.parametrize("workers", [2, 3])
def test_a_helper_process_gives_the_same_file(setup, tmp_path, monkeypatch, workers):
    """With this process's one worker, or two worker threads, beside the helper."""
    model, folder = setup
    files = {}
    for helpers in (False, True):
        out = tmp_path / f"{helpers}.calib.json"
        result, took = _calibrate(monkeypatch, model, folder, out, helpers, workers=workers)
        assert result.exit_code == 0, (result.output, result.exception)
        assert json.loads(result.stdout)["samples"] == N
        files[helpers] = json.loads(out.read_text())
        assert (0 < took[0] < N) if helpers else took == []
    assert files[True]["samples"] == N and files[True]["tensors"] == files[False]["tensors"]


def test_helpers_start_where_this_process_bins_with_numpy(setup, tmp_path, monkeypatch):
    """A calibration whose helper processes bin with their kernel while this process bins with numpy
    (KERNEL_BYTES, 2 GB, above HELPER_BYTES' runs) writes the file it writes with the kernel in both,
    and the helpers take images either way."""
    model, folder = setup
    files = {}
    for kernel in (True, False):
        out = tmp_path / f"{kernel}.calib.json"
        result, took = _calibrate(monkeypatch, model, folder, out, True, kernel=kernel)
        assert result.exit_code == 0, (result.output, result.exception)
        assert 0 < took[0] < N
        files[kernel] = json.loads(out.read_text())["tensors"]
    assert files[True] == files[False]


def test_unreadable_images_in_helpers(setup, tmp_path, monkeypatch):
    """Skipped where they are met, reported in input order as one process would; or the
    run stops with the image's one-line error."""
    model, folder = setup
    for name in ("03.png", "09.png", "10.png"):
        (folder / name).write_bytes(b"not an image")
    reports = {}
    for helpers in (False, True):
        out = tmp_path / f"{helpers}.calib.json"
        result, took = _calibrate(monkeypatch, model, folder, out, helpers, "--on-bad-image", "skip")
        assert result.exit_code == 0, (result.output, result.exception)
        reports[helpers] = json.loads(result.stdout)
        assert reports[helpers]["samples"] == N - 3
        reports[helpers]["tensors"] = json.loads(out.read_text())["tensors"]
    assert reports[True]["warnings"] == reports[False]["warnings"] and "03.png" in reports[True]["warnings"][0]
    assert reports[True]["tensors"] == reports[False]["tensors"]
    out = tmp_path / "fail.calib.json"
    result, _ = _calibrate(monkeypatch, model, folder, out, True)
    assert result.exit_code == 1 and "cannot read image" in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("command", [[sys.executable, "-c", "raise SystemExit(3)"], ["/nonexistent/python3"]])
def test_a_helper_that_cannot_start_leaves_the_run_to_this_process(setup, tmp_path, monkeypatch, capfd, command):
    """It ends at once, or there is no Python to start it (an embedded interpreter)."""
    model, folder = setup
    monkeypatch.setattr(procs.Helper, "COMMAND", command)
    monkeypatch.setattr(pipeline, "KERNEL_BYTES", 0)
    monkeypatch.setattr(pipeline, "HELPER_BYTES", 0)
    monkeypatch.setattr(pipeline, "_parallelism", lambda batches, size: (2, 1))
    out = tmp_path / "alone.calib.json"
    result = CliRunner().invoke(cli, ["-q", "calibrate", str(model), "--images", str(folder), "--size", "64x96", "-o", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert json.loads(out.read_text())["samples"] == N
    assert capfd.readouterr().err == ""  # nothing printed from the thread that served it


KILLED_HELPER = """
import os, pickle, signal, sys
from qtool.collection import procs
job = pickle.load(sys.stdin.buffer)
pickle.dump(("next", 0), sys.stdout.buffer); sys.stdout.buffer.flush()
pickle.load(sys.stdin.buffer)  # an input taken, then killed as the OOM killer does
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_helper_killed_by_the_oom_killer_is_one_line(setup, tmp_path, monkeypatch):
    """SIGKILL after taking an image: a one-line error saying what to do, exit 1, nothing written."""
    model, folder = setup
    monkeypatch.setattr(procs.Helper, "COMMAND", [sys.executable, "-c", KILLED_HELPER])
    out = tmp_path / "killed.calib.json"
    result, took = _calibrate(monkeypatch, model, folder, out, True)
    assert took == [1]
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: a calibration helper process was killed (SIGKILL, likely out of memory)")
    assert "nothing was written" in lines[0] and "--shard" in lines[0] and not out.exists()
