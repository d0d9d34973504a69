"""GPTQ weight rounding at export: the int8 codes of a linear layer's weights chosen to minimise the
layer's output error on the calibration tokens, instead of rounding each weight to the nearest code.

GPTQ (Frantar et al. 2022, arXiv 2210.17323, Algorithm 1; the same steps as NNCF's weight compression,
openvinotoolkit/nncf src/nncf/quantization/algorithms/weight_compression/gptq.py): with the layer's
input X (tokens x K) and H = X^T X (the Hessian of ||X W - X Q||^2 up to a factor 2), the input
channels are rounded one at a time, each to the nearest code, and the error that rounding left,
divided by the diagonal of the Cholesky factor of H^-1, is spread over the channels not rounded yet
(through that factor's row), which absorb it. H is damped by DAMP x its mean diagonal, and the
channels go in decreasing order of H's diagonal ("act order"). The grid is the one placement chose
(per output channel scale, the overflow guard's widened steps included): the scales stay, only the
codes change, each within the largest |code| round-to-nearest gives its output channel (so the
guard's bound on the codes still holds).

H is the mean over the calibration's positions of the layer input's x x^T, which calibrate stores
for transformers' linear layers (qtool.statistics.gram); SmoothQuant's X / s has diag(1/s) H diag(1/s)
(its record's Gram is scaled). DAMP is ten times GPTQ's: with 64 calibration passages (a few thousand
tokens for 1536 channels) H is known only roughly: on all-MiniLM-L6-v2 calibrated on Python reference
paragraphs, 0.01 gained 0.8 dB on held-out paragraphs of the same kind but -0.3 to +0.2 dB on other
text, 0.1 gained 0.4 to 0.9 dB on every kind (docs/benchmarks.md#other-text).

Applied where the calibration holds the layer input's Gram, the weight is a constant 2-D MatMul/Gemm
weight read by that one int8 layer, and the rounding is the default (half to even): other policies'
roundings are the user's choice and are kept. The layer's bias correction then uses the weights as
rounded here (Quantizer.unrounded keeps the float ones).
"""

from __future__ import annotations

import numpy as np
import onnx

from .. import blas
from ..model import graph as G
from ..statistics.stats import data_input
from .policy import fake_quantize as grid_values
from .policy import quantize

DAMP = 0.1  # H's dampening, x its mean diagonal: GPTQ's default 0.01 overfits 64 passages (MiniLM-L6, benchmarks#other-text)
BLOCK = 128  # input channels rounded before their error reaches the rest at once (GPTQ's lazy batch)


def round_codes(w: np.ndarray, h: np.ndarray, scale: np.ndarray, limit: np.ndarray) -> np.ndarray | None:
    """GPTQ's integer codes of `w` [K, N] (y = x w) on the symmetric grid of per-output-channel `scale`
    [N], each output channel's codes within +-`limit` [N], for inputs whose mean x x^T is `h` [K, K];
    None when H (damped) is not positive definite."""
    w = np.array(w, dtype=np.float64)
    k = w.shape[0]
    h = np.array(h, dtype=np.float64)
    diag = h.diagonal().copy()
    dead = ~(diag > 0)  # channels never non-zero in calibration: rounded to nearest, touching nothing
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    order = np.argsort(-h.diagonal(), kind="stable")
    w, h = w[order], h[np.ix_(order, order)]
    h[np.diag_indices(k)] += DAMP * float(np.mean(h.diagonal()))
    try:
        # H = R R^T with R upper (the Cholesky factor of H with its rows and columns reversed), so
        # H^-1 = R^-T R^-1 = U^T U with U = R^-1 upper: GPTQ's Cholesky(H^-1, upper) in one factorisation
        r = np.linalg.cholesky(h[::-1, ::-1])[::-1, ::-1]
        factor = np.triu(np.linalg.inv(r))
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(factor)):
        return None
    step = np.asarray(scale, dtype=np.float64).reshape(-1)
    step = np.where(step > 0, step, 1.0)
    lim = np.asarray(limit, dtype=np.float64).reshape(-1)
    codes = np.zeros(w.shape, dtype=np.int64)
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        block = w[b0:b1].copy()
        errors = np.zeros_like(block)
        u = factor[b0:b1, b0:b1]
        for i in range(b1 - b0):
            q = np.clip(np.rint(block[i] / step), -lim, lim)
            codes[b0 + i] = q.astype(np.int64)
            e = (block[i] - q * step) / u[i, i]
            block[i + 1:] -= np.outer(u[i, i + 1:], e)
            errors[i] = e
        w[b1:] -= factor[b0:b1, b1:].T @ errors
    out = np.empty_like(codes)
    out[order] = codes
    return out


