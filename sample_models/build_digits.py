"""Build the bundled sample assets for qtool (digits CNN + data).

How to run (from the repository root):

    pip install torch==2.13.0 scikit-learn onnx onnxruntime pillow numpy
    python sample_models/build_digits.py

It needs torch and scikit-learn (plus onnx, onnxruntime, pillow, numpy).
Tests and CI never run this script: its outputs are committed to the repo.
torch is only needed here, nowhere else in qtool.

Outputs (all overwritten):
    sample_models/digits_cnn.onnx     trained CNN, opset 13, input "input"
                                      float32 [batch, 1, 32, 32], output
                                      "logits" [batch, 10]
    sample_models/digits_heldout.npz  x: float32 [N, 1, 32, 32] preprocessed,
                                      y: int64 [N] labels (never trained on)
    calib_images/digit_0000.png ...   200 grayscale 8-bit 32x32 PNGs taken
                                      from the training split

Data: sklearn.datasets.load_digits (8x8, values 0..16). Permuted with
numpy default_rng(0); the last 400 samples are the held-out set, the rest is
the training split; calib_images are the first 200 training samples.

Preprocessing contract (identical for training, the npz and the PNGs):
    8x8 digit -> uint8 pixel = round(v / 16 * 255) -> PIL "L" image ->
    bilinear resize to 32x32 -> PNG (in memory or on disk) -> load with PIL,
    convert("L"), bilinear resize to 32x32 (no-op here) -> float32 / 255.
No mean/std normalisation.
"""

from __future__ import annotations

import io
import os
import random
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SEED = 0
SIZE = 32
N_HELDOUT = 400
N_CALIB = 200
EPOCHS = 12
BATCH = 32
LR = 3e-3
OPSET = 13

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / "sample_models"
CALIB_DIR = ROOT / "calib_images"
ONNX_PATH = MODEL_DIR / "digits_cnn.onnx"
NPZ_PATH = MODEL_DIR / "digits_heldout.npz"


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------
def digit_to_png_bytes(img8x8: np.ndarray) -> bytes:
    """8x8 digit (0..16) -> 32x32 grayscale 8-bit PNG bytes."""
    pix = np.round(img8x8.astype(np.float64) / 16.0 * 255.0).astype(np.uint8)
    im = Image.fromarray(pix, mode="L").resize((SIZE, SIZE), Image.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def load_png(src) -> np.ndarray:
    """Preprocessing as the model expects: [1, H, W] float32 in [0, 1]."""
    with Image.open(src) as im:
        im = im.convert("L").resize((SIZE, SIZE), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.float32) / 255.0
    return arr[None, :, :]


def preprocess(images: np.ndarray) -> np.ndarray:
    """Run each digit through the PNG round trip -> [N, 1, 32, 32] float32."""
    return np.stack([load_png(io.BytesIO(digit_to_png_bytes(d))) for d in images])


def split_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images  # [1797, 8, 8] float64, 0..16
    labels = digits.target.astype(np.int64)
    perm = np.random.default_rng(SEED).permutation(len(images))
    train_idx, held_idx = perm[:-N_HELDOUT], perm[-N_HELDOUT:]
    return images, labels, train_idx, held_idx


# --------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------
def build_model():
    import torch
    from torch import nn

    def cbr(cin, cout, k=3, relu=True):
        layers = [nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm2d(cout)]
        if relu:
            layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = cbr(1, 16)                     # 32x32
            self.pool1 = nn.MaxPool2d(2)               # -> 16x16
            self.res_a = cbr(16, 16)
            self.res_b = cbr(16, 16, relu=False)
            self.res_act = nn.ReLU()
            self.branch_relu = cbr(16, 16)             # 3x3 branch, ReLU
            self.branch_gate = cbr(16, 16, k=1, relu=False)  # 1x1 branch, SiLU
            self.pool2 = nn.MaxPool2d(2)               # -> 8x8
            self.head = cbr(32, 32)
            self.gap = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            x = self.pool1(self.stem(x))
            x = self.res_act(x + self.res_b(self.res_a(x)))        # residual Add
            g = self.branch_gate(x)
            g = g * torch.sigmoid(g)                               # x*sigmoid(x)
            x = torch.cat([self.branch_relu(x), g], dim=1)         # Concat
            x = self.head(self.pool2(x))
            return self.fc(self.flatten(self.gap(x)))

    return DigitsCNN()


def train(model, x: np.ndarray, y: np.ndarray):
    import torch
    from torch import nn

    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        model.train()
        order = torch.randperm(len(xt), generator=gen)
        total = 0.0
        for i in range(0, len(order), BATCH):
            idx = order[i : i + BATCH]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        sched.step()
        print(f"epoch {epoch + 1:2d}/{EPOCHS}  loss {total / len(xt):.4f}")
    model.eval()
    return model


def export(model):
    import warnings

    import torch

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # legacy exporter
    dummy = torch.zeros(1, 1, SIZE, SIZE)
    torch.onnx.export(
        model,
        (dummy,),
        str(ONNX_PATH),
        dynamo=False,
        opset_version=OPSET,
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        do_constant_folding=True,
    )
    import onnx

    m = onnx.load(str(ONNX_PATH))
    m.doc_string = "qtool sample: CNN on sklearn load_digits (see sample_models/README.md)"
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(ONNX_PATH))


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
def main() -> int:
    import torch

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    images, labels, train_idx, held_idx = split_data()
    x_train, y_train = preprocess(images[train_idx]), labels[train_idx]
    x_held, y_held = preprocess(images[held_idx]), labels[held_idx]
    print(f"train {len(x_train)}  heldout {len(x_held)}  calib {N_CALIB}")

    model = train(build_model(), x_train, y_train)
    with torch.no_grad():
        acc = (model(torch.from_numpy(x_held)).argmax(1).numpy() == y_held).mean()
    print(f"torch heldout accuracy {acc:.4f}")

    MODEL_DIR.mkdir(exist_ok=True)
    export(model)
    np.savez_compressed(NPZ_PATH, x=x_held.astype(np.float32), y=y_held.astype(np.int64))

    CALIB_DIR.mkdir(exist_ok=True)
    for old in CALIB_DIR.glob("digit_*.png"):
        old.unlink()
    for i, idx in enumerate(train_idx[:N_CALIB]):
        (CALIB_DIR / f"digit_{i:04d}.png").write_bytes(digit_to_png_bytes(images[idx]))

    # Sanity check with onnxruntime on both the npz and the PNGs on disk.
    import onnxruntime as ort

    sess = ort.InferenceSession(str(ONNX_PATH), providers=["CPUExecutionProvider"])
    pred = sess.run(["logits"], {"input": x_held})[0].argmax(1)
    print(f"onnxruntime heldout accuracy {(pred == y_held).mean():.4f}")
    pngs = sorted(CALIB_DIR.glob("digit_*.png"))
    xc = np.stack([load_png(p) for p in pngs])
    pred_c = sess.run(["logits"], {"input": xc})[0].argmax(1)
    print(f"onnxruntime calib accuracy {(pred_c == y_train[:N_CALIB]).mean():.4f}")
    print(f"model size {os.path.getsize(ONNX_PATH)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
