"""A float16 model read as its float32 twin, for the targets whose writers quantize float32 layers.

A model whose layers compute in float16 (tf2onnx's Keras mixed-precision exports, onnxconverter's
float16 conversion) is, for a Q/DQ writer, the float32 model with the same graph: every float16
initializer, Constant and tensor attribute (ConstantOfShape's value) upcast (exactly: float16 ->
float32 loses nothing), every Cast(to=FLOAT16) and dtype attribute made float32, and the declared
types of the graph's and its If/Loop/Scan bodies' inputs, outputs and value infos with them
(`twin`). Tensor names are unchanged, so the calibration's records (ranges of the values the float16
model computes) name the same tensors; placement and the writer then work on a float32 model.

The file keeps the user's feeds and output types (`restore`, after the writer inserted its
quantizers): a graph input that was float16 is float16 again, read through a Cast to float32 under a
new name; a graph output that was float16 is made by a Cast to float16 of its float32 value, also
renamed. Which ones is recorded on the twin (metadata KEY, removed by `restore`). A Cast pair that
only goes float16 -> float32 -> float16 at the boundary (a writer's FP16 conversion of the unquantized
part casts its float32 graph inputs to float16 and its outputs back) is dropped: it is exact, and the
runtime then reads the float16 input as the float16 layers do.

Models without a float16 tensor are left alone (`holds`): their exports are unchanged byte for byte.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from . import graph as G
from . import lazy

KEY = "qtool.float16_boundary"  # on the twin only: {"inputs": [...], "outputs": [...]} that were float16
FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
_DTYPE_ATTRS = ("dtype",)  # RandomNormal(Like), RandomUniform(Like), EyeLike, Bernoulli: the output type


def graphs(graph: onnx.GraphProto):
    """The graph and its If/Loop/Scan bodies at every depth."""
    yield graph
    for n in graph.node:
        for sub in G.subgraphs(n):
            yield from graphs(sub)


def _typed(tp: onnx.TypeProto) -> list[onnx.TypeProto.Tensor]:
    """The tensor types a value's type holds (sequences, optionals and maps of tensors included)."""
    if tp.HasField("tensor_type"):
        return [tp.tensor_type]
    if tp.HasField("sequence_type"):
        return _typed(tp.sequence_type.elem_type)
    if tp.HasField("optional_type"):
        return _typed(tp.optional_type.elem_type)
    if tp.HasField("map_type"):
        return _typed(tp.map_type.value_type)
    return []


def _tensor_attrs(node: onnx.NodeProto):
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            yield a.t
        elif a.type == AttributeProto.TENSORS:
            yield from a.tensors
        elif a.type == AttributeProto.SPARSE_TENSOR:
            yield a.sparse_tensor.values
        elif a.type == AttributeProto.SPARSE_TENSORS:
            yield from (s.values for s in a.sparse_tensors)


def _retyped_attr(node: onnx.NodeProto, a: AttributeProto) -> bool:
    return a.type == AttributeProto.INT and ((node.op_type == "Cast" and a.name == "to") or a.name in _DTYPE_ATTRS)


def holds(proto: onnx.ModelProto) -> bool:
    """Whether the model has any float16 tensor: a weight, a constant, a Cast or typed output to float16, a declared
    input, output or value info (in the graph or a body)."""
    for g in graphs(proto.graph):
        if any(t.data_type == FLOAT16 for t in list(g.initializer) + [s.values for s in g.sparse_initializer]):
            return True
        if any(t.elem_type == FLOAT16 for vi in list(g.input) + list(g.output) + list(g.value_info) for t in _typed(vi.type)):
            return True
        for n in g.node:
            if any(t.data_type == FLOAT16 for t in _tensor_attrs(n)):
                return True
            if any(_retyped_attr(n, a) and a.i == FLOAT16 for a in n.attribute):
                return True
    return False


def _upcast(t: TensorProto) -> None:
    """A float16 tensor (in the graph) as float32, in place: the same values, name and dims."""
    values = numpy_helper.to_array(t).astype(np.float32)
    name, doc = t.name, t.doc_string
    t.CopyFrom(numpy_helper.from_array(values, name))
    t.doc_string = doc


