"""SmoothQuant (Xiao et al. 2022, arXiv 2211.10438): move the quantization difficulty of
outlier activation channels into the weights of the linear layers that read them.

For an activation X read by MatMul/Gemm layers with constant weights W (Q, K and V share one
X), per input channel j: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), with max|W_j| the largest
over all those layers' weights. The layers get W_j * s_j, X gets X_j / s_j: the float model
computes the same (up to float32 rounding). 1/s is folded into the producer when it is a
LayerNormalization (gamma, beta), a decomposed LayerNorm's last Mul/Add by constants or a Keras
LayerNorm by moments (tf2onnx: x * m + (beta - mean * m), m = r * gamma), also through a Gather of
tokens (a ViT's [CLS]) and through Reshape-like ops keeping the K channels last (tf2onnx's Dense:
Reshape to [-1, K]), and nothing else reads X's values (a Shape reads none); otherwise a Mul by a
constant is inserted (as NNCF does): above those Reshapes and last-axis-keeping Transposes where X
comes through them, else right before the layers, except before a Gemm (OpenVINO computed both
Reshape -> Mul -> FakeQuantize -> Gemm and a Mul right before a Gemm's FakeQuantize wrongly). The
layers are the placement's int8 MatMul/Gemm but attention's output projection. The statistics are
the per-channel max |x| calibrate stores for the inputs of every MatMul/Gemm with a constant weight
(qtool.statistics.stats.new_stats).

Which models: "auto" smooths every transformer (qtool.quantizers.patterns.transformer_structure) and, on
the CPU targets (OpenVINO, Q/DQ), any other model's activations whose estimated gain (`estimate`) is at
least CLEAR_GAIN_DB, from peaks over at least MIN_ROWS values per channel (NNCF's TRANSFORMER preset
smooths every MatMul, its default preset none): a GRU decoder's output MatMul reading outlier channels
gains as a transformer's layers do. Other targets (`beyond` False) smooth transformers only.

alpha: per activation, the one of ALPHAS (or no smoothing) with the least estimated output noise
(`noise`: activation and weight rounding noise through the layers, from the stored maxima, the
weights and the tensor's mean square); NNCF uses 0.95 for every MatMul. The activation's step is
that of the range other inputs reach (`held_out_range`), not of the calibrated maximum: a channel's
peak is measured on a few sentences, and smoothing close to alpha 1 brings every channel's
calibrated peak to the edge of the range, where the held-out values of many channels clip (on
all-mpnet-base-v2's GELU outputs the estimate from the calibrated maximum picked 0.95 where 0.8
measured 3 dB better; on held-out sentences 70 % of the channels pass their calibrated peak). On the BERT and ViT
look-alikes of the tests the estimate beat both 0.95 and no smoothing in exact arithmetic
(e.g. ViT 39.6 dB against 30.3 and 37.2), and on paraphrase-MiniLM-L3-v2 it matched 0.95 in
OpenVINO (27.6 dB against 27.5; 22.5 without).

The smoothed activation's range: the exact max |x| after migration, max_j (max|X_j| / s_j),
which the stored per-channel maxima give; no histogram of X / s exists (the calibration ran the
original model), so its quantizer takes that maximum rather than a searched clipping threshold.

`smooth`: SmoothQuant as every export applies it (every target whose placement quantizes linear layers), on the
layers the target's own placement runs in int8.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..calibration import TensorRecord
from ..errors import Opt, QtoolError
from ..model import graph as G
from ..model import lazy, shapes
from ..statistics.stats import SampleStats
from . import patterns

# NNCF's clamps of the statistics and of the scales (openvinotoolkit/nncf
# src/nncf/quantization/algorithms/smooth_quant/algorithm.py: _clip_statistics a_min 1e-5,
# _calculate_scale_and_ratio: quantile 0.1 .. 1e2; its ALPHA_MAP gives MatMul 0.95)
STAT_FLOOR = 1e-5
SCALE_QUANTILE = 0.1
SCALE_MAX = 1e2


@dataclass
class Layer:
    node: str
    weight: str
    axis: int  # the weight's input-channel axis


@dataclass
class Group:
    tensor: str  # the activation the layers read (slot 0)
    layers: list[Layer]
    absmax: np.ndarray  # calibrated max |x| per channel (last axis)


@dataclass
class Smoothing:
    """What migration changed: the calibration records of the smoothed activations (replaced,
    or new for an inserted Mul's output) and their ranges, for the placement."""

    records: dict = field(default_factory=dict)  # tensor -> calibration.TensorRecord
    amax: dict[str, float] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    def calibration(self, cal):
        """`cal` with the smoothed activations' records (replaced in place, new ones appended)."""
        names = {t.name for t in cal.tensors}
        tensors = [self.records.get(t.name, t) for t in cal.tensors]
        tensors += [r for n, r in self.records.items() if n not in names]
        return replace(cal, tensors=tensors)


def parse_mode(value) -> str | bool | float:
    """smooth_quant option: "auto" (transformers only), True, False (also "true"/"false"/"on"/"off"),
    or alpha itself, a number in [0, 1] (on, that alpha everywhere instead of the estimated ones)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v in ("true", "on", "yes"):
            return True
        if v in ("false", "off", "no"):
            return False
        try:
            value = float(v)
        except ValueError:
            pass
    if isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0:
        return float(value)
    raise QtoolError("{option} must be auto, on, off or an alpha in [0, 1], not {given!r}", option=Opt("smooth_quant"), given=value)


def scales(act: np.ndarray, weight: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = act_j^alpha / weight_j^(1 - alpha), the statistics floored at STAT_FLOOR and the
    scales clamped to [their 10 % quantile, SCALE_MAX] (NNCF's clamps); 1 where not finite."""
    a = np.maximum(np.nan_to_num(np.asarray(act, np.float64), nan=0.0, posinf=0.0), STAT_FLOOR)
    w = np.maximum(np.nan_to_num(np.asarray(weight, np.float64), nan=0.0, posinf=0.0), STAT_FLOOR)
    s = np.power(a, alpha) / np.power(w, 1.0 - alpha)
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
    return np.clip(s, np.quantile(s, SCALE_QUANTILE), SCALE_MAX)


RESHAPES = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity"})  # values kept, in row-major order

ALPHAS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)  # what `estimate` chooses among (or no smoothing)


