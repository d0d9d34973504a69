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
