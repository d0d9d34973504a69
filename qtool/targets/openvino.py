"""OpenVINO: the FP32 ONNX model with FakeQuantize nodes that OpenVINO runs in int8.

Node format (openvinotoolkit/openvino src/frontends/onnx/frontend/src/op/org.openvinotoolkit/
fake_quantize.cpp): op_type `FakeQuantize`, domain `org.openvinotoolkit` (declared version 1 in
opset_import), inputs X, input_low, input_high, output_low, output_high, attribute `levels`.
The ranges are initializers (constants), or OpenVINO's low-precision transformations do not
turn the pair FakeQuantize -> Convolution into an int8 convolution. Output ranges equal input
ranges (as NNCF's ONNX export writes them, openvinotoolkit/nncf src/nncf/onnx/graph/node_utils.py). Shapes: scalar per tensor; [C,1,1,1] for Conv weights, the
output-channel axis otherwise. onnxruntime cannot run the result; OpenVINO can.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..model import data_inputs, prequantized
from ..model import graph as G
from ..options import ExportOptions
from ..quantizers import grids, placement, policy
from . import get, peepholes, reductions
from .cpu import Prepared, export_prepared, with_quantizers
from .cpu import prepare as cpu_prepare
from .cpu import report_view as cpu_report_view

DEFAULTS = ExportOptions("openvino")

DOMAIN = "org.openvinotoolkit"
FLOAT_TYPES = get("openvino").float_types  # FLOAT and FLOAT16


def suffix(options: ExportOptions | None = None) -> str:
    return get("openvino").suffix


def _np_type(elem_type: int):
    return np.float16 if elem_type == TensorProto.FLOAT16 else np.float32


def _fake_quantize(model: onnx.ModelProto, namer: G.Namer, tensor: str, params: grids.QParams, shape: tuple, elem_type: int,
                   out: str | None = None) -> str:
    """Append a FakeQuantize reading `tensor` (writing `out`, default a fresh name); returns the name of its output."""
    dtype = _np_type(elem_type)
    low = np.asarray(params.input_low, dtype=dtype).reshape(shape)
    high = np.asarray(params.input_high, dtype=dtype).reshape(shape)
    lo_name = namer.fresh(f"{tensor}/fq/input_low")
    hi_name = namer.fresh(f"{tensor}/fq/input_high")
    model.graph.initializer.extend([numpy_helper.from_array(low, lo_name), numpy_helper.from_array(high, hi_name)])
    out = out or namer.fresh(f"{tensor}/fq")
    model.graph.node.append(helper.make_node(
        "FakeQuantize", [tensor, lo_name, hi_name, lo_name, hi_name], [out],
        name=namer.fresh(f"{tensor}/FakeQuantize"), domain=DOMAIN, levels=params.levels,
    ))
    return out


# 8-bit weights are stored compressed, as OpenVINO stores a FakeQuantize of constant weights
# (openvinotoolkit/openvino src/common/offline_transformations compress_quantize_weights.hpp:
# Constant (low precision) -> Convert -> Subtract zero point -> Multiply scale; NNCF's IR holds
# the same): an int8 initializer -> Cast -> Mul by the per-channel scale, the zero point being 0.
COMPRESSED_GRID = grids.grid(8, signed=True, narrow=True)


def _codes(w: np.ndarray, low: np.ndarray, high: np.ndarray, g: grids.Grid) -> np.ndarray:
    """The integers OpenVINO's FakeQuantize of the constant `w` (range [low, high], g.levels levels)
    stands for, as it computes them when it runs such a layer in int8: its reference formula in the
    weights' float type (openvinotoolkit/openvino src/core/reference/include/openvino/reference/
    fake_quantize.hpp), onto [qmin, qmax]."""
    n = w.dtype.type(g.levels - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((w - low) / (high - low) * n)
    q = np.where(w <= np.minimum(low, high), 0, np.where(w > np.maximum(low, high), n, q))
    return (q.astype(np.int64) + g.qmin).astype(np.int8)


def _compressed_weight(model: onnx.ModelProto, namer: G.Namer, site, params: grids.QParams, values: np.ndarray,
                       nodes: dict[str, onnx.NodeProto], transposed: bool) -> str:
    """Append the int8 weight, its Cast and Mul; returns the name of the dequantized weight. The
    integers and scales are those OpenVINO derives from the FakeQuantize of `values` the file held
    before (`_fake_quantize`'s ranges), so it computes the same. `transposed` (a MatMul's [K, N]
    weight): stored [N, K], the layout of OpenVINO's FullyConnected, with a Transpose after the Mul,
    which OpenVINO folds into the layer; stored [K, N], OpenVINO transposes the int8 constant at
    every inference (it keeps compressed weights unfolded: MiniLM-L3, 24 runtime Transposes -> 6).
    `nodes`: the model's nodes by name (its readers', whose bias an asymmetric flip shifts)."""
    dtype = _np_type(site.elem_type)
    shape = grids.range_shape(params, values.ndim)
    low = np.asarray(params.input_low, dtype=dtype).reshape(shape)
    high = np.asarray(params.input_high, dtype=dtype).reshape(shape)
    q = _codes(np.asarray(values, dtype=dtype), low, high, params.grid)
    scale = (high - low) / dtype(params.grid.levels - 1)
    if site.channel_signs is not None:  # the guard's flipped input channels: symmetric codes negate exactly
        if site.flip_offset:
            for node_name, _ in site.readers:
                _flip_bias(model, namer, nodes[node_name], site, q, scale)
        q = (q * site.channel_signs.astype(np.int8).reshape(1, -1, *[1] * (q.ndim - 2))).astype(np.int8)
    if transposed:
        q, scale = np.ascontiguousarray(q.T), np.ascontiguousarray(scale.T)
    stored, scale_name = namer.fresh(f"{site.tensor}/int8"), namer.fresh(f"{site.tensor}/scale")
    model.graph.initializer.extend([numpy_helper.from_array(q, stored), numpy_helper.from_array(scale, scale_name)])
    converted, out = namer.fresh(f"{site.tensor}/int8/float"), namer.fresh(f"{site.tensor}/dequantized")
    model.graph.node.extend([
        helper.make_node("Cast", [stored], [converted], name=namer.fresh(f"{site.tensor}/Convert"), to=site.elem_type),
        helper.make_node("Mul", [converted, scale_name], [out], name=namer.fresh(f"{site.tensor}/Multiply")),
    ])
    if not transposed:
        return out
    back = namer.fresh(f"{site.tensor}/dequantized/transposed")
    model.graph.node.append(helper.make_node("Transpose", [out], [back], name=namer.fresh(f"{site.tensor}/Transpose"), perm=[1, 0]))
    return back


def _flipped(model: onnx.ModelProto, namer: G.Namer, site, source: str | None = None) -> str:
    """Append the guard's sign flip of an activation's channels (site.channel_signs, +-1 shaped for
    its tensor): a Mul by the signs, stored as int8 and Cast to the tensor's type; returns the
    flipped tensor. By a float constant, OpenVINO 2026.4 folds the Mul into the FakeQuantize after
    it and, with negative signs and dynamic input shapes, computes that FakeQuantize wrong
    (PP-OCRv5 cls at 7 dB); from a Cast it runs the Mul and the FakeQuantize as one elementwise
    kernel, as the file says (PP-OCRv6 rec: the input stage 6 us, a 1x1 depthwise Conv of the
    signs 60 us). That holds with its low-precision transformations, as it runs an int8 file by
    default; with LP_TRANSFORMS_MODE NO it folds the Cast as well and computes the flip wrong. `source`: the
    tensor flipped (default: the site's; its explicit padding, `_padded`)."""
    signs, cast = namer.fresh(f"{site.tensor}/signs"), namer.fresh(f"{site.tensor}/signs/float")
    out = namer.fresh(f"{site.tensor}/flipped")
    model.graph.initializer.append(numpy_helper.from_array(site.channel_signs.astype(np.int8), signs))
    model.graph.node.extend([
        helper.make_node("Cast", [signs], [cast], name=namer.fresh(f"{site.tensor}/signs/Convert"), to=site.elem_type),
        helper.make_node("Mul", [source or site.tensor, cast], [out], name=namer.fresh(f"{site.tensor}/Flip")),
    ])
    if not site.flip_offset:
        return out
    # an asymmetric grid: offset - x, which keeps the grid's range (Quantizer.flip_offset)
    offsets, shifted = namer.fresh(f"{site.tensor}/offsets"), namer.fresh(f"{site.tensor}/flipped/shifted")
    values = np.where(site.channel_signs < 0, site.flip_offset, 0.0).astype(_np_type(site.elem_type))
    model.graph.initializer.append(numpy_helper.from_array(values, offsets))
    model.graph.node.append(helper.make_node("Add", [out, offsets], [shifted], name=namer.fresh(f"{site.tensor}/Flip/Shift")))
    return shifted


def _padded(model: onnx.ModelProto, namer: G.Namer, site, layer: onnx.NodeProto) -> str:
    """An asymmetric flip's explicit padding (Quantizer.flip_pads): a zero Pad of the site's tensor, which the flip
    then turns into flip_offset on the flipped channels, as the layer's own padding (0 on the unflipped grid) stands
    for; the layer's pads set to 0. Returns the padded tensor."""
    spatial = len(site.flip_pads) // 2
    pads = [0, 0, *site.flip_pads[:spatial], 0, 0, *site.flip_pads[spatial:]]
    out = namer.fresh(f"{site.tensor}/padded")
    name = namer.fresh(f"{site.tensor}/Pad")
    if G.default_opset(model) >= 11:
        pads_name = namer.fresh(f"{site.tensor}/pads")
        model.graph.initializer.append(numpy_helper.from_array(np.array(pads, dtype=np.int64), pads_name))
        model.graph.node.append(helper.make_node("Pad", [site.tensor, pads_name], [out], name=name, mode="constant"))
    else:  # the attribute form before opset 11
        model.graph.node.append(helper.make_node("Pad", [site.tensor], [out], name=name, mode="constant", pads=pads, value=0.0))
    for a in layer.attribute:
        if a.name == "pads":
            del a.ints[:]
            a.ints.extend([0] * len(site.flip_pads))
    return out


def _flip_bias(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, site, q: np.ndarray, scale: np.ndarray) -> None:
    """The bias share of an asymmetric flip (Quantizer.flip_offset): `node` (a Conv reading the
    weight `site`, integers `q` [O, C, ...] before the flip, `scale` per output channel) adds
    offset x the flipped channels' dequantized weights, which offset - x takes away."""
    flipped = site.channel_signs < 0
    weights = q.astype(np.float64) * np.asarray(scale, dtype=np.float64).reshape(-1, *[1] * (q.ndim - 1))
    share = site.flip_offset * weights[:, flipped].reshape(q.shape[0], -1).sum(axis=1)
    dtype = _np_type(site.elem_type)
    inits = {t.name: t for t in model.graph.initializer}
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    name = namer.fresh(f"{node.name}/bias/flip")
    if bias is None or bias in inits:
        base = np.zeros(q.shape[0]) if bias is None else numpy_helper.to_array(inits[bias]).astype(np.float64)
        model.graph.initializer.append(numpy_helper.from_array((base + share).astype(dtype), name))
    else:
        model.graph.initializer.append(numpy_helper.from_array(share.astype(dtype), name + "/share"))
        model.graph.node.append(helper.make_node("Add", [bias, name + "/share"], [name], name=namer.fresh(f"{node.name}/bias/Flip")))
    while len(node.input) < 3:
        node.input.append("")
    node.input[2] = name


# OpenVINO 2026.4's CPU plugin fuses a FakeQuantize into the ReduceMax/ReduceMin that feeds it and, where an int8
# layer reads it, computes something else (bench/openvino_quirks.py, case 4: 24 dB and 1 dB from the file; AttaCut's
# Thai segmenter ran at 7 dB for its file's 43). Max and min commute with a per-tensor FakeQuantize (a non-decreasing
# function of each element), so the quantizer goes on the reduction's input and the file computes the same numbers.
COMMUTING_REDUCTIONS = ("ReduceMax", "ReduceMin")


# Data-movement ops a per-tensor FakeQuantize commutes with (each output value is one of the inputs' values): the
# reduction's quantizer moves up through them to the layers that compute its input (placement moves a reader's
# request through them; this one is placed by the writer). Below them OpenVINO ran it alone, in f32, after f32
# Transposes; at a Conv's output it fuses into the Convolution, which writes u8 (AttaCut's character CNN: Conv ->
# Transpose -> Unsqueeze -> stack -> ReduceMax, three FakeQuantize nodes and f32 reorders gone, as NNCF's file).
HOISTED_THROUGH = ("Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Concat")


def _below_reduction(model: onnx.ModelProto, namer: G.Namer, reduction: onnx.NodeProto, params: grids.QParams,
                     elem_type: int) -> tuple[str, str]:
    """A FakeQuantize of the reduction's input and a copy of the reduction reading it; returns the copy's output
    (the per-tensor FakeQuantize of the reduction's output, computed in the order OpenVINO runs right) and the
    FakeQuantize's name (for `_hoist`)."""
    quantized = _fake_quantize(model, namer, reduction.input[0], params, (), elem_type)
    fq_name = model.graph.node[-1].name
    copy = onnx.NodeProto()
    copy.CopyFrom(reduction)
    copy.name = namer.fresh(f"{reduction.name}/quantized")
    copy.input[0] = quantized
    del copy.output[:]
    copy.output.append(namer.fresh(f"{reduction.output[0]}/fq"))
    model.graph.node.append(copy)
    return copy.output[0], fq_name


def _live_readers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """tensor -> the nodes reading it that the graph's outputs need (a node the export left unread does not count)."""
    made_by = G.producers(model.graph)
    needed = {o.name for o in model.graph.output}
    live: set[int] = set()
    stack = list(needed)
    while stack:
        n = made_by.get(stack.pop())
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        for r in G.node_reads(n):
            if r not in needed:
                needed.add(r)
                stack.append(r)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        if id(n) in live:
            for t in G.node_reads(n):
                readers.setdefault(t, []).append(n)
    return readers


def _hoist(model: onnx.ModelProto, namer: G.Namer, fq_names: list[str]) -> None:
    """Move each FakeQuantize of `fq_names` (per tensor) up through HOISTED_THROUGH ops, one copy per data input of a
    Concat, while it alone reads what such an op writes and the op alone reads its data inputs (no graph input or
    output, no constant among them): the same numbers, each FakeQuantize next to the layer computing its input."""
    outputs = {o.name for o in model.graph.output}
    consts = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    work = [n for n in model.graph.node if n.name in set(fq_names)]
    while work:
        fq = work.pop()
        t = fq.input[0]
        made_by = G.producers(model.graph)
        readers = _live_readers(model)
        op = made_by.get(t)
        if op is None or op.domain not in ("", "ai.onnx") or op.op_type not in HOISTED_THROUGH or t in outputs:
            continue
        data = list(range(len(op.input))) if op.op_type == "Concat" else [0]
        if [id(r) for r in readers.get(t, [])] != [id(fq)] or any(
                op.input[k] in consts or op.input[k] in outputs or [id(r) for r in readers.get(op.input[k], [])] != [id(op)]
                for k in data):
            continue
        for k in data:
            copy = onnx.NodeProto()
            copy.CopyFrom(fq)
            copy.name = namer.fresh(f"{op.input[k]}/FakeQuantize")
            copy.input[0] = op.input[k]
            copy.output[0] = namer.fresh(f"{op.input[k]}/fq")
            op.input[k] = copy.output[0]
            model.graph.node.append(copy)
            work.append(model.graph.node[-1])  # the graph's own message (append copies)
        G.rename_reads(model.graph, fq.output[0], t)
        model.graph.node.remove(fq)


# OpenVINO 2026.4 reads a Conv's bias as Convolution -> Add and, on a dynamic shape, moves a ShapeOf of the Conv's
# output (or of an activation or a FakeQuantize after it) onto the Convolution before that Add. The Convolution then
# has two readers, so its CPU plugin leaves the bias out of it and folds the Add into the FakeQuantize after it instead
# (FusePerformedAsScaleShiftAndFakeQuantize, openvinotoolkit/openvino src/plugins/intel_cpu/src/graph_optimizer.cpp),
# which, kept per tensor, applies the first channel's bias to every channel (bench/openvino_quirks.py, case 6; CRAFT's
# text detector, whose upsampling reads its skips' sizes, ran at 2.35 dB for its file's 20.55). Such a Conv's bias is
# written as an Add after a Conv without one: the same numbers, and OpenVINO fuses that Add into the Convolution.
# The ShapeOf it moves there is the ONNX frontend's own: it reads a Conv's output shape to reshape the bias, and
# OptimizeSymbolsUsedAsValues (openvinotoolkit/openvino src/common/transformations/src/transformations/
# symbolic_transformations/symbol_optimization.cpp) takes the first ShapeOf input that carries a dimension's symbol
# as the source of every value of that dimension. A Convolution copies its input's batch dimension, symbol and all:
# with a dynamic batch, a batch size read anywhere as a value (Shape -> Gather -> ConstantOfShape, an LSTM's zero
# initial state; an ONNX LSTM, GRU or RNN, whose sequence lengths the frontend broadcasts to the batch read from its
# input's shape) is re-read from a biased Convolution's output, far from where the file reads it (bench/
# openvino_quirks.py, case 7: 7 dB; a seizure detector's spectrogram CNN -> two LSTMs at 7.85 dB for its file's
# 48.65; a GRU or an RNN reading the Conv's features, -8 dB). Which Convolution's ShapeOf comes first is OpenVINO's
# order, so in a model with a dynamic batch that reads one so, every Conv with a bias is written as above: the
# Convolution hosting that ShapeOf leaves its bias, and with it every post-op after it, out even where its
# FakeQuantize is not right after it. tesseranet's stem, Conv -> x * sigmoid(x) -> Mul by a constant -> FakeQuantize,
# ran as an int8 Convolution and then one f32 eltwise pass of bias, Swish and FakeQuantize over its output (6 of 41 ms
# in a one-thread profile, where NNCF's IR, its bias a folded constant, runs them in the Convolution); with only the
# Convs quantized right after them written so, the ShapeOf moved on to the next Conv with a bias. A shape
# that only sizes Reshapes does not count: OpenVINO rewrites Shape -> Gather -> Concat -> Reshape into a Reshape that
# copies the dimension, with no ShapeOf left (a dynamic-batch CNN's flatten runs right: 139 dB; so do whole shapes
# into Expand or ConstantOfShape and a Size, which are no single dimension's value).
SHAPE_KEEPING = ("Relu", "Clip", "FakeQuantize")  # ops between the Conv and the Shape or FakeQuantize that OpenVINO sees through
RECURRENT = ("LSTM", "GRU", "RNN")  # their ONNX frontend reads the batch from the input's shape (the sequence lengths)
# ops a shape's values pass through to where they are used
SHAPE_ARITHMETIC = ("Gather", "Slice", "Unsqueeze", "Squeeze", "Concat", "Cast", "Add", "Sub", "Mul", "Div", "Identity")
_RANK_KEEPING = ("Mul", "Cast", "Transpose", "FakeQuantize", "DequantizeLinear", "Identity")  # a weight's path from its initializer


def _reads_batch_value(index: G.Index, model: onnx.ModelProto) -> bool:
    """Whether the model has a recurrent op, or a Shape whose values reach anything but the shape input of a Reshape
    (through SHAPE_ARITHMETIC), or is an output of the model: where OpenVINO may read a batch size as a value from a
    biased Convolution's output."""
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in RECURRENT:
            return True
        if node.op_type != "Shape":
            continue
        chain, seen = [node.output[0]], set()
        while chain:
            tensor = chain.pop()
            if tensor in outputs:
                return True
            for reader, slot in index.readers.get(tensor, []):
                if reader.op_type in SHAPE_ARITHMETIC and reader.domain in ("", "ai.onnx"):
                    if reader.output[0] not in seen:
                        seen.add(reader.output[0])
                        chain.append(reader.output[0])
                elif not (reader.op_type == "Reshape" and slot == 1):
                    return True
    return False


def _weight_initializer(index: G.Index, conv: onnx.NodeProto) -> onnx.TensorProto | None:
    """`conv`'s weight initializer, through the int8 weight's Cast and Mul (_RANK_KEEPING); None where it is computed."""
    t = conv.input[1]
    while t not in index.constants:
        node = index.producer.get(t)
        if node is None or node.op_type not in _RANK_KEEPING:
            return None
        t = node.input[0]
    return index.constants[t]


def _spatial_dims(index: G.Index, conv: onnx.NodeProto) -> int | None:
    """The number of spatial axes of `conv`: its kernel_shape's, else its weight initializer's rank less 2 (through the
    int8 weight's Cast and Mul), None where neither says."""
    kernel = G.attr(conv, "kernel_shape")
    if kernel:
        return len(kernel)
    weight = _weight_initializer(index, conv)
    return None if weight is None else len(weight.dims) - 2


def _shape_read_convs(model: onnx.ModelProto, index: G.Index) -> list[onnx.NodeProto]:
    """The Convs with a bias whose output, directly or through SHAPE_KEEPING ops, a FakeQuantize quantizes and a Shape
    reads, in a model with a dynamic input (static, OpenVINO folds every Shape), and with a dynamic batch (a data input
    whose first dimension is not fixed) every Conv with a bias where the model reads a batch size as a value
    (_reads_batch_value): those OpenVINO 2026.4 may run with the first channel's bias, or with their bias and the
    post-ops after it outside the Convolution."""
    specs = data_inputs(model)
    if all(None not in spec.dims for spec in specs):
        return []
    batch_read = any(spec.dims[:1] == (None,) for spec in specs) and _reads_batch_value(index, model)
    found = []
    for node in model.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 3 or not node.input[2]:
            continue
        chain, readers = [node.output[0]], []
        while chain:
            for reader, slot in index.readers.get(chain.pop(), []):
                readers.append(reader)
                if slot == 0 and reader.op_type in SHAPE_KEEPING:
                    chain.append(reader.output[0])
        if batch_read or (any(r.op_type == "Shape" for r in readers) and
                          any(r.op_type == "FakeQuantize" and r.domain == DOMAIN for r in readers)):
            found.append(node)
    return found


def _bias_after(model: onnx.ModelProto, namer: G.Namer, index: G.Index, conv: onnx.NodeProto) -> None:
    """`conv`'s bias as an Add after it, shaped [C, 1, ...] to broadcast along the channel axis (in place); left in
    the Conv where its number of spatial axes is unknown."""
    spatial = _spatial_dims(index, conv)
    if spatial is None:
        return
    bias = conv.input[2]
    shaped = namer.fresh(f"{bias}/per_channel")
    if bias in index.constants:
        values = numpy_helper.to_array(index.constants[bias])
        model.graph.initializer.append(numpy_helper.from_array(values.reshape(-1, *[1] * spatial), shaped))
    else:
        shape = namer.fresh(f"{bias}/per_channel/shape")
        model.graph.initializer.append(numpy_helper.from_array(np.array([-1] + [1] * spatial, np.int64), shape))
        model.graph.node.append(helper.make_node("Reshape", [bias, shape], [shaped], name=namer.fresh(f"{conv.name}/bias/Reshape")))
    out = conv.output[0]
    raw = namer.fresh(f"{out}/without_bias")
    conv.output[0] = raw
    del conv.input[2:]
    model.graph.node.append(helper.make_node("Add", [raw, shaped], [out], name=namer.fresh(f"{conv.name}/bias/Add")))


def _float_type(index: G.Index, conv: onnx.NodeProto) -> int:
    """The float type `conv` computes in: its int8 weight's Cast target, else its weight FakeQuantize's range type."""
    weight = index.producer.get(conv.input[1])
    if weight is not None and weight.op_type == "Mul" and weight.input[0] in index.producer:
        cast = index.producer[weight.input[0]]
        if cast.op_type == "Cast":
            return G.attr(cast, "to")
    if weight is not None and weight.op_type == "FakeQuantize" and weight.input[1] in index.constants:
        return index.constants[weight.input[1]].data_type
    return TensorProto.FLOAT


def _unbiased_fanned_out(model: onnx.ModelProto, index: G.Index) -> list[onnx.NodeProto]:
    """The int8 Convs (a FakeQuantize's output in, an int8 weight's Cast and Mul or a FakeQuantize's weight) with no
    bias or an all-zero constant one whose output more than one node reads (a graph output counts as one): those
    OpenVINO 2026.4's CPU plugin runs wrong, one reader handed the output scaled again (bench/openvino_quirks.py
    case 15)."""
    found = []
    for node in model.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        x, w = index.producer.get(node.input[0]), index.producer.get(node.input[1])
        if x is None or x.op_type != "FakeQuantize" or x.domain != DOMAIN or w is None or w.op_type not in ("Mul", "FakeQuantize"):
            continue
        if len(node.input) > 2 and node.input[2]:
            bias = index.constants.get(node.input[2])
            if bias is None or numpy_helper.to_array(bias).any():
                continue
        if len(index.readers.get(node.output[0], [])) + (node.output[0] in index.outputs) > 1:
            found.append(node)
    return found


def _tiny_bias(model: onnx.ModelProto, namer: G.Namer, index: G.Index, conv: onnx.NodeProto) -> None:
    """Give `conv` (no bias, or an all-zero one) a bias of the smallest positive number of its float type (in place):
    float32's smallest normal 1.2e-38 (y + 1.2e-38 is y for every |y| of 2**-101 or more, and 1.2e-38 where y is 0), float16's
    smallest subnormal 2**-24 (float16 has no normal that small: one rounding of values below 2**-12 may move by an ulp).
    With a bias, OpenVINO's CPU plugin computes each of the Conv's readers right."""
    elem_type = _float_type(index, conv)
    dtype = _np_type(elem_type)
    tiny = np.float16(2 ** -24) if dtype == np.float16 else np.finfo(dtype).tiny
    weight = _weight_initializer(index, conv)
    if weight is None:
        return
    channels = weight.dims[0]
    name = namer.fresh(f"{conv.name}/bias/tiny")
    model.graph.initializer.append(numpy_helper.from_array(np.full(channels, tiny, dtype), name))
    del conv.input[2:]
    conv.input.append(name)


def _int8_lstm(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, site) -> None:
    """Rewrite the LSTM `node` as its placement.recurrent.RecurrentSite says, in the form OpenVINO's CPU plugin runs in
    int8: X through a FakeQuantize from its range onto the hidden state's grid, W and R as compressed int8 weights
    (int8 -> Cast -> Mul by one [1, 4H, 1] scale), the re-encoding's bias, the initial state through the grid (zeros
    [directions, batch, hidden] made from X's shape where the LSTM has none and X's batch is not fixed: _static_batch);
    X padded with `site.pad` zero features before its FakeQuantize and W with as many zero columns (the same numbers, a
    primitive of its own in OpenVINO: placement.recurrent)."""
    base = node.name

    def const(array: np.ndarray, name: str) -> str:
        name = namer.fresh(f"{base}/{name}")
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def fake_quantize(tensor: str, low: float, high: float, what: str) -> str:
        il, ih = const(np.float32(low), f"{what}/input_low"), const(np.float32(high), f"{what}/input_high")
        ol, oh = const(np.float32(site.grid[0]), f"{what}/output_low"), const(np.float32(site.grid[1]), f"{what}/output_high")
        out = namer.fresh(f"{base}/{what}/fq")
        model.graph.node.append(helper.make_node("FakeQuantize", [tensor, il, ih, ol, oh], [out], name=namer.fresh(f"{base}/{what}/FakeQuantize"),
                                                 domain=DOMAIN, levels=256))
        return out

    scale = const(site.scale, "scale")

    def weight(codes: np.ndarray, what: str) -> str:
        converted, out = namer.fresh(f"{base}/{what}/int8/float"), namer.fresh(f"{base}/{what}/dequantized")
        model.graph.node.extend([
            helper.make_node("Cast", [const(codes, f"{what}/int8")], [converted], name=namer.fresh(f"{base}/{what}/Convert"), to=TensorProto.FLOAT),
            helper.make_node("Mul", [converted, scale], [out], name=namer.fresh(f"{base}/{what}/Multiply")),
        ])
        return out

    while len(node.input) < 4:
        node.input.append("")
    x_in = node.input[0]
    x, w_codes = _padded_input(model, namer, base, x_in, site)
    node.input[0] = fake_quantize(x, *site.x_range, "X")
    node.input[1] = weight(w_codes, "W")
    node.input[2] = weight(site.r_codes, "R")
    node.input[3] = const(site.bias, "B")
    state = site.state
    if state is None and _static_batch(model, x_in):
        return  # no initial state: OpenVINO folds a static batch's zeros to a constant (below)
    if state is None:
        dirs, hidden = site.w_codes.shape[0], site.w_codes.shape[1] // 4
        shape, batch, dims, state = (namer.fresh(f"{base}/initial_h/{k}") for k in ("shape", "batch", "dims", "zeros"))
        model.graph.node.extend([
            helper.make_node("Shape", [node.input[0]], [shape], name=namer.fresh(f"{base}/initial_h/Shape")),
            helper.make_node("Gather", [shape, const(np.array([1], np.int64), "initial_h/batch_axis")], [batch],
                             name=namer.fresh(f"{base}/initial_h/Gather"), axis=0),
            helper.make_node("Concat", [const(np.array([dirs], np.int64), "initial_h/directions"), batch,
                                        const(np.array([hidden], np.int64), "initial_h/hidden")], [dims],
                             name=namer.fresh(f"{base}/initial_h/Concat"), axis=0),
            helper.make_node("ConstantOfShape", [dims], [state], name=namer.fresh(f"{base}/initial_h/ConstantOfShape"),
                             value=numpy_helper.from_array(np.zeros(1, np.float32))),
        ])
    while len(node.input) < 6:
        node.input.append("")
    node.input[5] = fake_quantize(state, *site.grid, "initial_h")


def _padded_input(model: onnx.ModelProto, namer: G.Namer, base: str, x: str, site) -> tuple[str, np.ndarray]:
    """(the LSTM's input, its W codes), both with `site.pad` zero input features appended (a Pad; zero columns)."""
    if not site.pad:
        return x, site.w_codes
    padded = namer.fresh(f"{base}/X/padded")
    pads = [0, 0, 0, 0, 0, site.pad]  # [seq, batch, input]: zeros after the last input feature
    if G.default_opset(model) >= 11:
        name = namer.fresh(f"{base}/X/pads")
        model.graph.initializer.append(numpy_helper.from_array(np.array(pads, np.int64), name))
        model.graph.node.append(helper.make_node("Pad", [x, name], [padded], name=namer.fresh(f"{base}/X/Pad")))
    else:  # Pad-2: the pads an attribute
        model.graph.node.append(helper.make_node("Pad", [x], [padded], name=namer.fresh(f"{base}/X/Pad"), pads=pads))
    codes = site.w_codes
    return padded, np.concatenate([codes, np.zeros(codes.shape[:2] + (site.pad,), codes.dtype)], axis=2)


def _static_batch(model: onnx.ModelProto, x: str) -> bool:
    """Whether the LSTM input `x` [seq, batch, input] is declared with a fixed batch. An LSTM without an initial state
    then gets none: OpenVINO 2026.4 folds the zeros made from X's shape and their FakeQuantize into a constant there,
    and a forward LSTM so fed ran 0.8-1.7 dB from the file's arithmetic (no state: 144 dB); on a dynamic batch it needs
    the zeros (it refuses the int8 weights without a state) and runs them exactly (148 dB)."""
    for info in (*model.graph.input, *model.graph.value_info):
        if info.name == x:
            dims = info.type.tensor_type.shape.dim
            return len(dims) == 3 and dims[1].HasField("dim_value") and dims[1].dim_value > 0
    return False


# OpenVINO 2026.4's low-precision transformations, which run on any model with a FakeQuantize, read a boolean Cast
# to float and multiplied by a constant as a u8 tensor and its dequantization scale, move that Multiply down through
# Unsqueeze, Expand and Slice, and at an Add with a tensor that no such scale reads compute (x + y * (1 / c)) * c
# (openvinotoolkit/openvino src/common/low_precision_transformations/src/add.cpp). Where |c| > 1 / FLT_MIN, 1 / c
# is subnormal and y is lost: the additive causal mask of a Hugging Face decoder (a boolean triangle times
# finfo(float32).min, plus the padding mask, which is 1 or 0), where Equal(sum, 0) then masks every position
# (bench/openvino_quirks.py, case 11; t5_title_decoder's causal self-attention: every softmax row uniform, the file at
# 7 dB where its arithmetic gives 25). Such a product is written as Where(b, c, c * 0): the same numbers (1 * c = c,
# 0 * c = c * 0, its sign and NaN kept), no Convert for the transformations to read. Scales whose reciprocal is a
# normal float run right (-8e37 does; -1e38 does not), so only those products are rewritten.
BOOL_OPS = ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf")
SUBNORMAL_RECIPROCAL = 1.0 / float(np.finfo(np.float32).tiny)  # 8.5e37: |c| above it has a subnormal 1 / c


def _is_bool(index: G.Index, t: str) -> bool:
    """Whether `t` is a boolean tensor by what makes it: a comparison or logical op, a Cast to bool, a boolean graph
    input or initializer."""
    node = index.producer.get(t)
    if node is not None:
        return node.domain in ("", "ai.onnx") and (node.op_type in BOOL_OPS or (node.op_type == "Cast" and G.attr(node, "to") == TensorProto.BOOL))
    if t in index.initializers:
        return index.initializers[t].data_type == TensorProto.BOOL
    return any(i.name == t and i.type.tensor_type.elem_type == TensorProto.BOOL for i in index.graph.input)


def _constant_values(index: G.Index, t: str) -> np.ndarray | None:
    """The values of `t` where the graph fixes them (folded constants; a ConstantOfShape's value, whatever its shape:
    a scalar), None otherwise."""
    node = index.producer.get(t)
    if node is not None and node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        value = G.attr(node, "value")
        return np.zeros((), np.float32) if value is None else numpy_helper.to_array(value).reshape(())
    return index.values.value(t)


def _huge_bool_scales(model: onnx.ModelProto, namer: G.Namer) -> int:
    """Rewrite Mul(Cast(b, to=float), c), b boolean, c constant with some |c| > SUBNORMAL_RECIPROCAL, as
    Where(b, c, c * 0) (in place); returns how many."""
    index = G.Index(model)
    done = 0
    for node in list(model.graph.node):
        if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        for k in (0, 1):
            cast, other = index.producer.get(node.input[k]), node.input[1 - k]
            if cast is None or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx") or G.attr(cast, "to") != TensorProto.FLOAT \
                    or not _is_bool(index, cast.input[0]):
                continue
            values = _constant_values(index, other)
            if values is None or values.dtype != np.float32 or not values.size:
                continue
            with np.errstate(invalid="ignore"):
                if not np.any(np.abs(values.astype(np.float64)) > SUBNORMAL_RECIPROCAL):
                    continue
                zeros = values * np.float32(0)  # c * 0: -0 for negative c, NaN for infinite c, as the Mul computes
            name = namer.fresh(f"{node.output[0]}/else")
            model.graph.initializer.append(numpy_helper.from_array(zeros, name))
            where = helper.make_node("Where", [cast.input[0], other, name], [node.output[0]], name=namer.fresh(f"{node.name}/Where"))
            position = list(model.graph.node).index(node)
            model.graph.node.remove(node)
            model.graph.node.insert(position, where)
            done += 1
            break
    return done


# A model's own activation QuantizeLinear -> DequantizeLinear pair (onnxruntime's quantize_static in its QDQ format,
# qtool.model.prequantized) is written as the FakeQuantize of the same grid. OpenVINO's ONNX frontend reads the pair as a
# FakeQuantize, a Convert to u8 and back, and a Subtract of the zero point that its int8 layers did not absorb (smart-turn
# v3: MatMuls run f32, 11 ms of 65 in Subtracts, Converts and FakeQuantizes; 1.51x NNCF's latency, as FakeQuantize 1.18x).
# The codes are the same: QuantizeLinear's saturate(round(x / s) + zp) on [qmin, qmax] (onnx docs/Operators.md) is
# FakeQuantize's round((x - lo) / (hi - lo) * 255) with lo = s (qmin - zp), hi = s (qmax - zp), up to float rounding
# (OpenVINO's frontend makes the same FakeQuantize of the pair: src/frontends/onnx/frontend/src/op/quantize_linear.cpp).
def _own_pairs_as_fake_quantize(model: onnx.ModelProto, namer: G.Namer) -> int:
    """Each activation QuantizeLinear read only by DequantizeLinears of its own grid, and those readers, replaced
    by one FakeQuantize per reader, named as the reader's output (in place); returns the pairs written so."""
    index = G.Index(model)  # index.types only once a pair is found: it infers the finished model's shapes
    gone: set[int] = set()  # the pairs' nodes (their ids)
    pairs = prequantized.own_pairs(index)
    for q, readers, (scale, zp, kind) in pairs:
        params = grids.QParams(np.float64(scale), np.int64(zp), grids.grid(8, signed=kind == TensorProto.INT8))
        for r in readers:
            _fake_quantize(model, namer, q.input[0], params, (), index.types.get(q.input[0], TensorProto.FLOAT), out=r.output[0])
        gone.update([id(q), *(id(r) for r in readers)])
    if gone:
        kept = [n for n in model.graph.node if id(n) not in gone]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return len(pairs)


def _float_own_weights(model: onnx.ModelProto, fp32: dict[str, str]) -> int:
    """Each of the `fp32` layers that reads the model's own int8 weights on its own quantized input (a model shipped
    Q/DQ-quantized, qtool.model.prequantized: kept FP32 by the overflow guard or the user) has its weights' Dequantize-
    Linear made a float constant of the values it computes (q x scale, zero point 0, in the scale's type: onnx
    docs/Operators.md): OpenVINO runs a layer whose weights are dequantized int8 and whose input is quantized as an int8
    layer whatever the plan says. In place; returns the weights so written."""
    if not fp32:
        return 0
    index = G.Index(model)
    own = prequantized.own_quantizers(index)
    folded: set[str] = set()
    for name in sorted(fp32):
        n = index.nodes.get(name)
        if n is None or len(n.input) < 2 or n.input[1] in folded or not all(own.reads_own(t) for t in n.input[:2]):
            continue
        weight = prequantized.weight_codes(index, n.input[1])
        if weight is None or any(r.name not in fp32 for r, _ in index.readers.get(n.input[1], ())):
            continue
        dq = index.producer[n.input[1]]
        model.graph.initializer.append(numpy_helper.from_array(prequantized.dequantized(*weight), n.input[1]))
        model.graph.node.remove(dq)
        folded.add(n.input[1])
    return len(folded)  # the int8 codes and steps no node reads any more: dropped with the file's unused initializers


def apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan) -> None:
    """Insert the plan's quantizers as FakeQuantize nodes, 8-bit weights stored compressed (in place)."""
    index = G.Index(model)
    nodes = index.nodes
    below_reductions = []
    for site in plan.quantizers:
        params = site.params()
        source = site.tensor
        if not site.is_weight:
            shape = () if site.channel_amax is None else grids.range_shape(params, site.rank)  # [1, C, 1, 1] per channel
            if site.channel_signs is not None:  # the guard's flipped input channels, negated before the FakeQuantize
                padded = _padded(model, namer, site, nodes[site.readers[0][0]]) if site.flip_pads else None
                source = _flipped(model, namer, site, padded)
            reduction = index.producer.get(site.tensor)
            if not shape and source == site.tensor and reduction is not None and reduction.op_type in COMMUTING_REDUCTIONS \
                    and reduction.domain in ("", "ai.onnx"):
                out, fq_name = _below_reduction(model, namer, reduction, params, site.elem_type)
                below_reductions.append(fq_name)
                for node_name, slot in site.readers:
                    nodes[node_name].input[slot] = out
                continue
        else:
            shape = grids.range_shape(params, site.values.ndim)
            values = site.values
            if site.policy.rounding != "half-even":  # FakeQuantize rounds half to even: give it weights already on the grid
                values = policy.fake_quantize(site.values, params, site.policy.rounding).astype(_np_type(site.elem_type))
            compressed = params.grid == COMPRESSED_GRID and not np.any(params.zero_point)
            if site.channel_signs is not None and not compressed:
                raise AssertionError(f"flipped input channels need a compressed 8-bit weight ({site.tensor})")
            if compressed:
                transposed = values.ndim == 2 and all(nodes[r].op_type == "MatMul" and slot == 1 for r, slot in site.readers)
                out = _compressed_weight(model, namer, site, params, values, nodes, transposed)
                for node_name, slot in site.readers:
                    nodes[node_name].input[slot] = out
                continue
            if values is not site.values or site.unrounded is not None:  # on the grid already (another rounding, GPTQ's)
                source = namer.fresh(f"{site.tensor}/rounded")
                model.graph.initializer.append(numpy_helper.from_array(values, source))
        out = _fake_quantize(model, namer, source, params, shape, site.elem_type)
        for node_name, slot in site.readers:
            nodes[node_name].input[slot] = out
    for site in plan.recurrent:
        _int8_lstm(model, namer, nodes[site.node], site)
    _hoist(model, namer, below_reductions)
    index = G.Index(model)  # with the FakeQuantize nodes
    for conv in _shape_read_convs(model, index):
        _bias_after(model, namer, index, conv)
    index = G.Index(model)
    for conv in _unbiased_fanned_out(model, index):
        _tiny_bias(model, namer, index, conv)
    _huge_bool_scales(model, namer)
    peepholes.peephole_lstms_as_scans(model, namer)  # OpenVINO drops an LSTM's peepholes (qtool.targets.peepholes)
    reductions.spell_misread(model, namer)  # OpenVINO drops three reductions' axes (qtool.targets.reductions)
    _float_own_weights(model, plan.fp32_layers)  # a model shipped Q/DQ-quantized: its layers kept FP32 read float weights
    _own_pairs_as_fake_quantize(model, namer)  # a model shipped Q/DQ-quantized: its pairs in OpenVINO's form
    G.ensure_opset(model, DOMAIN, 1)