def _mean_square(record) -> float:
    """E[x^2] over the tensor's calibrated values, from its histogram (bin centres)."""
    counts = np.asarray(record.counts, dtype=np.float64)
    if not counts.sum():
        return 0.0
    edges = record.edges()
    centres = (edges[:-1] + edges[1:]) / 2
    return float((counts * centres**2).sum() / counts.sum())


# The spread of a channel's peak between inputs: on other inputs it is the calibrated peak times
# r_j, log-normal with this standard deviation of log r_j, independently per channel. Measured on
# the dev encoders, 64 calibration against 128 held-out sentences: sd of log r_j about 0.15 on
# LayerNorm outputs, 0.2-0.4 on MiniLM's GELU outputs and attention contexts, up to 0.58 on
# MPNet's GELU outputs. Chosen by the token SQNR in OpenVINO on the held-out sentences of
# bench/fidelity.py (all-MiniLM-L6-v2 exported and tokenized as bench/transformers_data.py does
# MPNet): 0.3 gives paraphrase-MiniLM-L3-v2 29.6 dB, all-MiniLM-L6-v2 24.1 and
# all-mpnet-base-v2 18.9 (0 -- the calibrated maximum -- 29.1, 24.0 and 18.0; 0.5 29.1, 24.0, 19.0).
PEAK_SPREAD = 0.3


def _normal_tail(z: np.ndarray) -> np.ndarray:
    """P(Z > z) of a standard normal (Abramowitz and Stegun 7.1.26, absolute error below 1e-7)."""
    x = np.abs(z) / np.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    half = 0.5 * poly * np.exp(-x * x)  # P(Z > |z|)
    return np.where(z >= 0, half, 1.0 - half)


def held_out_range(peaks: np.ndarray, spread: float = PEAK_SPREAD) -> float:
    """The max |x| other inputs are expected to reach over channels whose calibrated peaks are
    `peaks`: the T where the expected number of channels whose peak r_j * peaks_j passes T is one
    (log r_j normal, sd `spread`), at least max(peaks). One dominant channel keeps T near its
    peak; many channels at the same peak push it up (their largest r_j)."""
    u = np.asarray(peaks, np.float64)
    u = u[np.isfinite(u) & (u > 0)]
    if not u.size:
        return 0.0
    logs = np.log(u)
    lo = float(logs.max())
    if spread <= 0 or float(_normal_tail((lo - logs) / spread).sum()) <= 1.0:
        return float(u.max())
    hi = lo + 8.0 * spread  # past 8 sd no channel's tail is left
    for _ in range(50):
        mid = (lo + hi) / 2
        if float(_normal_tail((mid - logs) / spread).sum()) > 1.0:
            lo = mid
        else:
            hi = mid
    return float(np.exp(hi))


