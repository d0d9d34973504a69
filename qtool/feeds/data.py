"""Calibration inputs from an image folder: discovery, decoding, preprocessing, batching."""

from __future__ import annotations

import math
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from onnx import helper

from ..errors import Opt, QtoolError, UsageError
from ..model import InputSpec
from ..model.graph import Constants

if TYPE_CHECKING:
    from PIL import Image

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp"}
RESIZE_MODES = ("stretch", "letterbox", "center-crop")
LETTERBOX_FILL = 114  # grey padding, as YOLO exporters' letterbox uses


@dataclass(frozen=True)
class Preprocess:
    """Everything that turns an image file into one input sample; stored in the calibration file."""

    height: int
    width: int
    channels: int  # 1 (grey) or 3
    layout: str  # "nchw" or "nhwc"
    resize: str = "stretch"
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    bgr: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
# The most pixels an image may have (Pillow's decompression-bomb limit, Image.MAX_IMAGE_PIXELS at its
# default: a 9459x9459 image), and the most bytes one .npy/.npz data file may hold once decompressed.
MAX_IMAGE_PIXELS = 89_478_485
MAX_ARRAY_FILE_BYTES = 2 << 30

# --size: the largest height and width (one 8192x8192 RGB image is 768 MB of float32)
MAX_SIDE = 8192


def parse_size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.lower().replace("×", "x").split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise QtoolError("{size} is not HxW, e.g. {example}", size=Opt("size", text, quoted=True), example=Opt("size", (320, 320))) from None
    if h <= 0 or w <= 0:
        raise QtoolError("{size} must have positive height and width, e.g. {example}", size=Opt("size", text, quoted=True),
                         example=Opt("size", (320, 320)))
    if h > MAX_SIDE or w > MAX_SIDE:
        raise QtoolError("{size} is too large: height and width go up to {most}", size=Opt("size", text, quoted=True), most=MAX_SIDE)
    return h, w


_DOWNSAMPLING = {"Conv", "MaxPool", "AveragePool", "LpPool", "ConvInteger", "QLinearConv"}
_UPSAMPLING = {"Resize", "Upsample", "ConvTranspose", "DepthToSpace"}


def size_multiple(proto, input_name: str) -> int | None:
    """What the image height and width must be a multiple of, when the graph tells: the largest
    stride a tensor reaches from the input (Conv/pool strides multiplied, divided again by what
    upsamples it), in a model that upsamples a strided tensor (a feature pyramid: its Resize output
    is joined to an earlier tensor, which only lines up at multiples of that stride; YOLOv8's path
    down again after it stays at 32). None when nothing upsamples (any size runs). A tensor whose
    stride the graph does not fix (upsampled by a computed factor or to computed sizes) counts for
    nothing: the check then errs towards sizes onnxruntime refuses, with size_mismatch."""
    constants = Constants(proto.graph)
    stride: dict[str, float | None] = {input_name: 1.0}
    multiple, upsampled = 1.0, False
    for node in proto.graph.node:  # ONNX graphs are stored in topological order
        if not any(i in stride for i in node.input):
            continue
        known = [stride[i] for i in node.input if stride.get(i) is not None]
        s = max(known) if known else None
        if s is not None and node.op_type in _DOWNSAMPLING:
            strides = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "strides"), None)
            s *= max(strides) if strides else 1
        elif s is not None and node.op_type in _UPSAMPLING:
            factor = _upsampling(node, constants)  # None: resized to computed sizes (which line up at any size)
            upsampled |= s > 1 and factor is not None
            s = s / factor if factor else None
        if s is not None:
            multiple = max(multiple, s)
        for out in node.output:
            stride[out] = s
    return int(round(multiple)) if upsampled and multiple > 1 else None


