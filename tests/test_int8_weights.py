"""A model onnxruntime quantized dynamically, calibrated as the float model it was made from: calibrate's sessions hold
its int8 weights (each float weight a MatMul or Gather reads made by a DequantizeLinear as the session runs,
qtool.model.dynamic.int8_weights, where that saves dynamic.MADE_SAVES), as plain inference holds them, not their float32
values 4x as large."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool.model import dynamic, lazy, load_float_model

V, D, H = 300, 64, 16  # vocabulary, embedding width, LSTM hidden size


def _float_model() -> onnx.ModelProto:
    """ids [n, t] -> Gather(embedding table) -> MatMul + Add -> Relu -> LSTM -> MatMul: the layers quantize_dynamic
    quantizes to int8 weights (the table, the MatMuls' weights, the LSTM's W and R)."""
    rng = np.random.default_rng(4)

    def w(name, *shape, s=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)
    inits = [w("table", V, D, s=1.0), w("w1", D, D), w("b1", D, s=0.1), w("W", 1, 4 * H, D), w("R", 1, 4 * H, H),
             w("w2", H, 40), numpy_helper.from_array(np.array([1, 0, 2], np.int64), "perm_shape")]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], "embed"),
        helper.make_node("MatMul", ["emb", "w1"], ["m1"], "fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], "fc1_bias"),
        helper.make_node("Relu", ["a1"], ["r1"], "relu"),
        helper.make_node("Transpose", ["r1"], ["seq"], "to_seq", perm=[1, 0, 2]),
        helper.make_node("LSTM", ["seq", "W", "R"], ["Y", "Y_h"], "lstm", hidden_size=H),
        helper.make_node("Squeeze", ["Y_h"], ["h"], "last"),
        helper.make_node("MatMul", ["h", "w2"], ["logits"], "head"),
    ]
    graph = helper.make_graph(nodes, "tagger", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", "t"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 40])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """(the float model's path, the model onnxruntime's quantize_dynamic made of it, a folder of 3 input files)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, path = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(_float_model(), src)
    quantize_dynamic(str(src), str(path), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "LSTM"])
    # the table as onnxruntime's quantized Gather leaves it (operators/gather.py): Gather of int8 rows -> DequantizeLinear
    model = onnx.load(path)
    g = model.graph
    table = next(t for t in g.initializer if t.name == "table")
    values = numpy_helper.to_array(table)
    scale = np.float32(np.abs(values).max() / 127)
    table.CopyFrom(numpy_helper.from_array(np.clip(np.round(values / scale), -127, 127).astype(np.int8), "table_quantized"))
    g.initializer.extend([numpy_helper.from_array(np.array(scale), "table_scale"),
                          numpy_helper.from_array(np.array(0, np.int8), "table_zero_point")])
    at, gather = next((k, n) for k, n in enumerate(g.node) if n.op_type == "Gather")
    gather.input[0], gather.output[0] = "table_quantized", "emb_rows"
    g.node.insert(at + 1, helper.make_node("DequantizeLinear", ["emb_rows", "table_scale", "table_zero_point"], ["emb"]))
    onnx.save(model, path)
    assert {"MatMulInteger", "DynamicQuantizeLSTM", "DequantizeLinear"} <= {n.op_type for n in g.node}
    monkeypatch.setattr(dynamic, "MADE_SAVES", 0)  # a model of a few kilobytes
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for k in range(3):
        np.save(folder / f"{k}.npy", rng.integers(0, V, (2, 5 + 3 * k)).astype(np.int64))
    return src, path, folder


def _float_weights_read(model: onnx.ModelProto) -> dict[str, str]:
    """{float weight of INLINE_BYTES or more: the op reading it} in `model`."""
    readers = {i: n.op_type for n in model.graph.node for i in n.input}
    return {t.name: readers.get(t.name, "") for t in model.graph.initializer
            if t.data_type == TensorProto.FLOAT and (lazy.nbytes(t) if lazy.is_lazy(t) else len(t.raw_data)) >= lazy.INLINE_BYTES}


def test_calibrate_s_sessions_hold_the_int8_weights(shipped, tmp_path, monkeypatch):
    """Every session calibrate makes of the float reading holds the table's and the MatMuls' weights as the int8 the
    file holds (each dequantized by a DequantizeLinear where it is read; the table's rows after its Gather), no float32
    weight of theirs (before: all of them, 4x the file's int8 bytes); the LSTM's stay float."""
    from qtool import api
    from qtool.runtime import nchwc

    _, path, folder = shipped
    monkeypatch.setattr(dynamic, "_made_up_to", lambda *a, **k: 1 << 40)  # every weight made (the choice: below)
    made, real = [], nchwc.fetching_session
    monkeypatch.setattr(nchwc, "fetching_session", lambda model, *a, **k: (made.append(model), real(model, *a, **k))[1])
    api.calibrate_files(path, data=folder, output=tmp_path / "m.calib.json")
    assert made
    for model in made:
        assert set(_float_weights_read(model).values()) == {"LSTM"}
        ints = [t for t in model.graph.initializer if t.data_type == TensorProto.INT8]
        dequantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        assert ints and {t.name for t in ints if lazy.nbytes(t) >= lazy.INLINE_BYTES} <= dequantized | {
            n.input[0] for n in model.graph.node if n.op_type == "Gather"}
        assert any(p.key == dynamic.SESSION_KEY for p in model.metadata_props)