def output_error(w: np.ndarray, q: np.ndarray, h: np.ndarray) -> float:
    """The mean squared output error per token, trace((w - q)^T H (w - q)), of weights q for w [K, N]."""
    d = np.asarray(w, dtype=np.float64) - np.asarray(q, dtype=np.float64)
    return float(np.sum(d * (np.asarray(h, dtype=np.float64) @ d)))


def _eligible(site, nodes: dict, constants: set, int8: set, records: dict):
    """(layer, H, whether the weight is stored transposed [N, K]) of a weight quantizer GPTQ rounds:
    a constant 2-D weight read by one int8 MatMul/Gemm only, rounded half to even on a symmetric grid,
    not the model's own integers (`stated`), whose layer's input has a Gram matrix in `records`; else None."""
    if site.values is None or np.ndim(site.values) != 2 or len(site.readers) != 1 or site.unrounded is not None or site.stated:
        return None
    name, slot = site.readers[0]
    n = nodes.get(name)
    if n is None or name not in int8 or slot != 1 or n.op_type not in ("MatMul", "Gemm") or data_input(n, constants) is None:
        return None
    if (n.op_type == "Gemm" and int(G.attr(n, "transA", 0))) or site.policy.rounding != "half-even" or not site.policy.symmetric:
        return None
    gram = getattr(getattr(records.get(n.input[0]), "stats", None), "gram", None)
    h = gram.matrix() if gram is not None else None
    if h is None or not np.all(np.isfinite(h)):
        return None
    return name, h, bool(n.op_type == "Gemm" and int(G.attr(n, "transB", 0)))


@blas.one_thread()  # serial small products: BLAS threads would only spin (qtool.blas)
def apply(model: onnx.ModelProto, plan, records: dict) -> list[str]:
    """Round the plan's eligible weight quantizers by GPTQ (in place: their `values` become the
    chosen grid points, `unrounded` the float weights, `floor` pins their scales); returns the
    layers rounded. `records`: {tensor: calibration.TensorRecord} of the model as placed."""
    nodes = {n.name: n for n in model.graph.node}
    constants = {t.name for t in model.graph.initializer} | {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output}
    int8 = set(plan.int8_layers)
    done = []
    for site in plan.weights:
        found = _eligible(site, nodes, constants, int8, records)
        if found is None:
            continue
        name, h, transposed = found
        w = np.asarray(site.values, dtype=np.float64)
        kn = w.T if transposed else w
        if h.shape[0] != kn.shape[0]:
            continue
        params = site.params()
        out_axis = 0 if transposed else 1
        if params.axis is not None and params.axis % 2 != out_axis:
            continue
        if np.any(np.asarray(params.zero_point) != 0):
            continue
        scale = np.broadcast_to(np.asarray(params.scale, dtype=np.float64).reshape(-1), (kn.shape[1],))
        rtn = np.clip(np.rint(kn / scale), params.grid.qmin, params.grid.qmax)
        limit = np.abs(rtn).max(axis=0)
        codes = round_codes(kn, h, scale, limit)
        if codes is None:
            continue
        q = codes * scale
        if output_error(kn, q, h) >= output_error(kn, rtn * scale, h):
            continue  # no better than round-to-nearest on the calibration tokens
        # the range the scale came from (the float weights' peak, or the guard's wider floor) is pinned: the
        # codes stay within it, and a grid point past it by an ulp is brought back (it would move the scale)
        amax = np.abs(kn).max(axis=0) if params.axis is not None else np.asarray(float(np.abs(kn).max()))
        pinned = amax if site.floor is None else np.maximum(amax, np.asarray(site.floor, dtype=np.float64))
        stored = np.clip(q, -pinned, pinned).astype(site.values.dtype)
        for _ in range(4):  # the top code's grid point rounded up past the range by the stored type: one ulp back
            over = np.abs(stored.astype(np.float64)) > pinned
            if not over.any():
                break
            stored[over] = np.nextafter(stored[over], stored.dtype.type(0))
        values = np.ascontiguousarray(stored.T if transposed else stored)
        old_values, old_floor = site.values, site.floor
        site.unrounded, site.values, site.floor = old_values, values, pinned
        new = site.params()
        if not (np.array_equal(np.asarray(new.scale), np.asarray(params.scale)) and
                np.array_equal(quantize(site.values, new), (codes.T if transposed else codes)) and
                np.allclose(grid_values(site.values, new), site.values, rtol=1e-6, atol=0)):
            site.values, site.floor, site.unrounded = old_values, old_floor, None  # not representable exactly: left alone
            continue
        done.append(name)
    return done
