"""Calibrate's memory (issue 49), session 21: cuts across a computed tensor an Unsqueeze reads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_segments import _one_session_and_segments_write_one_file


def _stacked_norm_like(layers: int = 8, channels: int = 8, width: int = 64) -> onnx.ModelProto:
    """OSKut's shape (a Keras word segmenter): an embedding batch-normalized as x * scale + bias (collect computes both
    from the fetched input), read by an Unsqueeze that starts a stack of 1 x 3 convolutions and by a Concat with their
    result at the end, so the normalized tensor lives across the whole body."""
    rng = np.random.default_rng(21)
    inits = [numpy_helper.from_array((rng.random((1, channels, 1)) + 0.5).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal((1, channels, 1)).astype(np.float32), "bias"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2")]
    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"], "bn_mul"),
             helper.make_node("Add", ["scaled", "bias"], ["normed"], "bn_add"),
             helper.make_node("Unsqueeze", ["normed", "axis2"], ["u"], "stack")]
    h = "u"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 3)) * 0.3).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("Conv", [h, f"w{k}"], [f"c{k}"], f"conv{k}", pads=[0, 1, 0, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], f"relu{k}")]
        h = f"r{k}"
    nodes += [helper.make_node("Squeeze", [h, "axis2"], ["body"], "unstack"),
              helper.make_node("Concat", ["normed", "body"], ["y"], "join", axis=1)]
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", channels, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_computed_tensor_an_unsqueeze_reads_blocks_no_cut(tmp_path, monkeypatch):
    """The normalized embedding (an Add collect computes) read by an Unsqueeze and a Concat crossed every position of
    the body: no cut, the run whole (OSKut deepcut and tnhc: 2 segments of 1060 positions, 2.27x and 2.04x plain
    inference's peak RSS). An Unsqueeze fuses with nothing before it: the body is cut, and the file is the one
    session's."""
    from qtool import model as qmodel
    from qtool.collection import segments

    model = _stacked_norm_like()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    made = {n.output[0]: n.op_type for n in model.graph.node}
    fetched = [n for n in names if made.get(n) not in ("Add", "Mul", "Concat")]  # collect computes the others
    assert "normed" in names and "normed" not in fetched
    exposed = qmodel.with_outputs(model, fetched, types)
    assert len(segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 4, types)) >= 4  # none before
    path = tmp_path / "stacked.onnx"
    onnx.save(model, path)
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for k in range(3):
        np.save(folder / f"{k}.npy", rng.standard_normal((4, 8, 64)).astype(np.float32))
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def test_a_ctrl_c_while_the_model_is_read_lazily_is_a_ctrl_c(monkeypatch):
    """A Ctrl-C while bigmodel.read_header parses the file through its memory map, while the parse holds a view of it,
    stops the command as a Ctrl-C (exit 130): the map's close raised BufferError ("cannot close exported pointers
    exist") in its place, which calibrate reported as an unreadable model, exit 1 (tests/test_signals_flags.py's
    Ctrl-C at 0.4 s, under load)."""
    import pytest
    from runcli import SAMPLE

    from qtool.model import bigmodel, wire

    real = wire.fields

    def fields(buf, start, end):
        for found in real(buf, start, end):
            held = buf[start:end]  # a view of the map the parse holds when the signal comes
            yield found
            assert held is not None
            raise KeyboardInterrupt

    monkeypatch.setattr(wire, "fields", fields)
    with pytest.raises(KeyboardInterrupt):
        bigmodel.read_header(SAMPLE)
    monkeypatch.undo()
    assert len(bigmodel.read_header(SAMPLE)[0].graph.node) > 0
