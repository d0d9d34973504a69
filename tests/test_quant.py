"""qtool.quantizers.grids: integer grids, scale/zero point <-> FakeQuantize ranges, numpy fake-quant."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qtool.quantizers import grids, policy
from qtool.quantizers.grids import Grid, grid

GRIDS = {
    "signed": (grid(8, signed=True), -128, 127),
    "signed narrow": (grid(8, signed=True, narrow=True), -127, 127),
    "unsigned": (grid(8, signed=False), 0, 255),
    "unsigned narrow": (grid(8, signed=False, narrow=True), 0, 254),
}


@pytest.mark.parametrize("name", GRIDS)
def test_grids(name):
    g, qmin, qmax = GRIDS[name]
    assert (g.qmin, g.qmax, g.levels) == (qmin, qmax, qmax - qmin + 1)
    assert g.signed == (qmin < 0)


def test_grid_rejects_nonsense():
    with pytest.raises(ValueError):
        Grid(3, 3)
    with pytest.raises(ValueError):
        grid(1)


def test_known_ranges_reference_section_6():
    t = 2.54
    # unsigned activations: qmin 0, qmax 255, zp 0, s = T/255 -> [0, T], 256 levels
    lo, hi = grids.range_from_scale(t / 255, 0, grid(8, signed=False))
    assert (lo, hi) == (0.0, pytest.approx(t))
    # symmetric signed narrow (weights): [-127, 127], zp 0 -> [-T, T], 255 levels
    lo, hi = grids.range_from_scale(t / 127, 0, grid(8, narrow=True))
    assert (lo, hi) == (pytest.approx(-t), pytest.approx(t))
    # signed full range (signed activations): [-128, 127] -> [-T*128/127, T] (NNCF levels/(levels-2))
    lo, hi = grids.range_from_scale(t / 127, 0, grid(8))
    assert (lo, hi) == (pytest.approx(-t * 256 / 254), pytest.approx(t))
    # asymmetric: zp 128 on the unsigned grid is the signed grid shifted
    lo, hi = grids.range_from_scale(0.1, 128, grid(8, signed=False))
    assert (lo, hi) == (pytest.approx(-12.8), pytest.approx(12.7))


@pytest.mark.parametrize("name", GRIDS)
@settings(max_examples=60, deadline=None)
@given(scale=st.floats(1e-6, 1e3), frac=st.floats(0, 1))
def test_round_trip_scale_range_scale(name, scale, frac):
    g = GRIDS[name][0]
    zp = round(g.qmin + frac * (g.qmax - g.qmin))
    lo, hi = grids.range_from_scale(scale, zp, g)
    s2, zp2 = grids.scale_from_range(lo, hi, g)
    assert s2 == pytest.approx(scale, rel=1e-9)
    assert int(zp2) == zp


@pytest.mark.parametrize("name", GRIDS)
def test_round_trip_range_scale_range_per_channel(name):
    g = GRIDS[name][0]
    rng = np.random.default_rng(3)
    scale = rng.uniform(1e-4, 5, size=16)
    zp = rng.integers(g.qmin, g.qmax + 1, size=16)
    lo, hi = grids.range_from_scale(scale, zp, g)
    assert lo.shape == hi.shape == (16,)
    s2, zp2 = grids.scale_from_range(lo, hi, g)
    np.testing.assert_allclose(s2, scale, rtol=1e-12)
    np.testing.assert_array_equal(zp2, zp)
    lo2, hi2 = grids.range_from_scale(s2, zp2, g)
    np.testing.assert_allclose(lo2, lo, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(hi2, hi, rtol=1e-12)


def test_scale_from_range_refuses_ranges_without_an_integer_zero_point():
    # [-a, a] with 256 levels puts zero halfway between two grid points (zero point 127.5)
    with pytest.raises(ValueError, match="zero"):
        grids.scale_from_range(-1.0, 1.0, grid(8))
    with pytest.raises(ValueError):
        grids.scale_from_range(1.0, 1.0, grid(8))
    with pytest.raises(ValueError):
        grids.scale_from_range(1.0, 2.0, grid(8))  # zero outside the range -> zp outside the grid
    with pytest.raises(ValueError):
        grids.range_from_scale(0.0, 0, grid(8))
    with pytest.raises(ValueError):
        grids.range_from_scale(1.0, 300, grid(8))


def test_fake_quantize_spec_cases():
    lo, hi, levels = -1.0, 2.0, 4  # steps of 1.0: outputs -1, 0, 1, 2
    x = np.array([-5, -1, -0.99, -0.5, 0.49, 0.5, 0.51, 1.5, 2.0, 2.0001, 9], np.float32)
    y = grids.fake_quantize(x, lo, hi, lo, hi, levels)
    # x <= il -> ol; x > ih -> oh; ties round half to even (-0.5 -> index 0.5 -> 0; 0.5 -> 1.5 -> 2; 1.5 -> 2.5 -> 2)
    np.testing.assert_array_equal(y, np.array([-1, -1, -1, -1, 0, 1, 1, 1, 2, 2, 2], np.float32))
    assert y.dtype == np.float32
    # output range may differ from the input range
    np.testing.assert_allclose(grids.fake_quantize([0.0, 1.0], 0, 1, 10, 20, 2), [10, 20])


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), amax=st.floats(1e-3, 1e3), unsigned=st.booleans())
def test_fake_quantize_equals_quantize_dequantize(seed, amax, unsigned):
    """On a grid with an integer zero point, OpenVINO's formula is exactly QDQ."""
    p = policy.activation_params(amax, unsigned)
    x = np.random.default_rng(seed).uniform(-1.5 * amax, 1.5 * amax, 500)
    fq = grids.fake_quantize(x, p.input_low, p.input_high, p.input_low, p.input_high, p.levels)
    qdq = grids.dequantize_linear(grids.quantize_linear(x, p.scale, p.zero_point, p.grid), p.scale, p.zero_point)
    np.testing.assert_allclose(fq, qdq.astype(x.dtype), rtol=1e-9, atol=amax * 1e-9)


