"""The TensorRT ONNX parser's rules for Q/DQ (explicit INT8 and FP8) models: every way a model breaks them.

A pure check (no printing, no exits): `check(model, "10.3")` lists, in graph order, each
QuantizeLinear/DequantizeLinear (or QOperator) node TensorRT would reject or import differently
from onnxruntime, with what to do about it. Each Q/DQ node is checked by the rule table of its
type (`precision` None): INT8 by the INT8 rules, FLOAT8 by FP8's (FP8 below); precision "int8"
or "fp8" holds every node to that one table.

FP8 (TensorRT developer guide, "Explicit Quantization" and "Working with Quantized Types": FP8 is
E4M3, per-tensor activations and per-channel weights as INT8, zero point 0; NVIDIA/Model-Optimizer
modelopt/onnx/quantization/fp8.py writes it so at opset 19+): FLOAT8E4M3FN only (E5M2 and the
FNUZ types are not imported), opset 19 (the first with FLOAT8 Q/DQ) hence TensorRT 10 or later,
`saturate` 1 (TensorRT saturates at +-448; onnxruntime with saturate 0 gives NaN past it); the
scale, zero-point and axis rules are INT8's.

Sources (facts only, the code is ours): onnx/onnx-tensorrt `onnxOpImporters.cpp`
(QuantDequantLinearHelper: "TensorRT only supports symmetric quantization", constant positive
scales of static shape, per-axis scales for weights only, ONNX's UINT8 default replaced by INT8)
and `docs/operators.md` (QLinearConv, ConvInteger, MatMulInteger not supported; opset per branch,
8.6-GA and 10.x); NVIDIA TensorRT developer guide, "Explicit Quantization" (Q/DQ rules and the
per-channel weight axes); summarised in the README's TensorRT section.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...errors import QtoolError
from ...model import lazy
from ...model.graph import all_nodes, subgraphs
from ...model.graph import attr as _attr
from .rules import weight_axis
from .versions import OPSETS, parse_version

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
DEFAULT_DOMAINS = ("", "ai.onnx")
EXPORT_HINT = "qtool export --target tensorrt --format qdq"
QOPERATORS = frozenset({
    "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QGemm", "QAttention", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "DynamicQuantizeLSTM", "QEmbedLayerNormalization", "QOrderedMatMul",
})
HALF_SCALES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
PRECISIONS = ("int8", "fp8")
FLOAT8 = (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ)
EXPORT_HINT_FP8 = "qtool export --target tensorrt --precision fp8"


@dataclass(frozen=True)
class Table:
    """One precision's Q/DQ rules: the quantized type, the lowest opset and TensorRT major."""

    precision: str
    qtype: int
    min_opset: int
    min_major: int
    hint: str


TABLES = {
    "int8": Table("int8", TensorProto.INT8, 13, 8, EXPORT_HINT),
    "fp8": Table("fp8", TensorProto.FLOAT8E4M3FN, 19, 10, EXPORT_HINT_FP8),
}


@dataclass(frozen=True)
class Violation:
    """One broken rule: the node (or tensor; "" for the model), a stable rule id, what to do."""

    node: str
    rule: str
    message: str


@dataclass
class _Index:
    """What the checks need to know about the model, built once."""

    opset: int
    major: int
    precision: str | None = None  # None: each node by the table of its own type
    consts: dict[str, TensorProto] = field(default_factory=dict)
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = field(default_factory=dict)
    types: dict[str, int] = field(default_factory=dict)


def check(model: onnx.ModelProto, trt_version: str, precision: str | None = None) -> list[Violation]:
    """Every Q/DQ rule of that TensorRT version the model breaks: model-wide first, then per node
    in graph order (subgraph nodes after the node that holds them). Deterministic. precision:
    None checks each node by the table of its type, "int8"/"fp8" every node by that table."""
    if precision is not None and precision not in PRECISIONS:
        raise QtoolError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    major = parse_version(trt_version)[0]
    index = _index(model, major)
    index.precision = precision
    nodes = list(all_nodes(model.graph))
    found = _check_opset(index) + _check_fp8_model([n for n in nodes if _is_qdq(n)], index)
    if not any(_is_qdq(n) for n in nodes):
        found.append(Violation("", "no-qdq", _no_qdq_message(major)))
    for node in nodes:
        if _is_qoperator(node):
            found.append(Violation(_name(node), "qoperator", _qoperator_message(node)))
        elif _is_qdq(node):
            found += _check_qdq(node, index)
    return found


