"""Targets: one record per runtime qtool writes for (the registry), and one declaration of every
export option, which qtool.api and the command line both read.

A target (`Target`) names its placement rules (a qtool.quantizers.rules.Rules table in its own module), the
float types it quantizes, the runtime that runs its file, whether its writer builds a model of any
subset of its quantizers (what evaluate --tensors, export --keep-fp32 and --max-drop need), the
export options it takes, its writer module and its default suffix. A writer module has
`suffix(**options)` and `export(loaded, cal, **options) -> ExportResult`: it turns a calibration
(and the model it was made for) into the bytes of one file, never writes files itself and never
modifies the model it is given; and `shown(loaded, cal, method=None, **options) -> Shown`, what
qtool report shows of that export. Optionally `evaluation_options(options, runtime)`: the options,
checked, with which qtool.checks.evaluation builds the file it runs (default: as given), and whether
`runtime` (None: the simulation only) can run it; `export_options(options) -> (options, summary)`:
what qtool export writes with (defaults resolved) and what its summary says of them; `exported(loaded,
cal, options, summary, path, model_path) -> (summary, warnings, line)`: what export's summary and text add
once the file is written (e.g. the command that builds an engine from it); `own_methods(options)`:
threshold methods of its own besides qtool.statistics.thresholds'.

Nothing here imports a writer until it is asked for (`Target.module`, `Target.rules`), so reading
the registry is cheap. The layout of one target's package is in the README, "Adding a target".
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types (not imported here: the registry stays light)


@dataclass
class ExportResult:
    data: bytes
    warnings: list[str] = field(default_factory=list)
    summary: dict = field(default_factory=dict)  # target-specific facts for the JSON summary


@dataclass
class Shown:
    """What qtool report shows of a target's export (a writer's `shown(loaded, cal, method=...)`):
    its placement and the thresholds and scales the file holds."""

    title: str  # e.g. "QDQ model (onnxruntime)"
    plan: object  # placement.Plan
    cal: object  # the calibration the export reads (SmoothQuant: the smoothed tensors' records)
    method: str | None  # the threshold method the export searches with (None: the file's)
    thresholds: dict  # tensor -> calibration.Threshold the export starts from
    smoothing: object = None  # smoothquant.Smoothing, when SmoothQuant changed the model
    scales: dict | None = None  # tensor -> the per-tensor scale as the file holds it, on the int8 symmetric grid (None: the quantizers' own)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Option:
    """One export option: its API keyword, its command-line flag, help and choices. `negated`: the
    flag is a --no-... switch that sets the keyword False. `evaluate`: qtool evaluate's shorter help
    (None: evaluate does not take it). Help text may hold {latest}: the newest TensorRT qtool knows."""

    keyword: str
    flag: str
    help: str
    choices: tuple[str, ...] | None = None
    evaluate: str | None = None
    negated: bool = False
    multiple: bool = False
    metavar: str | None = None
    param: str | None = None  # the command line's parameter name, when not the keyword


_CPU_OPTIONS = frozenset({"exclude", "include", "cpu", "weights_7bit", "smooth_quant", "ignored_patterns", "bias_correction", "policies", "method"})


@dataclass(frozen=True)
class Target:
    name: str
    writer: str  # the module with suffix() and export()
    rules_table: str  # "module:NAME" of its qtool.quantizers.rules.Rules
    float_types: tuple[int, ...]  # element types it quantizes (onnx.TensorProto)
    runtime: str  # the runtime that runs its file on this CPU: "openvino" or "onnxruntime"
    any_subset: bool  # its writer builds a model of any subset of its quantizers (prepare/quantized)
    options: frozenset[str]  # the export options it takes (keywords of OPTIONS)
    suffix: str  # default output suffix (the writer's suffix(**options) may pick another)
    description: str  # what its file is, in a few words (qtool evaluate --help)

    def module(self):
        """The writer module."""
        return importlib.import_module(self.writer)

    @property
    def rules(self):
        """Its placement rules (qtool.quantizers.rules.Rules)."""
        module, name = self.rules_table.split(":")
        return getattr(importlib.import_module(module), name)

    @property
    def default_method(self) -> str | None:
        """The threshold method its export uses when neither calibrate nor export chose one."""
        return self.rules.default_method

    def evaluation_options(self, options: dict, runtime: str | None = None) -> dict:
        """The export options with which qtool.checks.evaluation builds the file it runs (and `runtime` runs)."""
        check = getattr(self.module(), "evaluation_options", None)
        return check(options, runtime) if check is not None else dict(options)

    def export_options(self, options: dict) -> tuple[dict, dict]:
        """The options qtool export writes with, defaults resolved, and what its summary says of them."""
        resolve = getattr(self.module(), "export_options", None)
        return resolve(options) if resolve is not None else (dict(options), {})

    def exported(self, loaded, cal, options: dict, summary: dict, path: str, model_path: str) -> tuple[dict, list[str], str | None]:
        """What export's summary, warnings and text add once the file is at `path` (`summary`: the export's)."""
        after = getattr(self.module(), "exported", None)
        return after(loaded, cal, options, summary, path, model_path) if after is not None else ({}, [], None)

    def own_methods(self, options: dict) -> tuple[str, ...]:
        """Threshold methods its writer searches itself with these options."""
        own = getattr(self.module(), "own_methods", None)
        return tuple(own(options)) if own is not None else ()


_REGISTRY = (
    Target("tensorrt", "qtool.targets.tensorrt", "qtool.targets.tensorrt.rules:TENSORRT", (FLOAT,), "onnxruntime", False,
           frozenset({"trt_version", "fmt", "algorithm", "precision", "method", "high_precision", "weights", "exclude", "include",
                      "bias_correction", "smooth_quant"}),
           ".trt.onnx", "its Q/DQ model, with the FP16 part"),
    Target("openvino", "qtool.targets.openvino", "qtool.targets.cpu:CPU", (FLOAT, FLOAT16), "openvino", True, _CPU_OPTIONS,
           ".openvino.onnx", "FakeQuantize"),
    Target("qdq", "qtool.targets.qdq", "qtool.targets.cpu:CPU", (FLOAT,), "onnxruntime", True, _CPU_OPTIONS,
           ".qdq.onnx", "QuantizeLinear/DequantizeLinear"),
)
TARGETS = tuple(t.name for t in _REGISTRY)


def names() -> tuple[str, ...]:
    return TARGETS


def get(name: str) -> Target:
    """The target called `name` (ValueError for an unknown name: callers say what to do)."""
    for t in _REGISTRY:
        if t.name == name:
            return t
    raise ValueError(f"unknown target {name!r}")


def exporter(name: str):
    """The writer module of target `name`."""
    return get(name).module()


def runtimes() -> dict[str, tuple[str, ...]]:
    """Runtime -> the targets whose files it runs (names sorted, as every list of targets in a message)."""
    found: dict[str, tuple[str, ...]] = {}
    for t in _REGISTRY:
        found[t.runtime] = tuple(sorted(found.get(t.runtime, ()) + (t.name,)))
    return dict(sorted(found.items()))


def ranked() -> tuple[str, ...]:
    """The targets whose writers build a model of any subset of their quantizers."""
    return tuple(sorted(t.name for t in _REGISTRY if t.any_subset))


def taking(keyword: str) -> tuple[str, ...]:
    """The targets that take the export option `keyword`."""
    return tuple(sorted(t.name for t in _REGISTRY if keyword in t.options))


OPTIONS = {o.keyword: o for o in (
    Option("trt_version", "--trt-version",
           "tensorrt: the TensorRT that builds the engine, 7.x to 11.x: 8.6.1, 7.2.3, 8.6 (its GA release, 8.6.1), 10 or 10.x "
           "(the newest 10.x qtool knows) [default: the installed tensorrt package's, else {latest}].",
           evaluate="tensorrt: the TensorRT the Q/DQ model is for [default: the installed tensorrt package's, else {latest}]."),
    Option("fmt", "--format",
           "tensorrt: qdq (ONNX with QuantizeLinear/DequantizeLinear placed by TensorRT's rules; default for 10.x and 11.x, the only "
           "INT8 input of 11.x), cache (trtexec --calib; default for 8.x/9.x; onnxruntime with trt_int8_use_native_calibration_table=1), "
           "dynamic-range (sampleINT8API name:amax lines), ort-trt (onnxruntime TensorRT EP table: trt_int8_calibration_table_name=FILE "
           "in trt_engine_cache_path, native table off).",
           choices=("qdq", "cache", "dynamic-range", "ort-trt"), param="fmt",
           evaluate="tensorrt: qdq (default), the only format with a model to run (the others hold ranges: an error)."),
    Option("algorithm", "--algorithm",
           "tensorrt: entropy2 (default) (the signed-grid entropy threshold, as TensorRT's EntropyCalibration2) or minmax (max |x|); "
           "the cache header names it.", choices=("entropy2", "minmax")),
    Option("precision", "--precision",
           "tensorrt qdq: the number format of the quantized layers: int8 (default) or fp8 (FLOAT8E4M3FN Q/DQ, TensorRT 10 and "
           "later, ModelOpt's FP8 placement and max thresholds).", choices=("int8", "fp8"),
           evaluate="tensorrt: int8 (default) or fp8, as qtool export --precision."),
    Option("method", "--method",
           "Recompute every activation threshold for this export with this method (entropy, max, mse, percentile:P, mean-minmax, "
           "auto; tensorrt --precision fp8 also e4m3-mse) [default: the method calibrate was given, else the target's: openvino/qdq "
           "auto (lowest error per tensor), tensorrt mse for the Q/DQ model, NVIDIA's entropy for the range files, max for fp8].",
           evaluate="Thresholds of this method, as qtool export --method [default: the target's]."),
    Option("high_precision", "--high-precision",
           "tensorrt qdq: the type of the unquantized layers in the ONNX (strongly typed builds run them so); fp16 converts them with "
           "graph inputs/outputs kept FP32 [default: fp16 for 10.x/11.x, fp32 for 8.x/9.x].", choices=("fp16", "fp32"),
           evaluate="tensorrt: the type of the unquantized layers, as qtool export [default: fp16 for 10.x/11.x]."),
    Option("weights", "--weights",
           "tensorrt qdq: FP32 weight -> QuantizeLinear -> DequantizeLinear (fp32, every version; the int8 default), or the "
           "quantized weight -> DequantizeLinear: int8 (10.x/11.x; 4x smaller file) or fp8 (the fp8 default).",
           choices=("fp32", "int8", "fp8")),
    Option("include", "--include",
           "tensorrt qdq/openvino/qdq: quantize this node although a default exclusion (ModelOpt's small Conv/GEMV/attention rules) "
           "or an ignored pattern keeps it FP32 (repeatable).", multiple=True,
           evaluate="Quantize this node anyway, as qtool export --include (repeatable)."),
    Option("exclude", "--exclude", "keep this node or tensor in FP32 (repeatable; tensorrt: --format qdq).", multiple=True,
           evaluate="Keep this node or tensor in FP32, as qtool export --exclude (repeatable)."),
    Option("cpu", "--cpu",
           "openvino/qdq: the CPU the file will run on. any (default): every x86 CPU, also those without VNNI (AVX2 only: "
           "Haswell to Comet Lake, Zen 1-3), whose int8 kernels add pairs of u8 x s8 products into a saturating int16: the "
           "overflow guard keeps those pairs from passing it (openvino: weight steps widened on the channels that could, "
           "qdq: uint8 weights). vnni: CPUs with VNNI or AMX (Ice Lake and later Xeons, Alder Lake and later cores, Zen 4 and "
           "later), which accumulate in int32: no guard, every layer full 8-bit, as fast as the CPU runs int8; on a CPU "
           "without VNNI that file saturates.", choices=("any", "vnni"),
           evaluate="openvino/qdq: the CPU the file is for, as qtool export --cpu [default: any]."),
    Option("weights_7bit", "--weights-7bit",
           "openvino/qdq: the guard against int8 pair sums saturating on CPUs without VNNI (--cpu any). auto (default): the "
           "layers whose calibrated inputs and weights can saturate get weight steps widened on the output channels whose pairs "
           "could pass int16 (openvino) or uint8 weights with zero point 128, the same values computed exactly (qdq); first/all: "
           "7-bit weights on the first/every int8 layer (NNCF's choices); none: no guard.",
           choices=("auto", "first", "all", "none"), evaluate="The overflow guard, as qtool export --weights-7bit [default: auto]."),
    Option("smooth_quant", "--smooth-quant",
           "SmoothQuant (outlier activation channels moved into the linear layers' weights, qtool.quantizers.smoothquant; tensorrt: its INT8 "
           "Q/DQ model): auto (default) on transformers with the alpha of least estimated error per activation, on, off, or one alpha "
           "in [0, 1] for every layer.", metavar="auto|on|off|ALPHA",
           evaluate="SmoothQuant, as qtool export --smooth-quant [default: auto]."),
    Option("ignored_patterns", "--no-ignored-patterns",
           "openvino/qdq: also quantize NNCF's ignored patterns (squeeze-excitation gating path, attention output MatMul, RoPE), "
           "which stay FP32 by default.", negated=True, param="no_ignored_patterns",
           evaluate="openvino/qdq: also quantize NNCF's ignored patterns, as qtool export."),
    Option("bias_correction", "--no-bias-correction",
           "openvino/qdq/tensorrt qdq: keep the biases as they are instead of shifting each int8 Conv/MatMul/Gemm bias by the mean "
           "output error its weight quantization causes (from the per-channel input means in the calibration file; NNCF's fast bias "
           "correction).", negated=True, param="no_bias_correction", evaluate="Keep the biases as they are, as qtool export."),
    # set on the command line by the policy flags (qtool.cli.policy_options), in the API as one qtool.quantizers.policy.Policies
    Option("policies", "--policy", "openvino/qdq: quantization policies (qtool.quantizers.policy).", param="policy"),
)}
POLICY_FLAGS = {"weight_bits": "--weight-bits", "activation_bits": "--activation-bits", "scale_kind": "--scale",
                "activations": "--activations", "rounding": "--rounding", "policy": "--policy"}
