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
flags and returning an Outcome (what `--json` prints, the text, a failed check): calibrate_files,
export_file, evaluate_files, inspect_file, report_file, merge_files, recompute_file. The command
line calls each; a QtoolError names options by key (qtool.errors), worded as keywords here
(str(error)) and as flags on the command line.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import onnx

from . import calibration, commands, model, targets
from .calibration import Calibration
from .checks import evaluation as _evaluate
from .commands import EXPORT_OPTIONS, calibrated, channels_text, progress_bar, shard_pair, size_pair
from .errors import Opt, QtoolError
from .feeds import data as _data
from .statistics import thresholds
from .targets import TARGETS, exporter

log = logging.getLogger("qtool")

# What the command line builds its options and help from (declared once, in the library).
OPTIONS = targets.OPTIONS  # export option keyword -> its flag, help and choices
POLICY_FLAGS = targets.POLICY_FLAGS
runtimes = targets.runtimes
METHODS = thresholds.METHODS + thresholds.SAMPLE_METHODS
KL_VARIANTS = thresholds.KL_VARIANTS
RESIZE_MODES = _data.RESIZE_MODES
TARGET_DESCRIPTIONS = {t: targets.get(t).description for t in TARGETS}
_LAZY = {"TRT_CACHE_VERSION": ("targets.tensorrt", "CACHE_VERSION"), "TRT_LATEST_VERSION": ("targets.tensorrt", "LATEST_VERSION"),
         "REPORT_TARGETS": ("checks.report", "TARGETS"), "REPORT_DEFAULT_TARGET": ("checks.report", "DEFAULT_TARGET"),
         "DEFAULT_BATCH": ("inputs", "DEFAULT_BATCH")}


def __getattr__(name: str):
    """The constants of modules that `import qtool.api` does not load until asked (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    where, attr = _LAZY[name]
    return getattr(importlib.import_module(f".{where}", __package__), attr)


def _loaded(model_or_path, external_data: bool = True) -> model.LoadedModel:
    """A LoadedModel from a path or an in-memory ModelProto (its SHA-256: of its serialized bytes)."""
    if isinstance(model_or_path, onnx.ModelProto):
        if not model_or_path.HasField("graph") or not model_or_path.graph.node:
            raise QtoolError("the ModelProto has no graph nodes; give a complete ONNX model")
        digest = hashlib.sha256(model_or_path.SerializeToString()).hexdigest()
        return model.LoadedModel(path=Path.cwd() / "in-memory.onnx", sha256=digest, proto=model_or_path)
    if isinstance(model_or_path, (str, os.PathLike)):
        return model.load_model(model_or_path, external_data=external_data)
    raise QtoolError(f"model must be a path or an onnx.ModelProto, not {type(model_or_path).__name__}")


def _checked(model_or_path, cal: Calibration) -> model.LoadedModel:
    """The model, refused unless it is the one `cal` was made for (same SHA-256)."""
    loaded = _loaded(model_or_path)
    if loaded.sha256 != cal.model_sha256:
        raise QtoolError("the model is not the one the calibration was made for (SHA-256 differs); calibrate it again")
    return loaded


def calibrate(model_or_path, *, images: str | os.PathLike | None = None, data=None, limit: int | None = None,
              shard: tuple[int, int] | str | None = None, on_bad_image: str = "fail", size=None, resize: str = "stretch",
              scale: float = 1 / 255, mean=None, std=None, bgr: bool = False, layout: str | None = None,
              batch_size: int | None = None, bins: int = 2048, method: str | None = None, kl_variant: str = "nvidia",
              progress: Callable[[int], None] | None = None) -> Calibration:
    """Run the model on calibration inputs and return per-tensor histograms and thresholds, as
    `qtool calibrate` does. One source of inputs: `images` (a folder, for single-input image models;
    size/resize/scale/mean/std/bgr/layout preprocess them), or `data`: a folder of .npy/.npz files or
    an in-memory loader (see the module docstring). `progress(n)` is called after each batch with
    the number of inputs (images, data files or loader items) that batch finished: increments, to
    add up (4, 4, 4, ... for batches of 4), as tqdm's update(n) takes them."""
    folder = data if isinstance(data, (str, os.PathLike)) else None
    loader = data if data is not None and folder is None else None
    options = None
    if images is not None:
        options = dict(size=size_pair(size), layout=layout, resize=resize, scale=float(scale), mean=channels_text(mean),
                       std=channels_text(std), bgr=bgr)
    loaded = _loaded(model_or_path, external_data=False)
    cal, report = calibrated(loaded, images=images, data_dir=folder, loader=loader, limit=limit, shard=shard_pair(shard),
                             on_bad_image=on_bad_image, batch_size=batch_size, image_options=options, bins=bins, method=method,
                             kl_variant=kl_variant, progress=progress_bar(progress))
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


