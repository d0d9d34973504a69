"""Quantizer placement rules per target, as data (the way NNCF keeps its hardware setups in
openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py). `qtool.placement` applies them.

CPU (OpenVINO FakeQuantize and onnxruntime QDQ): NNCF's CPU rules, and on a graph with attention
and LayerNorm NNCF's transformer preset, see the qtool.placement docstring. On every target a
range no 8-bit grid represents (infinite, |x| >= 1e30, an additive mask) stays float. TENSORRT: the TensorRT developer guide's Q/DQ placement recommendations and NVIDIA
ModelOpt's ONNX PTQ defaults (NVIDIA/Model-Optimizer modelopt/onnx/quantization/int8.py,
graph_utils.py, partitioning.py):

* every input of Conv, ConvTranspose, Gemm and MatMul, weights per output channel where the parser
  allows it (Conv 0, ConvTranspose 1, Gemm by transB, MatMul [K, N] 1), nothing on their outputs;
* the skip input of a residual Add only (ModelOpt's build_non_residual_input_map: the input on the
  longer path back to the lowest common ancestor comes from a Conv that TensorRT fuses the Add into);
* AveragePool/GlobalAveragePool only next to a quantized neighbour; MaxPool and the
  shape ops pass the quantizer through; a Concat's quantized inputs and output share one scale;
* signed INT8 everywhere (TensorRT: "only supports symmetric quantization"), activation scale =
  amax / 127 with amax searched on the signed grid: mse by default, or the cache's entropy amax
  bit for bit with --method entropy, except where a threshold is degenerate (clips more than
  calibration.MAX_CLIPPED of the values, e.g. the entropy search on image pixels); there max |x| is
  used, as on every target;
* ModelOpt's default exclusions: small Convs, GEMV-shaped and small MatMul/Gemm, the attention
  core above sequence length 512 (qtool.patterns.tensorrt_exclusions); `--include` overrides them;
* on a transformer this is ModelOpt's placement: both inputs of the attention BMMs (Q.K^T and
  softmax.V) and the linear layers' inputs; LayerNorm, Softmax, GELU, the additive mask and the
  residual stream (an Add with no Conv backbone is not residual) get no Q/DQ
  (tests/test_transformers.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    name: str
    linear: frozenset[str]  # every input quantized: data per tensor, constant weights per channel
    elementwise: frozenset[str]  # both data inputs quantized (unless fused into an activation)
    residual_add: bool  # Add quantizes its skip input only, when it is a residual Add
    pooling: frozenset[str]  # the data input quantized
    pooling_needs_neighbour: bool  # ... only when the pool's output or input is quantized anyway
    pass_through: frozenset[str]  # the quantizer moves up through these (and Concat) when every reader wants it
    concat_shares_quantized_inputs: bool  # a Concat's output and its inputs quantized elsewhere share one range
    nncf_patterns: bool  # activations/normalisations OpenVINO fuses, LayerNorm's mean and centring; NNCF's transformer preset on transformers
    ignored_patterns: bool  # NNCF's ignored patterns (SE gating, attention output, RoPE) stay FP32
    tensorrt_exclusions: bool  # ModelOpt's default exclusions stay FP32
    weight_axes: str  # "nncf" or "tensorrt": which constant inputs are quantized per channel
    signed_only: bool  # activations on the signed grid even when never negative
    clip_fallback: bool  # a threshold clipping > MAX_CLIPPED of the values falls back to max |x|
    depthwise_per_channel: bool  # depthwise Conv inputs per channel (NNCF's CPU q8_a_ch)
    default_method: str | None = None  # threshold method when neither calibrate nor export chose one (None: the file's)


_SHAPE_OPS = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Identity"})

CPU = Rules(
    name="cpu",
    linear=frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"}),
    elementwise=frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"}),
    residual_add=False,
    pooling=frozenset({"AveragePool", "GlobalAveragePool", "ReduceMean", "Resize"}),
    pooling_needs_neighbour=False,
    pass_through=_SHAPE_OPS | {"MaxPool"},
    concat_shares_quantized_inputs=False,
    nncf_patterns=True,
    ignored_patterns=True,
    tensorrt_exclusions=False,
    weight_axes="nncf",
    signed_only=False,
    clip_fallback=True,
    depthwise_per_channel=True,
    # per tensor the lowest histogram quantization error of entropy, percentile and mse: on the
    # real PP-OCR/MTCNN/YOLO models it matches or beats NNCF's defaults (bench/fidelity.py)
    default_method="auto",
)

TENSORRT = Rules(
    name="tensorrt",
    linear=frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"}),
    elementwise=frozenset(),
    residual_add=True,
    pooling=frozenset({"AveragePool", "GlobalAveragePool"}),
    pooling_needs_neighbour=True,
    pass_through=_SHAPE_OPS | {"MaxPool"},
    concat_shares_quantized_inputs=True,
    nncf_patterns=False,
    ignored_patterns=False,
    tensorrt_exclusions=True,
    weight_axes="tensorrt",
    signed_only=True,
    clip_fallback=True,
    depthwise_per_channel=False,
    # the Q/DQ model's default (the cache keeps NVIDIA's entropy): measured in onnxruntime on the
    # eight real models of bench/tensorrt_vs_modelopt.py, mse beats ModelOpt's best on six (entropy
    # fell 7.7 dB short on MTCNN O-Net and 0.045 mask IoU on PP-OCRv6 det); README, TensorRT section
    default_method="mse",
)
