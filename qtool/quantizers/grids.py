"""Quantization grid maths: integer grids, scale/zero point <-> FakeQuantize ranges, fake-quant.

Two equivalent descriptions of one uniform quantizer are used by the exporters:

* scale / zero point on an integer grid [qmin, qmax] (ONNX QuantizeLinear/DequantizeLinear):
      q = clip(round(x / scale) + zp, qmin, qmax),   x' = (q - zp) * scale
* OpenVINO FakeQuantize ranges (input_low, input_high, levels), output ranges = input ranges:
      levels = qmax - qmin + 1
      input_low  = (qmin - zp) * scale
      input_high = (qmax - zp) * scale
  and back: scale = (input_high - input_low) / (qmax - qmin), zp = qmin - input_low / scale,
  which must land on an integer inside the grid.
  (Derivation: ModelTC/MQBench mqbench/deploy/deploy_openvino.py.)

Conventions (NNCF's CPU defaults, openvinotoolkit/nncf src/nncf/quantization/fake_quantize.py
`symmetric_range`, src/nncf/common/hardware/setups/cpu.py):

* activations, per tensor, 256 levels: [0, amax] when never negative (qmin 0, qmax 255,
  scale amax/255); otherwise the signed 8-bit grid [-128, 127] with scale amax/127, i.e.
  [-amax * 128/127, amax] - the NNCF range `-level_high * levels / (levels - 2)`, whose zero is
  exactly on the grid (a [-amax, amax] range with 256 levels would need zero point 127.5);
* weights, per output channel, symmetric narrow range [-127, 127] (255 levels), scale
  max|w| / 127 per channel. The 7-bit variant (the fix for int8 overflow on CPUs without VNNI)
  keeps the same exported grid but uses scale max|w| / 63, so every weight lands on [-63, 63].

Rounding is half to even everywhere (numpy `rint`), which is what OpenVINO's reference
FakeQuantize uses (`std::nearbyint`, openvinotoolkit/openvino
src/core/reference/include/openvino/reference/fake_quantize.hpp) and what ONNX QuantizeLinear
specifies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "Grid",
    "QParams",
    "dequantize_linear",
    "fake_quantize",
    "grid",
    "quantize_linear",
    "range_from_scale",
    "range_shape",
    "scale_from_range",
]


@dataclass(frozen=True)
class Grid:
    """An integer grid [qmin, qmax]."""

    qmin: int
    qmax: int

    def __post_init__(self):
        if not (isinstance(self.qmin, (int, np.integer)) and isinstance(self.qmax, (int, np.integer))):
            raise TypeError("grid bounds must be integers")
        if self.qmax <= self.qmin:
            raise ValueError(f"empty grid [{self.qmin}, {self.qmax}]")

    @property
    def levels(self) -> int:
        return int(self.qmax - self.qmin + 1)

    @property
    def signed(self) -> bool:
        return self.qmin < 0


def grid(num_bits: int = 8, signed: bool = True, narrow: bool = False) -> Grid:
    """The integer grid of `num_bits` bits: signed [-2^(b-1), 2^(b-1)-1] (narrow: -2^(b-1)+1),
    unsigned [0, 2^b-1] (narrow: [0, 2^b-2])."""
    if not 2 <= num_bits <= 32:
        raise ValueError(f"num_bits {num_bits} outside 2..32")
    if signed:
        qmax = 2 ** (num_bits - 1) - 1
        return Grid(-qmax if narrow else -qmax - 1, qmax)
    qmax = 2 ** num_bits - 1
    return Grid(0, qmax - 1 if narrow else qmax)


def range_from_scale(scale, zero_point, g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(input_low, input_high) of the quantizer (scale, zero point) on grid `g`; arrays broadcast."""
    s = np.asarray(scale, dtype=np.float64)
    zp = np.asarray(zero_point)
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("scale must be finite and > 0")
    if np.any(zp != np.round(zp)):
        raise ValueError("zero point must be an integer")
    zp = zp.astype(np.int64)
    if np.any(zp < g.qmin) or np.any(zp > g.qmax):
        raise ValueError(f"zero point outside the grid [{g.qmin}, {g.qmax}]")
    return (g.qmin - zp) * s, (g.qmax - zp) * s


