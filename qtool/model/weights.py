"""Big models: weights kept out of protobuf, read where they lie, written beside the output.

A model of LAZY_BYTES or more (its .onnx file and external data together) is loaded without its
weights: every float initializer of the main graph holding INLINE_BYTES or more becomes a
reference, in the graph, to where its bytes lie, in the .onnx file itself (a torch export's
embedded weights) or in the model's external data files (any layout: one file, one per tensor).
The reference is an external-data location that names an entry of this module (`qtool-lazy:`),
not a file: reading the value (`value`), handing the graph to onnxruntime (`runnable`, which
points onnxruntime at the same bytes), checking it (`check`) and writing it (`ModelFile`) resolve
it. An entry is either bytes in a file (`Source`, read with pread when asked for: nothing is
memory-mapped, so nothing stays resident) or an array computed at export (`Computed`: weights
SmoothQuant scaled, weights converted to FP16), kept as long as the model it belongs to is.
Graphs so loaded serialize to a few megabytes: copies, shape inference and checks of them cost
what the graph costs, not what the weights weigh.

Smaller models are loaded whole, as they always were; everything here then does what it did
(`value` is numpy_helper.to_array, `ModelFile` is never made).

Writing (`ModelFile`): the file is what `SerializeToString` of the model with every value in
place would give, byte for byte, written piece by piece (protobuf writes a message's fields in
field-number order, so a tensor's data goes after its name, field 8, and an initializer list
after the graph's name, field 2). When that would pass protobuf's 2 GiB (MAX_PROTO_BYTES), the
initializers of INLINE_BYTES or more go to one external data file beside the output, named after
it with `.data` appended (`bert.qdq.onnx.data`), in graph order, each at an offset that is a
multiple of DATA_ALIGNMENT (4096: runtimes may map them), with zero bytes between; smaller tensors
stay in the .onnx file. That is the layout onnx.save_model(..., save_as_external_data=True,
location=NAME + ".data") writes (onnx/external_data_helper.py), aligned.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import QtoolError

LAZY_BYTES = 64 << 20  # models this large or larger are loaded lazily
INLINE_BYTES = 1024  # smaller tensors stay in the graph (onnx.save_model's size_threshold)
MAX_PROTO_BYTES = (1 << 31) - 1  # protobuf parses messages of at most 2 GiB
DATA_ALIGNMENT = 4096  # offsets of tensors in the external data qtool writes
PREFIX = "qtool-lazy:"  # the external-data location of a lazy tensor: PREFIX + store id + "/" + entry number
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


# ---------------------------------------------------------------- protobuf's wire format
# (protobuf.dev/programming-guides/encoding: a field is a varint key, number << 3 | wire type, then
# a varint (0), 8 bytes (1), a varint length and that many bytes (2) or 4 bytes (5))

def _varint(buf, pos: int) -> tuple[int, int]:
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


def _encode(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int = 2) -> bytes:
    return _encode(number << 3 | wire)


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field, start of its value, end) of each field of the message in buf[start:end]."""
    pos = start
    while pos < end:
        first = pos
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value = pos
            _, pos = _varint(buf, pos)
        elif wire == 2:
            length, value = _varint(buf, pos)
            pos = value + length
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        else:
            raise ValueError(f"wire type {wire} (groups) in an ONNX file")
        if pos > end:
            raise ValueError("a field runs past its message")
        yield key >> 3, first, value, pos


def _split(message: bytes, number: int) -> int:
    """Where in a serialized message a field `number` goes: before the first field numbered higher."""
    for n, first, _, _ in _fields(message, 0, len(message)):
        if n > number:
            return first
    return len(message)


# ---------------------------------------------------------------- entries


