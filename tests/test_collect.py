"""Collection: --data inputs, shards and merge, auto batch size, non-finite and zero tensors."""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper
from runcli import invoke as run

from qtool.calibration import load
from qtool.statistics import histogram

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"


def ok(*args):
    r = run(*args)
    assert r.exit_code == 0, r.output
    return r


def fail(*args, needle):
    r = run(*args)
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
    return lines[0]


@pytest.fixture
def digits(sample_images):
    """The first 30 sample images, in a folder of their own."""
    return sample_images(30)


def test_shards_merge_to_the_single_run_file(tmp_path, digits):
    ok("calibrate", SAMPLE, "--images", digits, "-o", tmp_path / "all.calib.json")
    parts = []
    for k in (1, 2, 3):
        part = tmp_path / f"s{k}.calib.json"
        ok("calibrate", SAMPLE, "--images", digits, "--shard", f"{k}/3", "-o", part)
        assert load(part).samples == 10 and json.loads(part.read_text())["shard"] == f"{k}/3"
        parts.append(part)
    ok("merge", parts[2], parts[0], parts[1], "-o", tmp_path / "merged.calib.json")
    assert (tmp_path / "merged.calib.json").read_bytes() == (tmp_path / "all.calib.json").read_bytes()


def test_merge_refuses_mismatched_files(tmp_path, digits):
    a, b = tmp_path / "a.calib.json", tmp_path / "b.calib.json"
    ok("calibrate", SAMPLE, "--images", digits, "--shard", "1/2", "-o", a)
    ok("calibrate", SAMPLE, "--images", digits, "--shard", "1/2", "--method", "max", "-o", b)
    fail("merge", a, b, "-o", tmp_path / "m.json", needle="method")
    fail("merge", a, a, "-o", tmp_path / "m.json", needle="twice")
    assert not (tmp_path / "m.json").exists()


def test_auto_batch_size_equals_batch_one(tmp_path, digits):
    r = ok("calibrate", SAMPLE, "--images", digits, "-o", tmp_path / "auto.calib.json", "--json")
    assert json.loads(r.stdout)["batch_size"] > 1
    ok("calibrate", SAMPLE, "--images", digits, "-o", tmp_path / "one.calib.json", "--batch-size", "1")
    assert (tmp_path / "auto.calib.json").read_bytes() == (tmp_path / "one.calib.json").read_bytes()


def test_channel_pairs_do_not_depend_on_batch_size_or_shards(tmp_path):
    """A 3-channel stem's input gets the joint histogram of its first channel pair, over every
    pixel seen: the same bytes in batches of one as in batches of four, and the same numbers from
    two shards merged."""
    from test_openvino import noise_images

    path = tmp_path / "yolo_like.onnx"
    onnx.save(zoo.yolo_like(), path)
    images = noise_images(tmp_path / "noise", n=6)
    one, four = tmp_path / "one.json", tmp_path / "four.json"
    ok("-q", "calibrate", path, "--images", images, "--size", "64x64", "-o", one, "--batch-size", "1")
    ok("-q", "calibrate", path, "--images", images, "--size", "64x64", "-o", four, "--batch-size", "4")
    assert one.read_bytes() == four.read_bytes()
    shards = [tmp_path / f"s{k}.json" for k in (1, 2)]
    for k, out in enumerate(shards, 1):
        ok("-q", "calibrate", path, "--images", images, "--size", "64x64", "-o", out, "--shard", f"{k}/2")
    ok("-q", "merge", *shards, "-o", tmp_path / "merged.json")

    def joint(f):
        return [t["per_sample"]["channel_pairs"] for t in json.loads(f.read_text())["tensors"].values()
                if "channel_pairs" in t.get("per_sample", {})]

    assert joint(tmp_path / "merged.json") == joint(one)
    assert len(joint(one)) == 1 and len(joint(one)[0]["pairs"]) == 1
    assert sum(joint(one)[0]["pairs"][0][1::2]) == 6 * 64 * 64


def test_npy_data_with_and_without_batch_axis(tmp_path):
    m = tmp_path / "cf.onnx"
    onnx.save(zoo.control_flow_model(), m)  # 4 channels: images cannot feed it
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((4, 8, 8)).astype(np.float32) for _ in range(5)]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for i, s in enumerate(samples):
        np.save(tmp_path / "a" / f"{i}.npy", s)
        np.save(tmp_path / "b" / f"{i}.npy", s[None].astype(np.float64))  # batch axis, float64
    ok("calibrate", m, "--data", tmp_path / "a", "-o", tmp_path / "a.calib.json")
    ok("calibrate", m, "--data", tmp_path / "b", "-o", tmp_path / "b.calib.json")
    a = (tmp_path / "a.calib.json").read_bytes()
    assert a == (tmp_path / "b.calib.json").read_bytes()
    cal = load(tmp_path / "a.calib.json")
    assert cal.samples == 5 and cal.preprocess == {"source": "data", "inputs": ["x"]}
    assert cal.tensors[0].name == "x" and sum(cal.tensors[0].counts) == 5 * 4 * 8 * 8


def test_npz_multi_input_model_with_int64_input(tmp_path):
    m = tmp_path / "mi.onnx"
    onnx.save(zoo.int_input_model(), m)
    rng = np.random.default_rng(1)
    (tmp_path / "d").mkdir()
    for i in range(4):
        np.savez(tmp_path / "d" / f"{i}.npz", image=rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
                 scale_id=np.array([i % 4], np.int64))
    ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "mi.calib.json")
    names = [t.name for t in load(tmp_path / "mi.calib.json").tensors]
    assert "image" in names and "scale_id" not in names


def test_dynamic_shapes_change_between_runs(tmp_path):
    m = tmp_path / "yolo.onnx"
    onnx.save(zoo.yolo_like(), m)
    rng = np.random.default_rng(2)
    (tmp_path / "d").mkdir()
    for i, (h, w) in enumerate([(64, 96), (32, 32), (96, 64)]):
        np.save(tmp_path / "d" / f"{i}.npy", rng.random((1, 3, h, w), dtype=np.float32))
    ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "y.calib.json")
    assert load(tmp_path / "y.calib.json").samples == 3


