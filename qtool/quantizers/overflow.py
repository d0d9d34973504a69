"""Where u8 x s8 pair sums can saturate on x86 CPUs without VNNI, estimated per layer from the
calibration histogram and the integer weights.

Without VNNI, onnxruntime's MLAS and OpenVINO's oneDNN multiply u8 activation codes by s8 weights
with vpmaddubsw, which adds each pair of adjacent products along the reduction axis into a
saturating int16 (onnxruntime onnxruntime/core/mlas/lib/x86_64/QgemmU8S8KernelAvx2.S; oneDNN's
"int8 computation behavior" notes; onnxruntime's reduce_range and NNCF's OverflowFix exist for
it). The code a runtime multiplies is the stored u8 value: q for an unsigned activation, q + 128
for a signed one (both runtimes shift s8 activations to u8 and correct with the zero point), so a
pair saturates when a1*|w1| + a2*|w2| > 32767 with w1, w2 of the same sign (opposite signs stay
within 255 * 127). With weights on [-63, 63] no pair can (255 * 63 * 2 < 32767).

The estimate, in units of (activation scale x weight scale), per output channel:
  saturation   the saturated pairs' expected squared excess over 32767. For an image (a tensor
               no linear layer computed: neighbouring channels and positions move together) both
               codes of a pair are one code drawn from the histogram, E[((a * S - 32767)+)^2] with
               S = |w1| + |w2|, and the pairs' excesses add coherently (they all lose in the same
               direction); for other activations the two codes are independent draws and so are
               the pairs' errors;
  7-bit cost   the weight rounding noise 7-bit weights add: K * E[q^2] * (step7^2 - 1) / 12;
  int8 noise   the layer's own rounding noise: K * E[q^2] / 12 + sum(w^2) / 12.
The noises take E[q^2], the codes' power about zero: the rounding noise of the layer without bias
correction. Bias correction (the default) takes the weight error's mean out, which on an image is
most of it (a ViT patch embedding on uniform noise: 3.7e6 measured with it against 1.2e7 by this
formula, 1.0e7 measured without; tests/test_overflow.py): so the dB this module reports are of
that larger noise. Weighing against the centred codes' power instead (E[q^2] less the channel means
squared) had the guard widen more and came out worse at the output of MTCNN's P-Net and R-Net, on
VNNI and AVX2 alike (docs/benchmarks.md#guard-avx2-native): SATURATION_WEIGHT and the guard's other
weights were measured with this yardstick.
Pairs are taken in the layouts runtimes use (MLAS: kernel position outer, channel inner, the
flattened axis paired; oneDNN, OpenVINO's CPU kernels: channels paired within a kernel position,
an odd channel count padded with a zero, so a 3-channel stem's third channel never saturates.
Measured on an AVX2 CPU with a 3x3 Conv of 3, 5 and 16 channels whose same-sign weights pair only
across kernel positions: OpenVINO 2026.4 gives the exact sum, onnxruntime 1.32 saturates);
`runtime="openvino"` takes oneDNN's, else the worse of both counts. Depthwise
convolutions have no pairs along a reduction axis (channels are the vector lanes) and are never
at risk.

The remedy that keeps a layer int8 at the least cost (`pair_step`): widen the weight step of only
those output channels where a pair can pass int16, just enough that none can: per channel the
step s >= max over same-sign pairs of (a1 |w1| + a2 |w2|) / (32767 - (a1 + a2) / 2), with a1, a2
the largest codes the two input channels reach (255, or from the calibrated per-channel max |x|
where calibration recorded it: transformers' linear-layer inputs); the rounding of each code adds
at most a half. 7-bit weights (NNCF's OverflowFix) are the special case of every channel at twice
its step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from ..model import graph as G
from . import grids

LIMIT = 32767
CODES = np.arange(256, dtype=np.float64)
SEVEN_BIT_STEP = 127 / 63  # the 7-bit weight step on the 8-bit grid (policy.weight_params, headroom 1)


@dataclass(frozen=True)
class Risk:
    """One layer's estimate (sums over output channels, units of activation x weight scale)."""

    saturation: float  # expected squared error from saturated pairs
    seven_bit: float  # extra rounding noise of 7-bit weights
    noise: float  # the int8 layer's own rounding noise
    share: float  # share of calibrated activation codes that saturate the layer's largest pair
    weight_power: float = 0.0  # sum(q^2) over the integer weights (a layer with weights): noise's input part is it / 12

    def describe(self) -> str:
        return (f"saturation noise {db(self.saturation, self.noise)} dB of the int8 noise "
                f"(7-bit weights add {db(self.seven_bit, self.noise)} dB); {self.share:.2%} of activation codes saturate its largest pair")


