"""What each command returns: one frozen dataclass per command (what it wrote, what it measured,
what it kept FP32 and why, its warnings, a check that failed), typed, with `to_json()`: the
document `--json` prints (qtool.JSON_SCHEMA its version). Data only: the command line words them
as text (qtool.cli); nothing here formats text for people."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import JSON_SCHEMA
from .checks import evaluation as _evaluation
from .errors import QtoolError


def _document(command: str, body: dict) -> dict:
    return {"schema": JSON_SCHEMA, "command": command, **body}


@dataclass(frozen=True)
class CalibrateResult:
    """`qtool calibrate`: the calibration file written (and a target's file beside it)."""

    model: str  # the calibrated model, an absolute path
    outputs: dict[str, str]  # what was written: "calibration" (and a target's file beside it) -> its path
    tensors: int  # activation tensors calibrated
    inputs: int  # inputs read: images, data files, or runs of a file of samples
    samples: int  # samples those inputs held
    skipped: int  # unreadable images skipped (--on-bad-image skip)
    batch_size: int
    method: str  # the threshold method the file records
    seconds: float
    warnings: tuple[str, ...] = ()
    images: int | None = None  # with images: the images the samples come from
    data_file: str | None = None  # with one file of samples: that file
    target_facts: dict = field(default_factory=dict)  # what a target's file beside it adds (e.g. its header, the build command)
    target_lines: tuple[str, ...] = ()  # the target's own words on that file

    def to_json(self) -> dict:
        doc = _document("calibrate", {
            "model": self.model, "outputs": dict(self.outputs), "tensors": self.tensors, "inputs": self.inputs,
            "samples": self.samples, "skipped": self.skipped, "batch_size": self.batch_size, "method": self.method,
            "seconds": round(self.seconds, 3), "warnings": list(self.warnings),
        })
        if self.images is not None:
            doc["images"] = self.images
        elif self.data_file is not None:
            doc["data_file"] = self.data_file
        doc.update(self.target_facts)
        return doc


@dataclass(frozen=True)
class ExportResult:
    """`qtool export`: the file written for a target, what its writer placed and kept FP32 and why."""

    target: str
    model: str  # the calibrated model, an absolute path
    calibration: str  # the calibration file read
    output: str  # the file written
    seconds: float
    warnings: tuple[str, ...] = ()
    written: dict = field(default_factory=dict)  # what the target's writer says of the file: quantizers, layers, its options
    kept_fp32: tuple[str, ...] | None = None  # --keep-fp32/--max-drop: the quantized tensors whose layers were kept FP32
    budget: dict | None = None  # --max-drop: required, reached, trials, latency_ms
    resolved: dict = field(default_factory=dict)  # what the target resolved of the options (e.g. where a version came from)
    build: str | None = None  # the command that builds an engine from the file, where the target has one
    target_lines: tuple[str, ...] = ()  # the target's own words on its file (a plug-in words its summary, as its help)

    @property
    def fp32_layers(self) -> list[str]:
        """The layers the file leaves in FP32."""
        return list(self.written.get("fp32_layer_names", []))

    @property
    def fp32_reasons(self) -> dict[str, str]:
        """Layer -> why the target kept it FP32 by default (its rules, estimates)."""
        return dict(self.written.get("default_exclusions", {}))

    @property
    def overflow_fix(self) -> dict | None:
        """The overflow guard's remedies: its mode and, per layer, the remedy and why."""
        return self.written.get("overflow_fix")

    def to_json(self) -> dict:
        doc = _document("export", {
            "target": self.target, "model": self.model, "calibration": self.calibration, "outputs": {self.target: self.output},
            "seconds": round(self.seconds, 3), "warnings": list(self.warnings), **self.written,
        })
        if self.kept_fp32 is not None:
            doc["kept_fp32"] = list(self.kept_fp32)
        if self.budget is not None:
            doc["budget"] = self.budget
        doc.update(self.resolved)
        if self.build is not None:
            doc["build"] = self.build
        return doc


@dataclass(frozen=True)
class EvaluateResult:
    """`qtool evaluate`: a target's int8 model against FP32 on held-out inputs, and the --fail-below verdict."""

    evaluation: _evaluation.Evaluation  # per output (and per quantized tensor, per runtime) numbers
    model: str  # the FP32 model compared with, an absolute path
    model_sha256: str
    calibration: str | None  # the calibration file read (None: an exported file evaluated without one)
    inputs: int  # inputs read: images, data files, or runs of a file of samples
    input_kind: str  # "images", "data files", "samples" (of data_file, one each) or "runs" (of data_file, a fixed batch each)
    seconds: float
    data_file: str | None = None  # the file of samples, for "samples" and "runs"
    file: str | None = None  # an exported file evaluated as it is, an absolute path
    file_sha256: str | None = None
    provenance: dict | None = None  # what that file records of how it was made (qtool.provenance)
    fail_below: float | None = None
    failure: QtoolError | None = None  # an output below fail_below (the command line exits 1 after the results)
    reference: dict | None = None  # a model onnxruntime quantized dynamically or shipped with Q/DQ pairs: the reference is it as given (commands.evaluate.evaluated)

    @property
    def passed(self) -> bool | None:
        return None if self.fail_below is None else self.failure is None

    @property
    def warnings(self) -> list[str]:
        return self.evaluation.warnings

    def to_json(self) -> dict:
        if self.file is not None:
            what = {"file": self.file, "file_sha256": self.file_sha256, "model": self.model, "model_sha256": self.model_sha256,
                    "calibration": self.calibration, "provenance": self.provenance}
        else:
            what = {"model": self.model, "model_sha256": self.model_sha256, "calibration": self.calibration}
            if self.reference is not None:
                what["reference"] = self.reference
        return _document("evaluate", {
            **what, "inputs": self.inputs, **_evaluation.to_json(self.evaluation), "fail_below": self.fail_below,
            "passed": self.passed, "seconds": round(self.seconds, 3), "warnings": list(self.warnings),
        })


@dataclass(frozen=True)
class InspectResult:
    """`qtool inspect`: what a file holds, and a check that failed. One of three kinds of answer:
    a calibration or range file (header, tensors, with a model its coverage), an ONNX model checked
    against a target's rules (`check`), or each quantizer's policy (quantizers)."""

    file: str
    kind: str  # "calibration", a range file kind (as its target names it), a checked model's kind ("onnx") or "policies"
    kind_name: str = ""  # what that kind of file is called
    header: dict = field(default_factory=dict)  # a calibration or range file's header
    tensors: tuple[dict, ...] = ()  # its tensors, sorted by name: name, amax and the kind's own fields (NaN/inf as they are)
    columns: tuple[str, ...] = ()  # the fields of `tensors` that say what the kind holds, in table order
    model: str | None = None  # the model the file records (a calibration file) or was given (coverage), absolute; "policies": as recorded
    coverage: dict | None = None  # with a model: which of its activation tensors the file gives a usable range
    unusable: tuple[str, ...] | None = None  # a range file's tensors with a NaN, infinite, zero or negative scale
    check: dict | None = None  # a model checked against a target's rules: the target's document (version, violations, ...)
    quantizers: tuple[dict, ...] = ()  # "policies": kind, tensor, read_by and the policy's fields
    policies: tuple[str, ...] = ()  # "policies": each quantizer's policy in short (Policy.describe)
    warnings: tuple[str, ...] = ()
    target_lines: tuple[str, ...] = ()  # a target's own words on its file (a range file's header decoded, a check's violations)
    failure: QtoolError | None = None  # a missing range, an unusable scale, a broken rule

    def to_json(self) -> dict:
        doc = _document("inspect", {"file": self.file, "kind": self.kind})
        if self.check is not None:
            doc.update(self.check)
        elif self.kind == "policies":
            doc.update(quantizers=list(self.quantizers), warnings=list(self.warnings))
        else:
            doc["header"] = self.header
            if self.model is not None:
                doc["model"] = self.model
            doc["tensors"] = [{k: _finite(v) if isinstance(v, float) else v for k, v in t.items()} for t in self.tensors]
            if self.coverage is not None:
                doc["coverage"] = self.coverage
            if self.unusable is not None:
                doc["unusable"] = list(self.unusable)
        return doc


def _finite(value: float) -> float | None:
    """JSON-safe float: None for NaN/inf (JSON has neither)."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class ReportResult:
    """`qtool report`: the HTML page written of a calibration as one target's export uses it."""

    calibration: str
    evaluation: str | None  # the qtool evaluate --json file read
    target: str
    target_from: str  # why that target: given, recorded in the exported file, or the evaluation's
    output: str  # the page written
    tensors: int  # tensors the calibration holds
    quantized: int  # of those, quantized by the target's export
    bytes: int  # the page's size
    seconds: float

    def to_json(self) -> dict:
        return _document("report", {
            "calibration": self.calibration, "evaluation": self.evaluation, "target": self.target, "target_from": self.target_from,
            "outputs": {"report": self.output}, "tensors": self.tensors, "quantized": self.quantized, "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        })


@dataclass(frozen=True)
class MergeResult:
    """`qtool merge`: calibration files combined exactly into one."""

    inputs: tuple[str, ...]  # the files merged
    output: str  # the merged calibration file
    samples: int
    tensors: int
    seconds: float
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return _document("merge", {
            "inputs": list(self.inputs), "outputs": {"calibration": self.output}, "samples": self.samples, "tensors": self.tensors,
            "seconds": round(self.seconds, 3), "warnings": list(self.warnings),
        })


@dataclass(frozen=True)
class RecomputeResult:
    """`qtool recompute`: every threshold of a calibration file searched again from its histograms."""

    calibration: str  # the file read
    output: str  # the file written (the same one, rewritten, by default)
    tensors: int
    changed: int  # thresholds that changed
    method: str
    kl_variant: str
    seconds: float
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return _document("recompute", {
            "calibration": self.calibration, "outputs": {"calibration": self.output}, "tensors": self.tensors, "changed": self.changed,
            "method": self.method, "kl_variant": self.kl_variant, "seconds": round(self.seconds, 3), "warnings": list(self.warnings),
        })


Result = CalibrateResult | ExportResult | EvaluateResult | InspectResult | ReportResult | MergeResult | RecomputeResult
