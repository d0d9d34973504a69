"""The Python API (qtool.calibrate/export/evaluate/merge/recompute): same files as the command
line, in-memory loaders, no printing, one exception type for user errors, the README's example."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import onnx
import pytest
from runcli import invoke
from test_openvino import HELDOUT, IMAGES, ROOT, SAMPLE, ok

import qtool
from qtool import calibration
from qtool.checks import evaluation
from qtool.quantizers import cpu_kinds


@pytest.fixture(scope="module")
def arrays():
    return np.load(HELDOUT)["x"][:120]


def test_in_memory_loader_equals_the_cli_over_the_same_arrays_as_npy(tmp_path, arrays, capsys):
    folder = tmp_path / "npy"
    folder.mkdir()
    for i in range(0, len(arrays), 40):  # three files of 40 samples: three runs, as the loader's three items
        np.save(folder / f"{i:03d}.npy", arrays[i:i + 40])
    ok(invoke("-q", "calibrate", SAMPLE, "--data", folder, "-o", tmp_path / "cli.calib.json"))
    capsys.readouterr()
    cal = qtool.calibrate(SAMPLE, data=({"input": arrays[i:i + 40]} for i in range(0, len(arrays), 40)))
    cal.save(tmp_path / "api.calib.json")
    assert capsys.readouterr() == ("", "")  # the library never prints
    assert (tmp_path / "api.calib.json").read_bytes() == (tmp_path / "cli.calib.json").read_bytes()
    # a list of bare arrays is the same loader for a single-input model; shard and limit as on the command line
    same = qtool.calibrate(SAMPLE, data=[arrays[i:i + 40] for i in range(0, len(arrays), 40)])
    assert calibration.to_json(same) == calibration.to_json(cal)


def test_the_calibration_file_is_written_in_pieces(tmp_path, arrays, monkeypatch):
    """calibration.json_chunks: the file's text in pieces of about CHUNK_BYTES, never whole in memory (a
    transformer's Grams: svtrv2_captcha's 100 MB file was copied four times on its way out, where its
    calibrate peaked); the same bytes as the text, saved and hashed as they go."""
    cal = qtool.calibrate(SAMPLE, data=[arrays[:40]])
    monkeypatch.setattr(calibration, "CHUNK_BYTES", 4096)
    chunks = list(calibration.json_chunks(cal))
    whole = calibration.to_json(cal).encode()
    assert b"".join(chunks) == whole and len(whole) > 3 * 4096
    assert len(chunks) > 3 and max(len(c) for c in chunks) < 2 * 4096 + max(len(line) for line in whole.splitlines())
    # each tensor's document made as the encoder comes to it (before: every one, and all their number lists, first)
    from qtool.statistics.stats import SampleStats

    made, to_json = [], SampleStats.to_json
    monkeypatch.setattr(SampleStats, "to_json", lambda self: made.append(self) or to_json(self))
    next(calibration.json_chunks(cal))
    documented = sum(t.stats is not None for t in cal.tensors)
    assert documented > 3 and 0 < len(made) < documented / 2, (len(made), documented)
    monkeypatch.undo()
    cal.save(tmp_path / "a.calib.json")
    saved = (tmp_path / "a.calib.json").read_bytes()
    assert saved == calibration.to_json(calibration.relocate(cal, tmp_path / "a.calib.json")).encode()
    assert cal.file[1] == hashlib.sha256(saved).hexdigest()


def test_images_and_every_export_equal_the_cli_byte_for_byte(tmp_path):
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "--limit", "40", "-o", tmp_path / "cli.calib.json"))
    cal = qtool.calibrate(str(SAMPLE), images=IMAGES, limit=40)
    cal.save(tmp_path / "api.calib.json")
    assert (tmp_path / "api.calib.json").read_bytes() == (tmp_path / "cli.calib.json").read_bytes()
    loaded = qtool.Calibration.load(tmp_path / "cli.calib.json")  # the file the command line reads: its name and SHA-256 go in the provenance
    cases = [
        ("openvino", [], {}),
        ("qdq", [], {}),
        ("qdq", ["--weight-bits", "4", "--scale-kind", "pow2"], {"policies": qtool.Policies(
            weights=qtool.Policy(bits=4, signed=True, per_channel=True, scale="pow2"), activations=qtool.Policy(symmetric=None, scale="pow2"))}),
        ("tensorrt", ["--trt-version", "11.4"], {"trt_version": "11.4"}),
        ("tensorrt", ["--trt-version", "10.3", "--weights", "int8"], {"trt_version": "10.3", "weights": "int8"}),
        ("tensorrt", ["--trt-version", "8.6.1"], {"trt_version": "8.6.1"}),
        ("tensorrt", ["--trt-version", "10.3", "--format", "ort-trt"], {"trt_version": "10.3", "fmt": "ort-trt"}),
    ]
    for i, (target, flags, options) in enumerate(cases):
        out = tmp_path / f"cli{i}.out"
        ok(invoke("-q", "export", "--target", target, "--calib", tmp_path / "cli.calib.json", "-o", out, *flags))
        data = qtool.export(SAMPLE, loaded, target=target, path=tmp_path / f"api{i}.out", **options)
        assert data == out.read_bytes() == (tmp_path / f"api{i}.out").read_bytes(), (target, flags)


def test_model_proto_recompute_merge_and_evaluate(arrays):
    proto = onnx.load(str(SAMPLE))
    cal = qtool.calibrate(proto, data=[{"input": arrays[:60]}, {"input": arrays[60:]}])
    a = qtool.calibrate(proto, data=[{"input": arrays[:60]}, {"input": arrays[60:]}], shard="1/2")
    b = qtool.calibrate(proto, data=[{"input": arrays[:60]}, {"input": arrays[60:]}], shard="2/2")
    merged = qtool.merge([a, b])
    assert [t.counts for t in merged.tensors] == [t.counts for t in cal.tensors] and merged.samples == 120
    p = qtool.recompute(cal, "percentile:99.9")
    assert p.method == "percentile:99.9" and any(x.amax != y.amax for x, y in zip(p.tensors, cal.tensors))
    assert len(qtool.export(proto, cal, target="qdq")) > 0
    seen = []
    result = qtool.evaluate(proto, cal, data=[{"input": arrays[:60]}], per_tensor=False, progress=seen.append)
    assert result.samples == 60 and np.isfinite(result.worst_sqnr_db) and seen


def test_evaluate_takes_a_target_its_options_and_a_runtime(arrays, capsys):
    cal = qtool.calibrate(SAMPLE, data=[arrays[:60]])
    held = [{"input": arrays[60:]}]
    trt = qtool.evaluate(SAMPLE, cal, data=held, target="tensorrt", trt_version="10.3", high_precision="fp32")
    assert trt.target == "tensorrt" and trt.plan_summary["high_precision"] == "fp32" and trt.tensors == [] and trt.runtime is None
    both = qtool.evaluate(SAMPLE, cal, data=held, runtime="onnxruntime", per_tensor=True)
    doc = evaluation.to_json(both)
    assert doc["target"] == "qdq" and doc["runtime"]["name"] == "onnxruntime" and len(doc["runtime"]["outputs"]) == 1
    assert both.runtime.vnni == cpu_kinds.vnni() and len(both.tensors) == 16
    assert capsys.readouterr() == ("", "")
    for kwargs, message in [
        (dict(target="tensorrt", weights_7bit="all"), "weights_7bit= applies to target='openvino' or qdq, not tensorrt"),
        (dict(runtime="openvino"), "runtime='openvino' runs the file of target='openvino', not qdq"),  # keywords, not flags
        (dict(target="openvino", runtime="onnxruntime"), "runs the file of target='qdq' or tensorrt, not openvino"),
        (dict(target="tensorrt", per_tensor=True), "the per-tensor ranking is for target='openvino' or qdq"),
        (dict(target="tensorrt", fmt="cache", trt_version="10.3"), "a cache file holds ranges, no model to run"),
        (dict(target="tflite"), "not one of"),
    ]:
        with pytest.raises(qtool.QtoolError, match=re.escape(message)):
            qtool.evaluate(SAMPLE, cal, data=held, **kwargs)


def test_user_errors_raise_qtoolerror_never_exit(arrays):
    with pytest.raises(qtool.QtoolError, match="exactly one source of inputs"):
        qtool.calibrate(SAMPLE, images=IMAGES, data=[arrays])
    with pytest.raises(qtool.QtoolError, match="has no array for input"):
        qtool.calibrate(SAMPLE, data=[{"image": arrays[:4]}])
    with pytest.raises(qtool.QtoolError, match="the loader gave no inputs"):
        qtool.calibrate(SAMPLE, data=[])
    cal = qtool.calibrate(SAMPLE, data=[arrays[:8]])
    with pytest.raises(qtool.QtoolError, match="weights_7bit= applies to target='openvino' or qdq, not tensorrt"):
        qtool.export(SAMPLE, cal, target="tensorrt", weights_7bit="all")
    with pytest.raises(qtool.QtoolError, match="TensorRT 11 removed implicit INT8"):
        qtool.export(SAMPLE, cal, target="tensorrt", trt_version="11.4", fmt="cache")
    with pytest.raises(qtool.QtoolError, match="not one of"):
        qtool.export(SAMPLE, cal, target="tflite")
    with pytest.raises(qtool.QtoolError, match="method"):
        qtool.recompute(cal, "entropee")
    other = onnx.load(str(SAMPLE))
    other.graph.node[0].name = "renamed"
    with pytest.raises(qtool.QtoolError, match=r"records '.*digits_cnn.onnx' \(SHA-256 [0-9a-f]{12}\), not the ModelProto \(SHA-256"):
        qtool.export(other, cal, target="qdq")


def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- test:python-api.*?-->\n```python\n(.*?)```", text, re.S)
    assert block, "the README has no Python API block"
    for folder in ("sample_models", "calib_images"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), namespace)
    assert (tmp_path / "digits.calib.json").exists() and (tmp_path / "digits.openvino.onnx").exists()
    assert capsys.readouterr().out.startswith("logits SQNR ")  # the example's own print, nothing from qtool
    assert namespace["four_bit"] != namespace["trt"]


def test_api_errors_name_keywords_not_flags(tmp_path):
    """The library's messages name --size HxW on the command line and size=(h, w) here."""
    import zoo
    from PIL import Image

    from qtool.errors import Opt, QtoolError

    model = tmp_path / "yolo.onnx"
    onnx.save(zoo.yolo_like(), model)
    (tmp_path / "i").mkdir()
    Image.new("RGB", (20, 20)).save(tmp_path / "i" / "a.png")
    with pytest.raises(qtool.QtoolError, match=r"give the calibration size with size=\(h, w\)$"):
        qtool.calibrate(model, images=tmp_path / "i")
    with pytest.raises(qtool.QtoolError, match=r"^size='3x' is not HxW, e.g. size=\(320, 320\)$"):
        qtool.calibrate(model, images=tmp_path / "i", size="3x")
    error = QtoolError("use {qdq} or {fp32}; --int8 stays", qdq=Opt("fmt", "qdq"), fp32=Opt("high_precision", "fp32"))
    assert str(error) == "use fmt='qdq' or high_precision='fp32'; --int8 stays"
    assert error.worded({"fmt": "--format"}) == "use --format qdq or --high-precision fp32; --int8 stays"


def test_progress_receives_increments_that_add_up_to_the_inputs(tmp_path):
    seen = []
    qtool.calibrate(SAMPLE, images=IMAGES, limit=12, batch_size=4, progress=seen.append)
    assert seen == [4, 4, 4]
