"""What an exported ONNX file records of how it was made, and reading it back.

Every ONNX model qtool export (and qtool.export) writes carries one `metadata_props` entry,
KEY = "qtool.provenance", whose value is a JSON object (keys sorted, ASCII):

    format       FORMAT (this layout's version)
    qtool        the qtool version that wrote the file
    target       the target whose writer made it (qtool.targets)
    model        {"name": file name, "sha256": qtool.model's SHA-256 (external data included), "path": the
                 model relative to the exported file's folder, or null when the file's place is not known}: the FP32 model
    calibration  {"name": file name, "sha256": of its bytes}, or null for a calibration never read from or
                 saved to a file (qtool.calibrate's result in memory)
    options      the export options that made it, resolved as the target's writer reads them, as keywords
                 of qtool.export (the target's own group only; policies as their resolved Policy records)
    preprocess   the calibration's image preprocessing record (what evaluate --images feeds)

The entry is appended to the writer's bytes as one more ModelProto field (protobuf concatenates
repeated fields in any order; onnx/onnx.proto: ModelProto.metadata_props = 14), so the rest of the
file is the writer's, byte for byte, and `unstamped` gives that back. The stamp is put on in one
place, `exported`, which qtool export and qtool.export both write through; a target's range files
(caches) are not ONNX and carry none.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import onnx

from . import __version__, model, targets
from .errors import QtoolError
from .model import graph as G
from .model import wire
from .model.writer import ModelFile
from .options import ExportOptions
from .targets import branches

KEY = "qtool.provenance"
FORMAT = 1
MODEL_METADATA_PROPS = 14  # onnx.proto: ModelProto.metadata_props
MAX_VALUE_BYTES = 1 << 20  # a provenance value larger than this is not one qtool wrote


def _plain(value):
    """`value` as JSON data: dataclasses as objects of their compared fields, tuples/sets as lists, paths as text."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value) if f.compare}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, Path):
        return str(value)
    return value


def options_record(options: ExportOptions) -> dict:
    """The export options as qtool.export's keywords: the general ones, and the fields of the groups
    the target reads (a group's policies as their Policy records)."""
    record = {}
    for f in fields(options):
        if f.name not in ("target", "own"):
            record[f.name] = _plain(getattr(options, f.name))
    own = options.group(targets.get(options.target).group)
    record.update({g.name: _plain(getattr(own, g.name)) for g in fields(own)})
    return record


def _relative(model_path: Path, output) -> str | None:
    """The model's path from the folder of the file written to `output` (None: no output path, or a model in memory)."""
    if output is None or not model_path.is_file():
        return None
    return Path(os.path.relpath(os.path.realpath(model_path), os.path.realpath(Path(output).parent))).as_posix()


def record(loaded, cal, options: ExportOptions, output=None) -> dict:
    """The provenance of options.target's export of `cal` on `loaded`, to be written to `output` (module doc)."""
    resolved, _ = targets.get(options.target).export_options(options)
    source = cal.file
    return {
        "format": FORMAT, "qtool": __version__, "target": options.target,
        "model": {"name": Path(loaded.path).name, "sha256": loaded.sha256, "path": _relative(Path(loaded.path), output)},
        "calibration": None if source is None else {"name": source[0], "sha256": source[1]},
        "options": options_record(resolved), "preprocess": _plain(cal.preprocess),
    }


def stamp(provenance: dict) -> bytes:
    """The ModelProto field holding `provenance` as KEY's metadata entry."""
    entry = onnx.StringStringEntryProto(key=KEY, value=json.dumps(provenance, sort_keys=True, separators=(",", ":")))
    return wire.field(MODEL_METADATA_PROPS, entry.SerializeToString())


def built(loaded, cal, options: ExportOptions):
    """options.target's writer's result for `cal` on `loaded`, refused (a one-line QtoolError, no file) when it would
    quantize nothing: what `export` writes and `evaluate` scores (before the provenance record)."""
    why = unquantizable(loaded.proto)  # before the writer's work: minutes and gigabytes on a big tree ensemble
    if why is not None:
        raise QtoolError(f"the {options.target} export would quantize nothing: {why}; no file written")
    writer = targets.exporter(options.target)
    result = branches.finished(loaded, cal, options, writer.export, writer.export(loaded, cal, options))
    nothing = quantizes_nothing(loaded.proto, options.target, result.summary, calibrated=len(cal.tensors))
    if nothing is not None:
        raise branches.refused(options.target, loaded.proto) or nothing
    return result


