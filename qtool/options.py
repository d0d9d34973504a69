"""Every command's options as data: one frozen dataclass per command (and per group of export
options), each field declared once with its command-line flag and help (`option`), checked where
the object is built (`__post_init__`: choices, which target reads which option, one source of
inputs). The command line and qtool.api build these objects from their keywords (`build`); the
library below takes them (a target's writer: ExportOptions) instead of keywords.

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
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from . import calibration
from .errors import Opt, QtoolError, UsageError
from .feeds import data as _data
from .statistics import thresholds


@dataclass(frozen=True)
class Option:
    """One option as the command line shows it: its key (the field and API keyword), flag, help,
    --help section and the targets that read it. `negated`: a --no-... switch setting the key False;
    `evaluate`, `report`: those commands' shorter help (None: the command does not take it);
    `bounds`: an integer's (least, most). `readers`: filled in by the registry (qtool.targets)."""

    key: str
    flag: str
    help: str
    section: str | None = None
    readers: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    evaluate: str | None = None
    report: str | None = None
    negated: bool = False
    multiple: bool = False
    metavar: str | None = None
    bounds: tuple[int, int | None] | None = None
    path: bool = False
    default: object = None


def option(default, flag: str, help: str, **declared):
    """A dataclass field declaring its option (the rest of Option is filled in by `declared_options`)."""
    return field(default=default, metadata={"option": dict(flag=flag, help=help, **declared)})


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


@dataclass(frozen=True)
class ExportOptions:
    """What a target's writer reads: the options every target takes (declared here), and `own`: the
    target's own option group, declared in its package (qtool.targets names it; None: its defaults).
    Built from keywords, checked for the target, by qtool.targets.options_for."""

    SECTION: ClassVar = "General"

    target: str = "qdq"
    method: str | None = option(
        None, "--method", "Thresholds by this method: entropy, max, mse, percentile:P, mean-minmax, auto [default: "
        "calibrate's, else the target's].",
        evaluate="Thresholds of this method, as qtool export --method [default: the target's].")
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


@dataclass(frozen=True)
class ImageOptions:
    """How images are fed (qtool.feeds.data.resolve_preprocess): None for what the model or, when
    evaluating, the calibration file decides."""

    size: tuple[int, int] | None = None
    resize: str | None = None
    scale: float | None = None
    mean: str | None = None
    std: str | None = None
    bgr: bool | None = None
    layout: str | None = None

    def __post_init__(self):
        _choose("resize", self.resize, _data.RESIZE_MODES)
        _choose("layout", self.layout, ("nchw", "nhwc"))

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


IMAGE_KEYS = ("size", "resize", "scale", "mean", "std", "bgr", "layout")


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


@dataclass(frozen=True)
class CalibrateOptions:
    """What a calibration runs on and records (qtool.collection.pipeline.run). `data`: a folder,
    or (Python) an in-memory loader; `image`: the preprocessing of `images`."""

    images: Path | None = None
    data: object = None
    limit: int | None = None
    shard: tuple[int, int] | None = None
    on_bad_image: str = "fail"
    image: ImageOptions = ImageOptions(resize="stretch", scale=1 / 255, bgr=False)
    batch_size: int | None = None
    bins: int = 2048
    method: str | None = None
    kl_variant: str = "nvidia"

    def __post_init__(self):
        if self.loader is not None and self.images is not None:
            raise QtoolError("give exactly one source of inputs: {images}, {data} (a folder or an in-memory loader)",
                             images=Opt("images"), data=Opt("data"))
        exactly_one(self.images, self.data)
        if self.bins > calibration.MAX_BINS:
            raise QtoolError("{bins} is too many: the maximum is {most} (default 2048)", bins=Opt("bins", self.bins),
                             most=calibration.MAX_BINS)
        _choose("on_bad_image", self.on_bad_image, ("fail", "skip"))
        _choose("kl_variant", self.kl_variant, thresholds.KL_VARIANTS)
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
        image = {"resize": "stretch", "scale": "1/255", "bgr": False, **{k: given.pop(k) for k in IMAGE_KEYS if k in given}}
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
    images: Path | None = option(None, "--images", "Held-out images to rank and measure on.", path=True)
    data: Path | None = option(None, "--data", "Held-out .npy/.npz files (a folder, or one file of samples).", path=True)
    limit: int | None = option(None, "--limit", "Use only the first N inputs.", bounds=(1, None))

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


MIXED_KEYS = ("keep_fp32", "max_drop", "max_fp32", "images", "data", "limit")

@dataclass(frozen=True)
class EvaluateOptions:
    """qtool evaluate: `target`'s model with `export` options against FP32 on held-out inputs
    (`image`: each given part overrides the calibration file's preprocessing)."""

    export: ExportOptions = ExportOptions()
    runtime: str | None = None
    tensors: bool = False
    images: Path | None = None
    data: Path | None = None
    limit: int | None = None
    image: ImageOptions = ImageOptions()
    batch_size: int | None = None
    fail_below: float | None = None

    @property
    def target(self) -> str:
        return self.export.target

    @classmethod
    def build(cls, export: ExportOptions, **given) -> EvaluateOptions:
        """From keywords as `qtool evaluate` takes its flags: its own and the image ones (None: not
        given), with the `export` options (qtool.targets.options_for) built from the rest."""
        given = {k: v for k, v in given.items() if v is not None}
        image = ImageOptions.build(**{k: given.pop(k) for k in IMAGE_KEYS if k in given})
        own = {k: given.pop(k) for k in ("images", "data", "limit", "batch_size", "runtime", "tensors", "fail_below") if k in given}
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