@dataclass(frozen=True)
class Source:
    """A tensor's bytes in a file: the model's .onnx (`external` False) or one of its external data
    files (True: written back in one file, the tensor records data_location DEFAULT as onnx's
    loader leaves it)."""

    path: str
    offset: int
    length: int
    external: bool
    identity: tuple  # (device, inode, size, mtime) when loaded: the file must not change under qtool

    def bytes_into(self, out: memoryview) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise QtoolError(f"cannot read the model's weights from {self.path!r}: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self.identity:
                raise QtoolError(f"the model file {self.path!r} changed while qtool was reading it; run the command again")
            done = 0
            while done < self.length:
                n = os.preadv(fd, [out[done:]], self.offset + done)
                if n <= 0:
                    raise QtoolError(f"the model file {self.path!r} ends before its weights do; check the file is complete")
                done += n
        finally:
            os.close(fd)


@dataclass(frozen=True)
class Computed:
    """A tensor's value computed at export (kept in memory, read-only), or computed from another
    entry when read (`fn`)."""

    fn: Callable[[], np.ndarray]
    dtype: np.dtype
    external: bool = False  # as Source.external, for a value derived from such a tensor


class Store:
    """The entries of one lazily loaded model and of what exports make of it. It lives as long
    as a graph that refers to it is alive in qtool (LoadedModel.weights)."""

    _ids = itertools.count()

    def __init__(self):
        self.id = next(self._ids)
        self.entries: dict[int, Source | Computed] = {}
        _STORES[self.id] = self

    def add(self, entry: Source | Computed) -> str:
        n = len(self.entries)
        self.entries[n] = entry
        return f"{PREFIX}{self.id}/{n}"


_STORES: weakref.WeakValueDictionary[int, Store] = weakref.WeakValueDictionary()


def _location(t: TensorProto) -> str | None:
    for e in t.external_data:
        if e.key == "location":
            return e.value
    return None


def is_lazy(t: TensorProto) -> bool:
    """Whether `t` is a reference of this module (its value is not in the graph)."""
    if t.data_location != TensorProto.EXTERNAL:
        return False
    loc = _location(t)
    return loc is not None and loc.startswith(PREFIX)


def _entry(t: TensorProto) -> tuple[Store, Source | Computed]:
    loc = _location(t)
    store_id, _, n = loc[len(PREFIX):].partition("/")
    store = _STORES.get(int(store_id))
    if store is None:  # the model it came from is gone: a bug, not a user error
        raise RuntimeError(f"tensor {t.name!r} refers to weights that are no longer held ({loc})")
    return store, store.entries[int(n)]


def _dtype(t: TensorProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))


def nbytes(t: TensorProto) -> int:
    """The bytes of a lazy tensor's value."""
    return int(np.prod(t.dims, dtype=np.int64)) * _dtype(t).itemsize


def _array(t: TensorProto, entry: Source | Computed) -> np.ndarray:
    if isinstance(entry, Source):
        out = np.empty(int(np.prod(t.dims, dtype=np.int64)), dtype=_dtype(t))
        if out.nbytes != entry.length:
            raise RuntimeError(f"tensor {t.name!r}: {entry.length} bytes for {out.nbytes}")
        entry.bytes_into(memoryview(out).cast("B"))
        return out.reshape(tuple(t.dims))
    value = entry.fn()
    if value.dtype != _dtype(t) or value.size != int(np.prod(t.dims, dtype=np.int64)):
        raise RuntimeError(f"tensor {t.name!r}: a computed value of {value.dtype} {value.shape} for {list(t.dims)}")
    return value.reshape(tuple(t.dims))


def value(t: TensorProto) -> np.ndarray:
    """A tensor's value: numpy_helper.to_array for one in the graph, read or computed for a lazy one
    (a read-only array when it is kept in memory)."""
    if is_lazy(t):
        return _array(t, _entry(t)[1])
    return numpy_helper.to_array(t)


def has_value(t: TensorProto) -> bool:
    """Whether `value(t)` can give the value: in the graph, or lazy (not an external file of its own)."""
    return t.data_location != TensorProto.EXTERNAL or is_lazy(t)


def _kept(array: np.ndarray) -> Computed:
    array = np.array(array, copy=True)
    array.setflags(write=False)
    return Computed(lambda: array, array.dtype)


