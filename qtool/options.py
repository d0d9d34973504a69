"""Every command's options as data: one frozen dataclass per command (and per group of export
options), each field declared once with its command-line flag and help (`option`), checked where
the object is built (`__post_init__`: choices, which target reads which option, one source of
inputs). The command line and qtool.api build these objects from their keywords (`build`); the
library below takes them (a target's writer: ExportOptions) instead of keywords.

Export options come in groups, one dataclass each, which `qtool export --help` shows as sections:
General (every target), TensorRT, OpenVINO/qdq, Policy (openvino/qdq: the flags that make one
qtool.quantizers.policy.Policies); the command line adds export's Mixed precision (layers kept FP32
by measurement, MixedPrecision) and evaluate's held-out inputs.
Adding an export option: one field in its group here, and the code that reads it.
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
from .quantizers import policy as _policy
from .statistics import thresholds

TARGETS = ("tensorrt", "openvino", "qdq")  # the names qtool.targets registers, in its order
CPU_TARGETS = ("openvino", "qdq")


@dataclass(frozen=True)
class Option:
    """One option as the command line shows it: its key (the field and API keyword), flag, help,
    --help section and the targets that read it. `negated`: a --no-... switch setting the key False;
    `evaluate`: qtool evaluate's shorter help (None: evaluate does not take it); `bounds`: an
    integer's (least, most). Help may hold {latest}: the newest TensorRT qtool knows."""

    key: str
    flag: str
    help: str
    section: str
    readers: tuple[str, ...]
    choices: tuple[str, ...] | None = None
    evaluate: str | None = None
    negated: bool = False
    multiple: bool = False
    metavar: str | None = None
    bounds: tuple[int, int] | None = None
    path: bool = False


def option(default, flag: str, help: str, **declared):
    """A dataclass field declaring its option (the rest of Option is filled in by `declared_options`)."""
    return field(default=default, metadata={"option": dict(flag=flag, help=help, **declared)})


def declared_options(group) -> dict[str, Option]:
    """key -> Option of a group's fields (its SECTION and READERS)."""
    return {f.name: Option(f.name, section=group.SECTION, readers=group.READERS, **f.metadata["option"])
            for f in fields(group) if "option" in f.metadata}


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
class TensorRTOptions:
    SECTION: ClassVar = "TensorRT"
    READERS: ClassVar = ("tensorrt",)

    trt_version: str | None = option(
        None, "--trt-version",
        "tensorrt: the TensorRT that builds the engine, 7.x to 11.x: 8.6.1, 7.2.3, 8.6 (its GA release, 8.6.1), 10 or 10.x "
        "(the newest 10.x qtool knows) [default: the installed tensorrt package's, else {latest}].",
        evaluate="tensorrt: the TensorRT the Q/DQ model is for [default: the installed tensorrt package's, else {latest}].")
    fmt: str | None = option(
        None, "--format",
        "tensorrt: qdq (ONNX with QuantizeLinear/DequantizeLinear placed by TensorRT's rules; default for 10.x and 11.x, the only "
        "INT8 input of 11.x), cache (trtexec --calib; default for 8.x/9.x; onnxruntime with trt_int8_use_native_calibration_table=1), "
        "dynamic-range (sampleINT8API name:amax lines), ort-trt (onnxruntime TensorRT EP table: trt_int8_calibration_table_name=FILE "
        "in trt_engine_cache_path, native table off).",
        choices=("qdq", "cache", "dynamic-range", "ort-trt"),
        evaluate="tensorrt: qdq (default), the only format with a model to run (the others hold ranges: an error).")
    algorithm: str = option(
        "entropy2", "--algorithm",
        "tensorrt: entropy2 (default) (the signed-grid entropy threshold, as TensorRT's EntropyCalibration2) or minmax (max |x|); "
        "the cache header names it.", choices=("entropy2", "minmax"))
    precision: str = option(
        "int8", "--precision",
        "tensorrt qdq: the number format of the quantized layers: int8 (default) or fp8 (FLOAT8E4M3FN Q/DQ, TensorRT 10 and "
        "later, ModelOpt's FP8 placement and max thresholds).", choices=("int8", "fp8"),
        evaluate="tensorrt: int8 (default) or fp8, as qtool export --precision.")
    high_precision: str | None = option(
        None, "--high-precision",
        "tensorrt qdq: the type of the unquantized layers in the ONNX (strongly typed builds run them so); fp16 converts them with "
        "graph inputs/outputs kept FP32 [default: fp16 for 10.x/11.x, fp32 for 8.x/9.x].", choices=("fp16", "fp32"),
        evaluate="tensorrt: the type of the unquantized layers, as qtool export [default: fp16 for 10.x/11.x].")
    weights: str | None = option(
        None, "--weights",
        "tensorrt qdq: FP32 weight -> QuantizeLinear -> DequantizeLinear (fp32, every version; the int8 default), or the "
        "quantized weight -> DequantizeLinear: int8 (10.x/11.x; 4x smaller file) or fp8 (the fp8 default).",
        choices=("fp32", "int8", "fp8"))

    def __post_init__(self):
        _check_choices(self)

    def own_methods(self) -> tuple[str, ...]:
        """Threshold methods the writer searches itself: FP8's e4m3-mse (qtool.targets.tensorrt.fp8)."""
        return ("e4m3-mse",) if self.precision == "fp8" else ()


