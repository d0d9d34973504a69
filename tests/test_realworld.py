"""End to end: exporter-like models from tests/zoo.py calibrated through the CLI on noise images."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from click.testing import CliRunner
from PIL import Image

from qtool import model
from qtool.calibration import load as load_calibration
from qtool.cli import cli
from qtool.collection import collect
from qtool.errors import QtoolError
from qtool.runtime import onnxruntime
from qtool.statistics.stats import new_stats
from qtool.targets.tensorrt.files import ZERO_AMAX_FALLBACK, read_cache

N_IMAGES = 8  # a multiple of the batch sizes used below; test_image_count_not_a_multiple_of_the_batch covers 6


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _noise_images(seed: int = 0, n: int = N_IMAGES) -> list[np.ndarray]:
    """Small random-noise RGB pictures of varying sizes (so every one is resized)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(40 + 4 * i, 56 - 2 * i, 3), dtype=np.uint8) for i in range(n)]


def _write_images(folder: Path, names: list[str], images: list[np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in zip(names, images):
        Image.fromarray(arr, mode="RGB").save(folder / name)
    return folder


@pytest.fixture
def images(tmp_path) -> Path:
    return _write_images(tmp_path / "images", [f"img_{i:02d}.png" for i in range(N_IMAGES)], _noise_images())


def _save(proto: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(proto, str(path))
    return path


def _invoke(*args):
    return CliRunner().invoke(cli, ["-q", "calibrate", *[str(a) for a in args]])


def _ok(result) -> None:
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)


def _user_error(result) -> str:
    """The message of a user error (exit 1); a crash (exit 3, or a stray exception) fails the test."""
    assert result.exit_code == 1, (result.output, result.exception)
    if isinstance(result.exception, QtoolError):  # raised through cli(): main() would print it
        return str(result.exception)
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # printed by the cli group
    assert result.output.startswith("error: ") and "internal error" not in result.output, result.output
    return result.output


def _assert_same_calibration(label: str, data: bytes, reference: bytes) -> None:
    ref_tensors = json.loads(reference)["tensors"]
    tensors = json.loads(data)["tensors"]
    differing = [n for n in ref_tensors if tensors.get(n) != ref_tensors[n]]
    assert not differing, f"{label}: calibration differs from batch size 1 in tensors {differing}"
    assert data == reference, label


def _check_calibration(model_path: Path, calib_path: Path, cache_path: Path) -> None:
    """The calibration JSON and the TensorRT cache agree with the model and with each other."""
    loaded = model.load_model(model_path)
    names = model.activation_tensors(loaded.proto)
    doc = json.loads(calib_path.read_text())

    assert doc["format"] == "qtool.calibration"
    assert doc["model"]["sha256"] == loaded.sha256  # the .onnx bytes, then any external data files
    assert doc["samples"] == N_IMAGES
    assert list(doc["tensors"]) == names
    for name, t in doc["tensors"].items():
        counts = t["histogram"]["counts"]
        bin_width = t["histogram"]["range"][1] / len(counts)
        bound = max(abs(t["min"]), abs(t["max"])) + bin_width
        assert math.isfinite(t["amax"]) and 0 <= t["amax"] <= bound, (name, t["amax"], bound)
        assert t["nonfinite"] == 0, name

    header, entries = read_cache(cache_path.read_text())
    assert header["algorithm"] == "EntropyCalibration2"
    assert list(entries) == names
    signed = {t.name: t.threshold("entropy", unsigned=False) for t in load_calibration(calib_path).tensors}
    for name, cached in entries.items():
        amax = doc["tensors"][name]["amax"]
        if doc["tensors"][name]["unsigned"]:  # TensorRT's grid is signed: searched again with 128 levels
            amax = signed[name]
        assert signed[name] == pytest.approx(amax)
        expected = amax if amax > 0 else ZERO_AMAX_FALLBACK
        assert cached == pytest.approx(expected, rel=1e-6), name


# --------------------------------------------------------------------------
# models that images can feed
# --------------------------------------------------------------------------
def _yolo17(d: Path):
    return _save(zoo.yolo_like(), d / "yolo17.onnx"), ["--size", "64x96"]


def _yolo11(d: Path):
    return _save(zoo.yolo_like(opset=11), d / "yolo11.onnx"), ["--size", "64x96"]


def _paddle(d: Path):
    args = ["--size", "32x64", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"]
    return _save(zoo.paddle_ocr_like(), d / "paddle_ocr.onnx"), args


def _nhwc(d: Path):
    return _save(zoo.nhwc_model(), d / "tf_nhwc.onnx"), []


def _external(d: Path):
    return Path(zoo.external_data_model(d / "ext")), []


@pytest.mark.parametrize("build", [_yolo17, _yolo11, _paddle, _nhwc, _external],
                         ids=["yolo17", "yolo11", "paddle", "nhwc", "external_data"])
def test_calibrate_real_world_model(tmp_path, images, build):
    model_path, extra = build(tmp_path)
    calib, cache = tmp_path / "out.calib.json", tmp_path / "out.cache"
    result = _invoke(model_path, "--images", images, *extra, "-o", calib, "--trt-table", cache)
    _ok(result)
    _check_calibration(model_path, calib, cache)


def test_nhwc_layout_is_inferred(tmp_path, images):
    model_path, _ = _nhwc(tmp_path)
    calib = tmp_path / "nhwc.calib.json"
    _ok(_invoke(model_path, "--images", images, "-o", calib))
    pre = json.loads(calib.read_text())["preprocess"]
    assert (pre["layout"], pre["height"], pre["width"], pre["channels"]) == ("nhwc", 16, 16, 3)


# --------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------
def test_dynamic_size_without_size_option(tmp_path, images, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output would land here
    model_path, _ = _yolo17(tmp_path)
    calib, cache = tmp_path / "out.calib.json", tmp_path / "out.cache"
    message = _user_error(_invoke(model_path, "--images", images, "-o", calib, "--trt-table", cache))
    assert "--size" in message
    assert not calib.exists() and not cache.exists()
    assert not list(tmp_path.glob("*.calib.json"))
    _user_error(_invoke(model_path, "--images", images))  # default -o path
    assert not list(tmp_path.glob("*.calib.json"))


def test_four_channel_model_is_refused(tmp_path, images):
    model_path = _save(zoo.control_flow_model(), tmp_path / "control_flow.onnx")
    calib = tmp_path / "cf.calib.json"
    message = _user_error(_invoke(model_path, "--images", images, "-o", calib))
    assert "4 channels" in message and "1 or 3" in message
    assert not calib.exists()


def test_control_flow_model_calibrates_through_the_library():
    m = zoo.control_flow_model()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    session = onnxruntime.session(model.with_outputs(m, names, types))
    batch = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)

    hists, seen = collect.collect(session, collect.Plan(names, 2048), [({"x": batch}, 1)])
    assert seen == 1

    assert list(hists) == names
    values = dict(zip(names, session.run(names, {"x": batch})))
    for name, h in hists.items():
        v = values[name]
        assert h.size == v.size and int(h.counts.sum()) == v.size, name
        assert (h.min, h.max) == (float(v.min()), float(v.max())), name


def test_worker_count_does_not_change_histograms_or_statistics():
    """Workers fill their own accumulators, merged at the end: any split of the batches among any
    number of workers, and of a run's outputs among the threads of a worker (spread), gives the
    same histograms and per-sample statistics, static and derived tensors included."""
    m = zoo.yolo_like()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    static = frozenset(names) - model.data_dependent(m)
    rng = np.random.default_rng(5)
    batches = [({"images": rng.random((2, 3, 64, 96), dtype=np.float32) * 2 - 0.5}, 2) for _ in range(5)]
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    derived = collect.derivations(m, names, types, static, new_stats(m, names))
    assert any(d.op == "Mul" for d in derived.values())
    results = []
    for workers, spread in ((1, 1), (2, 1), (3, 1), (1, 2), (2, 3)):
        stats = new_stats(m, names)
        hists, seen = collect.collect(session, collect.Plan(names, 2048, static, derived=derived), iter(batches), stats=stats,
                                      schedule=collect.Schedule(workers, spread))
        results.append((seen, {n: (h.top, h.counts.tolist(), h.min, h.max, h.size) for n, h in hists.items()},
                        {n: st.to_json() for n, st in stats.items()}))
    assert results[0][0] == 10 and static and any("channel_sums" in st for st in results[0][2].values())
    assert all(r == results[0] for r in results[1:])


@pytest.mark.parametrize("build, shape", [(zoo.yolo_like, (2, 3, 64, 96)), (zoo.paddle_ocr_like, (2, 3, 48, 64))])
def test_derived_tensors_equal_fetched_ones(build, shape):
    """Concat outputs summed from their parts and Add/Mul outputs computed from their inputs (with
    broadcasting: the paddle model's squeeze-excitation gates) give the same histograms, min/max
    and per-sample statistics, channel means included, as fetching them from onnxruntime."""
    m = build()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    static = frozenset(names) - model.data_dependent(m)
    stats = new_stats(m, names)
    plan = collect.derivations(m, names, types, static, stats)
    ops = [d.op for d in plan.values()]
    assert ops.count("Mul") >= 10 and ops.count("Add") >= 1
    assert any(d.constant for d in plan.values())  # Mul by a stride, the paddle model's scale/bias pairs
    if build is zoo.yolo_like:
        assert ops.count("concat") >= 3 and any(stats[out].axis == 1 for out, d in plan.items() if d.op == "concat")
    rng = np.random.default_rng(6)
    feed = m.graph.input[0].name
    batches = [({feed: rng.random(shape, dtype=np.float32)}, 2) for _ in range(3)]
    batches[1][0][feed][1, 0, :4, :4] = np.nan  # non-finite values in one sample
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    results = []
    for derived in ({}, plan):
        stats = new_stats(m, names)
        hists, _ = collect.collect(session, collect.Plan(names, 2048, static, derived=derived), iter(batches), stats=stats, schedule=collect.Schedule(workers=2))
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max, h.size, h.nonfinite) for n, h in hists.items()},
                        {n: st.to_json() for n, st in stats.items()}))
    assert list(results[1][0]) == names
    assert results[0] == results[1]


