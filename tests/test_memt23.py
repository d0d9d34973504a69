"""Calibrate's memory, session 23 (issue 49: docs/benchmarks.md #memt23): the optimized blocked graph's weights in a
file beside it, a dynamic model's dequantized weights lazy where they were held in the graph for the layout's sake, a
lazily read model's blocked session no longer lost to a deleted Spill file."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from runcli import invoke
from test_dynamic import C, H, quantized

from qtool import model
from qtool.model import bigmodel, lazy, load_float_model
from qtool.runtime import nchwc, onnxruntime

needs_blocks = pytest.mark.skipif(nchwc.block_size() is None, reason="onnxruntime does not use a blocked layout on this machine")


def _convs(path, channels: int = 32, side: int = 12) -> None:
    """Conv -> Relu -> Conv -> Relu -> Add of a constant (a weight onnxruntime keeps as it reads it), saved to `path`."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), f"w{k}")
             for k in range(2)]
    inits.append(numpy_helper.from_array(rng.standard_normal((channels, side, side)).astype(np.float32), "bias"))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], "conv0", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r0"], "relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], "conv1", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
             helper.make_node("Add", ["r1", "bias"], ["y"], "add")]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, side, side])], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def _exposed(m: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    return model.with_outputs(m, names, types), names


def _same_values(m: onnx.ModelProto, names: list[str], session, blocked) -> None:
    x = {"x": np.random.default_rng(5).standard_normal((1, 32, 12, 12)).astype(np.float32)}
    want = dict(zip(names, onnxruntime.session(m, threads=1).run(names, x)))
    got = session.run([blocked[n].source if n in blocked else n for n in names], x)
    for name, value in zip(names, got):
        value = nchwc.unblocked(value, blocked[name].block) if name in blocked else value
        assert np.array_equal(value, want[name]), name


@needs_blocks
def test_a_lazily_read_model_with_computed_weights_keeps_its_blocked_session(tmp_path):
    """A lazily read model whose weights onnxruntime keeps as it reads them are computed in memory (written to a Spill
    file for the session that optimizes): its blocked session is made (before: the optimized graph referred to the
    Spill file, removed once that session was made, so the blocked session failed to load and every tensor came in
    NCHW from a second session of the whole model); the values are the model's."""
    path = tmp_path / "convs.onnx"
    _convs(path)
    loaded = model.load_model(path, lazy=True)
    bias = next(t for t in loaded.proto.graph.initializer if t.name == "bias")
    lazy.replace(bias, lazy.value(bias) * 2)  # computed in memory: spilled for each session
    assert isinstance(lazy.entry(bias), lazy.Computed)
    exposed, names = _exposed(loaded.proto)
    session, blocked = nchwc.fetching_session(exposed, names, threads=1)
    assert {"c0", "r0", "c1"} <= set(blocked), blocked  # before: {}
    _same_values(exposed, names, session, blocked)


@needs_blocks
def test_the_blocked_session_is_made_from_its_graph_without_its_weights(tmp_path, monkeypatch):
    """The optimized (blocked) graph the fetching session is made from holds no weight: onnxruntime writes them to a
    file beside it, which the session reads and which is removed once it is made (before: every reordered Conv weight
    was in the graph, parsed, serialized and read again: tabledet_obj_q's 370 MB of float32 weights 2-3 times in
    calibrate's peak); the same values; the layout probe reads the same graph."""
    path = tmp_path / "convs.onnx"
    _convs(path)
    for loaded in (model.load_model(path), model.load_model(path, lazy=True)):
        exposed, names = _exposed(loaded.proto)
        made = []

        def session(m, made=made, session_of=onnxruntime.session, **kw):
            made.append(len(m) if isinstance(m, bytes) else None)
            return session_of(m, **kw)
        monkeypatch.setattr(onnxruntime, "session", session)
        session, blocked = nchwc.fetching_session(exposed, names, threads=1)
        monkeypatch.undo()
        weights = 2 * 32 * 32 * 9 * 4
        assert len(made) == 1 and made[0] is not None and made[0] < weights / 10, (made, weights)  # before: > weights
        assert set(blocked) >= {"c0", "r0", "c1"}
        _same_values(exposed, names, session, blocked)
        assert nchwc.blocked_layout(exposed, names) == {n: b.block for n, b in blocked.items()}
    from qtool import scratch
    assert not [p for p in scratch.directory().rglob("*") if p.is_file()]  # the weights' files are gone


@needs_blocks
def test_dequantized_weights_beyond_the_room_are_lazy_and_keep_the_layout(tmp_path, monkeypatch):
    """Past bigmodel.room_for_lazy, a dynamic model's dequantized Conv weights are lazy all the same, counted as held in
    the graph (lazy.Computed.held; before: float32 copies in the proto for the whole of calibrate and in each
    serialization of it), so that what decides by lazy weights decides as it did: the blocked layout (nchwc), the room
    for more (room_for_lazy), int8_weights; the same values, and the same calibration file as within the room."""
    from qtool.model import dynamic

    _, path = quantized(tmp_path)
    within = load_float_model(path, lazy=True)
    made = {t.name: lazy.value(t) for t in within.proto.graph.initializer if lazy.is_lazy(t)}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 8 << 10)  # the integer weights as float32 (16.9 KB) pass it
    beyond = load_float_model(path, lazy=True)
    assert beyond.proto.ByteSize() < sum(v.nbytes for v in made.values()) / 4  # before: the float weights in the graph
    weights = [t for t in beyond.proto.graph.initializer if t.name in made]
    assert len(weights) == 3 and all(lazy.is_lazy(t) and lazy.held(t) for t in weights)
    assert len(made) == 3 and not any(lazy.held(t) for t in within.proto.graph.initializer if t.name in made)
    assert all(np.array_equal(lazy.value(t), made[t.name]) for t in weights)
    assert lazy.apart(beyond.proto) == [] and bigmodel.room_for_lazy(beyond.proto, 0)
    assert nchwc._held_whole(beyond.proto) and dynamic.int8_weights(beyond.proto) is None
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        np.savez(data / f"{i}.npz", x=np.random.default_rng(i).random((1, C, H, 12 + 4 * (i % 2))).astype(np.float32))
    files, blocked = [], []
    for limit in (bigmodel.LAZY_BYTES, 64 << 20):
        monkeypatch.setattr(bigmodel, "LAZY_BYTES", limit)
        out = tmp_path / f"{limit}.calib.json"
        result = invoke("-v", "calibrate", path, "--data", data, "-o", out)
        assert result.exit_code == 0, result.output
        blocked.append(int(re.search(r"(\d+) fetched in blocked layout", result.output).group(1)))
        files.append(json.loads(out.read_text())["tensors"])
    assert files[0] == files[1] and blocked[0] == blocked[1]
    if 8 % nchwc.block_size() == 0:  # the Convs' 8 channels fill whole blocks (AVX2's 8, not AVX-512's 16)
        assert blocked[0] > 0


