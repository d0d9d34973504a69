"""Calibrate's memory, session 24 (issue 49: docs/benchmarks.md #mem24): a dynamic model's 1-D convolution weights
held by its sessions as the int8 the file holds, made float by a DequantizeLinear as they run (the same floats)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.model import bigmodel, dynamic, lazy, load_float_model
from qtool.runtime import nchwc

CH, T = 8, 64


def _vocoder_like() -> onnx.ModelProto:
    """x [1, CH, t] -> Conv1d -> LeakyRelu -> Conv1d (dilated) -> Add x -> Transpose -> MatMul: Kokoro's 1-D
    convolutions and a MatMul, the layers quantize_dynamic makes ConvInteger / MatMulInteger."""
    rng = np.random.default_rng(24)

    def w(name, *shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)
    inits = [w("w0", 2 * CH, CH, 7), w("b0", 2 * CH, s=0.1), w("w1", CH, 2 * CH, 3), w("b1", CH, s=0.1), w("head", CH, 40)]
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], "conv0", pads=[3, 3]),
        helper.make_node("LeakyRelu", ["c0"], ["a0"], "act0", alpha=0.1),
        helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], "conv1", pads=[3, 3], dilations=[3]),
        helper.make_node("Add", ["c1", "x"], ["s1"], "sum1"),
        helper.make_node("Transpose", ["s1"], ["t1"], "to_time", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t1", "head"], ["y"], "head"),
    ]
    graph = helper.make_graph(nodes, "vocoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CH, "t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "t", 40])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """(quantize_dynamic's model of _vocoder_like, a folder of 3 input files of other lengths); the model's weights
    beyond bigmodel.room_for_lazy (counted as held in the graph, as Kokoro's 290 MB are)."""
    from onnxruntime.quantization import quantize_dynamic

    src, path = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_vocoder_like(), src)
    quantize_dynamic(str(src), str(path), op_types_to_quantize=["Conv", "MatMul"])
    assert {"ConvInteger", "MatMulInteger"} <= {n.op_type for n in onnx.load(path).graph.node}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 1 << 10)  # no room: the dequantized weights count as held
    monkeypatch.setattr(dynamic, "MADE_SAVES", 0)  # a model of a few kilobytes
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(7)
    for k in range(3):
        np.save(folder / f"{k}.npy", rng.standard_normal((1, CH, T + 16 * k)).astype(np.float32))
    return path, folder


def _float_weights_read(model: onnx.ModelProto) -> dict[str, str]:
    readers = {i: n.op_type for n in model.graph.node for i in n.input}
    return {t.name: readers.get(t.name, "") for t in model.graph.initializer
            if t.data_type == TensorProto.FLOAT and (lazy.nbytes(t) if lazy.is_lazy(t) else len(t.raw_data)) >= lazy.INLINE_BYTES}


