"""`qtool evaluate`: a target's int8 model (the exact simulation of its file, and on request the real
runtime on this CPU) against FP32 on held-out inputs: the export built in memory from MODEL and its
calibration, or an exported file as it is, with the FP32 model its provenance records
(qtool.provenance) or --reference."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import onnx

from .. import calibration, model, provenance
from ..checks import evaluation as _evaluate
from ..checks import simulate
from ..commandinputs import check_model, find_calibration, held_out_runs, load_checked_model, model_json
from ..errors import Opt, QtoolError, UsageError
from ..feeds import data as _data
from ..model import dynamic, prequantized
from ..model.graph import Index
from ..model.writer import ModelFile
from ..options import EvaluateOptions, ExportOptions, exactly_one
from ..quantizers import cpu_kinds
from ..results import EvaluateResult
from . import done, path, progress_bar

log = logging.getLogger("qtool")


def check_request(options: EvaluateOptions) -> None:
    """A usage error for a target qtool cannot evaluate so, or a runtime that does not run its file;
    then the one source of inputs."""
    try:
        _evaluate.check_request(options.target, options.runtime, options.tensors)
    except QtoolError as e:
        raise UsageError(e.words.template, **e.words.fields) from None
    exactly_one(options.images, options.data)


def run(model_path, options: EvaluateOptions, *, calib=None, reference=None, progress=None) -> EvaluateResult:
    """options.target's int8 model of the calibration file `calib` [default: the single *.calib.json
    here] against FP32 on held-out images (preprocessed as the file records, options.image overriding
    its parts) or data. With options.fail_below DB, an output below it (the worse of the simulation and, with
    options.runtime, the runtime's run: evaluation.judged) is the result's failure. When `model_path` is an
    exported file (it records qtool's provenance, or `reference` names its FP32 model), that file as it is
    (`evaluate_file`). `progress`: a tqdm bar or a callback(n) per model pass over the inputs."""
    started = time.perf_counter()
    model_path, reference = path(model_path), path(reference)
    shipped = exported_file(model_path, reference, path(calib))
    if shipped is not None:
        return evaluate_file(model_path, shipped, options, calib=path(calib), reference=reference, progress=progress, started=started)
    check_request(options)
    calib_path = find_calibration(path(calib))
    cal = calibration.load(calib_path)
    loaded = load_checked_model(model_path, calib_path, cal)
    inputs, runs = held_out_runs(loaded, cal, options.images, options.data, options.limit, options.batch_size, options.image)
    result, rewrite = evaluated(loaded, cal, runs, options.export, runtime=options.runtime, per_tensor=options.tensors,
                                progress=progress_bar(progress))
    done(progress)
    return _result(result, inputs, options, started, model=model_json(loaded.path), model_sha256=loaded.sha256,
                   calibration=str(calib_path), reference=rewrite)


def evaluated(loaded, cal, runs, options: ExportOptions, *, runtime: str | None = None, per_tensor: bool = False,
              progress=None) -> tuple[_evaluate.Evaluation, dict | None]:
    """qtool.checks.evaluation.evaluate, and what the result says of the reference: None for an FP32
    model. For a model onnxruntime quantized dynamically, read as the float model it was made from
    (qtool.model.as_float), the reference is the model as given, run by onnxruntime: the export built
    from the float reading is scored against it (evaluate_file), and so is the float reading itself
    (its own error, in the result); per_tensor ranks the quantizers against the float reading."""
    if loaded.given is None:
        result = _evaluate.evaluate(loaded, cal, runs, options, runtime=runtime, per_tensor=per_tensor, progress=progress)
        return result, _own_pairs_reference(loaded.proto)
    _evaluate.check_request(options.target, runtime, per_tensor)
    options = _evaluate.export_options(options, runtime)
    built = provenance.built(loaded, cal, options)
    given = replace(loaded, proto=loaded.given, given=None, rewritten=None)
    result = _evaluate.evaluate_file(given, built.data, runs, target=options.target, runtime=runtime, progress=progress)
    tensors = _evaluate.ranked_tensors(loaded, cal, runs, options) if per_tensor else []
    own = _evaluate.evaluate_file(given, loaded.proto.SerializeToString(), runs)
    result = replace(result, tensors=tensors, plan_summary=built.summary, warnings=list(built.warnings) + result.warnings)
    reference = {
        "model": "as given: quantized dynamically by onnxruntime (its int8 layers run as onnxruntime runs them)",
        "read_as_float": loaded.rewritten,
        "float_reading_sqnr_db": _evaluate.json_number(own.worst_sqnr_db),
        "float_reading_outputs": [o.to_json() for o in own.outputs],
    }
    reference.update(_pair_saturation(given, loaded.proto, runs))
    return result, reference


def _pair_saturation(given, reading: onnx.ModelProto, runs) -> dict:
    """On an x86 CPU without VNNI, where onnxruntime's u8 x s8 kernels add pairs of products in int16 with saturation: the
    model as given against the same integers computed without saturating (its int8 weights as uint8 with zero point
    + 128: dynamic.without_pair_saturation), and the float reading against those. Empty elsewhere, and for a model
    without int8 weights."""
    if not (cpu_kinds.is_x86() and cpu_kinds.vnni() is False):
        return {}
    found = dynamic.without_pair_saturation(given.proto)
    if found is None:
        return {}
    unsaturated, layers = found
    as_given = _evaluate.evaluate_file(given, unsaturated.SerializeToString(), runs)
    reading_vs = _evaluate.evaluate_file(replace(given, proto=unsaturated), reading.SerializeToString(), runs)
    return {"unsaturated_layers": layers, "unsaturated_sqnr_db": _evaluate.json_number(as_given.worst_sqnr_db),
            "float_reading_vs_unsaturated_sqnr_db": _evaluate.json_number(reading_vs.worst_sqnr_db)}


def _own_pairs_reference(proto: onnx.ModelProto) -> dict | None:
    """What the reference is for a model shipped with its own Q/DQ pairs (qtool.model.prequantized): not an FP32
    model, but those pairs computed as the float arithmetic they state (evaluation._session); None otherwise."""
    pairs = prequantized.own_quantizers(Index(proto)).pairs
    if not pairs:
        return None
    return {"model": f"as given: its own {pairs} QuantizeLinear/DequantizeLinear pair(s) computed as float ops "
                     "(onnxruntime, graph optimisation off), not onnxruntime's int8 kernels"}


def _result(result: _evaluate.Evaluation, inputs: list, options: EvaluateOptions, started: float, **compared) -> EvaluateResult:
    """The EvaluateResult of an evaluation (`compared`: what was compared with what), warnings
    logged, and options.fail_below's verdict."""
    for w in result.warnings:
        log.warning(w)
    fail_below = options.fail_below
    failing = [(o, who) for o, who in _evaluate.judged(result) if fail_below is not None and not o.sqnr_db >= fail_below]
    failure = None
    if failing:
        worst, who = min(failing, key=lambda f: (f[0].sqnr_db if not math.isnan(f[0].sqnr_db) else -math.inf))
        failure = QtoolError("output {name!r} SQNR {db} dB{by} is below {fail_below} dB{count}", name=worst.name,
                             db=_evaluate.format_db(worst.sqnr_db), by=f" ({who} on this CPU)" if who else "",
                             fail_below=Opt("fail_below", float(fail_below)),
                             count=f" ({len(failing)} outputs fail)" if len(failing) > 1 else "")
    kind, data_file = "images" if options.images is not None else "data files", None
    if options.images is None:
        kind, data_file = _data.sample_runs(inputs) or (kind, None)
    return EvaluateResult(evaluation=result, inputs=len(inputs), input_kind=kind, data_file=data_file,
                          seconds=time.perf_counter() - started, fail_below=fail_below, failure=failure, **compared)


# ---------------------------------------------------------------- an exported file


def exported_file(file: Path | None, reference: Path | None, calib: Path | None = None) -> tuple | None:
    """(its graph without weights, its provenance or None) when `file` is an exported file to
    evaluate as it is: it records qtool's provenance, or `reference` is given; None for an FP32
    MODEL (the export is built from it and its calibration). A quantized file without provenance
    and without `reference` is an error: there is nothing to compare it with; except a model the
    calibration file (`calib`, or the one found here) was made from: calibrate took it as a MODEL (a
    Q/DQ model is calibrated as it is, with a warning), and so does evaluate (smart-turn v3, shipped
    QDQ-quantized: calibrate and export ran, evaluate refused it)."""
    if file is None or (reference is None and not os.path.isfile(file)):
        return None  # no such file: the MODEL path says so, after the calibration
    head = provenance.header(file)
    found = provenance.read(head, file)
    if found is None and reference is None:
        if dynamic.is_dynamic(head):  # quantized by onnxruntime's quantize_dynamic: a MODEL, read as float (qtool.model.dynamic)
            return None
        quantized = sorted({n.op_type for n in head.graph.node if n.op_type in model.QUANTIZED_OPS})
        if quantized and _calibrated_from(file, head, calib):
            return None
        if quantized:
            raise QtoolError("{file!r} holds {ops} nodes but no qtool provenance ({key}); give the FP32 model it was made from "
                             "with {reference}", file=str(file), ops="/".join(quantized), key=provenance.KEY,
                             reference=Opt("reference", metavar="MODEL"))
        return None
    return head, found


def _calibrated_from(file: Path, head: onnx.ModelProto, calib: Path | None) -> bool:
    """Whether the calibration file `calib` (or the single one here) records `file` (its SHA-256; `head`: its graph
    without weights)."""
    try:
        cal = calibration.load(find_calibration(calib))
    except QtoolError:  # none, several, or unreadable: the file is not a calibrated MODEL
        return False
    return model.model_sha256(file, model.external_locations(head)) == cal.model_sha256


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


def _no_export_options(file: Path, found, options: EvaluateOptions) -> None:
    """What builds an export (its options, --tensors' rebuilt models) does not apply to a file already exported."""
    if options.tensors:
        raise QtoolError("{tensors} ranks the quantizers of an export qtool builds: give the FP32 MODEL and its calibration, "
                         "not the exported file {file!r}", tensors=Opt("tensors"), file=str(file))
    target = found.target if found is not None else None
    if options.named_target not in (None, target):
        raise QtoolError("{given}: {file!r} is {what}", given=Opt("target", options.named_target), file=str(file),
                         what=f"{_article(target)} {target} export" if target else "not a qtool export")
    built = provenance.options_record(options.export)
    plain = provenance.options_record(ExportOptions(target=options.target))
    changed = [k for k in built if built[k] != plain.get(k)]
    if changed:
        raise QtoolError("{option} builds an export; {file!r} is one already, made with its own options: give the FP32 MODEL "
                         "and its calibration to evaluate other options", option=Opt(changed[0]), file=str(file))


def _runtime_check(file: Path, head, found, runtime: str | None) -> None:
    """The refusals of the MODEL path for the file's target and the options it records (an FP8
    model has no runtime beside the simulation); for a file qtool did not write, whether the
    runtime reads its nodes."""
    if runtime is None:
        return
    if found is not None:
        _evaluate.check_request(found.target, runtime)
        _evaluate.export_options(provenance.export_options(found), runtime)
        return
    if runtime not in simulate.RUNTIMES:
        raise QtoolError(f"runtime {runtime!r} is not one of {', '.join(simulate.RUNTIMES)}")
    if runtime != "openvino" and any(simulate.is_fake_quantize(n) for n in head.graph.node):
        raise QtoolError("{runtime} cannot run {file!r}'s FakeQuantize nodes ({domain}); use {openvino}", runtime=Opt("runtime", runtime),
                         file=str(file), domain=simulate.DOMAIN, openvino=Opt("runtime", "openvino"))


def find_reference(file: Path, found, reference: Path | None) -> model.LoadedModel:
    """The FP32 model of the exported `file`: `reference` (checked against the SHA-256 the file
    records, when it records one), else the model the file records, with that SHA-256: by name
    beside it, at the path it records (relative to its folder), or by name here."""
    flag = Opt("reference", metavar="MODEL")
    if reference is not None:
        loaded = model.load_model(reference)
        if found is not None and loaded.sha256 != found.model_sha256:
            raise QtoolError("{ref!r} is not the model {file!r} was exported from (SHA-256 differs from the one the file records, "
                             "of {name!r})", ref=str(reference), file=str(file), name=found.model_name)
        return loaded
    name = found.model_name
    candidates = []
    for candidate in [file.parent / name] + ([file.parent / found.model_path] if found.model_path else []) + [Path(name)]:
        if all(os.path.realpath(candidate) != os.path.realpath(c) for c in candidates):
            candidates.append(candidate)
    mismatched = []
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            loaded = model.load_model(candidate)
        except QtoolError:
            loaded = None
        if loaded is not None and loaded.sha256 == found.model_sha256:
            return loaded
        mismatched.append(str(candidate))
    looked = " and ".join(repr(str(c)) for c in candidates)
    if mismatched:
        raise QtoolError("{found!r} is not the FP32 model {file!r} was exported from (SHA-256 differs from the one the file records); "
                         "give that model with {reference}", found=mismatched[0], file=str(file), reference=flag)
    raise QtoolError("the FP32 model {file!r} was exported from, {name!r}, is not beside it, where it was, or here (looked for "
                     "{looked}); give it with {reference}", file=str(file), name=name, looked=looked, reference=flag)


def _preprocess(file: Path, found, calib: Path | None, loaded) -> tuple[dict, Path | None]:
    """The image preprocessing record to feed --images with: the calibration file's when given (the
    one the file records, checked by SHA-256), else the record the file carries (none for a file
    qtool did not write: the image flags alone)."""
    if calib is None:
        return (found.preprocess if found is not None else {}), None
    cal = calibration.load(calib)
    if found is not None and found.calibration_sha256 is not None and cal.file[1] != found.calibration_sha256:
        raise QtoolError("{calib!r} is not the calibration file {file!r} was exported with (SHA-256 differs from the one the file "
                         "records, of {name!r})", calib=str(calib), file=str(file), name=found.calibration_name)
    check_model(loaded, calib, cal.model_path, cal.model_sha256)
    return cal.preprocess, calib


def evaluate_file(file: Path, shipped: tuple, options: EvaluateOptions, *, calib: Path | None = None, reference: Path | None = None,
                  progress=None, started: float | None = None) -> EvaluateResult:
    """The exported `file` as it is (`shipped`: exported_file's) against its FP32 model
    (find_reference) on held-out inputs: the exact simulation of its nodes as written, and with
    options.runtime that runtime on this CPU; images preprocessed as the file (or `calib`) records."""
    started = time.perf_counter() if started is None else started
    head, found = shipped
    _no_export_options(file, found, options)
    exactly_one(options.images, options.data)
    _runtime_check(file, head, found, options.runtime)
    loaded = find_reference(file, found, reference)
    recorded, calib = _preprocess(file, found, calib, loaded)
    exported = model.load_model(file)
    data = ModelFile(exported.proto) if exported.store is not None else exported.proto.SerializeToString()
    inputs, runs = held_out_runs(loaded, SimpleNamespace(preprocess=recorded),  # held_out_runs reads a calibration's preprocess only
                                 options.images, options.data, options.limit, options.batch_size, options.image)
    target = found.target if found is not None else None
    result = _evaluate.evaluate_file(loaded, data, runs, target=target, runtime=options.runtime, progress=progress_bar(progress))
    done(progress)
    return _result(result, inputs, options, started, file=model_json(file), file_sha256=exported.sha256, model=model_json(loaded.path),
                   model_sha256=loaded.sha256, calibration=None if calib is None else str(calib),
                   provenance=None if found is None else found.raw)