def test_fake_quantize_per_channel_broadcast():
    w = np.random.default_rng(0).standard_normal((4, 3, 2, 2))
    p = policy.weight_params(w, axis=0)
    shape = grids.range_shape(p, 4)
    assert shape == (4, 1, 1, 1)
    lo, hi = p.input_low.reshape(shape), p.input_high.reshape(shape)
    y = grids.fake_quantize(w, lo, hi, lo, hi, p.levels)
    for c in range(4):
        yc = grids.fake_quantize(w[c], lo[c, 0, 0, 0], hi[c, 0, 0, 0], lo[c, 0, 0, 0], hi[c, 0, 0, 0], 255)
        np.testing.assert_array_equal(y[c], yc)
    # every channel's extreme weight is exactly representable
    np.testing.assert_allclose(np.abs(y).max(axis=(1, 2, 3)), np.abs(w).max(axis=(1, 2, 3)), rtol=1e-12)


def test_quantize_linear_rounds_half_to_even_and_saturates():
    g = grid(8)
    q = grids.quantize_linear([0.5, 1.5, 2.5, -0.5, 1000, -1000], 1.0, 0, g)
    np.testing.assert_array_equal(q, [0, 2, 2, 0, 127, -128])
    q = grids.quantize_linear(np.ones((2, 3)), [1.0, 0.5, 0.25], [0, 1, 2], grid(8, signed=False), axis=1)
    np.testing.assert_array_equal(q, [[1, 3, 6], [1, 3, 6]])


def test_activation_params():
    p = policy.activation_params(3.0, unsigned=True)
    assert (p.levels, float(p.input_low), float(p.input_high)) == (256, 0.0, 3.0)
    p = policy.activation_params(3.0, unsigned=False)
    assert p.levels == 256 and float(p.zero_point) == 0 and float(p.scale) == pytest.approx(3 / 127)
    assert float(p.input_high) == pytest.approx(3.0) and float(p.input_low) == pytest.approx(-3.0 * 128 / 127)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            policy.activation_params(bad, True)


def test_weight_params_per_channel_axes_and_zero_channels():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 5)).astype(np.float32)  # MatMul B [K, N]
    w[:, 2] = 0.0  # an all-zero output channel
    p = policy.weight_params(w, axis=1)
    assert p.scale.shape == (5,) and p.levels == 255 and p.axis == 1
    assert np.all(np.isfinite(p.scale)) and np.all(p.scale > 0)
    np.testing.assert_allclose(p.scale[[0, 1, 3, 4]], np.abs(w).max(axis=0)[[0, 1, 3, 4]] / 127)
    assert grids.range_shape(p, 2) == (1, 5)
    lo, hi = p.input_low.reshape(1, 5), p.input_high.reshape(1, 5)
    y = grids.fake_quantize(w, lo, hi, lo, hi, p.levels)
    assert np.all(np.isfinite(y)) and np.all(y[:, 2] == 0)
    q = grids.quantize_linear(w, p.scale, p.zero_point, p.grid, axis=1)
    assert q.min() >= -127 and q.max() <= 127 and np.abs(q).max(axis=0)[0] == 127
    # all-zero tensor: still a valid (positive) scale
    assert float(policy.weight_params(np.zeros((2, 2)), None).scale) > 0
    with pytest.raises(ValueError):
        policy.weight_params(np.array([1.0, np.nan]), None)


def test_weight_params_7bit_uses_half_the_grid():
    w = np.random.default_rng(2).standard_normal((8, 4, 3, 3))
    p7 = policy.weight_params(w, axis=0, headroom_bits=1)
    assert p7.levels == 255  # exported as an 8-bit narrow quantizer ...
    q = grids.quantize_linear(w, p7.scale.reshape(8, 1, 1, 1), 0, p7.grid)
    assert np.abs(q).max() == 63  # ... whose weights only use [-63, 63]
    np.testing.assert_allclose(p7.input_high, np.abs(w).max(axis=(1, 2, 3)) * 127 / 63)
    assert grids.range_shape(policy.weight_params(w, None), 4) == ()
