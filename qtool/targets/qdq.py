"""QDQ: standard ONNX QuantizeLinear/DequantizeLinear with the OpenVINO target's placement.

Activations: QuantizeLinear -> DequantizeLinear per tensor, uint8 [0, amax] when never negative,
else int8 with scale amax/127 (zero point 0 in both cases). Weights: int8 initializers (narrow
range [-127, 127], or [-63, 63] with --weights-7bit) with a per-output-channel DequantizeLinear
(`axis`). onnxruntime runs the result (its uint8 activations are not for every runtime's Q/DQ parser).

DequantizeLinear's `axis` needs opset 13, so older models (paddle2onnx writes opset 11-12) are
converted with onnx's version converter first; onnxruntime's own quantizer writes an invalid
model there (its DequantizeLinear `axis` needs opset 13).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import Opt, QtoolError
from ..model import float16, lazy
from ..model import graph as G
from ..model.checker import check
from ..options import ExportOptions
from ..quantizers import grids, placement
from ..quantizers import policy as policy_mod
from ..quantizers.quantizer import Quantizer
from . import get
from .cpu import CpuOptions, Prepared, export_prepared, with_quantizers
from .cpu import prepare as cpu_prepare
from .cpu import report_view as cpu_report_view

DEFAULTS = ExportOptions("qdq")

MIN_OPSET = 13


def suffix(options: ExportOptions | None = None) -> str:
    return get("qdq").suffix


def upgrade_opset(model: onnx.ModelProto, target: int = MIN_OPSET, why: str = "per-channel DequantizeLinear") -> tuple[onnx.ModelProto, list[str]]:
    """The model at default-domain opset >= target (converted with onnx.version_converter);
    `why` names what needs that opset in the messages."""
    current = G.default_opset(model)
    if current >= target:
        return model, []
    try:
        from onnx import version_converter

        converted = version_converter.convert_version(model, target)
        lazy.rebuilt(converted)
        _original_names(model, converted)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QtoolError(
            f"the model is opset {current}; {why} needs opset {target} and onnx's version "
            f"converter failed ({reason}); re-export the model at opset {target} or later"
        ) from None
    try:
        check(converted)  # onnx.checker (a big model without its lazy weights)
    except onnx.checker.ValidationError as e:
        raise QtoolError(
            f"the model is opset {current}; converting it to opset {target} gave an invalid model "
            f"({str(e).strip().splitlines()[0]}); re-export the model at opset {target} or later"
        ) from None
    return converted, [f"the model was converted from opset {current} to opset {target} ({why} needs {target})"]


def _original_names(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Give back the names onnx's version converter changed: an adapter that replaces a node names its output anew
    (an opset-9 Upsample becomes a Resize writing '_v_21' where the model said 'u'), and the calibration file's range
    of 'u' would find no tensor. The converter keeps the nodes in order, adding only the Constant nodes that hold new
    inputs; where the two node lists do not align, nothing is renamed."""
    known = {o for n in original.graph.node for o in n.output} | {i.name for i in original.graph.input} | \
        {t.name for t in original.graph.initializer}
    nodes = [n for n in converted.graph.node if not (n.op_type == "Constant" and not set(n.output) & known)]
    if len(nodes) != len(original.graph.node) or any(a.op_type != b.op_type and len(a.output) != len(b.output)
                                                     for a, b in zip(original.graph.node, nodes)):
        return
    rename = {new: old for a, b in zip(original.graph.node, nodes) for old, new in zip(a.output, b.output)
              if old and new and old != new and new not in known}
    if not rename:
        return
    for n in converted.graph.node:
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename.get(t, t) for t in n.output]
    for v in list(converted.graph.output) + list(converted.graph.value_info):
        v.name = rename.get(v.name, v.name)


def add_initializer(model: onnx.ModelProto, namer: G.Namer, base: str, array: np.ndarray) -> str:
    name = namer.fresh(base)
    model.graph.initializer.append(numpy_helper.from_array(array, name))
    return name


