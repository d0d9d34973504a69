"""Fast bias correction, applied at export from the per-channel input means calibration
gathers (qtool.statistics.stats).

NNCF's fast bias correction (openvinotoolkit/nncf
src/nncf/quantization/algorithms/fast_bias_correction/algorithm.py), run by default after its
min-max quantization: for every Conv/MatMul with a bias whose weights were quantized, the mean
over the calibration samples of the layer's input, per input channel, is collected on the FP32
model; the layer with quantized weights is run on a blob that holds that mean everywhere, and
each output channel's bias is shifted by (mean FP32 output - mean quantized output). NNCF applies
a shift only when max |shift / bias| < 2 (FAST_BIAS_CORRECTION_THRESHOLD), so never to a layer
with a zero bias element; qtool applies every shift by default (see `correct`).

qtool splits the same computation between its two commands:

* `qtool calibrate` (which runs the model on every sample) adds the per-channel input means to
  the calibration file, for every tensor a Conv/MatMul/Gemm reads as its data input, along the
  axis the layer contracts (Conv: 1, MatMul: the last, Gemm: 1, or 0 with transA). `qtool
  export` never runs the model: its inputs are not in the calibration file, and exports must
  stay fast and byte-identical.
* `qtool export` shifts the biases. A Conv/MatMul/Gemm is linear in its input, so the mean
  output error that weight quantization causes is exactly (W - Wq) applied to the mean input,
  summed over the kernel: the quantity NNCF measures by running the quantized layer on the mean
  blob, computed here without a runtime and without the blob's border effects (NNCF compares
  the blob's output with the FP32 output mean measured with real padding). NNCF also passes the
  mean blob through the input quantizer; rounding one mean value says nothing about the mean
  rounding error of the data, so qtool leaves that term out.

Where the bias lives: the layer's own bias input (Conv B, Gemm C), an Add of a per-channel
constant that is the layer's only reader (PyTorch MatMul + Add, paddle2onnx Conv + Add of a
reshaped constant), or a BatchNormalization that is its only reader (the shift, times the
normalisation scale, goes into the BN bias). ConvTranspose and batched MatMul weights are left
alone (NNCF corrects neither).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..model import graph as G
from ..statistics.stats import data_input
from . import policy

NNCF_THRESHOLD = 2.0  # NNCF FAST_BIAS_CORRECTION_THRESHOLD: max |shift / bias| of an applied shift


# ---------------------------------------------------------------- what export applies


@dataclass
class Correction:
    layers: list[str] = field(default_factory=list)  # biases shifted
    skipped: dict[str, str] = field(default_factory=dict)  # layer -> why not


def _along(value: np.ndarray, channels: int, axis: int, out_rank: int) -> bool:
    """True when `value`, broadcast against the layer output (rank out_rank), holds one entry
    per output channel along output axis `axis` and nothing else."""
    if value.size != channels or value.ndim > out_rank:
        return False
    offset = out_rank - value.ndim
    return all(s == 1 for i, s in enumerate(value.shape) if i + offset != axis % out_rank)


def correct(model: onnx.ModelProto, namer, plan, records: dict, threshold: float | None = None) -> Correction:
    """Shift the biases of the plan's int8 Conv/MatMul/Gemm layers by the mean output error their
    weight quantization causes (in place; run before the quantizers are inserted).

    records: {tensor: TensorRecord}; a layer whose data input has no per-channel means in its
    record (a calibration file from an older qtool) is skipped. threshold: with NNCF_THRESHOLD,
    NNCF's rule: a layer whose shift reaches that many times its bias in some channel (or that
    has a zero bias element) is left alone. The default None applies every shift: the shift is
    the exact mean of the weight error, not an estimate that needs a guard, and skipping the
    layers the rule rejects (a third to a half of them in the PP-OCR models) cost accuracy in
    bench/fidelity.py (PP-OCRv5 det mask IoU 0.886 vs 0.869, rec 0.987 vs 0.982)."""
    out = Correction()
    index = G.Index(model)
    nodes, consts = index.nodes, index.values
    weight_site = {(node, slot): site for site in plan.weights for node, slot in site.readers}
    constants = consts.inits.keys() | {k for k, v in consts.nodes.items() if v.op_type == "Constant"}
    for name in plan.int8_layers:
        n = nodes[name]
        found = data_input(n, constants)
        site = weight_site.get((name, 1))
        if found is None or site is None or n.op_type not in ("Conv", "MatMul", "Gemm"):
            out.skipped[name] = "no constant weight"
            continue
        slot, axis = found
        stats = getattr(records.get(n.input[slot]), "stats", None)
        means = stats.channel_means() if stats is not None and stats.axis == axis else None
        if means is None:
            out.skipped[name] = "no per-channel input means in the calibration file"
            continue
        shift = _mean_error(n, site, means)
        out_rank = np.ndim(site.values) if n.op_type == "Conv" else 2
        reason = shift if isinstance(shift, str) else _apply(model, namer, n, shift, out_rank, consts, index, threshold)
        if reason:
            out.skipped[name] = reason
        else:
            out.layers.append(name)
    return out


def _mean_error(n: onnx.NodeProto, site, means: np.ndarray) -> np.ndarray | str:
    """The mean output error, per output channel, that quantizing the weights of layer `n` (its
    quantizer `site`) causes on inputs whose per-channel mean is `means`; or why it cannot be had."""
    w = np.asarray(site.values, dtype=np.float64)
    d = w - policy.fake_quantize(w, site.params(), site.policy.rounding)  # the weights as the export writes them
    if site.unrounded is not None:  # GPTQ's grid points: the error is the float weights' less them
        d = np.asarray(site.unrounded, dtype=np.float64) - w + d
    if n.op_type == "Conv":
        groups = int(G.attr(n, "group", 1))
        cout, cin_g = d.shape[0], d.shape[1]
        if means.size != cin_g * groups or cout % groups:
            return "channel count mismatch"
        dk = d.reshape(cout, cin_g, -1).sum(axis=2)
        m = means.reshape(groups, cin_g)[np.arange(cout) // (cout // groups)]
        return (dk * m).sum(axis=1)
    if d.ndim != 2:
        return "batched weight"
    if n.op_type == "Gemm" and int(G.attr(n, "transB", 0)):
        d = d.T
    if means.size != d.shape[0]:
        return "channel count mismatch"
    shift = means @ d
    if n.op_type == "Gemm":  # Y = alpha A B + beta C: the output's shift (C's is _apply's, over beta)
        shift = shift * float(G.attr(n, "alpha", 1.0))
    return shift


def _apply(model, namer, n, shift: np.ndarray, out_rank: int, consts: G.Constants, index: G.Index, threshold) -> str | None:
    """Add `shift` (per output channel) to the bias of layer `n`; None, or why it was not done."""
    channels = shift.size
    axis = 1 if n.op_type == "Conv" else out_rank - 1  # the output channel axis
    scale = 1.0
    beta = float(G.attr(n, "beta", 1.0)) if n.op_type == "Gemm" else 1.0
    # a Gemm's C counts beta times (tf2onnx writes beta 0 and the bias in an Add after it: C then counts nothing)
    if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2] and beta != 0:
        node, k, scale = n, 2, 1.0 / beta
        value = consts.value(n.input[2])
        if value is None:
            return "bias is not a constant"
        if n.op_type == "Conv":
            axis, out_rank = 0, 1  # B is [C]
    else:
        after = [r for r, slot in index.readers.get(n.output[0], ()) if slot >= 0]  # not the reads inside subgraphs
        if len(after) != 1 or n.output[0] in index.outputs:
            return "no bias (the output has other readers)"
        node = after[0]
        if node.op_type == "Add" and len(node.input) == 2:
            k = 1 if node.input[0] == n.output[0] else 0
            value = consts.value(node.input[k])
            if value is None:
                return "no bias"
            if n.op_type != "Conv":  # the channel axis is the last one, whatever the rank
                out_rank = max(value.ndim, 1)
                axis = out_rank - 1
        elif node.op_type == "BatchNormalization" and n.op_type == "Conv" and len(node.input) == 5:
            k = 2
            gamma, value, var = (consts.value(node.input[i]) for i in (1, 2, 4))
            if gamma is None or value is None or var is None:
                return "BatchNormalization parameters are not constants"
            scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + float(G.attr(node, "epsilon", 1e-5)))
            axis, out_rank = 0, 1
        else:
            return "no bias"
    if not np.issubdtype(value.dtype, np.floating) or not _along(value, channels, axis, out_rank):
        return "bias is not per output channel"
    delta = np.asarray(scale * shift, dtype=np.float64).reshape(value.shape)
    bias = value.astype(np.float64)
    if threshold is not None:
        if np.any(bias == 0):
            return "a zero bias element (NNCF's magnitude rule)"
        if np.max(np.abs(delta / bias)) >= threshold:
            return f"shift reaches {threshold:g}x the bias (NNCF's magnitude rule)"
    new = namer.fresh(f"{node.input[k]}/bias_corrected")
    model.graph.initializer.append(numpy_helper.from_array((bias + delta).astype(value.dtype), new))
    node.input[k] = new
    return None


def apply_to_export(model: onnx.ModelProto, namer, plan, cal, enabled: bool = True) -> tuple[int, list[str]]:
    """The exporters' step: correct the biases unless disabled; (layers corrected, warnings)."""
    if not enabled or not plan.int8_layers:
        return 0, []
    records = {t.name: t for t in cal.tensors}
    if not any(getattr(t, "stats", None) is not None for t in cal.tensors):
        warning = ("the calibration file has no per-channel means (made by an older qtool): biases are not corrected; "
                   "calibrate again for bias correction")
        return 0, [warning]
    result = correct(model, namer, plan, records)
    return len(result.layers), []
