"""Autocast: FP16 for the unquantized part of a (Q/DQ) ONNX model, for TensorRT strongly typed builds.

A strongly typed TensorRT 10/11 network runs every layer in the type the ONNX gives it, so an
all-FP32 Q/DQ model runs its unquantized layers in FP32; NVIDIA's answer is an FP16 ONNX outside
the Q/DQ pairs (ModelOpt `--high_precision_dtype fp16`, NVIDIA/Model-Optimizer modelopt/onnx/autocast; the README's TensorRT section).
`to_fp16` does that with onnxruntime's converter
(`onnxruntime/transformers/float16.py: convert_float_to_float16`, onnxruntime 1.32) and guards it.

What the converter does, found by reading that file and by the tests in tests/test_autocast.py:

* It never produces inf: `convert_np_to_float16` clamps |x| > 65504 to 65504 and non-zero
  |x| < 5.96e-8 up to 5.96e-8. So a Paddle BatchNormalization variance of 1.2e7 silently becomes
  65504 (a wrong model, not an invalid one); NVIDIA ModelOpt's conversion once made such a constant
  inf and the model output all zeros. The guard below keeps such constants, and their readers, FP32.
* Blocked nodes (op_block_list / node_block_list) get Cast nodes around them, but the tensor
  between two blocked nodes still goes FP32 -> FP16 -> FP32 (each blocked output is cast to FP16,
  each blocked input back to FP32): an activation above 65504 kept FP32 would still overflow.
  The same holds for a blocked node next to a kept-FP32 graph input/output. `_drop_cast_pairs`
  removes those round trips and gives the tensors their original names back.
* Casts are appended at the end of the node list: the graph is no longer topologically sorted
  (onnx.checker refuses it; qtool.model.graph.toposort, run on every body too, fixes it). The Casts
  for a blocked node inside an If/Loop/Scan body go to the main graph as well, where the body's
  tensors do not exist: `_home_casts` moves them into the body.
* Every FP32 graph output becomes the output of a new Cast reading a renamed tensor: an output no
  node produces (a graph input or initializer passed straight out, silero VAD's state) or one
  listed twice would leave a Cast reading nothing; `_detach_unproduced_outputs` takes those out
  for the conversion and puts them back (a graph input stays FP32, an initializer keeps its FP32
  value and its readers get a copy).
* Its Casts have fixed names (graph_input_cast_0, graph_output_cast0, x_cast_to_fp32, ...): a model
  it already made (an FP16 model with FP32 I/O, qtool's own TensorRT file) would get them twice;
  `_clear_converter_names` renames the existing ones first.
* A blocked If/Loop/Scan keeps its bodies FP32, but only its inputs are cast, not what the
  bodies read from the main graph: `_cast_outer_reads` adds those Casts.
* QuantizeLinear/DequantizeLinear need no special case: they are not blocked, their FP32 scale
  initializers become FP16 (so QuantizeLinear-19 has x and y_scale both FP16 and a DequantizeLinear
  feeding an FP16 Conv outputs FP16), int8 zero points and int8 weights are left alone, and a
  scale shared by a blocked and an unblocked Q/DQ is converted once with a Cast for the blocked one.
  onnxruntime 1.32 (CPU) runs FP16 Q/DQ, but only up to ORT_ENABLE_BASIC optimisation: its
  EXTENDED level fuses DQ -> Concat -> Q into com.microsoft QLinearConcat, which rejects FP16
  scales ("Type 'tensor(float16)' of input parameter ... of operator (QLinearConcat) ... is
  invalid"; seen on onnxruntime's own QDQ quantizer output of sample_models/digits_cnn.onnx), so
  whoever runs the FP16 model in onnxruntime must stay at BASIC or below. The check below runs with
  no optimisation at all (the model as written): BASIC's constant folding would add an int8 copy of
  every weight QuantizeLinear reads and its runs keep their dequantized weights, 1.1 GB more on a
  1.34 GB BERT-large (TensorRT export's peak 2.99 GB, 2.22x the model).
  Scales get a stricter, per-element guard (below).
* Constant nodes' `value` tensors are converted, `value_float(s)` attributes are not (their output
  would be declared FP16 but be FP32): qtool.model.graph.normalize_constants rewrites them as `value` tensors.
* Resize `scales` stays FP32 (its ALWAYS_FLOAT_INPUTS); DEFAULT_OP_BLOCK_LIST (Range, TopK, Min,
  Max, NonMaxSuppression, ...) stays FP32.

The guard keeps a node FP32 when (reason recorded in `Fp16Result.kept_fp32`):
(a) it reads a float constant (initializer or Constant) holding inf/NaN, with |x| > 65504, or whose
    FP16 rounding error exceeds 2^-8 of the tensor's max |x| (half an INT8 step of its own range:
    the tensor's values are tiny, subnormal or clamped in FP16). A Q/DQ scale must meet that bound
    element by element (a 2^-8 relative scale error moves the end of the INT8 range by half a step).
    A Constant node holding such a constant stays FP32 too;
(b) it produces or reads an activation whose calibrated max |x| exceeds ACTIVATION_LIMIT = 65504/4
    (two binades of headroom over what calibration saw; ModelOpt AutoCast's default `data_max` is
    512, docs: nvidia.github.io/Model-Optimizer/guides/8_autocast.html, a much wider margin for
    uncalibrated use);
(c) it is named in `keep_fp32_nodes`;
(e) it belongs to a decomposed LayerNorm (ReduceMean -> Sub -> Pow 2 (or Mul x*x) -> ReduceMean
    -> Add eps -> Sqrt -> Div, also Reciprocal/Mul or Rsqrt in place of the Div) whose squares
    overflow FP16: the squared deviation's input reaches |x| > sqrt(65504) ~ 255.9 at calibration
    (or the squares themselves > 65504). The whole normalisation stays FP32, not only the nodes
    (b) catches, so the mean, the deviation and the division see FP32 values (BERT residual
    streams have outlier channels in the hundreds);
(d) its op type is on the converter's DEFAULT_OP_BLOCK_LIST or EXTRA_OP_BLOCK_LIST, or it computes shapes (a node
    whose outputs reach only shape/index/parameter slots, qtool.model.NON_DATA_SLOTS, and that
    reads or writes a float: FP16 holds integers exactly only up to 2048; Shape/Size and Constant
    nodes excepted), or it is a custom-domain op (com.microsoft ops, TensorRT plugins: the converter
    does not know which of their inputs must stay float32).
Q/DQ then follow their neighbours (`_follow_qdq`): a DequantizeLinear feeding only FP32 nodes,
and a QuantizeLinear of an FP32 tensor or feeding only FP32 DequantizeLinears, stay FP32, so no
Cast sits between a DQ and its Conv; a Constant node read only by FP32 nodes stays FP32.
Where FP32 and FP16 nodes share a constant, the FP32 side gets an FP32 initializer of the FP16
value (`_fp32_constant_copies`) rather than the converter's Cast: TensorRT wants constant scales.
Afterwards the model must pass onnx.checker,
hold only finite FP16 constants, and load and run in onnxruntime (CPU, zero inputs), else
QtoolError; when the input model itself fails the checker or does not run, that is a warning.
The zero inputs give unknown dims (no value, a symbol, Paddle's -1) 1 first and 64 elsewhere.
If/Loop/Scan bodies are converted by the converter as it sees fit (not guarded). When the
conversion fails anyway, qtool.targets.tensorrt.int8 keeps the control-flow nodes FP32 and tries
again, then keeps the whole model FP32, with a warning either way.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.transformers import float16  # onnxruntime's converter, not a session (qtool.runtime makes those)

from ...errors import QtoolError
from ...model import NON_DATA_SLOTS, batch_one, lazy
from ...model.checker import check
from ...model.graph import (
    Index,
    Namer,
    cast_to,
    defined,
    node_reads,
    normalize_constants,
    outer_refs,
    producers,
    rename_reads,
    subgraphs,
    tensor_names,
    toposort_all,
)
from ...model.shapes import with_inferred_shapes
from ...quantizers.patterns import length_roundings
from ...runtime import onnxruntime

FP16_MAX = 65504.0
ACTIVATION_LIMIT = FP16_MAX / 4
REL_TOL = 2.0**-8
# onnxruntime's converter defaults (float16.py): values it clamps to.
_MIN_POSITIVE, _MAX_FINITE = 5.96e-08, 65504.0
# Float-only inputs the converter does not know about (ONNX spec: DynamicQuantizeLinear x is float).
EXTRA_OP_BLOCK_LIST = ("DynamicQuantizeLinear",)
_SHAPE_READERS = {"Shape", "Size"}  # read only a shape, never values


@dataclass
class Fp16Result:
    model: onnx.ModelProto
    kept_fp32: dict[str, str] = field(default_factory=dict)  # node name -> why it stays FP32
    warnings: list[str] = field(default_factory=list)


def to_fp16(
    model: onnx.ModelProto,
    *,
    activation_absmax: dict[str, float] | None = None,
    keep_fp32_nodes: Iterable[str] = (),
) -> Fp16Result:
    """The model with its float computation in FP16 and FP32 graph inputs/outputs (module doc)."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    g = work.graph
    namer = Namer(work)
    for n in g.node:  # node_block_list works by name: every node needs one
        if not n.name:
            n.name = namer.fresh(f"{n.op_type}_{n.output[0] if n.output else 'node'}")
    renamed_nodes = _clear_converter_names(work, namer)
    keep_fp32_nodes = [renamed_nodes.get(name, name) for name in keep_fp32_nodes]
    normalize_constants(g)
    try:
        work = with_inferred_shapes(work)  # on the graph without its weight data
    except Exception as e:
        raise QtoolError(f"FP16 conversion needs ONNX shape inference, which failed: {_first_line(e)}") from None
    g = work.graph
    index = Index(work)  # the guards read the graph, the conversion below edits copies of it
    kept: dict[str, str] = {}
    for name in keep_fp32_nodes:
        if name not in index.nodes:
            raise QtoolError(f"no node named {name!r} in the model (keep FP32 nodes)")
        kept.setdefault(name, "kept FP32 on request")
    _guard_layernorms(index, activation_absmax or {}, kept)
    _guard_constants(index, kept)
    _guard_activations(index, activation_absmax or {}, kept)
    _guard_shape_nodes(index, kept)
    blocked_ops = set(float16.DEFAULT_OP_BLOCK_LIST) | set(EXTRA_OP_BLOCK_LIST)
    for n in g.node:
        if n.op_type in blocked_ops:
            kept.setdefault(n.name, f"op type {n.op_type} stays FP32 (onnxruntime's float16 block list)")
        elif n.domain not in ("", "ai.onnx"):
            kept.setdefault(n.name, f"custom-domain op {n.domain}.{n.op_type}: its float types are unknown")
    main_nodes = index.nodes
    warnings: list[str] = []
    while True:
        attempt = onnx.ModelProto()
        attempt.CopyFrom(work)
        kept_now = dict(kept)
        try:
            out, more = _convert(attempt, kept_now, blocked_ops, namer, model)
            break
        except QtoolError as e:
            name = _failing_node(str(e), main_nodes)
            if name is None or name in kept_now or len(warnings) >= MAX_REFUSED_NODES:
                raise
            why = _first_line(e).split(": ", 1)[-1]
            kept[name] = f"onnxruntime refuses it in FP16 ({why})"
            warnings.append(f"node {name!r} ({main_nodes[name].op_type}) stays FP32: onnxruntime refuses it in FP16 ({why})")
    order = {n.name: i for i, n in enumerate(out.graph.node)}
    kept_sorted = dict(sorted(kept_now.items(), key=lambda kv: (order.get(kv[0], -1), kv[0])))
    return Fp16Result(out, kept_sorted, warnings + more)


