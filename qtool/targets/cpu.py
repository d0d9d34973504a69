"""What the CPU targets (OpenVINO FakeQuantize, onnxruntime QDQ) share: NNCF's CPU placement
rules (`CPU`), the placement with the thresholds and policies those targets use (`cpu_plan`),
and the preparation qtool.checks.evaluation shares with their exports (`prepare`, `Prepared`,
`with_quantizers`).

CPU rules: NNCF's (openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py), and on a graph
with attention and LayerNorm NNCF's transformer preset, see the qtool.quantizers.placement docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import onnx

from ..calibration import Threshold
from ..model import graph as G
from ..options import ExportOptions
from ..quantizers import biascorrection, placement, policy
from ..quantizers.rules import ELEMENTWISE, LINEAR, POOLING, SHAPE_OPS, Rules
from ..quantizers.smoothquant import smooth
from . import ReportView, WrittenFile

# ops that move values without computing new ones, beside the shape ops: NNCF's quantize-agnostic operations
# (openvinotoolkit/nncf src/nncf/onnx/graph/metatypes/groups.py QUANTIZE_AGNOSTIC_OPERATIONS) that read one data
# input (the rest indices or shapes) and write values of it. A CRNN's unrolled BiLSTM Gathers each time step of
# one sequence: one quantizer on the sequence (OpenVINO gathers u8) instead of one per step (a single Gather, a
# class token's, keeps its quantizer: placement.moves). Not Pad (its constant
# need not lie on the grid) nor ReduceMax (qtool.targets.openvino moves its quantizer up with the output's range).
MOVED_ONLY = frozenset({"MaxPool", "GlobalMaxPool", "Gather", "GatherElements", "GatherND", "Tile", "Expand", "DepthToSpace",
                        "SpaceToDepth", "Dropout"})

CPU = Rules(
    name="cpu",
    linear=LINEAR,
    elementwise=ELEMENTWISE,
    residual_input=None,
    pooling=POOLING,
    pooling_needs_neighbour=False,
    pass_through=SHAPE_OPS | MOVED_ONLY,
    concat_shares_quantized_inputs=False,
    nncf_patterns=True,
    ignored_patterns=True,
    exclusions=None,
    weight_axis=None,  # placement.sites.weight_axis: the output-channel axis
    signed_only=False,
    clip_fallback=True,
    depthwise_per_channel=True,
    # per tensor the lowest histogram quantization error of entropy, percentile and mse: on the
    # real PP-OCR/MTCNN/YOLO models it matches or beats NNCF's defaults (bench/fidelity.py)
    default_method="auto",
)
# OpenVINO's: its attention kernel takes the context's Transpose only without a FakeQuantize between them
# (MiniLM-L3: 6 runtime Transposes -> 3, as NNCF's file; docs/benchmarks.md#guard-cost)
OPENVINO = replace(CPU, name="openvino", fused_attention_context=True)
PLACEMENT_RULES = {"openvino": OPENVINO}  # by target; the others place with CPU


@dataclass
class Prepared:
    """The model as a target's export edits it before inserting quantizers (opset raised, node
    names unique, SmoothQuant applied, biases not yet corrected) and its plan: what export,
    qtool.checks.evaluation and the report share (the CPU targets' writers, and every other Q/DQ writer's preparation)."""

    model: onnx.ModelProto
    plan: object  # placement.Plan
    warnings: list[str]
    place: Callable | None  # CPU targets: place(exclude) -> Plan, the same placement with more nodes kept FP32
    cal: object = None  # the calibration of `model` when SmoothQuant changed it (smoothed activations' records)
    smoothing: object = None  # smoothquant.Smoothing, when SmoothQuant changed the model
    source_opset: int | None = None  # the model's opset, when the export raised it
    cpu: str | None = None  # CPU targets: the CPU the file is for ("any" or "vnni", the --cpu option)


def with_quantizers(prepared: Prepared, cal, plan, bias_correction: bool, apply: Callable) -> tuple[onnx.ModelProto, int, list[str]]:
    """A copy of the prepared model with `plan`'s quantizers (default: all), inserted by the
    target's `apply(model, namer, plan)`, and with bias_correction the bias shifts of its int8
    layers: (model, layers corrected, warnings)."""
    plan = prepared.plan if plan is None else plan
    cal = prepared.cal if prepared.cal is not None else cal
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    namer = G.Namer(model)
    corrected, warnings = biascorrection.apply_to_export(model, namer, plan, cal, bias_correction)
    apply(model, namer, plan)
    return model, corrected, warnings


def export_prepared(loaded, cal, prepared: Prepared, apply: Callable, bias_correction: bool = True, *, opset: bool = False,
                    rounding_warnings=()):
    """The file of a preparation, as both CPU writers end their export: every quantizer inserted by
    `apply`, biases corrected, the model finished, and the summary (`opset`: with the file's opset;
    `rounding_warnings` after bias correction's)."""

    model, corrected, bc_warnings = with_quantizers(prepared, cal, None, bias_correction, apply)
    data, more = G.finish(model, loaded.proto)
    plan = prepared.plan
    summary = {**plan.summary(), **({"opset": G.default_opset(model)} if opset else {}), **({"cpu": prepared.cpu} if prepared.cpu else {}),
               "fp32_layer_names": sorted(plan.fp32_layers), "bias_corrected_layers": corrected}
    if prepared.smoothing is not None:
        summary["smooth_quant"] = prepared.smoothing.summary
    return WrittenFile(data, prepared.warnings + bc_warnings + list(rounding_warnings) + more, summary)


def cpu_plan(model, cal, options: ExportOptions, *, float_types: tuple[int, ...], overflow_remedy: str | None, more_excluded=(),
             smoothing=None, rules: Rules | None = None):
    """The placement of the OpenVINO and QDQ exports (`model` with unique node names) with the export
    `options` (and `more_excluded` nodes kept FP32): NNCF's CPU rules, the thresholds those targets use
    (calibration.Calibration.for_target), the quantizers' policies (default: qtool.quantizers.policy.Policies())
    and the target's remedy for layers whose int8 pair sums can saturate on CPUs without VNNI
    (placement.place, qtool.quantizers.overflow). `smoothing` (smoothquant.Smoothing, `cal` its
    calibration): the smoothed activations take their exact max |x| as threshold, on every grid.
    `rules`: the placement's (default: the target's, PLACEMENT_RULES)."""
    method, own = options.method, options.cpu_target
    thresholds = cal.for_target(CPU, method)
    recompute = policy.searcher(cal, cal.method_for(CPU, method))
    if smoothing is not None and smoothing.amax:
        records = {t.name: t for t in cal.tensors}
        fixed = dict(smoothing.amax)
        thresholds.update({n: Threshold(a, records[n].unsigned and not CPU.signed_only, 0.0, False) for n, a in fixed.items()})
        searched = recompute

        def recompute(tensor, pol):
            return fixed[tensor] if tensor in fixed else searched(tensor, pol)

    choices = placement.Choices(exclude=list(options.exclude) + list(more_excluded), include=list(options.include),
                                ignored_patterns=own.ignored_patterns, weights_7bit=own.weights_7bit)
    rules = rules or PLACEMENT_RULES.get(options.target, CPU)
    return placement.place(model, {t.name: t for t in cal.tensors}, rules=rules, thresholds=thresholds, choices=choices,
                           overflow_remedy=overflow_remedy,
                           float_types=float_types,
                           policies=own.policies if own.policies is not None else policy.Policies(),
                           recompute=recompute)


def prepare(model, cal, warnings: list[str], options: ExportOptions, *, float_types: tuple[int, ...], overflow_remedy: str) -> Prepared:
    """A CPU target's preparation of `model` (its copy, opset raised and node names unique;
    `warnings` so far) with the export `options`: SmoothQuant on the int8 layers placed without the
    overflow guard (which then decides on the smoothed model), and the placement (`cpu_plan`). cpu
    "vnni": for CPUs whose int8 kernels accumulate in int32, no overflow guard (unless weights_7bit
    first/all asks for 7-bit weights)."""
    cpu = options.cpu_target.cpu
    if cpu == "vnni" and options.cpu_target.weights_7bit in (None, "auto"):
        overflow_remedy = None

    # SmoothQuant's layers: those reading an activation quantizer in NNCF's CPU placement, without the guard (OpenVINO's
    # would add attention's output projection, below the context's Reshape: smoothing it cost ViT-S 1.2 dB, bench/guard_cost.py)
    cal, smoothing, sq_warnings = smooth(model, cal, options.smooth_quant, lambda m, c: cpu_plan(
        m, c, options, float_types=float_types, overflow_remedy=None, rules=CPU))

    def place(more_excluded=()):
        return cpu_plan(model, cal, options, float_types=float_types, overflow_remedy=overflow_remedy,
                        more_excluded=more_excluded, smoothing=smoothing)

    plan = place()
    return Prepared(model, plan, list(warnings) + sq_warnings + list(plan.warnings), place, cal if smoothing else None, smoothing,
                    cpu=cpu)


def report_view(prepare, title: str, loaded, cal, options: ExportOptions):
    """qtool.targets.ReportView of a CPU target's export with these options (`prepare`: its writer's)."""
    method = options.method
    prepared = prepare(loaded, cal, options)
    used = prepared.cal if prepared.cal is not None else cal
    return ReportView(title, prepared.plan, used, used.method_for(CPU, method), used.for_target(CPU, method), prepared.smoothing)
