"""Never lose a user's file: an output that would overwrite an input is refused before any work,
a command writes all its outputs or none, and a rewrite follows symlinks and keeps the file's
mode; the model's SHA-256 covers its external data."""

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import zoo
from required import module
from runcli import invoke as run

from qtool import fileio, model
from qtool.calibration import load

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"


def _snapshot(d: Path) -> dict:
    return {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.fixture
def w(tmp_path, monkeypatch):
    """digits.onnx and 4 images; ext/external_conv.onnx (weights in ext/weights.bin) and 2 .npy
    files; a calibration file of each."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(SAMPLE, tmp_path / "digits.onnx")
    (tmp_path / "imgs").mkdir()
    for p in sorted(IMAGES.glob("*.png"))[:4]:
        shutil.copy(p, tmp_path / "imgs" / p.name)
    zoo.external_data_model(tmp_path / "ext")
    (tmp_path / "npy").mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        np.save(tmp_path / "npy" / f"{i}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    r = run("calibrate", "digits.onnx", "--images", "imgs", "-o", "d.calib.json")
    assert r.exit_code == 0, r.output
    r = run("calibrate", "ext/external_conv.onnx", "--data", "npy", "-o", "e.calib.json")
    assert r.exit_code == 0, r.output
    return tmp_path


def _refused(w: Path, *args, needle: str = "is an input file"):
    before = _snapshot(w)
    r = run(*args)
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
    assert _snapshot(w) == before  # the input intact, nothing written or left behind
    return lines[0]


def test_calibrate_onto_an_images_file_is_refused(w):
    line = _refused(w, "calibrate", "digits.onnx", "--images", "imgs", "-o", "imgs/digit_0000.png")
    assert "--images" in line and "digit_0000.png" in line


def test_calibrate_onto_a_data_file_is_refused(w):
    line = _refused(w, "calibrate", "ext/external_conv.onnx", "--data", "npy", "-o", "npy/0.npy")
    assert "--data" in line


def test_calibrate_onto_the_external_data_file_is_refused(w):
    line = _refused(w, "calibrate", "ext/external_conv.onnx", "--data", "npy", "-o", "ext/weights.bin")
    assert "external data" in line and "weights.bin" in line
    _refused(w, "calibrate", "ext/external_conv.onnx", "--data", "npy", "-o", "e.calib.json", "--trt-table", "ext/weights.bin")


def test_report_onto_the_calibrated_model_is_refused(w):
    module("matplotlib")
    line = _refused(w, "report", "d.calib.json", "-o", "digits.onnx")
    assert "calibrated model" in line


def test_merge_onto_the_calibrated_model_is_refused(w):
    _refused(w, "merge", "d.calib.json", "-o", "digits.onnx")
    _refused(w, "merge", "e.calib.json", "-o", "ext/weights.bin")


def test_export_onto_the_policy_file_is_refused(w):
    (w / "p.json").write_text(json.dumps({"rules": [{"op_type": "Conv", "bits": 8}]}))
    line = _refused(w, "export", "--target", "qdq", "--calib", "d.calib.json", "--policy", "p.json", "-o", "p.json")
    assert "--policy" in line


def test_export_onto_a_held_out_image_is_refused(w):
    _refused(w, "export", "--target", "qdq", "--calib", "d.calib.json", "--keep-fp32", "1", "--images", "imgs",
             "-o", "imgs/digit_0001.png")


def test_links_to_an_input_are_refused(w):
    """Identity, not names: a symlink or a hard link to an input is that input."""
    os.symlink("digits.onnx", w / "link.onnx")
    _refused(w, "calibrate", "digits.onnx", "--images", "imgs", "-o", "link.onnx")
    os.link(w / "imgs" / "digit_0002.png", w / "hard.png")
    _refused(w, "calibrate", "digits.onnx", "--images", "imgs", "-o", "hard.png")
    os.symlink("d.calib.json", w / "same.json")
    _refused(w, "calibrate", "digits.onnx", "--images", "imgs", "-o", "d.calib.json", "--trt-table", "same.json",
             needle="name the same file")


def test_a_failed_run_writes_nothing(w, monkeypatch):
    """calibrate -o ok.json --trt-table X: X failing leaves ok.json as it was (absent, or its old bytes)."""
    (w / "old.json").write_bytes(b"the user's old file")
    real_mkstemp, real_replace = fileio.tempfile.mkstemp, fileio.os.replace

    def disk_full(*a, **k):
        if k.get("suffix") == ".tmp" and k.get("prefix", "").startswith(".t.cache"):
            raise OSError(28, "No space left on device")
        return real_mkstemp(*a, **k)

    def replace_fails(src, dst):
        if str(dst).endswith("t.cache"):
            raise OSError(5, "Input/output error")
        return real_replace(src, dst)

    for name, target, fake in (("mkstemp", fileio.tempfile, disk_full), ("replace", fileio.os, replace_fails)):
        for out in ("new.json", "old.json"):
            before = _snapshot(w)
            with monkeypatch.context() as m:
                m.setattr(target, name, fake)
                r = run("calibrate", "digits.onnx", "--images", "imgs", "-o", out, "--trt-table", "t.cache")
            assert _snapshot(w) == before, (name, out)  # no new.json, old.json unchanged, no temporary files
            assert r.exit_code == 1 and "nothing was written" in r.output, r.output
    r = run("calibrate", "digits.onnx", "--images", "imgs", "-o", "new.json", "--trt-table", "/sys/t.cache")
    assert r.exit_code == 1 and not (w / "new.json").exists()


def test_a_rewrite_follows_symlinks_and_keeps_the_mode(w):
    (w / "real").mkdir()
    target = w / "real" / "r.calib.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    os.symlink("real/r.calib.json", w / "r.calib.json")
    r = run("calibrate", "digits.onnx", "--images", "imgs", "-o", "r.calib.json")
    assert r.exit_code == 0, r.output
    assert (w / "r.calib.json").is_symlink() and os.readlink(w / "r.calib.json") == "real/r.calib.json"
    assert load(target).samples == 4  # the target updated, not left stale
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    os.chmod(w / "d.calib.json", 0o640)
    r = run("recompute", "d.calib.json", "--method", "max")
    assert r.exit_code == 0, r.output
    assert stat.S_IMODE(os.stat(w / "d.calib.json").st_mode) == 0o640
    assert not [p for p in w.rglob(".*") if p.is_file()]  # no temporary files left


def test_the_model_hash_covers_external_data(w):
    onnx_only = hashlib.sha256((w / "ext" / "external_conv.onnx").read_bytes()).hexdigest()
    full = hashlib.sha256((w / "ext" / "external_conv.onnx").read_bytes() + (w / "ext" / "weights.bin").read_bytes()).hexdigest()
    assert load(w / "e.calib.json").model_sha256 == full != onnx_only
    # without external data the hash is the .onnx file's, as older calibration files record it
    assert model.load_model(w / "digits.onnx").sha256 == hashlib.sha256((w / "digits.onnx").read_bytes()).hexdigest()


def test_export_refuses_changed_external_weights(w):
    r = run("export", "--target", "tensorrt", "--calib", "e.calib.json", "-o", "e.cache")
    assert r.exit_code == 0, r.output
    weights = w / "ext" / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x40  # one weight changed, the .onnx file untouched
    weights.write_bytes(bytes(data))
    before = _snapshot(w)
    r = run("export", "--target", "tensorrt", "--calib", "e.calib.json", "-o", "e2.cache")
    assert r.exit_code == 1 and "has changed since 'e.calib.json' was made for it (SHA-256 " in r.output, r.output
    assert _snapshot(w) == before


def test_an_older_calibration_file_of_an_external_data_model_says_why(w):
    """Files from before the hash covered external data: one clear line, not a vague mismatch."""
    doc = json.loads((w / "e.calib.json").read_text())
    doc["model"]["sha256"] = hashlib.sha256((w / "ext" / "external_conv.onnx").read_bytes()).hexdigest()
    (w / "old.calib.json").write_text(json.dumps(doc))
    r = run("export", "--target", "tensorrt", "--calib", "old.calib.json", "-o", "e.cache")
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "older qtool" in r.output and "weights.bin" in r.output and "calibrate again" in r.output
    # an older file of a model without external data still verifies: its hash is unchanged
    r = run("export", "--target", "tensorrt", "--calib", "d.calib.json", "-o", "d.cache")
    assert r.exit_code == 0, r.output


def test_staged_files_of_a_killed_run_are_removed_by_the_next_write(w, monkeypatch):
    """kill -9 between staging and commit leaves `.NAME.qtool-PID-*.tmp` (or a `.bak` link) beside
    the target: the next write into that folder removes those of dead processes, no others."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [w / f".d.calib.json.qtool-{dead.pid}-abcd1234.tmp", w / f".x.json.qtool-{dead.pid}-0a1b2c3d4e5f.bak"]
    kept = [w / f".d.calib.json.qtool-{os.getppid()}-abcd1234.tmp",  # a running process's
            w / f".d.calib.json.{dead.pid}-abcd1234.tmp"]  # not qtool's name
    for p in stale + kept:
        p.write_bytes(b"half")
    monkeypatch.setattr(fileio, "_swept", set())  # the fixture's runs swept this folder already (once a process)
    r = run("calibrate", "digits.onnx", "--images", "imgs", "-o", "d.calib.json")
    assert r.exit_code == 0, r.output
    assert [p.exists() for p in stale + kept] == [False, False, True, True]
    assert not [p for p in w.iterdir() if ".qtool-" in p.name and p not in kept]