def replace(t: TensorProto, array: np.ndarray) -> None:
    """Give `t` the value `array` (its name kept), as CopyFrom(numpy_helper.from_array(array, t.name))
    does; a lazy tensor stays out of the graph when the array is INLINE_BYTES or more."""
    if is_lazy(t) and array.nbytes >= INLINE_BYTES:
        store, _ = _entry(t)
        name = t.name
        t.Clear()  # then the fields numpy_helper.from_array sets, but the data
        t.name, t.data_type = name, helper.np_dtype_to_tensor_dtype(array.dtype)
        t.dims.extend(array.shape)
        _refer(t, store.add(_kept(array)))
        return
    t.CopyFrom(numpy_helper.from_array(array, t.name))


def retyped(model: onnx.ModelProto, convert: Callable[[np.ndarray], np.ndarray], old: int, new: int) -> None:
    """After a converter changed the declared type of lazy tensors from `old` to `new` without
    touching their data (it cannot see it), give each of them `convert` of its value (in place)."""
    old_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(old))
    for t in lazy_tensors(model):
        if t.data_type != new:
            continue
        store, entry = _entry(t)
        count = int(np.prod(t.dims, dtype=np.int64))
        if (entry.length != count * old_dtype.itemsize) if isinstance(entry, Source) else entry.dtype != old_dtype:
            continue  # the data has the new type already
        source = TensorProto()
        source.CopyFrom(t)
        source.data_type = old

        def fn(source=source, entry=entry):
            return np.ascontiguousarray(convert(_array(source, entry)))

        loc = store.add(Computed(fn, _dtype(t), entry.external))
        for e in t.external_data:
            if e.key == "location":
                e.value = loc


def rebuilt(model: onnx.ModelProto) -> None:
    """After onnx's version converter, which rebuilds every tensor without its data_location field
    (a tensor that came from an external data file no longer records DEFAULT): the lazy tensors too."""
    for t in lazy_tensors(model):
        store, entry = _entry(t)
        if entry.external:
            for e in t.external_data:
                if e.key == "location":
                    e.value = store.add(dataclasses.replace(entry, external=False))


def _refer(t: TensorProto, location: str) -> None:
    del t.external_data[:]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", location


def lazy_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    return [t for t in model.graph.initializer if is_lazy(t)]


# ---------------------------------------------------------------- loading


def _stat(fd: int) -> tuple:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _strip_graph(buf, start: int, end: int, found: list) -> bytes:
    """The graph in buf[start:end] without the raw data of its float initializers of INLINE_BYTES
    or more; `found` gets (initializer index, data offset, data length) for each."""
    parts = []
    k = 0
    for number, first, value, stop in _fields(buf, start, end):
        if number != 5:
            parts.append(buf[first:stop])
            continue
        raw = None
        data_type = 0
        kept = []
        for n, f, v, s in _fields(buf, value, stop):
            if n == 9:
                raw = (v, s - v)
                continue
            if n == 2:
                data_type, _ = _varint(buf, v)
            kept.append((f, s))
        if raw is not None and data_type in FLOATS and raw[1] >= INLINE_BYTES:
            body = b"".join(bytes(buf[f:s]) for f, s in kept)
            parts.append(_key(5) + _encode(len(body)) + body)
            found.append((k, *raw))
        else:
            parts.append(buf[first:stop])
        k += 1
    return b"".join(bytes(p) for p in parts)


def read_header(path: Path) -> tuple[onnx.ModelProto, list, tuple]:
    """The model in `path` without the raw data of its big float initializers (see _strip_graph),
    read through a memory map (only the graph's pages are touched), and the file's identity."""
    fd = os.open(path, os.O_RDONLY)
    try:
        identity = _stat(fd)
        size = identity[2]
        found: list = []
        if size == 0:
            raise ValueError("empty file")
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                parts = []
                for number, first, value, stop in _fields(buf, 0, size):
                    if number == 7:
                        graph = _strip_graph(buf, value, stop, found)
                        parts.append(_key(7) + _encode(len(graph)) + graph)
                    else:
                        parts.append(bytes(buf[first:stop]))
                header = onnx.ModelProto.FromString(b"".join(parts))
            finally:
                buf.release()
    finally:
        os.close(fd)
    return header, found, identity


