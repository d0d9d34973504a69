"""Big models (qtool.model.bigmodel, lazy, writer): weights kept where they lie, exports of any size written
beside the output, on small models with the size limits lowered (bigmodel.LAZY_BYTES, writer.MAX_PROTO_BYTES)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from runcli import invoke

import qtool
from qtool import calibration
from qtool.errors import QtoolError
from qtool.model import as_float, bigmodel, lazy, load_model, shapes, writer


def _feeds(n=6, seq=16):
    """Token ids and attention masks of `n` sentences, the k-th padded after seq - k tokens."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        mask = np.ones((1, seq), np.int64)
        mask[0, seq - k:] = 0
        out.append({"input_ids": rng.integers(0, 200, (1, seq)).astype(np.int64), "attention_mask": mask})
    return out


def _bert(tmp_path, layout):
    """bert_like saved as one file, or with its weights in one external file or one file per tensor (torch's layout past 2 GB)."""
    m = zoo.bert_like()
    path = tmp_path / layout / "bert.onnx"
    path.parent.mkdir()
    if layout == "single":
        onnx.save_model(m, path)
    else:
        onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=layout == "one-file",
                        location="bert.onnx.data" if layout == "one-file" else None, size_threshold=256)
    return path, _feeds()


def _run(path_or_bytes, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    s = ort.InferenceSession(str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes, opts,
                             providers=["CPUExecutionProvider"])
    return [s.run(None, f) for f in feeds]


@pytest.mark.parametrize("layout", ["single", "one-file", "per-tensor"])
def test_a_model_loaded_lazily_calibrates_and_exports_the_same_bytes(tmp_path, monkeypatch, layout):
    path, feeds = _bert(tmp_path, layout)
    cal = qtool.calibrate(path, data=feeds)
    whole = {t: qtool.export(path, cal, target=t) for t in ("openvino", "qdq", "tensorrt")}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    loaded = load_model(path)
    assert lazy.lazy_tensors(loaded.proto) and loaded.proto.ByteSize() < 40_000  # the weights stayed in their files
    assert not loaded.external_files  # nothing left for onnxruntime to find beside the model: it reads them by path
    lazy_cal = qtool.calibrate(path, data=feeds)
    assert calibration.to_json(lazy_cal) == calibration.to_json(cal)
    for target, data in whole.items():
        assert qtool.export(path, lazy_cal, target=target) == data, target


def test_a_lazy_weight_passed_on_by_identity_nodes_is_read_as_the_same_bytes_not_copied(tmp_path, monkeypatch):
    """A layer used three times reads three Identity copies of one weight (chython_rxnmap: 53 of 8 weights, 642 MB
    of float32 made in memory against an 81 MB file, 2.9 GB of calibrate's RSS): loaded lazily, the weights read as
    constants (model.as_float) refer to the one weight's bytes in the file; calibrate and export give the bytes
    they give for the model loaded whole."""
    path = tmp_path / "shared.onnx"
    onnx.save_model(zoo.shared_layer_like(width=64, uses=3), path)
    feeds = [{"x": np.random.default_rng(k).standard_normal((1, 8, 64)).astype(np.float32)} for k in range(4)]
    cal = qtool.calibrate(path, data=feeds)
    whole = {t: qtool.export(path, cal, target=t) for t in ("openvino", "qdq", "tensorrt")}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    loaded = as_float(load_model(path))
    weights = [t for t in loaded.proto.graph.initializer if t.name.startswith("onnx::MatMul_")]
    assert len(weights) == 3 and all(lazy.is_lazy(t) for t in weights)  # before: three float copies in the graph
    assert loaded.proto.ByteSize() < 64 * 64 * 4  # not even one copy of the weight's 16 KB
    w = onnx.numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0])
    assert all(np.array_equal(lazy.value(t), w) for t in weights)
    lazy_cal = qtool.calibrate(path, data=feeds)
    assert calibration.to_json(lazy_cal) == calibration.to_json(cal)
    for target, data in whole.items():
        assert qtool.export(path, lazy_cal, target=target) == data, target


def test_a_non_finite_weight_passed_on_by_identity_nodes_stays_as_the_graph_makes_it_loaded_either_way(tmp_path, monkeypatch):
    """fold_weights leaves a weight whose value is not finite as the graph makes it; read lazily by reference, the
    same (the source is read once to tell)."""
    m = zoo.shared_layer_like(width=64, uses=2)
    w = onnx.numpy_helper.to_array(m.graph.initializer[0]).copy()
    w[3, 5] = np.inf
    m.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(w, "layer.weight"))
    path = tmp_path / "inf.onnx"
    onnx.save_model(m, path)
    whole = as_float(load_model(path)).proto
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    read = as_float(load_model(path)).proto
    for proto in (whole, read):
        assert [n.op_type for n in proto.graph.node].count("Identity") == 2
        assert not any(t.name.startswith("onnx::MatMul_") for t in proto.graph.initializer)