def noise(absmax: np.ndarray, weights: list[np.ndarray], s: np.ndarray, mean_square: float) -> float:
    """Estimated output noise power of the group's int8 layers with scales s: the activation
    quantizer (per tensor, step held_out_range(absmax / s) / 127, uniform noise on every channel)
    through the weights W * s, plus each output channel's weight quantizer (step max_j |W_jn s_j| / 127)
    through the activations, whose per-channel mean square is taken as absmax_j^2 scaled to the
    tensor's measured mean square (every channel the same peak-to-rms ratio). `weights`: [K, N]."""
    a = np.asarray(absmax, np.float64)
    ratio = mean_square / float(np.mean(a**2)) if np.mean(a**2) > 0 else 0.0
    x2 = a**2 * ratio / s**2
    step_x = held_out_range(a / s) / 127
    total = 0.0
    for w in weights:
        ws = w * s[:, None]
        step_w = np.abs(ws).max(axis=0) / 127
        total += step_x**2 / 12 * float((ws**2).sum()) + float(x2.sum()) * float((step_w**2).sum()) / 12
    return total


# Beyond transformers (`smooth`'s `beyond`), "auto" smooths an activation only when the estimate
# lowers its layers' output noise by at least CLEAR_GAIN_DB and each channel's calibrated peak is the
# maximum of at least MIN_ROWS values (tokens, frames, positions over all inputs). Measured on 16 zoo
# models (OpenVINO, worst output on held-out inputs; docs/benchmarks.md #smoothquant-beyond-transformers):
# estimated gains of 3.0-3.5 dB measured -1.9 .. +2.7 dB (magika's Dense after a LayerNorm -1.9, an FSMN's
# ReLUs -0.4), 5-13 dB gained (DeepFilterNet3's deep-filter decoder, its 256 -> 1 output MatMul reading a
# GRU's output + a skip: 5.9 dB estimated, 53.3 -> 61.6 dB). A classifier head reading pooled features
# has one row per input: its peaks over 16-64 inputs moved by up to 3x on held-out ones (magika), which
# the estimate's PEAK_SPREAD (from transformers' thousands of tokens) does not cover.
CLEAR_GAIN_DB = 4.0
MIN_ROWS = 1000


def _rows(record, k: int) -> float:
    """The values per channel a K-channel tensor's calibration saw (its histogram's count / K)."""
    return float(np.sum(np.asarray(record.counts, dtype=np.float64))) / max(k, 1)


def estimate(absmax: np.ndarray, weights: list[np.ndarray], mean_square: float, gain_db: float = 0.0) -> float | None:
    """The alpha of ALPHAS with the least estimated noise (`noise`), or None when no smoothing
    is estimated best or, with `gain_db`, when the best lowers the noise by less than that."""
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    plain = noise(absmax, weights, np.ones_like(wmax), mean_square)
    best, best_noise = None, plain
    for alpha in ALPHAS:
        n = noise(absmax, weights, scales(absmax, wmax, alpha), mean_square)
        if n < best_noise * (1 - 1e-6):  # a real gain, not rounding
            best, best_noise = alpha, n
    if best is not None and gain_db > 0 and not (np.isfinite(plain) and best_noise <= plain * 10.0 ** (-gain_db / 10)):
        return None
    return best


