"""How much of a dense detector's output noise sits where the input is the letterbox's constant colour.

A YOLO-style detector's output holds one row per anchor point of three strides (8, 16, 32), in that
order ([1, N, C] or [1, C, N], N = sum of (H / s) * (W / s)). On a letterboxed input a large part of
the image is one colour (YOLOX's 114 grey): every position there computes the same values, so an int8
model's rounding errors are the same at each of them and add up coherently instead of averaging out.
For one zoo model and calibration file this script exports qtool's OpenVINO file with and without
bias correction and scores each, simulated (qtool.checks.simulate) and run by OpenVINO on this CPU,
on the zoo's held-out inputs:
  sqnr       the output's SQNR (dB), as `qtool evaluate` pools it (all values of all inputs);
  constant   the share of the noise at anchor points whose stride x stride input patch is all the
             input's most frequent colour (the letterbox);
  content    the SQNR with that noise left out (the same signal): what the image content gets.
Outputs of other shapes are scored whole (sqnr only).

Usage: python bench/letterbox_noise.py MODEL CALIB.json [--zoo ~/.cache/qtool-bench/zoo] [--json out.json]
(docs/benchmarks.md#bias23).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import onnx

import qtool.api as api
from qtool.calibration import Calibration
from qtool.checks import simulate
from qtool.runtime import onnxruntime

STRIDES = (8, 16, 32)


def constant_mask(img: np.ndarray) -> np.ndarray:
    """[H, W]: where every channel holds the image's most frequent colour."""
    colours, counts = np.unique(img.reshape(img.shape[0], -1).T, axis=0, return_counts=True)
    common = colours[np.argmax(counts)]
    return np.all(img == common[:, None, None], axis=0)


def anchor_noise(ref: np.ndarray, got: np.ndarray, img: np.ndarray) -> tuple[float, float] | None:
    """(noise at the letterbox's anchor points, all noise) of one [1, N, C] / [1, C, N] output; None
    when its rows are not three strides' anchor points of this input."""
    if ref.ndim != 3 or got.shape != ref.shape:
        return None
    h, w = img.shape[-2:]
    n = sum((h // s) * (w // s) for s in STRIDES)
    e = (got[0].astype(np.float64) - ref[0].astype(np.float64)) ** 2
    if ref.shape[1] == n:
        e2 = e.sum(axis=1)
    elif ref.shape[2] == n:
        e2 = e.sum(axis=0)
    else:
        return None
    const = constant_mask(img)
    pad, start = 0.0, 0
    for s in STRIDES:
        gh, gw = h // s, w // s
        block = const[:gh * s, :gw * s].reshape(gh, s, gw, s).all(axis=(1, 3)).ravel()
        pad += float(e2[start:start + gh * gw][block].sum())
        start += gh * gw
    return pad, float(e2.sum())


def score(session, ref_session, names: list[str], feeds: list[dict], image: str | None) -> dict:
    signal = noise = pad = 0.0
    split = image is not None
    for f in feeds:
        ref = ref_session.run(names, f)
        got = session.run(names, f)
        for r, g in zip(ref, got):
            signal += float(np.sum(np.asarray(r, np.float64) ** 2))
            noise += float(np.sum((np.asarray(g, np.float64) - r) ** 2))
        parts = anchor_noise(ref[0], got[0], f[image][0]) if split and len(ref) == 1 else None
        split = parts is not None
        pad += parts[0] if parts else 0.0
    row = {"sqnr": 10 * np.log10(signal / noise) if noise > 0 else float("inf")}
    if split and noise > 0:
        row["constant"] = pad / noise
        row["content"] = 10 * np.log10(signal / (noise - pad)) if noise > pad else float("inf")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("calib")
    ap.add_argument("--zoo", default=os.path.expanduser("~/.cache/qtool-bench/zoo"))
    ap.add_argument("--json")
    a = ap.parse_args()
    folder = Path(a.zoo) / a.model
    path = str(folder / "model.onnx")
    cal = Calibration.load(a.calib)
    fp32 = onnx.load(path)
    ref = onnxruntime.session(fp32, optimization="none")
    names = [o.name for o in fp32.graph.output]
    feeds = [dict(np.load(f)) for f in sorted((folder / "held").glob("*.npz"))]
    images = [i.name for i in fp32.graph.input if i.name in feeds[0] and feeds[0][i.name].ndim == 4]
    image = images[0] if len(images) == 1 else None
    rows = {}
    for corrected in (True, False):
        data = api.export(path, cal, target="openvino", bias_correction=corrected)
        for kind, session in (("sim", simulate.simulation(data)), ("run", simulate.runtime("openvino", data))):
            key = f"{kind} {'bias corrected' if corrected else 'uncorrected'}"
            rows[key] = score(session, ref, names, feeds, image)
            print(a.model, key, {k: round(float(v), 3) for k, v in rows[key].items()}, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({a.model: rows}, indent=1))


if __name__ == "__main__":
    main()
