"""Exports that carry their provenance (qtool.provenance), and `qtool evaluate FILE` reading it:
on the file qtool export writes, the numbers of `qtool evaluate MODEL --calib --target` exactly;
the rest of the file is the writer's, byte for byte; a missing or mismatched FP32 model, a
quantized file without provenance and a file that is not ONNX: one error line, exit 1."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from runcli import invoke
from test_openvino import HELDOUT, IMAGES, SAMPLE, ok

from qtool import api, calibration, provenance
from qtool.model import load_model
from qtool.targets import exporter, options_for

TARGETS = {  # name: (export flags, the matching evaluate flags of the MODEL path)
    "openvino": (["--target", "openvino"], ["--target", "openvino"]),
    "qdq": (["--target", "qdq"], ["--target", "qdq"]),
    "tensorrt": (["--target", "tensorrt", "--trt-version", "10.3"], ["--target", "tensorrt", "--trt-version", "10.3"]),
    "tensorrt-fp8": (["--target", "tensorrt", "--trt-version", "10.3", "--precision", "fp8"],
                     ["--target", "tensorrt", "--trt-version", "10.3", "--precision", "fp8"]),
}


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A calibration of the sample model on calib_images, every target's export of it, and the held-out set as .npy files."""
    d = tmp_path_factory.mktemp("prov")
    shutil.copy(SAMPLE, d / "digits_cnn.onnx")
    ok(invoke("-q", "calibrate", d / "digits_cnn.onnx", "--images", IMAGES, "--limit", 64, "-o", d / "cal.calib.json"))
    for name, (flags, _) in TARGETS.items():
        ok(invoke("-q", "export", "--calib", d / "cal.calib.json", "-o", d / f"{name}.onnx", *flags))
    (d / "held").mkdir()
    for i, x in enumerate(np.load(HELDOUT)["x"][:60]):
        np.save(d / "held" / f"{i:03d}.npy", x)
    return d


def _numbers(outcome) -> list[tuple]:
    """Per output: name, SQNR, cosine, top-1 agreement, samples (floats as computed, not rounded)."""
    ev = outcome.evaluation
    rt = [] if ev.runtime is None else [(o.name, o.sqnr_db, o.cosine, o.top1_agreement) for o in ev.runtime.outputs]
    return [(o.name, o.sqnr_db, o.cosine, o.top1_agreement, o.samples) for o in ev.outputs], rt


@pytest.mark.parametrize("name", list(TARGETS))
def test_evaluating_the_exported_file_gives_the_numbers_of_model_and_calibration(w, name, monkeypatch):
    monkeypatch.chdir(w)
    _, flags = TARGETS[name]
    keywords = {k.lstrip("-").replace("-", "_"): v for k, v in zip(flags[::2], flags[1::2])}
    built = api.evaluate_files(w / "digits_cnn.onnx", calib=w / "cal.calib.json", data=w / "held", **keywords)
    shipped = api.evaluate_files(w / f"{name}.onnx", data=w / "held")
    assert _numbers(shipped) == _numbers(built)  # exactly: the same file simulated
    ev = shipped.evaluation
    assert ev.samples == 60 and ev.target == name.split("-")[0]
    assert np.isfinite(ev.outputs[0].sqnr_db) and ev.outputs[0].top1_agreement is not None
    assert shipped.provenance["calibration"]["name"] == "cal.calib.json"
    assert shipped.model_sha256 == built.model_sha256
    # the command line: the same numbers in its JSON
    a = json.loads(ok(invoke("evaluate", w / f"{name}.onnx", "--data", w / "held", "--json")).stdout)
    b = json.loads(ok(invoke("evaluate", w / "digits_cnn.onnx", "--calib", w / "cal.calib.json", "--data", w / "held", *flags,
                             "--json")).stdout)
    assert a["outputs"] == b["outputs"] and a["sqnr_db"] == b["sqnr_db"] and a["file"] == str(w / f"{name}.onnx")


