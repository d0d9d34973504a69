"""A value computed once per sample and multiplied into a tensor (a diffusion denoiser's preconditioning c_in from its
noise level, hunt20's terrain_unet) stays float: its rounding would scale every position of the tensor alike."""

from __future__ import annotations

import numpy as np
import onnx
from zoo import preconditioned_denoiser_like

from qtool import api


def _write(d, sigmas, seed):
    rng = np.random.default_rng(seed)
    d.mkdir()
    for i, pair in enumerate(np.asarray(sigmas, np.float32).reshape(-1, 2)):
        clean = np.cumsum(np.cumsum(rng.standard_normal((2, 1, 16, 16)), axis=2), axis=3) / 16  # smooth terrain-like
        noisy = clean + pair[:, None, None, None] * rng.standard_normal((2, 1, 16, 16))
        np.savez(d / f"{i:04d}.npz", noisy=noisy.astype(np.float32), sigma=pair)
    return d


def test_a_per_sample_preconditioning_scale_is_not_quantized(tmp_path):
    path = tmp_path / "denoiser.onnx"
    onnx.save(preconditioned_denoiser_like(), path)
    calib = _write(tmp_path / "calib", np.geomspace(0.05, 80, 16), 1)  # the sigmas a sampler visits
    held = _write(tmp_path / "held", [80.0] * 8, 2)  # its first step
    api.calibrate_files(path, data=calib, output=tmp_path / "m.calib.json")
    for target in ("openvino", "qdq"):
        out = tmp_path / f"m.{target}.onnx"
        api.export_file(path, target=target, calib=tmp_path / "m.calib.json", output=out)
        m = onnx.load(out)
        quantized = {n.input[0] for n in m.graph.node if n.op_type in ("FakeQuantize", "QuantizeLinear")}
        assert not quantized & {"node_reciprocal_output_0", "node_unsqueeze_output_0"}, quantized
        assert "node_mul_output_0" in quantized, quantized  # the first Conv's input
        result = api.evaluate_files(path, calib=tmp_path / "m.calib.json", data=held, target=target)
        assert result.to_json()["sqnr_db"] > 30, (target, result.to_json()["sqnr_db"])  # 2 codes for c_in: 25 % off, about 12 dB