def exported(loaded, cal, options: ExportOptions, output=None):
    """options.target's export of `cal` on `loaded` as qtool writes it (to `output`, when known): the
    writer's result (qtool.targets.WrittenFile), an ONNX model with its provenance appended (module doc)."""
    module = targets.exporter(options.target)
    result = built(loaded, cal, options)
    if not module.suffix(options).endswith(".onnx"):
        return result
    trailer = stamp(record(loaded, cal, options, output))
    if isinstance(result.data, ModelFile):
        result.data.trailer = trailer
    else:
        result.data = bytes(result.data) + trailer
    return result


def unstamped(data: bytes) -> bytes:
    """The writer's bytes of a stamped file: without the provenance entries at its end."""
    end = len(data)
    entries = [(number, first, value, stop) for number, first, value, stop in wire.fields(data, 0, len(data))]
    for number, first, value, stop in reversed(entries):
        if number != MODEL_METADATA_PROPS or stop != end or onnx.StringStringEntryProto.FromString(bytes(data[value:stop])).key != KEY:
            break
        end = first
    return bytes(data[:end])


@dataclass(frozen=True)
class Provenance:
    """What an exported file records (module doc), read back."""

    target: str
    model_name: str
    model_sha256: str
    model_path: str | None  # relative to the exported file's folder
    calibration_name: str | None
    calibration_sha256: str | None
    options: dict
    preprocess: dict
    raw: dict


def header(path) -> onnx.ModelProto:
    """The ONNX file at `path` without its weights, or a one-line error naming it."""
    try:
        return model.read_model_header(path, weightless=True)
    except QtoolError:
        raise
    except Exception as e:  # protobuf's or the memory map's: not a model
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise QtoolError(f"{str(path)!r} is not a readable ONNX model ({reason}); give an .onnx file") from None


def read(proto: onnx.ModelProto, path) -> Provenance | None:
    """The provenance `proto` (the file at `path`, named in messages) records, None when it records none."""
    values = [p.value for p in proto.metadata_props if p.key == KEY]
    if not values:
        return None
    try:
        if len(values[-1]) > MAX_VALUE_BYTES:
            raise ValueError("too large")
        doc = json.loads(values[-1])
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format') if isinstance(doc, dict) else None!r}")
        calib = doc.get("calibration")
        found = Provenance(
            _text(doc["target"]), _text(doc["model"]["name"]), _text(doc["model"]["sha256"]),
            None if doc["model"].get("path") is None else _text(doc["model"]["path"]),
            None if calib is None else _text(calib["name"]), None if calib is None else _text(calib["sha256"]),
            _mapping(doc["options"]), _mapping(doc.get("preprocess") or {}), doc)
        if found.target not in targets.TARGETS:
            raise ValueError(f"unknown target {found.target!r}")
        if not found.model_name or Path(found.model_name).name != found.model_name:
            raise ValueError(f"model name {found.model_name!r}")
    except (ValueError, TypeError, KeyError) as e:
        raise QtoolError(f"{str(path)!r} records a damaged or unknown {KEY} ({str(e) or type(e).__name__}); "
                         "export it again with this qtool") from None
    return found


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def _mapping(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def export_options(found: Provenance) -> ExportOptions:
    """The export options a file records, rebuilt (without its policies: the file holds what they made)."""
    given = {k: v for k, v in found.options.items() if k != "policies"}
    try:
        return targets.options_for(found.target, **given)
    except (QtoolError, TypeError) as e:
        raise QtoolError(f"the export options the file records cannot be read by this qtool ({e}); export it again") from None


_LINEAR = ("Conv", "ConvTranspose", "MatMul", "Gemm")
_TYPE_NAMES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
               onnx.TensorProto.DOUBLE: "float64"}


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _type_name(elem_type: int) -> str:
    return _TYPE_NAMES.get(elem_type, onnx.TensorProto.DataType.Name(elem_type).lower())