@pytest.mark.parametrize("name,runtime", [("qdq", "onnxruntime"), ("openvino", "openvino")])
def test_the_runtime_runs_the_file_as_on_the_model_path(w, name, runtime, monkeypatch):
    monkeypatch.chdir(w)  # OpenVINO compiles in f32 (qtool.runtime.openvino states INFERENCE_PRECISION_HINT f32)
    built = api.evaluate_files(w / "digits_cnn.onnx", calib=w / "cal.calib.json", data=w / "held", target=name, runtime=runtime)
    shipped = api.evaluate_files(w / f"{name}.onnx", data=w / "held", runtime=runtime)
    assert _numbers(shipped) == _numbers(built) and _numbers(shipped)[1]


def test_images_are_preprocessed_as_the_file_records_without_the_calibration_file(w, tmp_path, monkeypatch):
    shutil.copy(w / "openvino.onnx", tmp_path / "shipped.onnx")
    shutil.copy(w / "digits_cnn.onnx", tmp_path / "digits_cnn.onnx")  # beside it, by the name it records
    monkeypatch.chdir(tmp_path)  # no calibration file here
    built = api.evaluate_files(w / "digits_cnn.onnx", calib=w / "cal.calib.json", images=IMAGES, limit=40, target="openvino")
    shipped = api.evaluate_files(tmp_path / "shipped.onnx", images=IMAGES, limit=40)
    assert _numbers(shipped) == _numbers(built)
    with_calib = api.evaluate_files(tmp_path / "shipped.onnx", images=IMAGES, limit=40, calib=w / "cal.calib.json")
    assert _numbers(with_calib) == _numbers(built)
    # a preprocessing flag still overrides its part: other numbers
    assert _numbers(api.evaluate_files(tmp_path / "shipped.onnx", images=IMAGES, limit=40, scale="1/128")) != _numbers(built)


def test_the_reference_is_found_where_the_model_was_and_here(w, tmp_path, monkeypatch):
    """Not beside the file: the path it records (relative to its folder) or the name in the current folder."""
    (tmp_path / "ship").mkdir()
    shutil.copy(w / "qdq.onnx", tmp_path / "ship" / "q.onnx")  # the recorded relative path no longer leads to the model
    monkeypatch.chdir(tmp_path)
    r = invoke("evaluate", "ship/q.onnx", "--data", w / "held")
    assert r.exit_code == 1 and "'digits_cnn.onnx'" in r.output and "looked for" in r.output
    shutil.copy(w / "digits_cnn.onnx", tmp_path / "digits_cnn.onnx")
    ok(invoke("evaluate", "ship/q.onnx", "--data", w / "held"))
    # an export written elsewhere finds its model by the path it records
    ok(invoke("-q", "export", "--calib", w / "cal.calib.json", "--target", "qdq", "-o", tmp_path / "ship" / "far.onnx"))
    (tmp_path / "digits_cnn.onnx").unlink()
    outcome = api.evaluate_files(tmp_path / "ship" / "far.onnx", data=w / "held")
    assert outcome.model == str(w / "digits_cnn.onnx")


def test_the_file_is_the_writers_with_its_provenance_appended(w):
    cal = calibration.load(w / "cal.calib.json")
    loaded = load_model(w / "digits_cnn.onnx")
    for name, target, options in [("openvino", "openvino", {}), ("qdq", "qdq", {}), ("tensorrt", "tensorrt", {"trt_version": "10.3"}),
                                  ("tensorrt-fp8", "tensorrt", {"trt_version": "10.3", "precision": "fp8"})]:
        written = (w / f"{name}.onnx").read_bytes()
        mine = exporter(target).export(loaded, cal, options_for(target, **options)).data
        assert written.startswith(mine) and provenance.unstamped(written) == mine, name
        model = onnx.load_from_string(written)
        onnx.checker.check_model(model)
        found = provenance.read(model, name)
        assert found.target == target and found.model_name == "digits_cnn.onnx" and found.model_sha256 == loaded.sha256
        assert found.calibration_name == "cal.calib.json" and found.calibration_sha256 == cal.file[1]
        assert found.preprocess == cal.preprocess and found.options["trt_version" if target == "tensorrt" else "cpu"]
        assert provenance.export_options(found).target == target
    # range files are not ONNX: no provenance in them
    ok(invoke("-q", "export", "--calib", w / "cal.calib.json", "--target", "tensorrt", "--trt-version", "8.6", "-o", w / "x.cache"))
    assert (w / "x.cache").read_bytes() == exporter("tensorrt").export(loaded, cal, options_for("tensorrt", trt_version="8.6")).data


