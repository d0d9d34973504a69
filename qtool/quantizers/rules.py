"""Quantizer placement rules, as data (the way NNCF keeps its hardware setups in
openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py): one `Rules` table per target, kept
in the target's own module (qtool.targets) and applied by `qtool.quantizers.placement`. Where a target's rule
is not a list of ops (which input of a residual Add to quantize, which nodes stay FP32 by default,
the axis of a per-channel weight), the table holds a small function.

On every target a range no 8-bit grid represents (infinite, |x| >= 1e30, an additive mask) stays
float.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    name: str
    linear: frozenset[str]  # every input quantized: data per tensor, constant weights per channel
    elementwise: frozenset[str]  # both data inputs quantized (unless fused into an activation)
    residual_input: Callable | None  # (graph.Index, Add node) -> the input slot of a residual Add to quantize, None when not residual
    pooling: frozenset[str]  # the data input quantized
    pooling_needs_neighbour: bool  # ... only when the pool's output or input is quantized anyway
    pass_through: frozenset[str]  # the quantizer moves up through these (and Concat) when every reader wants it
    concat_shares_quantized_inputs: bool  # a Concat's output and its inputs quantized elsewhere share one range
    nncf_patterns: bool  # activations/normalisations OpenVINO fuses, LayerNorms float; NNCF's transformer preset on transformers
    ignored_patterns: bool  # NNCF's ignored patterns (SE gating, attention output, RoPE) stay FP32
    exclusions: Callable | None  # (graph.Index) -> {node: why} kept FP32 by default (--include overrides)
    weight_axis: Callable | None  # (node, slot, rank) -> the per-channel axis of a constant input, None per tensor (None: placement.sites.weight_axis)
    signed_only: bool  # activations on the signed grid even when never negative
    clip_fallback: bool  # a threshold clipping > MAX_CLIPPED of the values falls back to max |x|
    depthwise_per_channel: bool  # depthwise Conv inputs per channel (NNCF's CPU q8_a_ch)
    default_method: str | None = None  # threshold method when neither calibrate nor export chose one (None: the file's)
    # a quantizer stays below the Reshape of attention's context (MatMul of two activations -> Transpose -> Reshape):
    # OpenVINO fuses that Transpose into its attention kernel only without a FakeQuantize between them
    fused_attention_context: bool = False
    # LSTMs run in int8 on the runtime's terms (qtool.quantizers.placement.recurrent): OpenVINO's CPU plugin
    int8_lstm: bool = False
    # a linear layer's output read by a Transpose whose (Cast's) reader is an Add/Sub/Mul of a constant gets its
    # quantizer (placement.requests): OpenVINO's CPU plugin cannot fuse that scale-shift into the layer
    transposed_scale_shift: bool = False
    # an element-wise op's input that one of these ops writes (through pass-through ops) stays float: the runtime fuses
    # no quantizer into them, so it would run alone, in float, before an element-wise op that runs in float anyway
    # (placement.requests; OpenVINO's CPU plugin and its scatters)
    unfused_sources: frozenset[str] = frozenset()
    # a quantizer moves up through a part-selecting op (Slice, Split, Gather) only when every reader of its input
    # reads the moved quantizer (qtool.quantizers.placement.moves.PARTS): NNCF's CPU propagation
    parts_need_every_reader: bool = False
    # an element-wise Max or Min whose output is quantized shares its range with its inputs quantized (placement.moves):
    # a runtime that runs it in float between DequantizeLinear and QuantizeLinear then requantizes nothing
    extremum_shares_quantized_inputs: bool = False
    # an element-wise Add whose two quantizers serve it alone stays float, and a residual Add of a small step
    # (placement.moves.lone_sums)
    lone_sums_float: bool = False
    # (graph.Index, node) -> the runtime runs this op in int8, and only on an input grid without a zero point: under
    # `--activations auto` a tensor it reads (through pass-through ops) keeps a symmetric grid (placement.sites)
    zero_point_free: Callable | None = None
    # a range group's exported range stretched to its calibrated [min, max] where its calibration samples' typical peak
    # reaches the range, except on transformers (qtool.statistics.thresholds.stretches; placement.sites.attach_policies)
    stretched_tails: bool = False

    def forwards(self, op: str) -> bool:
        """A quantizer moves up through `op` (a standard-domain op) when every reader wants it:
        the pass-through ops, and Concat on every target."""
        return op in self.pass_through or op == "Concat"


# the op vocabulary the tables share
LINEAR = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})
POOLING = frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean", "Resize"})
SHAPE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Identity"})
