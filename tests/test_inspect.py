"""`qtool inspect` and `qtool export --target tensorrt` end to end: calibrate a model with
reshape/concat/transpose chains from generated images, export every format, check coverage."""

import json
import shutil

import numpy as np
import onnx
import pytest
from PIL import Image
from runcli import invoke as run
from test_tensorrt import chain_model

from qtool.calibration import load
from qtool.targets.tensorrt.files import hex_amax, read_cache, read_dynamic_range, read_ort_table

FORMATS = {"cache": ".cache", "dynamic-range": ".dynamic_range.txt", "ort-trt": ".calibration.flatbuffers"}


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """chains.onnx calibrated on 6 generated 8x8 images, and its exports in every format."""
    d = tmp_path_factory.mktemp("chains")
    model = d / "chains.onnx"
    onnx.save(chain_model(), model)
    images = d / "images"
    images.mkdir()
    rng = np.random.default_rng(3)
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(images / f"{i}.png")
    cal = d / "chains.calib.json"
    r = run("calibrate", model, "--images", images, "-o", cal, "--mean", "0.5")
    assert r.exit_code == 0, r.output
    outputs = {}
    for fmt in FORMATS:
        out = d / f"out{FORMATS[fmt]}"
        r = run("export", "--target", "tensorrt", "--calib", cal, "--format", fmt, "-o", out, "--trt-version", "10.3.0")
        assert r.exit_code == 0, r.output
        outputs[fmt] = out
    return {"dir": d, "model": model, "calibration": cal, **outputs}


def one_error_line(r):
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1, r.output
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("which", ["calibration", *FORMATS])
def test_full_coverage_after_end_to_end_calibration(calibrated, which):
    r = run("inspect", calibrated[which], "--model", calibrated["model"])
    assert r.exit_code == 0, r.output
    assert "21/21 activation tensors (100 %)" in r.stdout and "0 missing" in r.stdout
    r = run("inspect", calibrated[which], "--model", calibrated["model"], "--json")
    cov = json.loads(r.stdout)["coverage"]
    assert (cov["percent"], cov["missing"], cov["extra"], cov["nonfinite"]) == (100.0, [], [], [])


def test_every_format_carries_the_same_ranges(calibrated):
    _, cache = read_cache(calibrated["cache"].read_text())
    ranges = read_dynamic_range(calibrated["dynamic-range"].read_text())
    table = read_ort_table(calibrated["ort-trt"].read_bytes())
    assert set(cache) == set(ranges) == set(table)
    assert not {"lin_shape_f", "lin_shape_same", "lin_sizes"} & set(cache)  # shape tensors never appear
    for name, amax in ranges.items():
        assert table[name] == amax
        assert cache[name] == pytest.approx(amax, rel=2.5e-7)
    cal = {t.name: t for t in load(calibrated["calibration"]).tensors}
    for name in ("relu", "flat", "flat_t", "nhwc", "nchw"):  # one chain, same values: the same range
        assert ranges[name] == ranges["relu"]
        assert cal[name].counts == cal["relu"].counts


