"""Fetch activations in onnxruntime's blocked channel layout instead of paying for reorders.

On x86 onnxruntime runs 2-D convolutions (and the pooling and elementwise operators between
them) in NCHWc: channels in blocks of B, 8 with AVX2 and 16 with AVX-512, so element
[n, c, h, w] of a logical NCHW tensor sits at [n, c // B, h, w, c % B]. A tensor that is a
graph output gets a com.microsoft.nchwc ReorderOutput node that copies it back to NCHW
(microsoft/onnxruntime onnxruntime/core/optimizer/nchwc_transformer.cc; the op's attributes
`channels` and `channels_last` are in onnxruntime/core/graph/contrib_ops/nchwc_schema_defs.cc).
With every tensor of a detector exposed, those copies are a fifth of onnxruntime's time.

Histograms and extrema do not depend on where values sit, per-channel statistics can read the
blocked layout, and an elementwise operation on two blocked tensors is the blocked form of the
result; so calibration fetches such tensors before the reorder. onnxruntime optimizes the
exposed model once (it writes the optimized graph to a file, its weights to another beside it: optimized_apart), the reorders that only
feed graph outputs are dropped, and that graph runs without further optimization. The values
fetched are the ones the reorder would have copied, bit for bit. The array onnxruntime returns
has the logical NCHW shape over blocked memory; `Blocked` says how to read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import onnx
from onnx import TensorProto, helper

from .. import scratch
from ..errors import QtoolError
from ..model import bigmodel, lazy
from ..model.graph import all_nodes, node_reads, subgraphs
from . import onnxruntime

DOMAIN = "com.microsoft.nchwc"


@dataclass(frozen=True)
class Blocked:
    """A fetched tensor in blocked layout: `source` is the tensor onnxruntime returns for it."""

    source: str
    block: int


def view5(a: np.ndarray, block: int) -> np.ndarray:
    """The blocked memory of a 4-D array with the logical NCHW shape, as [N, C/B, H, W, B]."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a).reshape(n, c // block, h, w, block)


def unblocked(a: np.ndarray, block: int) -> np.ndarray:
    """The NCHW array a blocked array stands for (a copy)."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(view5(a, block).transpose(0, 1, 4, 2, 3)).reshape(n, c, h, w)


def blocked_shape(a: np.ndarray, block: int) -> bool:
    """Whether `a` can be read as blocked: 4-D with whole channel blocks (the channel count is
    what onnxruntime reports: a padded count would put padding among the values)."""
    return a.ndim == 4 and a.shape[1] % block == 0


def optimized(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph onnxruntime runs for `model` on this machine, layout transformations included."""

    def write(path: str) -> None:
        onnxruntime.raw_session(model, threads=1, spin=False, optimized_path=path)

    return onnx.load_from_string(scratch.written_by(write, "optimized.onnx"))


def strip_reorders(graph_model: onnx.ModelProto, fetched: list[str], keep: frozenset[str], block: int,
                   in_place: bool = False) -> tuple[onnx.ModelProto, dict[str, Blocked]]:
    """Drop the NCHW reorders of an optimized graph that only produce graph outputs in `fetched`
    (not in `keep`), and output their blocked inputs instead; in a copy, or with `in_place` in
    `graph_model` itself (one copy of the weights less)."""
    g = graph_model.graph
    outputs = {o.name for o in g.output}
    read = {i for n in g.node for i in node_reads(n)}
    wanted = set(fetched) - keep
    blocked: dict[str, Blocked] = {}
    for node in g.node:
        if node.domain != DOMAIN or node.op_type != "ReorderOutput" or len(node.output) != 1:
            continue
        out = node.output[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if out in wanted and out in outputs and out not in read and not attrs.get("channels_last", 0) \
                and attrs.get("channels", 0) % block == 0 and node.input[0] not in outputs:
            blocked[out] = Blocked(node.input[0], block)
    if in_place:
        stripped = graph_model
    else:
        stripped = onnx.ModelProto()
        stripped.CopyFrom(graph_model)
    g = stripped.graph
    kept = [n for n in g.node if not (n.op_type == "ReorderOutput" and n.domain == DOMAIN and n.output[0] in blocked)]
    del g.node[:]
    g.node.extend(kept)
    outs = [helper.make_empty_tensor_value_info(blocked[o.name].source) if o.name in blocked else o for o in g.output]
    del g.output[:]
    g.output.extend(outs)
    return stripped, blocked


@lru_cache(maxsize=1)
def block_size() -> int | None:
    """onnxruntime's channel block on this machine, found by running a convolution both ways;
    None when it does not use a blocked layout (or no longer in the way this module reads)."""
    channels, h, w = 64, 3, 5
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, (channels, channels, 1, 1),
                                rng.standard_normal(channels * channels).astype(np.float32))
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])
    probe = helper.make_model(
        helper.make_graph([conv], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, channels, h, w))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, channels, h, w))], [weight]),
        opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    x = rng.standard_normal((1, channels, h, w)).astype(np.float32)
    try:
        expected = onnxruntime.raw_session(probe, threads=1, spin=False).run(["y"], {"x": x})[0]
        graph = optimized(probe)
        for block in (4, 8, 16, 32, 64):
            stripped, blocked = strip_reorders(graph, ["y"], frozenset(), block)
            if "y" not in blocked:
                return None  # no reorder: the convolution runs in NCHW
            got = onnxruntime.raw_session(stripped, threads=1, optimization="none", spin=False).run([blocked["y"].source], {"x": x})[0]
            if got.shape == expected.shape and np.array_equal(unblocked(got, block), expected):
                return block
    except Exception:  # an onnxruntime without these internals: fetch NCHW as before
        return None
    return None