# Integer types Q/DQ hold (ONNX QuantizeLinear-21: INT4/UINT4 and INT16/UINT16 need opset 21)
_NUMPY = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}
WIDE_OPSET = 21


def storage_type(grid: grids.Grid) -> int:
    """The smallest Q/DQ integer type holding `grid`."""
    for bits, signed_type, unsigned_type in ((4, TensorProto.INT4, TensorProto.UINT4), (8, TensorProto.INT8, TensorProto.UINT8),
                                             (16, TensorProto.INT16, TensorProto.UINT16)):
        full = grids.grid(bits, signed=grid.signed)
        if full.qmin <= grid.qmin and grid.qmax <= full.qmax:
            return signed_type if grid.signed else unsigned_type
    raise QtoolError(f"no ONNX integer type holds the grid [{grid.qmin}, {grid.qmax}]")


def needs_wide_types(policies) -> bool:
    """Whether any policy may need 4- or 16-bit storage (opset 21)."""
    if policies is None:
        return False
    bits = {policies.activations.bits, policies.weights.bits} | {r.changes["bits"] for r in policies.rules if "bits" in r.changes}
    return any(b <= 4 or b > 8 for b in bits)


def _int_init(model: onnx.ModelProto, namer: G.Namer, base: str, values: np.ndarray, elem_type: int) -> str:
    name = namer.fresh(base)
    if elem_type in _NUMPY:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(values, dtype=_NUMPY[elem_type]), name))
    else:
        v = np.asarray(values, dtype=np.int64)
        model.graph.initializer.append(helper.make_tensor(name, elem_type, list(v.shape), v.ravel().tolist()))
    return name


def _unsigned(p: grids.QParams) -> grids.QParams:
    """The same quantizer on the unsigned grid: q + 2^(b-1) with the zero point moved alike (the
    values it represents and the rounding are unchanged)."""
    if not p.grid.signed:
        return p
    shift = -p.grid.qmin
    return grids.QParams(p.scale, np.asarray(p.zero_point) + shift, grids.Grid(0, p.grid.qmax + shift), p.axis)


def _activation_nodes(model, namer, site: Quantizer) -> list[onnx.NodeProto]:
    p = site.params()
    if G.default_opset(model) >= WIDE_OPSET:
        # onnxruntime 1.32's optimizer breaks signed QuantizeLinear-21 (its int8 -> uint8 rewrite keeps
        # output_dtype INT8 beside a UINT8 zero point and the session fails to load): write them unsigned
        p = _unsigned(p)
    ztype = storage_type(p.grid)
    full = grids.grid({TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.INT16: 16, TensorProto.UINT16: 16}.get(ztype, 8), p.grid.signed)
    if (full.qmin, full.qmax) != (p.grid.qmin, p.grid.qmax):
        raise QtoolError("QuantizeLinear saturates to whole 4-, 8- or 16-bit types; the {bits}-bit activations of {tensor!r} need a "
                         "FakeQuantize target ({openvino})", bits=site.policy.bits, tensor=site.tensor, openvino=Opt("target", "openvino"))
    scale = add_initializer(model, namer, f"{site.tensor}/scale", np.asarray(p.scale, dtype=np.float32))
    zp = _int_init(model, namer, f"{site.tensor}/zero_point", p.zero_point, ztype)
    q = namer.fresh(f"{site.tensor}/quantized")
    dq = namer.fresh(f"{site.tensor}/dequantized")
    attrs = {"axis": p.axis} if p.axis is not None and np.ndim(p.scale) > 0 else {}  # per channel: depthwise Conv inputs
    return [helper.make_node("QuantizeLinear", [site.tensor, scale, zp], [q], name=namer.fresh(f"{site.tensor}/QuantizeLinear"), **attrs),
            helper.make_node("DequantizeLinear", [q, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs)]


def _weight_node(model, namer, site: Quantizer) -> onnx.NodeProto:
    p = site.params()
    axis = p.axis if p.axis is not None and np.ndim(p.scale) > 0 else None
    q = policy_mod.quantize(site.values, p, site.policy.rounding)
    if site.unsigned_storage:  # the same values as uint8 with zero point 128: onnxruntime's u8 x u8 kernels never saturate
        shift = p.grid.qmax + 1
        q, p = q + shift, grids.QParams(p.scale, np.asarray(p.zero_point) + shift, grids.Grid(p.grid.qmin + shift, p.grid.qmax + shift), p.axis)
    ztype = storage_type(p.grid)
    kind = {TensorProto.INT8: "int8", TensorProto.UINT8: "uint8"}.get(ztype, "int")
    wq = _int_init(model, namer, f"{site.tensor}/{kind}", q, ztype)
    scale = add_initializer(model, namer, f"{site.tensor}/scale", np.asarray(p.scale, dtype=np.float32))
    zp = _int_init(model, namer, f"{site.tensor}/zero_point", np.broadcast_to(p.zero_point, np.shape(p.scale)), ztype)
    dq = namer.fresh(f"{site.tensor}/dequantized")
    attrs = {"axis": axis} if axis is not None else {}
    return helper.make_node("DequantizeLinear", [wq, scale, zp], [dq], name=namer.fresh(f"{site.tensor}/DequantizeLinear"), **attrs)


def apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan) -> None:
    """Insert the plan's quantizers as QuantizeLinear/DequantizeLinear nodes (in place)."""
    nodes = G.Index(model).nodes
    new_nodes = []
    for site in plan.quantizers:
        new_nodes += [_weight_node(model, namer, site)] if site.is_weight else _activation_nodes(model, namer, site)
        for node_name, slot in site.readers:
            nodes[node_name].input[slot] = new_nodes[-1].output[0]
    model.graph.node.extend(new_nodes)


