"""Clipping thresholds (amax) from a histogram of |x|: pure functions, no I/O.

`entropy_amax` reproduces NVIDIA's KL-divergence search exactly (reference:
NVIDIA/TensorRT tools/pytorch-quantization/pytorch_quantization/calib/histogram.py,
`_compute_amax_entropy`; same in NVIDIA/TensorRT-Model-Optimizer
modelopt/torch/quantization/calib/histogram.py):
  - h[0] = h[1] before searching;
  - nbins = 1 << (num_bits - 1 + unsigned) quantization levels;
  - candidates i = start_bin .. len(h) inclusive, step `stride`;
  - P = h[:i] with the outliers sum(h[i:]) added to P[i-1];
  - Q: bin j < i belongs to group floor(nbins * j / i) (what np.digitize over
    np.linspace(0, i, nbins + 1) gives, exactly, for integer j); each group's sum over its
    non-zero bins is spread evenly over those non-zero bins, zero bins stay zero;
  - divergence = scipy.stats.entropy(P, Q): both normalised, natural log, P > 0 where Q == 0
    gives +inf; the LAST minimum wins; amax = bin_edges[i].

Instead of building P and Q for every candidate (O(N^2)), the divergence of all candidates
is computed at once from prefix sums:
  T * KL(i) = sum_{j<i-1} h_j log h_j + p log p - sum_k G_k log(G_k / c_k) - o log q
              + T log(S_i / T)
with G_k, c_k the sum and non-zero count of group k, o the outliers, p = h[i-1] + o and q the
value Q gives bin i-1. Candidates whose fast divergence lies within rounding distance of the
minimum are then re-evaluated exactly as the reference does, so the chosen bin is the
reference's even when several candidates tie.
"""

from __future__ import annotations

import numpy as np


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros_like(x)
    pos = x > 0
    out[pos] = x[pos] * np.log(x[pos])
    return out


