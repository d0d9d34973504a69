"""onnx's shape inference of a model without its weight data, shared by every step of a command.

Shape inference reads the graph, not the weights: it runs on the model's serialization with the
data of every big weight left out (`weightless`: lazy initializers, and in-graph ones of INLINE_BYTES
or more of any type but those shapes, axes and indices are read from: the float weights of a model,
the 8-bit ones of an export or of a model shipped quantized), at the size of the graph. The results are cached by the graph's content
(`INFERENCES`): the model module's tensor types and sizes, SmoothQuant's ranks and the FP16
converter ask about the same few graphs in one command and share one inference each. The cache is
one per process, not one per loaded model, because those steps are handed bare protos (copies and
edits of the loaded model's), which hold no link to where they came from; keyed by content, a
cached result is right for any proto it is found for.

onnx's shape inference is C++ that can abort the process (an assertion: std::clamp in Slice's
inference on a negative dimension, onnx 1.23) where a model's shapes are inconsistent, which a
Python `except` cannot catch: it runs in a child process (`isolated`: a new interpreter holding
onnx's extension alone, reused within a command, or a fork), and a child that dies is an inference
that failed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading

import onnx

from . import lazy, wire

WEIGHTLESS = "qtool-weightless"  # the external-data location of the initializers weightless leaves out


# The types whose values onnx's shape inference may read from a constant input (a shape, axes, pads, indices, a
# condition) stay in the graph; the data of every other type is a weight's, which inference never reads (data
# propagation, _infer_propagated, follows integer shape values only).
_READ_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64,
                         onnx.TensorProto.BOOL, onnx.TensorProto.STRING})


def _big_weight(t: onnx.TensorProto) -> bool:
    return t.data_type not in _READ_TYPES and lazy.big(t)


def weightless(model: onnx.ModelProto) -> bytes:
    """The model's serialization with the data of every big weight left out (lazy initializers, and
    in-graph ones of INLINE_BYTES or more but of the types shapes are read from, shown as external
    data of no file: the float weights, the 8-bit ones of an export, 433 MB of BERT-large's OpenVINO
    file), and of every big float Constant node of the main graph (Paddle's exports hold their
    weights so): what shape inference reads, at the size of the graph (ppocrv5_textline_ori: 6.8 MB
    -> 52 KB, the inference child 60 -> 21 MB)."""
    data = wire.spliced(model, lambda t: lazy.is_lazy(t) or _big_weight(t), lambda t: lazy.placeholder(t, WEIGHTLESS))
    heavy = {k for k, n in enumerate(model.graph.node) if _big_constant(n)}
    return _light_nodes(data, model.graph.node, heavy) if heavy else data


def _big_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and any(_big_value(a) for a in node.attribute)


def _big_value(a: onnx.AttributeProto) -> bool:
    """A Constant's value of a weight's type (not _READ_TYPES) of INLINE_BYTES or more in the graph (raw or in float_data: ppocrv2_rec_crnn's)."""
    return (a.name == "value" and a.HasField("t") and a.t.data_type not in _READ_TYPES and a.t.ByteSize() >= lazy.INLINE_BYTES
            and a.t.data_location != onnx.TensorProto.EXTERNAL)


def _light_nodes(data: bytes, nodes, heavy: set[int]) -> bytes:
    """The serialized model `data` with the main graph's nodes numbered in `heavy` (big float
    Constants of `nodes`, the model's own) serialized with their values as WEIGHTLESS placeholders."""
    graph = next(((first, value, stop) for n, first, value, stop in wire.fields(data, 0, len(data)) if n == wire.MODEL_GRAPH), None)
    if graph is None:
        return data
    pieces, k = [], 0
    for number, first, value, stop in wire.fields(data, graph[1], graph[2]):
        if number == GRAPH_NODE and k in heavy:
            # the node's other fields as they are, its attributes (the value's data left out) after them
            rest = [data[f:e] for n, f, _, e in wire.fields(data, value, stop) if n != NODE_ATTRIBUTE]
            light = onnx.NodeProto()
            light.attribute.extend(_light_attribute(a) for a in nodes[k].attribute)
            pieces.append(wire.field(GRAPH_NODE, b"".join(rest) + light.SerializeToString()))
        else:
            pieces.append(data[first:stop])
        k += number == GRAPH_NODE
    return data[:graph[0]] + wire.field(wire.MODEL_GRAPH, b"".join(pieces)) + data[graph[2]:]


GRAPH_NODE = 1  # GraphProto.node
NODE_ATTRIBUTE = 5  # NodeProto.attribute


def _light_attribute(a: onnx.AttributeProto) -> onnx.AttributeProto:
    """`a`, or for a big value its tensor's name, type and dims as a WEIGHTLESS placeholder (its data never copied)."""
    if not _big_value(a):
        return a
    out = onnx.AttributeProto()
    out.name, out.type = a.name, a.type
    out.t.name, out.t.data_type = a.t.name, a.t.data_type
    out.t.dims.extend(a.t.dims)
    lazy.refer(out.t, WEIGHTLESS)
    return out


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else ()


def isolated(call, data: bytes) -> tuple[bytes | None, str]:
    """`call(data)` (bytes -> bytes) in a forked child, so that a native abort or crash in it ends
    the child, not qtool: (its result, "") or (None, why it failed: the exception's last line, or
    how the child ended and the last line it wrote to stderr, which is kept off qtool's). Where
    fork is not available (or fails), called here. `_infer` and `_infer_propagated` run in a new
    minimal interpreter instead (_spawned_infer) where it can: a fork counts this process's memory again."""
    if call is _infer or call is _infer_propagated:
        spawned = _spawned_infer(data, call is _infer_propagated)
        if spawned is not None:
            return spawned
    if not hasattr(os, "fork"):
        return _direct(call, data)
    read, write = os.pipe()
    err = tempfile.TemporaryFile()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # the child's handlers: the defaults, before any signal
    try:
        pid = os.fork()
    except OSError:
        for fd in (read, write):
            os.close(fd)
        err.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return _direct(call, data)
    if pid == 0:  # the child: no Python handler, no atexit, no cleanup of the parent's files
        status = 1
        try:
            faulthandler.disable()  # a crash here is the child's end, reported by the parent, not a dump of its stack
            for s in _SIGNALS:
                signal.signal(s, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.dup2(err.fileno(), 2)
            os.close(read)
            result, why = _direct(call, data)
            payload = b"+" + result if result is not None else b"-" + why.encode("utf-8", "replace")
            with os.fdopen(write, "wb") as out:
                out.write(payload)
            status = 0
        finally:
            os._exit(status)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(write)
    with os.fdopen(read, "rb") as pipe, err:
        payload = pipe.read()
        _, status = os.waitpid(pid, 0)
        err.seek(max(0, os.fstat(err.fileno()).st_size - 4096))
        said = [line.strip() for line in err.read().decode("utf-8", "replace").splitlines() if line.strip()]
    if payload[:1] == b"+" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return payload[1:], ""
    if payload[:1] == b"-":
        return None, payload[1:].decode("utf-8", "replace")
    if os.WIFSIGNALED(status):
        try:
            how = signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            how = f"signal {os.WTERMSIG(status)}"
    else:
        how = f"exit code {os.waitstatus_to_exitcode(status)}"
    return None, f"it ended its process with {how}" + (f": {said[-1]}" if said else "")


def _direct(call, data: bytes) -> tuple[bytes | None, str]:
    try:
        return call(data), ""
    except Exception as e:
        text = str(e).strip()
        return None, text.splitlines()[-1] if text else type(e).__name__


def _infer(data: bytes) -> bytes:
    """onnx's shape inference (strict_mode off) of the serialized model `data`, serialized."""
    return onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data), strict_mode=False).SerializeToString()


