"""What every step of the placement starts from and what several of them write: the user's
choices (`Choices`), the read-only inputs (`Inputs`: the indexed graph, the calibration records,
the thresholds, the target's rules and float types) and the report the steps add to (`Report`:
the linear layers left FP32, with why, and the warnings). Each step's own result is defined in
the step's module."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...calibration import Threshold, decide
from ...model import graph as G
from ...model import prequantized
from ..rules import Rules


@dataclass(frozen=True)
class Choices:
    """The user's choices the placement follows (the export options of the same names)."""

    exclude: Sequence[str] = ()  # nodes and tensors kept FP32
    include: Sequence[str] = ()  # nodes the rules' default exclusions or ignored patterns would keep FP32, quantized anyway
    ignored_patterns: bool = True  # False turns NNCF's ignored patterns off
    weights_7bit: str | None = None  # one of placement.WEIGHTS_7BIT: which weights get 7-bit codes (None: auto, the overflow guard)


class Inputs:
    """What the steps read and none changes: the graph `m` (whose nodes have unique names), the
    calibration records {tensor: TensorRecord}, the amax per tensor (given, or the records' own on
    the rules' grid with the rules' clipping fallback), the target's rules and the element types it
    can quantize."""

    def __init__(self, proto, records: dict, rules: Rules, float_types: tuple[int, ...],
                 thresholds: dict[str, Threshold] | None):
        self.m = G.Index(proto)
        self.records = records
        self.thresholds = thresholds if thresholds is not None else {
            name: decide(rec, signed=rules.signed_only, fallback=rules.clip_fallback) for name, rec in records.items()}
        self.rules = rules
        self.float_types = float_types

    @functools.cached_property
    def own(self) -> prequantized.OwnQuantizers:
        """What the model's own QuantizeLinear/DequantizeLinear pairs quantize already (a Q/DQ model shipped quantized)."""
        return prequantized.own_quantizers(self.m)

    @functools.cached_property
    def constant_dims(self) -> dict[str, list[int]]:
        return {name: list(t.dims) for name, t in self.m.constants.items()}

    def quantizable_act(self, t: str) -> bool:
        """`t` carries data (depends on the input, not a shape) of a type the target quantizes."""
        return self.m.is_data(t) and self.m.types.get(t) in self.float_types


@dataclass
class Report:
    """What the steps tell beside the quantizers, in the order they find it."""

    fp32: dict[str, str] = field(default_factory=dict)  # linear node -> why it stays FP32
    warnings: list[str] = field(default_factory=list)