def db(x: float, ref: float) -> str:
    if x <= 0:
        return "-inf"
    if ref <= 0:
        return "+inf"
    return f"{10 * np.log10(x / ref):+.1f}"


def activation_codes(record, params: grids.QParams) -> tuple[np.ndarray, float]:
    """(P(code = a) for a in 0..255 from the positive values, E[q^2]) of the u8 code the kernel
    multiplies, from the record's histogram of |x|. A bin reachable by values of both signs is
    split evenly between them; negative values make small codes, which cannot saturate, and are
    left out of the distribution (not of E[q^2])."""
    counts = np.asarray(record.counts, dtype=np.float64)
    total = counts.sum()
    pmf = np.zeros(256)
    if total <= 0 or not np.isfinite(total) or params.axis is not None:
        return pmf, 0.0
    edges = record.edges()
    centre = (edges[:-1] + edges[1:]) / 2
    scale = float(params.scale)
    g = params.grid
    zp = int(params.zero_point)
    q_pos = np.clip(np.rint(centre / scale) + zp, g.qmin, g.qmax)  # positive value centre -> its grid point
    q_abs = np.minimum(np.rint(centre / scale), max(g.qmax - zp, zp - g.qmin))
    can_pos = centre <= max(record.max, 0.0) + (edges[1] - edges[0])
    can_neg = centre <= max(-record.min, 0.0) + (edges[1] - edges[0])
    both = can_pos & can_neg
    weight = np.where(both, 0.5, np.where(can_pos, 1.0, 0.0))
    codes = np.clip(q_pos - g.qmin, 0, 255).astype(np.int64)  # the stored u8 value: q + 128 on the signed grid
    np.add.at(pmf, codes, counts * weight)
    return pmf / total, float((counts * q_abs ** 2).sum() / total)


def magnitude_codes(record, params: grids.QParams) -> tuple[np.ndarray, float]:
    """(P(|q| = k) for k in 0..127, E[q^2]) of a signed quantizer's codes, from the record's histogram of |x|."""
    counts = np.asarray(record.counts, dtype=np.float64)
    total = counts.sum()
    pmf = np.zeros(128)
    if total <= 0 or not np.isfinite(total):
        return pmf, 0.0
    edges = record.edges()
    q = np.minimum(np.rint((edges[:-1] + edges[1:]) / 2 / float(params.scale)), 127).astype(np.int64)
    np.add.at(pmf, q, counts)
    return pmf / total, float((counts * q.astype(np.float64) ** 2).sum() / total)


def reduction_rows(node: onnx.NodeProto, slot: int, q: np.ndarray, dims: dict, runtime: str = "any") -> list[np.ndarray]:
    """The weights of one linear layer as [output, reduction] matrices, one per pair layout
    `runtime` uses ("openvino": oneDNN's; "any": MLAS's and oneDNN's); [] when the kernel has no
    pairs along the reduction (depthwise)."""
    op = node.op_type
    if op == "Conv" and slot == 1 and q.ndim >= 3:
        if G.is_depthwise(node, dims):
            return []
        w = np.moveaxis(q, 1, -1)  # [O, k..., C]: channel inner
        c = w.shape[-1]
        padded = (np.concatenate([w, np.zeros((*w.shape[:-1], c % 2), w.dtype)], axis=-1) if c % 2 else w).reshape(w.shape[0], -1)
        return [padded] if runtime == "openvino" else [w.reshape(w.shape[0], -1), padded]
    if op == "ConvTranspose" and slot == 1 and q.ndim >= 3 and int(G.attr(node, "group", 1)) == 1:
        w = np.moveaxis(q, 0, -1)  # [C_out, k..., C_in]
        return [w.reshape(w.shape[0], -1)]
    if op == "MatMul" and q.ndim >= 2:
        w = q.reshape(-1, *q.shape[-2:])
        w = np.swapaxes(w, -1, -2) if slot == 1 else w  # rows: output columns (B) or rows (A)
        return [w.reshape(-1, w.shape[-1])]
    if op == "Gemm" and q.ndim == 2:  # B is [K, N] ([N, K] with transB), A is [M, K] ([K, M] with transA)
        k_first = not G.attr(node, "transB", 0) if slot == 1 else G.attr(node, "transA", 0)
        return [q.T if k_first else q]
    return []


