"""Every command's options as data: one frozen dataclass per command (and per group of export
options), each field declared once with its command-line flag and help (`option`), checked where
the object is built (`__post_init__`: choices, which target reads which option, one source of
inputs). The command line and qtool.api build these objects from their keywords (`build`); the
library below takes them (a target's writer: ExportOptions) instead of keywords.

Each default is written once, in its field's declaration: the command line's click options
(qtool.cli.declared) and qtool.api's keywords both come from it. What several commands take with
one meaning is declared once too: the inputs (SHARED: --images, --data, --limit, --batch-size, in
calibrate, evaluate and export's mixed precision), the image preprocessing (ImageOptions: calibrate's
defaults CALIBRATE_IMAGE, evaluate's the calibration file's), DEFAULT_TARGET; `command_options`
gives each command's own options with its defaults, in --help order.

Export options come in groups, one dataclass each, which `qtool export --help` shows as sections:
General (every target, ExportOptions, here) and each target's own group, declared in its package
and named by the registry (qtool.targets); the command line adds export's Mixed precision (layers
kept FP32 by measurement, MixedPrecision) and evaluate's held-out inputs.
Adding an export option: one field in its group (here for every target, else in the target's
package), and the code that reads it.
"""

from __future__ import annotations

import math
import os
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import ClassVar

from . import calibration
from .errors import Opt, QtoolError, UsageError
from .feeds import data as _data
from .statistics import thresholds

COMMANDS = ("calibrate", "recompute", "merge", "export", "inspect", "evaluate", "report")


@dataclass(frozen=True)
class Option:
    """One option as the command line shows it: its key (the field and API keyword), flag (a
    "--x/--no-x" pair sets True/False), help, --help section and the targets that read it, and its
    default (the field's: the one place it is written). `negated`: a --no-... switch setting the key
    False; `helps`: (command, help) where a command words it otherwise than `help`; `bounds`: an
    integer's (least, most); `kind`: int or float for a number without bounds. `readers`: filled in
    by the registry (qtool.targets)."""

    key: str
    flag: str
    help: str
    section: str | None = None
    readers: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    helps: tuple[tuple[str, str], ...] = ()
    negated: bool = False
    multiple: bool = False
    metavar: str | None = None
    bounds: tuple[int, int | None] | None = None
    kind: type | None = None
    path: bool = False
    default: object = None

    def help_for(self, command: str) -> str:
        """Its help in `command`'s --help."""
        return dict(self.helps).get(command, self.help)


def option(default, flag: str, help: str, **declared):
    """A dataclass field declaring its option (the rest of Option is filled in by `declared_options`);
    a keyword named after a command (COMMANDS: evaluate=..., report=...) is that command's help."""
    helps = tuple((c, declared.pop(c)) for c in COMMANDS if c in declared)
    return field(default=default, metadata={"option": dict(flag=flag, help=help, helps=helps, **declared)})


def declaration(key: str, **declared):
    """A field declaring the shared option `key` of SHARED (the same flag, meaning and default in
    every command that takes it; `declared`: what one command adds, e.g. its help)."""
    default, flag, help, *more = SHARED[key]
    merged = {**(more[0] if more else {}), **declared}
    return option(default, flag, help, **merged)


def declared_options(group, section: str | None = None) -> dict[str, Option]:
    """key -> Option of a dataclass's declared fields (`section`: their --help section, default the class's SECTION)."""
    section = section or getattr(group, "SECTION", None)
    return {f.name: Option(f.name, section=section, default=f.default, **f.metadata["option"])
            for f in fields(group) if "option" in f.metadata}


def defaults(group) -> dict:
    """key -> default of a dataclass's fields."""
    return {f.name: f.default for f in fields(group) if f.default is not MISSING}


def _choose(key: str, value, choices) -> None:
    if value is not None and value not in choices:
        raise QtoolError("{option} is not one of {choices}", option=Opt(key, value, quoted=True), choices=", ".join(choices))


def _check_choices(obj) -> None:
    for key, o in declared_options(type(obj)).items():
        if o.choices:
            _choose(key, getattr(obj, key), o.choices)


def _names(values) -> tuple[str, ...]:
    return (values,) if isinstance(values, str) else tuple(values or ())


