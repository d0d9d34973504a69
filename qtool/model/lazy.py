"""Lazy weights: initializers that stand in the graph for bytes kept elsewhere.

A big model (bigmodel.py) is loaded without the data of its float initializers of INLINE_BYTES or
more: each becomes a reference, an external-data location naming an entry of a Store
(`qtool-lazy:` store id / entry number), not a file. An entry is either bytes in a file (`Source`,
read with pread when asked for: nothing is memory-mapped, so nothing stays resident) or an array
computed at export (`Computed`: weights SmoothQuant scaled, weights converted to FP16), kept as long
as the store is. This module owns the stores and the references: reading a value (`value`), giving
a tensor a new one (`replace`, `retyped`, `rebuilt`). What reads the whole model resolves the
references in its own way: onnxruntime (spill.py), onnx's checker (checker.py), shape inference
(shapes.py), the writer (writer.py).

Why a reference names its store by a key in a string, resolved through STORES (the stores alive,
weakly held): a lazy tensor is a TensorProto like any other, and qtool copies models (CopyFrom of
whole models, onnx's version converter and onnxruntime's FP16 converter, which rebuild every tensor)
and reads their tensors one by one in a dozen modules (graph.Constants, the quantizers, the
targets). Only what a proto holds survives those copies, so the way back to the bytes must be in
it. A store lives as long as the LoadedModel that owns it (LoadedModel.store) or a writer of an
export made from it (writer.ModelFile); after that its references no longer resolve.

Models loaded whole have no reference: `value` is numpy_helper.to_array, `replace` CopyFrom.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import QtoolError

INLINE_BYTES = 1024  # smaller tensors stay in the graph (onnx.save_model's size_threshold)
PREFIX = "qtool-lazy:"  # the external-data location of a lazy tensor: PREFIX + store id + "/" + entry number
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


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
class Dequantized:
    """How a computed float weight is made from integers, as ONNX DequantizeLinear makes it: (integers() - zero_point)
    * scale in float32, per tensor (`axis` None: scalar scale and zero point) or along `axis` (1-D ones). A session may
    then hold the integers and make the float weight as it runs (qtool.model.dynamic.int8_weights)."""

    integers: Callable[[], np.ndarray]  # int8/uint8, in the float weight's shape
    scale: np.ndarray  # float32
    zero_point: np.ndarray  # the integers' type, scale's shape
    axis: int | None


@dataclass(frozen=True)
class Computed:
    """A tensor's value computed at export (kept in memory, read-only), or computed from another
    entry when read (`fn`)."""

    fn: Callable[[], np.ndarray]
    dtype: np.dtype
    external: bool = False  # as Source.external, for a value derived from such a tensor
    dequantized: Dequantized | None = None  # `fn` as DequantizeLinear computes it, when it is that
    # a value the model would hold in its graph but for the memory it takes (qtool.model.dynamic's weights beyond
    # bigmodel.room_for_lazy): what decides by a model's lazy weights (its blocked layout, room_for_lazy, int8_weights)
    # counts it as held in the graph (`held`), so that it decides as it did when the value was there
    held: bool = False


Entry = Source | Computed


class Store:
    """The entries of one lazily loaded model and of what exports make of it (made by STORES.new)."""

    def __init__(self, store_id: int):
        self.id = store_id
        self.entries: dict[int, Entry] = {}

    def add(self, entry: Entry) -> str:
        """A reference to `entry`: the external-data location a lazy tensor records."""
        n = len(self.entries)
        self.entries[n] = entry
        return f"{PREFIX}{self.id}/{n}"


class Stores:
    """The stores alive in this process by id, weakly held: what the location of a lazy tensor
    names (module doc)."""

    def __init__(self):
        self._alive: weakref.WeakValueDictionary[int, Store] = weakref.WeakValueDictionary()
        self._ids = itertools.count()

    def new(self) -> Store:
        store = Store(next(self._ids))
        self._alive[store.id] = store
        return store

    def entry(self, t: TensorProto) -> tuple[Store, Entry]:
        """The store and entry lazy tensor `t` refers to."""
        loc = location(t)
        store_id, _, n = loc[len(PREFIX):].partition("/")
        store = self._alive.get(int(store_id))
        if store is None:  # the model it came from is gone: a bug, not a user error
            raise RuntimeError(f"tensor {t.name!r} refers to weights that are no longer held ({loc})")
        return store, store.entries[int(n)]


STORES = Stores()


def location(t: TensorProto) -> str | None:
    """The external-data location `t` records, if any."""
    for e in t.external_data:
        if e.key == "location":
            return e.value
    return None


def is_lazy(t: TensorProto) -> bool:
    """Whether `t` is a reference of this module (its value is not in the graph)."""
    if t.data_location != TensorProto.EXTERNAL:
        return False
    loc = location(t)
    return loc is not None and loc.startswith(PREFIX)


def entry(t: TensorProto) -> Entry:
    """What lazy tensor `t` refers to."""
    return STORES.entry(t)[1]


def lazy_tensors(model: onnx.ModelProto) -> list[TensorProto]:
    return [t for t in model.graph.initializer if is_lazy(t)]


def held(t: TensorProto) -> bool:
    """Whether `t` is in the graph, or lazy only for memory (Computed.held): counted as held in the graph."""
    if not is_lazy(t):
        return True
    what = entry(t)
    return isinstance(what, Computed) and what.held


def apart(model: onnx.ModelProto) -> list[TensorProto]:
    """The lazy tensors of `model` not counted as held in its graph (`held`)."""
    return [t for t in lazy_tensors(model) if not held(t)]


def _dtype(t: TensorProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))


def nbytes(t: TensorProto) -> int:
    """The bytes of a lazy tensor's value."""
    return int(np.prod(t.dims, dtype=np.int64)) * _dtype(t).itemsize