def test_calibrate_gives_onnxruntime_no_weights_of_its_own_to_copy_whatever_the_model_s_size(tmp_path, monkeypatch):
    """calibrate loads any model lazily: each session it makes reads the weights from the file (a model read whole
    was held as its proto, and again as the bytes serialized for every session beside onnxruntime's copy:
    lore_process, 44 MB, 356 -> 256 MB of peak RSS); the same calibration as the model read whole."""
    from qtool.runtime import onnxruntime as qort

    path = tmp_path / "shared.onnx"
    onnx.save_model(zoo.shared_layer_like(width=64, uses=3), path)
    feeds = [{"x": np.random.default_rng(k).standard_normal((1, 8, 64)).astype(np.float32)} for k in range(4)]
    made, _open = [], qort._open
    monkeypatch.setattr(qort, "_open", lambda data, *a: made.append(len(data)) or _open(data, *a))
    cal = qtool.calibrate(path, data=feeds)
    assert made and max(made) < 64 * 64 * 4  # before: the weight (16 KB) in every session's bytes, three times
    whole = qtool.calibrate(load_model(path).proto, data=feeds)  # a proto in memory is read whole
    assert json.loads(calibration.to_json(cal))["tensors"] == json.loads(calibration.to_json(whole))["tensors"]


def test_lazy_weights_are_read_where_they_lie_and_a_changed_file_is_refused(tmp_path, monkeypatch):
    path, _ = _bert(tmp_path, "one-file")
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    loaded = load_model(path)
    whole = onnx.load(str(path))
    t = next(t for t in loaded.proto.graph.initializer if lazy.is_lazy(t))
    expected = onnx.numpy_helper.to_array(next(w for w in whole.graph.initializer if w.name == t.name))
    assert np.array_equal(lazy.value(t), expected)
    assert loaded.sha256 == load_model(path).sha256 == hashlib.sha256(path.read_bytes() + (path.parent / "bert.onnx.data").read_bytes()).hexdigest()
    with open(path.parent / "bert.onnx.data", "ab") as f:  # rewritten in place while a command runs
        f.write(b"\0")
    with pytest.raises(QtoolError, match="changed while qtool was reading it"):
        lazy.value(t)


def test_shape_inference_runs_on_the_graph_without_its_weights_once_per_graph(tmp_path, monkeypatch):
    path, feeds = _bert(tmp_path, "single")
    cal = qtool.calibrate(path, data=feeds)
    seen = []
    isolated = shapes.isolated  # onnx's inference runs in a forked child: counted where it is handed over

    def counting(call, data):
        seen.append(len(data))
        return isolated(call, data)

    monkeypatch.setattr(shapes, "isolated", counting)
    shapes.INFERENCES.clear()
    qtool.export(path, cal, target="qdq")
    weights_bytes = sum(t.ByteSize() for t in onnx.load(str(path)).graph.initializer if t.ByteSize() > lazy.INLINE_BYTES)
    # two graphs: the model and the one SmoothQuant edited; each inferred once, without its weight data
    assert len(seen) == 2 and max(seen) < path.stat().st_size - weights_bytes + 10_000


