"""Per-sample statistics calibration gathers (for --method mean-minmax and the exporters' bias
correction, qtool.quantizers.biascorrection): every sample's minimum, maximum |x| and, for the data inputs
of Conv/MatMul/Gemm, per-channel mean (and per-channel max |x| for depthwise-conv inputs and for
the inputs of MatMul/Gemm with constant weights: SmoothQuant's statistics).

Every sample's value is rounded to a multiple of UNIT and summed as exact integers, so the
calibration file does not depend on batch size, input order or sharding (shards add exactly).
A sample is one entry along the first axis when that axis has the batch's size, else the whole
run.

Padded tokens: when the inputs hold an attention mask (`real_tokens`), a token tensor's
per-channel means are taken over the real tokens only. The outputs are never read at padding,
and its activations differ from text: in 64-token inputs of one sentence each, most positions
are padding, and bias correction from the means over all of them cost paraphrase-MiniLM-L3-v2
and all-MiniLM-L6-v2 0.6 and 0.5 dB against none, where the real tokens' means gain 0.3 and
0.5 dB (OpenVINO, token SQNR on bench/fidelity.py's held-out sentences).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..model import graph as G
from ..runtime import nchwc
from . import gram as gram_mod
from . import histogram, pairs

UNIT_LOG2 = -40
UNIT = 2.0 ** UNIT_LOG2  # the stored sums count multiples of this

def _units(values) -> np.ndarray:
    """float values -> float64 integers: rounded half to even to multiples of UNIT (exact for
    float32 inputs, whose 24-bit mantissas fit float64's 53)."""
    return np.rint(np.ldexp(np.asarray(values, dtype=np.float64), -UNIT_LOG2))


def _unit(value: float) -> int:
    """One value in UNITs, rounded half to even (as _units)."""
    return round(math.ldexp(value, -UNIT_LOG2))


# Channel sums accumulate in int64 while their bound stays below this, then move to Python ints.
_INT64_ROOM = 2.0**62


def real_tokens(feeds: dict) -> np.ndarray | None:
    """The real (not padded) tokens of a run: its `attention_mask` input (Hugging Face's name),
    2-D [batch, sequence], integer or boolean, every value 0 or 1, as a boolean array; else None."""
    mask = feeds.get("attention_mask")
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.ndim != 2 or not (np.issubdtype(mask.dtype, np.integer) or mask.dtype == np.bool_) or not np.isin(mask, (0, 1)).all():
        return None
    return mask.astype(bool)


def _token_means(v: np.ndarray, tokens: np.ndarray | None) -> np.ndarray | None:
    """Per-sample channel means [rows, channels] of v [rows, outer, channels, 1] over the real
    tokens when its positions are the tokens of the mask (`tokens` [rows, outer] or, flattened,
    [1, outer]); a sample without a real token keeps all its positions. None when they are not."""
    rows, outer = v.shape[:2]
    if tokens is None or v.shape[3] != 1 or tokens.size != rows * outer:
        return None
    keep = tokens.reshape(rows, outer)
    sums = []
    for r in range(rows):
        picked = v[r][keep[r]] if keep[r].any() else v[r]
        sums.append(np.add.reduce(picked, axis=(0, 2), dtype=np.float64) / picked.shape[0])
    return np.stack(sums)


def sample_channels(parts: list[np.ndarray], rows: int, axis: int, bad: bool, blocks: list[int | None],
                    track_absmax: bool, known: tuple[np.ndarray, np.ndarray] | None = None,
                    tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-sample channel means [rows, channels] of a tensor (or of the parts it concatenates
    along `axis`), and, with track_absmax, the batch's max |x| per channel; `bad`: NaN and inf
    count as 0; `blocks`: per part, its channel block when in onnxruntime's blocked layout;
    `known`: the min and max of every (sample, channel) of a single part, when the histogram
    had them (see SampleStats.segments); `tokens`: the run's real tokens (`real_tokens`): a
    tensor [batch, sequence, channels] (or [batch * sequence, channels]) is averaged over them."""
    means, peaks = [], []
    for a, block in zip(parts, blocks):
        sample = (1, *a.shape[1:]) if rows > 1 else a.shape  # a sample keeps a (size 1) first axis
        ax = axis % len(sample)
        if block and not (len(sample) == 4 and ax == 1):
            a, block = nchwc.unblocked(a, block), None
        outer = math.prod(sample[:ax])
        inner = math.prod(sample[ax + 1 :])
        if block:  # [sample, outer, channel block, inner, channel in block]
            v = np.ascontiguousarray(a).reshape(rows, outer, sample[ax] // block, inner, block)
        else:
            v = np.ascontiguousarray(a).reshape(rows, outer, sample[ax], inner)
        if bad:
            v = np.where(np.isfinite(v), v, 0)
        if block:  # numpy cannot sum along a middle axis fast; each sample alone, in order
            sums = histogram.ordered_sums(v, track_absmax)
            if track_absmax:
                sums, peak = sums
                peaks.append(peak)
            means.append(sums.reshape(rows, -1) / max(outer * inner, 1))
            continue
        if track_absmax:
            peaks.append(_peaks(v, known))
        real = _token_means(v, tokens)
        if real is not None:
            means.append(real)
            continue
        # one sample at a time, so a sample's sums do not depend on the batch it came in
        sums = [np.add.reduce(v[r], axis=(0, 2), dtype=np.float64) for r in range(rows)]
        means.append((sums[0][None] if rows == 1 else np.stack(sums)) / max(outer * inner, 1))
    return np.concatenate(means, axis=1), (np.concatenate(peaks) if track_absmax else None)


def top_two(a: list[float], b: list[float]) -> list[float]:
    """The largest two values of a and b together, largest first (order and grouping do not matter)."""
    return sorted([*a, *b], reverse=True)[:2]


def _peaks(v: np.ndarray, known: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """max |x| per channel of v [rows, outer, channels, inner]; from `known` (min and max per
    row and channel) unless a channel's is zero, where numpy's choice of sign is kept."""
    if known is not None:
        lo, hi = (k.reshape(v.shape[0], -1) for k in known)
        peak = np.maximum(hi.max(axis=0), -lo.min(axis=0))
        if peak.all():
            return peak.astype(np.float64)
    return np.maximum(v.max(axis=(0, 1, 3)), -v.min(axis=(0, 1, 3))).reshape(-1).astype(np.float64)


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
    pairs: pairs.ChannelPairs | None = None  # joint histograms of channel pairs (inputs of Conv with few channels: images)
    gram: gram_mod.Gram | None = None  # X^T X over every position (transformers' linear-layer inputs: GPTQ's rounding)
    # the largest two of the samples' max |x|, largest first (fewer while fewer samples were seen; None in files from
    # older versions): whether one sample alone reaches far beyond every other (qtool.statistics.thresholds.lone_peak)
    top_absmax: list[float] | None = field(default_factory=list)
    # channel sums not yet in channel_sums: exact int64 partial sums and a bound on their magnitude
    _pending: np.ndarray | None = field(default=None, repr=False, compare=False)
    _pending_bound: float = field(default=0.0, repr=False, compare=False)

    def update(self, parts: list[np.ndarray], rows: int, extrema, blocks: list[int | None] | None = None,
               tokens: np.ndarray | None = None) -> None:
        """Add the `rows` samples a tensor splits into along its first axis. `parts`: the tensor,
        or arrays that make it up when concatenated along `axis`; `extrema`: the samples'
        histogram.Extrema (NaN and inf count as 0 here; the histogram counts them apart);
        `blocks`: per part, its channel block when it is in onnxruntime's blocked layout (nchwc);
        `tokens`: the run's real tokens (`real_tokens`), which the channel means are taken over."""
        if not extrema.lo:
            return
        for lo, hi, bad in zip(extrema.lo, extrema.hi, extrema.nonfinite):
            if bad:
                lo, hi = min(lo, 0.0), max(hi, 0.0)
            self.min_sum += _unit(lo)
            self.absmax_sum += _unit(max(-lo, hi, 0.0))
            if self.top_absmax is not None:
                self.top_absmax = top_two(self.top_absmax, [max(-lo, hi, 0.0)])
        self.count += rows
        if self.axis is not None and parts[0].ndim > 0:
            known = extrema.parts if len(parts) == 1 else None
            self._add_channels([np.asarray(a) for a in parts], rows, any(extrema.nonfinite), blocks or [None] * len(parts),
                               known, tokens)
        if self.gram is not None:
            block = (blocks or [None])[0]
            if len(parts) != 1 or block or not self.gram.update(parts[0], rows):  # every position, padding too (gram.py)
                self.gram = None
        if self.pairs is not None:
            block = (blocks or [None])[0]
            value = nchwc.unblocked(np.asarray(parts[0]), block) if block else np.asarray(parts[0])
            if len(parts) != 1 or not self.pairs.update(value):
                self.pairs = None

    def segments(self, value: np.ndarray, rows: int, block: int | None) -> int:
        """For TensorHistogram.update: the channels, when `value`'s samples split into one
        contiguous part per channel and the extrema of those parts give the per-channel max |x|
        this gathers (depthwise-conv inputs in NCHW); else 1."""
        # a [rows, channels] tensor (a Gemm's input) has one value per sample and channel: its segments would cost
        # one extrema call per value (an unrolled RNN's 80 Gemm inputs: +25 % calibration time) for no gain
        if not self.track_absmax or block or value.ndim < 3 or value.shape[0] != rows or self.axis % value.ndim != 1:
            return 1
        return value.shape[1]

    def _add_channels(self, parts: list[np.ndarray], rows: int, bad: bool, blocks: list[int | None],
                      known: tuple[np.ndarray, np.ndarray] | None = None, tokens: np.ndarray | None = None) -> None:
        means, peak = sample_channels(parts, rows, self.axis, bad, blocks, self.track_absmax, known, tokens)
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
            old = peak if self.channel_absmax is None else np.maximum(np.asarray(self.channel_absmax, np.float64), peak)
            self.channel_absmax = np.asarray(old, np.float64).tolist()  # Python floats, at C speed (every run of every linear input)

    def flush(self) -> None:
        """Move the pending channel sums into channel_sums (collect does, once the runs are done:
        what reads channel_sums directly, SmoothQuant's scaling of them at export, sees them all)."""
        self._flush()

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
        if self.top_absmax and times > 1:
            self.top_absmax = top_two(self.top_absmax, self.top_absmax * (times - 1))
        if self.channel_sums is not None:
            self.channel_sums = [v * times for v in self.channel_sums]
        if self.pairs is not None:
            self.pairs.repeat(times)
        if self.gram is not None:
            self.gram.repeat(times)

    def fresh(self) -> SampleStats:
        """An empty accumulator gathering the same statistics."""
        return SampleStats(axis=self.axis, track_absmax=self.track_absmax, pairs=None if self.pairs is None else self.pairs.fresh(),
                           gram=None if self.gram is None else self.gram.fresh(), top_absmax=None if self.top_absmax is None else [])

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
        joint = None if self.pairs is None or other.pairs is None else self.pairs.merge(other.pairs)
        both = (self.gram is not None and other.gram is not None and self.gram.channels == other.gram.channels)
        # a Gram both hold (one object reached two ways) holds both's sums already
        gram = (self.gram if self.gram is other.gram else self.gram.merge(other.gram)) if both else None
        top = None if self.top_absmax is None or other.top_absmax is None else top_two(self.top_absmax, other.top_absmax)
        return SampleStats(self.count + other.count, self.min_sum + other.min_sum, self.absmax_sum + other.absmax_sum, axis, sums,
                           peak, peak is not None, joint, gram, top)

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
        if self.top_absmax:
            out["top_absmax"] = list(self.top_absmax)
        if self.channel_sums is not None:
            out["channel_axis"] = self.axis
            out["channel_sums"] = list(self.channel_sums)
            if self.channel_absmax is not None:
                out["channel_absmax"] = list(self.channel_absmax)
        if self.pairs is not None and self.pairs.pair_count():
            out["channel_pairs"] = self.pairs.to_json()
        if self.gram is not None:
            out["gram"] = self.gram.to_json()
        return out

    @classmethod
    def from_json(cls, doc: dict) -> SampleStats:
        return from_json(doc)


def from_json(doc: dict) -> SampleStats:
    """A SampleStats from its to_json form, checked."""
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
    top = doc.get("top_absmax")
    if top is not None:
        if not isinstance(top, list) or not 1 <= len(top) <= 2 or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf") for v in top):
            raise ValueError("top_absmax must be one or two finite values >= 0")
        if sorted(top, reverse=True) != top:
            raise ValueError("top_absmax must be in decreasing order")
        top = [float(v) for v in top]
    stats = SampleStats(integer(doc["count"]), integer(doc["min_sum"]), integer(doc["absmax_sum"]),
                        None if axis is None else integer(axis), None if sums is None else [integer(v) for v in sums],
                        peak, peak is not None, pairs.from_json(doc["channel_pairs"]) if "channel_pairs" in doc else None,
                        gram_mod.from_json(doc["gram"]) if "gram" in doc else None, top)
    if stats.count < 0:
        raise ValueError("negative sample count")
    if top is not None and len(top) > stats.count:
        raise ValueError("top_absmax holds more peaks than samples")
    return stats


# ---------------------------------------------------------------- what calibrate gathers


def _constant_names(graph: onnx.GraphProto) -> set[str]:
    """Initializers (those also listed as graph inputs too: torch's keep_initializers_as_inputs, IR 3/4
    exports, are weights to the runtimes and to every export, qtool.model.graph.copy_model) and Constants."""
    names = {t.name for t in graph.initializer}
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


def linear_inputs(proto: onnx.ModelProto) -> set[str]:
    """The data inputs of MatMul/Gemm nodes with a constant weight (what SmoothQuant may migrate)."""
    constants = _constant_names(proto.graph)
    return {n.input[0] for n in proto.graph.node
            if n.op_type in ("MatMul", "Gemm") and data_input(n, constants) is not None}


def linear_widths(proto: onnx.ModelProto) -> dict[str, int]:
    """{data input of a MatMul/Gemm with a constant 2-D weight: its channels K (the weight's
    contracted axis)}, in graph order; an input read with two different widths is left out."""
    constants = _constant_names(proto.graph)
    dims = _dims(proto.graph)
    out: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or data_input(n, constants) is None or len(dims.get(n.input[1], ())) != 2:
            continue
        if n.op_type == "Gemm" and int(G.attr(n, "transA", 0)):
            continue
        k = dims[n.input[1]][1 if n.op_type == "Gemm" and int(G.attr(n, "transB", 0)) else 0]
        out[n.input[0]] = k if out.get(n.input[0], k) == k else -1
    return {t: k for t, k in out.items() if k > 0}


def gram_inputs(proto: onnx.ModelProto) -> dict[str, int]:
    """The linear-layer inputs calibrate gathers X^T X of (qtool.statistics.gram): {tensor: K} for
    K <= gram.MAX_CHANNELS, in graph order while their K * K entries stay within gram.BUDGET."""
    out, used = {}, 0
    for t, k in linear_widths(proto).items():
        if k <= gram_mod.MAX_CHANNELS and used + k * k <= gram_mod.BUDGET:
            out[t] = k
            used += k * k
    return out


def product_inputs(proto: onnx.ModelProto) -> dict[str, int]:
    """{input of a MatMul of two activations (Q.K^T): the axis it contracts} (-1 for the first,
    -2 for the second), for the overflow guard's per-channel code bound (qtool.quantizers.overflow)."""
    constants = _constant_names(proto.graph)
    out: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and len(n.input) == 2 and not set(n.input) & constants:
            out.setdefault(n.input[0], -1)
            out.setdefault(n.input[1], -2)
    return out


def pair_inputs(proto: onnx.ModelProto) -> set[str]:
    """The data inputs of Conv nodes (constant weights, one group) with 2..pairs.MAX_CHANNELS input
    channels: an image's first layer, whose channel pairs the overflow guard estimates jointly."""
    constants = _constant_names(proto.graph)
    dims = _dims(proto.graph)
    return {n.input[0] for n in proto.graph.node
            if n.op_type == "Conv" and data_input(n, constants) is not None and int(G.attr(n, "group", 1)) == 1
            and len(dims.get(n.input[1], ())) >= 3 and 2 <= dims[n.input[1]][1] <= pairs.MAX_CHANNELS}


def new_stats(proto: onnx.ModelProto, names, smooth: bool = False) -> dict[str, SampleStats]:
    """Accumulators for `names`: per-channel means for the data inputs of Conv/MatMul/Gemm (and
    for those of Conv with few input channels, `pair_inputs`, the joint histograms of their channel pairs), and
    per-channel max |x| for those of depthwise Convs (NNCF quantizes them per channel) and of
    MatMul/Gemm with constant weights in every model (SmoothQuant's decision, qtool.quantizers.smoothquant:
    one max per channel beside the means already summed there), and, with `smooth` (transformers),
    their X^T X where not too wide (`gram_inputs`, for qtool.quantizers.gptq), and both inputs of
    MatMuls of two activations along the axis they contract (qtool.quantizers.overflow)."""
    axes = channel_axes(proto, names)
    linear = linear_inputs(proto)
    products = product_inputs(proto) if smooth else {}
    grams = gram_inputs(proto) if smooth else {}
    joint = pair_inputs(proto)
    out = {}
    for n in names:
        axis, depthwise = axes.get(n, (None, False))
        if axis is None and n in products:
            out[n] = SampleStats(axis=products[n], track_absmax=True)
            continue
        out[n] = SampleStats(axis=axis, track_absmax=depthwise or (axis is not None and n in linear),
                             pairs=pairs.ChannelPairs(axis) if axis == 1 and n in joint else None,
                             gram=gram_mod.Gram(grams[n]) if n in grams and axis is not None else None)
    return out
