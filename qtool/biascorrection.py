"""Fast bias correction, and the per-sample statistics calibration gathers for it (and for the
mean-minmax method).

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

Per-sample statistics: every sample's minimum, maximum |x| and per-channel mean of a tensor are
rounded to a multiple of UNIT and summed as exact integers, so the calibration file does not
depend on batch size, input order or sharding (shards add exactly). A sample is one entry along
the first axis when that axis has the batch's size, else the whole run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from . import graph as G
from . import histogram, nchwc

UNIT_LOG2 = -40
UNIT = 2.0 ** UNIT_LOG2  # the stored sums count multiples of this
NNCF_THRESHOLD = 2.0  # NNCF FAST_BIAS_CORRECTION_THRESHOLD: max |shift / bias| of an applied shift


def _units(values) -> np.ndarray:
    """float values -> float64 integers: rounded half to even to multiples of UNIT (exact for
    float32 inputs, whose 24-bit mantissas fit float64's 53)."""
    return np.rint(np.ldexp(np.asarray(values, dtype=np.float64), -UNIT_LOG2))


def _unit(value: float) -> int:
    """One value in UNITs, rounded half to even (as _units)."""
    return round(math.ldexp(value, -UNIT_LOG2))


# Channel sums accumulate in int64 while their bound stays below this, then move to Python ints.
_INT64_ROOM = 2.0**62


@dataclass
class SampleStats:
    """Sums over samples (in UNITs, exact) of one tensor's per-sample min, max |x| and, when
    `axis` is set, per-channel mean along `axis`."""

    count: int = 0
    min_sum: int = 0
    absmax_sum: int = 0
    axis: int | None = None
    channel_sums: list[int] | None = None
    channel_absmax: list[float] | None = None  # max |x| per channel along `axis` (depthwise conv inputs)
    track_absmax: bool = False
    # channel sums not yet in channel_sums: exact int64 partial sums and a bound on their magnitude
    _pending: np.ndarray | None = field(default=None, repr=False, compare=False)
    _pending_bound: float = field(default=0.0, repr=False, compare=False)

    def update(self, parts: list[np.ndarray], rows: int, extrema, blocks: list[int | None] | None = None) -> None:
        """Add the `rows` samples a tensor splits into along its first axis. `parts`: the tensor,
        or arrays that make it up when concatenated along `axis`; `extrema`: the samples'
        histogram.Extrema (NaN and inf count as 0 here; the histogram counts them apart);
        `blocks`: per part, its channel block when it is in onnxruntime's blocked layout (nchwc)."""
        if not extrema.lo:
            return
        for lo, hi, bad in zip(extrema.lo, extrema.hi, extrema.nonfinite):
            if bad:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
            self.min_sum += _unit(lo)
            self.absmax_sum += _unit(max(-lo, hi, 0.0))
        self.count += rows
        if self.axis is not None and parts[0].ndim > 0:
            self._add_channels([np.asarray(a) for a in parts], rows, any(extrema.nonfinite), blocks or [None] * len(parts))

    def _add_channels(self, parts: list[np.ndarray], rows: int, bad: bool, blocks: list[int | None]) -> None:
        means, peaks = [], []
        for a, block in zip(parts, blocks):
            sample = (1, *a.shape[1:]) if rows > 1 else a.shape  # a sample keeps a (size 1) first axis
            axis = self.axis % len(sample)
            if block and not (len(sample) == 4 and axis == 1):
                a, block = nchwc.unblocked(a, block), None
            outer = math.prod(sample[:axis])
            inner = math.prod(sample[axis + 1 :])
            if block:  # [sample, outer, channel block, inner, channel in block]
                v = np.ascontiguousarray(a).reshape(rows, outer, sample[axis] // block, inner, block)
            else:
                v = np.ascontiguousarray(a).reshape(rows, outer, sample[axis], inner)
            if bad:
                v = np.where(np.isfinite(v), v, 0)
            if block:  # numpy cannot sum along a middle axis fast; each sample alone, in order
                sums = histogram.ordered_sums(v).reshape(rows, -1)
            else:  # one sample at a time, so a sample's sums do not depend on the batch it came in
                sums = [np.add.reduce(v[r], axis=(0, 2), dtype=np.float64) for r in range(rows)]
                sums = sums[0][None] if rows == 1 else np.stack(sums)
            means.append(sums / max(outer * inner, 1))
            if self.track_absmax:
                peaks.append(np.maximum(v.max(axis=(0, 1, 3)), -v.min(axis=(0, 1, 3))).reshape(-1).astype(np.float64))
        means = np.concatenate(means, axis=1)  # [rows, channels]
        channels = means.shape[1]
        if self.channel_sums is None:
            self.channel_sums = [0] * channels
        if len(self.channel_sums) != channels:  # the channel count changed: not a channel axis
            self.axis, self.channel_sums, self.channel_absmax, self.track_absmax = None, None, None, False
            self._pending, self._pending_bound = None, 0.0
            return
        units = _units(means)
        bound = float(np.abs(units).max(initial=0.0)) * rows
        if self._pending_bound + bound >= _INT64_ROOM:
            self._flush()
        if bound < _INT64_ROOM:
            if self._pending is None:
                self._pending = np.zeros(channels, np.int64)
            self._pending += units.astype(np.int64).sum(axis=0)
            self._pending_bound += bound
        else:  # means beyond 2**22: Python ints
            for row in units:
                self.channel_sums = [s + int(v) for s, v in zip(self.channel_sums, row)]
        if self.track_absmax:
            peak = np.concatenate(peaks)
            old = peak if self.channel_absmax is None else np.maximum(np.asarray(self.channel_absmax), peak)
            self.channel_absmax = [float(p) for p in old]

    def _flush(self) -> None:
        if self._pending is not None:
            self.channel_sums = [s + int(v) for s, v in zip(self.channel_sums, self._pending)]
            self._pending, self._pending_bound = None, 0.0

    def repeat(self, times: int) -> None:
        """As if every sample had been seen `times` times."""
        self._flush()
        self.count *= times
        self.min_sum *= times
        self.absmax_sum *= times
        if self.channel_sums is not None:
            self.channel_sums = [v * times for v in self.channel_sums]

    def fresh(self) -> SampleStats:
        """An empty accumulator gathering the same statistics."""
        return SampleStats(axis=self.axis, track_absmax=self.track_absmax)

    def merge(self, other: SampleStats) -> SampleStats:
        self._flush()
        other._flush()
        if not other.count or not self.count:  # nothing seen: nothing to combine
            return self if other.count == 0 else other
        if self.axis != other.axis or (self.channel_sums is None) != (other.channel_sums is None) or (
                self.channel_sums is not None and len(self.channel_sums) != len(other.channel_sums)):
            sums, axis = None, None
        else:
            axis = self.axis
            sums = None if self.channel_sums is None else [a + b for a, b in zip(self.channel_sums, other.channel_sums)]
        peak = None
        if sums is not None and self.channel_absmax is not None and other.channel_absmax is not None:
            peak = [max(a, b) for a, b in zip(self.channel_absmax, other.channel_absmax)]
        return SampleStats(self.count + other.count, self.min_sum + other.min_sum, self.absmax_sum + other.absmax_sum, axis, sums,
                           peak, peak is not None)

    def _mean(self, total: int) -> float:
        return float(total * 2 ** UNIT_LOG2 / self.count) if self.count else 0.0

    @property
    def mean_min(self) -> float:
        return self._mean(self.min_sum)

    @property
    def mean_absmax(self) -> float:
        return self._mean(self.absmax_sum)

    def channel_means(self) -> np.ndarray | None:
        self._flush()
        if self.channel_sums is None or not self.count:
            return None
        return np.array([self._mean(v) for v in self.channel_sums], dtype=np.float64)

    def to_json(self) -> dict:
        self._flush()
        out = {"count": self.count, "min_sum": self.min_sum, "absmax_sum": self.absmax_sum}
        if self.channel_sums is not None:
            out["channel_axis"] = self.axis
            out["channel_sums"] = list(self.channel_sums)
            if self.channel_absmax is not None:
                out["channel_absmax"] = list(self.channel_absmax)
        return out

    @classmethod
    def from_json(cls, doc: dict) -> SampleStats:
        def integer(v):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"expected an integer, got {v!r}")
            return v

        if not isinstance(doc, dict):
            raise TypeError("per_sample must be an object")
        sums = doc.get("channel_sums")
        axis = doc.get("channel_axis")
        if (sums is None) != (axis is None):
            raise ValueError("channel_sums and channel_axis go together")
        if sums is not None and (not isinstance(sums, list) or not sums):
            raise TypeError("channel_sums must be a non-empty list")
        peak = doc.get("channel_absmax")
        if peak is not None:
            if sums is None or not isinstance(peak, list) or len(peak) != len(sums):
                raise ValueError("channel_absmax needs one value per channel_sums entry")
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0) or v == float("inf") for v in peak):
                raise ValueError("channel_absmax values must be finite and >= 0")
            peak = [float(v) for v in peak]
        stats = cls(integer(doc["count"]), integer(doc["min_sum"]), integer(doc["absmax_sum"]),
                    None if axis is None else integer(axis), None if sums is None else [integer(v) for v in sums],
                    peak, peak is not None)
        if stats.count < 0:
            raise ValueError("negative sample count")
        return stats


