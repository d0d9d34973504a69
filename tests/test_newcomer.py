"""What a new user trips on (issue 31): the TensorRT build line of a dynamic model, the versions
--trt-version takes, the counts and paths of the summaries, usage errors, completion, the example
pipeline script and the --max-drop latency."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from click.testing import CliRunner
from PIL import Image
from runcli import invoke, ok

from qtool.cli import cli

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"



def images(folder: Path, n: int = 3, size=(40, 50)) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        pixels = (np.random.default_rng(i).random((*size, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    """A YOLO look-alike with dynamic batch, height and width, calibrated at 96x128."""
    d = tmp_path_factory.mktemp("dyn")
    model = d / "yolo.onnx"
    onnx.save(zoo.yolo_like(), model)
    dims = [x.dim_param or x.dim_value for x in onnx.load(model).graph.input[0].type.tensor_type.shape.dim]
    assert isinstance(dims[2], str) and isinstance(dims[3], str)  # symbolic H/W
    calib = d / "yolo.calib.json"
    ok(invoke("calibrate", model, "--images", images(d / "imgs"), "--size", "96x128", "-o", calib))
    return model, calib


@pytest.mark.parametrize("version,fmt,start", [
    ("11", "qdq", "trtexec --onnx={out}"),
    ("10.3", "qdq", "trtexec --onnx={out} --stronglyTyped"),
    ("8.6", "cache", "trtexec --onnx={model} --int8 --calib={out}"),
    ("7.2.3", "cache", "trtexec --onnx={model} --int8 --calib={out}"),
    ("8.6", "qdq", "trtexec --onnx={out} --int8 --fp16"),
])
def test_build_line_of_a_dynamic_model_carries_the_calibrated_shapes(dynamic, tmp_path, monkeypatch, version, fmt, start):
    model, calib = dynamic
    monkeypatch.chdir(tmp_path)
    out = Path(f"m.{fmt}")
    r = ok(invoke("export", "--target", "tensorrt", "--calib", calib, "--trt-version", version, "--format", fmt, "-o", out, "--json"))
    summary = json.loads(r.stdout)
    shown = str(model)  # outside the current folder: absolute (below it: relative, see the pipeline test)
    assert summary["build"] == start.format(out=out, model=shown) + " --shapes=images:1x3x96x128"
    assert summary["trt_version_from"] == "--trt-version"
    text = ok(invoke("export", "--target", "tensorrt", "--calib", calib, "--trt-version", version, "--format", fmt, "-o", out)).stdout
    assert f"build it with: {summary['build']}" in text
    assert f"TensorRT {summary['trt_version']} (--trt-version), {fmt}, thresholds: {summary['method']}" in text


def test_default_version_is_named_with_its_source(dynamic, tmp_path, monkeypatch):
    _, calib = dynamic
    monkeypatch.chdir(tmp_path)
    text = ok(invoke("export", "--target", "tensorrt", "--calib", calib, "-o", "m.onnx")).stdout
    assert "TensorRT 11.4.0 (the newest TensorRT qtool knows (no tensorrt package installed)), qdq, thresholds: mse" in text


@pytest.mark.parametrize("version,header", [("8.6", "TRT-8601"), ("8.6.1", "TRT-8601"), ("7.2.3", "TRT-7203"), ("10", "TRT-101600"),
                                            ("10.x", "TRT-101600"), ("10.0", "TRT-100001")])
def test_cache_headers_of_versions_as_users_give_them(tmp_path, version, header):
    cache = tmp_path / "m.cache"
    ok(invoke("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", 8, "-o", tmp_path / "m.calib.json",
              "--trt-table", cache, "--trt-version", version))
    assert cache.read_text().splitlines()[0] == f"{header}-EntropyCalibration2"


@pytest.mark.parametrize("version", ["8.3", "12", "banana", "6.0.1"])
def test_unknown_versions_are_one_line_errors_listing_the_forms(tmp_path, version):
    r = invoke("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", 8, "-o", tmp_path / "m.calib.json",
               "--trt-table", tmp_path / "m.cache", "--trt-version", version)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "MAJOR.MINOR.PATCH (e.g. 7.2.3)" in r.stderr
    assert not (tmp_path / "m.calib.json").exists()


def test_a_skipped_image_is_not_counted(tmp_path):
    folder = images(tmp_path / "imgs", n=2, size=(28, 28))
    (folder / "2.png").write_bytes(b"not an image")
    r = ok(invoke("calibrate", SAMPLE, "--images", folder, "--on-bad-image", "skip", "-o", tmp_path / "m.calib.json"))
    assert "from 2 images, 1 unreadable skipped" in r.stdout
    doc = json.loads((tmp_path / "m.calib.json").read_text())
    assert doc["samples"] == 2
    summary = json.loads(ok(invoke("calibrate", SAMPLE, "--images", folder, "--on-bad-image", "skip", "-o",
                                   tmp_path / "n.calib.json", "--json")).stdout)
    assert summary["images"] == summary["samples"] == 2 and summary["skipped"] == 1


def test_model_path_in_json_is_absolute_in_every_command(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    shutil.copy(SAMPLE, tmp_path / "m.onnx")
    monkeypatch.chdir(work)
    rel = Path("..") / ".." / "m.onnx"
    expected = str(tmp_path / "m.onnx")
    cal = json.loads(ok(invoke("calibrate", rel, "--images", ROOT / "calib_images", "--limit", 8, "--json")).stdout)
    exp = json.loads(ok(invoke("export", "--target", "qdq", "--json")).stdout)
    ins = json.loads(ok(invoke("inspect", "m.calib.json", "--json")).stdout)
    cov = json.loads(ok(invoke("inspect", "m.calib.json", "--model", rel, "--json")).stdout)
    ev = json.loads(ok(invoke("evaluate", rel, "--calib", "m.calib.json", "--images", ROOT / "calib_images", "--limit", 4, "--json")).stdout)
    assert cal["model"] == exp["model"] == ins["model"] == cov["model"] == cov["coverage"]["model"] == ev["model"] == expected


def test_inspect_against_another_model_says_so_in_one_line(dynamic, tmp_path):
    _, calib = dynamic
    r = invoke("inspect", calib, "--model", SAMPLE)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.output
    assert f"{str(calib)!r} records " in r.stderr and f"not {str(SAMPLE)!r} (SHA-256" in r.stderr, r.output


def test_target_values_complete_in_the_shell():
    def complete(words: str, cword: int) -> list[str]:
        env = {"_QTOOL_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        r = CliRunner().invoke(cli, [], prog_name="qtool", env=env)
        return [line.split(",", 1)[1] for line in r.output.splitlines()]

    assert complete("qtool export --target ", 3) == ["tensorrt", "openvino", "qdq"] or \
        sorted(complete("qtool export --target ", 3)) == ["openvino", "qdq", "tensorrt"]
    assert complete("qtool export --target o", 3) == ["openvino"]


def test_a_size_the_strides_forbid_is_a_usage_error(dynamic, tmp_path):
    model, _ = dynamic
    r = invoke("calibrate", model, "--images", images(tmp_path / "i", n=1), "--size", "100x128", "-o", tmp_path / "x.calib.json")
    assert r.exit_code == 2 and "multiples of 8" in r.stderr and "--size 104x128" in r.stderr
    assert not (tmp_path / "x.calib.json").exists()


@pytest.mark.parametrize("option,value", [("--mean", "1e39"), ("--std", "1e-300"), ("--std", "-1e40")])
def test_mean_and_std_beyond_float32_are_refused(tmp_path, option, value):
    r = invoke("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", 2, option, value, "-o", tmp_path / "x.calib.json")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "float32" in r.stderr and "Warning" not in r.output


def test_too_many_pixels_and_inflating_data_files_are_one_line_errors(tmp_path, monkeypatch):
    from qtool.feeds import data

    folder = images(tmp_path / "i", n=1, size=(300, 400))
    monkeypatch.setattr(data, "MAX_IMAGE_PIXELS", 100_000)  # the real cap takes an 89 Mpixel file to reach
    r = invoke("calibrate", SAMPLE, "--images", folder, "-o", tmp_path / "x.calib.json")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "(400x300) has more than 100000 pixels" in r.stderr
    arrays = tmp_path / "d"
    arrays.mkdir()
    np.savez_compressed(arrays / "big.npz", input=np.zeros((64, 1, 28, 28), np.float32))  # compresses to almost nothing
    monkeypatch.setattr(data, "MAX_ARRAY_FILE_BYTES", 100_000)
    assert (arrays / "big.npz").stat().st_size < 100_000
    r = invoke("calibrate", SAMPLE, "--data", arrays, "-o", tmp_path / "y.calib.json")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "more than qtool loads as one input" in r.stderr


def _script(*args, cwd: Path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(ROOT / "examples" / "pipeline.sh"), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_example_pipeline_runs_on_the_sample_and_a_dynamic_model(dynamic, tmp_path):
    r = _script(SAMPLE, ROOT / "calib_images", tmp_path / "out", "--limit", "16", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "digits_cnn.cache").exists() and (tmp_path / "out" / "digits_cnn.trt.onnx").exists()
    model, _ = dynamic
    folder = images(tmp_path / "imgs", n=2)
    r = _script(model, folder, tmp_path / "dyn", cwd=tmp_path)  # no --size: calibrate's own error and exit code
    assert r.returncode == 1 and "calibration failed (exit 1)" in r.stderr and "--size HxW" in r.stderr
    r = _script(model, folder, tmp_path / "dyn", "--size", "96x128", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "dyn" / "trt.json").read_text())["build"].endswith("--shapes=images:1x3x96x128")


def _median_ms(session, feeds, runs=20) -> float:
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def test_max_drop_latency_is_one_inputs(dynamic, tmp_path):
    """The all-int8 latency is one input's: within a small factor of onnxruntime running the same
    file on one image here (it was 8 held-out images' worth), timed before and after the export
    (a shared machine's load moves both)."""
    model, _ = dynamic
    folder = images(tmp_path / "imgs", n=8)
    calib = tmp_path / "y.calib.json"
    ok(invoke("calibrate", model, "--images", folder, "--size", "192x192", "-o", calib))
    out = tmp_path / "y.qdq.onnx"
    feeds = {"images": np.random.default_rng(0).random((1, 3, 192, 192), np.float32)}
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out))  # all int8: the file --max-drop times first
    before = _median_ms(ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]), feeds)
    summary = json.loads(ok(invoke("export", "--target", "qdq", "--calib", calib, "--max-drop", "1dB", "--images", folder,
                                   "-o", tmp_path / "y.budget.qdq.onnx", "--json")).stdout)
    reported = summary["budget"]["latency_ms"]["all_int8"]
    after = _median_ms(ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]), feeds)
    assert min(before, after) / 3 < reported < 3 * max(before, after), (reported, before, after)