def prepare(loaded, cal, options: ExportOptions = DEFAULTS) -> Prepared:
    """The steps of the export up to the placement (as qdq.prepare): `export` and qtool.checks.evaluation share them."""
    model = G.copy_model(loaded.proto, str(loaded.path.parent))
    G.unique_node_names(model.graph, G.Namer(model))
    return cpu_prepare(model, cal, [], options, float_types=FLOAT_TYPES, overflow_remedy="pairs")


def quantized(prepared: Prepared, cal, plan: placement.Plan | None = None,
              bias_correction: bool = True) -> tuple[onnx.ModelProto, int, list[str]]:
    """A copy of the prepared model with `plan`'s FakeQuantize nodes (default: all) and, with
    bias_correction, the bias shifts of its int8 layers: (model, layers corrected, warnings)."""
    return with_quantizers(prepared, cal, plan, bias_correction, apply)


def export(loaded, cal, options: ExportOptions = DEFAULTS):
    """FakeQuantize ONNX for OpenVINO from the calibration `cal` of `loaded`."""
    prepared = prepare(loaded, cal, options)
    return export_prepared(loaded, cal, prepared, apply, options.bias_correction,
                           rounding_warnings=[*policy.runtime_rounding_warnings(prepared.plan, "OpenVINO"),
                                              *peepholes.warning(prepared.model)])


def report_view(loaded, cal, *, method: str | None = None):
    """What qtool report shows of this export (default options)."""
    return cpu_report_view(prepare, "OpenVINO, FakeQuantize model", loaded, cal, ExportOptions("openvino", method=method))