# ---------------------------------------------------------------- what calibrate gathers


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    names |= {n.output[0] for n in graph.node if n.op_type == "Constant" and n.output}
    return names



def data_input(node: onnx.NodeProto, constants) -> tuple[int, int] | None:
    """(slot, channel axis) of the data input of a Conv/MatMul/Gemm with a constant weight."""
    if node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    if node.op_type == "Conv" and node.input[1] in constants:
        return 0, 1
    if node.op_type == "MatMul" and node.input[1] in constants:
        return 0, -1
    if node.op_type == "Gemm" and node.input[1] in constants:
        return 0, 0 if int(G.attr(node, "transA", 0)) else 1
    return None


def _dims(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Shapes of the constants (from the protos' dims: no data is read)."""
    out = {t.name: list(t.dims) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.output:
            v = G.attr(n, "value")
            if isinstance(v, onnx.TensorProto):
                out[n.output[0]] = list(v.dims)
    return out



def channel_axes(proto: onnx.ModelProto, names) -> dict[str, tuple[int, bool]]:
    """{tensor in `names`: (the axis its first Conv/MatMul/Gemm reader contracts, whether a
    depthwise Conv reads it)}."""
    wanted = set(names)
    constants = _constant_names(proto.graph)
    dims = _dims(proto.graph)
    axes: dict[str, tuple[int, bool]] = {}
    for n in proto.graph.node:
        found = data_input(n, constants)
        if found is not None and n.input[found[0]] in wanted:
            t = n.input[found[0]]
            axis, depthwise = axes.get(t, (found[1], False))
            axes[t] = (axis, depthwise or (axis == 1 and G.is_depthwise(n, dims)))
    return axes


def new_stats(proto: onnx.ModelProto, names) -> dict[str, SampleStats]:
    """Accumulators for `names`: per-channel means for the data inputs of Conv/MatMul/Gemm, and
    per-channel max |x| for those of depthwise Convs (NNCF quantizes them per channel)."""
    axes = channel_axes(proto, names)
    out = {}
    for n in names:
        axis, depthwise = axes.get(n, (None, False))
        out[n] = SampleStats(axis=axis, track_absmax=depthwise)
    return out


# ---------------------------------------------------------------- what export applies


@dataclass
class Correction:
    layers: list[str] = field(default_factory=list)  # biases shifted
    skipped: dict[str, str] = field(default_factory=dict)  # layer -> why not


class _Constants:
    """Constant values of a graph: initializers, Constant nodes and shape ops folded over them."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        for name in {i.name for i in graph.input}:
            self.inits.pop(name, None)
        self.nodes = {n.output[0]: n for n in graph.node if n.output}

    def value(self, t: str, depth: int = 0) -> np.ndarray | None:
        if t in self.inits:
            return numpy_helper.to_array(self.inits[t])
        n = self.nodes.get(t)
        if n is None or depth > 4 or n.domain not in ("", "ai.onnx"):
            return None
        if n.op_type == "Constant":
            v = G.attr(n, "value")
            return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else None
        x = self.value(n.input[0], depth + 1) if n.input else None
        if x is None:
            return None
        if n.op_type == "Identity":
            return x
        if n.op_type == "Reshape" and len(n.input) > 1:
            shape = self.value(n.input[1], depth + 1)
            if shape is None:
                return None
            shape = [x.shape[i] if s == 0 and not G.attr(n, "allowzero", 0) else int(s) for i, s in enumerate(shape.tolist())]
            return x.reshape(shape)
        if n.op_type in ("Unsqueeze", "Squeeze"):
            axes = G.attr(n, "axes")
            if axes is None and len(n.input) > 1:
                a = self.value(n.input[1], depth + 1)
                axes = None if a is None else a.tolist()
            if n.op_type == "Unsqueeze":
                if axes is None:
                    return None
                for ax in sorted(a % (x.ndim + len(axes)) for a in axes):
                    x = np.expand_dims(x, ax)
                return x
            return np.squeeze(x, axis=None if axes is None else tuple(axes))
        return None


def _along(value: np.ndarray, channels: int, axis: int, out_rank: int) -> bool:
    """True when `value`, broadcast against the layer output (rank out_rank), holds one entry
    per output channel along output axis `axis` and nothing else."""
    if value.size != channels or value.ndim > out_rank:
        return False
    offset = out_rank - value.ndim
    return all(s == 1 for i, s in enumerate(value.shape) if i + offset != axis % out_rank)


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


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
    from . import quant

    out = Correction()
    g = model.graph
    nodes = {n.name: n for n in g.node}
    consts = _Constants(g)
    readers = _readers(g)
    outputs = {o.name for o in g.output}
    weight_site = {(node, slot): site for site in plan.weights for node, slot in site.readers}
    for name in plan.int8_layers:
        n = nodes[name]
        found = data_input(n, consts.inits.keys() | {k for k, v in consts.nodes.items() if v.op_type == "Constant"})
        site = weight_site.get((name, 1))
        if found is None or site is None or n.op_type not in ("Conv", "MatMul", "Gemm"):
            out.skipped[name] = "no constant weight"
            continue
        slot, axis = found
        record = records.get(n.input[slot])
        stats = getattr(record, "stats", None)
        means = stats.channel_means() if stats is not None and stats.axis == axis else None
        if means is None:
            out.skipped[name] = "no per-channel input means in the calibration file"
            continue
        w = np.asarray(site.values, dtype=np.float64)
        p = site.params()
        ax = p.axis if p.axis is not None and np.ndim(p.scale) > 0 else None
        wq = quant.dequantize_linear(quant.quantize_linear(w, p.scale, p.zero_point, p.grid, ax), p.scale, p.zero_point, ax)
        d = w - wq
        if n.op_type == "Conv":
            groups = int(G.attr(n, "group", 1))
            cout, cin_g = d.shape[0], d.shape[1]
            if means.size != cin_g * groups or cout % groups:
                out.skipped[name] = "channel count mismatch"
                continue
            dk = d.reshape(cout, cin_g, -1).sum(axis=2)
            m = means.reshape(groups, cin_g)[np.arange(cout) // (cout // groups)]
            shift = (dk * m).sum(axis=1)
        else:
            if d.ndim != 2:
                out.skipped[name] = "batched weight"
                continue
            if n.op_type == "Gemm" and int(G.attr(n, "transB", 0)):
                d = d.T
            if means.size != d.shape[0]:
                out.skipped[name] = "channel count mismatch"
                continue
            shift = means @ d
            if n.op_type == "Gemm":
                shift = shift * float(G.attr(n, "alpha", 1.0)) / float(G.attr(n, "beta", 1.0))
        reason = _apply(model, namer, n, shift, w.ndim if n.op_type == "Conv" else 2, consts, readers, outputs, threshold)
        if reason:
            out.skipped[name] = reason
        else:
            out.layers.append(name)
    return out


def _apply(model, namer, n, shift: np.ndarray, out_rank: int, consts: _Constants, readers, outputs, threshold) -> str | None:
    """Add `shift` (per output channel) to the bias of layer `n`; None, or why it was not done."""
    channels = shift.size
    axis = 1 if n.op_type == "Conv" else out_rank - 1  # the output channel axis
    scale = 1.0
    if n.op_type in ("Conv", "Gemm") and len(n.input) > 2 and n.input[2]:
        node, k = n, 2
        value = consts.value(n.input[2])
        if value is None:
            return "bias is not a constant"
        if n.op_type == "Conv":
            axis, out_rank = 0, 1  # B is [C]
    else:
        after = readers.get(n.output[0], [])
        if len(after) != 1 or n.output[0] in outputs:
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