def _infer_propagated(data: bytes) -> bytes:
    """_infer with onnx's data propagation (data_prop): the values of shape tensors (Shape -> Gather ->
    Concat -> Reshape...) followed, so that dimensions they decide are told, not made-up symbols."""
    return onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data), strict_mode=False,
                                             data_prop=True).SerializeToString()


# The child that runs _infer where it can: a new interpreter that loads onnx's C++ extension alone
# (no numpy, no onnx package, ~20 MB) and calls what onnx.shape_inference.infer_shapes calls
# (onnx/onnx shape_inference.py: C.infer_shapes(bytes, check_type, strict_mode, data_prop)), for
# each model it is sent (8-byte length, 1 byte: data propagation or not, bytes) answering "+" or "-" (a
# reason), length, bytes. A fork
# of this process shared its pages, but a process's resident set counts them again: a fork of a
# calibration holding a 54 MB float model doubled its process tree's memory while onnx ran.
_CHILD = """
import sys, importlib.machinery, importlib.util
path = sys.argv[1]
loader = importlib.machinery.ExtensionFileLoader("onnx.onnx_cpp2py_export", path)
module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("onnx.onnx_cpp2py_export", path, loader=loader))
loader.exec_module(module)
read, write = sys.stdin.buffer, sys.stdout.buffer
module.shape_inference.infer_shapes(b"", False, False, False)  # the call as this onnx spells it, else no "ready": a fork
write.write(b"ready")
write.flush()
while len(head := read.read(9)) == 9:
    data = read.read(int.from_bytes(head[:8], "little"))
    try:
        out = b"+" + module.shape_inference.infer_shapes(data, False, False, head[8] == 1)
    except Exception as e:
        text = str(e).strip()
        out = b"-" + (text.splitlines()[-1] if text else type(e).__name__).encode("utf-8", "replace")
    write.write(len(out).to_bytes(8, "little") + out)
    write.flush()
"""


