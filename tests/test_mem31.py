"""Calibrate's memory, session 31 (czann_pgc_nucleus, a U-Net whose decoder upsamples by DepthToSpace): a Concat, Add,
Sum or Mul that reads a tensor onnxruntime never blocks runs in NCHW whatever is cut, so the tensors it reads are free to
cross a cut before the layout reader after it (segments._layout_reads)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qtool import api
from qtool import model as qmodel
from qtool.collection import collect, pipeline, segments


def _unet(upsample: str = "DepthToSpace") -> onnx.ModelProto:
    """An encoder whose skip tensor `skip` (a BatchNormalization of a Conv) a decoder concatenates with an upsampled
    tensor (`upsample`: DepthToSpace, or a Conv of the same shape) before a BatchNormalization, then a residual block of
    the decoder: Add(BatchNormalization(up), Relu(Conv(...))) read by another BatchNormalization."""
    rng = np.random.default_rng(31)
    inits = []

    def w(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name))
        return name

    def bn(tag: str, x: str, c: int, out: str) -> onnx.NodeProto:
        for p, v in (("g", 1.0), ("b", 0.1), ("m", 0.0), ("v", 1.0)):
            inits.append(numpy_helper.from_array(np.full(c, v, np.float32) + rng.uniform(0, 0.1, c).astype(np.float32), f"{tag}_{p}"))
        return helper.make_node("BatchNormalization", [x, *(f"{tag}_{p}" for p in "gbmv")], [out], tag)

    conv = lambda x, wt, out, **kw: helper.make_node("Conv", [x, wt], [out], out, pads=[1, 1, 1, 1], **kw)  # noqa: E731
    nodes = [conv("x", w("w0", 16, 4, 3, 3), "c0"), bn("bn0", "c0", 16, "skip"),
             helper.make_node("MaxPool", ["skip"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
             conv("p", w("w1", 32, 16, 3, 3), "c1"), helper.make_node("Relu", ["c1"], ["r1"], "r1"),
             conv("r1", w("w2", 64, 32, 3, 3), "c2"), helper.make_node("Relu", ["c2"], ["r2"], "r2")]
    if upsample == "DepthToSpace":
        nodes.append(helper.make_node("DepthToSpace", ["r2"], ["up"], "d2s", blocksize=2))
    else:  # a blocked tensor of the same shape: the Concat runs blocked
        nodes += [helper.make_node("Resize", ["r2", "", "scales"], ["big"], "resize", mode="nearest"),
                  conv("big", w("w3", 16, 64, 3, 3), "up")]
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"))
    nodes += [helper.make_node("Concat", ["up", "skip"], ["cat"], "cat", axis=1), bn("bn1", "cat", 32, "n1"),
              conv("n1", w("w4", 64, 32, 3, 3), "c4"), helper.make_node("DepthToSpace", ["c4"], ["u2"], "d2s2", blocksize=2),
              bn("bn2", "u2", 16, "n2"), conv("n2", w("w5", 16, 16, 3, 3), "c5"), helper.make_node("Relu", ["c5"], ["r5"], "r5"),
              helper.make_node("Add", ["n2", "r5"], ["res"], "res"), bn("bn3", "res", 16, "y")]
    graph = helper.make_graph(nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_join_of_a_tensor_never_blocked_leaves_what_it_reads_free():
    """onnxruntime's blocked transformer runs a Concat, Add, Sum or Mul blocked only when every input comes blocked
    (nchwc_transformer.cc TransformConcat, TransformBinary). A DepthToSpace output never does: the decoder's Concat of
    it and the skip tensor runs in NCHW, and so does the BatchNormalization reading it, whether the skip tensor comes
    from a segment's inputs or not. Before, the skip tensor counted as one whose layout that BatchNormalization follows,
    and czann_pgc_nucleus's five skip tensors crossed every position from the encoder to the decoder (3 segments, the
    first 1.28 GB of a run's 2.19 GB: calibrate 2.2-2.9x plain inference's peak RSS). Where the other input is a Conv's
    (blocked), the skip tensor still counts."""
    model = _unet()
    reads = segments._layout_reads(list(model.graph.node), model.graph)
    assert not {"skip", "up", "cat", "n2", "r5", "c5"} & set(reads), reads
    assert set(reads) == {"c0"}, reads  # bn0 still follows its Conv's layout
    blocked = _unet("Conv")
    reads = segments._layout_reads(list(blocked.graph.node), blocked.graph)
    assert reads.get("skip") == [n.name for n in blocked.graph.node].index("bn1"), reads


def test_the_skip_tensor_crosses_a_cut_and_the_file_is_the_same(tmp_path, monkeypatch):
    """Cut wherever it may be, the model goes in segments between the encoder's skip tensor and the decoder's Concat
    (none before), and the calibration file is the one session's."""
    model = _unet()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 2, types)
    order = [n.output[0] for n in positions.nodes]
    assert any(order.index("skip") < k <= order.index("cat") for k in positions), (positions, order)
    path = tmp_path / "unet.onnx"
    onnx.save(model, path)
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(7)
    for k in range(3):
        np.save(folder / f"{k}.npy", rng.standard_normal((1, 4, 32, 32)).astype(np.float32))
    made = []

    class Seen(segments.Segmented):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    real_cuts = segments.cuts
    monkeypatch.setattr(segments, "Segmented", Seen)
    monkeypatch.setattr(segments, "cuts", lambda proto, fetched, sizes, budget, types: real_cuts(proto, fetched, sizes, 1, types))
    files = {}
    for label, run_bytes in (("one", 1 << 40), ("segments", 1 << 10)):
        monkeypatch.setattr(pipeline, "RUN_BYTES", run_bytes)
        out = tmp_path / f"{label}.calib.json"
        api.calibrate_files(path, data=folder, output=out)
        files[label] = out.read_bytes()
    assert len(made) == 1 and "skip" in made[0].carried, made
    assert files["one"] == files["segments"]


def test_a_chain_thousands_of_followers_long_is_walked_without_recursion():
    """_never_blocked goes through the nodes once in graph order: a chain of 3000 Relu/Add nodes behind a Conv (an
    unrolled recurrence's length) neither overflows Python's stack nor loses the answer at its end."""
    rng = np.random.default_rng(0)
    wt = numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["t0"], "conv", pads=[1, 1, 1, 1])]
    for k in range(3000):
        op = "Relu" if k % 2 else "Add"
        nodes.append(helper.make_node(op, [f"t{k}"] if op == "Relu" else [f"t{k}", f"t{k}"], [f"t{k + 1}"], f"n{k}"))
    nodes.append(helper.make_node("BatchNormalization", ["t3000", "g", "b", "m", "v"], ["y"], "bn"))
    inits = [wt] + [numpy_helper.from_array(np.ones(8, np.float32), n) for n in "gbmv"]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    reads = segments._layout_reads(list(graph.node), graph)
    assert reads.get("t3000") == len(nodes) - 1, {k: reads[k] for k in list(reads)[:3]}
    assert reads.get("t1500") == len(nodes) - 1  # the blocked Conv's output reaches the BatchNormalization through all
