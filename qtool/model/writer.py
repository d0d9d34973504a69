"""Writing an exported model with lazy weights, of any size, without holding its weights in memory.

`ModelFile` is the file SerializeToString of the model with every value in place would give, byte
for byte, written piece by piece (wire.py: a tensor's data goes after its name, an initializer list
after the graph's name), each lazy tensor's value (lazy.py) read or computed when its turn comes.
When that would pass protobuf's 2 GiB (MAX_PROTO_BYTES), the initializers of INLINE_BYTES or more
go to one external data file beside the output, named after it with `.data` appended
(`bert.qdq.onnx.data`, `data_path`), in graph order, each at an offset that is a multiple of
DATA_ALIGNMENT (4096: runtimes may map them), with zero bytes between; smaller tensors stay in the
.onnx file. That is the layout onnx.save_model(..., save_as_external_data=True,
location=NAME + ".data") writes (onnx/external_data_helper.py), aligned.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ..errors import QtoolError
from . import lazy, wire

MAX_PROTO_BYTES = (1 << 31) - 1  # protobuf parses messages of at most 2 GiB
DATA_ALIGNMENT = 4096  # offsets of tensors in the external data qtool writes


def _shell(t: TensorProto) -> TensorProto:
    """A lazy tensor as the file records it, without its data."""
    what = lazy.entry(t)
    out = TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    out.ClearField("data_location")
    if what.external:
        out.data_location = TensorProto.DEFAULT
    return out


def _exact(t: TensorProto, n: int) -> memoryview:
    """The bytes of tensor `t`'s data, which must be `n`."""
    data = memoryview(np.ascontiguousarray(lazy.value(t)) if lazy.is_lazy(t) else t.raw_data).cast("B")
    if len(data) != n:
        raise RuntimeError(f"tensor {t.name!r}: {len(data)} bytes of data for {n}")
    return data


def _data_body(shell: bytes, n: int) -> int:
    """The size of a tensor's serialization: its shell and `n` bytes of raw data."""
    return len(shell) + len(wire.key(wire.TENSOR_RAW_DATA)) + len(wire.encode(n)) + n


def _field_size(body: int) -> int:
    """The size of an initializer field of `body` bytes."""
    return len(wire.key(wire.GRAPH_INITIALIZER)) + len(wire.encode(body)) + body


def _external_offsets(g: onnx.GraphProto) -> list[tuple[int, int] | None]:
    """Per initializer, (offset, length) in the external data file, or None for one kept in the .onnx file."""
    offsets: list[tuple[int, int] | None] = []
    size = 0
    for t in g.initializer:
        n = lazy.nbytes(t) if lazy.is_lazy(t) else (len(t.raw_data) if t.HasField("raw_data") else 0)
        if n >= lazy.INLINE_BYTES:
            start = -(-size // DATA_ALIGNMENT) * DATA_ALIGNMENT
            offsets.append((start, n))
            size = start + n
        else:
            offsets.append(None)
    return offsets


def _external_tensor(t: TensorProto, data_name: str, where: tuple[int, int]) -> bytes:
    """Initializer `t` serialized as external data of file `data_name` at `where` (offset, length)."""
    if lazy.is_lazy(t):
        out = _shell(t)
    else:
        out = TensorProto()
        out.CopyFrom(t)
        out.ClearField("raw_data")
    out.data_location = TensorProto.EXTERNAL
    for key, v in (("location", data_name), ("offset", str(where[0])), ("length", str(where[1]))):
        e = out.external_data.add()
        e.key, e.value = key, v
    return out.SerializeToString()


class ModelFile:
    """An exported model with lazy tensors, to write (`chunks`, `external_chunks`; qtool.fileio) or
    take as bytes (`bytes(f)`): the file SerializeToString of the model with every value in it would give."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.stores = {lazy.STORES.entry(t)[0] for t in lazy.lazy_tensors(model)}  # alive while this is
        self._plan: tuple | None = None
        self.trailer = b""  # fields appended to the file as they are (qtool.provenance's metadata)

    def _embedded(self) -> tuple[bytes, bytes, list, int]:
        """(model shell, graph shell, per initializer (shell, where its data goes, data bytes)
        or None for one serialized as it is, the graph's size)."""
        if self._plan is None:
            model_bytes, graph_bytes, _ = wire.shells(self.model, lambda k, t: None)
            plan, graph_len = [], len(graph_bytes)
            for t in self.model.graph.initializer:
                if lazy.is_lazy(t):
                    shell, n = _shell(t).SerializeToString(), lazy.nbytes(t)
                    plan.append((shell, wire.split(shell, wire.TENSOR_RAW_DATA), n))
                    body = _data_body(shell, n)
                else:
                    plan.append(None)
                    body = t.ByteSize()
                graph_len += _field_size(body)
            self._plan = (model_bytes, graph_bytes, plan, graph_len)
        return self._plan

    def embedded_size(self) -> int:
        model_bytes, _, _, graph_len = self._embedded()
        return len(model_bytes) + len(wire.key(wire.MODEL_GRAPH)) + len(wire.encode(graph_len)) + graph_len + len(self.trailer)

    def external(self) -> bool:
        """Whether the file needs external data (over protobuf's 2 GiB with every tensor in it)."""
        return self.embedded_size() > MAX_PROTO_BYTES

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The single file, piece by piece."""
        model_bytes, graph_bytes, plan, graph_len = self._embedded()
        m_at, g_at = wire.split(model_bytes, wire.MODEL_GRAPH), wire.split(graph_bytes, wire.GRAPH_INITIALIZER)
        yield model_bytes[:m_at] + wire.key(wire.MODEL_GRAPH) + wire.encode(graph_len) + graph_bytes[:g_at]
        for piece, t in zip(plan, self.model.graph.initializer):
            if piece is None:
                yield wire.field(wire.GRAPH_INITIALIZER, t.SerializeToString())
                continue
            shell, at, n = piece
            yield (wire.key(wire.GRAPH_INITIALIZER) + wire.encode(_data_body(shell, n)) + shell[:at]
                   + wire.key(wire.TENSOR_RAW_DATA) + wire.encode(n))
            yield _exact(t, n)
            yield shell[at:]
        yield graph_bytes[g_at:] + model_bytes[m_at:] + self.trailer

    def external_chunks(self, data_name: str) -> tuple[bytes, Iterator[bytes | memoryview]]:
        """(the .onnx file's bytes, the data file's pieces), the initializers of INLINE_BYTES or
        more in the data file `data_name`, beside the .onnx file (module doc)."""
        g = self.model.graph
        offsets = _external_offsets(g)
        header = wire.assemble_shells(
            self.model, lambda k, t: None if offsets[k] is None else _external_tensor(t, data_name, offsets[k]))

        def data_chunks():
            at = 0
            for t, where in zip(g.initializer, offsets):
                if where is None:
                    continue
                if where[0] > at:
                    yield bytes(where[0] - at)
                yield _exact(t, where[1])
                at = where[0] + where[1]

        return header + self.trailer, data_chunks()

    def __bytes__(self) -> bytes:
        """The single file's bytes (a model that needs external data cannot be one)."""
        if self.external():
            raise QtoolError(f"the exported model is {self.embedded_size() / 2**30:.1f} GiB, past the 2 GiB of one ONNX file; "
                             "write it to a file (its weights go to external data beside it)")
        return b"".join(self.chunks())


def data_path(path: str | os.PathLike) -> Path:
    """Where the external data of a model written to `path` goes (module doc)."""
    p = Path(path)
    return p.with_name(p.name + ".data")