def test_calibration_table_is_sorted_with_every_column(calibrated):
    r = run("inspect", calibrated["calibration"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert "qtool calibration file, 21 tensors" in lines[0] and "entropy (nvidia)" in lines[0]
    assert lines[1].split() == ["name", "min", "max", "amax", "unsigned", "method"]
    names = [line.split()[0] for line in lines[2:]]
    assert names == sorted(names) and len(names) == 21
    doc = json.loads(run("inspect", calibrated["calibration"], "--json").stdout)
    assert doc["kind"] == "calibration" and [t["name"] for t in doc["tensors"]] == names
    by_name = {t.name: t for t in load(calibrated["calibration"]).tensors}
    for t in doc["tensors"]:
        rec = by_name[t["name"]]
        assert (t["min"], t["max"], t["amax"], t["unsigned"]) == (rec.min, rec.max, rec.amax, rec.unsigned)
        assert t["method"] == "entropy (nvidia)"
    relu = next(line for line in lines if line.startswith("relu "))
    assert relu.split()[4] == "yes"


def test_cache_header_and_entries_are_decoded(calibrated):
    r = run("inspect", calibrated["cache"])
    assert r.exit_code == 0, r.output
    assert "header TRT-100300-EntropyCalibration2: TensorRT 10.3.0, EntropyCalibration2" in r.stdout
    doc = json.loads(run("inspect", calibrated["cache"], "--json").stdout)
    assert doc["kind"] == "tensorrt-cache"
    assert doc["header"] == {"line": "TRT-100300-EntropyCalibration2", "version": 100300, "tensorrt": "10.3.0", "algorithm": "EntropyCalibration2"}
    for t in doc["tensors"]:
        assert t["amax"] == hex_amax(t["hex"]) and t["scale"] == pytest.approx(t["amax"] / 127, rel=1e-6)
    assert [t["name"] for t in doc["tensors"]] == sorted(t["name"] for t in doc["tensors"])


@pytest.mark.parametrize("header,shown", [("TRT-8601-EntropyCalibration2", "TensorRT 8.6.1"), ("TRT-8205-MinMaxCalibration", "TensorRT 8.2.5")])
def test_other_headers(tmp_path, header, shown):
    f = tmp_path / "c.cache"
    f.write_text(f"{header}\nimages: 3caa54fc\n")
    r = run("inspect", f)
    assert r.exit_code == 0 and shown in r.stdout and "3caa54fc" in r.stdout and "2.64064" in r.stdout


def test_kind_is_told_by_content_not_extension(calibrated, tmp_path):
    for src, name, kind in ((calibrated["cache"], "looks.json", "tensorrt-cache"), (calibrated["calibration"], "looks.cache", "calibration"),
                            (calibrated["ort-trt"], "looks.txt", "ort-trt"), (calibrated["dynamic-range"], "looks.flatbuffers", "dynamic-range")):
        shutil.copy(src, tmp_path / name)
        r = run("inspect", tmp_path / name, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["kind"] == kind


def test_missing_and_broken_entries_fail_coverage(calibrated, tmp_path):
    lines = calibrated["cache"].read_text().splitlines()
    relu = next(i for i, line in enumerate(lines) if line.startswith("relu: "))
    conv = next(i for i, line in enumerate(lines) if line.startswith("conv: "))
    up = next(i for i, line in enumerate(lines) if line.startswith("up: "))
    lines[conv] = "conv: 7fc00000"  # NaN scale
    lines[up] = "up: 00000000"  # zero scale
    del lines[relu]
    lines.append("/not/in/the/model: 3caa54fc")
    f = tmp_path / "broken.cache"
    f.write_text("\n".join(lines) + "\n")
    r = run("inspect", f, "--model", calibrated["model"])
    one_error_line(r)
    assert "18/21 activation tensors" in r.stdout
    assert "missing: relu" in r.stdout and "non-finite: conv" in r.stdout and "zero or negative: up" in r.stdout
    assert "extra: /not/in/the/model" in r.stdout
    doc = json.loads(run("inspect", f, "--model", calibrated["model"], "--json").stdout)
    assert doc["coverage"]["missing"] == ["relu"] and doc["coverage"]["nonfinite"] == ["conv"]
    conv_entry = next(t for t in doc["tensors"] if t["name"] == "conv")
    assert conv_entry["amax"] is None and conv_entry["hex"] == "7fc00000"  # JSON has no NaN
    # an extra entry alone does not fail
    g = tmp_path / "extra.cache"
    g.write_text(calibrated["cache"].read_text() + "/not/in/the/model: 3caa54fc\n")
    r = run("inspect", g, "--model", calibrated["model"])
    assert r.exit_code == 0 and "extra: /not/in/the/model" in r.stdout


@pytest.mark.parametrize("content", [
    None,  # does not exist
    b"",
    b"   \n",
    b"hello world\n",
    b'{"format": "something.else"}',
    b"{not json",
    b"TRT-8601-EntropyCalibration2\nrelu 3caa54fc\n",
    b"TRT-8601-EntropyCalibration2\nrelu:3caa54fc\n",
    b"relu:1.0\n\nconv:2.0\n",
    b"relu:one\n",
    b"\x00\x01\x02\x03" * 8,
    b"\xff\xfe\xfd" * 50,
    "model",  # an ONNX model given as FILE
    "truncated-table",
], ids=["missing", "empty", "blank", "text", "other-json", "bad-json", "cache-no-colon", "cache-no-space",
        "dynamic-range-blank-line", "dynamic-range-word", "zeros", "binary", "onnx", "truncated-table"])
def test_bad_files_fail_in_one_line(calibrated, tmp_path, content):
    f = tmp_path / "input.bin"
    if content == "model":
        f = calibrated["model"]
    elif content == "truncated-table":
        f.write_bytes(calibrated["ort-trt"].read_bytes()[:-9])
    elif content is not None:
        f.write_bytes(content)
    one_error_line(run("inspect", f))
    assert all(p.name == "input.bin" for p in tmp_path.iterdir())  # nothing written


def test_directory_and_bad_model_fail_in_one_line(calibrated, tmp_path):
    one_error_line(run("inspect", tmp_path))
    one_error_line(run("inspect", calibrated["cache"], "--model", tmp_path / "nope.onnx"))
    one_error_line(run("inspect", calibrated["cache"], "--model", calibrated["cache"]))


@pytest.mark.parametrize("args", [
    ["--trt-version", "6.0.1"],
    ["--trt-version", "11.4", "--format", "cache"],
    ["--trt-version", "8.10.0", "--format", "dynamic-range"],
    ["--calib", "{d}/nope.calib.json"],
])
def test_export_bad_requests_fail_in_one_line_without_output(calibrated, tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    shutil.copy(calibrated["calibration"], tmp_path / "chains.calib.json")
    shutil.copy(calibrated["model"], tmp_path / "chains.onnx")
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run("export", "--target", "tensorrt", *[a.format(d=tmp_path) for a in args])
    one_error_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_export_unknown_format_is_a_usage_error(calibrated, tmp_path):
    r = run("export", "--target", "tensorrt", "--calib", calibrated["calibration"], "--format", "bogus", "-o", tmp_path / "x.out")
    assert r.exit_code == 2 and "'qdq', 'cache', 'dynamic-range', 'ort-trt'" in r.stderr and not (tmp_path / "x.out").exists()


def test_default_output_names_per_format(calibrated, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(calibrated["calibration"], tmp_path / "chains.calib.json")
    shutil.copy(calibrated["model"], tmp_path / "chains.onnx")
    for fmt, suffix in FORMATS.items():
        r = run("export", "--target", "tensorrt", "--format", fmt, "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["outputs"]["tensorrt"] == f"chains{suffix}" and (tmp_path / f"chains{suffix}").is_file()
        assert doc["format"] == fmt and doc["coverage"]["missing"] == 0 and doc["entries"] == 21
    assert len((tmp_path / "chains.dynamic_range.txt").read_text().splitlines()) == 21


def test_onnx_model_without_trt_version_points_to_it(calibrated):
    r = run("inspect", calibrated["model"])
    one_error_line(r)
    assert "--trt-version" in r.stderr


def test_a_file_qtool_exported_is_checked_for_the_tensorrt_it_records(calibrated, tmp_path):
    """No --trt-version needed for a Q/DQ file qtool wrote: its provenance records the TensorRT it was made for."""
    out = tmp_path / "chains.trt.onnx"
    r = run("export", "--target", "tensorrt", "--calib", calibrated["calibration"], "-o", out, "--trt-version", "10.3.0", "--include", "Conv_conv")
    assert r.exit_code == 0, r.output
    r = run("inspect", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "onnx" and doc["trt_version"] == "10.3.0" and doc["violations"] == [] and doc["qdq_nodes"] > 0


def test_trt_version_checks_the_onnx_model(calibrated):
    r = run("inspect", calibrated["model"], "--trt-version", "11.4", "--json")
    assert r.exit_code == 1  # a float model: no Q/DQ node, and TensorRT 11 has no other INT8 path
    doc = json.loads(r.stdout)
    assert doc["kind"] == "onnx" and [v["rule"] for v in doc["violations"]] == ["no-qdq"] and doc["qdq_nodes"] == 0


@pytest.mark.parametrize("which,args,code", [
    ("cache", ["--trt-version", "10.3"], 2),  # not an ONNX model: usage error
    ("calibration", ["--trt-version", "10.3"], 2),
    ("text", ["--trt-version", "10.3"], 2),
    ("directory", ["--trt-version", "10.3"], 1),
    ("model", ["--trt-version", "10.3", "--model", "{model}"], 2),
    ("model", ["--trt-version", "7.2"], 1),
    ("model", ["--trt-version", "ten"], 1),
    ("missing", ["--trt-version", "10.3"], 1),
])
def test_trt_version_bad_requests(calibrated, tmp_path, which, args, code):
    f = {"missing": tmp_path / "nope.onnx", "directory": tmp_path, "text": tmp_path / "notes.txt"}.get(which) or calibrated[which]
    (tmp_path / "notes.txt").write_text("hello\n")
    r = run("inspect", f, *[a.format(model=calibrated["model"]) for a in args])
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    if code == 1:
        one_error_line(r)