def test_held_1d_convolution_weights_are_made_as_the_session_runs(shipped):
    """Counted as held in the graph (no room for them), a dynamic model's dequantized weights stay float in its
    sessions (the MatMul's: a computed weight is multiplied unpacked, other floats), but those only 1-D convolutions
    read are the int8 the file holds, each made by a DequantizeLinear before its Conv (before: float32, 4x the bytes;
    Kokoro's ~290 MB); their integers count as held too, and the session model has nothing onnxruntime may block."""
    path, _ = shipped
    loaded = load_float_model(path, lazy=True)
    weights = {t.name: t for t in loaded.proto.graph.initializer if lazy.is_lazy(t)}
    assert len(weights) == 3 and all(lazy.held(t) for t in weights.values())
    made = dynamic.int8_weights(loaded.proto)
    assert made is not None
    assert set(_float_weights_read(made).values()) == {"MatMul"}
    dq = {n.output[0]: n.input[0] for n in made.graph.node if n.op_type == "DequantizeLinear"}
    convs = [n for n in made.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and all(n.input[1] in dq for n in convs)
    ints = {t.name: t for t in made.graph.initializer if t.data_type == TensorProto.INT8}
    assert {dq[n.input[1]] for n in convs} <= set(ints) and all(lazy.held(ints[dq[n.input[1]]]) for n in convs)
    assert not nchwc.may_block(made)


def test_convolution_weights_made_so_give_the_same_file(shipped, tmp_path, monkeypatch):
    """Calibrate's file is byte-identical with the 1-D convolutions' weights made at run time or held float: a
    DequantizeLinear computes (q - zero point) * scale in float32 as the float reading does, and onnxruntime's Conv
    reads a computed weight as a constant one; every session calibrate makes holds them int8."""
    from qtool import api

    path, folder = shipped
    monkeypatch.setattr(dynamic, "_made_up_to", lambda *a, **k: 1 << 40)  # every candidate made
    made, real = [], nchwc.fetching_session
    monkeypatch.setattr(nchwc, "fetching_session", lambda model, *a, **k: (made.append(model), real(model, *a, **k))[1])
    api.calibrate_files(path, data=folder, output=tmp_path / "made.calib.json")
    assert made and all(set(_float_weights_read(m).values()) <= {"MatMul"} for m in made)
    monkeypatch.setattr(dynamic, "_SAME_MADE", ("", -1))  # held float, as before
    api.calibrate_files(path, data=folder, output=tmp_path / "float.calib.json")
    assert (tmp_path / "made.calib.json").read_bytes() == (tmp_path / "float.calib.json").read_bytes()


def test_a_convolution_whose_weight_a_dequantizelinear_makes_leaves_its_readers_free_to_cut():
    """onnxruntime blocks no Conv whose weight a DequantizeLinear makes (it leaves DequantizeLinear unfolded): no
    optimized copy for the layout (nchwc.may_block), and no cut kept away from a layout reader of its output
    (segments._layout_reads; before: such a weight counted as one that may be blocked, and Kokoro's int8 1-D
    convolutions, read through a Concat by an InstanceNormalization, left one segment of 544 MB uncut). A Conv of a
    4-D float weight still holds its readers together."""
    from qtool.collection import segments

    def model(dequantized: bool) -> onnx.ModelProto:
        rng = np.random.default_rng(3)
        w = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
        inits = [numpy_helper.from_array(np.ones(8, np.float32), n) for n in ("g", "b", "m", "v")]
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"], "relu"),
                 helper.make_node("Concat", ["r", "c"], ["cat"], "cat", axis=1),
                 helper.make_node("BatchNormalization", ["r", "g", "b", "m", "v"], ["y"], "bn")]
        if dequantized:
            inits += [numpy_helper.from_array(w, "q"), numpy_helper.from_array(np.array(0.01, np.float32), "s")]
            nodes.insert(0, helper.make_node("DequantizeLinear", ["q", "s"], ["w"], "dq"))
        else:
            inits.append(numpy_helper.from_array(w.astype(np.float32) / 100, "w"))
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                   helper.make_tensor_value_info("cat", TensorProto.FLOAT, None)], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)

    made, constant = model(True), model(False)
    assert segments._layout_reads(list(made.graph.node), made.graph) == {}
    assert not nchwc.may_block(made)
    assert set(segments._layout_reads(list(constant.graph.node), constant.graph)) == {"r", "c"}
    assert nchwc.may_block(constant)


def test_a_qdq_model_s_runs_go_one_at_a_time_where_its_dequantized_weights_leave_no_room(tmp_path, monkeypatch):
    """A Q/DQ model's DequantizeLinear outputs of its int8 weights are float32 weights each run makes beside its
    activations (plain inference runs int8 kernels on the integers): counted in a run's bytes, two runs side by side
    no longer fit in twice plain inference's peak (pipeline._within_bound), and one runs at a time (before: two, on
    effword_resnet50_qint8 2.1x plain inference's peak RSS). Calibrate's file is the same either way."""
    from qtool import api
    from qtool.collection import collect, pipeline

    rng = np.random.default_rng(9)
    q = rng.integers(-127, 128, (1024, 1024, 3, 3)).astype(np.int8)  # 9.4 MB of int8: 38 MB as float32
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(np.array(0.002, np.float32), "s")]
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], "dq"),
             helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], "relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    folder = tmp_path / "data"
    folder.mkdir()
    for k in range(4):
        np.save(folder / f"{k}.npy", rng.standard_normal((1, 1024, 4, 4)).astype(np.float32))
    monkeypatch.setattr(pipeline, "_cores", lambda: 2)
    schedules, real = [], collect.collect
    monkeypatch.setattr(collect, "collect", lambda *a, **k: (schedules.append(a[5] if len(a) > 5 else k["schedule"]), real(*a, **k))[1])
    api.calibrate_files(path, data=folder, output=tmp_path / "one.calib.json")
    monkeypatch.setattr(pipeline, "_dequantized_bytes", lambda proto: 0, raising=False)  # as before
    api.calibrate_files(path, data=folder, output=tmp_path / "two.calib.json")
    assert [s.workers for s in schedules] == [1, 2]
    assert (tmp_path / "one.calib.json").read_bytes() == (tmp_path / "two.calib.json").read_bytes()
