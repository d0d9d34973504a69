"""The Python API: what each command does, as functions that never print and never exit.

    cal = qtool.calibrate("model.onnx", images="imgs/", size=(320, 320), limit=200)
    cal = qtool.calibrate(proto_or_path, data=loader)      # any iterable of {input name: ndarray}
    cal.save("model.calib.json"); cal = qtool.Calibration.load("model.calib.json")
    cal2 = cal.recompute("percentile:99.99"); merged = qtool.merge([cal_a, cal_b])
    onnx_bytes = qtool.export("model.onnx", cal, target="openvino", path="model.openvino.onnx")
    result = qtool.evaluate("model.onnx", cal, data=loader)

Inputs in memory follow Polygraphy's data-loader convention: an iterable of dicts mapping input
names to numpy arrays, batch axis first (a bare array is taken for a single-input model); each item
is one inference. A torch DataLoader works through a generator: `({"input": x.numpy()} for x, _ in
loader)`. User errors raise qtool.QtoolError (one line: what is wrong and what to do); warnings go
to the "qtool" logger and to the result objects (`Calibration.warnings`, `Evaluation.warnings`,
`export(...)` returns bytes and logs). The command line is this API plus parsing and printing, and
both give byte-identical files for the same inputs.

Each command is also one function over files (qtool.commands), taking keywords named like its
flags and returning its result, a frozen dataclass of qtool.results (CalibrateResult,
ExportResult, EvaluateResult, InspectResult, ReportResult, MergeResult, RecomputeResult: what it
wrote, what it measured, what it kept FP32 and why, its warnings, a failed check as `failure`;
`to_json()` is the document `--json` prints): calibrate_files, export_file, evaluate_files,
inspect_file, report_file, merge_files, recompute_file. The command line calls each. Every function here builds its command's options
object (qtool.options: checked where it is built, an unknown keyword refused by name) and hands it
down. A QtoolError names options by key (qtool.errors), worded as keywords here (str(error)) and as
flags on the command line.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import onnx

from . import JSON_SCHEMA, calibration, model, options, provenance, targets
from .calibration import Calibration
from .checks import evaluation as _evaluate
from .commandinputs import check_model, held_out_runs
from .commands import calibrate as _calibrate
from .commands import evaluate as _evaluate_files
from .commands import export as _export
from .commands import inspect as _inspect
from .commands import merge as _merge
from .commands import progress_bar
from .commands import recompute as _recompute
from .commands import report as _report_file
from .errors import Opt, QtoolError
from .feeds import data as _data
from .fileio import check_output_path, write_atomic
from .results import CalibrateResult, EvaluateResult, ExportResult, InspectResult, MergeResult, RecomputeResult, ReportResult
from .statistics import thresholds
from .targets import TARGETS, tensorrt
from .targets.cpu import PolicyFlags

log = logging.getLogger("qtool")

# What the command line builds its options and help from (declared once, in the library).
EXPORT_GROUPS = targets.sections()  # --help section -> key -> Option
OPTIONS = targets.declared()  # export option key -> its flag, help and choices
COMMAND_OPTIONS = {command: options.command_options(command) for command in options.COMMANDS}  # a command's own: key -> Option
COMMAND_OPTIONS["calibrate"].update({k: o for cls in targets.calibrate_files().values() for k, o in options.declared_options(cls).items()})
COMMAND_OPTIONS["inspect"].update({k: o for cls in targets.inspect_checks().values() for k, o in options.declared_options(cls).items()})
CALIBRATE_FILES = tuple(k for cls in targets.calibrate_files().values() for k in options.declared_options(cls))  # calibrate's target files
INSPECT_HELP = [t.inspection().HELP for t in map(targets.get, TARGETS) if t.inspected]  # each target's section of inspect --help
runtimes = targets.runtimes
ranked = targets.ranked
METHODS = options.METHODS
DEFAULT_TARGET, DEFAULT_BATCH = options.DEFAULT_TARGET, options.DEFAULT_BATCH
KL_VARIANTS = thresholds.KL_VARIANTS
RESIZE_MODES = _data.RESIZE_MODES
IMAGE_KEYS = options.IMAGE_KEYS
TRT_CACHE_VERSION, TRT_LATEST_VERSION = tensorrt.CACHE_VERSION, tensorrt.LATEST_VERSION
format_db = _evaluate.format_db
from_json_number = _evaluate.from_json_number
__all__ = ["DEFAULT_BATCH", "JSON_SCHEMA", "CalibrateResult", "EvaluateResult", "ExportResult", "InspectResult", "MergeResult",
           "RecomputeResult", "ReportResult"]


def _loaded(model_or_path, external_data: bool = True, lazy: bool = False) -> model.LoadedModel:
    """A LoadedModel from a path (`lazy`: its weights left where they lie, model.load_model) or an in-memory
    ModelProto (its SHA-256: of its serialized bytes)."""
    if isinstance(model_or_path, onnx.ModelProto):
        if not model_or_path.HasField("graph") or not model_or_path.graph.node:
            raise QtoolError("the ModelProto has no graph nodes; give a complete ONNX model")
        bad = model.invalid_text(model_or_path)
        if bad is not None:
            raise QtoolError(f"the ModelProto's {bad} is not UTF-8 text; give a complete ONNX model")
        digest = hashlib.sha256(model_or_path.SerializeToString()).hexdigest()
        return model.as_float(model.LoadedModel(path=Path.cwd() / "in-memory.onnx", sha256=digest, proto=model_or_path),
                              "the ModelProto")
    if isinstance(model_or_path, (str, os.PathLike)):
        return model.load_float_model(model_or_path, external_data=external_data, lazy=lazy)
    raise QtoolError(f"model must be a path or an onnx.ModelProto, not {type(model_or_path).__name__}")


def _checked(model_or_path, cal: Calibration) -> model.LoadedModel:
    """The model, refused unless it is the one `cal` was made for (same SHA-256)."""
    loaded = _loaded(model_or_path)
    check_model(loaded, cal.source[0] if cal.source else None, cal.model_path, cal.model_sha256,
                "the ModelProto" if isinstance(model_or_path, onnx.ModelProto) else None)
    return loaded


def calibrate(model_or_path, *, progress: Callable[[int], None] | None = None, **keywords) -> Calibration:
    """Run the model on calibration inputs and return per-tensor histograms and thresholds, as
    `qtool calibrate` does, with its options as keywords (qtool.options.CalibrateOptions.build:
    images, data, limit, shard, on_bad_image, size, resize, scale, mean, std, bgr, layout,
    batch_size, bins, method, kl_variant). One source of inputs: `images` (a folder, for
    single-input image models; size=(h, w)/resize/scale/mean/std/bgr/layout preprocess them), or
    `data`: a folder of .npy/.npz files or an in-memory loader (see the module docstring).
    `progress(n)` is called after each batch with the number of inputs (images, data files or
    loader items) that batch finished: increments, to add up (4, 4, 4, ... for batches of 4), as
    tqdm's update(n) takes them."""
    built = options.CalibrateOptions.build(**keywords)
    loaded = _loaded(model_or_path, external_data=False, lazy=True)  # as `qtool calibrate` reads it
    cal, report = _calibrate.calibrated(loaded, built, progress)
    cal.warnings = list(report.warnings)
    for w in cal.warnings:
        log.warning(w)
    return cal