def test_qdq_target_is_not_for_tensorrt(tmp_path, monkeypatch):
    """What the README says: --target qdq (u8 activations with zero points) breaks TensorRT's Q/DQ
    rules, --target tensorrt does not."""
    monkeypatch.chdir(tmp_path)
    ok(invoke("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", 16))
    ok(invoke("export", "--target", "qdq", "-o", "m.qdq.onnx"))
    ok(invoke("export", "--target", "tensorrt", "--trt-version", "10", "-o", "m.trt.onnx"))
    broken = invoke("inspect", "m.qdq.onnx", "--trt-version", "10", "--json")
    assert broken.exit_code == 1 and json.loads(broken.stdout)["violations"]
    ok(invoke("inspect", "m.trt.onnx", "--trt-version", "10"))


def test_a_size_whose_strides_the_graph_hides_fails_with_what_to_do(dynamic, tmp_path, monkeypatch):
    from qtool.feeds import data

    model, _ = dynamic
    monkeypatch.setattr(data, "size_multiple", lambda proto, name: None)  # as for a graph qtool cannot read strides from
    r = invoke("calibrate", model, "--images", images(tmp_path / "i", n=1), "--size", "100x128", "-o", tmp_path / "x.calib.json")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.exit_code == 1 and len(errors) == 1 and "onnxruntime failed" in errors[0] and errors[0].endswith(
        "; the feature maps did not line up at this --size: give a height and width divisible by the model's total stride (often 32)")