def _open_external(folder: str, location: str, name: str) -> int:
    """A read-only descriptor of an external data file, with onnx's checks of its location (relative,
    inside the model's folder: onnx.external_data_helper, as onnx's own loader opens it)."""
    try:
        from onnx.external_data_helper import _open_external_data_fd
    except ImportError:  # an onnx without it: a relative path inside the folder
        if os.path.isabs(location) or ".." in Path(location).parts:
            raise ValueError(f"external data location {location!r} of {name!r} is not inside the model's folder") from None
        return os.open(os.path.join(folder, location), os.O_RDONLY)
    return _open_external_data_fd(folder, location, name, True)


def _external_info(t: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in t.external_data}
    length = int(info["length"]) if info.get("length") else None
    return info.get("location", ""), int(info.get("offset") or 0), length


def load_lazy(path: Path, header: onnx.ModelProto, found: list, identity: tuple) -> Store:
    """Make `header` (read_header's) refer to its weights where they lie: the big initializers
    stripped from the .onnx file, and the external data tensors of INLINE_BYTES or more (smaller ones
    are read into the graph, as onnx's loader reads them). Returns the store of the references."""
    store = Store()
    real = os.path.realpath(path)
    inits = header.graph.initializer
    for k, offset, length in found:
        _refer(inits[k], store.add(Source(real, offset, length, False, identity)))
    identities: dict[str, tuple] = {}
    folder = str(path.parent)

    def source(t: TensorProto) -> Source:
        location, offset, length = _external_info(t)
        fd = _open_external(folder, location, t.name)
        try:
            file = os.path.realpath(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else os.path.join(folder, location)
            identities.setdefault(file, _stat(fd))
        finally:
            os.close(fd)
        if length is None:
            length = identities[file][2] - offset
        return Source(file, offset, length, True, identities[file])

    def read(t: TensorProto, where: Source) -> None:  # as onnx.external_data_helper.load_external_data_for_model
        data = bytearray(where.length)
        where.bytes_into(memoryview(data))
        del t.external_data[:]
        t.raw_data = bytes(data)
        t.data_location = TensorProto.DEFAULT

    for t in inits:
        if t.data_location == TensorProto.EXTERNAL and not is_lazy(t):
            where = source(t)
            if t.data_type in FLOATS and where.length >= INLINE_BYTES:
                _refer(t, store.add(where))
            else:
                read(t, where)
    for t in graph_tensors(header.graph, initializers=False):
        if t.data_location == TensorProto.EXTERNAL:
            read(t, source(t))
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


# ---------------------------------------------------------------- onnxruntime, checks, shape inference


def _without(message, empty, name: str):
    """`empty` given every field of `message` but `name` (copied field by field: the one left out is never copied)."""
    for field, v in message.ListFields():
        if field.name == name:
            continue
        if field.is_repeated:
            getattr(empty, field.name).extend(v)
        elif field.message_type is not None:
            getattr(empty, field.name).CopyFrom(v)
        else:
            setattr(empty, field.name, v)
    return empty


def _serialize_shells(model: onnx.ModelProto, tensor: Callable[[int, TensorProto], bytes | None]) -> list:
    """The model's serialization as pieces, each main-graph initializer serialized by
    `tensor(index, t)` (None: as it is)."""
    g = model.graph
    graph_bytes = _without(g, onnx.GraphProto(), "initializer").SerializeToString()
    model_bytes = _without(model, onnx.ModelProto(), "graph").SerializeToString()
    inits = []
    for k, t in enumerate(g.initializer):
        encoded = tensor(k, t)
        inits.append(_key(5) + _encode(len(encoded)) + encoded if encoded is not None else None)
    return [model_bytes, graph_bytes, inits]


def _big(t: TensorProto) -> bool:
    """An initializer holding INLINE_BYTES or more in the graph."""
    return t.HasField("raw_data") and t.ByteSize() >= INLINE_BYTES


def _big_float(t: TensorProto) -> bool:
    return t.data_type in FLOATS and _big(t)


def plain_bytes(model: onnx.ModelProto, where: Callable[[TensorProto], TensorProto],
                also: Callable[[TensorProto], bool] | None = None) -> bytes:
    """The model's serialization with each lazy main-graph initializer (and each for which `also`
    holds) replaced by `where(t)` (a small TensorProto: an external reference), the rest as it is."""
    def replaced(t: TensorProto) -> bool:
        return is_lazy(t) or (also is not None and also(t))

    if not any(replaced(t) for t in model.graph.initializer):
        return model.SerializeToString()
    model_bytes, graph_bytes, inits = _serialize_shells(
        model, lambda k, t: where(t).SerializeToString() if replaced(t) else None)
    g = model.graph
    pieces = [p if p is not None else _key(5) + _encode(g.initializer[k].ByteSize()) + g.initializer[k].SerializeToString()
              for k, p in enumerate(inits)]
    return _assemble(model_bytes, graph_bytes, pieces)


def _assemble(model_bytes: bytes, graph_bytes: bytes, inits: list[bytes]) -> bytes:
    at = _split(graph_bytes, 5)
    graph = graph_bytes[:at] + b"".join(inits) + graph_bytes[at:]
    at = _split(model_bytes, 7)
    return model_bytes[:at] + _key(7) + _encode(len(graph)) + graph + model_bytes[at:]


class Spill:
    """The lazy tensors computed in memory, written to a file onnxruntime can open (in qtool's
    temporary directory, qtool.scratch); removed by close()."""

    def __init__(self):
        self.fd: int | None = None
        self.size = 0
        self.path = ""

    def put(self, data: np.ndarray) -> tuple[str, int]:
        from .. import scratch

        if self.fd is None:
            self.fd, self.path = scratch.open_file("weights.bin")
        offset = -(-self.size // DATA_ALIGNMENT) * DATA_ALIGNMENT
        view = memoryview(np.ascontiguousarray(data)).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.size = offset + len(view)
        return self.path, offset

    def close(self) -> None:
        if self.fd is not None:
            from .. import scratch

            scratch.close_file(self.fd, self.path)
            self.fd = None


def runnable(model: onnx.ModelProto) -> tuple[bytes, Spill | None]:
    """The model's bytes for onnxruntime, with its external-data folder "/" when it has lazy
    tensors: each refers to its file by a path from the root (the .onnx or external data file it
    lies in, or, for one computed in memory, the Spill file, to keep open until the session is
    made). (bytes, None) for a model without lazy tensors."""
    if not lazy_tensors(model):
        return model.SerializeToString(), None
    spill = Spill()

    def where(t: TensorProto) -> TensorProto:
        _, entry = _entry(t)
        out = TensorProto()
        out.CopyFrom(t)
        if isinstance(entry, Source):
            path, offset, length = entry.path, entry.offset, entry.length
        else:
            data = _array(t, entry)
            path, offset = spill.put(data)
            length = data.nbytes
        del out.external_data[:]
        for key, v in (("location", os.path.relpath(path, "/")), ("offset", str(offset)), ("length", str(length))):
            e = out.external_data.add()
            e.key, e.value = key, v
        return out

    try:
        return plain_bytes(model, where), spill
    except BaseException:
        spill.close()
        raise


def weightless(model: onnx.ModelProto) -> bytes:
    """The model's serialization with the data of every big float initializer left out (lazy
    ones, and in-graph ones of INLINE_BYTES or more, shown as external data of no file): what
    shape inference reads, at the size of the graph."""
    return plain_bytes(model, lambda t: _placeholder(t, "qtool-weightless"), _big_float)


def _placeholder(t: TensorProto, location: str) -> TensorProto:
    """`t` as external data at `location`, without its data (copied one tensor at a time)."""
    out = TensorProto()
    out.CopyFrom(t)
    _refer(out, location)
    return out


_INFERRED: dict[str, onnx.ModelProto | None] = {}
_INFERRED_KEEP = 4


def inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnx's shape inference (strict_mode off) of the model without its weight data, or None when
    it fails; cached by the graph's content, so every step of a command that asks about one graph
    shares one inference. The result holds no weight data: read types and shapes from it."""
    data = weightless(model)
    key = hashlib.sha256(data).hexdigest()
    if key not in _INFERRED:
        try:
            result = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data), strict_mode=False)
        except Exception:  # a model onnx cannot infer (custom ops): what the file declares
            result = None
        if len(_INFERRED) >= _INFERRED_KEEP:
            _INFERRED.pop(next(iter(_INFERRED)))
        _INFERRED[key] = result
    return _INFERRED[key]


def with_inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.shape_inference.infer_shapes(model, strict_mode=False) (raising as it does), computed on
    the model without its weight data: a new model, the weights those of `model`."""
    result = inferred(model)
    if result is None:
        onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(weightless(model)), strict_mode=False)  # raises
        raise RuntimeError("shape inference failed")
    out = onnx.ModelProto()
    out.CopyFrom(result)
    for mine, theirs in zip(out.graph.initializer, model.graph.initializer):
        if _location(mine) == "qtool-weightless":
            mine.CopyFrom(theirs)
    return out


def check(model: onnx.ModelProto | bytes) -> None:
    """onnx.checker.check_model(model) (raising as it does); a model with lazy tensors is checked
    without the data of its initializers of INLINE_BYTES or more (the checker only asks that an
    external data file exists: each reference names an empty one in a scratch folder)."""
    if isinstance(model, bytes) or not lazy_tensors(model):
        onnx.checker.check_model(model)
        return
    from .. import scratch

    folder = Path(scratch.directory()) / f"check-{os.urandom(4).hex()}"
    folder.mkdir()
    try:
        (folder / "data").touch()
        (folder / "model.onnx").write_bytes(plain_bytes(model, lambda t: _placeholder(t, "data"), _big))
        onnx.checker.check_model(str(folder / "model.onnx"))
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


# ---------------------------------------------------------------- writing


def _shell(t: TensorProto) -> TensorProto:
    """A lazy tensor as the file records it, without its data."""
    _, entry = _entry(t)
    out = TensorProto()
    out.CopyFrom(t)
    del out.external_data[:]
    out.ClearField("data_location")
    if entry.external:
        out.data_location = TensorProto.DEFAULT
    return out


class ModelFile:
    """An exported model with lazy tensors, to write (`chunks`, `external_chunks`; qtool.fileio) or
    take as bytes (`bytes(f)`): the file SerializeToString of the model with every value in it would give."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.stores = {_entry(t)[0] for t in lazy_tensors(model)}  # alive while this is
        self._plan: tuple | None = None

    def _embedded(self) -> tuple[bytes, bytes, list, int]:
        """(model shell, graph shell, per initializer (shell, where its data goes, data bytes)
        or None for one serialized as it is, the graph's size)."""
        if self._plan is None:
            model_bytes, graph_bytes, _ = _serialize_shells(self.model, lambda k, t: None)
            plan, graph_len = [], len(graph_bytes)
            for t in self.model.graph.initializer:
                if is_lazy(t):
                    shell, n = _shell(t).SerializeToString(), nbytes(t)
                    plan.append((shell, _split(shell, 9), n))
                    body = len(shell) + len(_key(9)) + len(_encode(n)) + n
                else:
                    plan.append(None)
                    body = t.ByteSize()
                graph_len += len(_key(5)) + len(_encode(body)) + body
            self._plan = (model_bytes, graph_bytes, plan, graph_len)
        return self._plan

    def embedded_size(self) -> int:
        model_bytes, _, _, graph_len = self._embedded()
        return len(model_bytes) + len(_key(7)) + len(_encode(graph_len)) + graph_len

    def external(self) -> bool:
        """Whether the file needs external data (over protobuf's 2 GiB with every tensor in it)."""
        return self.embedded_size() > MAX_PROTO_BYTES

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The single file, piece by piece."""
        model_bytes, graph_bytes, plan, graph_len = self._embedded()
        m_at, g_at = _split(model_bytes, 7), _split(graph_bytes, 5)
        yield model_bytes[:m_at] + _key(7) + _encode(graph_len) + graph_bytes[:g_at]
        for piece, t in zip(plan, self.model.graph.initializer):
            if piece is None:
                data = t.SerializeToString()
                yield _key(5) + _encode(len(data)) + data
                continue
            shell, at, n = piece
            body = len(shell) + len(_key(9)) + len(_encode(n)) + n
            yield _key(5) + _encode(body) + shell[:at] + _key(9) + _encode(n)
            yield _exact(t, n)
            yield shell[at:]
        yield graph_bytes[g_at:] + model_bytes[m_at:]

    def external_chunks(self, data_name: str) -> tuple[bytes, Iterator[bytes | memoryview]]:
        """(the .onnx file's bytes, the data file's pieces), the initializers of INLINE_BYTES or
        more in the data file `data_name`, beside the .onnx file (module doc)."""
        g = self.model.graph
        offsets: list[tuple[int, int] | None] = []
        size = 0
        for t in g.initializer:
            n = nbytes(t) if is_lazy(t) else (len(t.raw_data) if t.HasField("raw_data") else 0)
            if n >= INLINE_BYTES:
                start = -(-size // DATA_ALIGNMENT) * DATA_ALIGNMENT
                offsets.append((start, n))
                size = start + n
            else:
                offsets.append(None)

        def tensor(k, t):
            if offsets[k] is None:
                return None
            if is_lazy(t):
                out = _shell(t)
            else:
                out = TensorProto()
                out.CopyFrom(t)
                out.ClearField("raw_data")
            out.data_location = TensorProto.EXTERNAL
            for key, v in (("location", data_name), ("offset", str(offsets[k][0])), ("length", str(offsets[k][1]))):
                e = out.external_data.add()
                e.key, e.value = key, v
            return out.SerializeToString()

        model_bytes, graph_bytes, pieces = _serialize_shells(self.model, tensor)
        header = _assemble(model_bytes, graph_bytes, [
            p if p is not None else _key(5) + _encode(g.initializer[k].ByteSize()) + g.initializer[k].SerializeToString()
            for k, p in enumerate(pieces)])

        def data_chunks():
            at = 0
            for t, where in zip(g.initializer, offsets):
                if where is None:
                    continue
                if where[0] > at:
                    yield bytes(where[0] - at)
                yield _exact(t, where[1])
                at = where[0] + where[1]

        return header, data_chunks()

    def __bytes__(self) -> bytes:
        """The single file's bytes (a model that needs external data cannot be one)."""
        if self.external():
            raise QtoolError(f"the exported model is {self.embedded_size() / 2**30:.1f} GiB, past the 2 GiB of one ONNX file; "
                             "write it to a file (its weights go to external data beside it)")
        return b"".join(self.chunks())


def _exact(t: TensorProto, n: int) -> memoryview:
    """The bytes of tensor `t`'s data, which must be `n`."""
    data = memoryview(np.ascontiguousarray(value(t)) if is_lazy(t) else t.raw_data).cast("B")
    if len(data) != n:
        raise RuntimeError(f"tensor {t.name!r}: {len(data)} bytes of data for {n}")
    return data


def data_path(path: str | os.PathLike) -> Path:
    """Where the external data of a model written to `path` goes (module doc)."""
    p = Path(path)
    return p.with_name(p.name + ".data")
