"""`--data FILE`: one .npy/.npz file of samples along the first axis feeds calibrate, evaluate and
export's --max-drop exactly as a folder of one file per sample does."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from runcli import invoke

from qtool.calibration import load

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
HELD = ROOT / "sample_models" / "digits_heldout.npz"


def ok(*args):
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    return r


def fail(*args, needle):
    r = invoke(*args)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.output
    return lines[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The README's former split: the held-out set's first 60 samples, one .npy each."""
    d = tmp_path_factory.mktemp("split")
    x = np.load(HELD)["x"]
    for i in range(60):
        np.save(d / f"{i:03d}.npy", x[i])
    return d


def test_calibrate_from_the_file_writes_the_folders_bytes(tmp_path, folder):
    ok("calibrate", SAMPLE, "--data", folder, "-o", tmp_path / "dir.calib.json")
    r = ok("calibrate", SAMPLE, "--data", HELD, "--limit", "60", "-o", tmp_path / "file.calib.json", "--json")
    assert (tmp_path / "dir.calib.json").read_bytes() == (tmp_path / "file.calib.json").read_bytes()
    summary = json.loads(r.stdout)
    assert summary["samples"] == summary["inputs"] == 60 and summary["data_file"] == str(HELD)
    assert "60 samples in" in ok("calibrate", SAMPLE, "--data", HELD, "--limit", "60", "-o", tmp_path / "t.calib.json").stdout
    # shards of the file's samples merge to the same file
    for k in (1, 2):
        ok("calibrate", SAMPLE, "--data", HELD, "--limit", "60", "--shard", f"{k}/2", "-o", tmp_path / f"s{k}.calib.json")
        assert load(tmp_path / f"s{k}.calib.json").samples == 30
    ok("merge", tmp_path / "s1.calib.json", tmp_path / "s2.calib.json", "-o", tmp_path / "m.calib.json")
    assert (tmp_path / "m.calib.json").read_bytes() == (tmp_path / "file.calib.json").read_bytes()


def test_evaluate_and_max_drop_from_the_file_give_the_folders_numbers(tmp_path, folder):
    calib = tmp_path / "c.calib.json"
    ok("calibrate", SAMPLE, "--images", ROOT / "calib_images", "--limit", "32", "-o", calib)
    numbers = []
    for data in (folder, HELD):
        r = ok("evaluate", SAMPLE, "--calib", calib, "--data", data, "--limit", "60", "--target", "openvino", "--tensors", "--json")
        doc = json.loads(r.stdout)
        numbers.append({k: v for k, v in doc.items() if k in ("outputs", "tensors", "samples", "inputs")})
    assert numbers[0] == numbers[1] and numbers[0]["samples"] == 60
    text = ok("evaluate", SAMPLE, "--calib", calib, "--data", HELD, "--limit", "60", "--target", "qdq").stdout
    assert "on 60 samples from 60 samples in" in text
    kept = []
    for data in (folder, HELD):
        doc = json.loads(ok("export", SAMPLE, "--calib", calib, "--target", "qdq", "--max-drop", "40dB", "--data", data, "--limit", "60",
                            "-o", tmp_path / f"{len(kept)}.qdq.onnx", "--json").stdout)
        kept.append(doc["budget"])
    assert (tmp_path / "0.qdq.onnx").read_bytes() == (tmp_path / "1.qdq.onnx").read_bytes()
    assert {k: v for k, v in kept[0].items() if k != "latency_ms"} == {k: v for k, v in kept[1].items() if k != "latency_ms"}


