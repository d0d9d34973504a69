"""The threshold each target uses by default, chosen at export from the stored histograms."""

from __future__ import annotations

import json

import pytest
from runcli import invoke
from test_openvino import IMAGES, SAMPLE, ok

from qtool import calibration
from qtool.provenance import unstamped
from qtool.targets.cpu import CPU
from qtool.targets.tensorrt.rules import TENSORRT


@pytest.fixture(scope="module")
def calibs(tmp_path_factory):
    d = tmp_path_factory.mktemp("defaults")
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "--limit", "48", "-o", d / "free.calib.json",
              "--trt-table", d / "calibrate.cache"))
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "--limit", "48", "-o", d / "pinned.calib.json", "--method", "entropy"))
    return d


def export(calib, out, *args) -> dict:
    return json.loads(ok(invoke("export", "--calib", calib, "-o", out, "--json", *args)).stdout)


@pytest.mark.parametrize("target", [["--target", "openvino"], ["--target", "qdq"], ["--target", "tensorrt", "--trt-version", "10.3"]],
                         ids=["openvino", "qdq", "tensorrt-qdq"])
@pytest.mark.parametrize("method", ["mse", "percentile:99.9", "max"])
def test_export_method_equals_recompute_then_export(calibs, tmp_path, target, method):
    export(calibs / "free.calib.json", tmp_path / "a.onnx", *target, "--method", method)
    ok(invoke("-q", "recompute", calibs / "free.calib.json", "--method", method, "-o", tmp_path / "r.calib.json"))
    export(tmp_path / "r.calib.json", tmp_path / "b.onnx", *target)
    assert unstamped((tmp_path / "a.onnx").read_bytes()) == unstamped((tmp_path / "b.onnx").read_bytes())  # the writer's bytes (the provenance records the flags)


def test_unpinned_files_get_each_targets_default_and_pinned_files_keep_theirs(calibs, tmp_path):
    free, pinned = calibs / "free.calib.json", calibs / "pinned.calib.json"
    assert not calibration.load(free).pinned and calibration.load(pinned).pinned
    assert CPU.default_method == "auto" and TENSORRT.default_method == "mse"
    export(free, tmp_path / "default.onnx", "--target", "openvino")
    export(free, tmp_path / "auto.onnx", "--target", "openvino", "--method", "auto")
    assert unstamped((tmp_path / "default.onnx").read_bytes()) == unstamped((tmp_path / "auto.onnx").read_bytes())  # the writer's bytes (the provenance records the flags)
    export(pinned, tmp_path / "pinned.onnx", "--target", "openvino")
    export(free, tmp_path / "entropy.onnx", "--target", "openvino", "--method", "entropy")
    assert unstamped((tmp_path / "pinned.onnx").read_bytes()) == unstamped((tmp_path / "entropy.onnx").read_bytes())  # the writer's bytes (the provenance records the flags)
    assert (tmp_path / "pinned.onnx").read_bytes() != (tmp_path / "default.onnx").read_bytes()


def test_tensorrt_cache_is_nvidias_entropy_by_default(calibs, tmp_path):
    """Unchanged bit for bit: the cache calibrate writes, the exported one, pinned or not."""
    cache = (calibs / "calibrate.cache").read_bytes()
    export(calibs / "free.calib.json", tmp_path / "free.cache", "--target", "tensorrt", "--trt-version", "8.6.1")
    export(calibs / "pinned.calib.json", tmp_path / "pinned.cache", "--target", "tensorrt", "--trt-version", "8.6.1")
    assert (tmp_path / "free.cache").read_bytes() == cache == (tmp_path / "pinned.cache").read_bytes()
    export(calibs / "free.calib.json", tmp_path / "mse.cache", "--target", "tensorrt", "--trt-version", "8.6.1", "--method", "mse")
    assert (tmp_path / "mse.cache").read_bytes() != cache


def test_bad_export_method_is_one_line(calibs, tmp_path):
    r = invoke("export", "--target", "qdq", "--calib", calibs / "free.calib.json", "-o", tmp_path / "x.onnx", "--method", "entropee")
    assert r.exit_code == 1 and r.stderr.startswith("error: --method") and not (tmp_path / "x.onnx").exists()