def array(t: TensorProto, what: Entry) -> np.ndarray:
    """The value of `t` (its type and shape) that entry `what` holds."""
    if isinstance(what, Source):
        out = np.empty(int(np.prod(t.dims, dtype=np.int64)), dtype=_dtype(t))
        if out.nbytes != what.length:
            raise RuntimeError(f"tensor {t.name!r}: {what.length} bytes for {out.nbytes}")
        what.bytes_into(memoryview(out).cast("B"))
        return out.reshape(tuple(t.dims))
    value = what.fn()
    if value.dtype != _dtype(t) or value.size != int(np.prod(t.dims, dtype=np.int64)):
        raise RuntimeError(f"tensor {t.name!r}: a computed value of {value.dtype} {value.shape} for {list(t.dims)}")
    return value.reshape(tuple(t.dims))


def value(t: TensorProto) -> np.ndarray:
    """A tensor's value: numpy_helper.to_array for one in the graph, read or computed for a lazy one
    (a read-only array when it is kept in memory)."""
    if is_lazy(t):
        return array(t, entry(t))
    return numpy_helper.to_array(t)


def read_value(t: TensorProto, folder=None) -> np.ndarray | None:
    """`value(t)`, or for an external tensor not loaded its data read from `folder` (None without one)."""
    if has_value(t):
        return value(t)
    return None if folder is None else numpy_helper.to_array(t, base_dir=str(folder))


def has_value(t: TensorProto) -> bool:
    """Whether `value(t)` can give the value: in the graph, or lazy (not an external file of its own)."""
    return t.data_location != TensorProto.EXTERNAL or is_lazy(t)


def _kept(values: np.ndarray) -> Computed:
    values = np.array(values, copy=True)
    values.setflags(write=False)
    return Computed(lambda: values, values.dtype)


def replace(t: TensorProto, values: np.ndarray) -> None:
    """Give `t` the value `values` (its name kept), as CopyFrom(numpy_helper.from_array(values, t.name))
    does; a lazy tensor stays out of the graph when the array is INLINE_BYTES or more."""
    if is_lazy(t) and values.nbytes >= INLINE_BYTES:
        store, what = STORES.entry(t)
        name = t.name
        t.Clear()  # then the fields numpy_helper.from_array sets, but the data
        t.name, t.data_type = name, helper.np_dtype_to_tensor_dtype(values.dtype)
        t.dims.extend(values.shape)
        kept = _kept(values)
        refer(t, store.add(dataclasses.replace(kept, held=True) if isinstance(what, Computed) and what.held else kept))
        return
    t.CopyFrom(numpy_helper.from_array(values, t.name))


def _relocate(t: TensorProto, loc: str) -> None:
    for e in t.external_data:
        if e.key == "location":
            e.value = loc


def retyped(model: onnx.ModelProto, convert: Callable[[np.ndarray], np.ndarray], old: int, new: int) -> None:
    """After a converter changed the declared type of lazy tensors from `old` to `new` without
    touching their data (it cannot see it), give each of them `convert` of its value (in place)."""
    old_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(old))
    for t in lazy_tensors(model):
        if t.data_type != new:
            continue
        store, what = STORES.entry(t)
        count = int(np.prod(t.dims, dtype=np.int64))
        if (what.length != count * old_dtype.itemsize) if isinstance(what, Source) else what.dtype != old_dtype:
            continue  # the data has the new type already
        source = TensorProto()
        source.CopyFrom(t)
        source.data_type = old

        def fn(source=source, what=what):
            return np.ascontiguousarray(convert(array(source, what)))

        _relocate(t, store.add(Computed(fn, _dtype(t), what.external, held=isinstance(what, Computed) and what.held)))


def rebuilt(model: onnx.ModelProto) -> None:
    """After onnx's version converter, which rebuilds every tensor without its data_location field
    (a tensor that came from an external data file no longer records DEFAULT): the lazy tensors too."""
    for t in lazy_tensors(model):
        store, what = STORES.entry(t)
        if what.external:
            _relocate(t, store.add(dataclasses.replace(what, external=False)))


def refer(t: TensorProto, loc: str) -> None:
    """Make `t` external data at `loc`, without its data."""
    del t.external_data[:]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", loc


def placeholder(t: TensorProto, loc: str) -> TensorProto:
    """`t` as external data at `loc`, without its data (copied one tensor at a time)."""
    out = TensorProto()
    out.CopyFrom(t)
    refer(out, loc)
    return out


def big(t: TensorProto) -> bool:
    """An initializer holding INLINE_BYTES or more in the graph."""
    return t.HasField("raw_data") and t.ByteSize() >= INLINE_BYTES
