"""TensorRT's placement rules: the INT8 and FP8 Q/DQ tables qtool.quantizers.placement applies, the
per-channel weight axis its ONNX parser takes (used by the writers and by qtool.targets.tensorrt.checker),
ModelOpt's residual-Add rule and default exclusions.

The TensorRT developer guide's Q/DQ placement recommendations and NVIDIA
ModelOpt's ONNX PTQ defaults (NVIDIA/Model-Optimizer modelopt/onnx/quantization/int8.py,
graph_utils.py, partitioning.py):

* every input of Conv, ConvTranspose, Gemm and MatMul, weights per output channel where the parser
  allows it (Conv 0, ConvTranspose 1, Gemm by transB, MatMul [K, N] 1), nothing on their outputs;
* the skip input of a residual Add only (ModelOpt's build_non_residual_input_map: the input on the
  longer path back to the lowest common ancestor comes from a Conv that TensorRT fuses the Add into);
* AveragePool/GlobalAveragePool only next to a quantized neighbour; MaxPool and the
  shape ops pass the quantizer through; a Concat's quantized inputs and output share one scale;
* signed INT8 everywhere (TensorRT: "only supports symmetric quantization"), activation scale =
  amax / 127 with amax searched on the signed grid: mse by default, or the cache's entropy amax
  bit for bit with --method entropy, except where a threshold is degenerate (clips more than
  calibration.MAX_CLIPPED of the values, e.g. the entropy search on image pixels); there max |x| is
  used, as on every target;
* ModelOpt's default exclusions: small Convs, GEMV-shaped and small MatMul/Gemm, the attention
  core above sequence length 512 (`exclusions` below); and the attention core whose 8-bit error,
  estimated from the calibration, is too large (qtool.targets.tensorrt.attention; the Q/DQ writers
  pass it in); `--include` overrides them;
* on a transformer this is ModelOpt's placement: both inputs of the attention BMMs (Q.K^T and
  softmax.V, where the measured rule keeps them) and the linear layers' inputs; LayerNorm, Softmax,
  GELU, the additive mask and the residual stream (an Add with no Conv backbone is not residual)
  get no Q/DQ (tests/test_transformers.py).

FP8 (`FP8`): ModelOpt's FP8 op types (NVIDIA/Model-Optimizer modelopt/onnx/quantization/fp8.py:
Gemm, MatMul, Conv, Add) on the same machinery; ConvTranspose and pooling are not among them, and
no quantizer moves up through MaxPool or shape ops: the Q/DQ sits right before the layer that reads
it, as ModelOpt writes it (TensorRT has no FP8 pooling, and moves Q/DQ across shape ops itself).
Its writer adds ModelOpt's FP8 Conv rule (`fp8_exclusions`) to the INT8 default exclusions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx

from ... import model as M
from ...model import graph as G
from ...quantizers.patterns import AttentionCore, attention_core, producer, standard
from ...quantizers.rules import LINEAR, SHAPE_OPS, Rules

MIN_CHANNELS_FP8 = 16  # ModelOpt graph_utils._MIN_CHANNELS_FP8: Conv I/O channels up to this stay FP16
MAX_FILTER_FP8 = 32  # ModelOpt graph_utils: FP8 Conv kernels with more taps than this stay FP16


def weight_axis(node: onnx.NodeProto, slot: int, rank: int) -> int | None:
    """The per-channel axis TensorRT's ONNX parser takes for a constant input (None: one scalar
    scale): Conv 0, ConvTranspose 1 (one group), Gemm's B 0 when transB else 1, MatMul's [K, N]
    weight 1 (the README's TensorRT section; a batched [B, K, N] MatMul weight gets one scale)."""
    op = node.op_type
    if slot != 1:
        return None
    if op == "Conv":
        return 0 if rank >= 2 else None
    # W is [C_in, C_out/group, k...]: per output channel only with one group, as ModelOpt writes it for
    # TensorRT 10 (modelopt/onnx/quantization/ort_utils.py, "ConvTranspose": 1, "Cout axis"); TensorRT
    # issue #2380's axis 0 was pytorch_quantization's answer for TensorRT 8's deconvolution kernels
    if op == "ConvTranspose":
        return 1 if rank >= 2 and int(G.attr(node, "group", 1)) == 1 else None
    if op == "Gemm":
        return 0 if int(G.attr(node, "transB", 0)) else 1
    if op == "MatMul" and rank == 2:
        return 1
    return None


# What TensorRT fuses into a Conv before a residual Add, walking up from the Add's input
# (ModelOpt graph_utils.get_fusible_backbone: [MaxPool] <- [Relu or SiLU] <- [BatchNormalization]
# <- [bias Add] <- [constant Mul] <- Conv/ConvTranspose, each step optional).
_BACKBONE_STEPS = ("MaxPool", "Activation", "BatchNormalization", "BiasAdd", "ConstMul")
_ANCESTOR_LIMIT = 4096


def _backbone_step(m: G.Index, n: onnx.NodeProto) -> tuple[str, str] | None:
    """(step kind, data input) of a node TensorRT fuses into the Conv below it, else None."""
    if n.op_type in ("MaxPool", "BatchNormalization") and n.input:
        return n.op_type, n.input[0]
    if n.op_type == "Relu" and n.input:
        return "Activation", n.input[0]
    if n.op_type == "Mul" and len(n.input) == 2:  # SiLU: x * Sigmoid(x)
        for k in (0, 1):
            sig = producer(m, n.input[k])
            if sig is not None and sig.op_type == "Sigmoid" and sig.input[0] == n.input[1 - k]:
                return "Activation", n.input[1 - k]
    if n.op_type in ("Add", "Mul") and len(n.input) == 2:
        const = [i for i in n.input if i in m.constants]
        data = [i for i in n.input if i not in m.constants]
        if len(const) == 1 and len(data) == 1:
            return ("BiasAdd" if n.op_type == "Add" else "ConstMul"), data[0]
    return None


def fusible_backbone(m: G.Index, t: str) -> onnx.NodeProto | None:
    """The Conv/ConvTranspose that `t` comes out of through ops TensorRT fuses into it, else None."""
    n = producer(m, t)
    steps = _BACKBONE_STEPS
    while n is not None:
        if n.op_type in ("Conv", "ConvTranspose"):
            return n
        step = _backbone_step(m, n)
        if step is None or step[0] not in steps:
            return None
        steps = steps[steps.index(step[0]) + 1:]
        n = producer(m, step[1])
    return None


def _ancestors(m: G.Index, start: onnx.NodeProto) -> dict[str, int]:
    """Node name -> hops from `start` (0) walking up through data inputs (breadth first)."""
    dist = {start.name: 0}
    frontier = [start]
    while frontier and len(dist) < _ANCESTOR_LIMIT:
        nxt = []
        for n in frontier:
            for t in n.input:
                p = m.producer.get(t)
                if p is not None and p.name not in dist:
                    dist[p.name] = dist[n.name] + 1
                    nxt.append(p)
        frontier = nxt
    return dist


def lowest_common_ancestor(m: G.Index, a: onnx.NodeProto, b: onnx.NodeProto) -> tuple[str | None, int, int]:
    """(the common ancestor of nodes a and b nearest to a, its distance from a, from b), as
    ModelOpt's modelopt/onnx/utils.py find_lowest_common_ancestor picks it (distances here are
    shortest paths); (None, -1, -1) when they share none."""
    da, db = _ancestors(m, a), _ancestors(m, b)
    common = [n for n in da if n in db]
    if not common:
        return None, -1, -1
    best = min(common, key=lambda n: (da[n], db[n]))
    return best, da[best], db[best]


def residual_skip_input(m: G.Index, add: onnx.NodeProto) -> int | None:
    """The input slot of a residual Add to quantize (the skip connection), or None when the Add
    is not residual. ModelOpt's rule (graph_utils.build_non_residual_input_map): an Add of two
    node outputs, at least one coming out of a Conv that TensorRT fuses the Add into; the fused
    input is the one on the longer path back to their lowest common ancestor (an input whose
    Conv is that ancestor is not residual)."""
    if len(add.input) != 2 or any(i in m.constants or i not in m.producer for i in add.input):
        return None
    pa, pb = m.producer[add.input[0]], m.producer[add.input[1]]
    ba, bb = fusible_backbone(m, add.input[0]), fusible_backbone(m, add.input[1])
    lca, da, db = lowest_common_ancestor(m, pa, pb)
    if ba is not None and bb is not None:
        if ba.name == bb.name or ba.op_type != bb.op_type:
            return None
        fused = 0 if da > db else 1
    elif ba is not None:
        if lca == ba.name:
            return None
        fused = 0
    elif bb is not None:
        if lca == bb.name:
            return None
        fused = 1
    else:
        return None
    return 1 - fused


def _static_shapes(m: G.Index) -> dict[str, list[int | None]]:
    """Tensor name -> dims (None where unknown) from onnx shape inference on the main graph, with a
    dynamic batch (the first dimension of an input) taken as 1, the batch a TensorRT engine is
    usually built and measured for (ModelOpt measures its shapes on its calibration batches); a
    dynamic first axis that cannot be 1 (time, say) is no batch and stays open (M.batch_one)."""
    g = (M.inferred_batch_one(m.proto) or m.proto).graph  # no shapes inferred: no shape-based exclusions
    shapes: dict[str, list[int | None]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for name, c in m.constants.items():
        shapes[name] = list(c.dims)
    return shapes


MIN_CHANNELS = 16  # ModelOpt graph_utils: Conv I/O channels and MatMul/Gemm K, N below this stay FP32
MAX_ATTENTION_SEQUENCE = 512  # ModelOpt find_nodes_from_mha_to_exclude: int8 attention core only up to here
MIN_HEAD_FP8, MAX_HEAD_FP8 = 8, 256  # ... and FP8's only for head sizes in (8, 256]


def _conv_exclusion(m: G.Index, n: onnx.NodeProto, graph_inputs: set[str]) -> str | None:
    """ModelOpt's small-Conv rule (graph_utils.find_nodes_from_convs_to_exclude, int8)."""
    w = m.constants.get(n.input[1]) if len(n.input) > 1 else None
    if w is None or len(w.dims) < 3:
        return None
    oc, ic = int(w.dims[0]), int(w.dims[1])
    if oc >= MIN_CHANNELS and ic >= MIN_CHANNELS:
        return None
    group = int(G.attr(n, "group", 1))
    kernel = list(G.attr(n, "kernel_shape", list(w.dims[2:])))
    if group == 1 and (oc % 8 == 0 or ic % 8 == 0) and len(set(kernel)) == 1 and (
            any(i in graph_inputs for i in n.input) or oc >= MIN_CHANNELS or ic >= MIN_CHANNELS):
        return None
    if group > 1 and oc % 8 == 0 and all(k >= 3 for k in kernel):
        return None
    return f"default exclusion: Conv with {ic} input / {oc} output channels per group (TensorRT has no fast int8 kernel)"


def _matmul_exclusion(m: G.Index, n: onnx.NodeProto, shapes: dict) -> str | None:
    """ModelOpt's GEMV and small-GEMM rules (graph_utils._exclude_matmuls_by_shape_inference)."""
    out = shapes.get(n.output[0])
    if not out:
        return None
    both_data = all(i not in m.constants for i in n.input[:2])
    if both_data:
        if len(out) >= 2 and 1 in (out[-1], out[-2]):
            return "default exclusion: GEMV-shaped MatMul (a dimension of 1)"
    elif len(out) < 3 and 1 in out:
        return "default exclusion: GEMV-shaped MatMul/Gemm (a dimension of 1)"
    b = shapes.get(n.input[1]) if len(n.input) > 1 else None
    trans_b = n.op_type == "Gemm" and int(G.attr(n, "transB", 0))
    k = b[-1 if trans_b else -2] if b and len(b) >= 2 else None
    nn = out[-1] if len(out) >= 2 else None
    if (nn is not None and 0 < nn < MIN_CHANNELS) or (k is not None and 0 < k < MIN_CHANNELS):
        return f"default exclusion: small MatMul/Gemm (K={k}, N={nn} < {MIN_CHANNELS})"
    return None


def _attention_cores(m: G.Index, shapes: dict, why: Callable[[list], str | None],
                     measured: Callable[[G.Index, AttentionCore], str | None] | None = None) -> dict[str, str]:
    """The two MatMuls of each attention core (Q.K^T and .V: qtool.quantizers.patterns.attention_core)
    that stay FP32/FP16: where the K^T shape [..., head size, sequence] gives `why` a reason
    (ModelOpt graph_utils.find_nodes_from_mha_to_exclude, which reads the shape of BMM1's second
    input and keeps the whole core out), else where `measured` (qtool.targets.tensorrt.attention.rule)
    finds the core's 8-bit error too large. The core goes as one: TensorRT fuses it in one precision."""
    found: dict[str, str] = {}
    for sm in m.graph.node:
        if sm.op_type != "Softmax" or not standard(sm):
            continue
        core = attention_core(m, sm)
        if core is None:
            continue
        first = core.scores
        key = shapes.get(first.input[1]) if len(first.input) > 1 else None
        reason = why(key) if key and len(key) >= 2 else None
        if reason is None and measured is not None:
            reason = measured(m, core)
        if reason:
            for mm in [first, *(c for c, _ in core.contexts)]:
                found[mm.name] = f"default exclusion: attention core with {reason}"
    return found


def _long_sequence(key: list) -> str | None:
    seq = key[-1]
    return f"sequence length {seq} > {MAX_ATTENTION_SEQUENCE}" if seq is not None and seq > MAX_ATTENTION_SEQUENCE else None


def _fp8_head_size(key: list) -> str | None:
    head = key[-2]
    return (f"head size {head} outside FP8 attention's ({MIN_HEAD_FP8}, {MAX_HEAD_FP8}]"
            if head is not None and not MIN_HEAD_FP8 < head <= MAX_HEAD_FP8 else None)


def exclusions(m: G.Index, attention: Callable[[list], str | None] | None = None,
               measured: Callable[[G.Index, AttentionCore], str | None] | None = None) -> dict[str, str]:
    """Node -> why it stays FP32 by default for TensorRT's INT8: ModelOpt's rules (shapes from onnx
    shape inference; a dimension it cannot infer excludes nothing); `attention`: ModelOpt's rule for
    the attention core (default INT8's sequence length; FP8's is the head size), then `measured`:
    the core's 8-bit error estimated from the calibration (qtool.targets.tensorrt.attention.rule)."""
    shapes = _static_shapes(m)
    graph_inputs = {i.name for i in m.graph.input}
    found: dict[str, str] = {}
    for n in m.graph.node:
        if not standard(n):
            continue
        why = None
        if n.op_type == "Conv":
            why = _conv_exclusion(m, n, graph_inputs)
        elif n.op_type in ("MatMul", "Gemm") and len(n.input) >= 2:
            why = _matmul_exclusion(m, n, shapes)
        if why:
            found[n.name] = why
    for name, why in _attention_cores(m, shapes, attention or _long_sequence, measured).items():
        found.setdefault(name, why)
    return found


def fp8_exclusions(model: onnx.ModelProto) -> dict[str, str]:
    """Conv nodes ModelOpt keeps out of FP8 (graph_utils.find_nodes_from_convs_to_exclude, fp8):
    input or output channels (per group) <= 16, or a kernel with more than 32 taps."""
    m = G.Index(model)
    found: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type != "Conv" or not standard(n) or len(n.input) < 2:
            continue
        w = m.constants.get(n.input[1])
        if w is None or len(w.dims) < 3:
            continue
        oc, ic, taps = int(w.dims[0]), int(w.dims[1]), int(np.prod(w.dims[2:]))
        if taps > MAX_FILTER_FP8:
            found[n.name] = f"default exclusion: FP8 Conv kernel of {taps} taps > {MAX_FILTER_FP8} (no fast FP8 kernel)"
        elif oc <= MIN_CHANNELS_FP8 or ic <= MIN_CHANNELS_FP8:
            found[n.name] = f"default exclusion: FP8 Conv with {ic} input / {oc} output channels per group (<= {MIN_CHANNELS_FP8})"
    return found


TENSORRT = Rules(
    name="tensorrt",
    linear=LINEAR,
    elementwise=frozenset(),
    residual_input=residual_skip_input,
    pooling=frozenset({"AveragePool", "GlobalAveragePool"}),
    pooling_needs_neighbour=True,
    pass_through=SHAPE_OPS | {"MaxPool"},
    concat_shares_quantized_inputs=True,
    nncf_patterns=False,
    ignored_patterns=False,
    exclusions=exclusions,
    weight_axis=weight_axis,
    signed_only=True,
    clip_fallback=True,
    depthwise_per_channel=False,
    # the Q/DQ model's default (the cache keeps NVIDIA's entropy): measured in onnxruntime on the
    # eight real models of bench/tensorrt_vs_modelopt.py, mse beats ModelOpt's best on six (entropy
    # fell 7.7 dB short on MTCNN O-Net and 0.045 mask IoU on PP-OCRv6 det); README, TensorRT section
    default_method="mse",
)

def _fp8_placement_exclusions(m: G.Index, measured: Callable[[G.Index, AttentionCore], str | None] | None = None) -> dict[str, str]:
    """INT8's, with FP8's attention rule in place of INT8's: the attention core stays FP16 where its
    head size is not one FP8 fused attention takes (at most 8, above 256; ModelOpt
    graph_utils.find_nodes_from_mha_to_exclude, fp8), whatever the sequence length; then `measured`."""
    return exclusions(m, _fp8_head_size, measured)


FP8_DEFAULT_METHOD = "max"  # ModelOpt's FP8 amax (its FP8 path converts a max-calibrated INT8 model)
FP8 = replace(TENSORRT, name="tensorrt-fp8", linear=frozenset({"Conv", "Gemm", "MatMul"}), pooling=frozenset(),
              pass_through=frozenset(), default_method=FP8_DEFAULT_METHOD,
              exclusions=_fp8_placement_exclusions)