def groups(model: onnx.ModelProto, records: dict, only: set[str] | None = None) -> list[Group]:
    """The activations SmoothQuant can migrate, in graph order: read at slot 0 by MatMul (2-D
    weight [K, N]) or Gemm (transA 0) with an unshared float initializer as weight, whose record
    holds per-channel max |x| along the last axis for all K channels. `only`: the layer nodes
    allowed (those the placement runs in int8)."""
    index = G.Index(model)
    inits, readers, ops = index.initializers, index.readers, index.nodes
    found: dict[str, list[Layer]] = {}
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        if only is not None and n.name not in only:
            continue
        w = inits.get(n.input[1])
        if w is None or len(w.dims) != 2 or w.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        if len(readers.get(n.input[1], [])) != 1 or n.input[0] == n.input[1]:
            continue  # a shared weight (NNCF skips them too)
        if n.op_type == "Gemm":
            if int(G.attr(n, "transA", 0)):
                continue
            axis = 1 if int(G.attr(n, "transB", 0)) else 0
        else:
            axis = 0
        found.setdefault(n.input[0], []).append(Layer(n.name, n.input[1], axis))
    out = []
    for tensor, layers in found.items():
        record = records.get(tensor)
        stats = getattr(record, "stats", None)
        peak = None if stats is None else stats.channel_absmax
        if peak is None or not stats.count:
            continue
        want = -1 if ops[layers[0].node].op_type == "MatMul" else 1
        if stats.axis != want or any((-1 if ops[x.node].op_type == "MatMul" else 1) != want for x in layers):
            continue
        k = len(peak)
        if any(inits[x.weight].dims[x.axis] != k for x in layers):
            continue
        out.append(Group(tensor, layers, np.asarray(peak, dtype=np.float64)))
    return out


def _channel_constant(t: onnx.TensorProto | None, k: int) -> np.ndarray | None:
    """A float constant holding one value per last-axis channel (shape [..., K] or [..., 1], other
    dims 1), or None."""
    if t is None or t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        return None
    dims = list(t.dims)
    if any(d != 1 for d in dims[:-1]) or (dims and dims[-1] not in (1, k)):
        return None
    return lazy.value(t)


def _per_channel(value: np.ndarray, k: int, s: np.ndarray) -> np.ndarray:
    """value / s along the last axis (value broadcast to K channels, rank kept, at least 1)."""
    v = np.asarray(value, dtype=np.float64)
    shape = (*v.shape[:-1], k) if v.ndim else (k,)
    return (np.broadcast_to(v, shape) / s).astype(value.dtype)