def scale_from_range(input_low, input_high, g: Grid, rtol: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """(scale, integer zero point) of the range [input_low, input_high] on grid `g`.

    Raises ValueError when the range is empty or zero does not fall on the grid (within
    `rtol` of a grid step): such a range has no integer zero point.
    """
    lo = np.asarray(input_low, dtype=np.float64)
    hi = np.asarray(input_high, dtype=np.float64)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))) or np.any(hi <= lo):
        raise ValueError("need finite input_low < input_high")
    scale = (hi - lo) / (g.qmax - g.qmin)
    zp_real = g.qmin - lo / scale
    zp = np.round(zp_real)
    if np.any(np.abs(zp_real - zp) > rtol) or np.any(zp < g.qmin) or np.any(zp > g.qmax):
        raise ValueError("zero is not on the grid of this range (no integer zero point in the grid)")
    return scale, zp.astype(np.int64)


def fake_quantize(x, input_low, input_high, output_low, output_high, levels: int) -> np.ndarray:
    """OpenVINO FakeQuantize-1 in numpy (openvinotoolkit/openvino docs fake-quantize-1):

        x <= min(il, ih)  -> ol
        x >  max(il, ih)  -> oh
        otherwise         -> round((x - il) / (ih - il) * (levels-1)) / (levels-1) * (oh - ol) + ol

    Ranges broadcast against x (numpy rules); computed in float64, returned in x's float type.
    """
    if levels < 2:
        raise ValueError("levels must be >= 2")
    xa = np.asarray(x)
    out_type = xa.dtype if np.issubdtype(xa.dtype, np.floating) else np.float32
    xf = xa.astype(np.float64)
    il, ih, ol, oh = (np.asarray(a, dtype=np.float64) for a in (input_low, input_high, output_low, output_high))
    n = float(levels - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((xf - il) / (ih - il) * n) / n * (oh - ol) + ol
    y = np.where(xf <= np.minimum(il, ih), ol, np.where(xf > np.maximum(il, ih), oh, q))
    return y.astype(out_type)


def _along(a: np.ndarray, axis: int | None, ndim: int) -> np.ndarray:
    """Reshape a per-channel vector so that it broadcasts along `axis` of an ndim array."""
    a = np.asarray(a)
    if axis is None or a.ndim == 0:
        return a
    shape = [1] * ndim
    shape[axis] = -1
    return a.reshape(shape)


def quantize_linear(x, scale, zero_point, g: Grid, axis: int | None = None, round_fn=np.rint) -> np.ndarray:
    """ONNX QuantizeLinear: clip(rint(x / scale) + zp, qmin, qmax) as int64 (axis: per-channel);
    `round_fn` replaces rint for other roundings (qtool.quantizers.policy.quantize)."""
    xf = np.asarray(x, dtype=np.float64)
    s = _along(np.asarray(scale, dtype=np.float64), axis, xf.ndim)
    zp = _along(np.asarray(zero_point, dtype=np.int64), axis, xf.ndim)
    return np.clip(round_fn(xf / s) + zp, g.qmin, g.qmax).astype(np.int64)


def dequantize_linear(q, scale, zero_point, axis: int | None = None) -> np.ndarray:
    """ONNX DequantizeLinear: (q - zp) * scale, float64."""
    qa = np.asarray(q, dtype=np.int64)
    s = _along(np.asarray(scale, dtype=np.float64), axis, qa.ndim)
    zp = _along(np.asarray(zero_point, dtype=np.int64), axis, qa.ndim)
    return (qa - zp) * s


@dataclass(frozen=True)
class QParams:
    """One quantizer: scale and zero point (scalars, or vectors along `axis`) on `grid`."""

    scale: np.ndarray
    zero_point: np.ndarray
    grid: Grid
    axis: int | None = None

    @property
    def levels(self) -> int:
        return self.grid.levels

    @property
    def input_low(self) -> np.ndarray:
        return range_from_scale(self.scale, self.zero_point, self.grid)[0]

    @property
    def input_high(self) -> np.ndarray:
        return range_from_scale(self.scale, self.zero_point, self.grid)[1]


# All-zero (or denormal) weight channels: any positive scale represents zeros exactly; a zero
# scale would give 0/0 = NaN in the FakeQuantize formula (NNCF `fix_zero_filters_symmetric`
# solves the same problem).
MIN_WEIGHT_AMAX = 1e-30


def range_shape(params: QParams, rank: int) -> tuple[int, ...]:
    """Shape of the FakeQuantize range tensors for a per-channel quantizer of a rank-`rank`
    tensor ([C,1,1,1] for Conv weights, [1,N] for MatMul B); () for per-tensor."""
    if params.axis is None or np.ndim(params.scale) == 0:
        return ()
    shape = [1] * rank
    shape[params.axis] = int(np.size(params.scale))
    return tuple(shape)