def test_a_foreign_file_is_evaluated_with_its_reference(w, tmp_path):
    model = onnx.load(w / "qdq.onnx")
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "foreign.onnx")
    shipped = api.evaluate_files(w / "qdq.onnx", data=w / "held")
    foreign = api.evaluate_files(tmp_path / "foreign.onnx", data=w / "held", reference=w / "digits_cnn.onnx")
    assert _numbers(foreign) == _numbers(shipped) and foreign.provenance is None
    assert foreign.evaluation.target is None


def _one_error_line(r, *needles):
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for needle in needles:
        assert needle in lines[0], r.output


def test_a_qdq_model_calibrated_as_a_model_is_evaluated_as_one(w, tmp_path, monkeypatch):
    """A Q/DQ model another tool made (smart-turn v3 ships one, QDQ-quantized by onnxruntime): calibrate takes it as a
    MODEL, as it is (with a warning), export too, and so does evaluate when that calibration is given or is the one
    found here (it refused the model: "holds DequantizeLinear/QuantizeLinear nodes but no qtool provenance")."""
    monkeypatch.chdir(tmp_path)
    model = onnx.load(w / "qdq.onnx")
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "foreign.onnx")
    ok(invoke("-q", "calibrate", "foreign.onnx", "--data", w / "held", "--limit", 16, "-o", "foreign.calib.json"))
    for extra in ((), ("--calib", "foreign.calib.json")):
        r = ok(invoke("evaluate", "foreign.onnx", "--data", w / "held", "--limit", 16, "--target", "openvino", "--json", *extra))
        e = json.loads(r.stdout)
        assert e["target"] == "openvino" and e["calibration"].endswith("foreign.calib.json") and float(e["sqnr_db"]) > 20, e  # "inf": its own Q/DQ kept, exact
    # another model's calibration here: the Q/DQ file is no calibrated MODEL, the error stands
    (tmp_path / "foreign.calib.json").unlink()
    shutil.copy(w / "cal.calib.json", tmp_path / "other.calib.json")
    _one_error_line(invoke("evaluate", "foreign.onnx", "--data", w / "held"), "no qtool provenance", "--reference MODEL")


