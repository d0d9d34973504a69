"""What the CPU targets (OpenVINO FakeQuantize, onnxruntime QDQ) share: NNCF's CPU placement
rules (`CPU`), the placement with the thresholds and policies those targets use (`cpu_plan`),
the preparation qtool.checks.evaluation shares with their exports (`prepare`, `Prepared`,
`with_quantizers`), and their options (`CpuOptions`, made on the command line of `PolicyFlags`).

CPU rules: NNCF's (openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py), and on a graph
with attention and LayerNorm NNCF's transformer preset, see the qtool.quantizers.placement docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

import onnx

from ..calibration import Threshold
from ..errors import Opt, QtoolError, UsageError
from ..model import graph as G
from ..options import ExportOptions, _check_choices, declared_options, option
from ..quantizers import biascorrection, gptq, placement, policy
from ..quantizers.rules import ELEMENTWISE, LINEAR, POOLING, SHAPE_OPS, Rules
from ..quantizers.smoothquant import smooth
from . import ReportView, WrittenFile

# ---------------------------------------------------------------------------- their options (the rest of each help: docs/cli.md)


@dataclass(frozen=True)
class CpuOptions:
    """What the CPU targets' writers read beside the general export options; on the command line
    `policies` is made of the PolicyFlags (the "Policy" section)."""

    SECTIONS: ClassVar = ("OpenVINO/qdq", "Policy")

    cpu: str = option(
        "any", "--cpu", "any (default: the overflow guard for CPUs without VNNI) or vnni.", choices=("any", "vnni"),
        evaluate="The CPU the file is for, as qtool export --cpu [default: any].")
    weights_7bit: str | None = option(
        None, "--weights-7bit", "The overflow guard: auto (default), 7-bit weights on the first/all layers, none.",
        choices=("auto", "first", "all", "none"), evaluate="The overflow guard, as qtool export --weights-7bit [default: auto].")
    ignored_patterns: bool = option(
        True, "--no-ignored-patterns", "Also quantize NNCF's ignored patterns (SE gates, attention output, RoPE).",
        negated=True, evaluate="Also quantize NNCF's ignored patterns, as qtool export.")
    # the policy of every quantizer (qtool.quantizers.policy; None: the defaults): in Python one
    # Policies, on the command line made of the PolicyFlags
    policies: policy.Policies | None = None

    def __post_init__(self):
        _check_choices(self)

    @classmethod
    def build(cls, given: dict) -> CpuOptions:
        """From the keywords of `given` that are its fields or policy flags (taken out of it)."""
        flags = PolicyFlags(**{k: given.pop(k) for k in list(given) if k in declared_options(PolicyFlags)})
        own = cls(**{k: given.pop(k) for k in list(given) if k in declared_options(cls) or k == "policies"})
        if flags.given():
            if own.policies is not None:
                raise UsageError("give {policies} or the policy options, not both", policies=Opt("policies"))
            own = replace(own, policies=flags.policies())
        return own

    @classmethod
    def sections(cls) -> dict[str, type]:
        return dict(zip(cls.SECTIONS, (cls, PolicyFlags)))

    def own_methods(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class PolicyFlags:
    """The options that make the Policies of the CPU targets (qtool.quantizers.policy.from_options)."""

    SECTION: ClassVar = "Policy"

    weight_bits: int | None = option(None, "--weight-bits", "Weight bits (default 8; 4: INT4 weights, opset 21 in QDQ).",
                                     bounds=(2, 8))
    activation_bits: int | None = option(
        None, "--activation-bits", "Activation bits (default 8; QDQ: 8 or 16, which needs opset 21).", bounds=(2, 16))
    scale_kind: str | None = option(
        None, "--scale-kind", "Float scales (default) or powers of two (rounded up), for accelerators that shift.",
        choices=("float", "pow2"))
    activations: str | None = option(
        None, "--activations", "Activation grids: symmetric, asymmetric (u8, [min, max]) or auto (the finer per tensor).",
        choices=("symmetric", "asymmetric", "auto"))
    rounding: str | None = option(
        None, "--rounding", "Weight rounding (default half-even, as the runtimes round activations).",
        choices=("half-even", "half-up", "half-down", "half-away", "toward-zero", "up", "down"))
    policy: Path | None = option(
        None, "--policy", "JSON or TOML rules setting matching quantizers' policies.", path=True)

    def __post_init__(self):
        _check_choices(self)
        if self.policy is not None:
            object.__setattr__(self, "policy", Path(self.policy))
        for key, o in declared_options(PolicyFlags).items():
            value = getattr(self, key)
            if o.bounds and value is not None and not o.bounds[0] <= value <= o.bounds[1]:
                raise QtoolError("{option} is not in the range {low}<=x<={high}", option=Opt(key, value), low=o.bounds[0],
                                 high=o.bounds[1])

    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def policies(self) -> policy.Policies:
        """The Policies these flags choose (the rules file read now)."""
        rules = policy.load_rules(Path(self.policy)) if self.policy is not None else None
        return policy.from_options(self.weight_bits, self.activation_bits, self.scale_kind, self.rounding, rules, self.activations)


# ops that move values without computing new ones, beside the shape ops: NNCF's quantize-agnostic operations
# (openvinotoolkit/nncf src/nncf/onnx/graph/metatypes/groups.py QUANTIZE_AGNOSTIC_OPERATIONS) that read one data
# input (the rest indices or shapes) and write values of it. A CRNN's unrolled BiLSTM Gathers each time step of
# one sequence: one quantizer on the sequence (OpenVINO gathers u8) instead of one per step (a single Gather, a
# class token's, keeps its quantizer: placement.moves). Pad where it copies values (reflect, edge: Silero VAD's
# STFT pads its input so; OpenVINO pads the u8 codes) or pads zeros, which lie on every grid (M-LSD's explicit pads
# before its strided Convs), not another constant (it need not lie on the grid: placement.moves); not ReduceMax
# (qtool.targets.openvino moves its quantizer up with the output's range).
MOVED_ONLY = frozenset({"MaxPool", "GlobalMaxPool", "Gather", "GatherElements", "GatherND", "Tile", "Expand", "DepthToSpace",
                        "SpaceToDepth", "Dropout", "Pad"})

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
    parts_need_every_reader=True,
    lone_sums_float=True,
    # per tensor the lowest histogram quantization error of entropy, percentile and mse: on the
    # real PP-OCR/MTCNN/YOLO models it matches or beats NNCF's defaults (bench/fidelity.py)
    default_method="auto",
)


def _int8_deconvolution(m, n) -> bool:
    """A ConvTranspose that OpenVINO's CPU plugin runs in int8, which it does only on u8/s8 input without a zero
    point (its Convolution node alone takes one): openvinotoolkit/openvino src/plugins/intel_cpu/src/nodes/deconv.cpp
    canBeExecutedInInt8 (constant weights, 3-5D, kernel >= stride, a stride above 3 only grouped, a grouped one's
    channels in blocks of 16 (AVX-512; 8 on AVX2), a depthwise one on u8 alone; on CPUs without AVX-512 not when
    IC^2 x the output's spatial size passes 2^26, which this does not check) and src/plugins/intel_cpu/src/graph_optimizer.cpp
    FuseConvolutionAndZeroPoints. With an asymmetric input LORE's table detector ran its last 384x384 upsampling in
    f32 and fused no FakeQuantize after it (317 of 1031 ms); one the plugin cannot run in int8 goes slower with a
    symmetric input than with an asymmetric one (spindle_eeg's stride-5 ConvTransposes: 15 -> 137 ms)."""
    if n.op_type != "ConvTranspose" or len(n.input) < 2 or n.input[1] not in m.constants:
        return False
    dims = list(m.constants[n.input[1]].dims)  # [C_in, C_out / group, k...]
    kernel = [int(k) for k in G.attr(n, "kernel_shape", dims[2:])]
    strides = [int(s) for s in G.attr(n, "strides", [1] * len(kernel))]
    group = int(G.attr(n, "group", 1))
    if not 3 <= len(dims) <= 5 or len(strides) != len(kernel) or any(k < s for k, s in zip(kernel, strides)):
        return False
    if group == 1:
        return max(strides, default=1) <= 3
    depthwise = dims[1] == 1 and dims[0] == group
    return not depthwise and dims[0] % 16 == 0 and dims[1] * group % 16 == 0


# OpenVINO's: its attention kernel takes the context's Transpose only without a FakeQuantize between them
# (MiniLM-L3: 6 runtime Transposes -> 3, as NNCF's file; docs/benchmarks.md#guard-cost); its CPU plugin runs
# an LSTM in int8 (qtool.quantizers.placement.recurrent); it fuses no FakeQuantize into a scatter (its
# ScatterUpdate/ScatterElementsUpdate/ScatterNDUpdate nodes take no fused post-ops), so a FakeQuantize on a
# scatter's output before an Add ran alone in f32, and the Add in f32 anyway (a graph net's 31 scatter-adds:
# 13% of its latency; NNCF's file has none there); it runs a ConvTranspose in int8 only on a grid without a zero
# point (_int8_deconvolution: such an input keeps a symmetric grid under --activations auto)
SCATTERS = frozenset({"ScatterElements", "ScatterND", "Scatter"})
# OpenVINO runs no Max or Min in int8: its low precision transformations have none for Maximum/Minimum (their list:
# openvinotoolkit/openvino docs/articles_en/documentation/openvino-extensibility/openvino-plugin-library/advanced-guides/
# low-precision-transformations/step3-main.rst), so the CPU plugin dequantizes both inputs and runs the Max in f32 with its
# output's FakeQuantize as a post-op: the quantizers only round. A Keras Maximum of 12 Dense outputs (thai_deepcut, an
# 11-Max chain): 22 FakeQuantizes, 39.6 dB in OpenVINO's run against 44.8 with the chain float (NNCF's transformer 40.4)
ELEMENTWISE_INT8 = ELEMENTWISE - {"Max", "Min"}
# A MatMul's inputs keep the grid `auto` chose: with a constant weight OpenVINO runs it in int8 on a zero point too (a u8
# FullyConnected, its zero point subtracted); one of two computed tensors runs f32 on a zero point, but made symmetric
# PP-OCRv6 rec's two ran int8 no faster and 0.97 dB lower (bench/openvino_quirks.py case 16; docs/benchmarks.md#mm26)
OPENVINO = replace(CPU, name="openvino", elementwise=ELEMENTWISE_INT8, fused_attention_context=True, int8_lstm=True, transposed_scale_shift=True,
                   unfused_sources=SCATTERS, zero_point_free=_int8_deconvolution, stretched_tails=True)
# onnxruntime's: its QLinearConv takes one input scale and zero point (onnx docs/Operators.md QLinearConv: x_scale and
# x_zero_point are scalars), so a depthwise Conv's input quantized per channel either stays a float Conv (int8 grid:
# its QDQ fusion leaves it) or, on a uint8 grid, is fused and fails at run time ("QLinearConv : input zero point must
# be a scalar": DeepFilterNet3's ERB decoder): the qdq file quantizes it per tensor, as onnxruntime's quantize_static does.
# It runs a Max or Min in float between its inputs' DequantizeLinear and its output's QuantizeLinear: their quantizers share
# one grid, so none rounds again (thai_deepcut's 11-Max chain, onnxruntime's run: 35.9 -> 39.0 dB, docs/benchmarks.md#lead27)
QDQ = replace(CPU, name="qdq", depthwise_per_channel=False, extremum_shares_quantized_inputs=True)
PLACEMENT_RULES = {"openvino": OPENVINO, "qdq": QDQ}  # by target; the others place with CPU


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
    plan = prepared.plan
    for site in plan.weights:  # in the file now: GPTQ's grid points and float weights (BERT-large's 0.4 GB) go before it is checked and written
        site.values = site.unrounded = None
    data, more = G.finish(model, loaded.proto)
    summary = {**plan.summary(), **({"opset": G.default_opset(model)} if opset else {}), **({"cpu": prepared.cpu} if prepared.cpu else {}),
               "fp32_layer_names": sorted(plan.fp32_layers), "bias_corrected_layers": corrected}
    if prepared.smoothing is not None:
        summary["smooth_quant"] = prepared.smoothing.summary
    return WrittenFile(data, prepared.warnings + bc_warnings + list(rounding_warnings) + more, summary)


def cpu_plan(model, cal, options: ExportOptions, *, float_types: tuple[int, ...], overflow_remedy: str | None, more_excluded=(),
             smoothing=None, rules: Rules | None = None, round_weights: bool = False):
    """The placement of the OpenVINO and QDQ exports (`model` with unique node names) with the export
    `options` (and `more_excluded` nodes kept FP32): NNCF's CPU rules, the thresholds those targets use
    (calibration.Calibration.for_target), the quantizers' policies (default: qtool.quantizers.policy.Policies())
    and the target's remedy for layers whose int8 pair sums can saturate on CPUs without VNNI
    (placement.place, qtool.quantizers.overflow). `smoothing` (smoothquant.Smoothing, `cal` its
    calibration): the smoothed activations take their exact max |x| as threshold, on every grid.
    `rules`: the placement's (default: the target's, PLACEMENT_RULES). `round_weights`: the int8 linear
    layers whose input's X^T X the calibration holds get GPTQ's weight codes (qtool.quantizers.gptq)."""
    method, own = options.method, options.group(CpuOptions)
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
    if rules.stretched_tails and cal.method_for(CPU, method) != "auto":  # a method the user chose: its thresholds as searched
        rules = replace(rules, stretched_tails=False)
    records = {t.name: t for t in cal.tensors}
    plan = placement.place(model, records, rules=rules, thresholds=thresholds, choices=choices,
                           overflow_remedy=overflow_remedy,
                           float_types=float_types,
                           policies=own.policies if own.policies is not None else policy.Policies(),
                           recompute=recompute)
    if round_weights:
        plan.gptq_layers = gptq.apply(model, plan, records)
    return plan


def prepare(model, cal, warnings: list[str], options: ExportOptions, *, float_types: tuple[int, ...], overflow_remedy: str) -> Prepared:
    """A CPU target's preparation of `model` (its copy, opset raised and node names unique;
    `warnings` so far) with the export `options`: SmoothQuant on the int8 layers placed without the
    overflow guard (which then decides on the smoothed model), and the placement (`cpu_plan`). cpu
    "vnni": for CPUs whose int8 kernels accumulate in int32, no overflow guard (unless weights_7bit
    first/all asks for 7-bit weights)."""
    own = options.group(CpuOptions)
    cpu = own.cpu
    if cpu == "vnni" and own.weights_7bit in (None, "auto"):
        overflow_remedy = None

    # SmoothQuant's layers: those reading an activation quantizer in NNCF's CPU placement, without the guard (OpenVINO's
    # would add attention's output projection, below the context's Reshape: smoothing it cost ViT-S 1.2 dB, bench/guard_cost.py)
    cal, smoothing, sq_warnings = smooth(model, cal, options.smooth_quant, lambda m, c: cpu_plan(
        m, c, options, float_types=float_types, overflow_remedy=None, rules=CPU), beyond=True)

    def place(more_excluded=()):
        return cpu_plan(model, cal, options, float_types=float_types, overflow_remedy=overflow_remedy,
                        more_excluded=more_excluded, smoothing=smoothing, round_weights=True)

    plan = place()
    return Prepared(model, plan, list(warnings) + sq_warnings + list(plan.warnings), place, cal if smoothing else None, smoothing,
                    cpu=cpu)


def report_view(prepare, title: str, loaded, cal, options: ExportOptions):
    """qtool.targets.ReportView of a CPU target's export with these options (`prepare`: its writer's)."""
    method = options.method
    prepared = prepare(loaded, cal, options)
    used = prepared.cal if prepared.cal is not None else cal
    return ReportView(title, prepared.plan, used, used.method_for(CPU, method), used.for_target(CPU, method), prepared.smoothing)
