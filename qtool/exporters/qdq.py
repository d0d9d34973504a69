"""QDQ: standard ONNX QuantizeLinear/DequantizeLinear with the OpenVINO target's placement.

Activations: QuantizeLinear -> DequantizeLinear per tensor, uint8 [0, amax] when never negative,
else int8 with scale amax/127 (zero point 0 in both cases). Weights: int8 initializers (narrow
range [-127, 127], or [-63, 63] with --weights-7bit) with a per-output-channel DequantizeLinear
(`axis`). onnxruntime runs the result; TensorRT 10+ builds explicit-quantization engines from it.

DequantizeLinear's `axis` needs opset 13, so older models (paddle2onnx writes opset 11-12) are
converted with onnx's version converter first; onnxruntime's own quantizer writes an invalid
model there (reference section 8).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import biascorrection, placement, quant
from .. import graph as G
from ..errors import QtoolError

MIN_OPSET = 13


def suffix(**_options) -> str:
    return ".qdq.onnx"


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_OPSET, why: str = "per-channel DequantizeLinear") -> tuple[onnx.ModelProto, list[str]]:
    """The model at default-domain opset >= target (converted with onnx.version_converter);
    `why` names what needs that opset in the messages."""
    current = G.default_opset(model)
    if current >= target:
        return model, []
    try:
        from onnx import version_converter

        converted = version_converter.convert_version(model, target)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QtoolError(
            f"the model is opset {current}; {why} needs opset {target} and onnx's version "
            f"converter failed ({reason}); re-export the model at opset {target} or later"
        ) from None
    try:
        onnx.checker.check_model(converted)
    except onnx.checker.ValidationError as e:
        raise QtoolError(
            f"the model is opset {current}; converting it to opset {target} gave an invalid model "
            f"({str(e).strip().splitlines()[0]}); re-export the model at opset {target} or later"
        ) from None
    return converted, [f"the model was converted from opset {current} to opset {target} ({why} needs {target})"]


def _init(model: onnx.ModelProto, namer: G.Namer, base: str, array: np.ndarray) -> str:
    name = namer.fresh(base)
    model.graph.initializer.append(numpy_helper.from_array(array, name))
    return name


def apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan) -> None:
    """Insert the plan's quantizers as QuantizeLinear/DequantizeLinear nodes (in place)."""
    nodes = {n.name: n for n in model.graph.node}
    new_nodes = []
    for site in plan.activations:
        p = site.params()
        ztype = np.int8 if p.grid.signed else np.uint8
        scale = _init(model, namer, f"{site.tensor}/scale", np.asarray(p.scale, dtype=np.float32))
        zp = _init(model, namer, f"{site.tensor}/zero_point", np.asarray(p.zero_point, dtype=ztype))
        q = namer.fresh(f"{site.tensor}/quantized")
        dq = namer.fresh(f"{site.tensor}/dequantized")
        attrs = {"axis": p.axis} if p.axis is not None and np.ndim(p.scale) > 0 else {}  # per channel: depthwise Conv inputs
        new_nodes.append(helper.make_node("QuantizeLinear", [site.tensor, scale, zp], [q], name=namer.fresh(f"{site.tensor}/QuantizeLinear"), **attrs))
        new_nodes.append(helper.make_node("DequantizeLinear", [q, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs))
        for node_name, slot in site.readers:
            nodes[node_name].input[slot] = dq
    for site in plan.weights:
        p = site.params()
        axis = p.axis if p.axis is not None and np.ndim(p.scale) > 0 else None
        q = quant.quantize_linear(site.values, p.scale, p.zero_point, p.grid, axis).astype(np.int8)
        wq = _init(model, namer, f"{site.tensor}/int8", q)
        scale = _init(model, namer, f"{site.tensor}/scale", np.asarray(p.scale, dtype=np.float32))
        zp = _init(model, namer, f"{site.tensor}/zero_point", np.zeros(np.shape(p.scale), dtype=np.int8))
        dq = namer.fresh(f"{site.tensor}/dequantized")
        attrs = {"axis": axis} if axis is not None else {}
        new_nodes.append(helper.make_node("DequantizeLinear", [wq, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs))
        for node_name, slot in site.readers:
            nodes[node_name].input[slot] = dq
    model.graph.node.extend(new_nodes)


def export(loaded, cal, *, exclude=(), include=(), weights_7bit=None, ignored_patterns=True, bias_correction=True, **_options):
    """QDQ ONNX from the calibration `cal` of `loaded`."""
    from . import ExportResult

    model = G.copy_model(loaded.proto, str(loaded.path.parent))
    model, warnings = upgrade_opset(model)
    namer = G.Namer(model)
    G.unique_node_names(model.graph, namer)
    plan = placement.place(model, {t.name: t for t in cal.tensors}, exclude=list(exclude or ()), include=list(include or ()),
                           weights_7bit=weights_7bit, ignored_patterns=ignored_patterns, float_types=(TensorProto.FLOAT,))
    corrected, bc_warnings = biascorrection.apply_to_export(model, namer, plan, cal, bias_correction)
    apply(model, namer, plan)
    data, more = G.finish(model, loaded.proto)
    summary = {**plan.summary(), "opset": G.default_opset(model), "fp32_layer_names": sorted(plan.fp32_layers),
               "bias_corrected_layers": corrected}
    return ExportResult(data, warnings + plan.warnings + bc_warnings + more, summary)
