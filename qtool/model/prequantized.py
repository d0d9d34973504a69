"""A model shipped already quantized in the Q/DQ format (onnxruntime's quantize_static with QuantFormat.QDQ,
what smart-turn v3 ships): its own quantizers, read once and kept.

Such a model's arithmetic is its quantizers: an activation x read as DequantizeLinear(QuantizeLinear(x)) (uint8
with a zero point in onnxruntime's default), a weight as DequantizeLinear of an int8 constant (per output channel),
a bias as DequantizeLinear of an int32 one. It is the reference (what the user runs today) and what the export keeps:
qtool puts no second quantizer on a tensor the model quantizes already (its pair's input, the pair's output and
what pass-through ops make of that output, still on the pair's grid) and reads a linear layer whose inputs are all
the model's own quantized tensors and weights as an int8 layer as it is. What the model left float stays float:
the export is the model as its author quantized it (qtool.quantizers.placement.requests._shipped_requests: qtool's
own quantizers there cost more than they gain, as measured). Quantized again (the pair's output through a second,
calibrated grid), an activation is rounded twice: smart-turn v3's OpenVINO file ran 15.0 dB from the model's
arithmetic, 18.0 then (OpenVINO's run of the model itself; docs/benchmarks.md#prequantized-qdq). The OpenVINO file
writes each pair as the FakeQuantize of its grid (qtool.targets.openvino: the same codes, in the form OpenVINO's int8
layers take whole); the qdq file keeps the pairs as they are.

The patterns are those onnxruntime writes (microsoft/onnxruntime, onnxruntime/python/tools/quantization/
qdq_quantizer.py: a QuantizeLinear -> DequantizeLinear pair per activation tensor, weights and biases as
DequantizeLinear of initializers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from . import dynamic
from .graph import Index, attr, default_opset, toposort

# ops whose output holds values of their (first) input only: on a quantized input's grid, as the input is
# (onnxruntime's QDQ propagation, qdq_quantizer.py, passes a grid through these)
PASSES = dynamic.MOVES | {"Split", "MaxPool", "DepthToSpace", "SpaceToDepth"}
_INTEGERS = {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
             TensorProto.INT4, TensorProto.UINT4}


def _standard(n: onnx.NodeProto) -> bool:
    return n.domain in ("", "ai.onnx")


@dataclass(frozen=True)
class OwnQuantizers:
    """What a model's own QuantizeLinear/DequantizeLinear nodes quantize (empty for a float model)."""

    pairs: int  # activation QuantizeLinear nodes read by a DequantizeLinear
    quantized: frozenset[str]  # each pair's float input (its quantizer is the pair)
    on_grid: frozenset[str]  # each pair's DequantizeLinear outputs and what pass-through ops make of them alone
    weights: frozenset[str]  # DequantizeLinear outputs of integer constants (weights and biases)

    @property
    def tensors(self) -> frozenset[str]:
        """The activations no second quantizer goes on."""
        return self.quantized | self.on_grid

    def reads_own(self, t: str) -> bool:
        """Whether a layer input `t` is quantized by the model itself: on a pair's grid, or an integer weight dequantized."""
        return t in self.on_grid or t in self.weights


NONE = OwnQuantizers(0, frozenset(), frozenset(), frozenset())


def own_quantizers(m: Index) -> OwnQuantizers:
    """The model's own quantizers (NONE when it has no activation QuantizeLinear read by a DequantizeLinear)."""
    constant = set(m.constants)
    pairs = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and _standard(n) and n.input[0] not in constant
             and any(r.op_type == "DequantizeLinear" and slot == 0 for r, slot in m.readers.get(n.output[0], ()))]
    if not pairs:
        return NONE
    quantized = {n.input[0] for n in pairs}
    codes = {n.output[0] for n in pairs}
    on_grid: set[str] = set()
    weights: set[str] = set()
    for n in m.graph.node:  # graph order: the graph is sorted when loaded
        if not _standard(n) or not n.input:
            continue
        if n.op_type == "DequantizeLinear":
            if n.input[0] in codes:
                on_grid.add(n.output[0])
            elif n.input[0] in constant and m.constants[n.input[0]].data_type in _INTEGERS:
                weights.add(n.output[0])
            elif n.input[0] in m.producer and m.producer[n.input[0]].op_type == "QuantizeLinear" and n.input[0] not in codes:
                weights.add(n.output[0])  # a constant quantized in the graph (a weight's QuantizeLinear), dequantized
        elif n.op_type in PASSES and n.input[0] in on_grid:
            on_grid.update(o for o in n.output if o)
    return OwnQuantizers(len(pairs), frozenset(quantized), frozenset(on_grid), frozenset(weights))


def describe(own: OwnQuantizers) -> str:
    return (f"the model quantizes {own.pairs} activation(s) with its own QuantizeLinear/DequantizeLinear pairs: kept (the "
            "OpenVINO file writes each as the FakeQuantize of its grid), its export is the model as quantized (no second "
            "quantizer; what it left float stays float); evaluate's "
            "FP32 reference is the model with those pairs computed as float ops, not onnxruntime's int8 kernels")


def weight_codes(m: Index, t: str):
    """(int8 codes, scale per channel or one (as stored), axis) of a weight `t` the model dequantizes from int8 constants with no
    zero point (onnxruntime's symmetric weights), as its DequantizeLinear reads them; None for anything else."""
    dq = m.producer.get(t)
    if dq is None or dq.op_type != "DequantizeLinear" or not _standard(dq) or any(i not in m.constants for i in dq.input if i):
        return None
    codes = numpy_helper.to_array(m.constants[dq.input[0]])
    if m.constants[dq.input[0]].data_type != TensorProto.INT8 or codes.ndim == 0:
        return None
    if len(dq.input) > 2 and dq.input[2] and np.any(numpy_helper.to_array(m.constants[dq.input[2]])):
        return None
    scale = numpy_helper.to_array(m.constants[dq.input[1]])
    axis = int(attr(dq, "axis", 1)) % codes.ndim if scale.size > 1 else None
    return codes, scale.reshape(-1), axis