def test_the_kernel_loads_when_the_first_run_says_the_calibration_bins_enough(tmp_path, monkeypatch):
    """Data files whose activations' sizes shape inference cannot tell: whether to load the
    compiled kernel (~100 MB) is decided from the bytes the first run fetched, times the files."""
    from qtool.collection import pipeline
    from qtool.runtime import onnxruntime

    m = tmp_path / "yolo.onnx"
    onnx.save(zoo.yolo_like(), m)
    (tmp_path / "d").mkdir()
    for i in range(3):
        np.save(tmp_path / "d" / f"{i}.npy", np.random.default_rng(i).random((1, 3, 64, 64), dtype=np.float32))
    fetched, loads = [], []
    real = onnxruntime.run

    def run(session, names, feeds):
        values = real(session, names, feeds)
        fetched.append(sum(v.nbytes for v in values))
        return values

    monkeypatch.setattr(onnxruntime, "run", run)
    monkeypatch.setattr(histogram, "start_loading", lambda: loads.append(len(fetched)))
    # sizes shape inference cannot tell (segments.sizes computes the yolo look-alike's from its
    # grid's shapes; a model whose shapes depend on its inputs' values has none)
    monkeypatch.setattr(pipeline.segments, "sizes", lambda proto, names, dims, *rest: {})
    monkeypatch.setattr(pipeline, "_kernel_fits", lambda plain: True)  # the bytes rule alone (its memory: test_kernel_memory)
    out, first = [], None
    for limit in ("none", "above", "at"):  # the threshold: beyond any, just above the estimate, at it
        monkeypatch.setattr(pipeline, "KERNEL_BYTES", 1 << 40 if first is None else 3 * first + (limit == "above"))
        fetched.clear()
        ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / f"{limit}.calib.json")
        first = fetched[0]
        out.append((tmp_path / f"{limit}.calib.json").read_bytes())
    assert loads == [1], loads  # only at the threshold, once the first run was fetched
    assert out[0] == out[1] == out[2]