def _upsampling(node, constants) -> float | None:
    """How many times larger `node` makes a feature map (height or width, the larger), when the graph fixes it."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "ConvTranspose":
        return float(max(attrs.get("strides") or [1]))
    if node.op_type == "DepthToSpace":
        return float(attrs.get("blocksize", 1))
    slot = 2 if node.op_type == "Resize" else 1  # Resize(X, roi, scales, sizes); Upsample(X, scales)
    scales = constants.value(node.input[slot]) if len(node.input) > slot and node.input[slot] else None
    if scales is None or scales.size < 3 or not np.all(np.isfinite(scales)) or np.min(scales[2:]) <= 0:
        return None  # scales computed in the graph, or `sizes` given: the output's stride is not fixed
    return float(np.max(scales[2:]))


def size_problem(proto, input_name: str, size: tuple[int, int]) -> UsageError | None:
    """Why the model cannot run at `size` (its strides tell: size_multiple), else None."""
    multiple = size_multiple(proto, input_name)
    if not multiple or not (size[0] % multiple or size[1] % multiple):
        return None
    up = [-(-side // multiple) * multiple for side in size]
    return UsageError("{size}: this model's height and width must be multiples of {multiple} (its strides multiply "
                      "to {multiple} before it upsamples and joins features); e.g. {example}",
                      size=Opt("size", tuple(size)), multiple=multiple, example=Opt("size", tuple(up)))


def size_mismatch(error: QtoolError) -> QtoolError:
    """onnxruntime's `error` where feature maps of a size the strides do not divide meet (Concat, Add), with the hint."""
    return QtoolError("{error}; the feature maps did not line up at this {size}: give a height and width divisible by the "
                      "model's total stride (often 32)", error=error, size=Opt("size"))


def parse_scale(text: str) -> float:
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        raise QtoolError("{scale} is not a number or fraction, e.g. {example}", scale=Opt("scale", text, quoted=True),
                         example=Opt("scale", "1/255")) from None
    if not math.isfinite(value) or value == 0:
        raise QtoolError("{scale} must be a finite non-zero number", scale=Opt("scale", text, quoted=True))
    return value


def parse_channels(text: str | None, option: str, channels: int, default: float) -> tuple[float, ...]:
    if text is None:
        return (default,) * channels
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise QtoolError("{option} is not a comma-separated list of numbers", option=Opt(option, text, quoted=True)) from None
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise QtoolError("{option} has {n} values but the model input has {channels} channels", option=Opt(option, text, quoted=True),
                         n=len(values), channels=channels)
    if not all(math.isfinite(v) for v in values):
        raise QtoolError("{option} must be finite numbers", option=Opt(option, text, quoted=True))
    # preprocessing runs in float32: a value beyond its range would become inf, one below its
    # smallest normal number a std that overflows the division
    if any(abs(v) > FLOAT32_MAX for v in values):
        raise QtoolError("{option} is beyond float32 (|value| <= {most:.4g}), the type images are fed in", option=Opt(option, text, quoted=True),
                         most=FLOAT32_MAX)
    if option == "std" and any(abs(v) < FLOAT32_TINY for v in values):
        raise QtoolError("{std} must not contain zero or values below {least:.4g} (float32's smallest normal number)",
                         std=Opt("std", text, quoted=True), least=FLOAT32_TINY)
    return values


def infer_layout(dims: tuple[int | None, ...]) -> str:
    """NCHW unless only the last dimension looks like a channel count."""
    c_first, c_last = dims[1], dims[3]
    if c_last in (1, 3) and c_first not in (1, 3):
        return "nhwc"
    return "nchw"


def resolve_preprocess(
    spec: InputSpec,
    *,
    size: tuple[int, int] | None,
    layout: str | None,
    resize: str,
    scale: float,
    mean: str | None,
    std: str | None,
    bgr: bool,
) -> Preprocess:
    """Fill in what the model's input shape determines; refuse what contradicts it."""
    layout = layout or infer_layout(spec.dims)
    if layout == "nchw":
        c, h, w = spec.dims[1], spec.dims[2], spec.dims[3]
    else:
        h, w, c = spec.dims[1], spec.dims[2], spec.dims[3]
    if c not in (1, 3):
        what = "a dynamic channel dimension" if c is None else f"{c} channels"
        raise QtoolError("input {name!r} {shape} has {what} in {layout} layout; images give 1 or 3 channels (use {given} if the "
                         "layout was guessed wrong)", name=spec.name, shape=_shape(spec.dims), what=what, layout=layout.upper(),
                         given=Opt("layout", "nchw|nhwc"))
    if size is not None:
        if (h is not None and h != size[0]) or (w is not None and w != size[1]):
            raise QtoolError("{size} contradicts the model input {name!r} {shape}", size=Opt("size", tuple(size)), name=spec.name,
                             shape=_shape(spec.dims))
        h, w = size
    if h is None or w is None:
        raise QtoolError("input {name!r} {shape} has dynamic height/width; give the calibration size with {size}", name=spec.name,
                         shape=_shape(spec.dims), size=Opt("size", metavar="HxW"))
    return Preprocess(
        height=h, width=w, channels=c, layout=layout, resize=resize, scale=scale,
        mean=parse_channels(mean, "mean", c, 0.0), std=parse_channels(std, "std", c, 1.0), bgr=bgr,
    )