def channel_codes(record, act: grids.QParams, k: int) -> np.ndarray | None:
    """The largest u8 code each of the `k` input channels of a linear layer reaches in calibration
    (the stored value: q + 128 on a signed grid), from the record's per-channel max |x| along the
    last axis; None when calibration did not record them for `k` channels."""
    stats = getattr(record, "stats", None)
    peak = None if stats is None else stats.channel_absmax
    if peak is None or len(peak) != k or stats.axis not in (-1, None) or act.axis is not None:
        return None
    g = act.grid
    q = np.rint(np.asarray(peak, dtype=np.float64) / float(act.scale)) + int(act.zero_point)
    return np.clip(np.minimum(q, g.qmax) - g.qmin, 0, 255)


def pair_step(rows: np.ndarray, codes: np.ndarray | None = None) -> np.ndarray:
    """Per row of float weights [output, reduction] (one layout of `reduction_rows`): the smallest
    weight step that keeps every same-sign adjacent pair within int16 when the input channels
    reach the u8 codes `codes` (None: 255 everywhere), and 0 for a row without same-sign pairs."""
    w = np.asarray(rows, dtype=np.float64)
    a = np.full(w.shape[1], 255.0) if codes is None else np.asarray(codes, dtype=np.float64)
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros((w.shape[0], 1))], axis=1)
        a = np.concatenate([a, [0.0]])
    w1, w2, a1, a2 = w[:, 0::2], w[:, 1::2], a[0::2], a[1::2]
    need = (a1 * np.abs(w1) + a2 * np.abs(w2)) / (LIMIT - (a1 + a2) / 2)
    need = np.where(w1 * w2 > 0, need, 0.0)
    return need.max(axis=1, initial=0.0)


def channel_step(node: onnx.NodeProto, slot: int, values: np.ndarray, dims: dict, axis: int | None,
                 codes: np.ndarray | None, runtime: str = "any") -> np.ndarray | None:
    """`pair_step` of a layer's float weights per channel of its weight quantizer (along `axis`;
    None: per tensor, one value), the worst over `runtime`'s pair layouts; None without pairs."""
    layouts = reduction_rows(node, slot, values, dims, runtime)
    if not layouts:
        return None
    per_row = np.max([pair_step(rows, codes if codes is not None and rows.shape[1] == len(codes) else None)
                      for rows in layouts], axis=0)
    if axis is None:
        return np.asarray(per_row.max(initial=0.0))
    channels = values.shape[axis]
    return per_row.reshape(-1, channels).max(axis=0) if per_row.size % channels == 0 else np.full(channels, per_row.max(initial=0.0))


def widening_noise(mean_sq: float, k: int, ratio: np.ndarray) -> float:
    """The rounding noise weight steps widened by `ratio` per output row add (units as Risk's):
    K * E[q^2] * (ratio^2 - 1) / 12 per row."""
    return float(k * mean_sq * (np.asarray(ratio, dtype=np.float64) ** 2 - 1).sum() / 12)


def _pair_sums(rows: np.ndarray) -> np.ndarray:
    """|w1| + |w2| of each adjacent pair (0 when the signs differ: such a pair cannot saturate)."""
    w = rows.astype(np.int64)
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros((w.shape[0], 1), np.int64)], axis=1)
    a, b = w[:, 0::2], w[:, 1::2]
    return np.where(a * b > 0, np.abs(a) + np.abs(b), 0)


def _excess_sq_correlated(pmf: np.ndarray) -> np.ndarray:
    """Per pair sum S = 0..254: E[((a * S - LIMIT)+)^2] with both codes of the pair equal."""
    excess = np.maximum(np.outer(np.arange(255, dtype=np.float64), CODES) - LIMIT, 0.0)
    return (excess ** 2) @ pmf


