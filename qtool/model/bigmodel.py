"""Loading a big model lazily: its graph without its big weights, and a store of where they lie.

A model of LAZY_BYTES or more (its .onnx file and external data together; qtool.model.load_model
decides) is read without its weights: every float initializer of the main graph holding
lazy.INLINE_BYTES or more becomes a lazy tensor (lazy.py: the references and their stores) referring to where its bytes lie, in the
.onnx file itself (a torch export's embedded weights: `read_header` leaves their raw data out,
reading the file through a memory map so that only the graph's pages are touched) or in the model's
external data files (any layout: one file, one per tensor: `load_lazy`). Graphs so loaded serialize
to a few megabytes: copies, shape inference and checks of them cost what the graph costs, not what
the weights weigh.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from onnx import TensorProto

from . import lazy, wire

try:  # onnx's own checks of an external data location, as its loader opens the file
    from onnx.external_data_helper import _open_external_data_fd
except ImportError:  # an onnx without it: ours (_open_external)
    _open_external_data_fd = None

LAZY_BYTES = 64 << 20  # models this large or larger are loaded lazily


def room_for_lazy(proto: onnx.ModelProto, more: int) -> bool:
    """Whether `more` bytes of lazy weights computed when read (lazy.Computed: weights a model computes from its
    constants, dequantized ones) keep the model's blocked layout: onnxruntime's NCHWc reorders serve models with
    convolutions, and qtool.runtime.nchwc gives up the layout for those whose lazy weights come to LAZY_BYTES or
    more (its optimized copy would hold them all: the rule kept, though the copy now holds none), which would change
    their calibration. Lazy weights counted as held in the graph (lazy.Computed.held) are not counted."""
    if not any(n.op_type in ("Conv", "ConvInteger") for n in proto.graph.node):  # ConvInteger: a Conv read as float (dynamic.py)
        return True
    # the float ones: a dynamically quantized model's integers, lazy too (load_lazy), are not in the float reading's sessions
    return sum(lazy.nbytes(t) for t in lazy.apart(proto) if t.data_type in lazy.FLOATS) + more < LAZY_BYTES


def _stat(fd: int) -> tuple:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


INTEGERS = (TensorProto.INT8, TensorProto.UINT8)  # the weights of a model onnxruntime quantized dynamically


def _strip_initializer(buf, value: int, stop: int, integers: bool = False) -> tuple[bytes, tuple[int, int, bool]] | None:
    """The initializer in buf[value:stop] as a graph field without its raw data, and (data offset,
    data length, whether it is an integer tensor), when it is a float tensor (with `integers`, or an int8/uint8
    one) of INLINE_BYTES or more in raw data; None otherwise."""
    raw = None
    data_type = 0
    kept = []
    for n, f, v, s in wire.fields(buf, value, stop):
        if n == wire.TENSOR_RAW_DATA:
            raw = (v, s - v)
            continue
        if n == wire.TENSOR_DATA_TYPE:
            data_type, _ = wire.varint(buf, v)
        kept.append((f, s))
    integer = integers and data_type in INTEGERS
    if raw is None or not (data_type in lazy.FLOATS or integer) or raw[1] < lazy.INLINE_BYTES:
        return None
    return wire.field(wire.GRAPH_INITIALIZER, b"".join(bytes(buf[f:s]) for f, s in kept)), (*raw, integer)


def _strip_graph(buf, start: int, end: int, found: list, integers: bool = False) -> bytes:
    """The graph in buf[start:end] without the raw data of its float initializers (with `integers`, and int8/uint8
    ones) of INLINE_BYTES or more; `found` gets (initializer index, data offset, data length, integer) for each."""
    parts = []
    k = 0
    for number, first, value, stop in wire.fields(buf, start, end):
        if number != wire.GRAPH_INITIALIZER:
            parts.append(buf[first:stop])
            continue
        stripped = _strip_initializer(buf, value, stop, integers)
        if stripped is None:
            parts.append(buf[first:stop])
        else:
            parts.append(stripped[0])
            found.append((k, *stripped[1]))
        k += 1
    return b"".join(bytes(p) for p in parts)


def read_header(path: Path, integers: bool = False) -> tuple[onnx.ModelProto, list, tuple]:
    """The model in `path` without the raw data of its big float initializers (with `integers`, and its big int8/uint8
    ones: see _strip_graph), read through a memory map (only the graph's pages are touched), and the file's identity."""
    fd = os.open(path, os.O_RDONLY)
    try:
        identity = _stat(fd)
        size = identity[2]
        found: list = []
        if size == 0:
            raise ValueError("empty file")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        buf = memoryview(mm)
        try:
            parts = []
            for number, first, value, stop in wire.fields(buf, 0, size):
                if number == wire.MODEL_GRAPH:
                    parts.append(wire.field(wire.MODEL_GRAPH, _strip_graph(buf, value, stop, found, integers)))
                else:
                    parts.append(bytes(buf[first:stop]))
            header = onnx.ModelProto.FromString(b"".join(parts))
        except BaseException:
            # views of the map that a parse stopped midway still holds (its generators' frames) keep the map from
            # closing: the error raised is the one that stopped it (a Ctrl-C: exit 130), not BufferError's "cannot
            # close exported pointers exist" (which calibrate reported as an unreadable model); the map goes with them
            with contextlib.suppress(BufferError):
                buf.release()
                mm.close()
            raise
        buf.release()
        mm.close()
    finally:
        os.close(fd)
    return header, found, identity


def _open_external(folder: str, location: str, name: str) -> int:
    """A read-only descriptor of an external data file, with onnx's checks of its location (relative,
    inside the model's folder: onnx.external_data_helper, as onnx's own loader opens it)."""
    if _open_external_data_fd is None:  # a relative path inside the folder
        if os.path.isabs(location) or ".." in Path(location).parts:
            raise ValueError(f"external data location {location!r} of {name!r} is not inside the model's folder")
        return os.open(os.path.join(folder, location), os.O_RDONLY)
    return _open_external_data_fd(folder, location, name, True)


def _external_info(t: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in t.external_data}
    length = int(info["length"]) if info.get("length") else None
    return info.get("location", ""), int(info.get("offset") or 0), length


class _ExternalFiles:
    """The external data files of one model, each stat'ed once: where a tensor's bytes lie."""

    def __init__(self, folder: str):
        self.folder = folder
        self.identities: dict[str, tuple] = {}

    def source(self, t: TensorProto) -> lazy.Source:
        location, offset, length = _external_info(t)
        fd = _open_external(self.folder, location, t.name)
        try:
            real = f"/proc/self/fd/{fd}"
            file = os.path.realpath(real) if os.path.isdir("/proc/self/fd") else os.path.join(self.folder, location)
            self.identities.setdefault(file, _stat(fd))
        finally:
            os.close(fd)
        if length is None:
            length = self.identities[file][2] - offset
        return lazy.Source(file, offset, length, True, self.identities[file])


def _read(t: TensorProto, where: lazy.Source) -> None:
    """Put the bytes of `where` in `t`, as onnx.external_data_helper.load_external_data_for_model does."""
    data = bytearray(where.length)
    where.bytes_into(memoryview(data))
    del t.external_data[:]
    t.raw_data = bytes(data)
    t.data_location = TensorProto.DEFAULT


def load_lazy(path: Path, header: onnx.ModelProto, found: list, identity: tuple, integers: bool = False) -> lazy.Store:
    """Make `header` (read_header's) refer to its weights where they lie: the big initializers
    stripped from the .onnx file, and the external data tensors of INLINE_BYTES or more (smaller ones
    are read into the graph, as onnx's loader reads them); the int8/uint8 ones read_header stripped (its
    `integers`) refer to the file too with `integers`, else are read into the graph. Returns the store of the
    references. (A model onnxruntime quantized dynamically is read as the float model it was made from, whose float
    weights are computed from its integers when read (qtool.model.dynamic): held in the graph, the integers were held
    for the whole calibration beside the session's: t5_title_decoder's 58 MB.)"""
    store = lazy.STORES.new()
    real = os.path.realpath(path)
    inits = header.graph.initializer
    for k, offset, length, integer in found:
        where = lazy.Source(real, offset, length, False, identity)
        if integer and not integers:
            _read(inits[k], where)
        else:
            lazy.refer(inits[k], store.add(where))
    files = _ExternalFiles(str(path.parent))
    for t in inits:
        if t.data_location == TensorProto.EXTERNAL and not lazy.is_lazy(t):
            where = files.source(t)
            if (t.data_type in lazy.FLOATS or integers and t.data_type in INTEGERS) and where.length >= lazy.INLINE_BYTES:
                lazy.refer(t, store.add(where))
            else:
                _read(t, where)
    for t in graph_tensors(header.graph, initializers=False):
        if t.data_location == TensorProto.EXTERNAL:
            _read(t, files.source(t))
    return store


def graph_tensors(graph: onnx.GraphProto, initializers: bool = True) -> Iterator[TensorProto]:
    """Every tensor a graph holds: its initializers (unless `initializers` is False: the main
    graph's, which the caller walks itself), sparse initializers and node attributes, subgraphs
    included (their initializers always)."""
    if initializers:
        yield from graph.initializer
    for s in graph.sparse_initializer:
        yield s.values
        yield s.indices
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for s in a.sparse_tensors:
                yield s.values
                yield s.indices
            if a.HasField("g"):
                yield from graph_tensors(a.g)
            for g in a.graphs:
                yield from graph_tensors(g)