@dataclass(frozen=True)
class CpuOptions:
    SECTION: ClassVar = "OpenVINO/qdq"
    READERS: ClassVar = CPU_TARGETS

    cpu: str = option(
        "any", "--cpu",
        "openvino/qdq: the CPU the file will run on. any (default): every x86 CPU, also those without VNNI (AVX2 only: "
        "Haswell to Comet Lake, Zen 1-3), whose int8 kernels add pairs of u8 x s8 products into a saturating int16: the "
        "overflow guard keeps those pairs from passing it (openvino: weight steps widened on the channels that could, or "
        "a layer's input held to 7-bit codes where that costs less, or an image's paired input channels negated; qdq: "
        "uint8 weights). vnni: CPUs with VNNI or AMX (Ice "
        "Lake and later Xeons, Alder Lake and later cores, Zen 4 and later), which accumulate in int32: no guard, every "
        "layer full 8-bit, as fast as the CPU runs int8; on a CPU without VNNI that file saturates.", choices=("any", "vnni"),
        evaluate="openvino/qdq: the CPU the file is for, as qtool export --cpu [default: any].")
    weights_7bit: str | None = option(
        None, "--weights-7bit",
        "openvino/qdq: the guard against int8 pair sums saturating on CPUs without VNNI (--cpu any). auto (default): the "
        "layers whose calibrated inputs and weights can saturate get weight steps widened on the output channels whose pairs "
        "could pass int16, or their input held to 7-bit codes where that costs less, or an image stem's paired input "
        "channels negated where calibration's pixels say that leaves less (openvino), or uint8 weights with zero "
        "point 128, the same values computed exactly (qdq); first/all: 7-bit weights on the first/every int8 layer (NNCF's "
        "choices); none: no guard.",
        choices=("auto", "first", "all", "none"), evaluate="The overflow guard, as qtool export --weights-7bit [default: auto].")
    ignored_patterns: bool = option(
        True, "--no-ignored-patterns",
        "openvino/qdq: also quantize NNCF's ignored patterns (squeeze-excitation gating path, attention output MatMul, RoPE), "
        "which stay FP32 by default.", negated=True,
        evaluate="openvino/qdq: also quantize NNCF's ignored patterns, as qtool export.")
    # the policy of every quantizer (qtool.quantizers.policy; None: the defaults): in Python one
    # Policies, on the command line made of the PolicyFlags
    policies: _policy.Policies | None = None

    def __post_init__(self):
        _check_choices(self)