def qdq_nodes(model: onnx.ModelProto) -> int:
    """How many default-domain QuantizeLinear/DequantizeLinear nodes the model has (subgraphs too)."""
    return sum(1 for n in all_nodes(model.graph) if _is_qdq(n))


# ----------------------------------------------------------------------------- the model

def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from _graphs(sub)


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain (ai.onnx) opset."""
    return max((o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS), default=1)


def _index(model: onnx.ModelProto, major: int) -> _Index:
    """Constants (initializers, Constant outputs, through Identity), producers, consumers, types."""
    index = _Index(opset=default_opset(model), major=major)
    for graph in _graphs(model.graph):
        for init in graph.initializer:
            index.consts[init.name] = init
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            if vi.type.HasField("tensor_type"):
                index.types[vi.name] = vi.type.tensor_type.elem_type
    for node in all_nodes(model.graph):
        for i, name in enumerate(node.input):
            if name:
                index.consumers.setdefault(name, []).append((node, i))
        for name in node.output:
            index.producer[name] = node
        value = _constant_value(node, index.consts)
        if value is not None and node.output:
            index.consts[node.output[0]] = value
    return index


def _constant_value(node: onnx.NodeProto, consts: dict[str, TensorProto]) -> TensorProto | None:
    """The tensor a Constant node holds, or an Identity passes on from a constant."""
    if node.op_type == "Identity" and node.domain in DEFAULT_DOMAINS and node.input and node.input[0] in consts:
        return consts[node.input[0]]
    if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS:
        return None
    for attr in node.attribute:
        if attr.name == "value":
            return attr.t
        if attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            dtype = np.float32 if "float" in attr.name else np.int64
            return numpy_helper.from_array(np.array(helper.get_attribute_value(attr), dtype))
    return None


def _is_qdq(node: onnx.NodeProto) -> bool:
    return node.op_type in QDQ_OPS and node.domain in DEFAULT_DOMAINS


def _is_qoperator(node: onnx.NodeProto) -> bool:
    """QOperator forms, and com.microsoft's Q/DQ: TensorRT imports none of them."""
    if node.op_type in QDQ_OPS:
        return node.domain not in DEFAULT_DOMAINS
    return node.op_type.startswith("QLinear") or node.op_type in QOPERATORS


def _name(node: onnx.NodeProto) -> str:
    return node.name or (f"{node.op_type}->{node.output[0]}" if node.output else node.op_type)


def _type_name(dtype: int) -> str:
    try:
        return TensorProto.DataType.Name(dtype)
    except ValueError:
        return f"type {dtype}"