def _apply(model: onnx.ModelProto, namer: G.Namer, plan: placement.Plan) -> None:
    """`apply`, then a float16 model's graph inputs and outputs given back their float16 types (qtool.model.float16)."""
    apply(model, namer, plan)
    float16.restore(model, namer)


def prepare(loaded, cal, options: ExportOptions = DEFAULTS) -> Prepared:
    """The steps of the QDQ export up to the placement: `export` and qtool.checks.evaluation share them."""
    model = float16.twin(G.copy_model(loaded.proto, str(loaded.path.parent)))  # a float16 model: its float32 twin
    policies = options.group(CpuOptions).policies
    policies = policies if policies is not None else policy_mod.Policies()
    if needs_wide_types(policies):
        model, warnings = upgrade_opset(model, WIDE_OPSET, why="QuantizeLinear/DequantizeLinear with 4- or 16-bit integers")
    else:
        model, warnings = upgrade_opset(model)
    G.unique_node_names(model.graph, G.Namer(model))
    prepared = cpu_prepare(model, cal, warnings, options, float_types=get("qdq").float_types, overflow_remedy="uint8")
    prepared.warnings += policy_mod.runtime_rounding_warnings(prepared.plan, "onnxruntime")
    return prepared


def quantized(prepared: Prepared, cal, plan: placement.Plan | None = None,
              bias_correction: bool = True) -> tuple[onnx.ModelProto, int, list[str]]:
    """A copy of the prepared model with `plan`'s quantizers (default: all) and, with
    bias_correction, the bias shifts of its int8 layers: (model, layers corrected, warnings)."""
    return with_quantizers(prepared, cal, plan, bias_correction, _apply)


def export(loaded, cal, options: ExportOptions = DEFAULTS):
    """QDQ ONNX from the calibration `cal` of `loaded` (its CpuOptions' policies: qtool.quantizers.policy.Policies)."""
    prepared = prepare(loaded, cal, options)
    return export_prepared(loaded, cal, prepared, _apply, options.bias_correction, opset=True)


def report_view(loaded, cal, *, method: str | None = None):
    """What qtool report shows of this export (default options)."""
    return cpu_report_view(prepare, "QDQ model (onnxruntime)", loaded, cal, ExportOptions("qdq", method=method))