class _Editor:
    """Edits to one model: constants replaced (a copy when shared), nodes inserted."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.namer = G.Namer(model)
        index = G.Index(model)  # as the model was: set_constant records the initializers it adds
        self.inits, self.readers, self.producer, self.outputs = index.initializers, index.readers, index.producer, index.outputs
        self.nodes = index.nodes

    def set_constant(self, node: onnx.NodeProto, slot: int, value: np.ndarray) -> None:
        """Give `node` input `slot` the constant `value`: in place when only it reads the
        initializer, else as a new initializer."""
        name = node.input[slot]
        if len(self.readers.get(name, [])) == 1:
            lazy.replace(self.inits[name], value)
            return
        new = self.namer.fresh(f"{name}/smooth_quant")
        t = numpy_helper.from_array(value, new)
        self.model.graph.initializer.append(t)
        self.inits[new] = t
        node.input[slot] = new
        self.readers.setdefault(new, []).append((node, slot))

    def value_readers(self, tensor: str) -> list[tuple[onnx.NodeProto, int]]:
        """The readers of `tensor` that read its values (a Shape reads only its shape: tf2onnx's Dense reads
        its input's shape beside the Reshape)."""
        return [(n, slot) for n, slot in self.readers.get(tensor, []) if not (n.op_type == "Shape" and n.domain in ("", "ai.onnx"))]

    def only_read_by(self, tensor: str, nodes: set[str]) -> bool:
        got = self.value_readers(tensor)
        return tensor not in self.outputs and bool(got) and all(n.name in nodes and slot == 0 for n, slot in got)

    def _sole(self, tensor: str, node: onnx.NodeProto) -> bool:
        """`node` is the only reader of `tensor`'s values, and `tensor` no graph output."""
        got = self.value_readers(tensor)
        return tensor not in self.outputs and len(got) == 1 and got[0][0] is node

    def fold(self, tensor: str, k: int, s: np.ndarray) -> tuple[str, list[str]] | None:
        """Divide `tensor` by s through its producer's constants: (how, the tensors above it that are divided
        too), or None when it cannot (then nothing is changed)."""
        found = self._fold(tensor, k, s)
        if found is None:
            return None
        how, edits, chain = found
        for node, slot, value in edits:
            self.set_constant(node, slot, value)
        return how, chain

    def _fold(self, tensor: str, k: int, s: np.ndarray):
        """What `fold` edits: (how, [(node, slot, new constant)], [tensors divided above `tensor`]), or None."""
        node = self.producer.get(tensor)
        if node is None or node.domain not in ("", "ai.onnx") or list(node.output[:1]) != [tensor]:
            return None
        if node.op_type == "Gather":  # tokens picked (a ViT's [CLS]): each channel stays itself
            source = node.input[0]
            rank = self.rank(source)
            axis = int(G.attr(node, "axis", 0))
            if rank is None or axis % rank == rank - 1 or not self._sole(source, node) or node.input[1] not in self.inits:
                return None
            return self._through(source, k, s, "Gather")
        if node.op_type in RESHAPES:  # tf2onnx's Dense reads its input through Unsqueeze and Reshape to [-1, K]
            source = node.input[0] if node.input else ""
            # row-major: with K the last dim of both, the flat index mod K (the channel) is kept
            if not source or self.last_dim(source) != k or self.last_dim(tensor) != k or not self._sole(source, node):
                return None
            return self._through(source, k, s, node.op_type)
        if node.op_type == "LayerNormalization":
            if int(G.attr(node, "axis", -1)) != -1:
                return None
            slots = [i for i in (1, 2) if i < len(node.input) and node.input[i]]
            values = [_channel_constant(self.inits.get(node.input[i]), k) for i in slots]
            if 1 not in slots or any(v is None for v in values):
                return None
            return "LayerNormalization", [(node, i, _per_channel(v, k, s)) for i, v in zip(slots, values)], []
        if node.op_type == "Mul":
            slot = self._constant_slot(node, k)
            if slot is None:
                return None
            return "Mul", [(node, slot, self._divided(node, slot, k, s))], []
        if node.op_type == "Add":
            moments = self._moments_norm(node, k)
            if moments is not None:
                return "LayerNorm by moments", [(n, i, self._divided(n, i, k, s)) for n, i in moments], []
            slot = self._constant_slot(node, k)  # beta after a Mul by gamma read by nothing else
            if slot is None:
                return None
            mul = self.producer.get(node.input[1 - slot])
            if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or not self._sole(mul.output[0], node):
                return None
            gamma = self._constant_slot(mul, k)
            if gamma is None:
                return None
            return "Mul+Add", [(node, slot, self._divided(node, slot, k, s)), (mul, gamma, self._divided(mul, gamma, k, s))], []
        return None

    def _through(self, source: str, k: int, s: np.ndarray, op: str):
        found = self._fold(source, k, s)
        if found is None:
            return None
        how, edits, chain = found
        # above a Reshape the same values (their records replaced too); above a Gather more tokens than it picks
        return f"{how} through {op}", edits, [source, *chain] if op in RESHAPES else []

    def _divided(self, node: onnx.NodeProto, slot: int, k: int, s: np.ndarray) -> np.ndarray:
        return _per_channel(lazy.value(self.inits[node.input[slot]]), k, s)

    def _moments_norm(self, add: onnx.NodeProto, k: int) -> list[tuple[onnx.NodeProto, int]] | None:
        """A LayerNorm by moments as tf2onnx writes Keras' (x * m + (beta - mean * m), m = r * gamma: `add` is
        its last node), as [(node, slot)] of gamma and beta, or None. Dividing both by s divides its output by s."""
        if len(add.input) != 2:
            return None
        for i in (0, 1):
            mul1, sub = self.producer.get(add.input[i]), self.producer.get(add.input[1 - i])
            if (mul1 is None or sub is None or mul1.op_type != "Mul" or sub.op_type != "Sub" or len(sub.input) != 2
                    or not self._sole(mul1.output[0], add) or not self._sole(sub.output[0], add)):
                continue
            beta = sub.input[0]
            if _channel_constant(self.inits.get(beta), k) is None or self.inits[beta].dims[-1:] != [k]:
                continue
            mul2 = self.producer.get(sub.input[1])
            if mul2 is None or mul2.op_type != "Mul" or not self._sole(mul2.output[0], sub):
                continue
            shared = set(mul1.input) & set(mul2.input)
            m = self.producer.get(next(iter(shared))) if len(shared) == 1 else None
            if m is None or m.op_type != "Mul" or sorted(n.name for n, _ in self.value_readers(m.output[0])) != sorted([mul1.name, mul2.name]):
                continue
            if m.output[0] in self.outputs or any(n.domain not in ("", "ai.onnx") for n in (mul1, sub, mul2, m)):
                continue
            gamma = self._constant_slot(m, k)
            if gamma is None:
                continue
            return [(m, gamma), (sub, 0)]
        return None

    def _constant_slot(self, node: onnx.NodeProto, k: int) -> int | None:
        """The slot of a per-channel constant [..., K] (a LayerNorm's gamma or beta). Not a
        scalar: made per channel it would hide patterns runtimes fuse (GELU's x * 0.5); a Mul is
        inserted there instead."""
        if len(node.input) != 2:
            return None
        for slot in (1, 0):
            t = self.inits.get(node.input[slot])
            if (_channel_constant(t, k) is not None and t.dims and t.dims[-1] == k
                    and node.input[1 - slot] not in self.inits):
                return slot
        return None

    def rank(self, tensor: str) -> int | None:
        """The rank of `tensor` by onnx's shape inference (shapes.inferred: shared, without the weight data), or None."""
        if not hasattr(self, "_ranks"):
            found = shapes.inferred(self.model)  # None: a model onnx cannot infer, ranks unknown
            inferred = found.graph if found is not None else self.model.graph
            shaped = [v for v in [*inferred.value_info, *inferred.input, *inferred.output] if v.type.tensor_type.HasField("shape")]
            self._ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in shaped}
            self._last = {v.name: v.type.tensor_type.shape.dim[-1].dim_value for v in shaped
                          if v.type.tensor_type.shape.dim and v.type.tensor_type.shape.dim[-1].HasField("dim_value")}
        return self._ranks.get(tensor)

    def last_dim(self, tensor: str) -> int | None:
        """The static size of `tensor`'s last axis by onnx's shape inference, or None."""
        self.rank(tensor)
        return self._last.get(tensor)

    def reshapes_above(self, tensor: str, k: int) -> list[onnx.NodeProto]:
        """The Reshape-like ops (and Transposes keeping the last axis) that write `tensor` from an activation, nearest
        first, each keeping the K channels of the last axis and each output but `tensor`'s read by the next alone
        (tf2onnx's Dense input: Reshape to [-1, K]; PyTorch's sequence-first attention: Transpose, Reshape)."""
        chain, t = [], tensor
        while True:
            node = self.producer.get(t)
            if (node is None or node.domain not in ("", "ai.onnx") or not node.input or list(node.output[:1]) != [t]
                    or (chain and not self._sole(t, chain[-1])) or self.last_dim(node.input[0]) != k or self.last_dim(t) != k):
                return chain
            if node.op_type == "Transpose":
                perm, rank = G.attr(node, "perm", None), self.rank(t)
                if perm is None or rank is None or list(perm)[-1] != rank - 1:
                    return chain
            elif node.op_type not in RESHAPES:
                return chain
            chain.append(node)
            t = node.input[0]

    def insert_mul(self, tensor: str, layers: list[str], inverse: np.ndarray, rank: int | None) -> str:
        """X * (1/s) before the layers (which then read it); returns the new tensor. The constant
        has X's rank when known: OpenVINO 2026.4 computed a [K] one before a FakeQuantize on a
        [N, K] tensor wrongly (12 dB against 46 in exact arithmetic), a [1, K] one right."""
        g = self.model.graph
        const = self.namer.fresh(f"{tensor}/smooth_quant/scale")
        shape = (1,) * (rank - 1) + inverse.shape if rank else inverse.shape
        g.initializer.append(numpy_helper.from_array(inverse.reshape(shape), const))
        out = self.namer.fresh(f"{tensor}/smooth_quant")
        node = helper.make_node("Mul", [tensor, const], [out], name=self.namer.fresh(f"{tensor}/smooth_quant/Mul"))
        wanted = set(layers)
        first = min(i for i, n in enumerate(g.node) if n.name in wanted)
        for n in g.node:
            if n.name in wanted and n.input[0] == tensor:
                n.input[0] = out
        g.node.insert(first, node)
        return out


