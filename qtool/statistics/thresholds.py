"""Clipping thresholds (amax) from a histogram of |x|: pure functions, no I/O.

Every function takes OUR histogram: counts h[0..N) of |x| over N equal bins of width w whose
first edge is 0 (qtool.statistics.histogram: it ends at the bin holding max|x|, so N*w >= max|x|).

  method        function            reference
  entropy       entropy_amax        NVIDIA/Model-Optimizer modelopt/torch/quantization/calib/histogram.py
    --kl-variant nvidia                 `_compute_amax_entropy` (as NVIDIA's pytorch-quantization)
                ncnn_entropy_amax   Tencent/ncnn tools/quantize/ncnn2table.cpp `quantize_KL`
    --kl-variant ncnn
                ppq_entropy_amax    OpenPPL/ppq ppq/quantization/observer/range.py
    --kl-variant ppq                    `TorchHistObserver.hist_to_scale_offset`
  mse           mse_amax            the idea of NVIDIA's `_compute_amax_mse`, in float64
  percentile:P  percentile_amax     NVIDIA's `_compute_amax_percentile`
  max           max_amax            max|x|

Each KL variant picks the same bin as a slow literal transcription of the tool's algorithm run
on the same histogram (tests/literal.py). All arithmetic is float64; the tools' own float32
steps (ncnn's whole search, PPQ's histogram and distributions) are not imitated, so on two
candidates whose divergences differ by less than float32 rounding the tool itself may choose
the other one. An empty or all-zero histogram gives 0.0 for every method.

How the searches are fast without changing a chosen bin: every candidate is first evaluated by
an algebraic rewrite of the divergence (or error) over prefix sums, vectorised over all
candidates; then every candidate whose fast value lies within rounding distance of the best is
re-evaluated with exactly the operations, in exactly the order, of the literal algorithm, and
the tool's tie rule (NVIDIA: last minimum; ncnn, PPQ, mse: first minimum) picks among those.
The fast values only need to be accurate enough that the literal winner is re-evaluated.
Group boundaries depend only on the candidate and the number of levels, never on the data, so
they are computed once per (levels, size) and cached.
"""

from __future__ import annotations

import difflib
import math

import numpy as np

from . import noise

KL_VARIANTS = ("nvidia", "ncnn", "ppq")
METHODS = ("entropy", "max", "mse", "percentile:P", "auto")  # computed from a histogram
SAMPLE_METHODS = ("mean-minmax",)  # computed from per-sample statistics (TensorRecord.threshold)
_PLAIN_METHODS = ("entropy", "max", "mse", "mean-minmax", "auto")

_REL_TOL = 1e-7  # re-evaluate candidates this close to the best fast value (relative) ...
_ABS_TOL = 1e-9  # ... or absolute; the fast values are accurate to ~1e-12 of their size


# ---------------------------------------------------------------- shared helpers