def export(model_or_path, cal: Calibration, *, target: str, path: str | os.PathLike | None = None, **options) -> bytes:
    """The bytes of `target`'s file for this calibration (written atomically to `path` when given),
    as `qtool export` writes them (a model over 2 GiB: give `path`, its weights go to external data
    beside it, and the bytes are the .onnx file's). `options`: the keywords the target takes, EXPORT_OPTIONS[target]
    (qtool.targets.OPTIONS declares each once, with its command-line flag, help and choices:
    `python -c "import qtool.targets as t; print(t.OPTIONS['fmt'].help)"`); `policies` is a
    qtool.quantizers.policy.Policies, the others strings, booleans or lists of names as on the command line."""
    if target not in TARGETS:
        raise QtoolError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    unknown = sorted(set(options) - EXPORT_OPTIONS[target])
    if unknown:
        raise QtoolError(f"option {unknown[0]!r} does not apply to target {target!r} (it takes {', '.join(sorted(EXPORT_OPTIONS[target]))})")
    loaded = _checked(model_or_path, cal)
    result = exporter(target).export(loaded, cal, **options)
    for w in result.warnings:
        log.warning(w)
    if path is not None:
        from .fileio import check_output_path, write_atomic

        write_atomic(check_output_path(Path(path), inputs=()), result.data)
    if isinstance(result.data, model.weights.ModelFile) and result.data.external() and path is not None:
        return result.data.external_chunks(model.weights.data_path(path).name)[0]  # the .onnx file written
    return bytes(result.data)  # a big model's export that fits one file: that file


def evaluate(model_or_path, cal: Calibration, *, images: str | os.PathLike | None = None, data=None, limit: int | None = None,
             target: str = "qdq", runtime: str | None = None, per_tensor: bool = False,
             progress: Callable[[int], None] | None = None, **options) -> _evaluate.Evaluation:
    """The int8 model of `target` (one of qtool.targets.TARGETS: its file as `export` builds it, with
    the export `options` that target reads, EXPORT_OPTIONS) against FP32 on held-out inputs, as
    `qtool evaluate` does: the exact simulation of the file's arithmetic, the same on every CPU;
    with `runtime` (qtool.targets.runtimes(): openvino runs target openvino's file, onnxruntime
    qdq's and tensorrt's) also that runtime's int8 kernels on this CPU (Evaluation.runtime).
    per_tensor: also rank every quantizer (qtool.targets.ranked(): openvino and qdq; one model run
    over the inputs each). Inputs: images (preprocessed as the calibration
    records), a folder of .npy/.npz, or an in-memory loader."""
    from .inputs import held_out_runs

    if target not in TARGETS:
        raise QtoolError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    unknown = sorted(set(options) - EXPORT_OPTIONS[target])
    if unknown:
        raise QtoolError(f"option {unknown[0]!r} does not apply to target {target!r} (it takes {', '.join(sorted(EXPORT_OPTIONS[target]))})")
    _evaluate.check_request(target, runtime, per_tensor)
    loaded = _checked(model_or_path, cal)
    if data is not None and not isinstance(data, (str, os.PathLike)):
        specs = model.data_inputs(loaded.proto)
        items = list(data)

        def runs():
            return _data.memory_runs(items[:limit] if limit else items, specs)
    else:
        _, runs = held_out_runs(loaded, cal, images, data, limit)
    result = _evaluate.evaluate(loaded, cal, runs, target=target, runtime=runtime, per_tensor=per_tensor,
                                progress=progress_bar(progress), **options)
    for w in result.warnings:
        log.warning(w)
    return result


# The commands over files (qtool.commands): what each command does, its messages naming these keywords.
calibrate_files = commands.calibrate_files
export_file = commands.export_file
evaluate_files = commands.evaluate_files
inspect_file = commands.inspect_file
report_file = commands.report_file
merge_files = commands.merge_files
recompute_file = commands.recompute_file
