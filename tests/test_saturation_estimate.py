"""The overflow guard's saturation estimate (qtool.quantizers.overflow.row_saturation) against the
saturation it estimates, layer by layer.

On CPUs without VNNI the int8 kernels multiply u8 activation codes by s8 weights with vpmaddubsw:
each adjacent pair of products along the reduction is added into a saturating int16, and the pair
sums are then added exactly in int32 (vpmaddwd by ones; onnxruntime
onnxruntime/core/mlas/lib/x86_64/QgemmU8S8KernelAvx2.S). `_vpmaddubsw` emulates that in numpy, so
the estimate is checked on every CPU, exactly and fast: activation codes drawn from histograms
shaped like calibration's, the mean squared error of the saturated sums against the layer's
estimate. The last test checks the emulation itself against a real AVX2 kernel (onnxruntime's
MatMulInteger on this CPU where it is AVX2-only, else under QEMU's Haswell: tests/avx2.py),
skipped where neither can be had.
"""

from __future__ import annotations

import avx2
import numpy as np
import pytest
from onnx import TensorProto, helper
from required import require

from qtool.quantizers import overflow

RNG = np.random.default_rng(43)
K, ROWS, DRAWS = 64, 32, 20000
CODES = np.arange(256)
# activation code distributions (u8) shaped like calibration histograms: post-ReLU exponential tails,
# a flat one, and a mostly-dark one with a bright mode (text on photos)
PMFS = {"tail 40": np.exp(-CODES / 40), "tail 80": np.exp(-CODES / 80), "flat": np.ones(256),
        "bright mode": np.exp(-CODES / 20) + 0.05 * np.exp(-(((CODES - 230) / 10) ** 2))}