def test_the_api_checks_the_size_too(dynamic, tmp_path):
    import qtool

    model, _ = dynamic
    with pytest.raises(qtool.QtoolError, match=r"^size=\(100, 128\): .* multiples of 8 .* e.g. size=\(104, 128\)$"):
        qtool.calibrate(model, images=images(tmp_path / "i", n=1), size=(100, 128))


def test_calibrate_prints_the_build_line_of_its_cache(dynamic, tmp_path, monkeypatch):
    model, _ = dynamic
    monkeypatch.chdir(tmp_path)
    shutil.copy(model, "y.onnx")
    r = ok(invoke("calibrate", "y.onnx", "--images", images(tmp_path / "i", n=1), "--size", "96x128", "--trt-table", "y.cache",
                  "--trt-version", "8.6"))
    assert "TensorRT 8.6.1 cache TRT-8601-EntropyCalibration2 -> y.cache" in r.stdout
    assert "build it with: trtexec --onnx=y.onnx --int8 --calib=y.cache --shapes=images:1x3x96x128" in r.stdout


def test_an_installed_tensorrt_is_the_default_and_named(dynamic, tmp_path, monkeypatch):
    import types

    _, calib = dynamic
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.3.0.post1"))
    summary = json.loads(ok(invoke("export", "--target", "tensorrt", "--calib", calib, "-o", tmp_path / "m.onnx", "--json")).stdout)
    assert summary["trt_version"] == "10.3.0" and summary["trt_version_from"] == "the installed tensorrt package"
    assert " --stronglyTyped --shapes=images:1x3x96x128" in summary["build"]