def _held_whole(model: onnx.ModelProto) -> bool:
    """Whether `model` gets the blocked layout by its weights: its lazy weights apart from its graph (lazy.apart: not
    those counted as held in it) come to less than bigmodel.LAZY_BYTES. The rule of the time when the optimized copy
    held every weight it made, kept as it is: the layout decides the floats of per-channel statistics, so the
    calibration files (the copy now holds none: optimized_apart)."""
    return sum(lazy.nbytes(t) for t in lazy.apart(model)) < bigmodel.LAZY_BYTES


WEIGHTS_FILE = "optimized.weights"


@contextlib.contextmanager
def optimized_apart(model: onnx.ModelProto) -> Iterator[tuple[onnx.ModelProto, str]]:
    """(the graph onnxruntime runs for `model` on this machine, as `optimized` gives it but without its weights, the
    folder they are in): onnxruntime writes each initializer of lazy.INLINE_BYTES or more to a file in that folder
    (a folder of its own in qtool's scratch directory, removed when the context ends), where a session of the graph
    reads them (its external folder). The graph's copy of every weight onnxruntime makes (its blocked reorders of
    the Conv weights), parsed, serialized again and read by the session, was calibrate's peak RSS: tabledet_obj_q's
    370 MB of float32 Conv weights 2-3 times (docs/benchmarks.md #memt23). Lazy weights referred to by their path (a
    Spill file, gone once the session that optimized is made) are in that file too."""
    folder = tempfile.mkdtemp(prefix="optimized-", dir=scratch.directory())
    try:
        path = os.path.join(folder, "optimized.onnx")
        # a session that never runs: no packed weights (ddddocr_ocr's 51 MB of LSTM and head weights packed beside
        # themselves: its layout probe was one of calibrate's peaks, docs/benchmarks.md #memt23)
        onnxruntime.raw_session(model, threads=1, spin=False, optimized_path=path, optimized_weights=WEIGHTS_FILE, prepack=False)
        yield onnx.load(path, load_external_data=False), folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        scratch.release()  # a calibration killed outright once its sessions are made leaves nothing on disk


# Pools onnxruntime's blocked transformer runs blocked on a 4-D input whatever made it
# (NchwcTransformerImpl::TransformPool): blocked layout starts at them as at a 2-D Conv.
BLOCKED_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})


def blocks(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto], dequantized: frozenset[str] | set[str] = frozenset()
           ) -> bool:
    """Whether onnxruntime's blocked (NCHWc) transformer may give `node`'s output the blocked
    layout: only 4-D tensors are (NchwcTransformerImpl's kNchwcDims, microsoft/onnxruntime
    onnxruntime/core/optimizer/nchwc_transformer.cc), made by a 2-D Conv (4-D weights) or a pool
    over 2 axes. A Conv whose weights are not an initializer (computed from constants, which onnxruntime
    folds) or a global pool (any rank) counts as one that may; but not one whose weights a DequantizeLinear makes
    (`dequantized`: DequantizeLinear outputs): onnxruntime's constant folding leaves those for its QDQ fusions
    (ConstantFolding's skip_dequantize_linear, set unless session.disable_quant_qdq: onnxruntime/core/optimizer/
    graph_transformer_utils.cc) and the blocked transformer takes a constant weight only (a Q/DQ model's convolutions;
    the 1-D ones dynamic.int8_weights gives int8 weights: docs/benchmarks.md #mem24)."""
    if node.domain not in ("", "ai.onnx", "com.microsoft"):
        return False
    if node.op_type in ("Conv", "FusedConv"):
        name = node.input[1] if len(node.input) > 1 else ""
        if name in dequantized:
            return False
        w = weights.get(name)
        return w is None or len(w.dims) == 4
    if node.op_type in BLOCKED_POOLS:
        kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), None)
        return kernel is None or len(kernel) == 2
    return False