# How many nodes onnxruntime may refuse in FP16 (each kept FP32, the conversion tried again).
MAX_REFUSED_NODES = 8
_NODE_IN_ERROR = re.compile(r"in node \(([^)]*)\)|node with name '([^']*)'|node: ([^ ]+) OpType")


def _failing_node(message: str, names: dict[str, onnx.NodeProto]) -> str | None:
    """The main-graph node an onnx.checker / onnxruntime error names, if any."""
    for m in _NODE_IN_ERROR.finditer(message):
        name = next(x for x in m.groups() if x is not None)
        if name in names:
            return name
    return None


def _convert(work: onnx.ModelProto, kept: dict[str, str], blocked_ops: set[str], namer: Namer,
             original: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """One conversion of `work` (edited in place) with the nodes in `kept` FP32; `kept` gains
    the Q/DQ and Constant nodes that follow them. (model, warnings) or QtoolError."""
    g = work.graph
    index = Index(work)
    _follow_qdq(index, kept)
    _follow_constants(index, kept)
    outputs = _detach_unproduced_outputs(g, namer)
    original_tensors = tensor_names(g)
    n_before = len(g.node)
    try:
        with _lazy_shapes(work):
            out = float16.convert_float_to_float16(
                work, keep_io_types=True, disable_shape_infer=True,
                op_block_list=sorted(blocked_ops), node_block_list=sorted(kept),
            )
    except Exception as e:  # the converter's own failure: the caller may fall back to FP32
        raise QtoolError(f"onnxruntime's FP16 converter failed: {type(e).__name__}: {_first_line(e)}") from None
    # the converter changed the declared type of the weights it cannot see (lazy.py): convert their values as it would
    lazy.retyped(out, lambda a: float16.convert_np_to_float16(a, _MIN_POSITIVE, _MAX_FINITE), TensorProto.FLOAT, TensorProto.FLOAT16)
    _cast_outer_reads(out.graph, kept, namer)
    _home_casts(out.graph)
    _drop_cast_pairs(out.graph, n_before, original_tensors)
    _fp32_constant_copies(out.graph)
    del out.graph.output[:]
    out.graph.output.extend(outputs)
    toposort_all(out.graph)
    return out, _verify(out, original)


@contextlib.contextmanager
def _lazy_shapes(model: onnx.ModelProto):
    """While converting a model with lazy weights (lazy.py), the converter's value info of an
    initializer takes its shape from the tensor's dims (what numpy_helper.to_array(t).shape gives)
    instead of reading the value."""
    if not lazy.lazy_tensors(model):
        yield
        return
    saved = float16.make_value_info_from_tensor
    float16.make_value_info_from_tensor = lambda t: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    try:
        yield
    finally:
        float16.make_value_info_from_tensor = saved


_CONVERTER_NAME = re.compile(r"^graph_(input|output)_cast|_cast_to_(fp32|fp16|bfloat16)")


def _clear_converter_names(model: onnx.ModelProto, namer: Namer) -> dict[str, str]:
    """Rename the tensors and nodes named as onnxruntime's converter names its Casts
    (graph_input_cast_0, graph_output_cast0, x_cast_to_fp32, ...), graph inputs and outputs
    excepted, and return {old node name: new}. A model the converter made (an FP16 model with
    FP32 I/O) or qtool's FP16 export already has them, and converting it again would define
    those names twice (onnx.checker: not in SSA form; onnxruntime: two nodes with the same name)."""
    g = model.graph
    io = {v.name for v in list(g.input) + list(g.output)}
    tensors: dict[str, str] = {}
    nodes: dict[str, str] = {}

    def fresh(name: str) -> str:
        base = _CONVERTER_NAME.sub(lambda m: m.group(0).replace("cast", "Cast"), name)
        return namer.fresh(base)

    graphs = [g]
    for graph in graphs:
        for n in graph.node:
            graphs.extend(subgraphs(n))
            for t in list(n.input) + list(n.output):
                if t and t not in io and t not in tensors and _CONVERTER_NAME.search(t):
                    tensors[t] = fresh(t)
            if graph is g and _CONVERTER_NAME.search(n.name):
                nodes[n.name] = n.name = fresh(n.name)
            elif _CONVERTER_NAME.search(n.name):
                n.name = fresh(n.name)
        for t in list(graph.initializer) + list(graph.input) + list(graph.output) + list(graph.value_info):
            if t.name not in io and t.name not in tensors and _CONVERTER_NAME.search(t.name):
                tensors[t.name] = fresh(t.name)
    if not tensors:
        return nodes
    for graph in graphs:
        for n in graph.node:
            for k, t in enumerate(n.input):
                n.input[k] = tensors.get(t, t)
            for k, t in enumerate(n.output):
                n.output[k] = tensors.get(t, t)
        for t in list(graph.initializer) + list(graph.input) + list(graph.output) + list(graph.value_info):
            t.name = tensors.get(t.name, t.name)
    return nodes


def _detach_unproduced_outputs(g: onnx.GraphProto, namer: Namer) -> list[onnx.ValueInfoProto]:
    """Take out the graph outputs no node produces (a graph input or initializer passed straight
    out, a state input returned as is) and repeated outputs, and return all outputs as they were,
    to put back after conversion: onnxruntime's converter maps each FP32 output to a new Cast
    output, so for such outputs it leaves a Cast reading a tensor nothing produces (onnx.checker:
    "Nodes in a graph must be topologically sorted"). A graph input stays FP32 (keep_io_types);
    an initializer passed out keeps its FP32 value, its readers get a copy to convert."""
    saved = [onnx.ValueInfoProto() for _ in g.output]
    for copy, o in zip(saved, g.output):
        copy.CopyFrom(o)
    made_by = producers(g)
    inits = {t.name: t for t in g.initializer}
    inputs = {i.name for i in g.input}
    seen: set[str] = set()
    keep = []
    for o in g.output:
        if o.name in made_by and o.name not in seen:
            keep.append(o)
        elif o.name in inits and o.name not in inputs and o.name not in seen:
            alias = namer.fresh(f"{o.name}/for_nodes")
            readers = [n for n in g.node if o.name in n.input]
            if readers:
                t = g.initializer.add()
                t.CopyFrom(inits[o.name])
                t.name = alias
                for n in readers:
                    for k, x in enumerate(n.input):
                        if x == o.name:
                            n.input[k] = alias
        seen.add(o.name)
    if len(keep) != len(g.output):
        kept = [onnx.ValueInfoProto() for _ in keep]
        for copy, o in zip(kept, keep):
            copy.CopyFrom(o)
        del g.output[:]
        g.output.extend(kept)
    return saved


def _home_casts(g: onnx.GraphProto) -> None:
    """Move the converter's Casts of If/Loop/Scan body tensors into the body that defines them.
    The converter appends every Cast it makes, for a blocked node inside a body too, to the main
    graph's node list, where the body's tensors do not exist (a blocked Max in a branch: onnx.checker
    "Nodes in a graph must be topologically sorted"). A tensor defined in several bodies (two
    branches) gets a copy of the Cast in each; toposort_all orders the bodies afterwards."""
    bodies: list[onnx.GraphProto] = []
    stack = [sub for n in g.node for sub in subgraphs(n)]
    while stack:
        sub = stack.pop()
        bodies.append(sub)
        stack.extend(s for n in sub.node for s in subgraphs(n))
    if not bodies:
        return
    moved = True
    while moved:
        moved = False
        main_names = defined(g)
        for n in list(g.node):
            if n.op_type != "Cast" or not n.input or n.input[0] in main_names:
                continue
            homes = [b for b in bodies if n.input[0] in defined(b)]
            if not homes:
                continue
            for b in homes:
                b.node.add().CopyFrom(n)
            for vi in [vi for vi in g.value_info if vi.name == n.output[0]]:
                for b in homes:
                    b.value_info.add().CopyFrom(vi)
                g.value_info.remove(vi)
            g.node.remove(n)
            moved = True


def _cast_outer_reads(g: onnx.GraphProto, kept: dict[str, str], namer: Namer) -> None:
    """A kept-FP32 If/Loop/Scan keeps its bodies FP32 (the converter does not enter them), but it
    casts only the node's inputs, not what the bodies read from the main graph: each such FP16
    tensor gets a Cast to FP32 here, read by the bodies instead."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input)}
    types.update({t.name: t.data_type for t in g.initializer})
    casts: dict[str, str] = {}
    for n in list(g.node):
        if n.name not in kept:
            continue
        for sub in subgraphs(n):
            for r in sorted(outer_refs(sub)):
                if types.get(r) != TensorProto.FLOAT16:
                    continue
                if r not in casts:
                    casts[r] = namer.fresh(f"{r}_for_fp32_body")
                    g.node.append(helper.make_node("Cast", [r], [casts[r]], name=namer.fresh(f"{casts[r]}/Cast"), to=TensorProto.FLOAT))
                    vi = g.value_info.add()
                    vi.name, vi.type.tensor_type.elem_type = casts[r], TensorProto.FLOAT
                rename_reads(sub, r, casts[r])


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _float_constants(g: onnx.GraphProto) -> list[tuple[str, TensorProto, onnx.NodeProto | None]]:
    """(tensor name, float32 TensorProto, Constant node or None) for the main graph's constants."""
    out: list[tuple[str, TensorProto, onnx.NodeProto | None]] = [
        (t.name, t, None) for t in g.initializer if t.data_type == TensorProto.FLOAT
    ]
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output:
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                    out.append((n.output[0], a.t, n))
    return out


def constant_problem(arr: np.ndarray, per_element: bool = False) -> str | None:
    """Why a float32 constant must not become FP16, or None. `per_element`: each value must keep
    its own relative precision (Q/DQ scales) instead of precision relative to the tensor's max."""
    a = np.asarray(arr, dtype=np.float32).ravel()
    if a.size == 0:
        return None
    if not np.all(np.isfinite(a)):
        return "holds inf/NaN"
    mags = np.abs(a)
    amax = float(mags.max())
    if amax > FP16_MAX:
        return f"has |x| up to {amax:.3g} > 65504"
    err = np.abs(float16.convert_np_to_float16(a, _MIN_POSITIVE, _MAX_FINITE).astype(np.float64) - a)
    bound = REL_TOL * (mags.astype(np.float64) if per_element else amax)
    if np.any(err > bound):
        tiny = float(mags[mags > 0].min())
        return f"loses precision in FP16 (smallest non-zero |x| {tiny:.3g}, below FP16's normal range 6.1e-05)"
    return None


def _guard_constants(index: Index, kept: dict[str, str]) -> None:
    """(a): readers (and Constant nodes) of constants FP16 cannot hold stay FP32."""
    readers = index.readers
    for name, t, const_node in _float_constants(index.graph):
        try:
            arr = lazy.value(t)
        except Exception as e:
            raise QtoolError(f"cannot read constant {name!r} ({_first_line(e)}); load the model's external data first") from None
        users = readers.get(name, [])
        as_scale = any(u.op_type in ("QuantizeLinear", "DequantizeLinear") and slot == 1 for u, slot in users)
        why = constant_problem(arr) or (constant_problem(arr, per_element=True) if as_scale else None)
        if why is None:
            continue
        reason = f"constant {name!r} {why}"
        if const_node is not None:
            kept.setdefault(const_node.name, reason)
        for u, _ in users:
            kept.setdefault(u.name, reason)


def _square(n: onnx.NodeProto, constants: dict[str, np.ndarray]) -> str | None:
    """The tensor a Pow(x, 2) or Mul(x, x) squares, else None."""
    if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
        return n.input[0]
    if n.op_type == "Pow" and len(n.input) == 2 and n.input[1] in constants:
        e = constants[n.input[1]]
        return n.input[0] if e.size and np.all(e == 2) else None
    return None


_LN_CHAIN = ("Add", "Sqrt", "Reciprocal", "Rsqrt")  # between the variance and the division


def layernorm_nodes(index: Index, square: onnx.NodeProto, x: str) -> list[onnx.NodeProto]:
    """The nodes of the decomposed LayerNorm whose squaring node is `square` (squaring `x`):
    the mean and the Sub making `x`, the square, the variance ReduceMean, the eps Add, Sqrt and
    the Div (or Reciprocal/Rsqrt and Mul) that reads `x`; [] when the pattern is not there."""
    made_by, readers = index.producer, index.readers
    var = [u for u, _ in readers.get(square.output[0], []) if u.op_type == "ReduceMean"]
    if len(var) != 1:
        return []
    nodes = [square, var[0]]
    sub = made_by.get(x)
    if sub is not None and sub.op_type == "Sub" and len(sub.input) == 2:
        mean = made_by.get(sub.input[1])
        if mean is not None and mean.op_type == "ReduceMean" and mean.input[:1] == sub.input[:1]:
            nodes[:0] = [mean, sub]
    frontier, seen = var[0].output[0], 0
    while seen < 4:
        users = [u for u, _ in readers.get(frontier, [])]
        if len(users) != 1:
            return []
        u = users[0]
        if u.op_type in ("Div", "Mul") and x in u.input:
            return nodes + [u]
        if u.op_type not in _LN_CHAIN:
            return []
        nodes.append(u)
        frontier, seen = u.output[0], seen + 1
    return []


def _guard_layernorms(index: Index, absmax: dict[str, float], kept: dict[str, str]) -> None:
    """(e): a decomposed LayerNorm whose squares overflow FP16 stays FP32 as a whole."""
    g = index.graph
    constants: dict[str, np.ndarray] = {}
    for name, t, _ in _float_constants(g):
        if lazy.is_lazy(t):  # a weight, no exponent: not read
            continue
        try:
            constants[name] = numpy_helper.to_array(t)
        except Exception:
            continue
    limit = float(np.sqrt(FP16_MAX))
    for n in g.node:
        x = _square(n, constants)
        if x is None:
            continue
        value = float(absmax.get(x, 0.0))
        squares = float(absmax.get(n.output[0], 0.0))
        if not (value > limit or not np.isfinite(value) or squares > FP16_MAX or not np.isfinite(squares)):
            continue
        nodes = layernorm_nodes(index, n, x)
        if not nodes:
            continue
        shown = f"{max(value, np.sqrt(squares) if np.isfinite(squares) else squares):.4g}"
        reason = f"decomposed LayerNorm: it squares {x!r}, which reaches |x| {shown} at calibration (squares > 65504 overflow FP16)"
        for u in nodes:
            kept.setdefault(u.name, reason)


def _guard_activations(index: Index, absmax: dict[str, float], kept: dict[str, str]) -> None:
    """(b): producers and readers of activations calibrated above ACTIVATION_LIMIT stay FP32."""
    made_by, readers = index.producer, index.readers
    for name in sorted(absmax):
        value = float(absmax[name])
        if np.isfinite(value) and value <= ACTIVATION_LIMIT:
            continue
        reason = f"activation {name!r} reaches {value:.3g} at calibration (> {ACTIVATION_LIMIT:g} = 65504/4)"
        if name in made_by:
            kept.setdefault(made_by[name].name, reason)
        for u, _ in readers.get(name, []):
            kept.setdefault(u.name, reason)


def _guard_shape_nodes(index: Index, kept: dict[str, str]) -> None:
    """(d): nodes that compute shapes (outputs reach only shape/index/parameter slots, as in
    qtool.model.activation_tensors) and touch a float stay FP32."""
    g, types = index.graph, index.types
    data = {o.name for o in g.output}
    for n in g.node:
        for sub in subgraphs(n):
            data.update(outer_refs(sub))
    shape_nodes = []
    for n in reversed(g.node):
        outputs_are_data = any(o in data for o in n.output if o) or not n.output or bool(subgraphs(n))
        if not outputs_are_data:
            shape_nodes.append(n)
        skip = NON_DATA_SLOTS.get(n.op_type, ()) if n.domain in ("", "ai.onnx") else ()
        for slot, name in enumerate(n.input):
            if name and slot not in skip and outputs_are_data:
                data.add(name)
    for n in reversed(shape_nodes):
        if n.op_type in _SHAPE_READERS or n.op_type == "Constant":  # Constants: _follow_constants
            continue
        if any(types.get(t) in lazy.FLOATS for t in list(n.input) + list(n.output) if t):
            kept.setdefault(n.name, "computes a shape/index/parameter (FP16 holds integers exactly only to 2048)")


def _follow_qdq(index: Index, kept: dict[str, str]) -> None:
    """A DequantizeLinear whose readers all stay FP32 stays FP32 (FP32 scale, no Cast between it and
    its Conv), and so does a QuantizeLinear whose DequantizeLinears stay FP32 or that quantizes a
    kept node's output. A graph input's QuantizeLinear reads the FP16 Cast the converter puts after
    the input, as in ModelOpt's models, so Q -> DQ -> Conv stays one FP16 pattern TensorRT fuses."""
    made_by, readers = index.producer, index.readers
    changed = True
    while changed:
        changed = False
        for n in index.graph.node:
            if n.name in kept or n.domain not in ("", "ai.onnx"):
                continue
            if n.op_type == "DequantizeLinear":
                users = readers.get(n.output[0], [])
                if users and all(u.name in kept for u, _ in users):
                    kept[n.name] = f"dequantizes for FP32 node {users[0][0].name!r}"
                    changed = True
            elif n.op_type == "QuantizeLinear":
                src = made_by.get(n.input[0])
                users = readers.get(n.output[0], [])
                if users and all(u.name in kept for u, _ in users):
                    kept[n.name] = f"quantizes for FP32 node {users[0][0].name!r}"
                    changed = True
                elif src is not None and src.name in kept:
                    kept[n.name] = f"quantizes the FP32 output of node {src.name!r}"
                    changed = True


def _follow_constants(index: Index, kept: dict[str, str]) -> None:
    """A float Constant node read only by FP32 nodes stays FP32 (no FP16 rounding of, say, 4097.0)."""
    readers = index.readers
    for n in index.graph.node:
        if n.op_type != "Constant" or n.name in kept or not n.output:
            continue
        users = readers.get(n.output[0], [])
        if users and all(u.name in kept for u, _ in users):
            kept[n.name] = f"read only by FP32 node {users[0][0].name!r}"


def _fp32_constant_copies(g: onnx.GraphProto) -> None:
    """Cast(FP16 initializer -> FP32), inserted where FP32 and FP16 nodes share a constant, becomes an
    FP32 initializer of the same value (Q/DQ scales must be constants for TensorRT: qtool.targets.tensorrt.checker)."""
    inits = {t.name: t for t in g.initializer if t.data_type == TensorProto.FLOAT16}
    dead = []
    for n in g.node:
        if cast_to(n) == TensorProto.FLOAT and n.input[0] in inits:
            value = lazy.value(inits[n.input[0]]).astype(np.float32)
            g.initializer.append(numpy_helper.from_array(value, n.output[0]))
            dead.append(n)
    for n in dead:
        g.node.remove(n)
    if dead:
        gone = {n.output[0] for n in dead}
        vis = [vi for vi in g.value_info if vi.name not in gone]
        del g.value_info[:]
        g.value_info.extend(vis)
    used = {x for n in g.node for x in node_reads(n)} | {o.name for o in g.output}  # bodies' outer reads too
    unused = [t for t in g.initializer if t.name not in used and t.name in inits]
    for t in unused:
        g.initializer.remove(t)


def _rename(g: onnx.GraphProto, old: str, new: str) -> None:
    """Rename a main-graph tensor that is FP32 (node inputs/outputs and value_info)."""
    rename_reads(g, old, new)
    for n in g.node:
        for i, x in enumerate(n.output):
            if x == old:
                n.output[i] = new
    # in place: a copy of every value_info per rename (del + extend) grew the export of a model with ~1000 nodes
    # kept FP32 (kokoro_ja_int8, hunt22) to 21 GB before the OOM killer
    for i in reversed(range(len(g.value_info))):
        if g.value_info[i].name == new:
            del g.value_info[i]
    for vi in g.value_info:
        if vi.name == old:
            vi.name = new
            vi.type.tensor_type.elem_type = TensorProto.FLOAT


def _drop_cast_pairs(g: onnx.GraphProto, n_before: int, original: set[str]) -> None:
    """Remove the converter's FP32 -> FP16 -> FP32 round trips (Cast pairs it inserted between two
    blocked nodes or a blocked node and a kept-FP32 graph input/output) and give the FP32 tensors
    back their original names."""
    inserted = [n for n in list(g.node)[n_before:] if n.op_type == "Cast"]
    ids = {id(n) for n in inserted}
    outputs = {o.name for o in g.output}
    dead: set[int] = set()
    for b in inserted:
        a = producers(g).get(b.input[0])
        if cast_to(b) != TensorProto.FLOAT or a is None or id(a) not in ids or cast_to(a) != TensorProto.FLOAT16:
            continue
        s, u = a.input[0], b.output[0]
        if u not in outputs:
            dead.add(id(b))
            b.output[0] = ""  # detach before renaming u's readers to s
            rename_reads(g, u, s)
        elif s not in original and s in producers(g) and s not in outputs:
            dead.add(id(b))
            b.output[0] = ""
            _rename(g, s, u)
        else:
            b.op_type, b.input[0] = "Identity", s
            del b.attribute[:]
    reads = {x for n in g.node if id(n) not in dead for x in n.input}
    for a in inserted:
        if cast_to(a) != TensorProto.FLOAT16 or id(a) in dead:
            continue
        s, t = a.input[0], a.output[0]
        if t not in reads and t not in outputs:
            dead.add(id(a))
            if s not in original and t in original and s in producers(g):
                a.output[0] = ""
                _rename(g, s, t)
    kept_nodes = [n for n in g.node if id(n) not in dead]
    del g.node[:]
    g.node.extend(kept_nodes)
    live = tensor_names(g) - {i.name for i in g.input} - outputs
    vis = [vi for vi in g.value_info if vi.name in live]
    del g.value_info[:]
    g.value_info.extend(vis)


def _check_finite(g: onnx.GraphProto) -> None:
    """Every FP16 initializer and constant attribute tensor (subgraphs included) is finite."""
    tensors = [(t.name, t) for t in g.initializer]
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                tensors.append((f"{n.name}.{a.name}", a.t))
        for sub in subgraphs(n):
            _check_finite(sub)
    for name, t in tensors:
        if t.data_type == TensorProto.FLOAT16 and not np.all(np.isfinite(lazy.value(t))):
            raise QtoolError(f"FP16 conversion made constant {name!r} non-finite")


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Zeros for every graph input; an unknown dim (no value, a symbol, or a negative dim_value
    such as Paddle's -1) is 1 when it comes first and is a batch (model.batch_one), else 64 (a
    multiple of every usual stride, a plausible sequence length); a symbol takes the same value
    wherever it appears."""
    inits = {t.name for t in model.graph.initializer}
    symbols: dict[str, int] = {}
    feed = {}
    open_first = {i.name for i in model.graph.input if len(i.type.tensor_type.shape.dim) > 1
                  and not i.type.tensor_type.shape.dim[0].HasField("dim_value")}
    not_batch = open_first - set(batch_one(model)) if open_first else set()
    for i in model.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        dims = []
        first = 64 if i.name in not_batch else 1
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(d.dim_value)
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(symbols.setdefault(d.dim_param, first if k == 0 else 64))
            else:
                dims.append(first if k == 0 else 64)
        feed[i.name] = np.zeros(dims, dtype=helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return feed


def _ort_run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    # no optimisation: the model as written, without BASIC's folded weight copies (module doc)
    return onnxruntime.raw_session(model, optimization="none", spin=False).run(None, feed)


def _verify(out: onnx.ModelProto, original: onnx.ModelProto) -> list[str]:
    """Finite FP16 constants, onnx.checker, onnxruntime loads and runs (QtoolError otherwise);
    returns warnings for what could not be checked."""
    _check_finite(out.graph)
    warnings = []
    try:
        check(out)
    except onnx.checker.ValidationError as e:
        try:
            check(original)
        except onnx.checker.ValidationError:
            warnings.append(f"the FP16 model fails onnx.checker ({_first_line(e)}), as does the input model")
        else:
            raise QtoolError(f"FP16 conversion made an invalid model: {_first_line(e)}") from None
    lengths = length_roundings(Index(original))
    if lengths:  # kokoro_ja_int8 (hunt22): zero speed, infinite durations, onnxruntime asked for GBs
        return [*warnings, f"FP16 model not run in onnxruntime (its output's length is a count it computes from its inputs' "
                           f"values, {', '.join(lengths)}: zero inputs can ask for any size)"]
    try:
        feed = _feed(out)
    except Exception as e:  # an input that is no tensor (sequence, map) or of an exotic type
        return [*warnings, f"FP16 model not run in onnxruntime (no zero input for it: {_first_line(e)})"]
    try:
        got = _ort_run(out, feed)
    except Exception as e:
        try:
            _ort_run(original, feed)
        except Exception:
            return [*warnings, f"FP16 model not run in onnxruntime (the input model does not run on zero inputs either: {_first_line(e)})"]
        raise QtoolError(f"onnxruntime cannot run the FP16 model: {_first_line(e)}") from None
    bad = [i for i, v in enumerate(got) if np.issubdtype(v.dtype, np.floating) and not np.all(np.isfinite(v))]
    if not bad:
        return warnings
    ref = _ort_run(original, feed)
    names = [o.name for o in out.graph.output]
    return [*warnings, *(f"FP16 output {names[i]!r} is not finite on all-zero inputs (the FP32 model's is)"
            for i in bad if np.all(np.isfinite(ref[i])))]