def test_split_inputs_are_summed_from_their_outputs():
    """x -> Conv -> c -> Split(axis 1) -> a, b -> Concat(b, a, axis 1) -> y: c and y both hold exactly
    the values of a and b (per sample), so neither is fetched, and nothing changes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(8)
    w = numpy_helper.from_array(rng.normal(0, 1, (6, 3, 3, 3)).astype(np.float32), "w")
    v = numpy_helper.from_array(rng.normal(0, 1, (2, 6, 1, 1)).astype(np.float32), "v")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Split", ["c"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["b", "a"], ["y"], axis=1),
             helper.make_node("Conv", ["y", "v"], ["z"])]
    g = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[w, v])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    names = model.activation_tensors(m)
    plan = collect.derivations(m, names, model.tensor_types(m), frozenset(), new_stats(m, names))
    assert plan == {"c": collect.Derived("concat", ("a", "b")), "y": collect.Derived("concat", ("b", "a"))}
    batches = [({"x": rng.normal(0, 1, (3, 3, 8, 8)).astype(np.float32)}, 3) for _ in range(2)]
    session = onnxruntime.session(model.with_outputs(m, names, model.tensor_types(m)), threads=1)
    results = []
    for derived in ({}, plan):
        stats = new_stats(m, names)
        hists, _ = collect.collect(session, collect.Plan(names, 256, derived=derived), iter(batches), stats=stats)
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max, h.size) for n, h in hists.items()},
                        {n: st.to_json() for n, st in stats.items()}))
    assert "channel_sums" in results[0][1]["y"] and results[0] == results[1]


def test_a_concatenation_with_an_empty_part_gets_the_others():
    """Split into 3, 0 and 3 channels, Concat back: the empty part adds nothing, and the
    concatenation's statistics (gathered once all its parts are in) come from the other two."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.normal(0, 1, (6, 3, 3, 3)).astype(np.float32), "w")
    v = numpy_helper.from_array(rng.normal(0, 1, (2, 6, 1, 1)).astype(np.float32), "v")
    sizes = numpy_helper.from_array(np.array([3, 0, 3], np.int64), "sizes")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Split", ["c", "sizes"], ["a", "e", "b"], axis=1),
             helper.make_node("Concat", ["b", "e", "a"], ["y"], axis=1),
             helper.make_node("Conv", ["y", "v"], ["z"])]
    g = helper.make_graph(nodes, "split0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], initializer=[w, v, sizes])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    names = model.activation_tensors(m)
    types = model.tensor_types(m)
    plan = collect.derivations(m, names, types, frozenset(), new_stats(m, names))
    assert plan["y"] == collect.Derived("concat", ("b", "e", "a"))
    batches = [({"x": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)}, 2) for _ in range(2)]
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    results = []
    for derived, spread in (({}, 1), (plan, 1), (plan, 2)):
        stats = new_stats(m, names)
        hists, _ = collect.collect(session, collect.Plan(names, 256, derived=derived), iter(batches), stats=stats, schedule=collect.Schedule(spread=spread))
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max, h.size) for n, h in hists.items()},
                        {n: st.to_json() for n, st in stats.items()}))
    assert results[0][0]["e"][4] == 0 and len(results[0][1]["y"]["channel_sums"]) == 6
    assert results[0] == results[1] == results[2]