def method(text: str | None, own: tuple[str, ...] = ()) -> str | None:
    """A threshold method checked (qtool.statistics.thresholds; `own`: a target's own methods too)."""
    if text is None or text in own:
        return text
    try:
        return thresholds.parse_method(text)
    except ValueError as e:
        raise QtoolError("{method}: {why}", method=Opt("method"), why=str(e)) from None


def exactly_one(images, data) -> None:
    """The one source of inputs a command reads."""
    if (images is None) == (data is None):
        raise QtoolError("give exactly one of {images} or {data}", images=Opt("images", metavar="DIR"), data=Opt("data", metavar="DIR"))


# ---------------------------------------------------------------------------- export options

DEFAULT_TARGET = "qdq"  # whose export evaluate and report show when neither --target nor a file names one (the API's default too)


@dataclass(frozen=True)
class ExportOptions:
    """What a target's writer reads: the options every target takes (declared here), and `own`: the
    target's own option group, declared in its package (qtool.targets names it; None: its defaults).
    Built from keywords, checked for the target, by qtool.targets.options_for."""

    SECTION: ClassVar = "General"

    target: str = DEFAULT_TARGET
    method: str | None = option(
        None, "--method", "Thresholds by this method: entropy, max, mse, percentile:P, mean-minmax, auto [default: "
        "calibrate's, else the target's].",
        evaluate="Thresholds of this method, as qtool export --method [default: the target's].",
        report="The threshold method, as qtool export --method takes it [default: what export uses].")
    include: tuple[str, ...] = option(
        (), "--include", "Quantize this node although it stays FP32 by default (repeatable).",
        multiple=True, evaluate="Quantize this node anyway, as qtool export --include (repeatable).")
    exclude: tuple[str, ...] = option(
        (), "--exclude", "Keep this node or tensor in FP32 (repeatable).", multiple=True,
        evaluate="Keep this node or tensor in FP32, as qtool export --exclude (repeatable).")
    smooth_quant: str | bool | float = option(
        "auto", "--smooth-quant", "SmoothQuant: auto (default: transformers), on, off, or one alpha in [0, 1].", metavar="auto|on|off|ALPHA",
        evaluate="SmoothQuant, as qtool export --smooth-quant [default: auto].")
    bias_correction: bool = option(
        True, "--no-bias-correction", "Keep the biases as they are (no fast bias correction).", negated=True, evaluate="Keep the biases as they are, as qtool export.")
    own: object = None

    def __post_init__(self):
        object.__setattr__(self, "include", _names(self.include))
        object.__setattr__(self, "exclude", _names(self.exclude))

    def group(self, cls):
        """The target's own option group, an instance of `cls` (its defaults when none was given)."""
        if self.own is None:
            return cls()
        if not isinstance(self.own, cls):
            raise TypeError(f"the {self.target} export reads a {cls.__name__}, not a {type(self.own).__name__}")
        return self.own


def misplaced(key: str, readers: tuple[str, ...], target: str) -> UsageError:
    """An option given for a target that does not read it."""
    return UsageError("{option} applies to {first}{others}, not {target}", option=Opt(key), first=Opt("target", readers[0]),
                      others="".join(f" or {t}" for t in readers[1:]), target=target)


def unread(given: dict, keys: dict, readers: tuple[str, ...], target: str) -> None:
    """The keywords of `given` among `keys` ({key: default}) taken out of it, for a `target` that does
    not read them (`readers` do): one given as anything but "auto", empty or a --no- switch left off is an error."""
    for key in [k for k in given if k in keys]:
        value = given.pop(key)
        if value not in ("auto", (), []) and not (value is True and keys[key] is True):
            raise misplaced(key, readers, target)


# ---------------------------------------------------------------------------- inputs

DEFAULT_BATCH = 8  # held-out images per inference when the model's batch is not fixed (evaluate, export's mixed precision)

