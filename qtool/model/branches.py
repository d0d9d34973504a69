"""If branches as models of their own: what calibrate fetches inside them, and each branch as a
standalone model that a target's writer places quantizers in.

A branch of an If node (then_branch, else_branch) is a graph that reads tensors of the scopes
around it by name. `standalone` makes it a model: its outer-scope reads become graph inputs (typed
from the scope around it), the constants it reads from outside (initializers, Constant nodes)
copied in as initializers, so that every pass that works on a model (activation catalogue,
placement, writers) works on it unchanged. `put_back` writes such a model's graph back into its
branch, the outer-scope names staying implicit (the copied constants dropped again).

onnxruntime fetches no tensor of a subgraph. `exposed` gives calibrate a model whose If nodes have
one more output per branch tensor to record, at every depth: the branch that holds the tensor gives
it as its output, the other branch an empty tensor of its type (shape [0]), which adds nothing to a
histogram; the If output is named ALIAS after the tensor (a subgraph may not redefine a name of its
scope) and `original` maps it back. Which branch ran for which input changes nothing but which
values are seen. Loop and Scan bodies are not opened (their tensors stay float).
"""

from __future__ import annotations

import onnx
from onnx import helper

from . import shapes
from .graph import all_nodes, defined, outer_refs

ALIAS = "::qtool_branch"
BRANCHES = ("then_branch", "else_branch")


def is_if(node: onnx.NodeProto) -> bool:
    """Whether `node` is an If with both branches."""
    return node.op_type == "If" and node.domain in ("", "ai.onnx") \
        and {a.name for a in node.attribute if a.type == onnx.AttributeProto.GRAPH} >= set(BRANCHES)


def if_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The If nodes of a graph (not those of its subgraphs) with both branches."""
    return [n for n in graph.node if is_if(n)]


def has_branches(proto: onnx.ModelProto) -> bool:
    """Whether the model's main graph holds an If node (its branches: models of their own here)."""
    return bool(if_nodes(proto.graph))


def branch(node: onnx.NodeProto, which: str) -> onnx.GraphProto:
    return next(a.g for a in node.attribute if a.name == which)


def original(name: str) -> str:
    """The branch tensor an exposed If output (`exposed`) carries, at any depth; other names as they are."""
    while name.endswith(ALIAS):
        name = name[: -len(ALIAS)]
    return name


def flattened(proto: onnx.ModelProto) -> onnx.ModelProto:
    """For the analyses of which layer reads which tensor only (never run, never written): a model whose main
    graph holds, in place of each If node, the nodes and initializers of both its branches, at every depth."""
    model = onnx.ModelProto()
    model.ir_version = proto.ir_version
    model.opset_import.extend(proto.opset_import)
    g = model.graph
    g.input.extend(proto.graph.input)
    g.output.extend(proto.graph.output)

    def add(graph: onnx.GraphProto) -> None:
        g.initializer.extend(graph.initializer)
        for n in graph.node:
            if is_if(n):
                for which in BRANCHES:
                    add(branch(n, which))
            else:
                g.node.append(n)
    add(proto.graph)
    return model


def unseen_warning(unseen: list[str]) -> str | None:
    """The warning for branch tensors (`exposed` outputs) no calibration input reached, or None."""
    if not unseen:
        return None
    shown = ", ".join(original(n) for n in unseen[:3])
    return (f"{len(unseen)} tensor(s) inside If branches that no calibration input took have no range ({shown}"
            f"{', ...' if len(unseen) > 3 else ''}); their layers stay float: give inputs that take every branch")


