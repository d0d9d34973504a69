"""Real data for sequence.py's entries: English sentences from stdlib docstrings, speech synthesized from them by
espeak-ng, translated UI strings from the gettext catalogs installed on this machine, and note sequences
rendered by sox.

Needs `apt-get install -y espeak-ng sox` for the audio. Everything rendered is cached in the entry's work folder.
"""

from __future__ import annotations

import gettext
import hashlib
import importlib
import inspect
import re
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np

# Disjoint module lists: calibration text never comes from a held-out module.
CALIB_MODULES = ("collections", "json", "argparse", "subprocess", "logging", "pathlib", "functools", "itertools",
                 "textwrap", "string", "heapq", "bisect", "csv", "datetime", "decimal", "fractions")
HELD_MODULES = ("email.message", "http.client", "unittest.case", "tarfile", "zipfile", "shutil", "tempfile",
                "urllib.parse", "socket", "threading", "queue", "sched")


def _docstrings(module_name: str) -> list[str]:
    mod = importlib.import_module(module_name)
    docs = [inspect.getdoc(mod) or ""]
    for _, obj in sorted(vars(mod).items()):
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == module_name:
            docs.append(inspect.getdoc(obj) or "")
            if inspect.isclass(obj):
                for _, meth in sorted(vars(obj).items()):
                    if inspect.isfunction(meth):
                        docs.append(inspect.getdoc(meth) or "")
    return docs


def sentences(modules: tuple[str, ...], min_words: int = 5, max_words: int = 40) -> list[str]:
    """Prose sentences of the modules' docstrings, in a fixed order, without code lines or doctests."""
    out: list[str] = []
    seen: set[str] = set()
    for name in modules:
        for doc in _docstrings(name):
            paragraphs = re.split(r"\n\s*\n", doc)
            for para in paragraphs:
                if ">>>" in para or para.lstrip().startswith(("-", "*", ":")) or "  " in para.strip():
                    continue
                text = " ".join(para.split())
                for s in re.split(r"(?<=[.!?])\s+", text):
                    words = s.split()
                    if not (min_words <= len(words) <= max_words) or not re.match(r"[A-Z]", s):
                        continue
                    if sum(c.isalpha() or c == " " for c in s) < 0.85 * len(s) or s in seen:
                        continue
                    seen.add(s)
                    out.append(s)
    return out


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 in [-1, 1] and the sample rate of a 16-bit PCM WAV."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise SystemExit(f"{path}: expected 16-bit PCM")
        sr, ch = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    return x.reshape(-1, ch).mean(axis=1), sr


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        raise SystemExit(f"{tool} not found: apt-get install -y espeak-ng sox")