# The inputs calibrate, evaluate and export's mixed precision read, declared once: key -> (default,
# flag, help, the rest of the declaration: each command's own help). The preprocessing of images
# is ImageOptions'.
SHARED = {
    "images": (None, "--images", "Folder of images (JPEG/PNG/BMP, sorted by name, searched recursively).", dict(
        path=True, calibrate="Folder of calibration images (JPEG/PNG/BMP, sorted by name, searched recursively).",
        evaluate="Folder of held-out images (single-input image models).", export="Held-out images to rank and measure on.")),
    "data": (None, "--data", "Folder of .npy (single-input models) or .npz (keys = input names) files, or one such file "
             "of samples along its first axis.", dict(
                 path=True, evaluate="Held-out .npy/.npz files, as calibrate --data: a folder, or one file of samples.",
                 export="Held-out .npy/.npz files (a folder, or one file of samples).")),
    "limit": (None, "--limit", "Use only the first N images, data files or samples of a data file.", dict(
        bounds=(1, None), export="Use only the first N inputs.")),
    "batch_size": (None, "--batch-size", "Images per inference [default: the model's fixed batch, else as many as fit 64 MB of "
                   "activations]; results do not depend on it.", dict(
                       bounds=(1, None), evaluate=f"Images per inference [default: the model's fixed batch, else {DEFAULT_BATCH}]; "
                       "results do not depend on it.")),
}


@dataclass(frozen=True)
class ImageOptions:
    """How images are fed (qtool.feeds.data.resolve_preprocess): None for what the model or, when
    evaluating, the calibration file decides; calibrate's own defaults are CALIBRATE_IMAGE."""

    size: tuple[int, int] | None = option(None, "--size", "HxW to resize to; needed only when the model's height/width are dynamic.",
                                          evaluate="HxW [default: the calibration file's].")
    resize: str | None = option(None, "--resize", "How images are fitted to HxW (letterbox pads with grey 114).",
                                choices=_data.RESIZE_MODES, evaluate="Image fitting [default: the calibration file's].")
    scale: float | None = option(None, "--scale", "Pixel multiplier, a number or fraction.",
                                 evaluate="Pixel multiplier [default: the calibration file's].")
    mean: str | None = option(None, "--mean", "Per-channel mean subtracted after scaling, e.g. 0.485,0.456,0.406.",
                              evaluate="Per-channel mean [default: the calibration file's].")
    std: str | None = option(None, "--std", "Per-channel std divided by after the mean, e.g. 0.229,0.224,0.225.",
                             evaluate="Per-channel std [default: the calibration file's].")
    bgr: bool | None = option(None, "--bgr/--rgb", "Feed channels in BGR order (OpenCV-trained models), or RGB.",
                              evaluate="Channel order [default: the calibration file's].")
    layout: str | None = option(None, "--layout", "Input layout [default: inferred from the model input].", choices=("nchw", "nhwc"),
                                evaluate="Input layout [default: the calibration file's].")

    def __post_init__(self):
        _check_choices(self)

    @classmethod
    def build(cls, size=None, resize=None, scale=None, mean=None, std=None, bgr=None, layout=None) -> ImageOptions:
        """From text as typed (size "HxW", scale "1/255") or numbers (size (h, w), mean (0.5, 0.5, 0.5))."""
        if size is not None and not isinstance(size, tuple):
            size = _data.parse_size(str(size))
        if scale is not None:
            scale = _data.parse_scale(scale) if isinstance(scale, str) else float(scale)
        return cls(size, resize, scale, _channels(mean), _channels(std), bgr, layout)

    def given(self) -> list[str]:
        """The keys given (not None)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


IMAGE_KEYS = tuple(declared_options(ImageOptions))
CALIBRATE_IMAGE = {"resize": "stretch", "scale": "1/255", "bgr": False}  # calibrate's preprocessing when not given, as typed


def refuse_unknown(cls, given: dict) -> None:
    """An unknown keyword refused by name (`cls`: the options dataclass that takes them)."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise QtoolError("unknown option {option}: it takes {known}", option=Opt(unknown[0]), known=", ".join(sorted(names)))


def _channels(values) -> str | None:
    if values is None or isinstance(values, str):
        return values
    return ",".join(repr(float(v)) for v in values)


def shard(value) -> tuple[int, int] | None:
    """'K/N' or (K, N)."""
    return value if value is None or isinstance(value, tuple) else _data.parse_shard(str(value))


METHODS = thresholds.METHODS + thresholds.SAMPLE_METHODS


