"""protobuf's wire format, as qtool reads and writes ONNX models piece by piece.

Owns the codec (varints, field keys, walking a message's fields: protobuf.dev/programming-guides/
encoding: a field is a varint key, number << 3 | wire type, then a varint (0), 8 bytes (1), a varint
length and that many bytes (2) or 4 bytes (5)) and the splicing of a model's main-graph initializers
into its serialization: protobuf writes a message's fields in field-number order, so a tensor's data
(field 9) goes after its name, an initializer list (graph field 5) after the graph's name and the
graph (model field 7) after the model's version fields. What the initializers hold (lazy weights,
placeholders, external data) is the callers' business.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx
from onnx import TensorProto

MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_INITIALIZER = 5  # GraphProto.initializer
TENSOR_DATA_TYPE = 2  # TensorProto.data_type
TENSOR_RAW_DATA = 9  # TensorProto.raw_data


def varint(buf, pos: int) -> tuple[int, int]:
    """The varint at buf[pos] and the position after it."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def encode(value: int) -> bytes:
    """`value` as a varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire: int = 2) -> bytes:
    """The key of field `number` (wire type 2 unless told: a length-delimited field)."""
    return encode(number << 3 | wire)


def field(number: int, body: bytes) -> bytes:
    """Length-delimited field `number` holding `body`."""
    return key(number) + encode(len(body)) + body


def fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field, start of its value, end) of each field of the message in buf[start:end]."""
    pos = start
    while pos < end:
        first = pos
        k, pos = varint(buf, pos)
        if k >> 3 == 0:  # protobuf numbers fields from 1: a zero tag is no message (a file of zeros ends here, at once)
            raise ValueError("field number 0: not a protobuf message")
        wire = k & 7
        if wire == 0:
            value = pos
            _, pos = varint(buf, pos)
        elif wire == 2:
            length, value = varint(buf, pos)
            pos = value + length
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        else:
            raise ValueError(f"wire type {wire} (groups) in an ONNX file")
        if pos > end:
            raise ValueError("a field runs past its message")
        yield k >> 3, first, value, pos


def split(message: bytes, number: int) -> int:
    """Where in a serialized message a field `number` goes: before the first field numbered higher."""
    for n, first, _, _ in fields(message, 0, len(message)):
        if n > number:
            return first
    return len(message)


def _without(message, empty, name: str):
    """`empty` given every field of `message` but `name` (copied field by field: the one left out is never copied)."""
    for f, v in message.ListFields():
        if f.name == name:
            continue
        if f.is_repeated:
            getattr(empty, f.name).extend(v)
        elif f.message_type is not None:
            getattr(empty, f.name).CopyFrom(v)
        else:
            setattr(empty, f.name, v)
    return empty


def shells(model: onnx.ModelProto, tensor: Callable[[int, TensorProto], bytes | None]) -> tuple[bytes, bytes, list]:
    """(the model serialized without its graph, the graph without its initializers, per main-graph
    initializer the field `tensor(index, t)` serializes, or None where it returns None)."""
    g = model.graph
    graph_bytes = _without(g, onnx.GraphProto(), "initializer").SerializeToString()
    model_bytes = _without(model, onnx.ModelProto(), "graph").SerializeToString()
    inits = []
    for k, t in enumerate(g.initializer):
        encoded = tensor(k, t)
        inits.append(field(GRAPH_INITIALIZER, encoded) if encoded is not None else None)
    return model_bytes, graph_bytes, inits


def initializer_field(t: TensorProto) -> bytes:
    """Initializer `t` as a field of its graph, serialized as it is."""
    return key(GRAPH_INITIALIZER) + encode(t.ByteSize()) + t.SerializeToString()


def assemble(model_bytes: bytes, graph_bytes: bytes, inits: list[bytes]) -> bytes:
    """The model's serialization from shells' shells and every initializer's field."""
    at = split(graph_bytes, GRAPH_INITIALIZER)
    graph = graph_bytes[:at] + b"".join(inits) + graph_bytes[at:]
    at = split(model_bytes, MODEL_GRAPH)
    return model_bytes[:at] + field(MODEL_GRAPH, graph) + model_bytes[at:]


def assemble_shells(model: onnx.ModelProto, tensor: Callable[[int, TensorProto], bytes | None]) -> bytes:
    """The model's serialization with each main-graph initializer serialized by `tensor(index, t)`
    (None: as it is)."""
    model_bytes, graph_bytes, pieces = shells(model, tensor)
    g = model.graph
    return assemble(model_bytes, graph_bytes, [p if p is not None else initializer_field(g.initializer[k])
                                               for k, p in enumerate(pieces)])


def spliced(model: onnx.ModelProto, replaced: Callable[[TensorProto], bool],
            where: Callable[[TensorProto], TensorProto]) -> bytes:
    """The model's serialization with each main-graph initializer for which `replaced` holds
    serialized as `where(t)` (a small TensorProto: a reference to its data), the rest as it is."""
    if not any(replaced(t) for t in model.graph.initializer):
        return model.SerializeToString()
    return assemble_shells(model, lambda k, t: where(t).SerializeToString() if replaced(t) else None)
