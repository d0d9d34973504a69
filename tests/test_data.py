"""qtool/feeds/data.py: image discovery, decoding, preprocessing, batching.

Images are built on the fly; expected arrays are worked out by hand on tiny images.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from PIL import Image

from qtool.errors import QtoolError
from qtool.feeds.data import Preprocess, batches, infer_layout, list_images, load_image, parse_channels, parse_scale, parse_size, resolve_preprocess
from qtool.model import InputSpec

RGB_2x2 = np.array([[[255, 0, 0], [0, 255, 0]], [[0, 0, 255], [255, 255, 255]]], np.uint8)


def save(path, img, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, **kw)
    return path


def pre(h=2, w=2, c=3, layout="nchw", **kw):
    kw.setdefault("scale", 1.0)  # raw pixel values unless a test says otherwise
    return Preprocess(height=h, width=w, channels=c, layout=layout, **kw)


# ---------------------------------------------------------------- list_images

def test_list_images_recursive_sorted_by_relative_path_case_insensitive(tmp_path):
    tiny = Image.new("L", (1, 1))
    for rel in ["b.png", "a/z.jpeg", "a/sub/c.bmp", "c.JPG", "a.PNG"]:
        save(tmp_path / rel, tiny, format="PNG")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "pic.gif").write_bytes(b"GIF89a")
    (tmp_path / "x.png.txt").write_text("x")
    (tmp_path / "dir.png").mkdir()  # a folder with an image suffix is not an image
    got = [p.relative_to(tmp_path).as_posix() for p in list_images(tmp_path)]
    # plain code-point order of the relative path ('.' < '/' so a.PNG before a/...)
    assert got == ["a.PNG", "a/sub/c.bmp", "a/z.jpeg", "b.png", "c.JPG"]
    assert [p.relative_to(tmp_path).as_posix() for p in list_images(str(tmp_path), limit=2)] == got[:2]
    assert list_images(tmp_path, limit=100) == list_images(tmp_path)


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"), ("file", "is not a folder"), ("empty", "no images"),
])
def test_list_images_refuses_bad_folders(tmp_path, case, message):
    target = tmp_path / "imgs"
    if case == "file":
        target.write_bytes(b"x")
    elif case == "empty":
        target.mkdir()
        (target / "readme.txt").write_text("no pictures here")
    with pytest.raises(QtoolError, match=message) as e:
        list_images(target)
    assert "imgs" in str(e.value)


# ---------------------------------------------------------------- decoding modes

def test_grey_l_to_one_channel(tmp_path):
    a = np.array([[0, 64], [128, 255]], np.uint8)
    p = save(tmp_path / "g.png", Image.fromarray(a, "L"))
    np.testing.assert_array_equal(load_image(p, pre(c=1)), a[None].astype(np.float32))


def test_rgb_rgba_palette_decode_to_same_pixels(tmp_path):
    expected = RGB_2x2.transpose(2, 0, 1).astype(np.float32)
    rgb = save(tmp_path / "rgb.png", Image.fromarray(RGB_2x2, "RGB"))
    alpha = np.array([[0, 50], [128, 255]], np.uint8)[:, :, None]
    rgba = save(tmp_path / "rgba.png", Image.fromarray(np.concatenate([RGB_2x2, alpha], 2), "RGBA"))
    pal = Image.new("P", (2, 2))
    pal.putpalette([9, 9, 9, 255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 255] + [0] * 753)
    pal.putdata([1, 2, 3, 4])
    pal_p = save(tmp_path / "pal.png", pal)
    assert Image.open(pal_p).mode == "P"
    for p in (rgb, rgba, pal_p):
        np.testing.assert_array_equal(load_image(p, pre()), expected, err_msg=p.name)


def test_16bit_grey_png_full_scale_maps_to_one(tmp_path):
    a = np.array([[0, 65535], [25700, 257]], np.uint16)  # /257 -> 0, 255, 100, 1
    p = save(tmp_path / "g16.png", Image.fromarray(a))
    assert Image.open(p).mode in ("I;16", "I")
    got = load_image(p, pre(c=1, scale=1 / 255))
    np.testing.assert_allclose(got, np.array([[[0, 1.0], [100 / 255, 1 / 255]]]), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(load_image(p, pre(c=3))[:, 0, 1], [255, 255, 255])


def test_la_drops_alpha(tmp_path):
    la = Image.fromarray(np.array([[[10, 0], [20, 255]], [[30, 7], [40, 128]]], np.uint8), "LA")
    p = save(tmp_path / "la.png", la)
    grey = np.array([[10, 20], [30, 40]], np.float32)
    np.testing.assert_array_equal(load_image(p, pre(c=1)), grey[None])
    np.testing.assert_array_equal(load_image(p, pre(c=3)), np.stack([grey] * 3))


def test_grey_image_to_three_channel_model_replicates(tmp_path):
    a = np.array([[0, 64], [128, 255]], np.uint8)
    p = save(tmp_path / "g.png", Image.fromarray(a, "L"))
    np.testing.assert_array_equal(load_image(p, pre(c=3)), np.stack([a, a, a]).astype(np.float32))


def test_rgb_image_to_one_channel_model_uses_luma(tmp_path):
    # PIL's L = R*299/1000 + G*587/1000 + B*114/1000: red 76.2, green 149.7, blue 29.1, white 255
    p = save(tmp_path / "rgb.png", Image.fromarray(RGB_2x2, "RGB"))
    np.testing.assert_array_equal(load_image(p, pre(c=1)), [[[76, 150], [29, 255]]])


def test_bgr_flips_channels(tmp_path):
    p = save(tmp_path / "rgb.png", Image.fromarray(RGB_2x2, "RGB"))
    got = load_image(p, pre(bgr=True))
    np.testing.assert_array_equal(got, RGB_2x2[:, :, ::-1].transpose(2, 0, 1))
    assert got[0, 1, 0] == 255 and got[2, 0, 0] == 255  # blue pixel in channel 0, red in channel 2


def test_mean_std_applied_after_scale_per_channel(tmp_path):
    p = save(tmp_path / "rgb.png", Image.fromarray(RGB_2x2, "RGB"))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = load_image(p, pre(scale=1 / 255, mean=mean, std=std))
    x = RGB_2x2.astype(np.float64)
    expected = ((x / 255 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert got[0, 0, 0] == pytest.approx((1 - 0.485) / 0.229, rel=1e-5)  # red pixel, R channel
    assert got[1, 0, 0] == pytest.approx((0 - 0.456) / 0.224, rel=1e-5)  # red pixel, G channel


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_normalization_is_float32_scale_then_mean_then_std_bit_for_bit(tmp_path, layout):
    # calibration files hold what the model saw: the values must not depend on how they are computed
    a = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    p = save(tmp_path / "rgb.png", Image.fromarray(a, "RGB"))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = load_image(p, pre(h=5, w=7, layout=layout, bgr=True, scale=1 / 255, mean=mean, std=std))
    x = a[:, :, ::-1].astype(np.float32)
    want = (x * np.float32(1 / 255) - np.float32(mean)) / np.float32(std)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want.transpose(2, 0, 1) if layout == "nchw" else want)


def test_a_mean_per_channel_must_match_the_channels(tmp_path):
    p = save(tmp_path / "rgb.png", Image.fromarray(RGB_2x2, "RGB"))
    with pytest.raises(QtoolError, match="one per channel"):
        load_image(p, pre(c=1, mean=(0.1, 0.2, 0.3)))


def test_layouts_shape_dtype_contiguity(tmp_path):
    a = np.arange(18, dtype=np.uint8).reshape(2, 3, 3) * 10  # H=2, W=3: catches H/W swaps
    p = save(tmp_path / "rgb.png", Image.fromarray(a, "RGB"))
    nchw = load_image(p, pre(h=2, w=3, layout="nchw", bgr=True))
    nhwc = load_image(p, pre(h=2, w=3, layout="nhwc", bgr=True))
    assert nchw.shape == (3, 2, 3) and nhwc.shape == (2, 3, 3)
    np.testing.assert_array_equal(nhwc, a[:, :, ::-1])
    np.testing.assert_array_equal(nchw, nhwc.transpose(2, 0, 1))
    for arr in (nchw, nhwc, load_image(p, pre(h=2, w=3, c=1, layout="nhwc"))):
        assert arr.dtype == np.float32 and arr.flags["C_CONTIGUOUS"]
    assert load_image(p, pre(h=2, w=3, c=1, layout="nhwc")).shape == (2, 3, 1)


def test_exif_orientation_is_applied(tmp_path):
    stored = np.zeros((32, 48), np.uint8)  # 48 wide, 32 tall; top-left 16x16 block white
    stored[:16, :16] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # display = stored rotated 90 degrees clockwise
    p = save(tmp_path / "rot.jpg", Image.fromarray(stored, "L"), exif=exif, quality=95)
    got = load_image(p, pre(h=48, w=32, c=1))[0]  # displayed: 32 wide, 48 tall
    assert got.shape == (48, 32)
    blocks = got.reshape(3, 16, 2, 16).mean(axis=(1, 3))  # 3x2 grid of 16x16 block means
    expected = np.zeros((3, 2))
    expected[0, 1] = 255  # top-left corner turns into top-right under a clockwise turn
    np.testing.assert_allclose(blocks, expected, atol=12)


# ---------------------------------------------------------------- resize modes

def test_stretch_ignores_aspect_ratio(tmp_path):
    p = save(tmp_path / "s.png", Image.fromarray(np.array([[0, 255]], np.uint8), "L"))  # 2 wide, 1 tall
    got = load_image(p, pre(h=4, w=2, c=1))
    np.testing.assert_array_equal(got, np.tile([0, 255], (1, 4, 1)))
    assert load_image(p, pre(h=3, w=5, c=3)).shape == (3, 3, 5)


@pytest.mark.parametrize("c", [1, 3])
def test_letterbox_wide_image_pads_rows_with_114(tmp_path, c):
    p = save(tmp_path / "w.png", Image.new("RGB", (8, 4), (255, 255, 255)))  # 8 wide, 4 tall
    got = load_image(p, pre(h=8, w=8, c=c, resize="letterbox"))
    assert got.shape == (c, 8, 8)
    assert (got[:, :2] == 114).all() and (got[:, 6:] == 114).all()
    assert (got[:, 2:6] == 255).all()


def test_letterbox_tall_image_pads_columns_and_scales(tmp_path):
    p = save(tmp_path / "t.png", Image.new("L", (2, 4), 0))  # 2 wide, 4 tall -> 4 wide, 8 tall into 8x8
    got = load_image(p, pre(h=8, w=8, c=1, resize="letterbox"))[0]
    assert (got[:, :2] == 114).all() and (got[:, 6:] == 114).all()
    assert (got[:, 2:6] == 0).all()


def test_center_crop_keeps_middle_third(tmp_path):
    thirds = np.array([[10, 10, 100, 100, 200, 200]] * 2, np.uint8)  # 6 wide, 2 tall
    p = save(tmp_path / "h.png", Image.fromarray(thirds, "L"))
    np.testing.assert_array_equal(load_image(p, pre(h=2, w=2, c=1, resize="center-crop")), np.full((1, 2, 2), 100))
    p = save(tmp_path / "v.png", Image.fromarray(np.ascontiguousarray(thirds.T), "L"))  # 2 wide, 6 tall
    np.testing.assert_array_equal(load_image(p, pre(h=2, w=2, c=1, resize="center-crop")), np.full((1, 2, 2), 100))
    # a downscale: 30x10 -> cover 15x5 -> middle 5x5; interior columns come from the middle third only
    big = np.repeat(np.array([[10, 100, 200]], np.uint8), 10, axis=1).repeat(10, axis=0)
    p = save(tmp_path / "big.png", Image.fromarray(big, "L"))
    got = load_image(p, pre(h=5, w=5, c=1, resize="center-crop"))
    assert got.shape == (1, 5, 5) and (got[0, :, 1:4] == 100).all()


def test_center_crop_of_square_image_to_square_target_equals_stretch(tmp_path):
    # Scaling 7x7 to cover 29x29 needs exactly 29x29, nothing to crop. (Floating point
    # 7 * (29 / 7) = 29.000000000000004 must not make the cover size 30.)
    a = (np.arange(49).reshape(7, 7) * 5).astype(np.uint8)
    p = save(tmp_path / "sq.png", Image.fromarray(a, "L"))
    stretch = load_image(p, pre(h=29, w=29, c=1))
    crop = load_image(p, pre(h=29, w=29, c=1, resize="center-crop"))
    np.testing.assert_array_equal(crop, stretch)


# ---------------------------------------------------------------- corrupt files

def test_random_bytes_png_names_file(tmp_path):
    p = tmp_path / "noise.png"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    with pytest.raises(QtoolError, match=re.escape("noise.png")):
        load_image(p, pre())


def test_truncated_jpeg_names_file(tmp_path):
    noise = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    full = save(tmp_path / "full.jpg", Image.fromarray(noise, "RGB"))
    p = tmp_path / "cut.jpg"
    p.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    load_image(full, pre(h=64, w=64))  # the intact file decodes
    with pytest.raises(QtoolError, match=re.escape("cut.jpg")):
        load_image(p, pre(h=64, w=64))


# ---------------------------------------------------------------- option parsing

def test_parse_size():
    assert parse_size("320x320") == (320, 320)
    assert parse_size("240X320") == (240, 320)
    assert parse_size(None) is None
    for bad, msg in [("0x0", "positive"), ("0x5", "positive"), ("abc", "HxW"), ("1x2x3", "HxW"), ("ax3", "HxW")]:
        with pytest.raises(QtoolError, match=msg):
            parse_size(bad)


def test_parse_scale():
    assert parse_scale("1/255") == pytest.approx(1 / 255)
    assert parse_scale("0.5") == 0.5
    assert parse_scale("2") == 2.0
    for bad in ["1/0", "x", "0", "0/5", "inf", ""]:
        with pytest.raises(QtoolError, match="scale="):
            parse_scale(bad)


def test_parse_channels():
    assert parse_channels(None, "mean", 3, 0.0) == (0.0, 0.0, 0.0)
    assert parse_channels(None, "std", 1, 1.0) == (1.0,)
    assert parse_channels("0.5", "mean", 3, 0.0) == (0.5, 0.5, 0.5)
    assert parse_channels("1,2,3", "mean", 3, 0.0) == (1.0, 2.0, 3.0)
    assert parse_channels("0", "mean", 3, 0.0) == (0.0, 0.0, 0.0)  # a zero mean is fine
    with pytest.raises(QtoolError, match="3 channels"):
        parse_channels("1,2", "mean", 3, 0.0)
    with pytest.raises(QtoolError, match="1 channels"):
        parse_channels("1,2,3", "mean", 1, 0.0)
    for bad in ["0", "1,0,1"]:
        with pytest.raises(QtoolError, match="zero"):
            parse_channels(bad, "std", 3, 1.0)
    for bad in ["a,b,c", "nan"]:
        with pytest.raises(QtoolError, match="mean"):
            parse_channels(bad, "mean", 3, 0.0)


@pytest.mark.parametrize("dims, layout", [
    ((None, 3, None, None), "nchw"), ((1, 1, 28, 28), "nchw"), ((None, None, None, 3), "nhwc"),
    ((1, 224, 224, 3), "nhwc"), ((1, 28, 28, 1), "nhwc"), ((1, 3, 224, 3), "nchw"),
    ((1, 3, 3, 3), "nchw"), ((None, None, None, None), "nchw"), ((1, 4, 8, 8), "nchw"),
])
def test_infer_layout(dims, layout):
    assert infer_layout(dims) == layout


# ---------------------------------------------------------------- resolve_preprocess

def resolve(dims, size=None, layout=None, mean=None, std=None):
    spec = InputSpec("images", 1, dims)
    return resolve_preprocess(spec, size=size, layout=layout, resize="stretch", scale=1 / 255,
                              mean=mean, std=std, bgr=False)


def test_resolve_uses_static_dims_and_layout():
    p = resolve((1, 3, 224, 320))
    assert (p.height, p.width, p.channels, p.layout) == (224, 320, 3, "nchw")
    assert p.mean == (0.0, 0.0, 0.0) and p.std == (1.0, 1.0, 1.0)
    p = resolve((None, 240, 320, 1), mean="0.5", std="0.25")
    assert (p.height, p.width, p.channels, p.layout) == (240, 320, 1, "nhwc")
    assert p.mean == (0.5,) and p.std == (0.25,)
    assert resolve((1, 3, 224, 224), size=(224, 224)).height == 224  # agreeing --size is fine
    p = resolve((1, 3, None, 320), size=(256, 320))
    assert (p.height, p.width) == (256, 320)
    p = resolve((None, 3, None, None), size=(128, 96), mean="1,2,3")
    assert (p.height, p.width, p.mean) == (128, 96, (1.0, 2.0, 3.0))


def test_resolve_refusals():
    with pytest.raises(QtoolError, match="size="):
        resolve((None, 3, None, None))
    with pytest.raises(QtoolError, match="size="):
        resolve((1, 3, 224, None))
    with pytest.raises(QtoolError, match="contradicts"):
        resolve((1, 3, 224, 224), size=(320, 320))
    with pytest.raises(QtoolError, match="contradicts"):
        resolve((1, 3, None, 320), size=(256, 300))
    with pytest.raises(QtoolError, match="4 channels"):
        resolve((1, 4, 224, 224))
    with pytest.raises(QtoolError, match="dynamic channel"):
        resolve((1, None, 224, 224), layout="nchw")
    with pytest.raises(QtoolError, match="224 channels"):
        resolve((1, 3, 224, 224), layout="nhwc")
    with pytest.raises(QtoolError, match="3 channels"):
        resolve((1, 3, 8, 8), mean="1,2")


# ---------------------------------------------------------------- batches

def test_batches_stack_in_order_with_counts(tmp_path):
    paths = [save(tmp_path / f"{i}.png", Image.new("L", (3, 2), i * 30)) for i in range(7)]
    p = pre(h=2, w=3, c=1)
    got = list(batches(paths, p, 3))
    assert [n for _, n in got] == [3, 3, 1]
    assert [b.shape for b, _ in got] == [(3, 1, 2, 3), (3, 1, 2, 3), (1, 1, 2, 3)]
    assert all(b.dtype == np.float32 for b, _ in got)
    np.testing.assert_array_equal(np.concatenate([b for b, _ in got])[:, 0, 0, 0], [i * 30 for i in range(7)])
    runs = [np.concatenate([b for b, _ in batches(paths, p, bs)]) for bs in (1, 3, 8)]
    assert [len(list(batches(paths, p, bs))) for bs in (1, 3, 8)] == [7, 3, 1]
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[0], runs[2])
    assert list(batches([], p, 4)) == []