def test_int8_weights_run_the_float_model_s_arithmetic(shipped, monkeypatch):
    """The session model int8_weights makes computes what the float reading computes: the table's rows exactly as its
    float values give them, the MatMuls to float32 rounding (a constant weight is packed once, a computed one is multiplied unpacked: the products summed in another
    order). onnxruntime's QDQ fusions are off in its sessions: they would run DequantizeLinear -> MatMul as an int8
    MatMulNBits, far from the float model."""
    import onnxruntime as ort

    from qtool.runtime import onnxruntime

    _, path, _ = shipped
    monkeypatch.setattr(dynamic, "_made_up_to", lambda *a, **k: 1 << 40)  # every weight made
    loaded = load_float_model(path, lazy=True)
    assert _float_weights_read(loaded.proto) != {}
    outputs = ["emb", "m1", "Y", "logits"]
    with_outputs = onnx.ModelProto()
    with_outputs.CopyFrom(loaded.proto)
    with_outputs.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs[:-1])
    int8 = dynamic.int8_weights(with_outputs)
    assert int8 is not None and set(_float_weights_read(int8).values()) == {"LSTM"}
    feeds = {"ids": np.random.default_rng(6).integers(0, V, (3, 7)).astype(np.int64)}
    want = onnxruntime.session(with_outputs).run(outputs, feeds)
    got = onnxruntime.session(int8).run(outputs, feeds)
    assert np.array_equal(got[0], want[0])  # Gather of the int8 rows, then DequantizeLinear: the float table's rows
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    from qtool.model.spill import runnable
    data, spill = runnable(int8)
    try:
        fused = ort.InferenceSession(data, providers=["CPUExecutionProvider"],
                                     sess_options=_external_root()).run(outputs, feeds)
    finally:
        if spill is not None:
            spill.close()
    # with onnxruntime's fusions the head's DequantizeLinear -> MatMul runs as MatMulNBits: 2e-3 off here
    assert not np.allclose(fused[-1], want[-1], rtol=1e-5, atol=1e-6)


def _external_root():
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.model_external_initializers_file_folder_path", "/")
    return opts


def test_no_int8_weights_for_a_model_with_its_own_qdq_nodes(shipped):
    """A float reading that still holds QuantizeLinear/DequantizeLinear nodes keeps its float weights in its
    sessions: onnxruntime's QDQ fusions of its own nodes stay as they were."""
    _, path, _ = shipped
    loaded = load_float_model(path, lazy=True)
    g = loaded.proto.graph
    g.node.append(helper.make_node("QuantizeLinear", ["logits", "qs"], ["lq"]))
    g.initializer.append(numpy_helper.from_array(np.array(0.1, np.float32), "qs"))
    assert dynamic.int8_weights(loaded.proto) is None


def test_the_weights_made_are_those_that_hold_the_least():
    """_made_up_to: MatMul weights up to the size that holds the least (made ones a quarter of their float bytes, plus
    the largest made one's floats times the runs side by side; float ones their bytes), none where that saves less
    than MADE_SAVES. t5_title_decoder's case: 40 weights of 2 MB and a 64 MB head: the head stays float; without the
    head, two runs side by side still make the 2 MB ones."""
    mb = 1 << 20
    readers = {f"w{k}": [(helper.make_node("MatMul", ["x", f"w{k}"], [f"y{k}"]), 1)] for k in range(40)}
    readers["head"] = [(helper.make_node("MatMul", ["h", "head"], ["logits"]), 1)]
    readers["table"] = [(helper.make_node("Gather", ["table", "ids"], ["e"]), 0)]
    sizes = {**{f"w{k}": 2 * mb for k in range(40)}, "head": 64 * mb, "table": 64 * mb}
    assert dynamic._made_up_to(sizes, readers, 1) == 2 * mb
    assert dynamic._made_up_to({w: b for w, b in sizes.items() if w != "head"}, readers, 2) == 2 * mb
    assert dynamic._made_up_to({"head": 64 * mb}, readers, 1) == -1  # made: 16 MB + 64 MB while it runs
    small = {"w0": 2 * mb, "w1": 2 * mb}
    assert dynamic._made_up_to(small, readers, 1) == -1  # 4 MB float: less to save than MADE_SAVES


def test_segments_keep_the_sessions_without_qdq_fusions(shipped, monkeypatch):
    """A model cut into segments (collection.segments.split): each part's model says what the whole one says of its
    sessions (dynamic.SESSION_KEY), so that onnxruntime does not fuse a part's DequantizeLinear -> MatMul into
    MatMulNBits (before: the parts lost the model's metadata, t5's segments ran their MatMuls as int8 MatMulNBits)."""
    from qtool.collection import segments

    monkeypatch.setattr(dynamic, "_made_up_to", lambda *a, **k: 1 << 40)
    _, path, _ = shipped
    loaded = load_float_model(path, lazy=True)  # its store holds the lazy weights
    int8 = dynamic.int8_weights(loaded.proto)
    parts = segments.split(int8, ["m1", "logits"], [len(int8.graph.node) // 2])
    assert len(parts) == 2
    assert all(any(p.key == dynamic.SESSION_KEY for p in part.model.metadata_props) for part in parts)
