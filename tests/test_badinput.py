"""Bad input, one case per test: exit code 1 (2 for command-line usage), one line that names
the problem, no traceback, and no file written or changed."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from click.testing import CliRunner
from onnx import TensorProto, helper

from qtool.cli import cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"


def _single_input_model(elem_type, path):
    x = helper.make_tensor_value_info("x", elem_type, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", elem_type, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A workspace of inputs, built once: w / name."""
    d = tmp_path_factory.mktemp("bad")
    (d / "imgs").mkdir()
    for p in sorted(IMAGES.glob("*.png"))[:8]:
        shutil.copy(p, d / "imgs" / p.name)
    shutil.copytree(d / "imgs", d / "broken")
    (d / "broken" / "digit_0004.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    (d / "empty").mkdir()
    (d / "textonly").mkdir()
    (d / "textonly" / "readme.txt").write_text("no images here")
    (d / "truncated.onnx").write_bytes(SAMPLE.read_bytes()[:2500])
    (d / "notes.onnx").write_text("this is not a model")
    (d / "noise.onnx").write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    _single_input_model(TensorProto.INT64, d / "int.onnx")
    onnx.save(zoo.two_input_model(), d / "two.onnx")
    onnx.save(zoo.int_input_model(), d / "mixed.onnx")
    onnx.save(zoo.custom_op_model(), d / "custom.onnx")
    onnx.save(zoo.yolo_like(), d / "yolo.onnx")
    onnx.save(zoo.control_flow_model(), d / "cf.onnx")
    (d / "npz").mkdir()
    np.savez(d / "npz" / "0.npz", image=np.zeros((1, 3, 8, 8), np.float32))
    (d / "npy").mkdir()
    np.save(d / "npy" / "0.npy", np.zeros((8, 8), np.float32))
    shutil.copy(SAMPLE, d / "digits.onnx")
    r = CliRunner().invoke(cli, ["calibrate", str(d / "digits.onnx"), "--images", str(d / "imgs"), "-o", str(d / "good.calib.json")])
    assert r.exit_code == 0, r.output
    good = json.loads((d / "good.calib.json").read_text())
    (d / "other").mkdir()
    json.dump({**good, "model": {**good["model"], "sha256": "0" * 64}}, open(d / "other" / "o.calib.json", "w"))
    json.dump({**good, "version": 99}, open(d / "future.calib.json", "w"))
    (d / "cut.calib.json").write_text((d / "good.calib.json").read_text()[:500])
    json.dump({**good, "tensors": {"x": {"min": 0}}}, open(d / "fields.calib.json", "w"))
    (d / "two").mkdir()
    for n in ("a", "b"):
        shutil.copy(d / "good.calib.json", d / "two" / f"{n}.calib.json")
    r = CliRunner().invoke(cli, ["calibrate", str(d / "digits.onnx"), "--images", str(d / "imgs"), "--method", "max", "-o", str(d / "max.calib.json")])
    assert r.exit_code == 0, r.output
    return d


# (arguments with {w} for the workspace, expected exit code, text the message must contain)
CASES = {
    "missing model": ("calibrate {w}/nope.onnx --images {w}/imgs", 1, "does not exist"),
    "model is a folder": ("calibrate {w}/imgs --images {w}/imgs", 1, "not a file"),
    "truncated model": ("calibrate {w}/truncated.onnx --images {w}/imgs", 1, "not a readable ONNX model"),
    "text file as model": ("calibrate {w}/notes.onnx --images {w}/imgs", 1, "ONNX"),
    "random bytes as model": ("calibrate {w}/noise.onnx --images {w}/imgs", 1, "ONNX"),
    "no float input": ("calibrate {w}/int.onnx --images {w}/imgs", 1, "not a float tensor"),
    "two inputs with images": ("calibrate {w}/two.onnx --images {w}/imgs", 1, "2 inputs"),
    "unknown operator": ("calibrate {w}/custom.onnx --data {w}/npy", 1, "MyUnknownOp"),
    "missing image folder": ("calibrate {w}/digits.onnx --images {w}/none", 1, "does not exist"),
    "empty image folder": ("calibrate {w}/digits.onnx --images {w}/empty", 1, "no images"),
    "folder without images": ("calibrate {w}/digits.onnx --images {w}/textonly", 1, "no images"),
    "corrupt image in the middle": ("calibrate {w}/digits.onnx --images {w}/broken", 1, "digit_0004.png"),
    "mean for 3 channels on grey": ("calibrate {w}/digits.onnx --images {w}/imgs --mean 1,2,3", 1, "1 channels"),
    "mean 1,2 for 3 channels": ("calibrate {w}/yolo.onnx --images {w}/imgs --size 32x32 --mean 1,2", 1, "3 channels"),
    "size 0x0": ("calibrate {w}/yolo.onnx --images {w}/imgs --size 0x0", 1, "positive"),
    "size not HxW": ("calibrate {w}/yolo.onnx --images {w}/imgs --size big", 1, "HxW"),
    "dynamic size without --size": ("calibrate {w}/yolo.onnx --images {w}/imgs", 1, "--size"),
    "std zero": ("calibrate {w}/digits.onnx --images {w}/imgs --std 0", 1, "zero"),
    "scale 1/0": ("calibrate {w}/digits.onnx --images {w}/imgs --scale 1/0", 1, "--scale"),
    "bins not a power of two": ("calibrate {w}/digits.onnx --images {w}/imgs --bins 1000", 1, "power of two"),
    "unknown method": ("calibrate {w}/digits.onnx --images {w}/imgs --method kl", 1, "--method"),
    "bad TensorRT version": ("calibrate {w}/digits.onnx --images {w}/imgs --trt-table {w}/t.cache --trt-version x", 1, "--trt-version"),
    "npz missing an input": ("calibrate {w}/mixed.onnx --data {w}/npz", 1, "scale_id"),
    "npy of the wrong rank": ("calibrate {w}/cf.onnx --data {w}/npy", 1, "rank 4"),
    "images and data together": ("calibrate {w}/digits.onnx --images {w}/imgs --data {w}/npy", 1, "exactly one"),
    "shard out of range": ("calibrate {w}/digits.onnx --images {w}/imgs --shard 5/4", 1, "K <= N"),
    "output folder missing": ("calibrate {w}/digits.onnx --images {w}/imgs -o {w}/no/x.calib.json", 1, "does not exist"),
    "output folder unwritable": ("calibrate {w}/digits.onnx --images {w}/imgs -o /sys/x.calib.json", 1, "not writable"),
    "output is the input model": ("calibrate {w}/digits.onnx --images {w}/imgs -o {w}/digits.onnx", 1, "input file"),
    "output is a calibration image": ("calibrate {w}/digits.onnx --images {w}/imgs -o {w}/imgs/digit_0000.png", 1, "--images"),
    "cache is the other output": ("calibrate {w}/digits.onnx --images {w}/imgs -o {w}/c.json --trt-table {w}/c.json", 1, "same file"),
    "merge output is the model": ("merge {w}/good.calib.json -o {w}/digits.onnx", 1, "input file"),
    "recompute output is the model": ("recompute {w}/good.calib.json -o {w}/digits.onnx", 1, "input file"),
    "calibration of another model": ("export {w}/digits.onnx --target tensorrt --calib {w}/other/o.calib.json -o {w}/x.cache", 1, "SHA-256"),
    "calibration format from the future": ("export --target tensorrt --calib {w}/future.calib.json -o {w}/x.cache", 1, "version 99"),
    "truncated calibration file": ("export --target tensorrt --calib {w}/cut.calib.json -o {w}/x.cache", 1, "not a readable calibration file"),
    "calibration with missing fields": ("export --target tensorrt --calib {w}/fields.calib.json -o {w}/x.cache", 1, "damaged"),
    "calibration file missing": ("export --target tensorrt --calib {w}/none.calib.json -o {w}/x.cache", 1, "does not exist"),
    "export output is the model": ("export --target tensorrt --calib {w}/good.calib.json -o {w}/digits.onnx", 1, "input file"),
    "mistyped target": ("export --target tensorrtt --calib {w}/good.calib.json", 2, "did you mean 'tensorrt'"),
    "merge of different methods": ("merge {w}/good.calib.json {w}/max.calib.json -o {w}/m.calib.json", 1, "method"),
    "limit zero": ("calibrate {w}/digits.onnx --images {w}/imgs --limit 0", 2, "--limit"),
}


def _snapshot(d: Path) -> dict:
    return {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input(case, w, monkeypatch):
    args, code, needle = CASES[case]
    monkeypatch.chdir(w)
    before = _snapshot(w)
    r = CliRunner().invoke(cli, args.format(w=w).split())
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    if code == 1:
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert needle in r.output, r.output
    assert _snapshot(w) == before  # nothing written, changed or left behind


def test_export_without_calibration_file_here(tmp_path, monkeypatch, w):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["export", "--target", "tensorrt"])
    assert r.exit_code == 1 and "no *.calib.json" in r.output
    monkeypatch.chdir(w / "two")
    r = CliRunner().invoke(cli, ["export", "--target", "tensorrt"])
    assert r.exit_code == 1 and "a.calib.json" in r.output and "b.calib.json" in r.output