def _export_cli(model_path, calib, target, out):
    r = invoke("export", model_path, "--calib", calib, "--target", target, "-o", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("target", ["qdq", "tensorrt", "openvino"])
def test_an_export_past_2_gib_keeps_its_weights_beside_it(tmp_path, monkeypatch, target):
    path, feeds = _bert(tmp_path, "per-tensor")
    cal = qtool.calibrate(path, data=feeds)
    cal.save(tmp_path / "bert.calib.json")
    one = _export_cli(path, tmp_path / "bert.calib.json", target, tmp_path / f"one.{target}.onnx")
    assert not writer.data_path(one).exists()
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    monkeypatch.setattr(writer, "MAX_PROTO_BYTES", 20_000)  # the bert look-alike's export is ~60 kB
    out = _export_cli(path, tmp_path / "bert.calib.json", target, tmp_path / f"big.{target}.onnx")
    data = writer.data_path(out)
    assert data.name == f"big.{target}.onnx.data" and out.stat().st_size < one.stat().st_size / 2
    header = onnx.load(str(out), load_external_data=False)
    external = [t for t in header.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    info = [{e.key: e.value for e in t.external_data} for t in external]
    assert external and all(i["location"] == data.name and int(i["offset"]) % writer.DATA_ALIGNMENT == 0 for i in info)
    assert all(int(i["length"]) >= lazy.INLINE_BYTES for i in info)  # smaller ones stay in the .onnx file
    assert all(len(t.raw_data) < lazy.INLINE_BYTES for t in header.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL)
    full, single = onnx.load(str(out)), onnx.load(str(one))
    for t in full.graph.initializer:  # every value as in the single file written without the limit
        other = next(x for x in single.graph.initializer if x.name == t.name)
        assert np.array_equal(onnx.numpy_helper.to_array(t), onnx.numpy_helper.to_array(other)), t.name
    if target == "openvino":  # OpenVINO reads the external data, same outputs
        import openvino as ov

        core = ov.Core()
        outs = [core.compile_model(str(p), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}) for p in (one, out)]
        for f in feeds[:2]:
            a, b = (list(c(f).values()) for c in outs)
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
        return
    onnx.checker.check_model(str(out), full_check=True)  # by path: the external data is checked too
    for a, b in zip(_run(one, feeds), _run(out, feeds)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # the model is identified by its .onnx file and its external data: the export calibrates as a model
    assert load_model(out).sha256 == hashlib.sha256(out.read_bytes() + data.read_bytes()).hexdigest()


def test_an_export_with_external_data_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path, feeds = _bert(tmp_path, "single")
    cal = qtool.calibrate(path, data=feeds)
    cal.save(tmp_path / "bert.calib.json")
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    monkeypatch.setattr(writer, "MAX_PROTO_BYTES", 20_000)
    out = tmp_path / "out.onnx"
    out.write_bytes(b"old")
    calls = []
    real = writer._exact

    def failing(t, n):
        calls.append(t.name)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(t, n)

    monkeypatch.setattr(writer, "_exact", failing)
    r = invoke("export", path, "--calib", tmp_path / "bert.calib.json", "--target", "qdq", "-o", out)
    assert r.exit_code == 1 and "No space left on device" in r.output and "nothing was written" in r.output
    assert out.read_bytes() == b"old" and not writer.data_path(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert.calib.json", "out.onnx", "single"]  # no staged file left


def test_an_output_whose_data_file_would_overwrite_an_input_is_refused_before_any_work(tmp_path):
    path, feeds = _bert(tmp_path, "one-file")
    cal = qtool.calibrate(path, data=feeds)
    cal.save(tmp_path / "bert.calib.json")
    data = path.parent / "bert.onnx.data"
    before = data.read_bytes()
    r = invoke("export", path, "--calib", tmp_path / "bert.calib.json", "--target", "qdq", "-o", path.parent / "bert.onnx")
    assert r.exit_code == 1 and "is an input file" in r.output
    r = invoke("export", path, "--calib", tmp_path / "bert.calib.json", "--target", "qdq", "-o", tmp_path / "bert.onnx")
    assert r.exit_code == 0, r.output
    os.replace(data, tmp_path / "bert.onnx.data")  # the weights now beside the output's name
    os.replace(path, tmp_path / "in.onnx")  # a model whose weights are where `bert.onnx`'s external data would go
    r = invoke("export", tmp_path / "in.onnx", "--calib", tmp_path / "bert.calib.json", "--target", "qdq", "-o", tmp_path / "bert.onnx")
    assert r.exit_code == 1 and "would write its external data over" in r.output and "bert.onnx.data" in r.output
    assert (tmp_path / "bert.onnx.data").read_bytes() == before


def test_the_api_returns_the_onnx_file_of_an_export_with_external_data(tmp_path, monkeypatch):
    path, feeds = _bert(tmp_path, "single")
    cal = qtool.calibrate(path, data=feeds)
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)
    monkeypatch.setattr(writer, "MAX_PROTO_BYTES", 20_000)
    with pytest.raises(QtoolError, match="past the 2 GiB of one ONNX file"):
        qtool.export(path, cal, target="qdq")
    got = qtool.export(path, cal, target="qdq", path=tmp_path / "q.onnx")
    assert got == (tmp_path / "q.onnx").read_bytes() and (tmp_path / "q.onnx.data").stat().st_size > 20_000


def test_inspect_reads_a_big_qdq_model_as_a_small_one(tmp_path, monkeypatch):
    path, feeds = _bert(tmp_path, "single")
    out = tmp_path / "t.onnx"
    qtool.export(path, qtool.calibrate(path, data=feeds), target="tensorrt", path=out)
    whole = invoke("inspect", out, "--trt-version", "10.3", "--json")
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)  # its constants of 1 KiB or more are then read from the file when checked
    lazy = invoke("inspect", out, "--trt-version", "10.3", "--json")
    assert whole.exit_code == lazy.exit_code == 0 and lazy.output == whole.output and '"violations": []' in whole.output