def _prepare(hist: np.ndarray, bin_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(hist)
    edges = np.asarray(bin_edges, dtype=np.float64)
    if h.ndim != 1 or edges.shape != (h.size + 1,):
        raise ValueError(f"need a 1-D histogram and len(hist) + 1 edges, got {h.shape} and {edges.shape}")
    if h.size and (not np.all(np.isfinite(h)) or h.min() < 0):
        raise ValueError("histogram counts must be finite and non-negative")
    return h, edges


def reference_divergence(h: np.ndarray, i: int, nbins: int) -> float:
    """KL(P||Q) of candidate i, evaluated the way the reference does (h[0] already replaced)."""
    h = np.asarray(h, dtype=np.float64)
    kept = h[:i]
    p = kept.copy()
    p[-1] += h[i:].sum()
    group = (nbins * np.arange(i)) // i
    nonzero = kept != 0
    sums = np.bincount(group[nonzero], weights=kept[nonzero], minlength=nbins)
    counts = np.bincount(group[nonzero], minlength=nbins)
    q = np.zeros(i)
    q[nonzero] = sums[group[nonzero]] / counts[group[nonzero]]
    return _kl(p, q)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.stats.entropy(p, q): normalise both, sum of rel_entr."""
    sp, sq = p.sum(), q.sum()
    if sp <= 0 or sq <= 0:
        return float("nan")
    p = p / sp
    q = q / sq
    if np.any((p > 0) & (q <= 0)):
        return float("inf")
    both = (p > 0) & (q > 0)
    terms = np.zeros_like(p)
    terms[both] = p[both] * np.log(p[both] / q[both])
    return float(terms.sum())


def entropy_divergences(h: np.ndarray, candidates: np.ndarray, nbins: int) -> np.ndarray:
    """Fast KL(P||Q) for every candidate i (h already has h[0] replaced), float64."""
    h = np.asarray(h, dtype=np.float64)
    total = h.sum()
    S = np.concatenate(([0.0], np.cumsum(h)))  # exact while counts < 2**53
    C = np.concatenate(([0], np.cumsum(h > 0)))
    HL = np.concatenate(([0.0], np.cumsum(_xlogx(h))))
    i = candidates.astype(np.int64)
    k = np.arange(nbins + 1, dtype=np.int64)
    bounds = (k[None, :] * i[:, None] + nbins - 1) // nbins  # first bin of group k: ceil(k*i/nbins)
    G = S[bounds[:, 1:]] - S[bounds[:, :-1]]
    c = C[bounds[:, 1:]] - C[bounds[:, :-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        glog = np.where(G > 0, G * np.log(np.where(G > 0, G, 1.0) / np.maximum(c, 1)), 0.0).sum(axis=1)
        last = h[i - 1]
        outliers = total - S[i]
        p = last + outliers
        rows = np.arange(i.size)
        k_last = (nbins * (i - 1)) // i  # group of bin i-1 (nbins-1 unless i < nbins)
        q = np.where(last > 0, G[rows, k_last] / np.maximum(c[rows, k_last], 1), 0.0)
        oq = np.where(outliers > 0, outliers * np.log(np.where(q > 0, q, 1.0)), 0.0)
        kl_t = HL[i - 1] + _xlogx(p) - glog - oq
        kept = S[i]
        div = kl_t / total + np.log(np.where(kept > 0, kept, 1.0) / total)
    div = np.where((last == 0) & (outliers > 0), np.inf, div)
    div = np.where(kept > 0, div, np.nan)
    return div


def entropy_amax(
    hist: np.ndarray,
    bin_edges: np.ndarray,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> float:
    """NVIDIA's entropy (KL-divergence) calibration: the amax minimising KL(P||Q).

    Returns 0.0 for an empty or all-zero histogram, and the last edge when the histogram
    has fewer bins than `start_bin` (there is nothing to search).
    """
    h, edges = _prepare(hist, bin_edges)
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    h = h.astype(np.float64)
    if h.size > 1:
        h[0] = h[1]
    if not np.any(h > 0):  # only the zero bin was populated
        return 0.0
    nbins = 1 << (num_bits - 1 + int(unsigned))
    candidates = np.arange(start_bin, h.size + 1, stride)
    if candidates.size == 0:
        return float(edges[-1])
    div = entropy_divergences(h, candidates, nbins)
    if np.isnan(div).any():
        # Candidates keeping only empty bins give NaN; the reference's reversed np.argmin
        # stops at the first NaN it meets, i.e. picks the last NaN candidate.
        return float(edges[candidates[np.flatnonzero(np.isnan(div))[-1]]])
    finite = np.isfinite(div)
    if not finite.any():
        best = candidates.size - 1 - int(np.argmin(div[::-1]))
        return float(edges[candidates[best]])
    lo = div[finite].min()
    tol = 1e-9 + 1e-7 * abs(lo)
    near = np.flatnonzero(finite & (div <= lo + tol))
    exact = np.array([reference_divergence(h, int(candidates[j]), nbins) for j in near])
    best = near[len(near) - 1 - int(np.argmin(exact[::-1]))]
    return float(edges[candidates[best]])


def max_amax(hist: np.ndarray, bin_edges: np.ndarray, absmax: float) -> float:
    """The largest |x| seen (no clipping)."""
    return float(absmax) if np.isfinite(absmax) and absmax > 0 else 0.0


METHODS = ("entropy", "max")
KL_VARIANTS = ("nvidia",)


def parse_method(text: str) -> str:
    """Validate a --method value (e.g. 'entropy', 'max'); returns it normalised."""
    method = text.strip().lower()
    if method not in METHODS:
        raise ValueError(f"unknown method {text!r}; choose one of {', '.join(METHODS)}")
    return method


def amax_for(
    method: str,
    hist: np.ndarray,
    bin_edges: np.ndarray,
    *,
    absmax: float,
    unsigned: bool = False,
    kl_variant: str = "nvidia",
    num_bits: int = 8,
) -> float:
    """The threshold `method` (as parse_method returns it) picks for one tensor's histogram."""
    if method == "entropy":
        if kl_variant != "nvidia":
            raise ValueError(f"unknown KL variant {kl_variant!r}")
        return entropy_amax(hist, bin_edges, num_bits=num_bits, unsigned=unsigned)
    if method == "max":
        return max_amax(hist, bin_edges, absmax)
    raise ValueError(f"unknown method {method!r}")