def recompute(cal: Calibration, method: str, kl_variant: str | None = None) -> Calibration:
    """New thresholds from the stored histograms, as `qtool recompute` does."""
    try:
        thresholds.parse_method(method)
    except ValueError as e:
        raise QtoolError("{method}: {why}", method=Opt("method"), why=str(e)) from None
    return cal.recompute(method, kl_variant)


def merge(cals: Iterable[Calibration]) -> Calibration:
    """Shards combined exactly, as `qtool merge` does."""
    cals = list(cals)
    if not cals:
        raise QtoolError("merge needs at least one calibration")
    return calibration.merge(cals)


def export(model_or_path, cal: Calibration, *, target: str, path: str | os.PathLike | None = None, **keywords) -> bytes:
    """The bytes of `target`'s file for this calibration (written atomically to `path` when given),
    as `qtool export` writes them (a model over 2 GiB: give `path`, its weights go to external data
    beside it, and the bytes are the .onnx file's). `keywords`: the export options the target reads
    (qtool.targets.options_for; each declared once with its command-line flag, help and
    choices: `python -c "import qtool.api as a; print(a.OPTIONS['fmt'].help)"`); `policies` is a
    qtool.quantizers.policy.Policies (or give the policy flags' keywords: weight_bits, ...), the
    others strings, booleans or lists of names as on the command line."""
    built = targets.options_for(target, **keywords)
    loaded = _checked(model_or_path, cal)
    result = provenance.exported(loaded, cal, built, path)  # the writer's file, with its provenance
    for w in result.warnings:
        log.warning(w)
    if path is not None:
        write_atomic(check_output_path(Path(path), inputs=()), result.data)
    if isinstance(result.data, model.writer.ModelFile) and result.data.external() and path is not None:
        return result.data.external_chunks(model.writer.data_path(path).name)[0]  # the .onnx file written
    return bytes(result.data)  # a big model's export that fits one file: that file


