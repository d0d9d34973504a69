"""Exporters: one module per target, each with `suffix(**options)` (default output suffix) and
`export(loaded, cal, **options) -> ExportResult`.

An exporter turns a calibration (and the model it was made for) into the bytes of one output
file; it never writes files itself and never modifies the model it is given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

TARGETS = ("tensorrt", "openvino", "qdq")


@dataclass
class ExportResult:
    data: bytes
    warnings: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # target-specific facts for the JSON summary


@dataclass
class Prepared:
    """The model as a CPU target's export edits it before inserting quantizers (opset raised, node
    names unique, biases not yet corrected) and its plan: what export and qtool.evaluation share."""

    model: onnx.ModelProto
    plan: object  # placement.Plan
    warnings: list[str]
    place: Callable  # place(exclude) -> Plan: the same placement with more nodes kept FP32


def with_quantizers(prepared: Prepared, cal, plan, bias_correction: bool, apply: Callable) -> tuple[onnx.ModelProto, int, list[str]]:
    """A copy of the prepared model with `plan`'s quantizers (default: all), inserted by the
    target's `apply(model, namer, plan)`, and with bias_correction the bias shifts of its int8
    layers: (model, layers corrected, warnings)."""
    from .. import biascorrection
    from .. import graph as G

    plan = prepared.plan if plan is None else plan
    model = onnx.ModelProto()
    model.CopyFrom(prepared.model)
    namer = G.Namer(model)
    corrected, warnings = biascorrection.apply_to_export(model, namer, plan, cal, bias_correction)
    apply(model, namer, plan)
    return model, corrected, warnings


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
