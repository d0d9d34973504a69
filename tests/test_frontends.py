"""Audio front ends computed inside the model (issue 49): a log-mel spectrogram made of an STFT by Conv, the power
|X|^2 as Pow 2 + Pow 2 + Add, a mel filterbank MatMul and a Log (tests/zoo.py logmel_frontend_like, after
openwakeword's melspectrogram.onnx), alone or read by a network (as DNSMOS's sig_bak_ovr reads its own)."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import required
import zoo

import qtool

STFT = {"stft.conv_real.weight", "stft.conv_imag.weight"}


def _audio(rng, n, samples=256):
    """int16-valued audio [1, samples]: a few tones whose loudness differs from feed to feed by tens of dB, as
    speech and pauses do, over a microphone's noise floor (about -50 dB of full scale)."""
    feeds = []
    t = np.arange(samples) / 16000
    for _ in range(n):
        f = rng.uniform(300, 6000, 3)
        x = np.sin(2 * np.pi * f[0] * t) + 0.5 * np.sin(2 * np.pi * f[1] * t + 1) + 0.3 * np.sin(2 * np.pi * f[2] * t)
        x = 32767 * 0.5 * np.exp(rng.normal(-1, 0.7)) * x + rng.normal(0, 100, samples)
        feeds.append({"audio": np.round(np.clip(x, -32768, 32767))[None].astype(np.float32)})
    return feeds


@pytest.fixture(scope="module", params=[True, False], ids=["with-head", "front-end-only"])
def logmel(request):
    model = zoo.logmel_frontend_like(head=request.param)
    feeds = _audio(np.random.default_rng(11), 40)
    return request.param, model, qtool.calibrate(model, data=feeds[:24]), feeds[24:]


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record):
        self.text += record.getMessage() + "\n"


def _quantized(data: bytes) -> set[str]:
    m = onnx.load_from_string(data)
    return {n.input[0] for n in m.graph.node if n.op_type in ("FakeQuantize", "QuantizeLinear")}


@pytest.mark.parametrize("target", ["openvino", "qdq"])
def test_the_power_and_its_filterbank_stay_float_before_the_log(logmel, target):
    """The power's squares and the filterbank over them get no quantizer (the filterbank stays FP32, its float
    weight as it was, and the export says why). The STFT convolutions stay float too where a network reads the
    log-mel (the network int8), and int8 where the model is its front end alone (else nothing would be)."""
    head, model, cal, _ = logmel
    warned = _Warnings()
    logging.getLogger("qtool").addHandler(warned)  # the command line's set-up may stop propagation: listen on qtool's own
    try:
        data = qtool.export(model, cal, target=target)
    finally:
        logging.getLogger("qtool").removeHandler(warned)
    quantized = _quantized(data)
    m = onnx.load_from_string(data)
    add = next(n for n in model.graph.node if n.op_type == "Add" and n.name.startswith("/stft"))
    assert not quantized & {*add.input, add.output[0]}, quantized
    weights = {i.name: i for i in m.graph.initializer}
    assert weights["mel.weight"].data_type == onnx.TensorProto.FLOAT
    assert not [k for k in weights if k.startswith("mel.weight") and k != "mel.weight"], sorted(weights)
    assert "filterbank over a power spectrum" in warned.text
    if head:
        assert "STFT of a log spectrum" in warned.text
        assert STFT <= set(weights) and "audio" not in quantized, sorted(weights)  # float
        assert "logmel" in quantized and "head.0.weight" not in weights  # the network int8
    else:
        assert STFT.isdisjoint(weights) and "audio" in quantized  # int8


def test_log_mel_keeps_its_quiet_bins(logmel):
    """The dB log-mel in the file's exact arithmetic and run by OpenVINO (f32-pinned): with the power and the
    filterbank quantized it was at -1.8 dB (every bin 48 dB below the loudest one rounded to the 1e-10 floor), 33.8
    with them float; where a network reads it, the STFT in float too leaves the log-mel exact and took the network's
    output from 13.1 (everything int8) through 36.0 (the power and filterbank float) to 46.6 dB."""
    required.module("openvino")
    head, model, cal, held = logmel
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino")
    assert result.runtime.float_precision == "f32"
    exact = {o.name: o.sqnr_db for o in result.outputs}
    run = {o.name: o.sqnr_db for o in result.runtime.outputs}
    assert exact["logmel"] > (60 if head else 25) and exact.get("scores", 99) > 40, exact
    assert all(abs(run[k] - exact[k]) < 1.0 for k in exact if np.isfinite(exact[k])), (exact, run)