def _unary_model(path, op, **attrs):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])
    zero = numpy_helper.from_array(np.zeros(1, np.float32), "zero")
    nodes = [helper.make_node(op, ["x"], ["y"], **attrs), helper.make_node("Mul", ["x", "zero"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x], [y, z], [zero])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_all_zero_warning_leaves_out_shape_derived_tensors(tmp_path):
    """A zero tensor made from the input's shape alone (ConstantOfShape, as YOLO exports build
    their grids) is nothing the user can act on: no warning; one computed from the input is."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("y", "z")]
    zero = numpy_helper.from_array(np.zeros(1, np.float32), "zero")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("ConstantOfShape", ["shape"], ["grid"], value=numpy_helper.from_array(np.zeros(1, np.float32))),
             helper.make_node("Add", ["x", "grid"], ["y"]),
             helper.make_node("Mul", ["x", "zero"], ["z"])]
    m = tmp_path / "grid.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], outs, [zero]), opset_imports=[helper.make_opsetid("", 13)],
                                ir_version=8), m)
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "0.npy", np.array([[0.5, 1.0, -1.0, 2.0]], np.float32))
    r = ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "g.calib.json")
    cal = {t.name: t for t in load(tmp_path / "g.calib.json").tensors}
    assert cal["grid"].amax == 0 and cal["z"].amax == 0  # both calibrated, both zero
    warning = [line for line in r.output.splitlines() if "all zero" in line]
    assert len(warning) == 1 and "1 tensor(s)" in warning[0] and warning[0].endswith(": z"), r.output


def test_nonfinite_and_all_zero_tensors(tmp_path):
    m = _unary_model(tmp_path / "log.onnx", "Log")
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "0.npy", np.array([[0.0, 1.0, -1.0, 2.0]], np.float32))  # log: -inf, 0, nan, 0.69
    r = ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "l.calib.json")
    assert "NaN/inf" in r.output and "all zero" in r.output
    cal = {t.name: t for t in load(tmp_path / "l.calib.json").tensors}
    assert cal["y"].nonfinite == 2 and sum(cal["y"].counts) == 2
    assert cal["y"].min == 0.0 and cal["y"].max == pytest.approx(np.log(2.0))
    assert cal["z"].amax == 0.0 and np.isfinite(cal["z"].amax)


def test_bad_data_inputs(tmp_path):
    mi = tmp_path / "mi.onnx"
    onnx.save(zoo.int_input_model(), mi)
    cf = tmp_path / "cf.onnx"
    onnx.save(zoo.control_flow_model(), cf)
    d = {k: tmp_path / k for k in ("npz", "rank", "npy2", "dtype", "empty", "corrupt")}
    for p in d.values():
        p.mkdir()
    np.savez(d["npz"] / "0.npz", image=np.zeros((1, 3, 8, 8), np.float32))
    np.save(d["rank"] / "0.npy", np.zeros((8, 8), np.float32))
    np.save(d["npy2"] / "0.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.savez(d["dtype"] / "0.npz", image=np.zeros((1, 3, 8, 8), np.float32), scale_id=np.array([0.5]))
    (d["corrupt"] / "0.npy").write_bytes(b"\x93NUMPY garbage")
    out = tmp_path / "o.calib.json"
    fail("calibrate", mi, "--data", d["npz"], "-o", out, needle="scale_id")
    fail("calibrate", cf, "--data", d["rank"], "-o", out, needle="rank 4")
    fail("calibrate", mi, "--data", d["npy2"], "-o", out, needle=".npz")
    fail("calibrate", mi, "--data", d["dtype"], "-o", out, needle="int64")
    fail("calibrate", cf, "--data", d["empty"], "-o", out, needle="no .npy or .npz")
    fail("calibrate", cf, "--data", d["corrupt"], "-o", out, needle="cannot read")
    fail("calibrate", cf, "--data", d["empty"], "--images", d["empty"], "-o", out, needle="exactly one")
    fail("calibrate", SAMPLE, "--images", IMAGES, "--shard", "4/3", "-o", out, needle="K <= N")
    assert not out.exists()


def test_on_bad_image_skip(tmp_path, digits):
    (digits / "digit_0003.png").write_bytes(b"not a png")
    out = tmp_path / "s.calib.json"
    fail("calibrate", SAMPLE, "--images", digits, "-o", out, needle="digit_0003.png")
    r = ok("calibrate", SAMPLE, "--images", digits, "-o", out, "--on-bad-image", "skip")
    assert "skipped 1 unreadable image" in r.output and "digit_0003.png" in r.output
    assert load(out).samples == 29
    (digits / "digit_0003.png").unlink()
    ok("calibrate", SAMPLE, "--images", digits, "-o", tmp_path / "ref.calib.json")
    assert out.read_bytes() == (tmp_path / "ref.calib.json").read_bytes()


@pytest.mark.parametrize("build,make_sample", [
    ("transformer_like", lambda rng, i: {"input_ids": rng.integers(0, 50, (1, 5 + i), dtype=np.int64)}),
    ("lstm_like", lambda rng, i: {"features": rng.standard_normal((4 + i, 1, 8)).astype(np.float32),
                                  "h0": np.zeros((1, 1, 12), np.float32), "c0": np.zeros((1, 1, 12), np.float32)}),
    ("audio_like", lambda rng, i: {"waveform": rng.standard_normal((1, 800 + 40 * i)).astype(np.float32),
                                   "sample_rate": np.array(8000 * (1 + i % 2), np.int64)}),
], ids=["transformer", "recurrent", "audio"])
def test_non_image_models_calibrate(tmp_path, build, make_sample):
    m = tmp_path / f"{build}.onnx"
    onnx.save(getattr(zoo, build)(), m)
    rng = np.random.default_rng(4)
    (tmp_path / "d").mkdir()
    for i in range(4):  # sequence lengths differ from file to file
        np.savez(tmp_path / "d" / f"{i}.npz", **make_sample(rng, i))
    ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "c.calib.json", "--trt-table", tmp_path / "c.cache")
    cal = load(tmp_path / "c.calib.json")
    assert cal.samples == 4 and all(np.isfinite(t.amax) for t in cal.tensors)
    names = [t.name for t in cal.tensors]
    assert "input_ids" not in names and "sample_rate" not in names  # integer inputs pass through
    assert all(sum(t.counts) > 0 for t in cal.tensors)


# ---------------------------------------------------------------- pinned numbers
# Every number calibrate writes (histograms, min/max, amax, per-sample statistics), as SHA-256 of
# the file's tensors section, pinned with the code of before the collection speedups (issue 18);
# the channel pairs' joint histograms came later (issue 43) and are left out of the pins (their
# invariance: test_channel_pairs_do_not_depend_on_batch_size_or_workers).
# onnxruntime's kernels may compute other bits on another CPU or version: the pins hold where
# the fingerprint of onnxruntime's own activations (every tensor, on fixed random inputs) matches.

PINNED = {
    # name: {activation fingerprint: tensors SHA-256}, one entry per kind of CPU whose onnxruntime kernels compute the model's
    # activations differently (the fingerprint tells them apart): an AVX-512 VNNI CPU's, then an AVX2-only AMD EPYC's
    "digits": {"f8a6918ef816482f52bd55707cf20a2739e30c43c1288d2a515ff38a10cb470d": "b9f8cbc9292d20c8f1840be5ebb6d0fd08da28af13e22a133948326f62caebbf",
               "3ca398a0a1ee8f1952cf2aac6ebd54767d98c8c2e2d718a1780967d327a2ac3e": "37b4d9b14d2566f67e0282ece0050cdbeec5aa82cd35661c714f300a5b2bdc93"},
    "yolo_like": {"36119771e6c4d3d2081c002cc75b86dc048be5fc0e18c36361c83031b93cb604": "8ca44050b19b3f5d6cfad8cd92e2a5428b358772ee8f32f9de142cfa57ad8a27",
                  "416e414229bcb835404af14178b705b0d2a94ae5bdf58d8abf7354413ee31ad7": "323442892bc5158d833675e03d8b22457b73e88280c52c7c72aeaca0b69279da"},
    "yolo_like_large": {"3b59dbea1399f5d6694f1de919a01626477cf11ae3b5921ece2647d776e0d649": "5d66729cb22b0aac2884e1cfd9ec855d66d16f233a1339001d5e9314191a555b",
                        "ff746abcff590811177949ad191c62188b0d8c8504dd769d820f1d102f031c20": "6455384175d2be6b53541936bdda631fb8b1dcd7b0683c9d370fd0fc8853bc1e"},
    "paddle_ocr_like": {"5ef9dc786e7e5e8844b3e271a68f6250552d0186a339a87eb6d5d3e625426e5e": "602104a070ccce788b3cba9764ac38898904f448e93daa9133d13f14bc250a5c",
                        "c1f3e5e9158ebc5da8eec23f32d3f7b955582aac9fff33de6fbdccf853a1bc44": "2e81692be876dad8977338a1614ed1f71681b568a4d535e8a0f025033c7c70f2"},
}


def _fingerprint(path: Path, shape: tuple) -> str:
    import hashlib

    import onnxruntime as ort

    from qtool import model as qmodel

    proto = onnx.load(str(path))
    types = qmodel.tensor_types(proto)
    names = qmodel.activation_tensors(proto, types)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(qmodel.with_outputs(proto, names, types).SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    digest = hashlib.sha256()
    for v in sess.run(names, {sess.get_inputs()[0].name: x}):
        digest.update(np.ascontiguousarray(v).tobytes())
    return digest.hexdigest()


def _pinned_case(name, tmp_path):
    from test_openvino import noise_images

    if name == "digits":
        return SAMPLE, IMAGES, [], (2, 1, 32, 32)
    build = name.removesuffix("_large")
    path = tmp_path / f"{build}.onnx"
    onnx.save(getattr(zoo, build)(), path)
    if name.endswith("_large"):  # tensors for the compiled kernels, which so short a run would not load
        histogram.start_loading()
        histogram.wait_for_kernel()
    h, w = {"yolo_like": (96, 128), "yolo_like_large": (320, 384), "paddle_ocr_like": (48, 160)}[name]
    return path, noise_images(tmp_path / "noise", n=12), ["--size", f"{h}x{w}"], (2, 3, h, w)


@pytest.mark.parametrize("name", list(PINNED))
def test_calibration_numbers_are_pinned(tmp_path, name):
    import hashlib

    path, images, extra, shape = _pinned_case(name, tmp_path)
    out = tmp_path / "c.calib.json"
    ok("-q", "calibrate", path, "--images", images, "-o", out, *extra)
    tensors = json.loads(out.read_text())["tensors"]
    for t in tensors.values():
        t.get("per_sample", {}).pop("channel_pairs", None)
        t.get("per_sample", {}).pop("top_absmax", None)  # since s24 (#tail24); the pins are of the files before it
    got = hashlib.sha256(json.dumps(tensors, sort_keys=True).encode()).hexdigest()
    here = _fingerprint(path, shape)
    if here not in PINNED[name]:
        pytest.skip(f"onnxruntime computes other activations here ({here[:12]}): no pin for this kind of CPU")
    expected = PINNED[name][here]
    assert any("channel_sums" in t.get("per_sample", {}) for t in tensors.values())
    assert got == expected


def _two_layer() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((64, 64), 0.01, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_session_does_not_keep_the_model_bytes():
    """onnxruntime's Python session keeps the bytes it was made from for its life (to make itself
    again when providers change): a copy of the model beside onnxruntime's own, dropped here."""
    from qtool.runtime import onnxruntime

    proto = _two_layer()
    for model in (proto, proto.SerializeToString()):
        session = onnxruntime.session(model, threads=1)
        assert getattr(session, "_model_bytes", None) is None
        y = session.run(None, {"x": np.ones((1, 64), np.float32)})[0]
        np.testing.assert_allclose(y, np.full((1, 64), 0.64, np.float32), rtol=1e-6)