@dataclass(frozen=True)
class PolicyFlags:
    """The options that make the Policies of the CPU targets (qtool.quantizers.policy.from_options)."""

    SECTION: ClassVar = "Policy"
    READERS: ClassVar = CPU_TARGETS

    weight_bits: int | None = option(None, "--weight-bits", "openvino/qdq: weight bits (default 8; 4: INT4 weights, opset 21 in QDQ).",
                                     bounds=(2, 8))
    activation_bits: int | None = option(
        None, "--activation-bits", "openvino/qdq: activation bits (default 8; QDQ takes 8 or 16, 16 needs opset 21; FakeQuantize any).",
        bounds=(2, 16))
    scale_kind: str | None = option(
        None, "--scale-kind", "openvino/qdq: float scales (default) or powers of two (rounded up: nothing clips more), for accelerators "
        "that requantize by shifting.", choices=("float", "pow2"))
    activations: str | None = option(
        None, "--activations", "openvino/qdq: activation grids: symmetric (zero point 0), asymmetric (u8 with a zero point, [min, "
        "max]), or auto (per tensor the finer of the two).", choices=("symmetric", "asymmetric", "auto"))
    rounding: str | None = option(
        None, "--rounding", "openvino/qdq: weight rounding (default half-even, as the runtimes round activations).",
        choices=("half-even", "half-up", "half-down", "half-away", "toward-zero", "up", "down"))
    policy: Path | None = option(
        None, "--policy", "openvino/qdq: JSON or TOML rules setting the policy of matching quantizers (name, glob, regex or op_type; "
        "later rules win); qtool inspect CALIB --policy FILE shows what each quantizer gets.", path=True)

    def __post_init__(self):
        _check_choices(self)
        if self.policy is not None:
            object.__setattr__(self, "policy", Path(self.policy))
        for key, o in declared_options(PolicyFlags).items():
            value = getattr(self, key)
            if o.bounds and value is not None and not o.bounds[0] <= value <= o.bounds[1]:
                raise QtoolError("{option} is not in the range {low}<=x<={high}", option=Opt(key, value), low=o.bounds[0],
                                 high=o.bounds[1])

    def given(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def policies(self) -> _policy.Policies:
        """The Policies these flags choose (the rules file read now)."""
        rules = _policy.load_rules(Path(self.policy)) if self.policy is not None else None
        return _policy.from_options(self.weight_bits, self.activation_bits, self.scale_kind, self.rounding, rules, self.activations)


@dataclass(frozen=True)
class ExportOptions:
    """What a target's writer reads: the options every target takes, and its own group's.
    `target`: the target these are for (an option of another target's group given: an error)."""

    SECTION: ClassVar = "General"
    READERS: ClassVar = TARGETS

    target: str = "qdq"
    method: str | None = option(
        None, "--method",
        "Recompute every activation threshold for this export with this method (entropy, max, mse, percentile:P, mean-minmax, "
        "auto; tensorrt --precision fp8 also e4m3-mse) [default: the method calibrate was given, else the target's: openvino/qdq "
        "auto (lowest error per tensor), tensorrt mse for the Q/DQ model, NVIDIA's entropy for the range files, max for fp8].",
        evaluate="Thresholds of this method, as qtool export --method [default: the target's].")
    include: tuple[str, ...] = option(
        (), "--include",
        "tensorrt qdq/openvino/qdq: quantize this node although a default exclusion (ModelOpt's small Conv/GEMV/attention rules) "
        "or an ignored pattern keeps it FP32 (repeatable).", multiple=True,
        evaluate="Quantize this node anyway, as qtool export --include (repeatable).")
    exclude: tuple[str, ...] = option(
        (), "--exclude", "keep this node or tensor in FP32 (repeatable; tensorrt: --format qdq).", multiple=True,
        evaluate="Keep this node or tensor in FP32, as qtool export --exclude (repeatable).")
    smooth_quant: str | bool | float = option(
        "auto", "--smooth-quant",
        "SmoothQuant (outlier activation channels moved into the linear layers' weights, qtool.quantizers.smoothquant; tensorrt: its INT8 "
        "Q/DQ model): auto (default) on transformers with the alpha of least estimated error per activation, on, off, or one alpha "
        "in [0, 1] for every layer.", metavar="auto|on|off|ALPHA",
        evaluate="SmoothQuant, as qtool export --smooth-quant [default: auto].")
    bias_correction: bool = option(
        True, "--no-bias-correction",
        "openvino/qdq/tensorrt qdq: keep the biases as they are instead of shifting each int8 Conv/MatMul/Gemm bias by the mean "
        "output error its weight quantization causes (from the per-channel input means in the calibration file; NNCF's fast bias "
        "correction).", negated=True, evaluate="Keep the biases as they are, as qtool export.")
    tensorrt: TensorRTOptions = TensorRTOptions()
    cpu_target: CpuOptions = CpuOptions()

    def __post_init__(self):
        _choose("target", self.target, TARGETS)
        object.__setattr__(self, "include", _names(self.include))
        object.__setattr__(self, "exclude", _names(self.exclude))
        for group in (self.tensorrt, self.cpu_target):
            if self.target not in group.READERS:
                changed = [f.name for f in fields(group) if getattr(group, f.name) != f.default and f.default is not MISSING]
                if changed:
                    raise misplaced(changed[0], group.READERS, self.target)

    @classmethod
    def build(cls, target: str = "qdq", **given) -> ExportOptions:
        """From keywords as the command line and the API take them: every export option, the policy
        flags or `policies` (a Policies); None or an empty list for an option not given."""
        _choose("target", target, TARGETS)
        given = {k: v for k, v in given.items() if v is not None}
        flags = PolicyFlags(**_take(given, PolicyFlags, target))
        groups = {}
        for name, group in (("tensorrt", TensorRTOptions), ("cpu_target", CpuOptions)):
            groups[name] = group(**_take(given, group, target))
        if flags.given():
            if groups["cpu_target"].policies is not None:
                raise UsageError("give {policies} or the policy options, not both", policies=Opt("policies"))
            groups["cpu_target"] = replace(groups["cpu_target"], policies=flags.policies())
        own = _take(given, cls, target)
        unknown = sorted(set(given) - set(own))
        if unknown:
            raise QtoolError("{option} is not an export option", option=Opt(unknown[0]))
        options = cls(target=target, **own, **groups)
        method(options.method, options.tensorrt.own_methods())
        return options


def misplaced(key: str, readers: tuple[str, ...], target: str) -> UsageError:
    """An option given for a target that does not read it."""
    return UsageError("{option} applies to {first}{others}, not {target}", option=Opt(key), first=Opt("target", readers[0]),
                      others="".join(f" or {t}" for t in readers[1:]), target=target)


def _take(given: dict, group, target: str) -> dict:
    """The keywords of `given` that are fields of `group`, taken out of it; for a target that does
    not read the group, none (one given as anything but "auto", empty or a --no- switch left off: an error)."""
    defaults = {f.name: f.default for f in fields(group) if f.name not in ("target", "tensorrt", "cpu_target")}
    taken = {k: given.pop(k) for k in list(given) if k in defaults}
    if target not in group.READERS:
        for key, value in taken.items():
            if value not in ("auto", (), []) and not (value is True and defaults[key] is True):
                raise misplaced(key, group.READERS, target)
        return {}
    return taken


EXPORT_GROUPS = (ExportOptions, TensorRTOptions, CpuOptions, PolicyFlags)


def export_options() -> dict[str, Option]:
    """key -> Option of every export option, group by group."""
    found: dict[str, Option] = {}
    for group in EXPORT_GROUPS:
        found.update(declared_options(group))
    return found


def targets_reading(key: str) -> tuple[str, ...]:
    """The targets that read the export option `key` (sorted)."""
    if key == "policies":
        return CPU_TARGETS
    return tuple(sorted(export_options()[key].readers))


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
    READERS: ClassVar = CPU_TARGETS

    keep_fp32: int | None = None
    max_drop: str | None = None
    max_fp32: int = 20
    images: Path | None = None
    data: Path | None = None
    limit: int | None = None

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


def export_request(target: str = "qdq", **given) -> tuple[ExportOptions, MixedPrecision]:
    """qtool export's options from its keywords: the export's, and the layers kept FP32 by measurement."""
    _choose("target", target, TARGETS)
    mixed = {k: given.pop(k) for k in MIXED_KEYS if given.get(k) is not None}
    for key in ("keep_fp32", "max_drop"):
        if mixed.get(key) and target not in MixedPrecision.READERS:
            raise misplaced(key, MixedPrecision.READERS, target)
    export = ExportOptions.build(target, **given)
    paths = {k: Path(v) for k, v in mixed.items() if k in ("images", "data")}
    return export, MixedPrecision(**{**mixed, **paths})


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
    def build(cls, **given) -> EvaluateOptions:
        """From keywords as `qtool evaluate` takes its flags: its own, the image ones and the export
        options (None: not given)."""
        given = {k: v for k, v in given.items() if v is not None}
        image = ImageOptions.build(**{k: given.pop(k) for k in IMAGE_KEYS if k in given})
        own = {k: given.pop(k) for k in ("images", "data", "limit", "batch_size", "runtime", "tensors", "fail_below") if k in given}
        for key in ("images", "data"):
            if key in own:
                own[key] = Path(own[key])
        return cls(ExportOptions.build(**given), image=image, **own)

    def __post_init__(self):
        _positive("limit", self.limit)
        _positive("batch_size", self.batch_size)
        if self.fail_below is not None and not math.isfinite(self.fail_below):
            raise QtoolError("{fail_below} must be a finite number of decibels", fail_below=Opt("fail_below", str(self.fail_below)))
        given = self.image.given()
        if self.data is not None and given:
            raise QtoolError("{option} applies to {images}; .npy/.npz data is fed as it is", option=Opt(min(given)), images=Opt("images"))