def speak(work: Path, text: str, voice: str, speed: int, sr: int) -> np.ndarray:
    """`text` spoken by espeak-ng (voice, words per minute), resampled by sox to `sr` Hz mono; cached."""
    _need("espeak-ng")
    _need("sox")
    key = hashlib.sha1(f"{voice}|{speed}|{sr}|{text}".encode()).hexdigest()[:16]
    out = work / "speech" / f"{key}.wav"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        raw = out.with_suffix(".raw.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["sox", str(raw), "-r", str(sr), "-c", "1", "-b", "16", str(out)], check=True)
        raw.unlink()
    return read_wav(out)[0]


# Voices and speeds differ between the splits as well as the sentences.
CALIB_VOICES = (("en-us", 150), ("en-gb", 170), ("en-gb-scotland", 140), ("en-us+f3", 160))
HELD_VOICES = (("en-gb-x-rp", 155), ("en-us+m3", 175), ("en-gb+f2", 145))


def utterances(work: Path, held: bool, n: int, sr: int, per_utt: int = 2) -> list[np.ndarray]:
    """n recordings of `per_utt` consecutive docstring sentences each, cycling through the split's voices."""
    sents = sentences(HELD_MODULES if held else CALIB_MODULES)
    voices = HELD_VOICES if held else CALIB_VOICES
    if len(sents) < n * per_utt:
        raise SystemExit(f"only {len(sents)} sentences for {n} utterances")
    out = []
    for i in range(n):
        voice, speed = voices[i % len(voices)]
        out.append(speak(work, " ".join(sents[i * per_utt:(i + 1) * per_utt]), voice, speed, sr))
    return out


def locale_strings(lang: str, script: str, held: bool, min_chars: int = 6) -> list[str]:
    """Translated messages of the gettext catalogs under /usr/share/locale/<lang>/LC_MESSAGES (Debian packages'
    translations: real sentences written by translators), keeping those with >= min_chars characters matching
    the `script` character class; sorted, deduplicated. Every third catalog is held out, the others calibrate."""
    folder = Path("/usr/share/locale") / lang / "LC_MESSAGES"
    found: set[str] = set()
    for i, mo in enumerate(sorted(folder.glob("*.mo"))):
        if (i % 3 == 2) != held:
            continue
        with open(mo, "rb") as f:
            try:
                cat = gettext.GNUTranslations(f)._catalog  # the only way to list a catalog
            except Exception:  # a broken catalog is skipped
                continue
        for key, msg in cat.items():
            if not key or not isinstance(msg, str):
                continue
            msg = " ".join(re.sub(r"%[-#+ 0-9.]*[a-zA-Z]|[\x00-\x1f]|[<>{}\\]", " ", msg).split())
            if len(re.findall(script, msg)) >= min_chars:
                found.add(msg)
    if not found:
        raise SystemExit(f"no {lang} gettext catalogs under {folder}")
    return sorted(found)


# Chord progressions (scale degrees of a major key), rendered as plucked arpeggios plus a bass note per chord.
PROGRESSIONS = ((1, 5, 6, 4), (1, 4, 5, 1), (6, 4, 1, 5), (2, 5, 1, 6), (1, 6, 2, 5), (4, 5, 3, 6))
_MAJOR = (0, 2, 4, 5, 7, 9, 11)


def _triad(root_degree: int, tonic: int) -> list[int]:
    d = root_degree - 1
    return [tonic + 12 * ((d + k) // 7) + _MAJOR[(d + k) % 7] for k in (0, 2, 4)]


def music(work: Path, tonic: int, progression: tuple[int, ...], bpm: float, timbre: str, sr: int) -> np.ndarray:
    """A bar of arpeggiated triad per chord (eighth notes) over a bass note, rendered by sox synth; cached.
    tonic is a MIDI note number, timbre a sox synth type (pluck, sine, square, triangle, sawtooth)."""
    _need("sox")
    key = f"{tonic}-{'-'.join(map(str, progression))}-{bpm}-{timbre}-{sr}"
    out = work / "music" / f"{key}.wav"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        eighth = 30.0 / bpm
        parts = []
        for n, deg in enumerate(progression * 2):
            chord = _triad(deg, tonic)
            pattern = [chord[0], chord[1], chord[2], chord[1] + 12 if n % 2 else chord[0] + 12,
                       chord[2], chord[1], chord[0] + 12, chord[2]]
            bar = out.with_name(f"{key}.bar{n}.wav")
            mel = out.with_name(f"{key}.mel{n}.wav")
            tones = [out.with_name(f"{key}.bar{n}.{k}.wav") for k in range(len(pattern))]
            for t, note in zip(tones, pattern):
                subprocess.run(["sox", "-n", "-r", str(sr), "-c", "1", "-b", "16", str(t), "synth", f"{eighth:.4f}",
                                timbre, f"%{note - 69}", "fade", "0.005", f"{eighth:.4f}", f"{eighth * 0.3:.4f}",
                                "vol", "0.35"], check=True)
            subprocess.run(["sox", *map(str, tones), str(mel)], check=True)
            subprocess.run(["sox", "-n", "-r", str(sr), "-c", "1", "-b", "16", str(bar), "synth", f"{8 * eighth:.4f}",
                            "triangle", f"%{chord[0] - 12 - 69}", "fade", "0.01", f"{8 * eighth:.4f}", "0.5",
                            "vol", "0.3"], check=True)
            parts.append(out.with_name(f"{key}.part{n}.wav"))
            subprocess.run(["sox", "-m", str(mel), str(bar), str(parts[-1])], check=True)
            for t in (*tones, mel, bar):
                t.unlink()
        subprocess.run(["sox", *map(str, parts), str(out), "norm", "-3"], check=True)
        for p in parts:
            p.unlink()
    return read_wav(out)[0]


CALIB_MUSIC = tuple((tonic, prog, bpm, timbre) for i, (tonic, bpm, timbre) in enumerate(
    [(60, 96, "pluck"), (62, 120, "pluck"), (55, 84, "triangle"), (64, 132, "pluck"), (57, 100, "sawtooth"),
     (65, 110, "pluck"), (59, 90, "square"), (61, 140, "pluck")]) for prog in PROGRESSIONS[i % 3:i % 3 + 2])
HELD_MUSIC = tuple((tonic, prog, bpm, timbre) for i, (tonic, bpm, timbre) in enumerate(
    [(63, 105, "pluck"), (58, 126, "triangle"), (66, 92, "pluck"), (56, 116, "sine")])
    for prog in PROGRESSIONS[3 + i % 3:3 + i % 3 + 1] + PROGRESSIONS[i % 3:i % 3 + 1])


def clips(work: Path, held: bool, sr: int) -> list[np.ndarray]:
    """The split's rendered progressions (16 calibration clips, 8 held-out clips, other keys, tempos, timbres)."""
    return [music(work, t, p, b, tm, sr) for t, p, b, tm in (HELD_MUSIC if held else CALIB_MUSIC)]


def many_clips(work: Path, held: bool, n: int, sr: int) -> list[Path]:
    """n rendered progressions (WAV paths), configurations fixed by index: calibration on PROGRESSIONS[:4] with
    pluck/triangle/sawtooth/square, held out on PROGRESSIONS[4:] with pluck/sine/triangle in other keys/tempos."""
    paths = []
    for i in range(n):
        if held:
            cfg = (53 + (5 * i) % 15, PROGRESSIONS[4 + i % 2], 85 + (11 * i) % 60, ("pluck", "sine", "triangle")[i % 3])
        else:
            cfg = (52 + (7 * i) % 17, PROGRESSIONS[i % 4], 80 + (13 * i) % 70,
                   ("pluck", "pluck", "triangle", "sawtooth", "square")[i % 5])
        music(work, *cfg, sr=sr)
        paths.append(work / "music" / f"{cfg[0]}-{'-'.join(map(str, cfg[1]))}-{cfg[2]}-{cfg[3]}-{sr}.wav")
    return paths
