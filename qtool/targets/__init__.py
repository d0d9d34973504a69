"""Targets: one record per runtime qtool writes for (the registry), and one declaration of every
export option (qtool.options), which qtool.api and the command line both read.

A target (`Target`) names its placement rules (a qtool.quantizers.rules.Rules table in its own module), the
float types it quantizes, the runtime that runs its file, whether its writer builds a model of any
subset of its quantizers (what evaluate --tensors, export --keep-fp32 and --max-drop need), the
export options it takes (qtool.options declares which target reads which), its writer module and its
default suffix. A writer module has `suffix(options)` and `export(loaded, cal, options) -> WrittenFile`
(`options`: a qtool.options.ExportOptions): it turns a calibration
(and the model it was made for) into the bytes of one file, never writes files itself and never
modifies the model it is given; and `report_view(loaded, cal, method=None, **options) -> ReportView`, what
qtool report shows of that export. Optionally `evaluation_options(options, runtime)`: the options,
checked, with which qtool.checks.evaluation builds the file it runs (default: as given), and whether
`runtime` (None: the simulation only) can run it; `export_options(options) -> (options, summary)`:
what qtool export writes with (defaults resolved) and what its summary says of them; `exported(loaded,
cal, options, summary, path, model_path) -> (summary, warnings, line)`: what export's summary and text add
once the file is written (e.g. the command that builds an engine from it).

Nothing here imports a writer until it is asked for (`Target.module`, `Target.rules`), so reading
the registry is cheap. The layout of one target's package is in the README, "Adding a target".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from .. import options
from ..options import ExportOptions

FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types (not imported here: the registry stays light)


@dataclass
class WrittenFile:
    """What a writer's `export` gives: the file's bytes, its warnings and what the export's --json says of it."""

    data: bytes
    warnings: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # target-specific facts for the JSON summary


@dataclass
class ReportView:
    """What qtool report shows of a target's export (a writer's `report_view(loaded, cal, method=...)`):
    its placement and the thresholds and scales the file holds."""

    title: str  # e.g. "QDQ model (onnxruntime)"
    plan: object  # placement.Plan
    cal: object  # the calibration the export reads (SmoothQuant: the smoothed tensors' records)
    method: str | None  # the threshold method the export searches with (None: the file's)
    thresholds: dict  # tensor -> calibration.Threshold the export starts from
    smoothing: object = None  # smoothquant.Smoothing, when SmoothQuant changed the model
    scales: dict | None = None  # tensor -> the per-tensor scale as the file holds it, on the int8 symmetric grid (None: the quantizers' own)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Target:
    name: str
    writer: str  # the module with suffix() and export()
    rules_table: str  # "module:NAME" of its qtool.quantizers.rules.Rules
    float_types: tuple[int, ...]  # element types it quantizes (onnx.TensorProto)
    runtime: str  # the runtime that runs its file on this CPU: "openvino" or "onnxruntime"
    any_subset: bool  # its writer builds a model of any subset of its quantizers (prepare/quantized)
    suffix: str  # default output suffix (the writer's suffix(**options) may pick another)
    description: str  # what its file is, in a few words (qtool evaluate --help)

    def module(self):
        """The writer module."""
        return importlib.import_module(self.writer)

    @property
    def rules(self):
        """Its placement rules (qtool.quantizers.rules.Rules)."""
        module, name = self.rules_table.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def default_method(self) -> str | None:
        """The threshold method its export uses when neither calibrate nor export chose one."""
        return self.rules.default_method

    @property
    def options(self) -> frozenset[str]:
        """The export options it takes (keys of OPTIONS; the CPU targets' also `policies`)."""
        return frozenset(k for k, o in OPTIONS.items() if self.name in o.readers) | (
            {"policies"} if self.name in options.CPU_TARGETS else set())

    def evaluation_options(self, options: ExportOptions, runtime: str | None = None) -> ExportOptions:
        """The export options with which qtool.checks.evaluation builds the file it runs (and `runtime` runs)."""
        check = getattr(self.module(), "evaluation_options", None)
        return check(options, runtime) if check is not None else options

    def export_options(self, options: ExportOptions) -> tuple[ExportOptions, dict]:
        """The options qtool export writes with, defaults resolved, and what its summary says of them."""
        resolve = getattr(self.module(), "export_options", None)
        return resolve(options) if resolve is not None else (options, {})

    def exported(self, loaded, cal, options: ExportOptions, summary: dict, path: str, model_path: str) -> tuple[dict, list[str], str | None]:
        """What export's summary, warnings and text add once the file is at `path` (`summary`: the export's)."""
        after = getattr(self.module(), "exported", None)
        return after(loaded, cal, options, summary, path, model_path) if after is not None else ({}, [], None)


_REGISTRY = (
    Target("tensorrt", "qtool.targets.tensorrt", "qtool.targets.tensorrt.rules:TENSORRT", (FLOAT,), "onnxruntime", False,
           ".trt.onnx", "its Q/DQ model, with the FP16 part"),
    Target("openvino", "qtool.targets.openvino", "qtool.targets.cpu:CPU", (FLOAT, FLOAT16), "openvino", True,
           ".openvino.onnx", "FakeQuantize"),
    Target("qdq", "qtool.targets.qdq", "qtool.targets.cpu:CPU", (FLOAT,), "onnxruntime", True,
           ".qdq.onnx", "QuantizeLinear/DequantizeLinear"),
)
TARGETS = tuple(t.name for t in _REGISTRY)


def names() -> tuple[str, ...]:
    return TARGETS


def get(name: str) -> Target:
    """The target called `name` (ValueError for an unknown name: callers say what to do)."""
    for t in _REGISTRY:
        if t.name == name:
            return t
    raise ValueError(f"unknown target {name!r}")


def exporter(name: str):
    """The writer module of target `name`."""
    return get(name).module()


def runtimes() -> dict[str, tuple[str, ...]]:
    """Runtime -> the targets whose files it runs (names sorted, as every list of targets in a message)."""
    found: dict[str, tuple[str, ...]] = {}
    for t in _REGISTRY:
        found[t.runtime] = tuple(sorted(found.get(t.runtime, ()) + (t.name,)))
    return dict(sorted(found.items()))


def ranked() -> tuple[str, ...]:
    """The targets whose writers build a model of any subset of their quantizers."""
    return tuple(sorted(t.name for t in _REGISTRY if t.any_subset))


def reading(keyword: str) -> tuple[str, ...]:
    """The targets that take the export option `keyword`."""
    return options.targets_reading(keyword)


OPTIONS = options.export_options()  # key -> qtool.options.Option of every export option
assert TARGETS == options.TARGETS, "qtool.options.TARGETS names the registry's targets, in its order"