def _record(record, name: str, s: np.ndarray, peak: np.ndarray, stats: bool = True):
    """The calibration record of X / s: its exact max |x| from the per-channel maxima, min and
    max bounded from the original's; the original histogram stretched to the new maximum
    (its shape is what the overflow estimate reads; no threshold is searched on it). `stats` False
    (the same values above a Reshape, whose per-channel statistics may lie along another axis): none."""
    amax = float(peak.max()) if peak.size else 0.0
    lo_s, hi_s = float(s.min()), float(s.max())
    low = record.min / (lo_s if record.min < 0 else hi_s)
    high = record.max / (lo_s if record.max > 0 else hi_s)
    low, high = max(low, -amax), min(high, amax)
    stretch = amax / record.absmax if record.absmax > 0 else 1.0
    st = record.stats if stats else None
    stats = None if st is None else SampleStats(st.count, st.min_sum, round(st.absmax_sum * stretch), st.axis,
                        None if st.channel_sums is None else [round(v / sj) for v, sj in zip(st.channel_sums, s.tolist())],
                        [float(p) for p in peak], True, gram=None if st.gram is None else st.gram.scaled(1.0 / s))
    return TensorRecord(name=name, min=low, max=high, amax=amax, counts=list(record.counts),
                        hist_range=record.hist_range * stretch, nonfinite=record.nonfinite, stats=stats)


