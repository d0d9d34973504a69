"""One quantizer as placement decides it and every writer, the report and the evaluation read it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from . import grids
from .policy import SYMMETRIC, WEIGHTS, Policy, activation_params, seven_bit_codes, weight_params

ACTIVATION, WEIGHT = "activation", "weight"


@dataclass
class Range:
    amax: float
    unsigned: bool


@dataclass
class Quantizer:
    """One quantizer on `tensor`, read by `readers` (node name, input slot).

    Activation: the range `range` (shared over the tensors of `shared_with`), per tensor or per
    channel (axis 1 of a rank-`rank` tensor) when `channel_amax` is set; `low`/`high` the
    calibrated min and max for asymmetric policies. Weight: the constant `values` (an initializer
    or Constant output), per channel on `axis`, `headroom_bits` 1 for NNCF's 7-bit overflow fix
    (scale amax / 63 on the 8-bit grid), `floor` a smallest amax per channel (the overflow
    guard's pair bound, qtool.quantizers.overflow.pair_step), `unsigned_storage` to store it as
    uint8 with zero point 128 (the same values; onnxruntime's exact u8 x u8 kernels).
    `seven_bit_codes` (activations): the guard's input remedy, policy.seven_bit_codes.
    `channel_signs` (the guard's flipped input channels): an activation's values x on a channel of
    sign -1 (+-1, shaped to broadcast on `tensor`) become `flip_offset` - x before they are
    quantized (0 on a symmetric grid; input_low + input_high on an asymmetric one, which maps the
    range onto itself), and a weight's stored integers along axis 1 (its input channels) are
    multiplied by it, its layer's bias taking flip_offset x the flipped channels' weights: the
    layer computes the same, with other pairs of same-sign products. `flip_pads` (an asymmetric flip
    on a layer that pads its input with zeros, reading `tensor` directly): that layer's pads (ONNX
    order over the spatial axes), which the writer turns into an explicit zero Pad of `tensor` before
    the flip, so that a padded zero becomes flip_offset like every other 0 of a flipped channel, and
    takes off the layer. `unrounded`: a weight's float values where `values` holds the grid points
    GPTQ rounded them to (bias correction's mean error is the float weights' less these). `stated`:
    quantized by the model itself (a dynamically quantized model's whose own grids crush some input,
    placement.sites.model_grids): an int8 weight whose integers are the model's (no GPTQ), or an input
    its DynamicQuantizeLinear quantizes (no SmoothQuant on its layers)."""

    tensor: str
    kind: str  # ACTIVATION or WEIGHT
    elem_type: int
    readers: list[tuple[str, int]] = field(default_factory=list)
    shared_with: list[str] = field(default_factory=list)  # tensors in the same range group
    policy: Policy = SYMMETRIC
    range: Range | None = None
    low: float | None = None
    high: float | None = None
    channel_amax: np.ndarray | None = None
    rank: int | None = None
    values: np.ndarray | None = None
    axis: int | None = None
    headroom_bits: int = 0
    floor: np.ndarray | None = None
    unsigned_storage: bool = False
    seven_bit_codes: bool = False
    channel_signs: np.ndarray | None = None
    flip_offset: float = 0.0
    flip_pads: tuple[int, ...] | None = None
    unrounded: np.ndarray | None = None  # a weight's float values when `values` are grid points GPTQ chose (qtool.quantizers.gptq)
    stated: bool = False
    anchors: list[str] = field(default_factory=list)  # the group's tensors whose range is its range: a Max chain's end (else all)

    @classmethod
    def activation(cls, tensor: str, elem_type: int, rng: Range, readers: list[tuple[str, int]],
                   shared_with: list[str]) -> Quantizer:
        return cls(tensor, ACTIVATION, elem_type, readers, shared_with, SYMMETRIC, rng)

    @classmethod
    def weight(cls, tensor: str, elem_type: int, axis: int | None, headroom_bits: int, values: np.ndarray,
               readers: list[tuple[str, int]]) -> Quantizer:
        return cls(tensor, WEIGHT, elem_type, readers, policy=WEIGHTS, values=values, axis=axis, headroom_bits=headroom_bits)

    @property
    def is_weight(self) -> bool:
        return self.kind == WEIGHT

    def params(self) -> grids.QParams:
        if self.kind == WEIGHT:
            return weight_params(self.values, self.axis if self.policy.per_channel else None, self.policy, self.headroom_bits,
                                 self.floor)
        if self.channel_amax is None:
            params = activation_params(self.range.amax, self.range.unsigned, self.policy, self.low, self.high)
            return seven_bit_codes(params) if self.seven_bit_codes else params
        return activation_params(self.channel_amax, self.range.unsigned, replace(self.policy, symmetric=True), axis=1)