def test_tensors_are_exposed_on_the_model_itself_and_put_back():
    """Calibration exposes its tensors as outputs of the loaded model itself, not of a copy (which
    held the weights twice while sessions were made), and leaves its outputs as they were, also
    when what it does in between fails."""
    from qtool import model

    proto = _two_layer()
    before = proto.SerializeToString()
    with model.exposing(proto, ["h", "y"], {"h": TensorProto.FLOAT, "y": TensorProto.FLOAT}) as exposed:
        assert exposed is proto
        assert [o.name for o in proto.graph.output] == ["y", "h"]
        assert exposed.SerializeToString() == model.with_outputs(onnx.ModelProto.FromString(before), ["h", "y"],
                                                                  {"h": 1, "y": 1}).SerializeToString()
    assert proto.SerializeToString() == before
    with pytest.raises(RuntimeError), model.exposing(proto, ["h"], {"h": TensorProto.FLOAT}):
        raise RuntimeError
    assert proto.SerializeToString() == before


def test_a_calibration_on_data_files_imports_no_image_or_page_library(tmp_path):
    """The command line's calibrate on .npy files, off a terminal, loads neither Pillow (image
    decoding), jinja2 (the report's page) nor tqdm (no bar to show): 6 MB of a small model's process
    that its runs never use."""
    import subprocess
    import sys

    data = tmp_path / "data"
    data.mkdir()
    x = np.load(Path(__file__).parent.parent / "sample_models" / "digits_heldout.npz")["x"]
    for k in range(4):
        np.save(data / f"{k}.npy", x[k * 8:(k + 1) * 8])
    model = Path(__file__).parent.parent / "sample_models" / "digits_cnn.onnx"
    code = ("import sys\nfrom qtool.launch import main\n"
            f"sys.argv = ['qtool', 'calibrate', {str(model)!r}, '--data', {str(data)!r}, '-o', {str(tmp_path / 'c.json')!r}, '-q']\n"
            "try:\n    main()\nfinally:\n    print(sorted(m for m in ('PIL', 'jinja2', 'tqdm') if m in sys.modules))\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip().splitlines()[-1] == "[]"
    assert load(tmp_path / "c.json").samples == 32


def test_a_fetched_tensor_is_let_go_once_histogrammed(monkeypatch):
    """A run's fetched tensors go one by one, each once it is histogrammed, not all at the end of
    the run: with two workers the other's run then takes their place (madmom_beats_tcn, 64 inputs:
    364 -> 323 MB of peak RSS)."""
    import weakref

    from qtool import model
    from qtool.collection import collect
    from qtool.runtime import onnxruntime

    names = [f"t{i}" for i in range(5)]
    nodes = [helper.make_node("Relu" if i % 2 else "Neg", ["x" if i == 0 else names[i - 1]], [names[i]]) for i in range(5)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1000])],
                              [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [2, 1000])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    types = dict.fromkeys(names, TensorProto.FLOAT)
    session = onnxruntime.session(model.with_outputs(proto, names, types), threads=1)
    seen: list = []  # weak references to the tensors histogrammed so far
    alive: list[int] = []  # how many of them were still alive as each next one came
    update = histogram.TensorHistogram.update

    def watched(self, x, *args, **kwargs):
        alive.append(sum(ref() is not None for ref in seen))
        seen.append(weakref.ref(x))
        return update(self, x, *args, **kwargs)

    monkeypatch.setattr(histogram.TensorHistogram, "update", watched)
    feeds = [({"x": np.linspace(-1, 1, 2000, dtype=np.float32).reshape(2, 1000)}, 2) for _ in range(3)]
    hists, samples = collect.collect(session, collect.Plan(names, 2048), feeds, schedule=collect.Schedule(1, 1, False))
    assert samples == 6 and all(hists[n].size == 6000 for n in names)
    assert alive == [0] * 15


def test_no_run_holds_its_activations_while_the_kernel_loads(monkeypatch):
    """The binning kernel loads (numba's import, LLVM's pages: histogram.drop_clean_pages lets them
    go once it is loaded) before the first run makes its activations, not beside them
    (thai_deepcut, madmom_key_cnn: their peak was the first run's activations while it loaded)."""
    import threading
    import time

    from qtool import model
    from qtool.collection import collect
    from qtool.runtime import onnxruntime

    loaded = threading.Event()

    def slow_load():
        time.sleep(0.2)
        loaded.set()

    monkeypatch.setattr(histogram, "_load_kernel", slow_load)
    monkeypatch.setattr(histogram, "_loader", None)
    names = ["h", "y"]
    proto = _two_layer()
    session = onnxruntime.session(model.with_outputs(proto, names, dict.fromkeys(names, TensorProto.FLOAT)), threads=1)
    ran_before_load: list[bool] = []

    class Watched:
        def run(self, fetch, feeds):
            ran_before_load.append(not loaded.is_set())
            return session.run(fetch, feeds)

    feeds = [({"x": np.ones((1, 64), np.float32)}, 1) for _ in range(3)]
    collect.collect(Watched(), collect.Plan(names, 2048), feeds, schedule=collect.Schedule(1, 1, True))
    assert ran_before_load == [False] * 3


