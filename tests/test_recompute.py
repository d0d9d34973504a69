"""`qtool recompute`: thresholds from the stored histograms, in place or to -o, and bad input."""

import json

import numpy as np
import pytest
from runcli import invoke as run

from qtool import calibration
from qtool.statistics import thresholds
from qtool.statistics.histogram import TensorHistogram


def _calibration(n_tensors=12, bins=2048, seed=0, method="entropy"):
    """A calibration as `qtool calibrate` writes it, from synthetic activations (no model run)."""
    rng = np.random.default_rng(seed)
    records = []
    for k in range(n_tensors):
        hist = TensorHistogram(bins)
        x = rng.laplace(0, rng.uniform(0.1, 5), 5000).astype(np.float32)
        if k % 3 == 0:
            x = np.maximum(x, 0)  # unsigned: searched with 256 levels
        if k == n_tensors - 1:
            x = np.zeros(100, np.float32)  # an all-zero tensor
        hist.update(x)
        records.append(calibration.record_from_histogram(f"t{k}", hist, method))
    return calibration.Calibration(
        model_path="model.onnx", model_sha256="0" * 64, method=method, num_bits=8, bins=bins, samples=3,
        preprocess={"input": "x"}, tensors=records,
    )


@pytest.fixture
def calib_file(tmp_path):
    path = tmp_path / "m.calib.json"
    calibration.save(_calibration(), path)
    return path


def _expected(cal, method, variant="nvidia"):
    return [
        thresholds.amax_for(method, np.array(t.counts), t.edges(), absmax=t.absmax, unsigned=t.unsigned, kl_variant=variant)
        for t in cal.tensors
    ]


@pytest.mark.parametrize(
    "args, method, variant",
    [(["--method", "entropy", "--kl-variant", "ncnn"], "entropy", "ncnn"), (["--method", "entropy", "--kl-variant", "ppq"], "entropy", "ppq"),
     (["--method", "mse"], "mse", "nvidia"), (["--method", "Percentile:99.9"], "percentile:99.9", "nvidia"), (["--method", "max"], "max", "nvidia")],
)
def test_rewrites_the_file_in_place(calib_file, args, method, variant):
    before = calibration.load(calib_file)
    r = run("recompute", calib_file, *args)
    assert r.exit_code == 0, r.output
    assert "recomputed 12 thresholds" in r.output and str(calib_file) in r.output
    after = calibration.load(calib_file)
    assert (after.method, after.kl_variant) == (method, variant)
    assert [t.amax for t in after.tensors] == _expected(before, method, variant)
    assert after.tensors[-1].amax == 0.0
    for a, b in zip(before.tensors, after.tensors):  # only the thresholds change
        assert (a.name, a.min, a.max, a.counts, a.hist_range, a.nonfinite) == (b.name, b.min, b.max, b.counts, b.hist_range, b.nonfinite)
    assert (after.model_path, after.model_sha256, after.samples, after.preprocess) == (before.model_path, before.model_sha256, before.samples, before.preprocess)
    assert not [p for p in calib_file.parent.iterdir() if p.name.endswith(".tmp")]


def test_round_trip_gives_the_same_bytes(calib_file):
    original = calib_file.read_bytes()
    assert b"method_pinned" not in original  # calibrated without --method: each export picks its target's method
    assert run("recompute", calib_file, "--method", "entropy", "--kl-variant", "nvidia").exit_code == 0
    pinned = calib_file.read_bytes()
    assert pinned == original.replace(b' "preprocess"', b' "method_pinned": true,\n "preprocess"', 1)
    assert run("recompute", calib_file, "--method", "mse").exit_code == 0
    assert calib_file.read_bytes() != pinned
    assert run("recompute", calib_file, "--method", "entropy", "--kl-variant", "nvidia").exit_code == 0
    assert calib_file.read_bytes() == pinned


def test_output_elsewhere_leaves_the_input_alone(calib_file, tmp_path):
    original = calib_file.read_bytes()
    out = tmp_path / "other.calib.json"
    r = run("recompute", calib_file, "--method", "percentile:99.99", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["command"] == "recompute" and summary["outputs"] == {"calibration": str(out)}
    assert (summary["tensors"], summary["method"], summary["kl_variant"]) == (12, "percentile:99.99", "nvidia")
    assert summary["changed"] == 11  # all but the all-zero tensor
    assert summary["warnings"] and "amax 0" in summary["warnings"][0]
    assert calib_file.read_bytes() == original
    assert calibration.load(out).method == "percentile:99.99"


def test_defaults_to_the_recorded_method_and_variant(tmp_path):
    path = tmp_path / "m.calib.json"
    cal = _calibration(n_tensors=4)
    cal.kl_variant = "ncnn"
    for t in cal.tensors:
        t.amax = 1.0  # e.g. written by an older qtool
    calibration.save(cal, path)
    r = run("recompute", path)
    assert r.exit_code == 0, r.output
    assert "(entropy/ncnn; 4 changed)" in r.output
    assert [t.amax for t in calibration.load(path).tensors] == _expected(cal, "entropy", "ncnn")


@pytest.mark.parametrize(
    "args, message",
    [(["--method", "entropyy"], "--method: unknown method 'entropyy'"), (["--method", "percentile:101"], "> 0 and <= 100"),
     (["--method", "mse", "--kl-variant", "ncnn"], "--kl-variant chooses whose entropy search"),
     (["-o", "missing-dir/x.calib.json"], "does not exist"), (["-o", "model.onnx"], "is an input file")],
)
def test_user_errors_are_one_line_and_write_nothing(calib_file, monkeypatch, args, message):
    monkeypatch.chdir(calib_file.parent)
    (calib_file.parent / "model.onnx").write_bytes(b"not really a model")
    original = calib_file.read_bytes()
    r = run("recompute", calib_file.name, *args)
    assert r.exit_code == 1, r.output
    assert r.output.startswith("error: ") and message in r.output and r.output.count("\n") == 1
    assert calib_file.read_bytes() == original


def test_bad_files(tmp_path):
    r = run("recompute", tmp_path / "nope.calib.json")
    assert r.exit_code == 1 and "does not exist" in r.output
    bad = tmp_path / "bad.calib.json"
    bad.write_text("{}")
    r = run("recompute", bad)
    assert r.exit_code == 1 and "not a qtool calibration file" in r.output
    odd = tmp_path / "odd.calib.json"
    cal = _calibration(n_tensors=2)
    cal.method = "kl-magic"
    calibration.save(cal, odd)
    r = run("recompute", odd, "--method", "max")
    assert r.exit_code == 1 and "unknown method 'kl-magic'" in r.output and r.output.count("\n") == 1


def test_kl_variant_needs_the_entropy_method(calib_file):
    assert run("recompute", calib_file, "--method", "max").exit_code == 0
    r = run("recompute", calib_file, "--kl-variant", "ppq")
    assert r.exit_code == 1 and "uses max (add --method entropy)" in r.output
    assert run("recompute", calib_file, "--kl-variant", "ppq", "--method", "entropy").exit_code == 0
    assert calibration.load(calib_file).kl_variant == "ppq"


def test_unknown_kl_variant_is_a_usage_error(calib_file):
    r = run("recompute", calib_file, "--kl-variant", "mxnet")
    assert r.exit_code == 2 and "mxnet" in r.output


def test_help_lists_the_methods():
    r = run("recompute", "--help")
    assert r.exit_code == 0
    assert "percentile:P" in r.output and "ncnn" in r.output and "in place" in r.output