def test_bad_inputs_are_one_line(w, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(w / "openvino.onnx", tmp_path / "shipped.onnx")
    held = w / "held"
    # no reference found: the recorded path leads nowhere from here, nothing beside it or here
    (tmp_path / "ship").mkdir()
    shutil.copy(w / "openvino.onnx", tmp_path / "ship" / "shipped.onnx")
    _one_error_line(invoke("evaluate", "ship/shipped.onnx", "--data", held), "'digits_cnn.onnx'", "looked for", "--reference MODEL")
    # another model under the recorded name, and another model given: SHA-256 differs
    shutil.copy(w / "qdq.onnx", tmp_path / "ship" / "digits_cnn.onnx")
    _one_error_line(invoke("evaluate", "ship/shipped.onnx", "--data", held), "SHA-256 differs", "digits_cnn.onnx")
    _one_error_line(invoke("evaluate", "shipped.onnx", "--data", held, "--reference", w / "qdq.onnx"), "SHA-256 differs", "qdq.onnx")
    # a Q/DQ file without provenance and without --reference
    model = onnx.load(w / "qdq.onnx")
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "foreign.onnx")
    _one_error_line(invoke("evaluate", "foreign.onnx", "--data", held), "no qtool provenance", "--reference MODEL")
    # not an ONNX file
    (tmp_path / "notes.onnx").write_text("this is not a model")
    _one_error_line(invoke("evaluate", "notes.onnx", "--data", held), "'notes.onnx' is not a readable ONNX model")
    _one_error_line(invoke("evaluate", "notes.onnx", "--data", held, "--reference", w / "digits_cnn.onnx"), "not a readable ONNX model")
    # a damaged provenance record
    model = onnx.load(w / "qdq.onnx")
    model.metadata_props[-1].value = "{not json"
    onnx.save(model, tmp_path / "damaged.onnx")
    _one_error_line(invoke("evaluate", "damaged.onnx", "--data", held), "damaged or unknown qtool.provenance")
    # what builds an export does not apply to an exported file; nor another calibration file
    beside = tmp_path / "ok"
    beside.mkdir()
    shutil.copy(w / "qdq.onnx", beside / "q.onnx")
    shutil.copy(w / "digits_cnn.onnx", beside / "digits_cnn.onnx")
    _one_error_line(invoke("evaluate", beside / "q.onnx", "--data", held, "--method", "mse"), "--method", "export")
    _one_error_line(invoke("evaluate", beside / "q.onnx", "--data", held, "--target", "openvino"), "a qdq export")
    _one_error_line(invoke("evaluate", beside / "q.onnx", "--data", held, "--tensors"), "--tensors")
    ok(invoke("-q", "calibrate", w / "digits_cnn.onnx", "--images", IMAGES, "--limit", 16, "-o", tmp_path / "other.calib.json"))
    _one_error_line(invoke("evaluate", beside / "q.onnx", "--images", IMAGES, "--limit", 8, "--calib", tmp_path / "other.calib.json"),
                    "not the calibration file")
    _one_error_line(invoke("evaluate", w / "tensorrt-fp8.onnx", "--data", held, "--runtime", "onnxruntime"), "FP8")


@pytest.mark.parametrize("name,target", [("openvino", "openvino"), ("qdq", "qdq"), ("tensorrt", "tensorrt")])
def test_report_takes_the_exported_file(w, tmp_path, monkeypatch, name, target):
    """The page of the calibration file the export records, as its target (and TensorRT version) use it:
    the page of `qtool report CALIB --target T` but for the sentence saying why this target."""
    monkeypatch.chdir(tmp_path)
    flags = ["--trt-version", "10.3"] if target == "tensorrt" else []
    ok(invoke("-q", "report", w / f"{name}.onnx", "-o", "shipped.html"))
    ok(invoke("-q", "report", w / "cal.calib.json", "--target", target, *flags, "-o", "calib.html"))
    shipped, calib = (tmp_path / "shipped.html").read_text(), (tmp_path / "calib.html").read_text()
    assert f"Why this target: recorded in {name}.onnx." in shipped and "Why this target: given with --target." in calib
    assert shipped.replace(f"recorded in {name}.onnx.", "given with --target.") == calib


def test_report_refuses_what_it_cannot_show_of_an_exported_file(w, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_error_line(invoke("report", w / "tensorrt-fp8.onnx"), "precision='fp8'", "report its calibration file")
    _one_error_line(invoke("report", w / "qdq.onnx", "--target", "openvino"), "--target openvino", "records 'qdq'")
    shutil.copy(w / "qdq.onnx", tmp_path / "q.onnx")  # its calibration file is neither beside it nor here
    _one_error_line(invoke("report", "q.onnx"), "'cal.calib.json'", "looked for")
    model = onnx.load(w / "qdq.onnx")
    del model.metadata_props[:]
    onnx.save(model, tmp_path / "foreign.onnx")
    _one_error_line(invoke("report", "foreign.onnx"), "without qtool provenance")
    assert not list(tmp_path.glob("*.html"))