def _foreign_weights(proto, target: str) -> str | None:
    """Why no layer was quantized when the linear layers' constant weights are all of float types `target` does not
    quantize (a float16 model for a target of float32 layers), naming the targets that do; else None."""
    consts = {i.name: i.data_type for i in proto.graph.initializer}
    consts.update({n.output[0]: a.t.data_type for n in proto.graph.node if n.op_type == "Constant" and n.output
                   for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR})
    types = {consts[t] for n in proto.graph.node if n.op_type in _LINEAR for t in n.input[:2] if t in consts}
    own = set(targets.get(target).float_types)
    if not types or types & own:
        return None
    others = [name for name in targets.names() if types & set(targets.get(name).float_types)]
    return (f"its layers' weights are {'/'.join(sorted(_type_name(t) for t in types))} and the {target} target quantizes "
            f"{'/'.join(sorted(_type_name(t) for t in own))} layers only: "
            + (f"export it for {' or '.join(others)}, which quantizes them, or " if others else "")
            + "convert the model to float32 first")


def unquantizable(proto) -> str | None:
    """Why no export of `proto` can quantize anything, known from its ops alone (checked before any work, by
    calibrate and by every export): it computes only with ai.onnx.ml ops (onnxmltools' LightGBM, scikit-learn
    exports: TreeEnsembleClassifier, ZipMap, ...), which no target quantizes, and its standard ops, in the graph or a
    subgraph, only move or retype values (qtool.model.graph.REFORMS, Constant); None otherwise: an op that computes
    may be quantized (or recorded in a range file), and the export's own check (quantizes_nothing) says when not."""
    ml: set[str] = set()
    moved: set[str] = set()

    def plain(graph) -> bool:
        for n in graph.node:
            if n.domain == "ai.onnx.ml":
                ml.add(n.op_type)
            elif n.domain in ("", "ai.onnx") and n.op_type in G.REFORMS | {"Constant"}:
                moved.add(n.op_type)
            else:
                return False
            subgraphs = [a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
            subgraphs += [g for a in n.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]
            if not all(plain(g) for g in subgraphs):
                return False
        return True

    if not plain(proto.graph) or not ml:
        return None
    kept = sorted(moved - {"Constant"})
    return (f"no op of the model is one any target quantizes: it computes with ai.onnx.ml ops only ({', '.join(sorted(ml))})"
            + (f", its other ops only move or retype values ({', '.join(kept)})" if kept else ""))


def quantizes_nothing(proto, target: str, summary: dict, calibrated: int | None = None) -> QtoolError | None:
    """The error for a model export that places no quantizer (no Q/DQ or FakeQuantize node: the
    file would be the FP32 model, which a runtime builds without INT8 and `qtool inspect`
    refuses), naming why; None when it places some (an LSTM run in int8 included), writes a range file (no quantizer counts), or
    the model holds quantization nodes already (qtool's own export, exported again). `calibrated`:
    how many tensors the calibration holds (none: that is why, whatever the layers)."""
    if summary.get("activation_quantizers", 1) or summary.get("weight_quantizers", 1) or summary.get("int8_lstm") \
            or model.already_quantized(proto):
        return None
    kept = list(summary.get("fp32_layer_names", ()))
    if calibrated == 0:
        why = ("the calibration holds no tensor's range (calibrate records the float activations whose values reach an "
               "output; here none does, or the calibration was made for another model)")
    elif summary.get("float_lstm"):
        lstms = summary["float_lstm"]
        why = (f"its LSTM(s) stay float, their int8 estimated to cost too much ({'; '.join(f'{k}: {v}' for k, v in list(lstms.items())[:2])}), "
               "and it has no other op the target quantizes")
    elif kept and (foreign := _foreign_weights(proto, target)):
        why = foreign
    elif kept and set(kept) <= set(own := summary.get("default_exclusions", {})):
        by_reason: dict[str, list[str]] = {}
        for layer in kept:
            by_reason.setdefault(own[layer], []).append(layer)
        shown = "; ".join(f"{_listed(layers)}: {reason}" for reason, layers in by_reason.items())
        why = f"the {target} target's own rules keep every layer it could quantize FP32 ({len(kept)}: {shown})"
    elif kept:
        why = f"every layer it could quantize stays FP32 ({len(kept)}: {_listed(kept)}), by the exclusions asked for or the target's own"
    else:
        ops = sorted({n.op_type for n in proto.graph.node if n.op_type != "Constant"})
        shown = ", ".join(ops[:8]) + (f" and {len(ops) - 8} more" if len(ops) > 8 else "")
        why = f"no op of the model is one {target} quantizes under its rules (its ops: {shown or 'none'})"
    return QtoolError(f"the {target} export would quantize nothing: {why}; no file written")
