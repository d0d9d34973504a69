"""Exporters: one module per target, each with `suffix(**options)` (default output suffix) and
`export(loaded, cal, **options) -> ExportResult`.

An exporter turns a calibration (and the model it was made for) into the bytes of one output
file; it never writes files itself and never modifies the model it is given.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

TARGETS = ("tensorrt", "openvino", "qdq")


@dataclass
class ExportResult:
    data: bytes
    warnings: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # target-specific facts for the JSON summary


def exporter(target: str):
    """The module implementing `target` (one of TARGETS)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}")
    return importlib.import_module(f"{__name__}.{target}")


def cpu_plan(model, cal, *, float_types: tuple[int, ...], overflow_remedy: str, exclude=(), include=(), weights_7bit=None,
             ignored_patterns: bool = True, policies=None, method: str | None = None):
    """The placement of the OpenVINO and QDQ exports (`model` with unique node names): NNCF's CPU
    rules, the thresholds those targets use (calibration.Calibration.for_target), the
    quantizers' policies (default: qtool.policy.Policies()) and the target's remedy for layers
    whose int8 pair sums can saturate on CPUs without VNNI (placement.place, qtool.overflow)."""
    from .. import placement, policy
    from ..rules import CPU

    return placement.place(model, {t.name: t for t in cal.tensors}, thresholds=cal.for_target(CPU, method),
                           exclude=list(exclude or ()), include=list(include or ()), weights_7bit=weights_7bit,
                           overflow_remedy=overflow_remedy,
                           ignored_patterns=ignored_patterns, float_types=float_types,
                           policies=policies if policies is not None else policy.Policies(),
                           recompute=policy.searcher(cal, cal.method_for(CPU, method)))
