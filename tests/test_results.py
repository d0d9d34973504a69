"""Typed results (qtool.results): each command over files returns a frozen dataclass whose
`to_json()` is exactly the document `--json` prints (with "schema": 1), and the command line's
text is worded from the same object."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from runcli import invoke

from qtool import JSON_SCHEMA, api, results
from qtool.cli import export as cli_export
from qtool.cli import merge as cli_merge

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"


def _printed(*args) -> dict:
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _same(a: dict, b: dict, *keys) -> None:
    """Equal documents apart from the time taken and the keys given (paths that differ)."""
    a, b = dict(a), dict(b)
    for doc in (a, b):
        doc.pop("seconds")
        for key in keys:
            doc.pop(key)
    assert a == b


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    for k in (1, 2):
        api.calibrate_files(SAMPLE, images=IMAGES, limit=8, shard=f"{k}/2", output=d / f"part{k}.calib.json")
    return d


def test_every_result_is_a_frozen_dataclass_with_the_schema():
    for cls in (results.CalibrateResult, results.ExportResult, results.EvaluateResult, results.InspectResult,
                results.ReportResult, results.MergeResult, results.RecomputeResult):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        assert getattr(api, cls.__name__) is cls  # the API names them
    merged = results.MergeResult(inputs=("a", "b"), output="m.calib.json", samples=3, tensors=2, seconds=0.25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        merged.samples = 4
    assert merged.to_json() == {"schema": JSON_SCHEMA, "command": "merge", "inputs": ["a", "b"], "outputs": {"calibration": "m.calib.json"},
                                "samples": 3, "tensors": 2, "seconds": 0.25, "warnings": []}


def test_merge_and_recompute_return_what_json_prints(shards):
    d = shards
    parts = [d / "part1.calib.json", d / "part2.calib.json"]
    merged = api.merge_files(parts, d / "api.calib.json")
    printed = _printed("merge", *parts, "-o", d / "cli.calib.json")
    assert printed["schema"] == 1 and printed["command"] == "merge" and merged.samples == 8
    _same(merged.to_json(), printed, "outputs")
    assert cli_merge.text(merged) == f"merged 2 files (8 samples, {merged.tensors} tensors) -> {d / 'api.calib.json'}"
    again = api.recompute_file(d / "api.calib.json", method="mse", output=d / "mse.calib.json")
    _same(again.to_json(), _printed("recompute", d / "api.calib.json", "--method", "mse", "-o", d / "mse2.calib.json"), "outputs")
    assert (again.method, again.tensors, again.output) == ("mse", merged.tensors, str(d / "mse.calib.json"))


def test_export_result_says_what_it_kept_fp32_and_why(shards):
    d = shards
    api.merge_files([d / "part1.calib.json", d / "part2.calib.json"], d / "all.calib.json")
    exported = api.export_file(target="tensorrt", calib=d / "all.calib.json", output=d / "api.trt.onnx")
    printed = _printed("export", "--target", "tensorrt", "--calib", d / "all.calib.json", "-o", d / "cli.trt.onnx")
    _same(exported.to_json(), printed, "outputs", "build")
    assert exported.output == str(d / "api.trt.onnx") and Path(exported.output).is_file()
    assert exported.fp32_layers == printed["fp32_layer_names"] == ["/fc/Gemm"]  # TensorRT's GEMV rule keeps the classifier
    assert exported.fp32_reasons == printed["default_exclusions"] and "GEMV" in exported.fp32_reasons["/fc/Gemm"]
    assert exported.build is not None and exported.build.startswith("trtexec ")
    text = cli_export.text(exported).splitlines()
    assert text[0].startswith(f"exported tensorrt from {d / 'all.calib.json'} in ") and text[0].endswith(f"-> {exported.output}")
    assert text[1:-1] == list(exported.target_lines) and text[-1] == f"build it with: {exported.build}"
    kept = api.export_file(target="qdq", calib=d / "all.calib.json", output=d / "kept.qdq.onnx", keep_fp32=1, images=IMAGES, limit=8)
    assert len(kept.kept_fp32) == 1 and kept.budget is None
    assert kept.to_json()["kept_fp32"] == list(kept.kept_fp32) and "budget" not in kept.to_json()