_BIN = 8  # |w| in bins of 8 for the independent model (the bin centre stands for the bin)


def _excess_sq_independent(pmf: np.ndarray) -> np.ndarray:
    """Per binned (|w1|, |w2|): E[((a1 |w1| + a2 |w2| - LIMIT)+)^2] with a1, a2 independent.
    For each a2 the excess is positive for a1 > t = (LIMIT - a2 |w2|) / |w1|, so the sum over a1 is
    |w1|^2 S2(t) - 2 |w1| r S1(t) + r^2 S0(t) with r = LIMIT - a2 |w2| and S_k(t) the sums of
    P(a) a^k over the codes above t (suffix sums)."""
    centres = np.arange(_BIN / 2 - 0.5, 128, _BIN)
    suffix = np.zeros((3, 257))
    for k in range(3):
        suffix[k, :256] = np.cumsum((pmf * CODES ** k)[::-1])[::-1]
    u = centres[:, None, None]  # |w1|
    r = LIMIT - CODES[None, None, :] * centres[None, :, None]  # LIMIT - a2 |w2|, [1, w2, a2]
    first = np.clip(np.floor(r / u).astype(np.int64) + 1, 0, 256)  # the first code a1 above t
    s0, s1, s2 = suffix[0][first], suffix[1][first], suffix[2][first]
    inner = u ** 2 * s2 - 2 * u * r * s1 + r ** 2 * s0
    return np.maximum(inner, 0.0) @ pmf


