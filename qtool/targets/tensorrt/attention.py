"""The attention core by measured error: whether Q.K^T and softmax.V keep the block faithful in
8 bits, estimated from the calibration histograms alone; a core that does not stays FP16.

TensorRT runs an attention core (Q.K^T -> [scale, mask] -> Softmax -> .V,
qtool.quantizers.patterns.attention_core) fused, all in one precision: INT8 (or FP8) when both
MatMuls have Q/DQ on their inputs, FP16 otherwise. The per-tensor grid of the probabilities is
where 8-bit integers fail: a row of n probabilities sums to 1, so most of them lie near 1/n, and
with amax near 1 the step is ~1/127: on a ViT (n = 197 or 257) most probabilities round to 0 and
the rows lose 15-20 % of their mass. FP8 (E4M3) keeps 3 significant bits down to 2^-6 of its
range and holds them; its coarser logits (E4M3's relative rounding of Q and K) are what it loses.

From each histogram of |x| (values spread evenly inside each bin, as
qtool.statistics.noise estimates them) under the grid the export writes:
  P, the probabilities the .V MatMul reads: E[P], E[P^2], the rounding error e = P - q(P) (its
     mean and mean square); n = 1 / E[P] (each row sums to 1);
  V and O, the .V MatMul's other input and its output (the block's attention output): E[V^2],
     E[eV^2] (V's rounding), E[O^2];
  Q and K, the Q.K^T inputs: E[Q^2], E[eQ^2], E[K^2], E[eK^2]; the head size d = (values of Q)
     / (sum of P) (Q has d values per row of P); c, the constant factor between Q.K^T and Softmax.
The error each adds to O, relative to E[O^2]:
  softmax.V, P's rounding: a row's errors sum to the mass it loses or gains (mean n E[e],
     variance n Var(e)), taken as falling on values as large as V's (E[V^2]: the worst case, when
     the error falls where the row's values are);
     V's rounding: n E[P^2] E[eV^2] (independent per value, weighted by the row's P^2);
  Q.K^T: the logits' error variance s2 = c^2 d (E[eQ^2] E[K^2] + E[Q^2] E[eK^2]); Softmax turns
     it into relative errors of P, which reach O as s2 n E[P^2] E[V^2]; the part of s2 from values
     clipped at amax reaches O as s2_clip E[V^2]: clipping cuts the largest products, the logits
     Softmax keeps (on MPNet, Q and K clipped by the mse thresholds cost 14-17 dB there).
The core's SQNR is 10 log10(E[O^2] / the sum); below MIN_SQNR_DB the core stays FP16. Checked
against the errors measured at O with only that core quantized (tests/test_tensorrt_attention.py;
README, TensorRT section): the softmax.V part errs low (toward FP16) by up to 10 dB on the bench
transformers; the Q.K^T part is rougher (16 dB low to 8 dB high).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...model import graph as G
from ...quantizers.patterns import AttentionCore, producer
from ...quantizers.rules import SHAPE_OPS
from ...statistics import noise

# An int8 activation quantizer on the bench transformers' linear-layer inputs leaves 20-40 dB,
# median 31.6 dB (ViT-S) and 31.8 dB (MiniLM): a core below 30 dB is the block's worst 8-bit step.
MIN_SQNR_DB = 30.0

Grid = Callable[[np.ndarray, float], np.ndarray]  # (|x| values, amax) -> their quantized values


def int8_grid(x: np.ndarray, amax: float) -> np.ndarray:
    """The INT8 Q/DQ model's activation grid: step amax / 127 in float32, saturating at 127 steps."""
    step = float(np.float32(amax) / np.float32(127.0))
    return np.minimum(np.rint(x / step), 127.0) * step