def _prepare(hist: np.ndarray, bin_edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.asarray(hist)
    edges = np.asarray(bin_edges, dtype=np.float64)
    if h.ndim != 1 or edges.shape != (h.size + 1,):
        raise ValueError(f"need a 1-D histogram and len(hist) + 1 edges, got {h.shape} and {edges.shape}")
    if h.dtype.kind not in "iuf":
        raise ValueError(f"histogram counts must be numbers, got dtype {h.dtype}")
    if h.size and (not np.all(np.isfinite(h)) or h.min() < 0):
        raise ValueError("histogram counts must be finite and non-negative")
    if not np.all(np.isfinite(edges)):
        raise ValueError("bin edges must be finite")
    if h.size and h.dtype.kind in "iu" and int(h.max()) > (1 << 62) // h.size:
        h = h.astype(np.float64)  # the int64 total could overflow
    if h.size and h.dtype.kind == "f":
        _, exponent = math.frexp(float(h.max()))
        if abs(exponent) > 900:  # h ln h or the total could overflow: scale by a power of two,
            h = np.ldexp(h.astype(np.float64), -exponent)  # which keeps every ratio exact
    return h, edges


def _levels(num_bits: int, unsigned: bool) -> int:
    """Quantization levels on one side of zero: 128 for signed 8-bit, 256 for unsigned."""
    if not 2 <= int(num_bits) <= 16:
        raise ValueError(f"num_bits must be 2..16, got {num_bits}")
    return 1 << (int(num_bits) - 1 + int(bool(unsigned)))


def _xlogx(x: np.ndarray) -> np.ndarray:
    """x * ln(x), 0 where x <= 0."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _logs(values: np.ndarray, log=math.log) -> np.ndarray:
    """Elementwise C-library log (what the literal algorithms use), as float64."""
    return np.fromiter(map(log, values.tolist()), dtype=np.float64, count=values.size)


def _seqsum(values: np.ndarray) -> float:
    """Sum added strictly left to right, like a C or Python loop."""
    return float(np.add.accumulate(values)[-1]) if values.size else 0.0


def _near_best(fast: np.ndarray, abs_tol: float = _ABS_TOL) -> np.ndarray:
    """Indices of candidates whose fast value could be the exact minimum (all of them if no
    fast value is finite, so that the exact evaluation decides)."""
    finite = np.isfinite(fast)
    if not finite.any():
        return np.arange(fast.size)
    lo = fast[finite].min()
    return np.flatnonzero(finite & (fast <= lo + abs_tol + _REL_TOL * abs(lo)))


def _first_min(values: list[float]) -> int:
    """Index of the first minimum, like `if v < best` in a loop (NaN never wins)."""
    best, arg = math.inf, 0
    for j, v in enumerate(values):
        if v < best:
            best, arg = v, j
    return arg


_LAYOUTS: dict = {}
_CACHE_BINS = 4096  # layouts of histograms up to this size are cached whole (a few MB each)
_CHUNK = 1 << 15  # elements per candidate chunk: temporaries stay in cache


def _layout(kind: str, levels: int, n: int, build):
    """rows(index) -> the data-independent arrays `build(levels, candidates)` gives for the
    candidates `index` selects (a slice or an index array over 0 .. n): cached whole for
    histograms of up to _CACHE_BINS bins, built per chunk of candidates beyond that."""
    if n > _CACHE_BINS:
        def rows(index):
            if isinstance(index, slice):
                index = np.arange(index.start, index.stop)
            return build(levels, np.asarray(index, dtype=np.int64))

        return rows
    cap = max(1 << (max(n, 1) - 1).bit_length(), levels)
    key = (kind, levels, cap)
    table = _LAYOUTS.get(key)
    if table is None:
        if len(_LAYOUTS) >= 12:
            _LAYOUTS.clear()
        table = _LAYOUTS[key] = build(levels, np.arange(cap + 1, dtype=np.int64))
    return lambda index: tuple(a[index] for a in table)


# ---------------------------------------------------------------- NVIDIA


def reference_divergence(h: np.ndarray, i: int, nbins: int) -> float:
    """KL(P||Q) of candidate i with exactly the operations of NVIDIA's code (h[0] replaced).

    Integer counts stay int64 until NVIDIA divides by the total, as its code does.
    """
    kept = h[:i]
    p = kept.copy()
    p[-1] += h[i:].sum()
    group = (nbins * np.arange(i)) // i  # == np.digitize(j, np.linspace(0, i, nbins + 1)) - 1
    nonzero = kept != 0
    sums = np.bincount(group[nonzero], weights=kept[nonzero], minlength=nbins)  # float64, in bin order
    counts = np.bincount(group[nonzero], minlength=nbins)
    q = np.zeros(i)
    q[nonzero] = sums[group[nonzero]] / counts[group[nonzero]]
    return _scipy_entropy(p, q)


def _scipy_entropy(p: np.ndarray, q: np.ndarray) -> float:
    """scipy.stats.entropy(p, q): normalise both, sum rel_entr (C log) with np.sum."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = 1.0 * p / np.sum(p)
        q = 1.0 * q / np.sum(q)
    if np.isnan(p).any() or np.isnan(q).any():
        return float("nan")
    if np.any((p > 0) & (q <= 0)):
        return float("inf")
    both = (p > 0) & (q > 0)
    terms = np.zeros(p.size)
    terms[both] = p[both] * _logs(p[both] / q[both])
    return float(np.sum(terms))


def _nvidia_layout(nbins: int, i: np.ndarray):
    """Candidate i (row), group k: b = ceil(k*i/nbins), the first bin of group k."""
    return (-((-np.arange(nbins + 1, dtype=np.int64) * i[:, None]) // nbins),)


def _nvidia_table_layout(nbins: int, i: np.ndarray):
    """Each group as a flat index length * (cap+1) + start into the (length, start) table."""
    (b,) = _nvidia_layout(nbins, i)
    return (((b[:, 1:] - b[:, :-1]) * i.size + b[:, :-1]).astype(np.intp),)


def entropy_divergences(h: np.ndarray, candidates: np.ndarray, nbins: int) -> np.ndarray:
    """Fast KL(P||Q) of NVIDIA's search for every candidate i (h[0] already replaced), float64.

    With T the total, S_i = sum(h[:i]), o = sum(h[i:]), p = h[i-1] + o, G_k and c_k the sum
    and non-zero count of group k, and q = G/c of the group holding bin i-1:
      T * KL(i) = sum_{j<i-1} h_j ln h_j + p ln p - sum_k G_k ln(G_k / c_k) - o ln q + T ln(S_i / T)
    A group is fixed by its first bin and its length (<= ceil(i / nbins)), so up to
    nbins^2 bins G ln(G/c) is tabulated once per (length, start) and each candidate sums
    nbins table entries; beyond, the groups are summed directly, chunk by chunk.
    """
    h = np.asarray(h, dtype=np.float64)
    n = h.size
    total = h.sum()
    S = np.concatenate(([0.0], np.cumsum(h)))
    C = np.concatenate(([0], np.cumsum(h > 0)))
    HL = np.concatenate(([0.0], np.cumsum(_xlogx(h))))
    i = candidates.astype(np.intp)
    cap = max(1 << (max(n, 1) - 1).bit_length(), nbins)  # groups have at most lmax bins
    lmax = -(-cap // nbins)
    logn = np.log(np.arange(lmax + 1).clip(1))  # ln c for a count c of non-zero bins
    if n <= _CACHE_BINS and n <= nbins * nbins:
        pad = cap + lmax + 2 - S.size
        Sp = np.concatenate((S, np.full(pad, S[-1])))
        Cp = np.concatenate((C, np.full(pad, C[-1])))
        window = np.lib.stride_tricks.sliding_window_view
        G = window(Sp, cap + 1)[: lmax + 1] - Sp[: cap + 1]  # G[length, start]
        c = window(Cp, cap + 1)[: lmax + 1] - Cp[: cap + 1]
        log_g = np.log(G + (G == 0))  # 0 for an empty group
        log_g -= logn.take(c)
        table = (G * log_g).ravel()  # G ln(G / c), 0 for an empty group
        stride = i[1] - i[0] if i.size > 1 else 1
        index = slice(i[0], i[-1] + 1, stride) if np.all(np.diff(i) == stride) else i
        (flat,) = _layout("nvidia-table", nbins, n, _nvidia_table_layout)(index)
        glog = np.take(table, flat).sum(axis=1)
    else:
        rows = _layout("nvidia", nbins, n, _nvidia_layout)
        glog = np.empty(i.size)
        step = max(1, _CHUNK // nbins)
        for a in range(0, i.size, step):
            (b,) = rows(i[a : a + step])
            G = np.diff(S[b], axis=1)
            c = np.diff(C[b], axis=1)
            log_g = np.log(G + (G == 0))
            log_g -= logn.take(c)
            glog[a : a + step] = np.einsum("ij,ij->i", G, log_g)
    last = h[i - 1]
    outliers = total - S[i]
    k_last = (nbins * (i - 1)) // i  # group of bin i-1
    g0, g1 = -((-k_last * i) // nbins), -((-(k_last + 1) * i) // nbins)
    Gl, cl = S[g1] - S[g0], C[g1] - C[g0]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(last > 0, Gl / np.maximum(cl, 1), 0.0)
        oq = np.where((outliers > 0) & (q > 0), outliers * np.log(np.where(q > 0, q, 1.0)), 0.0)
        kept = S[i]
        kl_t = HL[i - 1] + _xlogx(last + outliers) - glog - oq
        div = kl_t / total + np.log(np.where(kept > 0, kept, 1.0) / total)
    div = np.where((last == 0) & (outliers > 0), np.inf, div)
    return np.where(kept > 0, div, np.nan)


def entropy_amax(
    hist: np.ndarray,
    bin_edges: np.ndarray,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> float:
    """NVIDIA's entropy (KL-divergence) calibration: the amax minimising KL(P||Q).

    NVIDIA's search (reference above): h[0] = h[1]; nbins = 1 << (num_bits - 1 + unsigned);
    candidates i = start_bin .. N step stride; P = h[:i] with the outliers sum(h[i:]) added
    to P[i-1]; Q spreads each of nbins groups (bin j in group floor(nbins*j/i)) evenly over
    its non-zero bins; divergence scipy.stats.entropy(P, Q); the LAST minimum wins;
    amax = bin_edges[i]. Returns 0.0 for an all-zero histogram and the last edge when there
    is no candidate (fewer than start_bin bins).
    """
    h, edges = _prepare(hist, bin_edges)
    nbins = _levels(num_bits, unsigned)
    if start_bin < 1 or stride < 1:
        raise ValueError(f"start_bin and stride must be >= 1, got {start_bin} and {stride}")
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    h = h.astype(np.int64 if h.dtype.kind in "iu" else np.float64)
    if h.size > 1:
        h[0] = h[1]
    if not np.any(h > 0):  # only the zero bin was populated
        return 0.0
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
        return float(edges[candidates[-1]])  # all +inf: the last one
    near = _near_best(np.where(finite, div, np.inf))
    if near.size == 1:  # nothing within rounding distance: the fast minimum is the reference's
        return float(edges[candidates[near[0]]])
    exact = [reference_divergence(h, int(candidates[j]), nbins) for j in near]
    best = near[len(near) - 1 - _first_min(exact[::-1])]
    return float(edges[candidates[best]])


# ---------------------------------------------------------------- ncnn

NCNN_EPS = float(np.float32(1e-4))  # ncnn's `kl_eps = 0.0001f`, the float32 value


def _ncnn_layout(levels: int, t: np.ndarray):
    """For threshold t (row), group g spans [x_g, x_{g+1}) with x_g = g*t/levels: floor(x_g),
    its fraction, and the fractions of the inner edges (g = 1 .. levels-1) on their own."""
    pos = np.arange(levels + 1, dtype=np.int64) * t[:, None]
    fr = (pos % levels) / levels
    return (pos // levels).astype(np.intp), fr, np.ascontiguousarray(fr[:, 1:-1])


def _ncnn_divergences(n: np.ndarray, levels: int) -> np.ndarray:
    """Fast ncnn divergence of every threshold t = levels .. len(n)-1 (n normalised), float64.

    P_j = n_j + eps (j < t-1), P_{t-1} = n_{t-1} + eps + o with o = sum(n[t:]). Q_g is the mass
    of [x_g, x_{g+1}) (cut bins pro rata) / w_t, w_t = t/levels; expanded, bin j gets
    E_j = eps + Q_g inside group g and eps + f Q_{g-1} + (1-f) Q_g in the bin floor(x_g) at an
    inner edge x_g (fraction f; with f = 0 both agree). KL = sum P ln P - sum P ln E. With T
    the prefix sums of n + eps, interpolated in cut bins, D_g = T(x_{g+1}) - T(x_g) equals
    w_t (eps + Q_g), so with the edge bins' P = n + eps:
      sum P ln E = sum_g ln D_g (T[fl_{g+1}] - T[fl_g]) + sum_inner P_edge ln(E_edge / D_g)
                   + o ln D_last - ln w_t (T[t] + o)
    Worked in chunks of candidates that stay in cache, on views of the cached layout.
    """
    rows = _layout("ncnn", levels, n.size, _ncnn_layout)
    t = np.arange(levels, n.size)
    ne = n + NCNN_EPS
    T = np.concatenate(([0.0], np.cumsum(ne)))
    S = np.concatenate(([0.0], np.cumsum(n)))
    PL = np.concatenate(([0.0], np.cumsum(_xlogx(ne))))
    outliers = S[-1] - S[t]
    p_last = ne[t - 1] + outliers
    p_log_e = np.empty(t.size)
    step = max(1, _CHUNK // 2 // (levels + 1))
    for a in range(0, t.size, step):
        fl, fr, f = rows(slice(levels + a, levels + min(a + step, t.size)))  # views when cached
        T_fl, ne_fl = T.take(fl), ne.take(fl)
        edge = fr * ne_fl
        edge += T_fl  # T(x_g)
        D = edge[:, 1:] - edge[:, :-1]
        log_d = np.log(D)
        E = D[:, :-1] - D[:, 1:]
        E *= f
        E += D[:, 1:]  # w_t * E at the edge bin of x_g, g = 1 .. levels-1
        ratio = np.log(E)
        ratio -= log_d[:, 1:]
        p_log_e[a : a + step] = (
            np.einsum("ij,ij->i", log_d, T_fl[:, 1:]) - np.einsum("ij,ij->i", log_d, T_fl[:, :-1])
            + np.einsum("ij,ij->i", ne_fl[:, 1:-1], ratio) + outliers[a : a + step] * log_d[:, -1]
        )
    return PL[t - 1] + p_last * np.log(p_last) - p_log_e + np.log(t / levels) * (T[t] + outliers)


def _ncnn_exact(n: np.ndarray, t: int, levels: int) -> float:
    """ncnn's divergence of threshold t with the literal algorithm's operations, in float64."""
    eps = NCNN_EPS
    N = n.size
    clip = eps + n[:t]
    clip[t - 1] = _seqsum(np.concatenate(([clip[t - 1]], n[t:])))  # outliers added one by one
    npb = t / levels
    g = np.arange(levels)
    start, end = g * npb, (g + 1) * npb
    lu = np.ceil(start).astype(np.intp)
    ls = lu - start
    rl = np.floor(end).astype(np.intp)
    rs = end - rl
    rl[-1], rs[-1] = t, 0.0  # the last group has no right part; the first has no left part
    lu[0], ls[0] = 0, 0.0
    # quantize: per group, 0 + left part + right part + whole bins, added in that order
    width = int((rl - lu).max())
    seq = np.zeros((levels, width + 2))
    seq[:, 0] = np.where(ls > 0, ls * n[np.maximum(lu - 1, 0)], 0.0)
    seq[:, 1] = np.where(rs > 0, rs * n[np.minimum(rl, N - 1)], 0.0)
    col = np.arange(width)
    whole = col < (rl - lu)[:, None]
    seq[:, 2:][whole] = n[(lu[:, None] + col)[whole]]
    Q = np.add.accumulate(seq, axis=1)[:, -1] / (((rl - lu) + ls) + rs)
    # expand: eps, then right part of group g-1, then left part of group g (bins cut by an edge)
    E = np.full(t, eps)
    reps = rl - lu
    E[np.repeat(lu, reps) + (np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps))] += np.repeat(Q, reps)
    r = rs > 0
    E[rl[r]] += rs[r] * Q[r]
    left = ls > 0
    E[lu[left] - 1] += ls[left] * Q[left]
    return _seqsum(clip * _logs(clip / E))


def ncnn_entropy_amax(hist: np.ndarray, bin_edges: np.ndarray, num_bits: int = 8, unsigned: bool = False) -> float:
    """ncnn's KL calibration (Tencent/ncnn tools/quantize/ncnn2table.cpp, 2021 rewrite).

    ncnn's search: n = h / sum(h); thresholds t = levels .. N-1 (ncnn: 128 .. 2047);
    P = n[:t] + eps with sum(n[t:]) added to P[t-1]; Q = n[:t] merged into `levels` groups
    of t/levels bins with fractional (interpolated) edges, each group's mass / t*levels, zero
    bins NOT excluded; expanded back with the same overlap weights, + eps; eps = 0.0001f;
    KL = sum P ln(P / E) (no normalisation); the FIRST minimum wins;
    threshold = (t + 0.5) * bin width, the centre of bin t.

    Mapping onto our histogram: ncnn's 2048 bins over [0, absmax] are our N bins over
    [0, N*w] (N*w >= absmax, N between bins/2 + 1 and bins), so our bins can be up to twice
    as wide as ncnn's; ncnn skips exact zeros while building its histogram, ours count them in
    bin 0; ncnn searches in float32, we in float64. levels = 1 << (num_bits - 1 + unsigned):
    ncnn itself always uses 128 (pass unsigned=False to reproduce it). With N <= levels there
    is no threshold to try and the last edge is returned.
    """
    h, edges = _prepare(hist, bin_edges)
    levels = _levels(num_bits, unsigned)
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    if h.size <= levels:
        return float(edges[-1])
    h = h.astype(np.float64)
    n = h / h.sum()
    candidates = np.arange(levels, h.size)
    fast = _ncnn_divergences(n, levels)
    near = _near_best(fast)
    best = near[0] if near.size == 1 else near[_first_min([_ncnn_exact(n, int(candidates[j]), levels) for j in near])]
    t = int(candidates[best])
    return float(0.5 * (edges[t] + edges[t + 1]))


# ---------------------------------------------------------------- PPQ

PPQ_EPS = 1e-30  # torch_KL_divergence's eps (ppq/quantization/measure/statistic.py)


def _ppq_histogram(h: np.ndarray, levels: int) -> np.ndarray:
    """Our histogram as PPQ's observer would hold it: padded with empty bins to a multiple of
    `levels`, the first 0.2 % of bins zeroed and the next one set to 1."""
    m = -(-h.size // levels) * levels
    hh = np.zeros(m)
    hh[: h.size] = h
    k = int(m * 0.002)
    hh[:k] = 0.0
    hh[k] = 1.0
    return hh


def _ppq_divergences(hh: np.ndarray, levels: int) -> np.ndarray:
    """Fast PPQ divergence (log10) of every bin range B = levels * m, m = 1 .. len(hh)/levels.

    p = hh[:B] / H with the outliers o added to the last bin; q_j = [hh_j > 0] G_g / c_g / S_B
    (G, c: group sum and non-zero count; S_B = sum(hh[:B]) = sum of q before normalising).
      ln10 * KL = sum p ln p - sum_g (G_g/H) ln(G_g / (c_g S_B)) - (o/H) ln q_last
    where q_last is PPQ's eps when bin B-1 is empty (then p ln(p + eps) - p ln eps).
    """
    H = hh.sum()
    S = np.concatenate(([0.0], np.cumsum(hh)))
    C = np.concatenate(([0], np.cumsum(hh > 0)))
    XL = np.concatenate(([0.0], np.cumsum(_xlogx(hh))))
    m = np.arange(1, hh.size // levels + 1)
    B = m * levels
    bounds = m[:, None] * np.arange(levels + 1)
    G = np.diff(S[bounds], axis=1)
    c = np.diff(C[bounds], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        glog = np.where(G > 0, G * np.log(np.where(G > 0, G, 1.0) / np.maximum(c, 1)), 0.0).sum(axis=1)
        kept = S[B]
        outliers = H - kept
        last = hh[B - 1]
        p_log_p = (XL[B - 1] + _xlogx(last + outliers)) / H - np.log(H)
        log_kept = np.log(np.where(kept > 0, kept, 1.0))
        q_last = G[:, -1] / (np.maximum(c[:, -1], 1) * np.where(kept > 0, kept, 1.0))
        log_q_last = np.where(last > 0, np.log(np.where(q_last > 0, q_last, 1.0)), math.log(PPQ_EPS))
        p_log_q = (glog - kept * log_kept + outliers * log_q_last) / H
        div = (p_log_p - p_log_q) / math.log(10)
    return np.where(kept > 0, div, np.nan)  # nothing kept: PPQ divides 0 by 0


def _ppq_exact(hh: np.ndarray, B: int, levels: int, hist_sum: float) -> float:
    """PPQ's divergence of bin range B with the literal algorithm's operations, in float64."""
    p = hh[:B].copy()
    p[-1] += _seqsum(hh[B:])
    p = p / hist_sum
    ratio = B // levels
    blocks = hh[:B].reshape(levels, ratio)
    positive = blocks > 0
    cnt = positive.sum(axis=1)
    cnt[cnt == 0] = 1
    q = (np.add.accumulate(blocks, axis=1)[:, -1] / cnt)[:, None] * positive
    q = q.ravel()
    q = q / _seqsum(q)
    if np.isnan(q).any():
        return float("nan")
    terms = p * (_logs(p + PPQ_EPS, math.log10) - _logs(q + PPQ_EPS, math.log10))
    return _seqsum(terms)


def ppq_entropy_amax(hist: np.ndarray, bin_edges: np.ndarray, num_bits: int = 8, unsigned: bool = False) -> float:
    """PPQ's KL calibration (OpenPPL/ppq ppq/quantization/observer/range.py, TorchHistObserver).

    PPQ's search: histogram[:int(bins * 0.002)] = 0 and the next bin = 1; bin ranges
    B = 128, 256, ... up to the whole histogram; P = h[:B] with sum(h[B:]) added to the last
    bin, / sum(h); Q = B/128 consecutive bins per group, the group sum spread over its non-zero
    bins, normalised; KL = dot(P, log10(P + 1e-30) - log10(Q + 1e-30)); the FIRST minimum wins
    (a stable sort); PPQ's scale is B * w / 128, i.e. amax = B * w.

    Mapping onto our histogram: PPQ's 4096 bins over [0, absmax] are our N bins over [0, N*w],
    zero-padded with empty bins (above max|x|) to a multiple of 128 so every bin range splits
    into whole groups; the 0.2 % rule counts the padded bins. amax = edges[min(B, N)]: the
    range covering the whole histogram gives its last edge (PPQ's own last range ends at
    absmax). PPQ holds counts and distributions in float32, we in float64; it rounds amax/128
    to its scale (amax / 127 is what exporters use). levels = 1 << (num_bits - 1 + unsigned)
    replaces 128 (PPQ itself always uses 2 ** (num_bits - 1)). Setting a bin to the fixed
    count 1 makes this search, unlike the others, depend slightly on the overall count scale.
    A range holding no counts gives PPQ a NaN divergence; it is never chosen here.
    """
    h, edges = _prepare(hist, bin_edges)
    levels = _levels(num_bits, unsigned)
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    hh = _ppq_histogram(h.astype(np.float64), levels)
    hist_sum = _seqsum(hh)
    fast = _ppq_divergences(hh, levels)
    near = _near_best(fast)
    best = near[0] if near.size == 1 else near[_first_min([_ppq_exact(hh, int(j + 1) * levels, levels, hist_sum) for j in near])]
    B = int(best + 1) * levels
    return float(edges[min(B, h.size)])


# ---------------------------------------------------------------- MSE


def _mse_layout(top: int, i: np.ndarray):
    """First bin of quantization cell k (k = 1..top) for amax = centre of bin i (row i):
    centre (j + 0.5) w rounds to level k iff j >= ((2k - 1)(2i + 1) - 2 top) / (4 top), which is
    never an integer, so the cells are exact. (Cell 0 starts at bin 0.)"""
    k = np.arange(1, top + 1, dtype=np.int64)
    num = (2 * k - 1) * (2 * i[:, None] + 1) - 2 * top
    return (np.maximum(-((-num) // (4 * top)), 0).astype(np.intp),)


def _mse_exact(p: np.ndarray, centers: np.ndarray, i: int, top: int) -> float:
    """Expected squared error of amax = centers[i], as the literal yardstick computes it."""
    scale = top / centers[i]
    quant = np.clip(np.rint(centers * scale), 0, top) / scale
    return float(np.sum((quant - centers) ** 2 * p))


def mse_amax(
    hist: np.ndarray,
    bin_edges: np.ndarray,
    num_bits: int = 8,
    unsigned: bool = False,
    start_bin: int = 128,
    stride: int = 1,
) -> float:
    """The bin centre minimising the expected squared quantization error (NVIDIA's
    `_compute_amax_mse` idea, float64, signed or unsigned grid).

    Every value is represented by its bin centre c_j and weighted by p_j = h_j / sum(h);
    candidates amax = c_i for i = start_bin .. N-1 (step stride); a value is quantized to
    min(rint(c * top / amax), top) * amax / top with top = 127 (signed) or 255 (unsigned);
    error = sum_j p_j (quantized - c_j)^2; the FIRST minimum wins. The fast path needs equal
    bins (non-uniform edges are evaluated candidate by candidate).
    """
    h, edges = _prepare(hist, bin_edges)
    top = _levels(num_bits, unsigned) - 1
    if start_bin < 0 or stride < 1:
        raise ValueError(f"start_bin must be >= 0 and stride >= 1, got {start_bin} and {stride}")
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    candidates = np.arange(start_bin, h.size, stride)
    if candidates.size == 0:
        return float(edges[-1])
    h = h.astype(np.float64)
    p = h / h.sum()
    centers = (edges[1:] + edges[:-1]) / 2
    if centers[candidates[0]] <= 0:
        candidates = candidates[centers[candidates] > 0]
        if candidates.size == 0:
            return 0.0
    width = edges[1] - edges[0]
    if not (width > 0 and np.allclose(np.diff(edges), width, rtol=1e-9, atol=0)):
        errors = [_mse_exact(p, centers, int(i), top) for i in candidates]
        return float(centers[candidates[_first_min(errors)]])
    off = -0.5 - edges[0] / width  # the bin-index offset of the centres (_mse_fast)
    fast = _mse_fast(p, edges, centers, candidates, top, off)
    near = _near_best(fast, abs_tol=1e-13 * (h.size + 1.0 - off) ** 2)  # fast is ~1e-16 (n - off)^2 accurate
    best = near[0] if near.size == 1 else near[_first_min([_mse_exact(p, centers, int(candidates[k]), top) for k in near])]
    return float(centers[candidates[best]])


def _mse_fast(p: np.ndarray, edges: np.ndarray, centers: np.ndarray, candidates: np.ndarray, top: int, off: float) -> np.ndarray:
    """The expected squared error of every candidate over equal bins, accurate to rounding.

    In bin-index units (c_j = e0 + (j + 0.5) w) level k of candidate i sits at
    tau_k = k*d + off with d = (c_i / top) / w, off = -0.5 - e0 / w, so tau_top = i. Cell k
    holds bins b_k .. b_{k+1}-1 (b_0 = 0, b_{top+1} = n): those rounding to level k, the last
    cell also those clamped to it. With prefix sums A0, A1, A2 of p, p j, p j^2 the error
    sum_k sum_cell p (j - tau_k)^2 telescopes (summation by parts, tau_k - tau_{k-1} = d) into
      A2[n] - 2 i A1[n] + i^2 A0[n] + 2d sum A1[b_k] - 2d off sum A0[b_k] - d^2 sum (2k-1) A0[b_k]
    (k = 1..top), so each candidate needs two gathers and two dot products.
    """
    n = p.size
    width = edges[1] - edges[0]
    rows = _layout("mse", top, n, _mse_layout) if edges[0] == 0 else None
    j = np.arange(n, dtype=np.float64)
    A0 = np.concatenate(([0.0], np.cumsum(p)))
    A1 = np.concatenate(([0.0], np.cumsum(p * j)))
    A2 = np.concatenate(([0.0], np.cumsum(p * j * j)))
    k = np.arange(1, top + 1, dtype=np.float64)
    weights = np.stack((np.ones(top), 2.0 * k - 1.0), axis=1)
    sums0 = np.empty((candidates.size, 2))
    sum1 = np.empty(candidates.size)
    step = max(1, 4 * _CHUNK // top)
    for a in range(0, candidates.size, step):
        chunk = candidates[a : a + step]
        if rows is not None:  # first edge 0: exact integer cell bounds, cached
            (b,) = rows(chunk)
        else:  # first centre that rounds up to level k
            b = np.searchsorted(centers, (k - 0.5) * (centers[chunk] / top)[:, None])
        sums0[a : a + step] = A0.take(b) @ weights
        sum1[a : a + step] = A1.take(b).sum(axis=1)
    i = candidates.astype(np.float64)
    d = centers[candidates] / top / width
    return A2[n] - 2.0 * i * A1[n] + i * i * A0[n] + 2.0 * d * sum1 - 2.0 * d * off * sums0[:, 0] - d * d * sums0[:, 1]


# ---------------------------------------------------------------- percentile, max


def percentile_amax(hist: np.ndarray, bin_edges: np.ndarray, percentile: float) -> float:
    """NVIDIA's `_compute_amax_percentile`: cdf = cumsum(h / total), idx = searchsorted(cdf,
    P / 100), amax = bin_edges[idx] (the lower edge of the bin where the cdf reaches P %, so
    P = 100 may clip the top bin, exactly as NVIDIA does)."""
    h, edges = _prepare(hist, bin_edges)
    if not (0 < percentile <= 100):
        raise ValueError(f"percentile must be > 0 and <= 100, got {percentile}")
    if h.size == 0 or not np.any(h > 0):
        return 0.0
    h = h.astype(np.float64)
    cdf = np.cumsum(h / h.sum())
    return float(edges[int(np.searchsorted(cdf, percentile / 100))])


def max_amax(hist: np.ndarray, bin_edges: np.ndarray, absmax: float) -> float:
    """The largest |x| seen (no clipping)."""
    return float(absmax) if np.isfinite(absmax) and absmax > 0 else 0.0


# ---------------------------------------------------------------- the interface


def _format_number(value: float) -> str:
    return repr(float(value)).removesuffix(".0")


def parse_method(text: str) -> str:
    """Validate a --method value ('entropy', 'max', 'mse', 'percentile:99.99'); returns it
    normalised (lower case, percentile as the shortest exact number)."""
    method = str(text).strip().lower().replace(" ", "")
    if method in _PLAIN_METHODS:
        return method
    if method.startswith("percentile"):
        value = method[len("percentile") :]
        if not value.startswith(":") or len(value) == 1:
            raise ValueError(f"{text!r} needs the percentile: percentile:P with 0 < P <= 100, e.g. percentile:99.99")
        try:
            p = float(value[1:])
        except ValueError:
            raise ValueError(f"{text!r}: {value[1:]!r} is not a number; use e.g. percentile:99.99") from None
        if not (math.isfinite(p) and 0 < p <= 100):
            raise ValueError(f"{text!r}: the percentile must be > 0 and <= 100, e.g. percentile:99.99")
        return f"percentile:{_format_number(p)}"
    near = difflib.get_close_matches(method.split(":")[0], _PLAIN_METHODS + ("percentile",), n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"unknown method {text!r}: choose entropy, max, mse or percentile:P (e.g. percentile:99.99), or mean-minmax or auto{hint}")


def _nvidia_start(hist: np.ndarray, start_bin: int = 128) -> int:
    """The first candidate whose kept bins hold any data (at least `start_bin`).

    NVIDIA's search scores a candidate whose kept bins are all empty as NaN, and its reversed
    argmin then picks the last such candidate: a threshold below every value, clipping all of
    them (a tensor with nothing near zero, e.g. a sigmoid output of confident scores). qtool's
    calibration starts the search after the first non-empty bin instead; `entropy_amax` itself
    keeps NVIDIA's behaviour exactly. Elsewhere the two agree bin for bin.
    """
    h = np.asarray(hist)
    nonzero = np.flatnonzero(h[1:]) + 1  # h[0] is replaced by h[1] before searching
    if nonzero.size == 0 or nonzero[0] == 1:
        return start_bin
    return max(start_bin, int(nonzero[0]) + 1)


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
    if kl_variant not in KL_VARIANTS:
        raise ValueError(f"unknown KL variant {kl_variant!r}: choose one of {', '.join(KL_VARIANTS)}")
    method = parse_method(method)
    if method == "mean-minmax":
        raise ValueError("mean-minmax needs per-sample statistics, not a histogram (TensorRecord.threshold)")
    if method in ("entropy", "mse", "auto") and num_bits > 8 and 2 ** (num_bits - 1) >= len(hist):
        # wider grids (16-bit activations) as fine as the histogram: no clipping search resolves them
        return max_amax(hist, bin_edges, absmax)
    if method == "auto":
        return auto_choice(hist, bin_edges, absmax=absmax, unsigned=unsigned, kl_variant=kl_variant, num_bits=num_bits)[1]
    if method == "entropy":
        if kl_variant == "nvidia":
            return entropy_amax(hist, bin_edges, num_bits=num_bits, unsigned=unsigned, start_bin=_nvidia_start(hist))
        # ncnn and PPQ search every tensor on the signed grid (128 levels), as those tools do
        search = {"ncnn": ncnn_entropy_amax, "ppq": ppq_entropy_amax}[kl_variant]
        return search(hist, bin_edges, num_bits=num_bits, unsigned=False)
    if method == "mse":
        return mse_amax(hist, bin_edges, num_bits=num_bits, unsigned=unsigned)
    if method == "max":
        return max_amax(hist, bin_edges, absmax)
    return percentile_amax(hist, bin_edges, float(method.split(":", 1)[1]))


# ---------------------------------------------------------------- auto

AUTO_CANDIDATES = ("entropy", "percentile:99.99", "percentile:99.999", "mse")


def quantization_error(hist: np.ndarray, bin_edges: np.ndarray, amax: float, *, unsigned: bool = False, num_bits: int = 8) -> float:
    """Mean squared error per value of fake-quantizing the histogram's values with threshold
    `amax` on the grid qtool exports (unsigned: 2^bits levels on [0, amax]; signed: step
    amax / (2^(bits-1) - 1), magnitudes up to amax), as qtool.statistics.noise estimates it:
    rounding error inside the range, x - amax above it."""
    h, edges = _prepare(hist, bin_edges)
    if not amax > 0:
        return 0.0
    top = (1 << num_bits) - 1 if unsigned else (1 << (num_bits - 1)) - 1
    found = noise.histogram_error(h, edges, noise.lattice(amax / top, top=top))
    return 0.0 if found is None else found.noise


def auto_choice(hist: np.ndarray, bin_edges: np.ndarray, *, absmax: float, unsigned: bool = False, kl_variant: str = "nvidia",
                num_bits: int = 8) -> tuple[str, float]:
    """(method, amax): the AUTO_CANDIDATES method whose threshold gives the lowest
    quantization_error on this histogram (the first listed on a tie)."""
    best = None
    for method in AUTO_CANDIDATES:
        amax = amax_for(method, hist, bin_edges, absmax=absmax, unsigned=unsigned, kl_variant=kl_variant, num_bits=num_bits)
        if not amax > 0:
            continue
        err = quantization_error(hist, bin_edges, amax, unsigned=unsigned, num_bits=num_bits)
        if best is None or err < best[0]:
            best = (err, method, amax)
    if best is None:
        return AUTO_CANDIDATES[0], 0.0
    return best[1], best[2]


# ---------------------------------------------------------------- one input's peak

# One calibration input whose max |x| is over LONE x every other input's (the largest two of the samples' peaks,
# SampleStats.top_absmax) and whose values beyond the others' peak are under LONE_SHARE of one input's values: a few
# positions of one input, which `auto` leaves out of its search (lone_peak). Pooled, that input's tail set the threshold
# every other input is quantized with: blazeface_back's depthwise_conv2d_26 peaks at 1505 on one of 16 photos and at
# 35-106 on the rest, and the least squared error over all values kept 1007 (docs/benchmarks.md#hunt23, #tail24)
LONE = 4.0
LONE_SHARE = 0.01


def lone_peak(hist: np.ndarray, bin_edges: np.ndarray, top_absmax, count: int) -> int | None:
    """The number of leading bins `auto` searches when one sample alone reaches far beyond every other: the bins up to
    the one holding the second-largest sample peak, when the largest is over LONE x it, there are at least 3 samples,
    and the values beyond those bins are fewer than LONE_SHARE of one sample's share of the histogram; else None.
    The values left out are that sample's only (no other sample reaches beyond its own peak)."""
    h = np.asarray(hist)
    if top_absmax is None or len(top_absmax) < 2 or count < 3 or h.size == 0:
        return None
    first, second = (float(v) for v in top_absmax[:2])
    width = float(bin_edges[1] - bin_edges[0]) if len(bin_edges) > 1 else 0.0
    if not (second > 0 and width > 0 and math.isfinite(first) and first > LONE * second):
        return None
    keep = min(int(second // width) + 1, h.size)
    total = float(h.sum(dtype=np.float64))
    beyond = float(h[keep:].sum(dtype=np.float64))
    if keep >= h.size or not beyond > 0 or beyond > LONE_SHARE * total / count:
        return None
    return keep


# ---------------------------------------------------------------- stretched tails

# A range whose calibration samples typically peak at TYPICAL_PEAK of its reach or beyond clips some values of most
# inputs, not one input's outlier. Held out in OpenVINO's run (docs/benchmarks.md#fid16-stretch), 0.5 / 0.7 / 0.9:
# table_cls 14.7 / 14.6 / 11.9 dB (none stretched: 9.5), anime_or_not 30.4 / 30.5 / 30.9 (30.7), trueocr_rec 27.5 /
# 27.7 / 28.2 (27.5): 0.9 loses nowhere
TYPICAL_PEAK = 0.9
# ... and only while the calibrated extreme stays within EXTREME x that typical peak: beyond it the stretch coarsens
# the grid of every input for a few inputs' values. ppocrv5_det's mask IoU@0.3 (held out in OpenVINO's run; none
# stretched 0.9037): every clipped range stretched 0.8583, up to 2.65x 0.8590, 2.4x 0.9000, 2x 0.9031, 1.5x 0.9033
# (its Add.5 at 2.57x: its grid 2.4x coarser, its own SQNR 27 -> 20 dB); table_cls's 39 are within 1.93x, 33 within
# 1.5x (9.46 none stretched, 11.94 at 2x, 11.77 at 1.5x; NNCF 11.0); docs/benchmarks.md#fid17-extreme
EXTREME = 1.5


def stretches(typical_peak: float, reach: float, peak: float) -> bool:
    """Whether an activation range whose largest magnitude is `reach` is stretched to cover the calibrated extreme
    `peak` (max |x|): when it clips (peak > reach), the mean over the calibration samples of each one's max |x|,
    `typical_peak`, is at least TYPICAL_PEAK x reach, so that the clipped values are the peaks of most inputs, and
    `peak` is at most EXTREME x `typical_peak`, so that the stretched grid still fits those inputs. The histogram's
    error cannot tell those from one input's outlier; where the samples' peaks stay far below the range
    (silero_v5_encoder's ReLUs: 0.13-0.37 of it) or the extreme far above them (ppocrv5_det's Add.205) the tail is a
    few inputs', and the finer grid is worth more."""
    values = (typical_peak, reach, peak)
    if not all(math.isfinite(float(v)) for v in values) or not reach > 0:
        return False
    return peak > reach and TYPICAL_PEAK * reach <= typical_peak and peak <= EXTREME * typical_peak