@dataclass(frozen=True)
class CalibrateOptions:
    """What a calibration runs on and records (qtool.collection.pipeline.run). `data`: a folder,
    or (Python) an in-memory loader; `image`: the preprocessing of `images` (ImageOptions'
    options, with CALIBRATE_IMAGE's defaults: `command_options`)."""

    images: Path | None = declaration("images")
    data: object = declaration("data")
    limit: int | None = declaration("limit")
    on_bad_image: str = option("fail", "--on-bad-image", "An unreadable image stops the run, or is skipped with a warning.",
                               choices=("fail", "skip"))
    shard: tuple[int, int] | None = option(None, "--shard", "K/N: calibrate only every N-th input starting with the K-th; combine "
                                           "shards with qtool merge.")
    image: ImageOptions = ImageOptions.build(**CALIBRATE_IMAGE)
    batch_size: int | None = declaration("batch_size")
    bins: int = option(2048, "--bins", "Histogram bins per tensor (a power of two).", kind=int)
    method: str | None = option(None, "--method", "Threshold method kept by every export (as qtool export --method) [default: "
                                "entropy; each export picks its own].", recompute=f"Threshold method: {', '.join(METHODS)} [default: "
                                "the file's].")
    kl_variant: str = option("nvidia", "--kl-variant", "Whose entropy search to reproduce.", choices=thresholds.KL_VARIANTS,
                             recompute="Whose entropy search to reproduce [default: the file's].")

    def __post_init__(self):
        if self.loader is not None and self.images is not None:
            raise QtoolError("give exactly one source of inputs: {images}, {data} (a folder or an in-memory loader)",
                             images=Opt("images"), data=Opt("data"))
        exactly_one(self.images, self.data)
        if self.bins > calibration.MAX_BINS:
            raise QtoolError("{bins} is too many: the maximum is {most} (default {default})", bins=Opt("bins", self.bins),
                             most=calibration.MAX_BINS, default=defaults(CalibrateOptions)["bins"])
        _check_choices(self)
        _positive("limit", self.limit)
        _positive("batch_size", self.batch_size)
        method(self.method)

    @property
    def loader(self):
        """An in-memory loader given as `data` (None: a folder or no data)."""
        return None if self.data is None or isinstance(self.data, (str, os.PathLike)) else self.data

    @property
    def data_dir(self) -> Path | None:
        return None if self.data is None or self.loader is not None else Path(self.data)

    @classmethod
    def build(cls, **given) -> CalibrateOptions:
        """From keywords as `qtool calibrate` takes its flags (or numbers, in Python; None: not given)."""
        given = {k: v for k, v in given.items() if v is not None}
        image = {**CALIBRATE_IMAGE, **{k: given.pop(k) for k in IMAGE_KEYS if k in given}}
        refuse_unknown(cls, given)
        if "images" in given:
            given["images"] = Path(given["images"])
        if "shard" in given:
            given["shard"] = shard(given["shard"])
        return cls(image=ImageOptions.build(**image), **given)


def _positive(key: str, value) -> None:
    if value is not None and value < 1:
        raise QtoolError("{option} must be at least 1", option=Opt(key, value))


@dataclass(frozen=True)
class MixedPrecision:
    """export: layers kept FP32 by measuring the target's model on held-out inputs."""

    SECTION: ClassVar = "Mixed precision"

    keep_fp32: int | None = option(None, "--keep-fp32", "Also keep FP32 the layers of the N tensors evaluate --tensors ranks "
                                   "worst on --images/--data.", metavar="N", bounds=(1, None))
    max_drop: str | None = option(None, "--max-drop", "Keep FP32 the fewest layers that bring the int8 model within BUDGET "
                                  "(30dB, 1%) on --images/--data.", metavar="BUDGET")
    max_fp32: int = option(20, "--max-fp32", "With --max-drop: the most tensors whose layers may be kept FP32.", bounds=(1, None))
    images: Path | None = declaration("images")
    data: Path | None = declaration("data")
    limit: int | None = declaration("limit")

    def __post_init__(self):
        if self.keep_fp32 and self.max_drop:
            raise QtoolError("{keep_fp32} and {max_drop} both choose the layers kept in FP32: give one",
                             keep_fp32=Opt("keep_fp32", metavar="N"), max_drop=Opt("max_drop", metavar="BUDGET"))
        if self.keep_fp32 or self.max_drop:
            if (self.images is None) == (self.data is None):
                raise QtoolError("{option} measures on real inputs: give exactly one of {images} or {data}",
                                 option=Opt("keep_fp32" if self.keep_fp32 else "max_drop"), images=Opt("images", metavar="DIR"),
                                 data=Opt("data", metavar="DIR"))
        elif self.images or self.data or self.limit:
            raise QtoolError("{images}, {data} and {limit} are only used with {keep_fp32} or {max_drop}",
                             **{k: Opt(k) for k in ("images", "data", "limit", "keep_fp32", "max_drop")})

    @property
    def wanted(self) -> bool:
        return bool(self.keep_fp32 or self.max_drop)


