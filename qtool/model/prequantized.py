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
from .graph import Index, attr

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


def activation_grid(m: Index, t: str) -> tuple[float, int, bool] | None:
    """(scale, zero point, signed) of the 8-bit pair an activation `t` is on (its DequantizeLinear, or one up through
    pass-through ops: `PASSES`), per tensor; None elsewhere."""
    for _ in range(64):
        n = m.producer.get(t)
        if n is None or not _standard(n):
            return None
        if n.op_type == "DequantizeLinear":
            if len(n.input) < 2 or n.input[1] not in m.constants or (len(n.input) > 2 and n.input[2] and n.input[2] not in m.constants):
                return None
            scale = numpy_helper.to_array(m.constants[n.input[1]])
            zp = m.constants[n.input[2]] if len(n.input) > 2 and n.input[2] else None
            kind = zp.data_type if zp is not None else TensorProto.UINT8
            if scale.size != 1 or kind not in (TensorProto.UINT8, TensorProto.INT8) or not float(scale.reshape(())) > 0:
                return None
            return float(scale.reshape(())), int(numpy_helper.to_array(zp).reshape(-1)[0]) if zp is not None else 0, kind == TensorProto.INT8
        if n.op_type not in PASSES or not n.input:
            return None
        t = n.input[0]
    return None