def test_a_worker_error_stops_collection():
    m = zoo.tiny_relu_model()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    name = m.graph.input[0].name
    dims = [d.dim_value or 1 for d in m.graph.input[0].type.tensor_type.shape.dim]
    good = ({name: np.ones(dims, np.float32)}, 1)
    bad = ({name: np.ones([d + 1 for d in dims], np.float32)}, 1)  # wrong shape: onnxruntime refuses it

    def runs():
        yield good
        yield bad
        for _ in range(1000):
            yield good

    with pytest.raises(QtoolError, match="onnxruntime failed"):
        collect.collect(session, collect.Plan(names, 2048), runs(), schedule=collect.Schedule(workers=2))


def test_an_input_error_while_prefetching_reaches_the_caller():
    """A lone worker with threads to spare decodes the next inputs in the background: an error
    there (an unreadable image) surfaces as it would inline, and no more inputs are taken."""
    m = zoo.yolo_like()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    taken = []

    def runs():
        for i in range(50):
            taken.append(i)
            if i == 2:
                raise QtoolError("image 2 is unreadable")
            yield {"images": np.ones((1, 3, 64, 96), np.float32)}, 1

    with pytest.raises(QtoolError, match="image 2 is unreadable"):
        collect.collect(session, collect.Plan(names, 2048), runs(), schedule=collect.Schedule(spread=2))
    assert taken == [0, 1, 2]


