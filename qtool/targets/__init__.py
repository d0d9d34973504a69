"""Targets: one record per runtime qtool writes for (the registry), with what each declares: its
option group, the file calibrate may write for it, its inspect check. qtool.api, the commands and the
command line read them here: the export options of every target (`declared`, `sections`), built
from keywords and checked for a target (`options_for`, `export_request`).

A target (`Target`) names its option group (a frozen dataclass in its package declaring its fields
with qtool.options.option, with `build(given)`, `sections()` and `own_methods()`), its placement rules (a qtool.quantizers.rules.Rules table in its own module), the
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

Optionally a target names a file calibrate writes for it (`calibrate_file`: a class declaring its
options with qtool.options.option, with `path`, `checked()`, `write(...)`, `SECTION`, `OUTPUT`)
and its inspection module (`inspected`: KINDS, FILES, FILE, COLUMNS, HELP, `read`, `usable`,
`header_text`, `unusable_failure`, `onnx_hint`; CHECK, the class declaring the option with which
qtool inspect checks an ONNX model for it, with `checked(value)` and `check(file, value)`).

Nothing here imports a writer until it is asked for (`Target.module`, `Target.rules`), so reading
the registry is cheap. The layout of one target's package is in the README, "Adding a target".
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import Opt, QtoolError
from ..options import DEFAULT_TARGET, MIXED_KEYS, ExportOptions, MixedPrecision, Option, _choose, declared_options, defaults, method, misplaced, unread

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
    float_types: tuple[int, ...]  # element types it quantizes (onnx.TensorProto; qdq and tensorrt: FLOAT16 as its float32 twin, qtool.model.float16)
    runtime: str  # the runtime that runs its file on this CPU: "openvino" or "onnxruntime"
    any_subset: bool  # its writer builds a model of any subset of its quantizers (prepare/quantized)
    suffix: str  # default output suffix (the writer's suffix(**options) may pick another)
    group_class: str  # "module:Class" of its option group (ExportOptions.own)
    calibrate_file: str | None = None  # "module:Class" of a file calibrate writes for it (options declared; `write`)
    inspected: str | None = None  # its inspection module: range files it reads, the model check it runs (qtool inspect)
    branches: bool = False  # its writer's placement runs inside If branches too (qtool.targets.branches)

    def module(self):
        """The writer module."""
        return importlib.import_module(self.writer)

    @property
    def rules(self):
        """Its placement rules (qtool.quantizers.rules.Rules)."""
        module, name = self.rules_table.split(":")
        return getattr(importlib.import_module(module), name)

    def inspection(self):
        """Its inspection module (qtool inspect: the range files it reads, the model check it runs)."""
        return importlib.import_module(self.inspected)

    @property
    def group(self) -> type:
        """Its option group (ExportOptions.own)."""
        return _resolve(self.group_class)

    def own_methods(self, options: ExportOptions) -> tuple[str, ...]:
        """Threshold methods its writer searches itself with these options."""
        return options.group(self.group).own_methods()

    @property
    def default_method(self) -> str | None:
        """The threshold method its export uses when neither calibrate nor export chose one."""
        return self.rules.default_method

    @property
    def options(self) -> frozenset[str]:
        """The export options it takes (keys of `declared()`, and its group's other fields, e.g. `policies`)."""
        return frozenset(k for k, o in declared().items() if self.name in o.readers) | set(defaults(self.group))

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


def _resolve(name: str):
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


_TRT = "qtool.targets.tensorrt.options:"
_REGISTRY = (
    Target("tensorrt", "qtool.targets.tensorrt", "qtool.targets.tensorrt.rules:TENSORRT", (FLOAT, FLOAT16), "onnxruntime", False,
           ".trt.onnx", _TRT + "TensorRTOptions", _TRT + "CalibrateCache", "qtool.targets.tensorrt.inspection"),
    Target("openvino", "qtool.targets.openvino", "qtool.targets.cpu:CPU", (FLOAT, FLOAT16), "openvino", True,
           ".openvino.onnx", "qtool.targets.cpu:CpuOptions", branches=True),
    Target("qdq", "qtool.targets.qdq", "qtool.targets.cpu:CPU", (FLOAT, FLOAT16), "onnxruntime", True,
           ".qdq.onnx", "qtool.targets.cpu:CpuOptions", branches=True),
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
    """The targets that take the export option `keyword` (sorted)."""
    return tuple(sorted(t.name for t in _REGISTRY if keyword in t.options))


def _groups() -> dict[type, tuple[str, ...]]:
    """Each option group -> the targets that read it, in registry order."""
    found: dict[type, tuple[str, ...]] = {}
    for t in _REGISTRY:
        found[t.group] = found.get(t.group, ()) + (t.name,)
    return found


@functools.cache
def sections() -> dict[str, dict[str, Option]]:
    """--help section -> key -> Option of every export option: the general ones, then each group's sections."""
    found = {ExportOptions.SECTION: {k: replace(o, readers=TARGETS) for k, o in declared_options(ExportOptions).items()}}
    for group, readers in _groups().items():
        for title, cls in group.sections().items():
            found[title] = {k: replace(o, readers=readers) for k, o in declared_options(cls, title).items()}
    return found


@functools.cache
def declared() -> dict[str, Option]:
    """key -> Option of every export option, section by section."""
    return {k: o for options in sections().values() for k, o in options.items()}


def check_name(target: str) -> None:
    _choose("target", target, TARGETS)


def options_for(target: str | None = DEFAULT_TARGET, **given) -> ExportOptions:
    """The export options of `target` from keywords as qtool.export takes them (None or an empty list:
    not given; a target None: DEFAULT_TARGET): the general ones, its group's (an option only another target reads: an error)."""
    target = DEFAULT_TARGET if target is None else target
    check_name(target)
    given = {k: v for k, v in given.items() if v is not None}
    own = None
    for group, readers in _groups().items():
        if target in readers:
            own = group.build(given)
        else:
            keys = defaults(group)
            for cls in group.sections().values():
                keys.update(defaults(cls))
            unread(given, keys, readers, target)
    general = set(declared_options(ExportOptions))
    unknown = sorted(set(given) - general)
    if unknown:
        raise QtoolError("{option} is not an export option", option=Opt(unknown[0]))
    options = ExportOptions(target, **given, own=own)
    method(options.method, own.own_methods())
    return options


def export_request(target: str | None, **given) -> tuple[ExportOptions, MixedPrecision]:
    """qtool export's options from its keywords: the export's, and the layers kept FP32 by measurement
    (for the targets that build any subset of their quantizers, `ranked()`). The target is required: an
    export is a file for one runtime."""
    if target is None:
        raise QtoolError("{target} is required: one of {targets}", target=Opt("target"), targets=", ".join(TARGETS))
    check_name(target)
    mixed = {k: given.pop(k) for k in MIXED_KEYS if given.get(k) is not None}
    for key in ("keep_fp32", "max_drop"):
        if mixed.get(key) and target not in ranked():
            raise misplaced(key, ranked(), target)
    export = options_for(target, **given)
    paths = {k: Path(v) for k, v in mixed.items() if k in ("images", "data")}
    return export, MixedPrecision(**{**mixed, **paths})


def take_export(given: dict) -> ExportOptions:
    """The export options built from the keywords of `given` that are export options (taken out of it)."""
    keys = set(declared()) | {"target"} | {k for t in _REGISTRY for k in defaults(t.group)}
    return options_for(**{k: given.pop(k) for k in list(given) if k in keys})


def calibrate_files() -> dict[str, type]:
    """Target -> the class of the file calibrate may write for it (its options declared as data)."""
    return {t.name: _resolve(t.calibrate_file) for t in _REGISTRY if t.calibrate_file}


def inspections() -> list:
    """The inspection modules of the targets that have one (module doc: `inspected`)."""
    return [t.inspection() for t in _REGISTRY if t.inspected]


def inspect_checks() -> dict[str, type]:
    """Target -> the class declaring the option with which qtool inspect checks a model for it."""
    return {t.name: t.inspection().CHECK for t in _REGISTRY if t.inspected}