def evaluate(model_or_path, cal: Calibration, *, runtime: str | None = None, per_tensor: bool = False,
             progress: Callable[[int], None] | None = None, **keywords) -> _evaluate.Evaluation:
    """The int8 model of `target` (a keyword, one of qtool.targets.TARGETS, default qdq: its file as
    `export` builds it, with the export options that target reads) against FP32 on held-out inputs,
    as `qtool evaluate` does: the exact simulation of the file's arithmetic, the same on every CPU;
    with `runtime` (qtool.targets.runtimes(): openvino runs target openvino's file, onnxruntime
    qdq's and tensorrt's) also that runtime's int8 kernels on this CPU (Evaluation.runtime).
    per_tensor: also rank every quantizer (qtool.targets.ranked(): openvino and qdq; one model run
    over the inputs each). Inputs (keywords, as qtool evaluate's flags: qtool.options.EvaluateOptions):
    images (preprocessed as the calibration records, size/resize/scale/mean/std/bgr/layout overriding
    parts), a folder or file of .npy/.npz, or an in-memory loader as data; limit, batch_size."""
    loader = keywords.pop("data") if not isinstance(keywords.get("data"), (str, os.PathLike, type(None))) else None
    built = options.EvaluateOptions.build(targets.take_export(keywords), runtime=runtime, tensors=per_tensor, **keywords)
    _evaluate.check_request(built.target, runtime, per_tensor)
    options.exactly_one(built.images, built.data if loader is None else loader)
    loaded = _checked(model_or_path, cal)
    if loader is not None:
        specs = model.data_inputs(loaded.proto)
        items = list(loader)

        def runs():
            return _data.memory_runs(items[:built.limit] if built.limit else items, specs)
    else:
        _, runs = held_out_runs(loaded, cal, built.images, built.data, built.limit, built.batch_size, built.image)
    # a model onnxruntime quantized dynamically: against the model as given (qtool.commands.evaluate.evaluated)
    result, _ = _evaluate_files.evaluated(loaded, cal, runs, built.export, runtime=runtime, per_tensor=per_tensor,
                                          progress=progress_bar(progress))
    for w in result.warnings:
        log.warning(w)
    return result


# The commands over files (qtool.commands), with the command's options as keywords.


def calibrate_files(model_path, *, output=None, progress=None, **keywords) -> CalibrateResult:
    """`qtool calibrate`: the model at `model_path` calibrated on a folder of `images` or `data` files
    (the keywords as qtool.api.calibrate takes them) into `output` [default: <model stem>.calib.json
    here], and with a target's file keywords (COMMAND_OPTIONS["calibrate"]: trt_table, a TensorRT
    calibration cache for trt_version) that file too. `progress`: a callback(n) or tqdm bar."""
    files = [cls.build(keywords) for cls in targets.calibrate_files().values()]
    built = options.CalibrateOptions.build(**keywords)
    return _calibrate.run(model_path, built, output=output, files=files, progress=progress)


def export_file(model_path=None, *, target: str, calib=None, output=None, **keywords) -> ExportResult:
    """`qtool export`: the calibration file `calib` [default: the single *.calib.json here] of the
    model at `model_path` [default: the one it records] written for `target` to `output` [default: the
    model's stem + the target's suffix, here]. The keywords are export's flags (qtool.options: the
    export options, the policy flags with `policy` a rules file, and keep_fp32 N or max_drop BUDGET
    measured on held-out images or data)."""
    built, mixed = targets.export_request(target, **keywords)
    return _export.run(model_path, built, mixed, calib=calib, output=output, policy_file=keywords.get("policy"))


def evaluate_files(model_path, *, calib=None, reference=None, progress=None, **keywords) -> EvaluateResult:
    """`qtool evaluate`: `target`'s [default: DEFAULT_TARGET] int8 model of the calibration file `calib` [default: the single
    *.calib.json here] against FP32 on held-out `images` (preprocessed as the file records, each
    image keyword overriding its part) or `data`; the keywords are evaluate's flags
    (qtool.options.EvaluateOptions.build). `model_path` may instead be an exported file: one qtool
    wrote (its FP32 model found by the name and SHA-256 it records, beside it or here, or given as
    `reference`), or another Q/DQ or FakeQuantize model with its FP32 model as `reference`; the file
    is scored as it is. With `fail_below` DB, an output below it (with
    `runtime`, the worse of the simulation and the runtime's run) is the result's failure (its numbers are there too).
    `progress`: a tqdm bar or a callback(n) per model pass over the inputs."""
    named = keywords.get("target")  # None: an exported file's own target, else DEFAULT_TARGET
    export = targets.take_export(keywords)
    return _evaluate_files.run(model_path, options.EvaluateOptions.build(export, named_target=named, **keywords), calib=calib,
                               reference=reference, progress=progress)


def inspect_file(file, *, model=None, **keywords) -> InspectResult:
    """`qtool inspect`: what `file` holds, with `model` what of that model it covers; with a target's
    check keyword (INSPECT_HELP; `trt_version`: the TensorRT rules the Q/DQ model `file` breaks) that
    check; with the policy keywords (as export's: weight_bits, ..., policy) the policy of each
    quantizer; a missing range, an unusable scale or a broken rule is the result's failure."""
    flags = PolicyFlags(**{k: keywords.pop(k) for k in list(keywords) if k in options.declared_options(PolicyFlags)})
    return _inspect.run(file, model=model, policies=flags, **keywords)


report_file = _report_file.run
merge_files = _merge.run
recompute_file = _recompute.run