def test_worker_threads_add_to_one_gram_per_tensor(monkeypatch):
    """A transformer's Grams (X^T X of its linear layers' inputs) are most of what calibrate holds
    (svtrv2_captcha: 220 MiB a worker): the worker threads add to one Gram per tensor, each under
    that tensor's lock, and the exact sums are those of one worker."""
    import time

    from qtool import model
    from qtool.collection import collect
    from qtool.runtime import onnxruntime
    from qtool.statistics import gram as gram_mod
    from qtool.statistics.stats import new_stats

    rng = np.random.default_rng(16)
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "t", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "t", 32])], [w])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    names = ["x", "h", "y"]
    types = dict.fromkeys(names, TensorProto.FLOAT)
    session = onnxruntime.session(model.with_outputs(proto, names, types), threads=1)
    grams: dict[int, set] = {}
    update = gram_mod.Gram.update

    def watched(self, value, rows):
        grams.setdefault(self.channels, set()).add(id(self))
        time.sleep(0.02)  # the other worker takes the next run meanwhile
        return update(self, value, rows)

    monkeypatch.setattr(gram_mod.Gram, "update", watched)
    feeds = [({"x": rng.standard_normal((1, 50 + k, 32)).astype(np.float32)}, 1) for k in range(8)]
    docs = []
    for workers in (1, 2):
        stats = new_stats(proto, names, smooth=True)
        assert stats["h"].gram is not None
        grams.clear()
        collect.collect(session, collect.Plan(names, 2048), feeds, stats=stats, schedule=collect.Schedule(workers, 1, False))
        assert len(grams[32]) == 1  # one Gram for h, whichever worker ran
        docs.append(stats["h"].gram.to_json())
    assert docs[0]["upper"] == docs[1]["upper"] and docs[0]["count"] == docs[1]["count"] == 8 * 50 + 28


def test_worker_threads_add_to_one_histogram_per_tensor(monkeypatch):
    """The workers share one accumulator: one histogram and one statistics record per tensor,
    each updated under that tensor's lock (one accumulator per worker held them once more each:
    OSKut's 1071 tensors, 17 MB a worker), and the counts, extrema and sums are those of one worker."""
    import time

    from qtool import model
    from qtool.collection import collect
    from qtool.runtime import onnxruntime
    from qtool.statistics.stats import new_stats

    proto = _two_layer()
    names = ["x", "h", "y"]
    session = onnxruntime.session(model.with_outputs(proto, names, dict.fromkeys(names, TensorProto.FLOAT)), threads=1)
    updated: set[int] = set()  # the histograms updated
    update = histogram.TensorHistogram.update

    def watched(self, x, *args, **kwargs):
        updated.add(id(self))
        time.sleep(0.01)  # the other worker takes the next run meanwhile
        return update(self, x, *args, **kwargs)

    monkeypatch.setattr(histogram.TensorHistogram, "update", watched)
    rng = np.random.default_rng(18)
    feeds = [({"x": (rng.standard_normal((1, 64)) * 2 ** (k % 5)).astype(np.float32)}, 1) for k in range(12)]
    found = []
    for workers in (1, 2):
        stats = new_stats(proto, names)
        updated.clear()
        hists, samples = collect.collect(session, collect.Plan(names, 2048), feeds, stats=stats,
                                         schedule=collect.Schedule(workers, 1, False))
        assert samples == 12 and len(updated) == len(names)  # one histogram each, whichever worker ran
        found.append({n: (hists[n].counts.tolist(), hists[n].top, hists[n].min, hists[n].max,
                          (stats[n].count, stats[n].min_sum, stats[n].absmax_sum, stats[n].channel_sums) if n in stats else None)
                      for n in names})
    assert found[0] == found[1]


def test_the_channel_sums_a_calibration_holds_are_complete_without_a_serialization():
    """Per-channel sums gather in pending int64 sums (stats.SampleStats._pending); collect moves them into
    channel_sums once the runs are done, whatever the workers: SmoothQuant's scaling at export reads
    channel_sums directly (one worker's calibration exported straight away gave other bias corrections than
    the same calibration after its JSON was written, which moves them)."""
    from qtool import model
    from qtool.collection import collect
    from qtool.runtime import onnxruntime
    from qtool.statistics.stats import new_stats

    proto = _two_layer()
    names = ["x", "h", "y"]
    session = onnxruntime.session(model.with_outputs(proto, names, dict.fromkeys(names, TensorProto.FLOAT)), threads=1)
    rng = np.random.default_rng(18)
    feeds = [({"x": rng.standard_normal((1, 64)).astype(np.float32)}, 1) for _ in range(5)]
    for workers in (1, 2):
        stats = new_stats(proto, names)
        collect.collect(session, collect.Plan(names, 2048), feeds, stats=stats, schedule=collect.Schedule(workers, 1, False))
        held = list(stats["x"].channel_sums)
        assert any(held) and held == stats["x"].to_json()["channel_sums"]


def _chain(path: Path, layers: int, channels: int, side: int, matmul_width: int = 0) -> None:
    """Conv 3x3 + Relu `layers` times on [1, channels, side, side] (runs that fetch far more than the model's
    weights), or with `matmul_width`, MatMuls of that square width on [1, 4, width] (weights far over the runs)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        if matmul_width:
            inits.append(numpy_helper.from_array((rng.standard_normal((matmul_width,) * 2) * 0.05).astype(np.float32), f"w{k}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]))
        else:
            inits.append(numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), f"w{k}"))
            nodes.append(helper.make_node("Conv", [x, f"w{k}"], [f"m{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"]))
        x = f"r{k}"
    shape = [1, 4, matmul_width] if matmul_width else [1, channels, side, side]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    (path.parent / "data").mkdir()
    for i in range(4):
        np.save(path.parent / "data" / f"{i}.npy", np.random.default_rng(i).random(shape).astype(np.float32))


@pytest.mark.parametrize("kind", ["activations", "weights"])
def test_runs_side_by_side_only_while_each_fetches_what_the_model_s_own_bytes_leave_room_for(tmp_path, monkeypatch, kind):
    """Each run in flight holds the activations it fetched: a small model whose every activation a run fetches
    (dfn3_enc: 63 MB a run for 2 MB of weights) ran two at a time, 3.2x plain inference's peak RSS; it now runs one
    at a time on all the cores (2.1x), while a model whose weights dwarf its runs' activations keeps its workers."""
    import qtool
    from qtool.collection import collect, pipeline

    schedules = []
    real = collect.collect

    def spy(session, plan, runs, progress, stats, schedule, helpers):  # as pipeline calls it
        schedules.append(schedule)
        return real(session, plan, runs, progress, stats, schedule, helpers)

    monkeypatch.setattr(collect, "collect", spy)
    monkeypatch.setattr(pipeline, "_cores", lambda: 4, raising=False)
    monkeypatch.setattr(pipeline, "RUN_ROOM", 1 << 20, raising=False)
    path = tmp_path / "model.onnx"
    if kind == "activations":
        _chain(path, layers=6, channels=16, side=96)  # 0.6 MB a tensor, 7 MB a run; 55 KB of weights
    else:
        _chain(path, layers=4, channels=0, side=0, matmul_width=512)  # 4 MB of weights, 64 KB a run
    qtool.calibrate(path, data=str(tmp_path / "data"))
    (schedule,) = schedules
    assert (schedule.workers, schedule.spread) == ((1, 4) if kind == "activations" else (4, 1))