def _moments(record, amax: float, grid: Grid | None) -> noise.HistogramError | None:
    """The record's |x| histogram under `grid` (None: unquantized) with threshold `amax`: its
    figures mean, power, error, noise and the part `clipped` beyond amax, in float64."""
    if record.hist_range <= 0 or not (amax > 0 and math.isfinite(amax)):
        return None
    quantize = None if grid is None else (lambda x: grid(x, amax))
    return noise.histogram_error(record.counts, record.edges(), quantize, clip=amax)


def _own(m: G.Index, records: dict, t: str) -> str | None:
    """The calibrated tensor holding `t`'s values: `t`, or the nearest one above it through
    reshapes and transposes."""
    for _ in range(16):
        if t in records:
            return t
        p = producer(m, t)
        if p is None or p.op_type not in SHAPE_OPS - {"Slice", "Split"} or not p.input:
            return None
        t = p.input[0]
    return None


def core_sqnr(m: G.Index, core: AttentionCore, records: dict, amax: dict[str, float], grid: Grid) -> dict | None:
    """{"sqnr_db", "scores_db", "context_db"}: the estimated SQNR at the core's output with both
    MatMuls quantized on `grid`, and the part each MatMul alone leaves (the module docstring);
    the worst .V MatMul when there are several. None when a histogram or threshold is missing."""
    q, k = (_own(m, records, t) for t in core.scores.input[:2])
    worst = None
    for mm, slot in core.contexts:
        if len(mm.input) != 2:
            return None
        p, v, o = _own(m, records, mm.input[slot]), _own(m, records, mm.input[1 - slot]), mm.output[0]
        if None in (p, v, q, k) or o not in records:
            return None
        stats = [_moments(records[t], amax.get(t, 0.0), grid) for t in (p, v, q, k)]
        out = _moments(records[o], records[o].absmax, None)
        if None in stats or out is None:
            return None
        sp, sv, sq, sk = stats
        if not (sp.mean > 0 and out.power > 0):
            return None
        n = 1.0 / sp.mean
        concentration = n * sp.power  # sum of a row's P^2
        context = sv.power * ((n * sp.error) ** 2 + n * max(sp.noise - sp.error ** 2, 0.0)) + concentration * sv.noise
        scores = None
        if core.scale is not None:
            weight = core.scale ** 2 * sum(records[q].counts) / (sum(records[p].counts) * sp.mean)  # c^2 d
            logits = weight * (sq.noise * sk.power + sq.power * sk.noise)
            clipped = weight * (sq.clipped * sk.power + sq.power * sk.clipped)
            scores = ((logits - clipped) * concentration + clipped) * sv.power
        found = {"sqnr_db": noise.sqnr_db(out.power, context + (scores or 0.0)), "context_db": noise.sqnr_db(out.power, context),
                 "scores_db": None if scores is None else noise.sqnr_db(out.power, scores)}
        if worst is None or found["sqnr_db"] < worst["sqnr_db"]:
            worst = found
    return worst


def rule(records: dict, amax: dict[str, float], grid: Grid, precision: str) -> Callable[[G.Index, AttentionCore], str | None]:
    """The measured rule qtool.targets.tensorrt.rules.exclusions applies to each attention core:
    why it stays FP16 (the estimated SQNR below MIN_SQNR_DB), else None."""

    def why(m: G.Index, core: AttentionCore) -> str | None:
        found = core_sqnr(m, core, records, amax, grid)
        if found is None or found["sqnr_db"] >= MIN_SQNR_DB:
            return None
        parts = ", ".join(f"{label} {found[key]:.1f} dB" for label, key in (("Q.K^T", "scores_db"), ("softmax.V", "context_db"))
                          if found[key] is not None)
        return f"{precision} error: {found['sqnr_db']:.1f} dB SQNR at its output < {MIN_SQNR_DB:g} dB ({parts}; estimated from the calibration)"

    return why


def is_measured(why: str) -> bool:
    """A default exclusion's reason (as the summary gives it) is this rule's."""
    return why.startswith("attention core with ") and " error: " in why and "estimated from the calibration" in why