def _shape(dims: tuple[int | None, ...]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"


def _list_files(folder: str | Path, suffixes: set[str], option: str, what: str, limit: int | None) -> list[Path]:
    """Files with these suffixes under `folder` (recursively), sorted by relative path."""
    root = Path(folder)
    if not root.exists():
        raise QtoolError("{option} folder {root!r} does not exist", option=Opt(option), root=str(root))
    if not root.is_dir():
        raise QtoolError("{option} {root!r} is not a folder", option=Opt(option), root=str(root))
    files = sorted(
        (p for p in root.rglob("*") if p.suffix.lower() in suffixes and p.is_file()),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    if not files:
        raise QtoolError(f"no {what} found in {str(root)!r}")
    return files[:limit] if limit else files


def list_images(folder: str | Path, limit: int | None = None) -> list[Path]:
    """Image files under `folder` (recursively), sorted by relative path."""
    return _list_files(folder, IMAGE_SUFFIXES, "images", "images (.jpg, .jpeg, .png, .bmp)", limit)


def _to_8bit(img: Image.Image) -> Image.Image:
    """Grey 16/32-bit and float images to 8-bit grey; everything else untouched."""
    from PIL import Image

    if img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        arr = np.asarray(img, dtype=np.float64)
        if img.mode == "F":
            peak = 1.0 if np.nanmax(arr, initial=0.0) <= 1.0 else 255.0
            arr = arr * (255.0 / peak)
        else:
            arr = arr / 257.0  # 16-bit full scale 65535 -> 255
        return Image.fromarray(np.clip(np.rint(np.nan_to_num(arr)), 0, 255).astype(np.uint8), mode="L")
    return img


def load_image(path: Path, pre: Preprocess) -> np.ndarray:
    """Decode and preprocess one image into a float32 sample (C,H,W) or (H,W,C)."""
    # Pillow is imported by the runs that decode images (2 MB of a calibration on data files otherwise)
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, in one line
            im = Image.open(path)
    except Image.DecompressionBombError:
        im = None
    except Exception as e:  # PIL raises many types for corrupt files
        raise QtoolError(f"cannot read image {str(path)!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if im is None or im.width * im.height > MAX_IMAGE_PIXELS:
        size = "" if im is None else f" ({im.width}x{im.height})"
        if im is not None:
            im.close()
        raise QtoolError(f"image {str(path)!r}{size} has more than {MAX_IMAGE_PIXELS} pixels (Pillow's decompression-bomb "
                         "limit); shrink it or leave it out")
    try:
        with im:
            im.load()
            img = ImageOps.exif_transpose(im) or im
            img = _to_8bit(img)
            img = img.convert("L" if pre.channels == 1 else "RGB")
    except Exception as e:  # PIL raises many types for corrupt files
        raise QtoolError(f"cannot read image {str(path)!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    img = _resize(img, pre)
    # channel order and layout are set on the 8-bit pixels (a quarter of the bytes to move; the
    # conversion to float32 is exact), then (x * scale - mean) / std runs in place, in that order
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if pre.bgr and pre.channels == 3:
        arr = arr[:, :, ::-1]
    mean, std = np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32)
    if pre.layout == "nchw":
        arr, mean, std = arr.transpose(2, 0, 1), mean.reshape(-1, 1, 1), std.reshape(-1, 1, 1)
    out = np.ascontiguousarray(arr, dtype=np.float32)
    if np.broadcast_shapes(out.shape, mean.shape, std.shape) != out.shape:
        raise QtoolError(f"mean {pre.mean} and std {pre.std} need one value or one per channel ({out.shape[0 if pre.layout == 'nchw' else -1]})")
    out *= np.float32(pre.scale)
    out -= mean
    out /= std
    return out


def _resize(img: Image.Image, pre: Preprocess) -> Image.Image:
    from PIL import Image

    w, h = img.size
    W, H = pre.width, pre.height
    if pre.resize == "stretch" or (w, h) == (W, H):
        return img if (w, h) == (W, H) else img.resize((W, H), Image.BILINEAR)
    if pre.resize == "letterbox":
        if W * h <= H * w:  # width is the binding side (integer comparison, exact)
            nw, nh = W, max(1, (2 * h * W + w) // (2 * w))  # round half up
        else:
            nw, nh = max(1, (2 * w * H + h) // (2 * h)), H
        fill = LETTERBOX_FILL if img.mode == "L" else (LETTERBOX_FILL,) * 3
        canvas = Image.new(img.mode, (W, H), fill)
        canvas.paste(img.resize((nw, nh), Image.BILINEAR), ((W - nw) // 2, (H - nh) // 2))
        return canvas
    # center-crop: cover the target, then cut the middle
    if W * h >= H * w:  # width is the tighter side: scale to width W (integer comparison, exact)
        nw, nh = W, max(H, -(-h * W // w))
    else:
        nw, nh = max(W, -(-w * H // h)), H
    left, top = (nw - W) // 2, (nh - H) // 2
    return img.resize((nw, nh), Image.BILINEAR).crop((left, top, left + W, top + H))


def batches(paths: list[Path], pre: Preprocess, batch_size: int, skipped: list | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Stacked batches of preprocessed images, with the number of images in each.

    With a `skipped` list, unreadable images are appended to it (path, reason) and left out
    instead of stopping the run; batches are then filled from the images that follow.
    """
    chunk: list[np.ndarray] = []
    for path in paths:
        try:
            chunk.append(load_image(path, pre))
        except QtoolError as e:
            if skipped is None:
                raise
            skipped.append((path, str(e)))
            continue
        if len(chunk) == batch_size:
            yield np.stack(chunk), len(chunk)
            chunk = []
    if chunk:
        yield np.stack(chunk), len(chunk)


def image_runs(paths: list[Path], pre: Preprocess, input_name: str, batch_size: int, skipped: list | None = None) -> Iterator[tuple[dict, int]]:
    """Feeds for the image input, `batch_size` images at a time."""
    for batch, count in batches(paths, pre, batch_size, skipped):
        yield {input_name: batch}, count


ARRAY_SUFFIXES = {".npy", ".npz"}


def list_arrays(where: str | Path, limit: int | None = None, specs: list[InputSpec] | None = None) -> list:
    """.npy/.npz files under the folder `where` (recursively), sorted by relative path, one run
    each; or, `where` being one such file, its runs of samples (Samples: one sample each, or the
    model's fixed batch), the first `limit` samples."""
    path = Path(where)
    if path.is_file() and path.suffix.lower() in ARRAY_SUFFIXES and specs is not None:
        return SampleFile(path, specs).runs(limit)
    if path.exists() and not path.is_dir():
        raise QtoolError("{option} {path!r} is neither a folder nor a .npy/.npz file", option=Opt("data"), path=str(path))
    return _list_files(path, ARRAY_SUFFIXES, "data", ".npy or .npz files", limit)


def _np_dtype(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _fit(path, arr: np.ndarray, spec: InputSpec) -> np.ndarray:
    """`arr` as the input `spec` takes it: batch axis added if missing, dtype converted
    (`path`: the file, or a description of an in-memory item, for messages)."""
    arr = np.asarray(arr)
    rank = len(spec.dims)
    if arr.ndim == rank - 1 and rank > 0:
        arr = arr[None]
    elif arr.ndim != rank:
        raise QtoolError(
            f"{str(path)!r}: array for input {spec.name!r} has shape {list(arr.shape)}, but the input has rank {rank} "
            f"({rank} dims with the batch axis, or {max(rank - 1, 0)} without)"
        )
    for axis, (want, got) in enumerate(zip(spec.dims, arr.shape)):
        if want is not None and axis > 0 and want != got:
            raise QtoolError(f"{str(path)!r}: input {spec.name!r} needs size {want} on axis {axis}, the array has {got}")
    target = _np_dtype(spec.elem_type)
    if arr.dtype != target:
        if not np.can_cast(arr.dtype, target, casting="same_kind"):
            raise QtoolError(f"{str(path)!r}: input {spec.name!r} takes {target}, the array is {arr.dtype}")
        arr = arr.astype(target)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)  # ascontiguousarray makes a scalar [1]


def _check_array_file(path: Path) -> None:
    """Refuse a .npy/.npz data file over MAX_ARRAY_FILE_BYTES, an .npz by the sizes its members
    declare once decompressed (a small archive can inflate to any size)."""
    try:
        size = path.stat().st_size
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                size = max(size, sum(i.file_size for i in z.infolist()))
    except (OSError, zipfile.BadZipFile, ValueError):
        return  # np.load reports what is wrong with it
    if size > MAX_ARRAY_FILE_BYTES:
        raise QtoolError(f"data file {str(path)!r} holds {size} bytes, more than qtool loads as one input "
                         f"({MAX_ARRAY_FILE_BYTES >> 30} GiB); split it into smaller .npy/.npz files")


def _read_arrays(path: Path, specs: list[InputSpec]) -> dict:
    """{name: array} of a .npy (single-input models: keyed by the input's name) or .npz file."""
    _check_array_file(path)
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return {k: loaded[k] for k in loaded.files}
    except Exception as e:
        raise QtoolError(f"cannot read {str(path)!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if len(specs) != 1:
        names = ", ".join(s.name for s in specs)
        raise QtoolError(f"{str(path)!r}: a .npy file feeds single-input models; this model has inputs {names}: use .npz files keyed by input name")
    return {specs[0].name: loaded}


def load_arrays(path: Path, specs: list[InputSpec]) -> tuple[dict, int]:
    """One run's feeds from a .npy (single-input models) or .npz (keys = input names) file."""
    return feeds_from(_read_arrays(path, specs), specs, path)


def feeds_from(arrays: dict, specs: list[InputSpec], where) -> tuple[dict, int]:
    """One run's feeds from {input name: array} (`where`: a file or item, for messages), and
    the number of samples in it."""
    names = [s.name for s in specs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise QtoolError(f"{str(where)!r} has no array for input(s) {', '.join(missing)} (it has: {', '.join(arrays) or 'nothing'})")
    extra = [k for k in arrays if k not in names]
    if extra:
        raise QtoolError(f"{str(where)!r} has arrays {', '.join(extra)} that are not model inputs ({', '.join(names)})")
    feeds = {s.name: _fit(where, arrays[s.name], s) for s in specs}
    # samples in this run: the common leading dimension, or 1 when the inputs have no common
    # batch axis (a recurrent model's [time, batch, ...] features beside a [1, batch, ...] state)
    leading = {a.shape[0] for s, a in zip(specs, feeds.values()) if len(s.dims) > 0}
    return feeds, leading.pop() if len(leading) == 1 else 1


def array_runs(paths: list, specs: list[InputSpec]) -> Iterator[tuple[dict, int]]:
    """One run per file (or per Samples of a file of samples, list_arrays): the data fix the
    batching, so results cannot depend on a batch size."""
    for path in paths:
        yield path.feeds() if isinstance(path, Samples) else load_arrays(path, specs)


class SampleFile:
    """A .npy/.npz file of samples along the first axis of its arrays (`--data FILE`), read once:
    a .npy feeds a single-input model; a .npz holds one array per input, keyed by its name, all
    with the same number of samples (a single-input model also takes a .npz whose one array of its
    rank has another name, e.g. `x` beside labels `y`). A sample feeds a run as the file of it
    alone would (np.save(f, array[i])): the batch axis added when the input has one; a model whose
    batch is fixed at B > 1 takes B samples a run."""

    def __init__(self, path: Path, specs: list[InputSpec]):
        self.path, self.specs = path, specs
        arrays = _read_arrays(path, specs)
        if len(specs) == 1 and specs[0].name not in arrays:
            fits = [k for k, a in arrays.items() if a.ndim in (len(specs[0].dims), len(specs[0].dims) + 1)]
            if len(fits) == 1:
                arrays = {specs[0].name: arrays[fits[0]]}
        names = [s.name for s in specs]
        missing = [n for n in names if n not in arrays]
        if missing:
            raise QtoolError(f"{str(path)!r} has no array for input(s) {', '.join(missing)} (it has: {', '.join(arrays) or 'nothing'}); "
                             "a file of samples holds one array per model input, keyed by its name")
        extra = [k for k in arrays if k not in names]
        if extra:
            raise QtoolError(f"{str(path)!r} has arrays {', '.join(extra)} that are not model inputs ({', '.join(names)})")
        lengths = {n: arrays[n].shape[0] if arrays[n].ndim else None for n in names}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            told = ", ".join(f"{n} {'a scalar' if k is None else k}" for n, k in lengths.items())
            raise QtoolError(f"{str(path)!r}: a file of samples holds them along the first axis of every array, the same "
                             f"number in each; it has {told}")
        self.arrays, self.count = {n: arrays[n] for n in names}, next(iter(lengths.values()))
        if self.count == 0:
            raise QtoolError(f"{str(path)!r} holds no samples (its arrays' first axis is empty)")
        # the samples axis is the inputs' batch axis: a batch every input fixes at B is B samples a run
        firsts = {s.dims[0] if s.dims and self.arrays[s.name].ndim == len(s.dims) else None for s in specs}
        self.batch = firsts.pop() if len(firsts) == 1 and None not in firsts else 1

    def runs(self, limit: int | None = None) -> list[Samples]:
        """The runs of the first `limit` samples (all: None)."""
        count = min(self.count, limit) if limit else self.count
        if count % self.batch:
            raise QtoolError("{count} samples do not fill batches of {fixed} (the model's fixed batch); use {limit}", count=count,
                             fixed=self.batch, limit=Opt("limit", count - count % self.batch or self.batch))
        return [Samples(self, i, i + self.batch) for i in range(0, count, self.batch)]


def sample_runs(inputs: list) -> tuple[str, str] | None:
    """What the runs over a file of samples are: ("samples", its path) when each is one sample,
    ("runs", its path) for a fixed batch over 1; None for files, one run each."""
    if not inputs or not isinstance(inputs[0], Samples):
        return None
    file = inputs[0].file
    return ("samples" if file.batch == 1 else "runs"), str(file.path)


@dataclass(frozen=True)
class Samples:
    """One run's samples [start, stop) of a SampleFile."""

    file: SampleFile
    start: int
    stop: int

    def __str__(self) -> str:
        which = self.start if self.stop == self.start + 1 else f"{self.start}..{self.stop - 1}"
        return f"{self.file.path} sample {which}"

    def feeds(self) -> tuple[dict, int]:
        one = self.stop == self.start + 1
        arrays = {n: a[self.start] if one else a[self.start:self.stop] for n, a in self.file.arrays.items()}
        return feeds_from(arrays, self.file.specs, self)


def memory_runs(items, specs: list[InputSpec]) -> Iterator[tuple[dict, int]]:
    """One run per item of an in-memory loader (Polygraphy's convention: an iterable of
    {input name: ndarray}, batch axis first; a bare array feeds a single-input model)."""
    for i, item in enumerate(items):
        where = f"loader item {i}"
        if not isinstance(item, dict):
            if len(specs) != 1:
                raise QtoolError(f"{where} is not a dict of input name -> array; this model has inputs {', '.join(s.name for s in specs)}")
            item = {specs[0].name: item}
        yield feeds_from(item, specs, where)


@dataclass(frozen=True)
class ImageRuns:
    """Runs of one image each, by index: what calibration's helper processes take one at a time."""

    paths: list[Path]
    pre: Preprocess
    input_name: str

    def __len__(self) -> int:
        return len(self.paths)

    def run(self, i: int, skipped: list | None = None) -> Iterator[tuple[dict, int]]:
        """The run of image i, as image_runs gives it (none if it is unreadable and skipped)."""
        return image_runs([self.paths[i]], self.pre, self.input_name, 1, skipped)


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'K/N' (1 <= K <= N): this process takes every N-th input starting with the K-th."""
    if text is None:
        return None
    try:
        k, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise QtoolError("{shard} is not K/N, e.g. {example}", shard=Opt("shard", text, quoted=True), example=Opt("shard", "1/4")) from None
    if not 1 <= k <= n:
        raise QtoolError("{shard} needs 1 <= K <= N", shard=Opt("shard", text, quoted=True))
    return k, n


def take_shard(items: list, shard: tuple[int, int] | None) -> list:
    if shard is None:
        return items
    k, n = shard
    return items[k - 1 :: n]