def test_a_lone_worker_decodes_the_next_inputs_after_its_run():
    """The background decode of a lone worker's next inputs starts once its run is done (beside
    the histograms), never while onnxruntime runs on every core."""
    m = zoo.yolo_like()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    events = []

    class Logged:
        def run(self, outputs, feeds):
            events.append(("run", int(feeds["images"][0, 0, 0, 0])))
            out = session.run(outputs, feeds)
            events.append(("ran", int(feeds["images"][0, 0, 0, 0])))
            return out

    def runs():
        for i in range(6):
            events.append(("decode", i))
            yield {"images": np.full((1, 3, 64, 96), i, np.float32)}, 1

    collect.collect(Logged(), collect.Plan(names, 2048), runs(), schedule=collect.Schedule(spread=2, kernel=False))
    for i in range(1, 6):
        assert events.index(("decode", i)) > events.index(("ran", i - 1)), events


def test_an_error_on_a_helper_thread_reaches_the_caller():
    """An error histogramming one tensor on a worker's helper thread (spread) stops the run and
    is raised, not lost in the thread."""
    m = zoo.yolo_like()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    session = onnxruntime.session(model.with_outputs(m, names, types), threads=1)
    x = np.ones((1, 3, 64, 96), np.float32)

    class Broken(collect.TensorHistogram):
        def update(self, *args, **kwargs):
            if threading.current_thread().name.startswith("qtool-fill"):
                raise RuntimeError("broken histogram")
            return super().update(*args, **kwargs)

    original = collect.TensorHistogram
    collect.TensorHistogram = Broken
    try:
        with pytest.raises(RuntimeError, match="broken histogram"):
            collect.collect(session, collect.Plan(names, 2048), iter([({"images": x}, 1)] * 3), schedule=collect.Schedule(spread=2))
    finally:
        collect.TensorHistogram = original


# --------------------------------------------------------------------------
# invariance: batch size and image order do not change the calibration file
# --------------------------------------------------------------------------
def test_batch_size_and_order_invariance(tmp_path):
    model_path, extra = _yolo17(tmp_path)
    pictures = _noise_images(seed=7)
    forward = _write_images(tmp_path / "forward", [f"a_{i}.png" for i in range(N_IMAGES)], pictures)
    # the same pictures under names that sort in the reverse order
    backward = _write_images(tmp_path / "backward", [f"b_{N_IMAGES - i}.png" for i in range(N_IMAGES)], pictures)

    outputs = {}
    for label, folder, batch in [("fwd_b1", forward, 1), ("fwd_b4", forward, 4), ("bwd_b1", backward, 1),
                                 ("bwd_b4", backward, 4), ("fwd_default", forward, None)]:
        out = tmp_path / f"{label}.calib.json"
        batch_args = ["--batch-size", batch] if batch else []
        _ok(_invoke(model_path, "--images", folder, *extra, *batch_args, "-o", out))
        outputs[label] = out.read_bytes()

    for label, data in outputs.items():
        _assert_same_calibration(label, data, outputs["fwd_b1"])


def test_image_count_not_a_multiple_of_the_batch(tmp_path):
    """Dynamic batch: 6 images run as 6 (default 8) or 4 + 2 and give the file batch size 1 gives."""
    model_path, extra = _yolo17(tmp_path)
    folder = _write_images(tmp_path / "six", [f"img_{i}.png" for i in range(6)], _noise_images(seed=3, n=6))
    outputs = {}
    for batch in (1, 4, None):
        out = tmp_path / f"b{batch}.calib.json"
        batch_args = ["--batch-size", batch] if batch else []
        _ok(_invoke(model_path, "--images", folder, *extra, *batch_args, "-o", out))
        outputs[batch] = out.read_bytes()
    assert json.loads(outputs[1])["samples"] == 6
    _assert_same_calibration("--batch-size 4", outputs[4], outputs[1])
    _assert_same_calibration("default batch", outputs[None], outputs[1])