def _constants(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The tensors a graph fixes: its initializers and its Constant nodes' `value`s."""
    found = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            value = next((a.t for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
            if value is not None:
                found[n.output[0]] = value
    return found


def _typed(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The type (shape included) onnx's shape inference gives each main-graph tensor of `proto`."""
    inferred = shapes.inferred(proto) or proto
    g = inferred.graph
    return {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output) if vi.type.HasField("tensor_type")
            and vi.type.tensor_type.HasField("shape")}


def standalone(proto: onnx.ModelProto, graph: onnx.GraphProto, types: dict[str, int]) -> onnx.ModelProto:
    """The branch `graph` of an If in `proto`'s main graph as a model of its own (same opsets and IR
    version): the constants it reads from `proto`'s main graph copied in as initializers, its other
    outer-scope reads graph inputs of their type in `types` (`proto`'s tensor types; their shapes as
    onnx's shape inference gives them), in the order it first reads them."""
    fixed = _constants(proto.graph)
    typed = _typed(proto)
    model = onnx.ModelProto()
    model.ir_version, model.producer_name = proto.ir_version, proto.producer_name
    model.opset_import.extend(proto.opset_import)
    model.graph.CopyFrom(graph)
    refs, order = outer_refs(graph), []
    for n in all_nodes(graph):
        order.extend(i for i in n.input if i in refs and i not in order)
    order.extend(sorted(refs - set(order)))
    for name in order:
        if name in fixed:
            copy = onnx.TensorProto()
            copy.CopyFrom(fixed[name])
            copy.name = name
            model.graph.initializer.append(copy)
        elif name in typed and typed[name].tensor_type.elem_type == types.get(name, typed[name].tensor_type.elem_type):
            model.graph.input.add(name=name).type.CopyFrom(typed[name])
        else:
            model.graph.input.append(helper.make_tensor_value_info(name, types.get(name, onnx.TensorProto.FLOAT), None))
    return model


def put_back(model: onnx.ModelProto, graph: onnx.GraphProto, outer: set[str]) -> None:
    """Write the graph of `model` (a `standalone` branch, edited) back into the branch `graph`: its
    nodes, value_info and outputs, and its initializers but those copied from the scope around it
    (`outer`: the names that scope defines), which the branch reads from there again."""
    g = model.graph
    del graph.node[:], graph.initializer[:], graph.value_info[:], graph.output[:]
    graph.node.extend(g.node)
    graph.initializer.extend(t for t in g.initializer if t.name not in outer)
    graph.value_info.extend(vi for vi in g.value_info if vi.name not in outer)
    graph.output.extend(g.output)


def exposed(proto: onnx.ModelProto, catalogue) -> tuple[onnx.ModelProto, dict[str, int]]:
    """(a copy of `proto` whose If nodes give every branch tensor to record as an output, up to the main
    graph (module doc), {those outputs: their element type}); (`proto`, {}) when it has no If. `catalogue(model)
    -> (names, types)`: the tensors to record of a model (its float activations) and its tensor types."""
    if not has_branches(proto):
        return proto, {}
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy, dict(_expose(copy, catalogue(copy)[1], catalogue))


def _expose(model: onnx.ModelProto, types: dict[str, int], catalogue) -> list[tuple[str, int]]:
    """Expose (in place) the branch tensors of the If nodes of `model`'s main graph; the new If outputs
    and their element types."""
    added: list[tuple[str, int]] = []
    scope = defined(model.graph)
    taken = scope | {o.name for o in model.graph.output}
    for node in if_nodes(model.graph):
        wanted: dict[str, list[tuple[str, int]]] = {}
        for which in BRANCHES:
            graph = branch(node, which)
            sub = standalone(model, graph, types)
            names, sub_types = catalogue(sub)
            inputs = {i.name for i in sub.graph.input} | {t.name for t in sub.graph.initializer if t.name not in defined(graph)}
            own = [n for n in names if n not in inputs]
            nested = _expose(sub, sub_types, catalogue)
            put_back(sub, graph, scope)
            wanted[which] = [(n, sub_types[n]) for n in own] + nested
        entries: dict[str, tuple[int, set[str]]] = {}  # alias -> (element type, the branches holding the tensor)
        for which in BRANCHES:
            for name, elem in wanted[which]:
                if name + ALIAS not in taken:
                    entries.setdefault(name + ALIAS, (elem, set()))[1].add(which)
        for which in BRANCHES:
            graph = branch(node, which)
            given = {o.name for o in graph.output}
            for alias, (elem, holders) in entries.items():
                name = alias[: -len(ALIAS)]
                if which in holders and name in given:  # an output already: given twice through an Identity
                    graph.node.append(helper.make_node("Identity", [name], [f"{alias}/{which}"], name=f"{alias}/{which}"))
                    graph.output.append(helper.make_tensor_value_info(f"{alias}/{which}", elem, None))
                elif which in holders:
                    graph.output.append(helper.make_tensor_value_info(name, elem, None))
                else:
                    empty = f"{alias}/empty_{which}"
                    graph.node.append(helper.make_node("Constant", [], [empty], name=empty, value=helper.make_tensor(empty, elem, [0], [])))
                    graph.output.append(helper.make_tensor_value_info(empty, elem, None))
        node.output.extend(entries)
        taken.update(entries)
        added.extend((alias, elem) for alias, (elem, _) in entries.items())
    return added