def apply(model: onnx.ModelProto, cal, alpha: float | None = None, only: set[str] | None = None, gain_db: float = 0.0) -> Smoothing:
    """Migrate every group's activation scales into its layers' weights (`model` edited in place,
    node names unique). alpha None: per group, the one `estimate` picks (or none; `gain_db`: its
    least estimated gain). Returns the smoothed activations' records and ranges."""
    records = {t.name: t for t in cal.tensors}
    editor = _Editor(model)
    done = Smoothing()
    folded = inserted = layers = 0
    chosen = []
    for group in groups(model, records, only):
        ws = [lazy.value(editor.inits[x.weight]) for x in group.layers]
        kn = [(w.astype(np.float64) if x.axis == 0 else w.astype(np.float64).T) for w, x in zip(ws, group.layers)]  # [K, N]
        wmax = np.max([np.abs(w).max(axis=1) for w in kn], axis=0)
        if gain_db > 0 and _rows(records[group.tensor], len(group.absmax)) < MIN_ROWS:
            continue
        a = alpha if alpha is not None else estimate(group.absmax, kn, _mean_square(records[group.tensor]), gain_db)
        if a is None:
            continue
        chosen.append(a)
        s = scales(group.absmax, wmax, a)
        k = s.size
        names = {x.node for x in group.layers}
        found = editor.fold(group.tensor, k, s) if editor.only_read_by(group.tensor, names) else None
        chain = editor.reshapes_above(group.tensor, k) if found is None and editor.only_read_by(group.tensor, names) else []
        if found is None and not chain and editor.nodes[group.layers[0].node].op_type == "Gemm":
            # OpenVINO 2026.4 computed Mul -> FakeQuantize -> Gemm wrongly (after a Gather: 11 dB against the exact
            # arithmetic on the ViT look-alike's head, also with its low-precision transformations off; after a
            # ReduceMean: 12 dB, test_openvino's transformer block): a Gemm input is smoothed only when folded or
            # with the Mul above a Reshape (tf2onnx's Dense), which it computes as written
            chosen.pop()
            continue
        for w, x in zip(ws, group.layers):
            shape = (k, 1) if x.axis == 0 else (1, k)
            lazy.replace(editor.inits[x.weight], (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype))
        inverse = (1.0 / s).astype(ws[0].dtype)
        if found is not None:
            target, above = group.tensor, [(t, records[t]) for t in found[1] if t in records]
            folded += 1
        elif chain:
            # the Mul above the Reshapes: OpenVINO 2026.4 computed Reshape -> Mul -> FakeQuantize -> Gemm wrongly
            # (24 dB against the exact arithmetic on the tf2onnx BERT look-alike's value Dense; above it 134 dB), and
            # above a Transpose the FakeQuantize it becomes fuses into the Mul and the Transpose runs in int8
            source = chain[-1].input[0]
            mul = editor.insert_mul(source, [chain[-1].name], inverse, editor.rank(source))
            target, above = group.tensor, [(t, records[group.tensor]) for t in [mul, *(n.output[0] for n in chain[1:])]]
            inserted += 1
        else:
            target, above = editor.insert_mul(group.tensor, [x.node for x in group.layers], inverse, editor.rank(group.tensor)), []
            inserted += 1
        layers += len(group.layers)
        for name, record in [(target, records[group.tensor]), *above]:
            rec = _record(record, name, s, group.absmax / s, stats=name == target)
            done.records[name] = rec
            done.amax[name] = rec.amax
    if folded or inserted:
        done.summary = {"alpha": alpha if alpha is not None else "estimated", "activations": folded + inserted, "folded": folded,
                        "layers": layers}
        if alpha is None:
            done.summary["alphas"] = {str(v): chosen.count(v) for v in sorted(set(chosen))}
    return done