class _Child:
    """The _CHILD process, started on first use (or by `start_child`) and kept for the next inferences until
    `close_child` (its start, ~0.1 s, once per command instead of once per graph). `ready` waits for its word."""

    def __init__(self, extension: str):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CHILD, extension], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err)
        self._ready: bool | None = None

    @property
    def ready(self) -> bool:
        if self._ready is None:
            self._ready = self.proc.stdout.read(5) == b"ready"
        return self._ready

    def infer(self, data: bytes, data_prop: bool = False) -> tuple[bytes | None, str]:
        try:
            self.proc.stdin.write(len(data).to_bytes(8, "little") + bytes([data_prop]) + data)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(8)
            payload = self.proc.stdout.read(int.from_bytes(head, "little")) if len(head) == 8 else b""
        except OSError:
            payload = b""
        if payload[:1] == b"+":
            return payload[1:], ""
        if payload[:1] == b"-":
            return None, payload[1:].decode("utf-8", "replace")
        return None, self.ended()

    def ended(self) -> str:
        """How the child ended (it died mid-inference), with the last line it wrote to stderr."""
        self.close()
        code = self.proc.returncode
        self.err.seek(max(0, os.fstat(self.err.fileno()).st_size - 4096))
        said = [line.strip() for line in self.err.read().decode("utf-8", "replace").splitlines() if line.strip()]
        if code is not None and code < 0:
            try:
                how = signal.Signals(-code).name
            except ValueError:
                how = f"signal {-code}"
        else:
            how = f"exit code {code}"
        return f"it ended its process with {how}" + (f": {said[-1]}" if said else "")

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                f.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_child: _Child | None = None
_child_lock = threading.Lock()


def close_child() -> None:
    """End the inference child, if one runs (a command calls this before its memory-heavy part)."""
    global _child
    with _child_lock:
        if _child is not None:
            _child.close()
            _child.err.close()
            _child = None


def _started() -> _Child | None:
    """The inference child, started here if none runs (not waited for); None where it cannot start. Under _child_lock."""
    global _child
    extension = getattr(getattr(onnx, "onnx_cpp2py_export", None), "__file__", None)
    if not extension or not sys.executable:
        return None
    if _child is None or _child.proc.poll() is not None:
        try:
            _child = _Child(extension)
        except OSError:
            return None
    return _child


def start_child() -> None:
    """Start the inference child now, while this process is small. A child's process, until it runs its own program,
    shares all of its parent's pages (subprocess's vfork), and a process tree's RSS sum counts them twice: started
    on first use, from calibrate holding onnxruntime and the model (74 MB: magika_v1), the tree read 146 MB for a
    moment against a peak of 128 MB otherwise (2.1x plain inference's 69 MB, where 1.85x is calibrate's own)."""
    with _child_lock:
        _started()


