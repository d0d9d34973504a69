"""What `qtool inspect` reads and says: a calibration file or a target's range file (told apart by
content; the target's inspection module reads it, qtool.targets.inspections) and the activation
tensors of a model it covers; the rules of a target an ONNX model breaks (`inspect_onnx`); the
policy each quantizer resolves to. Each `inspect_*` returns a qtool.results.InspectResult (data,
with a target's own lines on its files; the command line words the rest)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import onnx
from google.protobuf.message import Error as ProtobufError

from . import calibration, model, targets
from .commandinputs import check_model, load_checked_model, model_json
from .errors import Opt, QtoolError
from .options import ExportOptions
from .results import InspectResult
from .targets import qdq as qdq_target
from .targets.cpu import CpuOptions

log = logging.getLogger("qtool")

CALIBRATION = "qtool calibration file"


# an ONNX model is one protobuf message, which cannot exceed 2 GB
MAX_ONNX_BYTES = 2 << 30


def read_file(path: Path) -> dict:
    """Decode a calibration file or a target's range file.

    The kind is told by content, never by the file name. Returns {'kind', 'header', 'tensors'}
    with tensors sorted by name, each a dict with at least 'name' and 'amax'.
    """
    readers = targets.inspections()
    data = calibration.read_input(path, calibration.MAX_FILE_BYTES, "file",
                                  "give a calibration file or a " + " or a ".join(r.FILE for r in readers))
    if not data.strip():
        raise QtoolError(f"{str(path)!r} is empty")
    text = None
    if b"\0" not in data:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if text is not None and text.lstrip().startswith("{"):
        return _calibration(path, data)  # its messages name the file
    for reader in readers:
        try:
            doc = reader.read(text, data)
        except QtoolError as e:
            if text is not None:
                raise QtoolError("{path!r}: {error}", path=str(path), error=e) from None
            if _is_onnx(data):
                raise reader.onnx_hint(path) from None
            raise QtoolError("{path!r} is binary and {error}", path=str(path), error=e) from None
        if doc is not None:
            return doc
    raise QtoolError("{path!r} is not a qtool calibration file, {files} (an ONNX model goes after {model})", path=str(path),
                     files=", ".join(r.FILES for r in readers), model=Opt("model"))


def _reader(kind: str):
    """The inspection module of the target whose range file is of `kind`."""
    return next(r for r in targets.inspections() if kind in r.KINDS)


def _is_onnx(data: bytes) -> bool:
    try:
        return len(onnx.load_model_from_string(data).graph.node) > 0
    except (ProtobufError, ValueError, TypeError, RuntimeError):  # any decoding failure: not a model
        return False


def _calibration(path: Path, data: bytes) -> dict:
    cal = calibration.parse(data, path)  # the bytes already read: a pipe cannot be read twice
    method = cal.method if cal.method != "entropy" else f"entropy ({cal.kl_variant})"
    tensors = [
        {"name": t.name, "min": t.min, "max": t.max, "amax": t.amax, "unsigned": t.unsigned,
         "method": method, "nonfinite_values": t.nonfinite}
        for t in sorted(cal.tensors, key=lambda t: t.name)
    ]
    header = {"model": cal.model_path, "sha256": cal.model_sha256, "method": cal.method,
              "kl_variant": cal.kl_variant, "samples": cal.samples, "bins": cal.bins}
    return {"kind": "calibration", "header": header, "tensors": tensors}


def _printable(name: str) -> str:
    """A tensor name for a one-line message: quoted when it holds line breaks or other control characters."""
    return name if name.isprintable() else repr(name)


def unusable(doc: dict) -> list[str]:
    """Tensors of a target's range file whose scale or range its runtime cannot use (NaN, infinite,
    zero or negative: it divides by the scale). A calibration file's amax 0 is the exact range of an
    all-zero tensor, and exports safely."""
    if doc["kind"] == "calibration":
        return []
    usable = _reader(doc["kind"]).usable
    return [t["name"] for t in doc["tensors"] if not usable(t.get("scale", t["amax"]))]


def coverage(doc: dict, loaded: model.LoadedModel) -> dict:
    """Which activation tensors of the model the file gives a usable range.

    Usable: finite, and > 0 in a range file (its runtime divides by the scale); a calibration
    file's amax 0 is the exact range of an all-zero tensor and exports safely.
    """
    expected = model.activation_tensors(loaded.proto)
    amax = {t["name"]: t["amax"] for t in doc["tensors"]}
    missing = [n for n in expected if n not in amax]
    nonfinite = [n for n in expected if n in amax and not math.isfinite(amax[n])]
    nonpositive = [] if doc["kind"] == "calibration" else [
        n for n in expected if n in amax and math.isfinite(amax[n]) and amax[n] <= 0
    ]
    wanted = set(expected)
    extra = sorted(n for n in amax if n not in wanted)
    covered = len(expected) - len(missing) - len(nonfinite) - len(nonpositive)
    result = {
        "model": model_json(loaded.path), "activation_tensors": len(expected), "covered": covered,
        "percent": round(100.0 * covered / len(expected), 2) if expected else 100.0,
        "missing": missing, "extra": extra, "nonfinite": nonfinite, "nonpositive": nonpositive,
    }
    if doc["kind"] == "calibration":
        result["model_matches"] = doc["header"]["sha256"] == loaded.sha256
    return result


def is_onnx_file(path: Path) -> bool:
    """Whether FILE is an ONNX model; missing or unreadable is a one-line error."""
    return _is_onnx(calibration.read_input(path, MAX_ONNX_BYTES, "ONNX model", "give an ONNX model"))


def inspect_onnx(file: Path, target: str, value: str) -> InspectResult:
    """`inspect MODEL.onnx` with `target`'s check option set to `value`: the rules the model breaks (any: a failed check)."""
    document, lines, failure = targets.get(target).inspection().check(file, value)
    checked = {k: v for k, v in document.items() if k not in ("command", "file", "kind")}
    return InspectResult(str(file), document["kind"], check=checked, target_lines=tuple(lines.split("\n")),
                         failure=QtoolError(failure) if failure else None)


