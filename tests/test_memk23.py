"""Calibrate's memory on a vocoder's long 1-D activations (session 23, kokoro_ja_int8): cuts through residual sums
that an instance normalization reads, and no optimized copy of a model onnxruntime lays out nothing of blocked."""

import contextlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_segments import _one_session_and_segments_write_one_file

from qtool import model as qmodel
from qtool.collection import collect, segments
from qtool.runtime import nchwc


def _adain_resblocks(ch: int = 8, steps: int = 256, blocks: int = 4, style: int = 16, seed: int = 23) -> onnx.ModelProto:
    """Kokoro's iSTFTNet resblocks as its ONNX export spells them: a Conv1d stem, then per block an AdaIN (an instance
    normalization over time written as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, then * (1 + gamma) + beta,
    gamma and beta a Gemm of the style vector), a LeakyReLU, a Conv1d, and the block's input added back: each residual
    sum is read by the next block's ReduceMean and Sub and by the next residual Add."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind, inputs, name, **attrs):
        nodes.append(helper.make_node(kind, inputs, [name], name=name, **attrs))
        return name

    axes, one, two, eps = init("axes", np.array([2], np.int64)), init("one", np.float32(1)), init("two", np.float32(2)), \
        init("eps", np.float32(1e-5))
    x = op("Conv", ["x", init("stem.w", rng.normal(0, 0.7, (ch, 2, 1)).astype(np.float32))], "/stem/Conv")
    for b in range(blocks):
        s = f"/res{b}"
        gamma = op("Unsqueeze", [op("Gemm", ["style", init(f"g{b}.w", rng.normal(0, 0.2, (style, ch)).astype(np.float32)),
                                             init(f"g{b}.b", rng.normal(0, 0.1, ch).astype(np.float32))], f"{s}/fc_g"), axes],
                   f"{s}/gamma")
        beta = op("Unsqueeze", [op("Gemm", ["style", init(f"b{b}.w", rng.normal(0, 0.2, (style, ch)).astype(np.float32)),
                                            init(f"b{b}.b", rng.normal(0, 0.1, ch).astype(np.float32))], f"{s}/fc_b"), axes],
                  f"{s}/beta")
        mean = op("ReduceMean", [x], f"{s}/mean", axes=[2])
        d = op("Sub", [x, mean], f"{s}/centred")
        var = op("ReduceMean", [op("Pow", [d, two], f"{s}/square")], f"{s}/var", axes=[2])
        n = op("Div", [d, op("Sqrt", [op("Add", [var, eps], f"{s}/var_eps")], f"{s}/std")], f"{s}/norm")
        h = op("Add", [op("Mul", [n, op("Add", [one, gamma], f"{s}/scale")], f"{s}/scaled"), beta], f"{s}/adain")
        h = op("LeakyRelu", [h], f"{s}/act", alpha=0.2)
        w = init(f"c{b}.w", (rng.normal(0, 1, (ch, ch, 3)) / np.sqrt(3 * ch)).astype(np.float32))
        h = op("Conv", [h, w, init(f"c{b}.b", rng.normal(0, 0.1, ch).astype(np.float32))], f"{s}/conv", pads=[1, 1])
        x = op("Add", [h, x], f"{s}/sum")
    nodes.append(helper.make_node("Conv", [x, init("head.w", rng.normal(0, 0.3, (1, ch, 1)).astype(np.float32))], ["y"],
                                  name="/head/Conv"))
    graph = helper.make_graph(nodes, "adain_resblocks",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, steps]),
                               helper.make_tensor_value_info("style", TensorProto.FLOAT, [1, style])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, steps])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _files(tmp_path, count: int = 3, steps: int = 256):
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for k in range(count):
        np.savez(folder / f"{k}.npz", x=rng.standard_normal((1, 2, steps)).astype(np.float32),
                 style=rng.standard_normal((1, 16)).astype(np.float32))
    return folder


def test_residual_sums_an_instance_norm_reads_do_not_block_cuts(tmp_path, monkeypatch):
    """kokoro_ja_int8's vocoder was cut in 16 segments of which three held 371, 377 and 1078 MB of a run's 2.27 GB
    (calibrate at 2.3 GB peak RSS): each resblock's residual sum, which collect computes from fetched tensors, is
    read by the next AdaIN's ReduceMean and Sub and crossed every position of a group of resblocks. onnxruntime's one
    fusion taking in a ReduceMean's input (LayerNormFusion, then SkipLayerNormFusion) leaves alone a ReduceMean whose
    output is a graph output, as every fetched one is: the sums are carried, cuts go between the blocks, and the file
    is the one session's."""
    model = _adain_resblocks()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    sums = [f"/res{b}/sum" for b in range(3)]
    assert not set(sums) & set(fetched)  # collect computes them
    exposed = qmodel.with_outputs(model, fetched, types)
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 4, types)
    assert len(positions) >= 3, positions  # none before
    parts = segments.split(exposed, fetched, positions)
    carried = {t for part in parts[1:] for t in part.inputs}
    assert set(sums) & carried, carried
    path = tmp_path / "adain.onnx"
    onnx.save(model, path)
    _one_session_and_segments_write_one_file(path, _files(tmp_path), tmp_path, monkeypatch)


def test_a_reduce_mean_inside_a_layer_norm_it_may_fuse_still_blocks_a_cut():
    """The rule is only for a ReduceMean whose output is a graph output: one whose output is not (onnxruntime may fuse
    it into a LayerNormalization, and an Add before it then into a SkipLayerNormalization) still counts."""
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("ReduceMean", ["s"], ["m"], axes=[2]),
             helper.make_node("Sub", ["s", "m"], ["d"]), helper.make_node("Add", ["d", "s"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in "ab"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b", "d", "y")])
    computed = segments._computed(list(graph.node), graph, {"a", "b", "d", "y"})
    assert "s" not in computed
    graph.output.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, None))
    assert "s" in segments._computed(list(graph.node), graph, {"a", "b", "d", "y", "m"})


def test_a_model_nothing_of_which_is_blocked_makes_no_optimized_copy(tmp_path, monkeypatch):
    """Kokoro's convolutions are all 1-D (3-D weights), which onnxruntime's blocked (NCHWc) transformer never takes;
    calibrate still made an optimized copy of the whole float model to look for blocked tensors (the layout probe:
    477 -> 1433 MB of peak RSS while it was made) and one of each segment before its session. None is made now for
    a model no node of which may be blocked (nchwc.may_block), and the file is the same; a 2-D convolution
    network still makes them."""
    made = []
    real = nchwc.optimized_apart

    @contextlib.contextmanager
    def optimized_apart(model):  # what makes the optimized copy (nchwc.fetching_session's, blocked_layout's)
        made.append(len(model.graph.node))
        with real(model) as found:
            yield found

    monkeypatch.setattr(nchwc, "optimized_apart", optimized_apart)
    model = _adain_resblocks()
    path = tmp_path / "adain.onnx"
    onnx.save(model, path)
    _one_session_and_segments_write_one_file(path, _files(tmp_path), tmp_path, monkeypatch)
    assert made == []
    assert not nchwc.may_block(model)
    w = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    conv2d = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "c",
                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    assert nchwc.may_block(helper.make_model(conv2d))