def twin(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The float32 twin of `proto` (module doc), in place (give it a copy: the writers' G.copy_model); `proto` itself
    when it holds no float16 tensor. The main graph's float16 inputs and outputs are recorded under KEY for
    `restore`."""
    if not holds(proto):
        return proto
    main = proto.graph
    boundary = {"inputs": [i.name for i in main.input if i.type.tensor_type.elem_type == FLOAT16],
                "outputs": [o.name for o in main.output if o.type.tensor_type.elem_type == FLOAT16]}
    lazy_ones = []
    for g in graphs(main):
        for t in g.initializer:
            if t.data_type != FLOAT16:
                continue
            if lazy.is_lazy(t):  # a big model's weight: converted when read (lazy.retyped below)
                t.data_type = FLOAT
                lazy_ones.append(t)
            else:
                _upcast(t)
        for s in g.sparse_initializer:
            if s.values.data_type == FLOAT16:
                _upcast(s.values)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            for t in _typed(vi.type):
                if t.elem_type == FLOAT16:
                    t.elem_type = FLOAT
        for n in g.node:
            for t in _tensor_attrs(n):
                if t.data_type == FLOAT16:
                    _upcast(t)
            for a in n.attribute:
                if _retyped_attr(n, a) and a.i == FLOAT16:
                    a.i = FLOAT
    if lazy_ones:
        lazy.retyped(proto, lambda a: a.astype(np.float32), FLOAT16, FLOAT)
    if boundary["inputs"] or boundary["outputs"]:
        proto.metadata_props.add(key=KEY, value=json.dumps(boundary))
    return proto


def _boundary(model: onnx.ModelProto) -> dict | None:
    for i, p in enumerate(model.metadata_props):
        if p.key == KEY:
            del model.metadata_props[i]
            return json.loads(p.value)
    return None


def restore(model: onnx.ModelProto, namer: G.Namer | None = None) -> None:
    """Give the twin's file (`model`, quantizers inserted) the float16 graph inputs and outputs the user's model has
    (module doc), in place; nothing for a model `twin` did not record."""
    boundary = _boundary(model)
    if boundary is None:
        return
    namer = namer or G.Namer(model)
    g = model.graph
    outputs = {o.name for o in g.output}
    for vi in g.input:
        if vi.name not in boundary["inputs"]:
            continue
        vi.type.tensor_type.elem_type = FLOAT16
        readers = [n for n in g.node if vi.name in G.node_reads(n)]
        inner = namer.fresh(f"{vi.name}/float32")
        G.rename_reads(g, vi.name, inner)
        g.node.insert(0, helper.make_node("Cast", [vi.name], [inner], name=namer.fresh(f"{vi.name}/Cast"), to=FLOAT))
        for n in readers:  # a Cast back to float16 (an FP16 autocast's graph-input Cast): read the input itself
            if G.cast_to(n) == FLOAT16 and n.output[0] not in outputs:
                G.rename_reads(g, n.output[0], vi.name)
    made_by = G.producers(g)
    done: set[str] = set()
    for vi in g.output:
        if vi.name not in boundary["outputs"] or vi.name in boundary["inputs"]:  # an input passed straight out: float16 already
            continue
        vi.type.tensor_type.elem_type = FLOAT16
        if vi.name in done:  # an output listed twice: made float16 once
            continue
        done.add(vi.name)
        inner = namer.fresh(f"{vi.name}/float32")
        producer = made_by.get(vi.name)  # None: an initializer (or a twin's input) passed out
        _rename(g, producer, vi.name, inner)
        if producer is not None and G.cast_to(producer) == FLOAT and producer.input[0] in made_by \
                and producer.input[0] not in outputs and _declared(model, producer.input[0]) == FLOAT16:
            # float16 -> float32 -> float16: the float16 value itself
            _rename(g, made_by[producer.input[0]], producer.input[0], vi.name)
            continue
        g.node.append(helper.make_node("Cast", [inner], [vi.name], name=namer.fresh(f"{vi.name}/Cast"), to=FLOAT16))
    G.toposort(g)
    G.cleanup(g)


def _rename(g: onnx.GraphProto, producer: onnx.NodeProto | None, old: str, new: str) -> None:
    """Tensor `old` named `new`: the output of its main-graph `producer` (or, with None, the initializer of that name),
    its readers at any depth, its value info."""
    if producer is not None:
        producer.output[list(producer.output).index(old)] = new
    else:
        for t in g.initializer:
            if t.name == old:
                t.name = new
    G.rename_reads(g, old, new)
    for info in g.value_info:
        if info.name == old:
            info.name = new


def _declared(model: onnx.ModelProto, name: str) -> int | None:
    """The element type the main graph gives tensor `name` (value infos, a Cast's `to`, initializers), or None."""
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if vi.name == name and vi.type.HasField("tensor_type"):
            return vi.type.tensor_type.elem_type
    for n in model.graph.node:
        if name in n.output and n.op_type == "Cast":
            return G.attr(n, "to")
    for t in model.graph.initializer:
        if t.name == name:
            return t.data_type
    return None