def dequantized(codes: np.ndarray, scale: np.ndarray, axis: int | None) -> np.ndarray:
    """The values a DequantizeLinear with no zero point computes of `weight_codes`' (codes, scale, axis): q x scale,
    in the scale's type (onnx docs/Operators.md)."""
    shape = [1] * codes.ndim
    if axis is not None:
        shape[axis] = scale.size
    return codes.astype(scale.dtype) * scale.reshape(shape)


def activation_grid(m: Index, t: str) -> tuple[float, int, bool] | None:
    """(scale, zero point, signed) of the 8-bit pair an activation `t` is on (its DequantizeLinear, or one up through
    pass-through ops: `PASSES`), per tensor; None elsewhere."""
    for _ in range(64):
        n = m.producer.get(t)
        if n is None or not _standard(n):
            return None
        if n.op_type == "DequantizeLinear":
            grid = pair_grid(n, m.constants)
            return None if grid is None else (grid[0], grid[1], grid[2] == TensorProto.INT8)
        if n.op_type not in PASSES or not n.input:
            return None
        t = n.input[0]
    return None


def pairs_as_float_ops(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` with each of its own activation QuantizeLinear -> DequantizeLinear pairs (per tensor, 8-bit)
    written as the float ops of the arithmetic they state, (clip(round(x / s) + zp, qmin, qmax) - zp) x s (onnx
    docs/Operators.md; Round is half to even, as QuantizeLinear's rounding): what evaluate's reference computes
    (onnxruntime with its graph optimizations off), in a form a runtime cannot fuse into int8 layers. A runtime given
    the pairs themselves runs the model's reference in its int8 kernels (OpenVINO's "FP32" run of a shipped model was
    its int8 run, trueocr_orient u8: the same 22.06 dB). The weights' DequantizeLinear of constants stay: they compute
    in float. Pairs of other grids stay as they are, and so does a model before opset 11 (Round, Clip's inputs)."""
    if default_opset(proto) < 11:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    m = Index(out)
    made: list[onnx.NodeProto] = []
    gone: set[int] = set()
    for q, readers, (scale, zero_point, kind) in own_pairs(m):
        lo, hi = (-128, 127) if kind == TensorProto.INT8 else (0, 255)
        base = q.output[0]
        consts = {k: f"{base}/float_{k}" for k in ("scale", "zero", "lo", "hi")}
        for k, v in zip(consts, (scale, zero_point, lo, hi)):
            out.graph.initializer.append(numpy_helper.from_array(np.asarray(v, np.float32), consts[k]))

        def op(kind: str, *inputs: str, base: str = base, name: str = q.name or base) -> str:
            made.append(onnx.helper.make_node(kind, list(inputs), [f"{base}/float_{kind}"], name=f"{name}/float_{kind}"))
            return made[-1].output[0]

        codes = op("Clip", op("Add", op("Round", op("Div", q.input[0], consts["scale"])), consts["zero"]), consts["lo"], consts["hi"])
        t = op("Sub", codes, consts["zero"])
        for r in readers:
            made.append(onnx.helper.make_node("Mul", [t, consts["scale"]], [r.output[0]], name=f"{r.name or r.output[0]}/float_Mul"))
            gone.add(id(r))
        gone.add(id(q))
    if gone:
        kept = [n for n in out.graph.node if id(n) not in gone]
        del out.graph.node[:]
        out.graph.node.extend(kept + made)
        out.graph.ClearField("value_info")  # the codes' integer types are float now
        toposort(out.graph)
    return out


_EIGHT_BIT = frozenset({TensorProto.UINT8, TensorProto.INT8})


def pair_grid(node: onnx.NodeProto, constants: dict[str, onnx.TensorProto], code_type: int | None = None):
    """(scale, zero point, element type of the codes) of a per-tensor 8-bit QuantizeLinear or DequantizeLinear
    (`code_type`: the codes' type a DequantizeLinear reads), or None."""
    if not _standard(node) or len(node.input) < 2 or node.input[1] not in constants:
        return None
    scale = numpy_helper.to_array(constants[node.input[1]])
    if scale.size != 1 or not (np.isfinite(scale).all() and scale.item() > 0):
        return None
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in constants:
            return None
        zp_proto = constants[node.input[2]]
        zp, kind = numpy_helper.to_array(zp_proto), zp_proto.data_type
    else:
        zp = np.zeros(1, np.int64)
        kind = code_type or attr(node, "output_dtype") or TensorProto.UINT8
    if kind not in _EIGHT_BIT or zp.size != 1:
        return None
    return float(scale.reshape(())), int(zp.reshape(())), kind


def own_pairs(m: Index) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto], tuple[float, int, int]]]:
    """The model's own activation pairs, in graph order: (each QuantizeLinear of a per-tensor 8-bit grid (`pair_grid`)
    whose codes are no graph output and are read only by DequantizeLinears of the same grid, those readers, the grid)."""
    found = []
    for q in m.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] in m.constants:
            continue
        grid = pair_grid(q, m.constants)
        readers = m.readers.get(q.output[0], [])
        if grid is None or q.output[0] in m.outputs or not readers or any(
                r.op_type != "DequantizeLinear" or slot != 0 or pair_grid(r, m.constants, grid[2]) != grid for r, slot in readers):
            continue
        found.append((q, [r for r, _ in readers], grid))
    return found