def inspect_policies(file: Path, policies) -> InspectResult:
    """Each quantizer of the calibration's model with the policy it resolves to."""
    cal = calibration.load(file)
    loaded = load_checked_model(None, file, cal)
    prepared = qdq_target.prepare(loaded, cal, ExportOptions("qdq", own=CpuOptions(policies=policies)))
    ops = {n.name: n.op_type for n in prepared.model.graph.node}
    quantizers = prepared.plan.quantizers
    rows = [{"kind": q.kind, "tensor": q.tensor, "read_by": sorted({ops[n] for n, _ in q.readers}), **q.policy.to_json()} for q in quantizers]
    for w in prepared.warnings:
        log.warning(w)
    return InspectResult(str(file), "policies", model=str(loaded.path), quantizers=tuple(rows),
                         policies=tuple(q.policy.describe() for q in quantizers), warnings=tuple(prepared.warnings))


def inspect_file(file: Path, model_path: Path | None) -> InspectResult:
    """FILE's kind, header and tensors; with `model_path`, which of the model's activation tensors it
    covers (any without a usable range: a failed check); a range file's unusable scales (a failed check)."""
    doc = read_file(file)
    cov = None
    if model_path is not None:
        loaded = model.load_float_model(model_path)
        if doc["kind"] == "calibration":
            check_model(loaded, file, doc["header"]["model"], doc["header"]["sha256"])  # export's check: another model's names say nothing
        cov = coverage(doc, loaded)
    kind = doc["kind"]
    reader = None if kind == "calibration" else _reader(kind)
    shown_model = None
    if kind == "calibration" or model_path is not None:
        shown_model = model_json(model_path if model_path is not None else file.parent / doc["header"]["model"])
    bad_scales = unusable(doc)
    failure = None
    bad = len(cov["missing"]) + len(cov["nonfinite"]) + len(cov["nonpositive"]) if cov is not None else 0
    if bad:
        failure = f"{bad} of {cov['activation_tensors']} activation tensors of {model_path} have no usable range in {file}"
    elif bad_scales:
        failure = reader.unusable_failure(file, [_printable(n) for n in bad_scales])
    if reader is None:
        named, columns, lines = CALIBRATION, ("name", "min", "max", "amax", "unsigned", "method"), ()
    else:
        header_line = reader.header_text(doc)
        named, columns, lines = reader.KINDS[kind], tuple(reader.COLUMNS.get(kind, ["name", "amax"])), (header_line,) if header_line else ()
    return InspectResult(str(file), kind, kind_name=named, header=doc["header"], tensors=tuple(doc["tensors"]), columns=columns,
                         model=shown_model, coverage=cov, unusable=None if kind == "calibration" else tuple(bad_scales),
                         target_lines=lines, failure=QtoolError(failure) if failure else None)