_VIEWS = RESHAPES | {"Transpose"}


def _reads_attention_context(index: G.Index, node: onnx.NodeProto) -> bool:
    """`node`'s data input is, through shape ops, the output of a MatMul of two activations (attention's context)."""
    t = node.input[0] if node.input else ""
    for _ in range(16):
        p = index.producer.get(t)
        if p is None or not p.input:
            return False
        if p.op_type == "MatMul":
            return all(i not in index.constants for i in p.input[:2])
        if p.op_type not in _VIEWS:
            return False
        t = p.input[0]
    return False


def _clear_gain(model, cal) -> bool:
    """Some activation `estimate` smooths with a gain of CLEAR_GAIN_DB or more from peaks over MIN_ROWS values or
    more, whatever the placement (weights read before placing: a model without one places once)."""
    records = {t.name: t for t in cal.tensors}
    inits = G.Index(model).initializers
    for group in groups(model, records):
        if _rows(records[group.tensor], len(group.absmax)) < MIN_ROWS:
            continue
        kn = [lazy.value(inits[x.weight]).astype(np.float64) for x in group.layers]
        kn = [w if x.axis == 0 else w.T for w, x in zip(kn, group.layers)]
        if estimate(group.absmax, kn, _mean_square(records[group.tensor]), CLEAR_GAIN_DB) is not None:
            return True
    return False


def smooth(model, cal, mode, place: Callable, beyond: bool = False):
    """SmoothQuant for an export (`model` with unique node names, edited in place): with mode
    "auto" when the graph has transformer structure (qtool.quantizers.patterns.transformer_structure)
    and, with `beyond` (the CPU targets), in other models on the activations whose estimated gain is
    CLEAR_GAIN_DB or more (from peaks over MIN_ROWS values or more), with True (or an alpha, `parse_mode`) always, on the linear layers the placement
    `place(model, cal)` (a qtool.quantizers.placement.Plan) runs in int8 with their input quantized.
    Returns (the calibration of the edited model, Smoothing or None, warnings)."""
    mode = parse_mode(mode)
    gain_db = 0.0
    if mode == "auto" and not patterns.transformer_structure(G.Index(model)):
        if not beyond or not _clear_gain(model, cal):
            return cal, None, []  # decided before placing: a CNN's export places once
        gain_db = CLEAR_GAIN_DB
    if mode is False:
        return cal, None, []
    plan = place(model, cal)
    # every input of an int8 layer is quantized, also where the placement moved its quantizer up through a
    # Reshape/Unsqueeze (tf2onnx's Dense: Reshape -> MatMul/Gemm; the site's readers then name the Reshape);
    # but not attention's output projection, which reads the context (softmax . V) through shape ops: smoothing it
    # cost ViT-S 1.2 dB (bench/guard_cost.py), g2p-id's BERT 0.1
    index = G.Index(model)
    # nor a layer whose input the model quantizes on its own grid (a dynamically quantized model's: placement.sites.model_grids)
    stated = {name for site in plan.activations if site.stated for name, _ in site.readers}
    layers = {n for n in plan.int8_layers if not _reads_attention_context(index, index.nodes[n]) and n not in stated}
    del plan  # the weights it read are not held while the smoothed ones are made (a big model's: its size again)
    gc.collect()  # the placement's objects refer to each other: freed only by a collection, which may not come before the peak
    alpha = mode if isinstance(mode, float) else None  # None: per activation, the alpha `estimate` picks
    done = apply(model, cal, alpha, only=layers, gain_db=gain_db)
    if not done.records:
        records = {t.name: t for t in cal.tensors}
        nodes = G.Index(model).nodes
        old = [n for n in sorted(layers) if nodes[n].op_type in ("MatMul", "Gemm")
               and getattr(records.get(nodes[n].input[0]), "stats", None) is not None
               and records[nodes[n].input[0]].stats.channel_absmax is None]
        if old:
            return cal, None, [f"SmoothQuant skipped: the calibration file has no per-channel maxima of the inputs of {len(old)} "
                               "linear layer(s) (made by an older qtool, or calibrated as a non-transformer); calibrate again to use it"]
        if mode != "auto":
            return cal, None, ["SmoothQuant changed nothing: no int8 MatMul/Gemm with an unshared constant weight reads its input directly"]
        return cal, None, []
    return done.calibration(cal), done, []