def dequantized_outputs(nodes) -> set[str]:
    """The outputs of the DequantizeLinear nodes among `nodes` (blocks' `dequantized`)."""
    return {n.output[0] for n in nodes if n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx") and n.output}


def may_block(proto: onnx.ModelProto) -> bool:
    """Whether the blocked transformer may give some tensor of `proto` the blocked layout: a node of it, or of a graph
    inside it, `blocks`; and the model has a Conv (the layout serves convolutions). Where not (Kokoro's vocoder and
    every other 1-D convolution network, whose Conv weights are 3-D), an optimized copy of the model finds nothing
    blocked: fetching_session and blocked_layout make none (kokoro_ja_int8: the layout probe's optimized copy of the
    whole float model took calibrate 477 -> 1433 MB while it was made)."""
    if not any(n.op_type == "Conv" for n in proto.graph.node):
        return False
    graphs = [proto.graph, *(sub for n in all_nodes(proto.graph) for sub in subgraphs(n))]
    weights = {t.name: t for g in graphs for t in g.initializer}
    dequantized = dequantized_outputs(n for g in graphs for n in g.node)
    return any(blocks(n, weights, dequantized) for g in graphs for n in g.node)


def blocked_layout(model: onnx.ModelProto, fetched: list[str], keep: frozenset[str] = frozenset()) -> dict[str, int]:
    """{tensor: channel block} of the fetched tensors that fetching_session(model, fetched, keep)
    returns in blocked layout, without making that session (collection.segments: the layout each
    tensor has when the whole model runs, which its statistics are summed in)."""
    block = block_size() if may_block(model) and _held_whole(model) else None
    if block is None:
        return {}
    try:
        with optimized_apart(model) as (graph, _):
            _, blocked = strip_reorders(graph, fetched, keep, block, in_place=True)
    except Exception:
        return {}
    return {name: b.block for name, b in blocked.items()}


def to_blocked(a: np.ndarray, block: int) -> np.ndarray:
    """An NCHW array in the blocked layout (a copy): what onnxruntime returns for it blocked."""
    n, c, h, w = a.shape
    return np.ascontiguousarray(a.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(n, c, h, w)


def fetching_session(model: onnx.ModelProto, fetched: list[str], keep: frozenset[str] = frozenset(),
                     external_folder: str | os.PathLike | None = None, threads: int | None = None, arena: bool = True
                     ) -> tuple[onnxruntime.Session, dict[str, Blocked]]:
    """A session for `model`, whose outputs include `fetched`, and the fetched tensors it returns
    in onnxruntime's blocked layout (the `blocked` argument of qtool.collection.collect). Tensors
    in `keep` come in NCHW. Models without convolutions or none that may be blocked (may_block), with external weights or lazy weights of
    bigmodel.LAZY_BYTES or more (whose optimized copy would hold them all), and machines or onnxruntime builds without the blocked
    layout, get onnxruntime.session's session and every tensor in NCHW. `arena`: onnxruntime.session's."""
    block = block_size() if external_folder is None and may_block(model) and _held_whole(model) else None
    if block is not None:
        with contextlib.ExitStack() as files:
            try:
                graph, folder = files.enter_context(optimized_apart(model))
            except Exception:  # onnxruntime.session below says what is wrong with the model
                graph = None
            if graph is not None:
                _, blocked = strip_reorders(graph, fetched, keep, block, in_place=True)
                if blocked:
                    data = graph.SerializeToString()  # the graph alone: its weights are in `folder`
                    del graph
                    with contextlib.suppress(QtoolError):
                        return onnxruntime.session(data, threads=threads, optimization="none", arena=arena, external_folder=folder), blocked
            graph = None
        # what the optimizing session freed goes back to the system before the session of the model is made beside it
        # (effword_resnet50_qint8, a Q/DQ ResNet-50 nothing of which is blocked: calibrate 238 -> 218 MB in-process)
        onnxruntime.trim()
    return onnxruntime.session(model, external_folder=external_folder, threads=threads, arena=arena), {}