def _spied(monkeypatch, seen):
    """(what `seen` makes of each schedule collect is given, the segment count of each segmented run), filled as
    calibrate runs: collect and segments.Segmented spied on."""
    from qtool.collection import collect, segments

    schedules, parts = [], []
    real, made = collect.collect, segments.Segmented

    def spy(session, plan, runs, progress, stats, schedule, helpers):  # as pipeline calls it
        schedules.append(seen(schedule))
        return real(session, plan, runs, progress, stats, schedule, helpers)

    class Counted(segments.Segmented):
        def __init__(self, segs, *args):
            parts.append(len(segs))
            made.__init__(self, segs, *args)

    monkeypatch.setattr(collect, "collect", spy)
    monkeypatch.setattr(segments, "Segmented", Counted)
    return schedules, parts


@pytest.mark.parametrize("room", ["little", "plenty"])
def test_runs_in_segments_go_side_by_side_only_while_a_segment_s_bytes_fit_beside_the_model_s(tmp_path, monkeypatch, room):
    """A run in segments holds one segment's activations at a time, and each worker beside the first
    another segment's: tabledet_obj_q (6 segments of ~280 MB for 97 MB of weights, two workers) peaked at
    6.9x plain inference's RSS, 2.45 GB of 3.9 GB with one worker. Segmented runs now go side by side by
    the rule of unsegmented ones, with the most one segment holds (segments.held) as a run's bytes."""
    import qtool
    from qtool.collection import pipeline

    schedules, parts = _spied(monkeypatch, lambda schedule: schedule)
    monkeypatch.setattr(pipeline, "_cores", lambda: 4, raising=False)
    monkeypatch.setattr(pipeline, "RUN_BYTES", 1 << 20, raising=False)  # 7 MB a run: in segments of ~1.2 MB
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 20, raising=False)
    monkeypatch.setattr(pipeline, "RUN_ROOM", (1 << 20) if room == "little" else (1 << 30), raising=False)
    path = tmp_path / "model.onnx"
    _chain(path, layers=6, channels=16, side=96)  # 0.6 MB a tensor; 55 KB of weights
    qtool.calibrate(path, data=str(tmp_path / "data"))
    (schedule,) = schedules
    assert parts and parts[0] >= 3, parts
    assert (schedule.workers, schedule.spread) == ((1, 4) if room == "little" else (4, 1))


def test_what_sizing_and_the_sessions_freed_goes_back_before_the_runs(tmp_path, monkeypatch):
    """A Paddle classifier (zoo.paddle_constant_weights_like: ppocrv5_textline_ori's Reshape of a computed shape) runs
    in one session; what sizing its runs and making its sessions freed is given back to the system (malloc_trim) once
    before the runs (ppocrv5_textline_ori held 77 MB of heap through them: 203 -> 153 MB of peak RSS with both fixes
    of docs/benchmarks.md#mem16), and the file is the same as without it."""
    from qtool import api
    from qtool.collection import collect
    from qtool.runtime import onnxruntime

    path = tmp_path / "paddle.onnx"
    onnx.save(zoo.paddle_constant_weights_like(), path)
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(31)
    for k in range(3):
        np.save(folder / f"{k}.npy", rng.standard_normal((2, 3, 16, 32)).astype(np.float32))
    files, trims, order = {}, [], []
    fill = collect._Accumulator.fill
    monkeypatch.setattr(collect._Accumulator, "fill", lambda self, *a, **k: (order.append(len(trims)), fill(self, *a, **k))[1])
    for label, trim in (("trimmed", onnxruntime.trim), ("not", lambda: None)):
        trims.clear()
        order.clear()
        monkeypatch.setattr(onnxruntime, "trim", lambda trim=trim: (trims.append(sys._getframe(1).f_code.co_name), trim()))
        out = tmp_path / f"{label}.calib.json"
        api.calibrate_files(path, data=folder, output=out)
        files[label] = out.read_bytes()
        assert trims.count("accumulate") == 1 and order == [len(trims)] * 3  # the runs' one, before the first of three
    assert files["trimmed"] == files["not"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heaps (malloc_info)")
def test_a_calibration_s_threads_allocate_in_one_heap(tmp_path):
    """onnxruntime's threads and the workers' allocate in the main heap, not each in a heap of its
    own whose leftovers stay beside the others' (thai_oskut_ws: 178 -> 167 MB of peak RSS), and
    the file is the one they write each in its own heap."""
    import subprocess

    data = tmp_path / "data"
    data.mkdir()
    x = np.load(ROOT / "sample_models" / "digits_heldout.npz")["x"]
    for k in range(8):
        np.save(data / f"{k}.npy", x[k * 4:(k + 1) * 4])
    code = (
        "import ctypes, sys\nimport qtool\nfrom qtool.collection import pipeline, segments\n"
        "pipeline._cores = lambda: 2  # two workers, whatever the machine\n"
        "if sys.argv[2] == 'own':\n    segments.M_ARENA_MAX = -99  # not a parameter: mallopt changes nothing\n"
        f"qtool.calibrate({str(SAMPLE)!r}, data={str(data)!r}).save(sys.argv[1])\n"
        "libc = ctypes.CDLL(None)\nlibc.fopen.restype = ctypes.c_void_p\nlibc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]\n"
        "libc.fclose.argtypes = [ctypes.c_void_p]\n"
        "f = libc.fopen((sys.argv[1] + '.heaps').encode(), b'w')\nlibc.malloc_info(0, f)\nlibc.fclose(f)\n"
        "print(open(sys.argv[1] + '.heaps').read().count('<heap nr='))\n")
    heaps, files = {}, {}
    for how in ("one", "own"):
        out = tmp_path / f"{how}.json"
        child = subprocess.run([sys.executable, "-c", code, str(out), how], capture_output=True, text=True, cwd=ROOT)
        assert child.returncode == 0, child.stderr
        heaps[how] = int(child.stdout.strip().splitlines()[-1])
        files[how] = json.loads(out.read_text())["tensors"]
    assert heaps["one"] == 1 and heaps["own"] > 1
    assert files["one"] == files["own"]


def test_a_run_under_run_bytes_goes_in_segments_where_twice_plain_inference_leaves_no_room_for_it(tmp_path, monkeypatch):
    """A run of fewer than RUN_BYTES that would take calibrate past twice plain inference's peak (estimated
    from below, pipeline._plain_bytes) beside what calibrate holds before its runs (CALIBRATE_FLOOR) and the
    model's file runs in segments (ppocr_cls: 51 MB a run, 72 MB plain: 166 -> 139 MB of peak RSS), with
    the workers and threads it has unsplit (other thread counts give other floats), and the same file."""
    import qtool
    from qtool.collection import pipeline

    schedules, parts = _spied(monkeypatch, lambda schedule: (schedule.workers, schedule.spread))
    monkeypatch.setattr(pipeline, "_cores", lambda: 2, raising=False)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 20, raising=False)
    # 12 tensors of 0.6 MB a run (7 MB, far under RUN_BYTES), at most 2 alive at once in plain inference:
    # twice its 1.2 MB (and no floor on either side) leaves no room for the run beside the 55 KB model
    monkeypatch.setattr(pipeline, "PLAIN_FLOOR", 0, raising=False)
    monkeypatch.setattr(pipeline, "CALIBRATE_FLOOR", 0, raising=False)
    monkeypatch.setattr(pipeline, "RUN_ROOM", 1 << 20, raising=False)  # unsplit: one run at a time, on both cores
    path = tmp_path / "model.onnx"
    _chain(path, layers=6, channels=16, side=96)
    files = {}
    for how in ("split", "whole"):
        if how == "whole":
            monkeypatch.setattr(pipeline, "_run_limit", lambda plain, file_bytes, computed=0: pipeline.RUN_BYTES)
        schedules.clear()
        parts.clear()
        cal = qtool.calibrate(path, data=str(tmp_path / "data"))
        files[how] = [r.to_json() if hasattr(r, "to_json") else r for r in cal.tensors]
        (schedule,) = schedules
        assert schedule == (1, 2)  # one worker of both cores, as unsplit
        assert (parts and parts[0] >= 3) if how == "split" else not parts, parts
    assert files["split"] == files["whole"]