def _spawned_infer(data: bytes, data_prop: bool = False) -> tuple[bytes | None, str] | None:
    """_infer(data) (_infer_propagated where `data_prop`) in the inference child (_CHILD), as `isolated`
    reports it; None where that child cannot start or load onnx's extension (the caller forks instead)."""
    global _child
    with _child_lock:
        if _started() is None:
            return None
        if not _child.ready:  # the extension does not load on its own
            _child.close()
            _child.err.close()
            _child = None
            return None
        found, why = _child.infer(data, data_prop)
        if found is None and _child.proc.poll() is not None:
            _child.err.close()
            _child = None
        return found, why


class Inferences:
    """onnx's shape inference results of the last few weightless graphs, by their SHA-256
    (`data_prop`: with onnx's data propagation, _infer_propagated)."""

    def __init__(self, keep: int = 4, data_prop: bool = False):
        self.keep = keep
        self.call = _infer_propagated if data_prop else _infer
        self._results: dict[str, onnx.ModelProto | None] = {}
        self.failures: dict[str, str] = {}  # why the inference of a graph failed, by its SHA-256

    def clear(self) -> None:
        self._results.clear()
        self.failures.clear()

    def of(self, data: bytes) -> onnx.ModelProto | None:
        """The inference (strict_mode off) of the weightless model `data`, or None when it fails."""
        key = hashlib.sha256(data).hexdigest()
        if key not in self._results:
            found, why = isolated(self.call, data)  # None: a model onnx cannot infer (custom ops, inconsistent shapes)
            result = None if found is None else onnx.ModelProto.FromString(found)
            if len(self._results) >= self.keep:
                old = next(iter(self._results))
                self._results.pop(old)
                self.failures.pop(old, None)
            self._results[key] = result
            if found is None:
                self.failures[key] = why
        return self._results[key]

    def failure(self, data: bytes) -> str:
        """Why the inference of `data` failed ("" when it did not, or was not asked for)."""
        return self.failures.get(hashlib.sha256(data).hexdigest(), "")


INFERENCES = Inferences()
# ... with data propagation: the segments' declarations (collection.segments._inferred), which must tell the static
# dimensions onnxruntime's own inference tells (it propagates shape values too: microsoft/onnxruntime
# onnxruntime/core/graph/data_propagation/, called from graph.cc's node inference) where onnx's plain inference
# makes up a symbol (unk__N)
PROPAGATED = Inferences(data_prop=True)


def inferred(model: onnx.ModelProto, data_prop: bool = False) -> onnx.ModelProto | None:
    """onnx's shape inference (strict_mode off) of the model without its weight data, or None when
    it fails; cached by the graph's content, so every step of a command that asks about one graph
    shares one inference. The result holds no weight data: read types and shapes from it.
    `data_prop`: with onnx's data propagation (PROPAGATED)."""
    return (PROPAGATED if data_prop else INFERENCES).of(weightless(model))


def with_inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.shape_inference.infer_shapes(model, strict_mode=False) (a RuntimeError with its reason where it fails), computed on
    the model without its weight data: a new model, the weights those of `model`."""
    data = weightless(model)
    result = INFERENCES.of(data)
    if result is None:
        raise RuntimeError(f"onnx's shape inference failed: {INFERENCES.failure(data) or 'no reason given'}")
    out = onnx.ModelProto()
    out.CopyFrom(result)
    for mine, theirs in zip(out.graph.initializer, model.graph.initializer):
        if lazy.location(mine) == WEIGHTLESS:
            mine.CopyFrom(theirs)
    for mine, theirs in zip(out.graph.node, model.graph.node):
        if mine.op_type == "Constant" and any(a.HasField("t") and lazy.location(a.t) == WEIGHTLESS for a in mine.attribute):
            mine.CopyFrom(theirs)
    return out


# The command line (qtool.launch: the console script and `python -m qtool`) starts the inference child as this module
# is imported, after numpy and onnx but before onnxruntime and any model (start_child): every command it runs infers
# shapes. A program that imports qtool starts it on first use.
if "qtool.launch" in sys.modules:
    start_child()