def pair_codes(joint, p: int, act: grids.QParams, signs: tuple[int, int], offset: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u8 code of channel 2p, of channel 2p + 1, probability) over the non-empty bins of pair p
    of `joint` (qtool.statistics.pairs.ChannelPairs): the stored value the kernel multiplies (q +
    128 on a signed grid) of each bin's centre x, or of offset - x for a channel whose sign in
    `signs` is -1."""
    counts = joint.counts[p]
    i, j = np.nonzero(counts)
    prob = counts[i, j].astype(np.float64) / max(float(counts.sum()), 1.0)
    centre = joint.centres()
    g, scale, zp = act.grid, float(act.scale), int(act.zero_point)

    def code(x, sign):
        x = x if sign > 0 else offset - x
        return np.clip(np.rint(x / scale) + zp, g.qmin, g.qmax) - g.qmin

    return code(centre[i], signs[0]), code(centre[j], signs[1]), prob


def joint_saturation(rows: np.ndarray, channels: int, joint, act: grids.QParams, signs: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """Per row of integer weights [rows, reduction] in oneDNN's layout (channel inner, `channels`
    padded to even): the expected squared error its saturated pairs add to one output (units as
    `row_saturation`), the codes of each pair drawn together from calibration's joint histogram
    of that channel pair (`joint`), channel c's values x taken as offset - x where signs[c] is -1
    (the weights are given as the kernel multiplies them: with the signs applied). The pairs of
    an output add coherently, as in `row_saturation`'s image model."""
    per_position = channels + channels % 2
    w = np.asarray(rows, dtype=np.int64).reshape(rows.shape[0], -1, per_position)
    root = np.zeros(rows.shape[0])
    for p in range(joint.pair_count()):
        w1, w2 = w[:, :, 2 * p], w[:, :, 2 * p + 1]
        risky = (w1 * w2 > 0) & (np.abs(w1) + np.abs(w2) > LIMIT // 255)
        if not risky.any():
            continue
        a, b, prob = pair_codes(joint, p, act, (int(signs[2 * p]), int(signs[2 * p + 1])), offset)
        pairs, which = np.unique(np.stack([w1[risky], w2[risky]], axis=1), axis=0, return_inverse=True)
        total = pairs[:, :1] * a[None] + pairs[:, 1:] * b[None]
        excess = np.maximum(total - LIMIT, 0.0) + np.maximum(-LIMIT - 1 - total, 0.0)
        expected = np.sqrt((excess ** 2) @ prob)  # per distinct (w1, w2)
        np.add.at(root, np.nonzero(risky)[0], expected[which.reshape(-1)])  # each risky pair's, in row-major order
    return root ** 2


def assess_activations(record_a, act_a: grids.QParams, record_b, act_b: grids.QParams) -> Risk | None:
    """The saturation estimate of a MatMul of two activations A @ B (Q.K^T, softmax.V): the
    runtimes multiply A's u8 codes by B's s8 codes (B in the weights' place), pairs along the
    reduction axis, all four codes of a pair independent draws from the histograms and the two
    B codes of one sign half the time. Units as `assess`, per product (the reduction length
    cancels out); None unless both grids are 8-bit, per tensor, and B's signed (the s8 side)."""
    if (act_a.grid.qmax - act_a.grid.qmin != 255 or act_b.grid.qmax - act_b.grid.qmin != 255 or not act_b.grid.signed
            or act_a.axis is not None or act_b.axis is not None):
        return None
    pmf_a, sq_a = activation_codes(record_a, act_a)
    pmf_b, sq_b = magnitude_codes(record_b, act_b)
    binned = np.add.reduceat(pmf_b, np.arange(0, 128, _BIN))
    table = _excess_sq_independent(pmf_a)
    saturation = 0.25 * float(binned @ table @ binned)  # half the pairs, of one sign half the time
    noise = (sq_a + sq_b) / 12
    share = float(pmf_a[CODES * 254 > LIMIT].sum())
    return Risk(saturation, 3 * sq_a / 12, noise, share)


def row_saturation(q_rows: np.ndarray, pmf: np.ndarray, correlated: bool, tables: dict) -> np.ndarray:
    """Per row of integer weights [rows, reduction] (one layout of `reduction_rows`): the expected
    squared error its saturated pairs add to one output (units of activation x weight step), the
    activation codes drawn from `pmf` (see `assess` for `correlated`). `tables` caches the
    code tables between calls with the same pmf."""
    sums = _pair_sums(q_rows)
    if correlated:
        if "correlated" not in tables:
            tables["correlated"] = _excess_sq_correlated(pmf)
        return np.sqrt(tables["correlated"][sums]).sum(axis=1) ** 2  # coherent: the errors add up
    at_risk = sums > LIMIT // 255
    if not at_risk.any():
        return np.zeros(q_rows.shape[0])
    if "independent" not in tables:
        tables["independent"] = _excess_sq_independent(pmf)
    w = np.abs(q_rows.astype(np.int64))
    if w.shape[1] % 2:
        w = np.concatenate([w, np.zeros((w.shape[0], 1), np.int64)], axis=1)
    per_pair = tables["independent"][w[:, 0::2] // _BIN, w[:, 1::2] // _BIN]
    return np.where(at_risk, per_pair, 0.0).sum(axis=1)


def assess(node: onnx.NodeProto, slot: int, q: np.ndarray, dims: dict, record, act: grids.QParams,
           correlated: bool, runtime: str = "any") -> Risk | None:
    """The saturation estimate of one layer with integer weights `q` (at input `slot`) and the
    activation quantizer `act` (on 8 bits; None for other grids or a layer without pairs).
    correlated: the two activations of a pair are equal and the pairs of one output saturate
    together (an image: neighbouring channels and positions move together); otherwise they are
    independent and so are the pairs' errors. runtime: whose pair layouts (reduction_rows)."""
    if act.grid.qmax - act.grid.qmin != 255 or np.abs(q).max(initial=0) > 127:
        return None
    layouts = reduction_rows(node, slot, q, dims, runtime)
    if not layouts:
        return None
    pmf, mean_sq = activation_codes(record, act)
    worst = share = 0.0
    tables: dict = {}
    for rows in layouts:
        worst = max(worst, float(row_saturation(rows, pmf, correlated, tables).sum()))
        top = int(_pair_sums(rows).max(initial=0))
        if top:
            share = max(share, float(pmf[CODES * top > LIMIT].sum()))
    rows = layouts[0].astype(np.float64)
    k = q.size // rows.shape[0]  # the reduction length (a padded layout's zeros left out)
    power = float((rows ** 2).sum())
    noise = rows.shape[0] * k * mean_sq / 12 + power / 12
    seven = rows.shape[0] * k * mean_sq * (SEVEN_BIT_STEP ** 2 - 1) / 12
    return Risk(worst, seven, noise, share, power)


# the fractions of the way from a row's step to its pair bound (`pair_step`) tried by `least_noise_ratios`
FRACTIONS = np.array([0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
# saturation noise counts this many times its estimate against the widening's rounding noise: it lands on
# CPUs without VNNI only, but heavy-tailed and estimated from a per-tensor histogram (bench/guard_cost.py)
SATURATION_WEIGHT = 2.0


def widened_noise(rows: np.ndarray, step: np.ndarray, ratio: np.ndarray, stats: tuple[np.ndarray, float, int], correlated: bool,
                  tables: dict, saturation=None) -> tuple[np.ndarray, np.ndarray]:
    """Per row of float weights [rows, reduction] (oneDNN's layout) quantized with `step` x `ratio`
    per row: (the rounding noise the widening adds, k E[q^2] (r^2 - 1) / 12; the saturation noise
    expected, row_saturation x r^2, or `saturation`(integer rows) where given: joint_saturation),
    both in units of activation scale x the row's `step`. stats: (the activation codes' pmf,
    E[q^2], the reduction length k)."""
    pmf, mean_sq, k = stats
    r = np.maximum(np.asarray(ratio, dtype=np.float64), 1.0)
    s = np.maximum(np.asarray(step, dtype=np.float64), np.finfo(np.float64).tiny) * r
    q = np.clip(np.rint(np.asarray(rows, dtype=np.float64) / s[:, None]), -127, 127)
    sat = row_saturation(q, pmf, correlated, tables) if saturation is None else saturation(q)
    return k * mean_sq * (r ** 2 - 1) / 12, sat * r ** 2


def least_noise_ratios(rows: np.ndarray, step: np.ndarray, top: np.ndarray, stats: tuple[np.ndarray, float, int],
                       correlated: bool, saturation=None) -> np.ndarray:
    """Per row of float weights [rows, reduction] (oneDNN's layout) quantized with `step` per row:
    the widening ratio in [1, top] (top: the pair bound, where no pair can saturate) of least
    added rounding noise plus SATURATION_WEIGHT x the saturation noise still expected
    (`widened_noise`; stats and `saturation` as there), tried at FRACTIONS of the way to `top`."""
    top = np.maximum(np.asarray(top, dtype=np.float64), 1.0)
    tables: dict = {}
    best = np.full(top.shape, np.inf)
    ratio = np.ones(top.shape)
    for f in FRACTIONS:
        r = 1 + f * (top - 1)
        cost, sat = widened_noise(rows, step, r, stats, correlated, tables, saturation)
        total = cost + SATURATION_WEIGHT * sat
        better = total < best * (1 - 1e-12)
        best, ratio = np.where(better, total, best), np.where(better, r, ratio)
    return ratio


def product_codes(record_a, act_a: grids.QParams, record_b, act_b: grids.QParams) -> tuple[np.ndarray, np.ndarray] | None:
    """For a MatMul of two activations A @ B: (A's largest u8 code per reduction channel, the
    stored value as `channel_codes`; B's largest |s8 code| per reduction channel), from the
    calibrated per-channel max |x| along the axis each contracts (A's last, B's second to last);
    None where calibration did not record them (files before these statistics)."""
    sa, sb = getattr(record_a, "stats", None), getattr(record_b, "stats", None)
    if sa is None or sb is None or sa.channel_absmax is None or sb.channel_absmax is None or sb.axis != -2:
        return None
    k = len(sb.channel_absmax)
    a = channel_codes(record_a, act_a, k)
    if a is None or act_b.axis is not None or not act_b.grid.signed:
        return None
    b = np.rint(np.asarray(sb.channel_absmax, dtype=np.float64) / max(float(act_b.scale), np.finfo(np.float64).tiny))
    return a, np.minimum(b, -act_b.grid.qmin)


def operand_ratio(a: np.ndarray, b: np.ndarray) -> float:
    """The least factor B's step must widen by so that no adjacent pair a1 |b1| + a2 |b2| of the
    reduction passes int16 with A's codes `a` and B's |codes| `b` per channel (their largest;
    the rounding of B's codes adds at most a half each); 1 where none can."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size % 2:
        a, b = np.append(a, 0.0), np.append(b, 0.0)
    a1, a2, b1, b2 = a[0::2], a[1::2], b[0::2], b[1::2]
    need = (a1 * b1 + a2 * b2) / np.maximum(LIMIT - (a1 + a2) / 2, 1.0)
    return float(max(need.max(initial=0.0), 1.0))