@needs_blocks
def test_the_session_that_only_optimizes_packs_no_weights(tmp_path, monkeypatch):
    """The session made only to write the optimized graph (it never runs) is made without onnxruntime's packed copies
    of its weights (ddddocr_ocr's layout probe: 174 -> 130 MB); the session the runs use packs them as before (its
    floats: a packed MatMul sums in another order)."""
    import onnxruntime as ort

    path = tmp_path / "convs.onnx"
    _convs(path)
    loaded = model.load_model(path, lazy=True)  # its store lives as long as it
    exposed, names = _exposed(loaded.proto)
    made = []
    real = ort.InferenceSession

    def entry(options, key):
        try:
            return options.get_session_config_entry(key)
        except Exception:  # not set
            return None

    def recording(data, sess_options=None, **kw):
        made.append((bool(sess_options.optimized_model_filepath), entry(sess_options, "session.disable_prepacking")))
        return real(data, sess_options=sess_options, **kw)
    monkeypatch.setattr(onnxruntime.ort, "InferenceSession", recording)
    session, blocked = nchwc.fetching_session(exposed, names, threads=1)
    monkeypatch.undo()
    assert made == [(True, "1"), (False, None)], made  # before: [(True, None), (False, None)]
    _same_values(exposed, names, session, blocked)