def test_stride_multiples_of_the_look_alikes():
    from qtool.feeds import data

    for build, expected in [(zoo.yolo_like, 8), (zoo.paddle_ocr_like, 8), (zoo.resnet_like, None), (zoo.vit_like, None)]:
        m = build()
        assert data.size_multiple(m, m.graph.input[0].name) == expected, build.__name__


def _runs(m, h: int, w: int) -> bool:
    import onnxruntime as ort

    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    try:
        session.run(None, {m.graph.input[0].name: np.zeros((1, 3, h, w), np.float32)})
        return True
    except Exception:  # onnxruntime: the feature maps do not line up
        return False


def _pan(scales=True):
    """YOLOv8's neck in small: down to stride 8, up to 4 (Resize x2, joined), down again to 8 (joined)."""
    from onnx import TensorProto, helper, numpy_helper

    def conv(x, name, stride):
        return helper.make_node("Conv", [x, f"{name}_w"], [name], strides=[stride, stride], pads=[1, 1, 1, 1], kernel_shape=[3, 3])

    nodes = [conv("images", "c1", 2), conv("c1", "c2", 2), conv("c2", "c3", 2)]
    if scales:
        nodes.append(helper.make_node("Resize", ["c3", "", "scales"], ["up"], mode="nearest"))
    else:  # the sizes of the tensor it joins, computed in the graph
        nodes += [helper.make_node("Shape", ["c2"], ["shape"]), helper.make_node("Resize", ["c3", "", "", "shape"], ["up"], mode="nearest")]
    nodes += [helper.make_node("Concat", ["up", "c2"], ["cat"], axis=1), conv("cat", "d1", 2),
              helper.make_node("Concat", ["d1", "c3"], ["out"], axis=1)]
    weights = [numpy_helper.from_array(np.full((4, c, 3, 3), 0.1, np.float32), f"{n}_w")
               for n, c in (("c1", 3), ("c2", 4), ("c3", 4), ("d1", 8))]
    weights.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    graph = helper.make_graph(nodes, "pan", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_path_down_again_after_upsampling_keeps_the_deepest_stride():
    """YOLOv8's PAN goes down to stride 32, up and down again: its sizes are multiples of 32, not of
    128 (the strides on that path multiplied without the upsampling between)."""
    from qtool.feeds import data

    m = _pan()
    assert data.size_multiple(m, "images") == 8
    assert _runs(m, 72, 72) and not _runs(m, 68, 68)  # 72 = 9 x 8 runs (not a multiple of 16); 68 does not
    assert _runs(zoo.yolo_like(), 72, 72) and not _runs(zoo.yolo_like(), 68, 68)
    assert data.size_multiple(_pan(scales=False), "images") is None  # resized to a computed size: any size lines up


def test_one_sample_keeps_a_fixed_batch():
    from qtool.checks import budget

    fixed = zoo.resnet_like()  # batch fixed at 1 in the graph
    x = np.zeros((1, 3, 32, 32), np.float32)
    assert budget.one_sample(fixed, {"input": x})["input"] is x
    dyn = zoo.yolo_like()
    assert budget.one_sample(dyn, {"images": np.zeros((8, 3, 32, 32), np.float32)})["images"].shape == (1, 3, 32, 32)