def _input(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _values(tensor: TensorProto) -> np.ndarray | None:
    """A small constant's values as float64, or None when they cannot be read."""
    try:
        return np.asarray(lazy.value(tensor), dtype=np.float64)  # a big model's: read from its file
    except (ValueError, TypeError, KeyError, OSError):  # external data not loaded, odd types: values unchecked
        return None


# ----------------------------------------------------------------------------- model-wide rules

def _check_opset(index: _Index) -> list[Violation]:
    low, high = OPSETS[index.major]
    if low <= index.opset <= high:
        return []
    if index.opset < low:
        what = f"Q/DQ with per-channel axis needs opset {low}: convert it up (onnx.version_converter) or re-export"
    else:
        what = f"convert it down (onnx.version_converter) or re-export at opset {high}"
    return [Violation("", "opset", f"default-domain opset {index.opset}; the TensorRT {index.major}.x parser takes Q/DQ models at opset {low} to {high}: {what}")]


def _no_qdq_message(major: int) -> str:
    if major >= 11:
        why = "TensorRT 11 has no other INT8 path (no calibration cache, no --int8), so it builds this model without INT8"
    else:
        why = f"TensorRT {major}.x builds it INT8 only with a calibration cache (implicit quantization)"
    return f"no QuantizeLinear/DequantizeLinear node: {why}; export a Q/DQ model: {EXPORT_HINT}"


def _qoperator_message(node: onnx.NodeProto) -> str:
    where = f"{node.domain} " if node.domain not in DEFAULT_DOMAINS else ""
    return (f"{where}{node.op_type} is a QOperator-form node TensorRT does not import; use the QDQ format "
            f"(FP32 op between QuantizeLinear/DequantizeLinear): {EXPORT_HINT}")


# ----------------------------------------------------------------------------- per Q/DQ node

Found = list[tuple[str, str]]  # (rule, message) pairs of one node


def _check_qdq(node: onnx.NodeProto, index: _Index) -> list[Violation]:
    """Every rule one QuantizeLinear/DequantizeLinear node breaks."""
    found: Found = []
    for rule in (_check_type, _check_fp8, _check_zero_point, _check_scale, _check_channels):
        found += rule(node, index)
    return [Violation(_name(node), rule, message) for rule, message in found]


def _size(tensor: TensorProto) -> int:
    return int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1


def _quant_type(node: onnx.NodeProto, index: _Index) -> int | None:
    """The integer type a Q produces or a DQ reads, as ONNX defines it (None: unknown)."""
    zero_point = _input(node, 2)
    if zero_point:
        tensor = index.consts.get(zero_point)
        return tensor.data_type if tensor is not None else index.types.get(zero_point)
    if node.op_type == "QuantizeLinear":
        return _attr(node, "output_dtype", 0) or TensorProto.UINT8  # ONNX's default without a zero point
    x = node.input[0]
    if x in index.consts:
        return index.consts[x].data_type
    source = index.producer.get(x)
    if source is not None and _is_qdq(source) and source.op_type == "QuantizeLinear":
        return _quant_type(source, index)
    return index.types.get(x)


def table_of(node: onnx.NodeProto, index: _Index) -> Table:
    """The rule table a Q/DQ node is held to: the one asked for, else FP8's for a FLOAT8 node."""
    if index.precision is not None:
        return TABLES[index.precision]
    return TABLES["fp8"] if _quant_type(node, index) in FLOAT8 else TABLES["int8"]


def _check_type(node: onnx.NodeProto, index: _Index) -> Found:
    """INT8 (or FP8 E4M3) only; no int32 bias DQ; INT8 weight initializers only from TensorRT 10."""
    x = node.input[0]
    stored = index.consts.get(x) if node.op_type == "DequantizeLinear" else None
    if stored is not None and stored.data_type == TensorProto.INT32:
        return [("int32-bias", (f"DequantizeLinear of the INT32 initializer {x} (int32 bias) is not imported by TensorRT: "
                 "keep the bias FP32 (onnxruntime quantize_static: extra_options={'QuantizeBias': False})"))]
    found: Found = []
    qtype = _quant_type(node, index)
    table = table_of(node, index)
    side = "quantizes to" if node.op_type == "QuantizeLinear" else "dequantizes"
    if qtype is not None and table.precision == "fp8" and qtype != table.qtype:
        found.append(("fp8-e4m3-only", (f"{node.op_type} {side} {_type_name(qtype)}; TensorRT's FP8 is FLOAT8E4M3FN only "
                      f"(no E5M2 or FNUZ types in Q/DQ): re-export with E4M3: {table.hint}")))
    elif qtype is not None and qtype != TensorProto.INT8 and table.precision == "int8":
        default = " (ONNX's default without a zero point; TensorRT would silently use INT8)" if not _input(node, 2) else ""
        found.append(("int8-only", (f"{node.op_type} {side} {_type_name(qtype)}{default}; TensorRT takes signed INT8 only: "
                      f"re-export with symmetric int8 Q/DQ: {EXPORT_HINT}")))
    if stored is not None and stored.data_type == TensorProto.INT8 and index.major < 10:
        found.append(("weight-int8-initializer", (f"weight {x} is stored as an INT8 initializer read by DequantizeLinear, which "
                      f"TensorRT documents from 10.x only: store the FP32 weight with QuantizeLinear -> DequantizeLinear")))
    return found


def _check_fp8_model(qdq: list[onnx.NodeProto], index: _Index) -> list[Violation]:
    """Model-wide, when a Q/DQ node is held to FP8's table: opset 19+ (FLOAT8 Q/DQ), TensorRT 10+."""
    if not any(table_of(n, index).precision == "fp8" for n in qdq):
        return []
    table, found = TABLES["fp8"], []
    if index.opset < table.min_opset:
        found.append(Violation("", "fp8-opset", (f"FP8 Q/DQ needs opset {table.min_opset} (the model has {index.opset}): "
                               f"convert it up (onnx.version_converter) or re-export: {table.hint}")))
    if index.major < table.min_major:
        found.append(Violation("", "fp8-version", (f"TensorRT {index.major}.x's parser reads up to opset {OPSETS[index.major][1]}, "
                               f"below FP8 Q/DQ's {table.min_opset}: build with TensorRT {table.min_major} or later, or use INT8")))
    return found


def _check_fp8(node: onnx.NodeProto, index: _Index) -> Found:
    """FP8 QuantizeLinear saturating (the default)."""
    if node.op_type == "QuantizeLinear" and table_of(node, index).precision == "fp8" and _attr(node, "saturate", 1) == 0:
        return [("fp8-saturate", ("saturate 0: onnxruntime turns values past +-448 * scale into NaN, TensorRT saturates "
                 "them: drop the attribute (default 1)"))]
    return []


def _check_zero_point(node: onnx.NodeProto, index: _Index) -> Found:
    """Zero points constant and all 0; present at all on 8.x (3-input Q/DQ)."""
    name = _input(node, 2)
    if not name:
        if index.major < 10:
            return [("zero-point-input", (f"no zero-point input: the TensorRT {index.major}.x parser needs 3-input Q/DQ; add "
                     "an int8 zero point of 0 with as many elements as the scale"))]
        return []
    tensor = index.consts.get(name)
    if tensor is None:
        return [("zero-point", f"zero point {name} is not a constant: TensorRT needs constant zeros (symmetric quantization)")]
    found: Found = []
    values = _values(tensor)
    if values is not None and np.any(values != 0):
        shown = f"{values.flat[0]:g}" if values.size == 1 else f"{np.count_nonzero(values)} of {values.size} non-zero"
        found.append(("zero-point", (f"zero point {name} is {shown}, not 0: TensorRT only supports symmetric quantization; "
                      f"re-export with symmetric activations: {table_of(node, index).hint}")))
    scale = index.consts.get(_input(node, 1))
    if scale is not None and _size(scale) != _size(tensor):
        found.append(("zero-point", (f"zero point {name} has {_size(tensor)} element(s), the scale {scale.name or _input(node, 1)} "
                      f"{_size(scale)}: give one zero per scale")))
    return found


def _check_scale(node: onnx.NodeProto, index: _Index) -> Found:
    """Scales constant (so of static shape), FP32 (FP16/BF16 from opset 19, TensorRT 10+), finite, > 0."""
    name = _input(node, 1)
    tensor = index.consts.get(name)
    if tensor is None:
        return [("scale", (f"scale {name} is not a constant (initializer or Constant node): TensorRT needs constant scales "
                 "of static shape; fold constants (polygraphy surgeon sanitize --fold-constants) or re-export"))]
    found: Found = []
    dtype = _type_name(tensor.data_type)
    if tensor.data_type in HALF_SCALES and index.opset < 19:
        found.append(("fp16-scale-opset", (f"scale {name} is {dtype}, which Q/DQ take from opset 19 (the model has "
                      f"{index.opset}): use FP32 scales or opset 19+")))
    elif tensor.data_type in HALF_SCALES and index.major < 10:
        found.append(("scale", f"scale {name} is {dtype}; TensorRT {index.major}.x takes FP32 scales only: use FP32 scales"))
    elif tensor.data_type not in (TensorProto.FLOAT, *HALF_SCALES):
        found.append(("scale", f"scale {name} is {dtype}; TensorRT takes FP32 scales (FP16 from opset 19): use FP32 scales"))
    values = _values(tensor)
    if values is not None and values.size == 0:
        found.append(("scale", f"scale {name} is empty: give one scale per tensor or per channel"))
    elif values is not None:
        bad = values[~(np.isfinite(values) & (values > 0))]
        if bad.size:
            found.append(("scale", (f"scale {name} has {bad.size} of {values.size} value(s) that are not finite and > 0 "
                          f"(e.g. {bad[0]:g}): TensorRT needs finite positive scales; recalibrate")))
    return found


def _check_channels(node: onnx.NodeProto, index: _Index) -> Found:
    """Per tensor for activations; per channel only along a weight's output-channel axis."""
    block = _attr(node, "block_size", 0)
    if block:
        return [("block-quantization", (f"block_size {block}: TensorRT does not take block-quantized INT8; "
                 "quantize weights per channel (1-D scale along the output-channel axis)"))]
    found: Found = []
    if _attr(node, "axis") is not None and index.opset < 13:
        found.append(("opset", f"the axis attribute of {node.op_type} needs opset 13 (the model has {index.opset})"))
    scale = index.consts.get(_input(node, 1))
    if scale is None or _size(scale) <= 1:
        return found
    weight = _weight(node, index)
    if weight is None:
        found.append(("activation-per-tensor", (f"{_size(scale)} scales (per channel) on the activation {node.input[0]}: "
                      f"TensorRT quantizes activations per tensor only; use one scalar scale: {table_of(node, index).hint}")))
        return found
    return found + _check_weight_axis(node, index, scale, weight)


def _weight(node: onnx.NodeProto, index: _Index) -> TensorProto | None:
    """The constant tensor this node quantizes (a DQ's through its Q), None for an activation."""
    x = node.input[0]
    if x in index.consts:
        return index.consts[x]
    source = index.producer.get(x)
    if node.op_type == "DequantizeLinear" and source is not None and _is_qdq(source) \
            and source.op_type == "QuantizeLinear" and source.input[0] in index.consts:
        return index.consts[source.input[0]]
    return None


def _check_weight_axis(node: onnx.NodeProto, index: _Index, scale: TensorProto, weight: TensorProto) -> Found:
    rank = len(weight.dims)
    axis = int(_attr(node, "axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return [("per-channel-axis", f"axis {_attr(node, 'axis', 1)} is outside weight {node.input[0]} of rank {rank}")]
    found: Found = []
    for reader, i in _readers(node, index):
        want = weight_axis(reader, i, rank) if reader.domain in DEFAULT_DOMAINS else None  # the writers' own axis
        if want is None:
            found.append(("per-channel-axis", (f"per-channel scales on {node.input[0]}, read by {reader.op_type} "
                          f"{_name(reader)} as input {i}: TensorRT takes them only on Conv/ConvTranspose/Gemm/MatMul "
                          "weights; use one scalar scale")))
        elif want != axis:
            found.append(("per-channel-axis", (f"axis {axis}, but {reader.op_type} {_name(reader)} needs its weight "
                          f"quantized along axis {want} (its output channels): set axis={want}")))
    if found:  # a scale count that does not fit a wrong axis follows from it
        return found
    if len(scale.dims) != 1:
        found.append(("scale", f"scale {_input(node, 1)} has shape {list(scale.dims)}: per-channel scales are 1-D"))
    elif scale.dims[0] != weight.dims[axis]:
        found.append(("scale", (f"{scale.dims[0]} scales for axis {axis} of weight {node.input[0]}, which has "
                      f"{weight.dims[axis]} channels there: give one scale per channel")))
    return found


def _readers(node: onnx.NodeProto, index: _Index) -> list[tuple[onnx.NodeProto, int]]:
    """The nodes (and input slots) that read the dequantized value, through Identity."""
    if node.op_type == "DequantizeLinear":
        pending = [node.output[0]]
    else:
        pending = [n.output[0] for n, _ in index.consumers.get(node.output[0], [])
                   if _is_qdq(n) and n.op_type == "DequantizeLinear"]
    readers, seen = [], set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        for reader, i in index.consumers.get(name, []):
            if reader.op_type == "Identity" and reader.domain in DEFAULT_DOMAINS:
                pending.append(reader.output[0])
            else:
                readers.append((reader, i))
    return readers