def _vpmaddubsw(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """u8 codes x [N, K] times s8 weights w [rows, K] as an AVX2 kernel computes it: adjacent
    pairs along K saturate at int16, the pair sums add in int32. [N, rows]."""
    x, w = x.astype(np.int64), w.astype(np.int64)
    if x.shape[1] % 2:
        x, w = np.pad(x, ((0, 0), (0, 1))), np.pad(w, ((0, 0), (0, 1)))
    pairs = x[:, None, 0::2] * w[None, :, 0::2] + x[:, None, 1::2] * w[None, :, 1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=-1)


def _weights(rows: int = ROWS, k: int = K) -> np.ndarray:
    """Laplacian weights quantized per row to s8, each row reaching 127 (as per-channel weights do)."""
    w = RNG.laplace(size=(rows, k))
    return np.clip(np.rint(w / np.abs(w).max(axis=1, keepdims=True) * 127), -127, 127).astype(np.int8)


def _measured(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row: the mean squared error saturation adds to one output."""
    err = _vpmaddubsw(x, w) - x.astype(np.int64) @ w.astype(np.int64).T
    return (err.astype(np.float64) ** 2).mean(axis=0)


def _db(a: float, b: float) -> float:
    return float(10 * np.log10(a / b))


@pytest.mark.parametrize("name", list(PMFS))
def test_estimate_matches_the_emulated_kernel_for_independent_codes(name):
    pmf = PMFS[name] / PMFS[name].sum()
    w = _weights()
    x = RNG.choice(256, size=(DRAWS, K), p=pmf)
    estimate = overflow.row_saturation(w, pmf, False, {}).sum()
    measured = _measured(x, w).sum()
    assert measured > 0 and abs(_db(estimate, measured)) < 2.0, (name, estimate, measured)


@pytest.mark.parametrize("name", list(PMFS))
def test_estimate_matches_the_emulated_kernel_for_an_image(name):
    """An image's channels move together: one code for every channel of an input (the coherent
    model bounds the rows that mix positive and negative saturated pairs)."""
    pmf = PMFS[name] / PMFS[name].sum()
    w = _weights(16, 27)  # a 3x3 stem of 3 channels
    x = np.repeat(RNG.choice(256, size=(DRAWS, 1), p=pmf), 27, axis=1)
    estimate = overflow.row_saturation(w, pmf, True, {}).sum()
    measured = _measured(x, w).sum()
    assert measured > 0 and -0.5 < _db(estimate, measured) < 1.5, (name, estimate, measured)


def test_no_saturation_is_estimated_where_none_can_happen():
    w = np.clip(_weights(), -63, 63)  # 255 * 63 * 2 < 32767
    pmf = np.ones(256) / 256
    assert not overflow.row_saturation(w, pmf, False, {}).any()
    assert not _measured(RNG.choice(256, size=(2000, K), p=pmf), w).any()


def test_the_chosen_widening_leaves_less_noise_than_the_pair_bound_or_none():
    """least_noise_ratios' choice, scored by the emulation: the widening's rounding noise (the same
    closed form the guard uses: K E[q^2] (r^2 - 1) / 12) plus SATURATION_WEIGHT x the saturation
    noise the emulated kernel really adds at that step is no larger than not widening or widening
    to the pair bound."""
    pmf = PMFS["tail 40"] / PMFS["tail 40"].sum()
    mean_sq = float(pmf @ CODES.astype(np.float64) ** 2)
    floats = RNG.laplace(size=(ROWS, K))
    step = np.abs(floats).max(axis=1) / 127
    top = np.maximum(overflow.pair_step(floats) / step, 1.0)
    x = RNG.choice(256, size=(DRAWS, K), p=pmf)

    def measured_total(ratio: np.ndarray) -> np.ndarray:
        q = np.clip(np.rint(floats / (step * ratio)[:, None]), -127, 127).astype(np.int8)
        return K * mean_sq * (ratio ** 2 - 1) / 12 + overflow.SATURATION_WEIGHT * _measured(x, q) * ratio ** 2

    chosen = overflow.least_noise_ratios(floats, step, top, (pmf, mean_sq, K), False)
    assert (chosen >= 1).all() and (chosen <= top + 1e-9).all() and (chosen < top - 1e-9).any()
    got = measured_total(chosen).sum()
    assert got <= 1.05 * measured_total(np.ones(ROWS)).sum() and got <= 1.05 * measured_total(top).sum()


# onnxruntime's MatMulInteger (u8 x s8, int32 out) on the codes in an .npz: MLAS's u8 x s8 kernel
KERNEL = """
import sys
import numpy as np
import onnxruntime as ort
model, data, out = sys.argv[1:]
z = np.load(data)
s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
np.save(out, s.run(None, {"x": z["x"]})[0])
"""


def _matmul_integer(w: np.ndarray) -> bytes:
    node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
    g = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, w.shape[1]])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [None, w.shape[0]])],
                          [helper.make_tensor("w", TensorProto.INT8, [w.shape[1], w.shape[0]], w.T.ravel().tolist())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


def test_the_emulation_is_what_an_avx2_kernel_computes(tmp_path):
    if not avx2.is_x86():
        pytest.skip("x86 int8 kernels only")
    try:
        avx2.how()
    except avx2.Unavailable as e:
        require(False, str(e))
    pmf = PMFS["bright mode"] / PMFS["bright mode"].sum()
    w = _weights()
    x = RNG.choice(256, size=(256, K), p=pmf).astype(np.uint8)
    (tmp_path / "mmi.onnx").write_bytes(_matmul_integer(w))
    np.savez(tmp_path / "x.npz", x=x)
    (tmp_path / "run.py").write_text(KERNEL)
    ran = avx2.run_python(tmp_path / "run.py", tmp_path / "mmi.onnx", tmp_path / "x.npz", tmp_path / "y.npy")
    got = np.load(tmp_path / "y.npy")
    exact = x.astype(np.int64) @ w.astype(np.int64).T
    assert (got != exact).any(), ran.how  # it really saturated
    assert np.array_equal(got, _vpmaddubsw(x, w)), ran.how