MIXED_KEYS = tuple(declared_options(MixedPrecision))


@dataclass(frozen=True)
class EvaluateOptions:
    """qtool evaluate: `target`'s model with `export` options against FP32 on held-out inputs
    (`image`: each given part overrides the calibration file's preprocessing). `named_target`: the
    target as given (None: an exported FILE's own, else DEFAULT_TARGET, which `export` then holds)."""

    export: ExportOptions = ExportOptions()
    runtime: str | None = None
    tensors: bool = option(False, "--tensors/--no-tensors", "openvino/qdq: also rank each quantized tensor by the output SQNR "
                           "with it alone quantized (one run per tensor).")
    images: Path | None = declaration("images")
    data: Path | None = declaration("data")
    limit: int | None = declaration("limit")
    image: ImageOptions = ImageOptions()
    batch_size: int | None = declaration("batch_size")
    fail_below: float | None = option(None, "--fail-below", "Exit 1 when an output's SQNR (with --runtime, the worse of both) is "
                                      "below DB decibels, after printing the results.", metavar="DB", kind=float)
    named_target: str | None = None

    @property
    def target(self) -> str:
        return self.export.target

    @classmethod
    def build(cls, export: ExportOptions, **given) -> EvaluateOptions:
        """From keywords as `qtool evaluate` takes its flags: its own and the image ones (None: not
        given), with the `export` options (qtool.targets.options_for) built from the rest."""
        given = {k: v for k, v in given.items() if v is not None}
        image = ImageOptions.build(**{k: given.pop(k) for k in IMAGE_KEYS if k in given})
        own = {k: given.pop(k) for k in [f.name for f in fields(cls)] if k in given and k not in ("export", "image")}
        if given:
            raise QtoolError("{option} is not an export option", option=Opt(sorted(given)[0]))
        for key in ("images", "data"):
            if key in own:
                own[key] = Path(own[key])
        return cls(export, image=image, **own)

    def __post_init__(self):
        _positive("limit", self.limit)
        _positive("batch_size", self.batch_size)
        if self.fail_below is not None and not math.isfinite(self.fail_below):
            raise QtoolError("{fail_below} must be a finite number of decibels", fail_below=Opt("fail_below", str(self.fail_below)))
        given = self.image.given()
        if self.data is not None and given:
            raise QtoolError("{option} applies to {images}; .npy/.npz data is fed as it is", option=Opt(min(given)), images=Opt("images"))


def command_options(command: str) -> dict[str, Option]:
    """key -> Option of what `command` declares here, each with that command's default (the field's;
    calibrate's image options CALIBRATE_IMAGE's; recompute's None: the file's), in --help order. The
    export options every target reads and the targets' groups are the registry's (qtool.targets)."""
    def own(cls, **changed) -> dict[str, Option]:
        return {k: replace(o, **changed) for k, o in declared_options(cls).items()}

    if command == "calibrate":
        found = own(CalibrateOptions)
        image = own(ImageOptions)
        image.update({k: replace(image[k], default=CALIBRATE_IMAGE[k]) for k in CALIBRATE_IMAGE})
        at = list(found).index("shard") + 1
        return dict(list(found.items())[:at] + list(image.items()) + list(found.items())[at:])
    if command == "recompute":
        return {k: o for k, o in own(CalibrateOptions, default=None).items() if k in ("method", "kl_variant")}
    if command == "evaluate":
        return {**own(EvaluateOptions), **own(ImageOptions)}
    if command == "export":
        return own(MixedPrecision)
    return {}