def _biased_chain(path: Path, layers: int = 6, channels: int = 16, side: int = 96) -> None:
    """Conv 3x3 -> Add (a bias per channel) -> Relu, `layers` times on [1, channels, side, side]: the Adds' outputs are
    computed by collect from the Convs' (collect.derivations), not fetched."""
    rng = np.random.default_rng(1)
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array((rng.standard_normal((channels, 1, 1)) * 0.1).astype(np.float32), f"b{k}")]
        nodes += [helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Add", [f"c{k}", f"b{k}"], [f"a{k}"]), helper.make_node("Relu", [f"a{k}"], [f"r{k}"])]
        x = f"r{k}"
    shape = [1, channels, side, side]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    (path.parent / "data").mkdir()
    for i in range(4):
        np.save(path.parent / "data" / f"{i}.npy", np.random.default_rng(i).random(shape).astype(np.float32))


def test_the_tensors_collect_computes_count_against_the_2x_bound_of_an_unsplit_run(tmp_path, monkeypatch):
    """An unsplit run holds the tensors it fetched (onnxruntime's arena keeps them from run to run) and, beside them,
    those collect computes from them (Add/Sub/Mul outputs, collect.derivations), each a new array: atspm_funcnet_pair's
    runs fetched 29 MB and computed 32 MB, under the 31 MB twice plain inference left for the fetched ones alone, and
    took calibrate to 2.07x plain inference's peak (1.8x split). A run whose fetched tensors fit beside CALIBRATE_FLOOR
    and the model's file, but not with the computed ones, goes in segments, with the workers and threads it has
    unsplit, and the same file."""
    import qtool
    from qtool.collection import pipeline

    schedules, parts = _spied(monkeypatch, lambda schedule: (schedule.workers, schedule.spread))
    monkeypatch.setattr(pipeline, "_cores", lambda: 2, raising=False)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 20, raising=False)
    monkeypatch.setattr(pipeline, "PLAIN_FLOOR", 0, raising=False)
    monkeypatch.setattr(pipeline, "RUN_ROOM", 1 << 20, raising=False)  # unsplit: one run at a time, on both cores
    path = tmp_path / "model.onnx"
    _biased_chain(path)
    limits, cuts = [], []
    real_limit, real_cuts = pipeline._run_limit, pipeline._segment_cuts
    monkeypatch.setattr(pipeline, "_run_limit", lambda plain, file_bytes, computed=0: (limits.append((plain, file_bytes, computed)),
                                                                                       real_limit(plain, file_bytes, computed))[1])
    monkeypatch.setattr(pipeline, "_segment_cuts", lambda exposed, fetched, types, sizes, limit=pipeline.RUN_BYTES:
                        (cuts.append(sum(sizes.values())), real_cuts(exposed, fetched, types, sizes, limit))[1])
    qtool.calibrate(path, data=str(tmp_path / "data"))
    (plain, file_bytes, computed), = limits
    fetched = cuts[0]
    assert computed == 6 * 16 * 96 * 96 * 4 and fetched >= computed  # the six Adds' outputs
    # a floor that leaves the fetched tensors room beside the file, not the computed ones with them
    monkeypatch.setattr(pipeline, "CALIBRATE_FLOOR", 2 * plain - file_bytes - fetched - computed // 2)
    files = {}
    for how in ("with computed", "fetched alone"):
        if how == "fetched alone":
            monkeypatch.setattr(pipeline, "_run_limit", lambda plain, file_bytes, computed=0: real_limit(plain, file_bytes))
        schedules.clear()
        parts.clear()
        cal = qtool.calibrate(path, data=str(tmp_path / "data"))
        files[how] = [r.to_json() if hasattr(r, "to_json") else r for r in cal.tensors]
        assert schedules == [(1, 2)]  # one worker of both cores, as unsplit
        assert (parts and parts[0] >= 2) if how == "with computed" else not parts, (how, parts)
    assert files["with computed"] == files["fetched alone"]


def test_runs_go_side_by_side_only_while_twice_plain_inference_leaves_room_for_each(tmp_path, monkeypatch):
    """Each worker holds a run's fetched activations: runs go side by side only while twice plain
    inference's peak (estimated from below) leaves room for each beside CALIBRATE_FLOOR, the model's
    file and the histograms (thai_oskut_ws: 2 workers of 19 MB runs, 166 -> 153 MB of peak RSS against
    82 MB plain). The session keeps its one thread (other thread counts give other floats), the other
    core goes to the histograms, and the file is the one of two workers."""
    import qtool
    from qtool.collection import collect, pipeline

    schedules, threads = [], []
    real, session = collect.collect, pipeline._session

    def spy(session, plan, runs, progress, stats, schedule, helpers):  # as pipeline calls it
        schedules.append((schedule.workers, schedule.spread))
        return real(session, plan, runs, progress, stats, schedule, helpers)

    def made(exposed, fetched, positions, static, folder, count):
        threads.append(count)
        return session(exposed, fetched, positions, static, folder, count)

    monkeypatch.setattr(collect, "collect", spy)
    monkeypatch.setattr(pipeline, "_session", made)
    monkeypatch.setattr(pipeline, "_cores", lambda: 2, raising=False)
    monkeypatch.setattr(pipeline, "RUN_ROOM", 1 << 30, raising=False)  # the model's bytes would let two runs go side by side
    monkeypatch.setattr(pipeline, "_run_limit", lambda plain, file_bytes, computed=0: pipeline.RUN_BYTES)  # not in segments
    # 7 MB a run, at most 1.2 MB alive at once in plain inference: twice that (and no floor on either side)
    # leaves room for no run beside the 55 KB model: one at a time
    monkeypatch.setattr(pipeline, "PLAIN_FLOOR", 0, raising=False)
    monkeypatch.setattr(pipeline, "CALIBRATE_FLOOR", 0, raising=False)
    path = tmp_path / "model.onnx"
    _chain(path, layers=6, channels=16, side=96)
    files = {}
    for how in ("bound", "free"):
        if how == "free":
            monkeypatch.setattr(pipeline, "_within_bound", lambda workers, per_run, room: workers)
        schedules.clear()
        threads.clear()
        cal = qtool.calibrate(path, data=str(tmp_path / "data"))
        files[how] = [r.to_json() if hasattr(r, "to_json") else r for r in cal.tensors]
        assert threads == [1] and schedules == ([(1, 2)] if how == "bound" else [(2, 1)])
    assert files["bound"] == files["free"]


def _matmul_chain(width: int = 256, layers: int = 4) -> onnx.ModelProto:
    """x [n, 8, width] -> (MatMul + Add -> Relu) x layers: weights of `width`^2 float32 values each."""
    rng = np.random.default_rng(21)
    inits, nodes, x = [], [], "x"
    for k in range(layers):
        inits += [numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(np.zeros(width, np.float32), f"b{k}")]
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]), helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}"])]
        x = f"r{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_dynamic_model_s_float_weights_count_against_the_2x_bound(tmp_path, monkeypatch):
    """A model onnxruntime quantized dynamically is calibrated as the float model it was made from: its sessions hold
    float32 weights where plain inference holds the file's int8 (ddddocr's OCR model: 52 MB against 13). The room
    twice plain inference leaves for runs side by side was taken beside the file: 2 workers of 11 MB runs, 2.5x its
    plain peak RSS. Now beside the float weights: where those leave room for one run, one worker runs (the same file:
    the runs and sums are the same)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from qtool import api
    from qtool import model as qmodel
    from qtool.collection import collect, pipeline

    if pipeline._cores() < 2:
        pytest.skip("one core: one worker whatever the bound")
    src, path = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_matmul_chain(), src)
    quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8)
    loaded = qmodel.load_float_model(path, external_data=False, lazy=True)
    held, file_bytes = pipeline._session_bytes(loaded), pipeline._file_bytes(loaded)
    assert held >= 4 * 4 * 256 * 256 > 3 * file_bytes  # float32 weights, the file's int8
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(22)
    for k in range(4):
        np.save(folder / f"{k}.npy", rng.standard_normal((64, 8, 256)).astype(np.float32))
    seen, bound, plains = [], [], []
    real_collect, real_within, real_room = collect.collect, pipeline._within_bound, pipeline._bound_room
    monkeypatch.setattr(pipeline, "_bound_room", lambda plain, model_bytes, accumulator: (plains.append((plain, accumulator)),
                                                                                         real_room(plain, model_bytes, accumulator))[1])
    monkeypatch.setattr(collect, "collect", lambda session, plan, runs, progress, stats, schedule, helpers:
                        (seen.append(schedule.workers), real_collect(session, plan, runs, progress, stats, schedule, helpers))[1])
    monkeypatch.setattr(pipeline, "_within_bound", lambda workers, per_run, room: (bound.append((workers, per_run, room)),
                                                                                  real_within(workers, per_run, room))[1])
    files = {}
    api.calibrate_files(path, data=folder, output=tmp_path / "free.calib.json")
    files["free"] = (tmp_path / "free.calib.json").read_bytes()
    workers, per_run, _ = bound[0]
    assert workers == 2 and seen == [2]  # room for both runs with the floor as it is
    # a floor that leaves room for two runs beside the file, for one beside the float weights (runs still unsplit)
    (plain, accumulator), floor = plains[0], pipeline.CALIBRATE_FLOOR
    beside_weights = 2 * plain - floor - held - accumulator
    monkeypatch.setattr(pipeline, "CALIBRATE_FLOOR", floor + beside_weights - 2 * per_run + (held - file_bytes) // 2)
    seen.clear()
    bound.clear()
    plains.clear()
    api.calibrate_files(path, data=folder, output=tmp_path / "bound.calib.json")
    assert seen == [1] and bound[0][1] == per_run, bound  # the same runs, one at a time
    assert (tmp_path / "bound.calib.json").read_bytes() == files["free"]
