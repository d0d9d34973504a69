"""Recurrent nets (issue 49, class 3) on a look-alike of Silero VAD's sequence model (tests/zoo.py
stft_lstm_vad_like): an STFT magnitude, a Conv encoder and an LSTM over the time-first axis with its h/c
states as inputs and outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import required
import zoo

import qtool

HIDDEN = 16


def _blocks(rng, n):
    """Audio-like blocks [time, 64]: a few tones whose loudness changes block to block by tens of dB, a little noise."""
    feeds = []
    for _ in range(n):
        blocks = int(rng.integers(24, 40))
        t = np.arange(blocks * 64) / 8000
        loudness = np.repeat(np.exp(rng.normal(-2, 1.2, blocks)), 64)
        f = rng.uniform(200, 3000, 3)
        x = loudness * (np.sin(2 * np.pi * f[0] * t) + 0.5 * np.sin(2 * np.pi * f[1] * t + 1) + 0.3 * np.sin(2 * np.pi * f[2] * t))
        x = x + rng.normal(0, 0.003, x.size)
        zeros = np.zeros((1, 1, HIDDEN), np.float32)
        feeds.append({"input": x.reshape(blocks, 64).astype(np.float32), "h": zeros, "c": zeros})
    return feeds


@pytest.fixture(scope="module")
def vad():
    model = zoo.stft_lstm_vad_like(hidden=HIDDEN)
    feeds = _blocks(np.random.default_rng(3), 36)
    return model, qtool.calibrate(model, data=feeds[:24]), feeds[24:]


def _quantized(data: bytes) -> set[str]:
    m = onnx.load_from_string(data)
    return {n.input[0] for n in m.graph.node if n.op_type in ("FakeQuantize", "QuantizeLinear")}


@pytest.mark.parametrize("target", ["openvino", "qdq", "tensorrt"])
def test_no_quantizer_on_the_squares_of_a_magnitude_nor_on_the_lstm(vad, target):
    """sqrt(re^2 + im^2): the squares span twice their roots' dynamic range, so no quantizer goes on them (the Add of
    the magnitude computes in float; the Sqrt output is quantized for the Conv that reads it). The LSTM keeps its
    inputs, weights and states float on every target."""
    model, cal, _ = vad
    quantized = _quantized(qtool.export(model, cal, target=target))
    assert not {"/stft/Pow_output_0", "/stft/Pow_1_output_0"} & quantized
    assert not {"/Transpose_output_0", "h", "c", "lstm.W", "lstm.R", "lstm.B"} & quantized
    if target != "tensorrt":  # the CPU rules quantize the magnitude where the encoder's Conv reads it
        assert "/stft/Sqrt_output_0" in quantized


def test_states_of_the_lstm_keep_their_precision(vad):
    """The speech probabilities and the LSTM's final states, in the file's exact arithmetic and run by OpenVINO:
    with the squares quantized the states were at 13 dB (speech 38 dB); the magnitude in float gives 27 (52)."""
    required.module("openvino")
    model, cal, held = vad
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino")
    exact = {o.name: o.sqnr_db for o in result.outputs}
    run = {o.name: o.sqnr_db for o in result.runtime.outputs}
    assert min(exact["hn"], exact["cn"]) > 20 and exact["speech_probs"] > 45, exact
    assert all(abs(run[k] - exact[k]) < 1.0 for k in exact), (exact, run)