def test_npy_file_and_multi_input_npz(tmp_path):
    m = tmp_path / "mi.onnx"
    onnx.save(zoo.int_input_model(), m)
    rng = np.random.default_rng(1)
    image, ids = rng.standard_normal((6, 3, 8, 8)).astype(np.float32), np.arange(6, dtype=np.int64) % 4
    np.savez(tmp_path / "all.npz", image=image, scale_id=ids)
    (tmp_path / "d").mkdir()
    for i in range(6):
        np.savez(tmp_path / "d" / f"{i}.npz", image=image[i], scale_id=ids[i:i + 1])
    ok("calibrate", m, "--data", tmp_path / "all.npz", "-o", tmp_path / "f.calib.json")
    ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "d.calib.json")
    assert (tmp_path / "f.calib.json").read_bytes() == (tmp_path / "d.calib.json").read_bytes()

    np.savez(tmp_path / "short.npz", image=image, scale_id=ids[:5])
    fail("calibrate", m, "--data", tmp_path / "short.npz", "-o", tmp_path / "x.calib.json", needle="image 6, scale_id 5")
    np.savez(tmp_path / "named.npz", x=image, scale_id=ids)
    fail("calibrate", m, "--data", tmp_path / "named.npz", "-o", tmp_path / "x.calib.json", needle="no array for input(s) image")
    np.save(tmp_path / "one.npy", image)
    fail("calibrate", m, "--data", tmp_path / "one.npy", "-o", tmp_path / "x.calib.json", needle="single-input")

    single = tmp_path / "cf.onnx"
    onnx.save(zoo.control_flow_model(), single)  # x [?, 4, 8, 8]
    x = rng.standard_normal((5, 4, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "xy.npz", features=x, labels=np.arange(5))  # the one array of the input's rank, labels beside it
    ok("calibrate", single, "--data", tmp_path / "x.npy", "-o", tmp_path / "a.calib.json")
    ok("calibrate", single, "--data", tmp_path / "xy.npz", "-o", tmp_path / "b.calib.json")
    assert (tmp_path / "a.calib.json").read_bytes() == (tmp_path / "b.calib.json").read_bytes()
    assert load(tmp_path / "a.calib.json").samples == 5
    np.save(tmp_path / "empty.npy", x[:0])
    fail("calibrate", single, "--data", tmp_path / "empty.npy", "-o", tmp_path / "x.calib.json", needle="holds no samples")
    np.save(tmp_path / "scalar.npy", np.float32(1))
    fail("calibrate", single, "--data", tmp_path / "scalar.npy", "-o", tmp_path / "x.calib.json", needle="along the first axis")
    (tmp_path / "notes.txt").write_text("x")
    fail("calibrate", single, "--data", tmp_path / "notes.txt", "-o", tmp_path / "x.calib.json", needle="neither a folder nor")


def test_a_fixed_batch_takes_that_many_samples_a_run(tmp_path):
    m = tmp_path / "two.onnx"
    proto = zoo.two_input_model()
    for vi in list(proto.graph.input) + list(proto.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = 2
    onnx.save(proto, m)
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((6, 3, 8, 8)).astype(np.float32) for _ in range(2))
    np.savez(tmp_path / "ab.npz", a=a, b=b)
    (tmp_path / "d").mkdir()
    for i in range(3):
        np.savez(tmp_path / "d" / f"{i}.npz", a=a[2 * i:2 * i + 2], b=b[2 * i:2 * i + 2])
    ok("calibrate", m, "--data", tmp_path / "ab.npz", "-o", tmp_path / "f.calib.json")
    ok("calibrate", m, "--data", tmp_path / "d", "-o", tmp_path / "d.calib.json")
    assert (tmp_path / "f.calib.json").read_bytes() == (tmp_path / "d.calib.json").read_bytes()
    assert load(tmp_path / "f.calib.json").samples == 6
    fail("calibrate", m, "--data", tmp_path / "ab.npz", "--limit", "5", "-o", tmp_path / "x.calib.json", needle="--limit 4")


def test_a_scalar_input_is_fed_as_a_scalar(tmp_path):
    """A model with a rank-0 input (Silero VAD's sample rate `sr`): each file's 0-d array feeds it as it is. qtool fed
    it as [1] (np.ascontiguousarray makes a 0-d array 1-d); onnxruntime takes that, OpenVINO refuses it ("got [1]
    expecting []"), so `evaluate --runtime openvino` exited 1 on a model OpenVINO runs."""
    from onnx import TensorProto, helper, numpy_helper

    from qtool.feeds.data import feeds_from
    from qtool.model import data_inputs

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array((rng.standard_normal((8, 6)) / 3).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["gain"], ["g"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "g"], ["xg"]),
         helper.make_node("MatMul", ["xg", "w"], ["y"])],
        "scalar_input", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
                         helper.make_tensor_value_info("gain", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    m = tmp_path / "scalar.onnx"
    onnx.save(model, m)
    for split in ("cal", "held"):
        (tmp_path / split).mkdir()
        for i in range(6):
            np.savez(tmp_path / split / f"{i}.npz", x=rng.standard_normal((2, 8)).astype(np.float32), gain=np.int64(1 + i % 3))
    feeds, _ = feeds_from(dict(np.load(tmp_path / "held" / "0.npz")), data_inputs(model), "0.npz")
    assert feeds["gain"].shape == () and feeds["x"].shape == (2, 8)
    ok("calibrate", m, "--data", tmp_path / "cal", "-o", tmp_path / "s.calib.json")
    e = json.loads(ok("evaluate", m, "--calib", tmp_path / "s.calib.json", "--data", tmp_path / "held", "--target", "openvino",
                      "--runtime", "openvino", "--json").stdout)
    assert e["runtime"]["float_precision"] == "f32" and abs(e["runtime"]["sqnr_db"] - e["sqnr_db"]) < 1
