"""What `qtool inspect` reads and checks of TensorRT: its range files (a calibration cache, a
sampleINT8API dynamic-range file, an onnxruntime TensorRT EP table; told apart by content), whether
their scales are usable (TensorRT divides by them), and a Q/DQ ONNX model checked against a
TensorRT version's ONNX parser rules (`--trt-version`, qtool.targets.tensorrt.checker). qtool.inspection
asks this module through the registry (qtool.targets)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ... import model
from ...errors import Opt, QtoolError
from . import checker
from . import files as trtfiles
from .options import InspectRules

KINDS = {
    "tensorrt-cache": "TensorRT calibration cache",
    "dynamic-range": "TensorRT sampleINT8API dynamic-range file",
    "ort-trt": "onnxruntime TensorRT EP calibration table",
}
FILES = "TensorRT cache, dynamic-range file or onnxruntime TensorRT table"  # the kinds, in a message
FILE = "TensorRT cache"  # what a range file is called, in short
CHECK = InspectRules  # the option that makes inspect check a model's Q/DQ nodes (declared as data)
COLUMNS = {"tensorrt-cache": ["name", "hex", "scale", "amax"]}  # a kind's table (default: name, amax)
HELP = """Range files: a TensorRT calibration cache (its header decoded: version number -> TensorRT
X.Y.Z, algorithm; each entry's hex and scale), a dynamic-range file or an onnxruntime TensorRT
table.

With --trt-version X, FILE is an ONNX model with QuantizeLinear/DequantizeLinear nodes: each
rule of TensorRT X's ONNX parser it breaks is printed as `node: rule: message`. A TensorRT file
qtool exported is checked so without it, against the version it records."""  # qtool inspect --help


def _plain(entries: dict[str, float]) -> list[dict]:
    return [{"name": n, "amax": entries[n]} for n in sorted(entries)]


def read(text: str | None, data: bytes) -> dict | None:
    """{'kind', 'header', 'tensors'} of a range file (`text`: its UTF-8 text, None for binary);
    None when it is none of them; a QtoolError (without the path) for one that is broken."""
    if text is not None:
        first = next((line for line in text.splitlines() if line.strip()), "")
        if text.startswith("TRT-"):
            return _cache(text)
        if ":" in first:
            return {"kind": "dynamic-range", "header": {}, "tensors": _plain(trtfiles.read_dynamic_range(text))}
        return None
    return {"kind": "ort-trt", "header": {}, "tensors": _plain(trtfiles.read_ort_table(data))}


def _cache(text: str) -> dict:
    header, entries = trtfiles.read_cache(text)
    hexes = trtfiles.read_cache_hex(text)
    header = {"line": text.splitlines()[0].strip(), "version": header["version"],
              "tensorrt": trtfiles.decode_version(header["version"]), "algorithm": header["algorithm"]}
    tensors = [
        {"name": n, "hex": hexes[n], "scale": trtfiles.hex_scale(hexes[n]), "amax": entries[n]}
        for n in sorted(entries)
    ]
    return {"kind": "tensorrt-cache", "header": header, "tensors": tensors}


def usable(value: float) -> bool:
    """A range file's scale or range TensorRT can divide by: finite and > 0."""
    return trtfiles.is_usable(value)


def header_text(doc: dict) -> str | None:
    """The line under the title for a cache: its header decoded."""
    if doc["kind"] != "tensorrt-cache":
        return None
    header = doc["header"]
    version = f"TensorRT {header['tensorrt']}" if header["tensorrt"] else f"unknown TensorRT version number {header['version']}"
    return f"header {header['line']}: {version}, {header['algorithm']}"


def unusable_failure(file: Path, names: list[str]) -> str:
    return (f"{len(names)} tensor(s) of {file} have a NaN, infinite, zero or negative scale, "
            f"which TensorRT cannot use: {trtfiles._listed(names, 10)}")


def onnx_hint(path: Path) -> QtoolError:
    """An ONNX model given as a range file."""
    return QtoolError("{path!r} is an ONNX model; check its Q/DQ nodes with {version}, or give it with {model} and a "
                      "calibration file or cache as FILE", path=str(path), version=Opt("trt_version", metavar="X"), model=Opt("model"))


def checked(value: str) -> str:
    """--trt-version as MAJOR.MINOR.PATCH, one whose rules qtool knows (a one-line error otherwise)."""
    version = trtfiles.canonical_version(value)
    checker.parse_version(version)
    return version


def check(file: Path, trt_version: str) -> tuple[dict, str, str | None]:
    """`inspect MODEL.onnx --trt-version X`: the Q/DQ rules the model breaks (any: a failed check)."""
    major, minor, patch = checker.parse_version(trt_version)
    version = f"{major}.{minor}.{patch}"
    loaded = model.load_model(file)
    found = checker.check(loaded.proto, trt_version)
    qdq = checker.qdq_nodes(loaded.proto)
    summary = {
        "command": "inspect", "file": str(file), "kind": "onnx", "trt_version": version,
        "opset": checker.default_opset(loaded.proto),
        "qdq_nodes": qdq, "violations": [{"node": v.node, "rule": v.rule, "message": v.message} for v in found],
    }
    failure = f"{file} breaks the TensorRT {version} Q/DQ rules in {len(found)} place(s)" if found else None
    return summary, _text(file, version, found, qdq), failure


def _text(path: Path, version: str, found: list[checker.Violation], qdq: int) -> str:
    lines = [f"{v.node or '<model>'}: {v.rule}: {v.message}" for v in found]
    if found:
        counts = ", ".join(f"{rule} {n}" for rule, n in sorted(Counter(v.rule for v in found).items()))
        lines.append(f"{path}: {len(found)} violation(s) of the TensorRT {version} Q/DQ rules, {qdq} Q/DQ nodes ({counts})")
    else:
        lines.append(f"{path}: no violation of the TensorRT {version} Q/DQ rules, {qdq} Q/DQ nodes")
    return "\n".join(lines)
