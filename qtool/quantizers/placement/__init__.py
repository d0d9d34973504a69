"""Where quantizers go, as data the exporters turn into nodes: the machinery (requests, moves
through pass-through ops, shared-range groups, exclusions, ranges, weights) shared by every
target, driven by a target's `qtool.quantizers.rules.Rules`. This docstring describes the CPU rules
(OpenVINO and onnxruntime QDQ, qtool.targets.cpu); each other target's module describes its own.

CPU rules (openvinotoolkit/nncf src/nncf/common/hardware/setups/cpu.py, quantizer propagation and
the OpenVINO fused/ignored patterns in src/nncf/openvino/hardware/fused_patterns.py and
src/nncf/openvino/quantization/ignored_patterns.py):

* Conv, ConvTranspose, MatMul, Gemm: the data input(s) per tensor and the constant weight per
  output channel. Such a layer computes in int8 only if every input is quantized, so when one
  cannot be (not calibrated, excluded, shape-derived) the layer keeps all its inputs in FP32.
* Element-wise Add/Sub/Mul/Div/Max/Min: both inputs, when both carry data; not an Add both of whose
  quantizers would serve it alone (no int8 layer reads either input's codes: an FSMN memory block
  p + depthwise(cache ++ p)), which reads float (placement.moves.lone_sums), unless convolutions write both
  inputs, directly or through post-ops OpenVINO fuses into them (batch norm, ReLU and other activations, a
  constant scale or shift: an FPN's relu(bn(up(x))) + conv1x1(skip)), whose FakeQuantizes fuse into their
  layers; nor the residual Adds x + f(x) whose branch f(x) carries at most a quarter of the skip's power (a stream of small steps, as in a
  transformer or a GELU Conv stack: quantized, each puts the stream's rounding noise back into the stream;
  placement.moves.STREAM_SHARE), whose f(x) quantizer served it alone and which no layer writes (nor x * g(x), a
  squeeze-excitation residual), where their requantizations, summed, are noisier than the model's noisiest
  other quantizer (estimated from the histograms). Not when the op is
  part of an activation or normalisation of a single tensor, which OpenVINO fuses into one op
  (x*sigmoid(x) -> Swish, x*HardSigmoid(x) / x*clip(x+3,0,6)/6 -> HSwish, GELU, a decomposed
  LayerNorm). The gating Mul of a squeeze-excitation block is quantized like any other
  (NNCF's SE_BLOCK pattern marks it PATTERN_NODE_TO_EXCLUDE: left out of the ignored nodes),
  so every reader of the block input reads one quantized tensor. Nor the Add of a magnitude,
  sqrt(a^2 + b^2) (an STFT's): its squares span twice their roots' dynamic range
  (qtool.quantizers.patterns.is_magnitude; the Sqrt output is quantized where a layer reads it). Nor an op
  one of whose operands holds one value per sample (a diffusion model's preconditioning scale, a per-sample
  mean or norm): rounded, it would scale or shift every position alike (placement.requests._one_per_sample).
* Recurrent ops (LSTM, GRU, RNN) ask for nothing here: their inputs, weights and states stay float,
  except under rules with `int8_lstm` (OpenVINO's): an LSTM's X re-encoded onto its hidden state's
  grid, its initial state on that grid, W and R int8 with per-unit scales (with the guard, "pairs",
  widened until no pair of a row's codes can pass AVX2's int16 pair sums), as OpenVINO's CPU plugin
  runs an LSTM in int8 (step 10, qtool.quantizers.placement.recurrent). NNCF quantizes an
  LSTMSequence's X, H, W and R at their own ranges; OpenVINO then requantizes every step's hidden
  state on X's grid.
* Ignored patterns (NNCF src/nncf/openvino/quantization/ignored_patterns.py and
  src/nncf/onnx/quantization/ignored_patterns.py; on by default, `ignored_patterns=False` turns
  them off): the nodes of these subgraphs get no quantizer on their inputs, so their linear
  layers stay FP32: the gating path of a squeeze-excitation block (ReduceMean/GlobalAveragePool
  -> Conv/Gemm/MatMul [+ bias] -> activation -> Conv/Gemm/MatMul [+ bias] -> Sigmoid or
  relu6(x + 3) / 6 -> Mul, as NNCF matches it on the OpenVINO graph (an ONNX HardSigmoid
  stays OpenVINO's HardSigmoid, not HSigmoid, so NNCF quantizes such blocks, e.g. PP-OCR's);
  the pool and the Mul are not part of it), the attention output (Softmax [-> Reshape] -> MatMul with
  V from Reshape/Transpose/Split/Gather/Squeeze/Concat), rotary position embeddings
  (MatMul [-> Transpose] -> Concat -> Sin, Cos) and SAM's positional embedding
  (MatMul -> Mul -> Sin, Cos -> Concat).
* Depthwise Conv (one input channel per group): its data input per channel (NNCF's CPU setup
  gives DEPTHWISE_CONVOLUTION the per-channel activation space q8_a_ch, with min-max ranges per
  channel), when the calibration file has the per-channel max |x| and no other op reads the
  quantized tensor; per tensor otherwise.
* AveragePool, GlobalAveragePool, ReduceMean, Resize: the data input; not a decomposed LayerNorm's
  (OpenVINO's MVN) ReduceMean of squares nor the mean of its centring Sub(x, ReduceMean(x)): the
  LayerNorm computes in float on a float x, as a LayerNormalization op does and as NNCF's transformer
  preset leaves it (its default preset quantizes the MVN's input; docs/benchmarks.md#ln31). Not,
  on every target, a generalized mean (GeM: pooling over Pow(x, p > 1) taken back to the root,
  qtool.quantizers.patterns.is_power_mean): an 8-bit grid on x^p zeroes the channels whose values
  are all small.
* The max-subtraction Sub(x, ReduceMax(x)) of a softmax or log-sum-exp written out (ReduceMin alike, through ops
  that only move values) asks for nothing: it reads float logits, as a Softmax op does (NNCF's default preset
  quantizes both inputs, each on its own grid, and x - max(x) is then no longer 0 at the max).
* Transformers (NNCF's ModelType.TRANSFORMER preset, which qtool applies when the graph has
  attention, MatMul [-> scale, mask] -> Softmax -> MatMul of activations, and a LayerNorm, fused
  LayerNormalization or decomposed ReduceMean/Sub/Pow/Sqrt/Div; qtool.quantizers.patterns.transformer_structure;
  NNCF src/nncf/quantization/algorithms/min_max/onnx_backend.py and openvino_backend.py,
  get_ignored_metatypes): only the linear layers are quantized, MatMul/Gemm with weights and the
  attention's Q.K^T on both inputs (softmax @ V is the attention-output ignored pattern above).
  Element-wise ops (Add, Sub, Mul, Div, Max, Min) and ReduceMean/ReduceSum/ReduceL2/AveragePool/
  GlobalAveragePool ask for nothing, so the residual stream (residual and embedding Adds,
  LayerNorm inputs), LayerNorm and GELU internals, the attention scale and mask stay float. The
  summary's `transformer` counts what was found. CNNs (no attention or no LayerNorm) are placed
  as before.
* Ranges no 8-bit grid can represent, on every target: infinite or NaN values,
  |x| >= 1e30 (float32 keeps no precision for q * step + low: the grid of [-3.4e38, 0] gives
  -2e31 at q = 255, not 0) and additive masks (a tensor computed with a huge constant, e.g.
  (1 - mask) * finfo(float32).min or Where(mask, 0, -inf), and what it flows into), even when
  calibration saw no padding. They get no quantizer; their readers read the float tensor (a
  linear layer reading one stays FP32). A warning and the summary's `unrepresentable` list them.
* Shape/index tensors and tensors that do not depend on the input (decode grids) never.
* A model shipped quantized with its own QuantizeLinear -> DequantizeLinear pairs (onnxruntime's QDQ format):
  nothing they quantize (a pair's input, its output and pass-throughs of it) gets a second quantizer, and a
  linear layer whose inputs are all such tensors or dequantized integer weights is an int8 layer as it is
  (qtool.model.prequantized; kept tensors of `exclusions`). Nothing else asks either: what the model left float
  stays float (requests._shipped_requests, measured there).
* MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice, Split pass ranges through: when everything that reads their output wants it quantized, the
  quantizer moves up to their input (one quantizer, the op runs on integers); through Slice,
  Split and Gather only when every reader of their input reads it too (a part keeps its own,
  narrower range where the rest of the input is read float). Concat does the
  same for all its inputs, which then share one range (NNCF's unified scales), the Concat
  output's calibrated range.
* One quantizer per tensor, whatever the number of readers; only readers that asked for the
  quantized tensor read it.

Ranges: activations from qtool.calibration.decide (the file's amax on the target's grid, with the
clipping fallback); weights from the weights
(qtool.quantizers.grids). The result is a `Plan`; exporters add FakeQuantize or Q/DQ nodes from it.

The steps, in `place()`'s order, each a function over the results of the ones before it (the
read-only `state.Inputs`, the user's `state.Choices`, the `state.Report` of FP32 layers and
warnings they add to): what stays float (`exclusions`), what each op asks for (`requests`), the
moves through pass-through ops and the shared-range groups with their ranges (`moves`), the
weights, the int8 layers and their quantizers, depthwise inputs per channel and the policies
(`sites`), the overflow guard (`guard`) and the LSTMs run in int8 (`recurrent`).
"""


from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx
from onnx import TensorProto

from ... import model as M
from ...calibration import Threshold
from ...errors import Opt, QtoolError
from ..policy import Policies
from ..quantizer import Quantizer
from ..rules import Rules
from . import exclusions, guard, moves, recurrent, requests, sites
from .state import Choices, Inputs, Report

WEIGHTS_7BIT = (None, "auto", "first", "all", "none")  # None: auto


@dataclass
class Plan:
    """Where the quantizers go, and what the placement found on the way."""

    activations: list[Quantizer]
    weights: list[Quantizer]
    int8_layers: list[str]  # Conv/ConvTranspose/MatMul/Gemm nodes with every input quantized
    fp32_layers: dict[str, str]  # such nodes left in FP32, with the reason
    warnings: list[str]
    ignored: dict[str, str] = field(default_factory=dict)  # node -> the ignored pattern it is part of
    overflow: dict = field(default_factory=dict)  # the overflow guard: mode, remedy, layers given it (with why)
    transformer: dict = field(default_factory=dict)  # the transformer structure found (counts), when the CPU rules' transformer preset applies
    unrepresentable: dict = field(default_factory=dict)  # tensor -> why no 8-bit grid can represent its range (kept float)
    recurrent: list = field(default_factory=list)  # recurrent.RecurrentSite: the LSTMs run in int8 (Rules.int8_lstm)
    float_lstm: dict = field(default_factory=dict)  # LSTM -> why it stays float (Rules.int8_lstm: its estimated int8 error)
    gptq_layers: list = field(default_factory=list)  # the layers whose weight codes GPTQ chose (qtool.quantizers.gptq; the CPU targets)

    @property
    def quantizers(self) -> list[Quantizer]:
        """The activation quantizers, then the weight quantizers."""
        return [*self.activations, *self.weights]

    def summary(self) -> dict:
        out = {
            "activation_quantizers": len(self.activations),
            "weight_quantizers": len(self.weights),
            "int8_layers": len(self.int8_layers),
            "fp32_layers": len(self.fp32_layers),
        }
        patterns: dict[str, int] = {}
        defaults: dict[str, str] = {}
        for node, name in self.ignored.items():
            if name.startswith("default exclusion"):
                defaults[node] = name.removeprefix("default exclusion: ")
            else:
                patterns[name] = patterns.get(name, 0) + 1
        if patterns:
            out["ignored_pattern_nodes"] = dict(sorted(patterns.items()))
        if defaults:
            out["default_exclusions"] = dict(sorted(defaults.items()))
        if self.overflow:
            out["overflow_fix"] = self.overflow
        if self.transformer:
            out["transformer"] = self.transformer
        if self.unrepresentable:
            out["unrepresentable"] = dict(sorted(self.unrepresentable.items()))
        if self.recurrent:
            out["int8_lstm"] = sorted(site.node for site in self.recurrent)
        if self.float_lstm:
            out["float_lstm"] = dict(sorted(self.float_lstm.items()))
        if self.gptq_layers:
            out["gptq_layers"] = len(self.gptq_layers)
        return out


def place(proto: onnx.ModelProto, records: dict, *, rules: Rules, choices: Choices | None = None,
          thresholds: dict[str, Threshold] | None = None, policies: Policies | None = None, recompute=None,
          overflow_remedy: str | None = None, float_types: tuple[int, ...] = (TensorProto.FLOAT,)) -> Plan:
    """The quantizers for `proto` (whose nodes must have unique names) under a target's `rules`,
    given the calibration records {tensor name: TensorRecord} and the user's `choices` (what to
    exclude and include, NNCF's ignored patterns, 7-bit weights; default: none). float_types:
    element types the target can quantize. thresholds: the amax per tensor (qtool.calibration.decide; default: the
    records' own, on the rules' grid, with the rules' clipping fallback). policies: the policy
    of each quantizer (qtool.quantizers.policy; default: none, every quantizer 8-bit symmetric), with
    `recompute(tensor, policy) -> amax` for activation grids of other bits. overflow_remedy: the
    target's remedy for int8 layers whose pair sums can saturate ("uint8", "pairs"; None: no guard)."""
    choices = choices if choices is not None else Choices()
    weights_7bit = choices.weights_7bit
    if weights_7bit not in WEIGHTS_7BIT:
        raise QtoolError("{option} must be one of {choices}, not {given!r}", option=Opt("weights_7bit"), choices=", ".join(WEIGHTS_7BIT[1:]),
                         given=weights_7bit)
    inputs, report = Inputs(proto, records, rules, float_types, thresholds), Report()
    kept = exclusions.kept_float(inputs, choices, report)  # 1. what stays float whatever the ops ask
    asked, moved = _asked_and_moved(inputs, kept, report)  # 2-3. what each op asks, moved up through pass-through ops
    if rules.lone_sums_float:  # 3b. Adds whose two quantizers would serve them alone read float
        kept, asked, moved = _lone_sums_float(inputs, kept, asked, moved)
    ranges = moves.group_ranges(inputs, asked, moved, report)  # 4. one range per shared-range group
    checked = sites.read_weights(inputs, kept, asked, report)  # 5. the weights, finite or not
    placed = sites.decide(inputs, kept, asked, moved, ranges, checked, weights_7bit, report)  # 6. int8 ops, quantizers
    if rules.depthwise_per_channel:  # 7. depthwise Conv inputs per channel
        sites.per_channel_depthwise(inputs, kept, placed.activations)
    if policies is not None:  # 8. each quantizer's policy
        sites.attach_policies(inputs, placed, policies, recompute, report, stretch=rules.stretched_tails and not asked.transformer)
        sites.model_grids(inputs, placed, report)  # 8b. a dynamically quantized model's own grids
    overflow_fix: dict = {}
    if overflow_remedy is not None:  # 9. the overflow guard
        overflow_fix = guard.remedies(inputs, asked, moved, placed, overflow_remedy, weights_7bit)
        fp32 = sorted(name for name, fix in overflow_fix["layers"].items() if fix["remedy"] == "fp32")
        if fp32:  # place again with those layers in FP32 (the guard may then find no more)
            plan = place(proto, records, rules=rules, choices=replace(choices, exclude=[*choices.exclude, *fp32]),
                         thresholds=thresholds, policies=policies, recompute=recompute, overflow_remedy=overflow_remedy,
                         float_types=float_types)
            plan.overflow["layers"] = dict(sorted({**plan.overflow["layers"], **{k: overflow_fix["layers"][k] for k in fp32}}.items()))
            plan.fp32_layers.update(dict.fromkeys(fp32, "kept FP32 by the overflow guard"))
            return plan
    # 10. the LSTMs run in int8: with OpenVINO's guard (a file for any CPU) their weights' pairs bounded for AVX2's int16 pair sums
    lstms, float_lstms = recurrent.lstm_sites(inputs, kept, pairs=overflow_remedy == "pairs") \
        if rules.int8_lstm and overflow_remedy in (None, "pairs") and not inputs.own.pairs else ([], {})
    if float_lstms:
        report.warnings.append(f"{len(float_lstms)} LSTM(s) stay float: " + "; ".join(f"{k} ({v})" for k, v in list(float_lstms.items())[:3])
                               + (" ..." if len(float_lstms) > 3 else ""))
    widened = {site.node: site.widened for site in lstms if site.widened > 1}
    if widened:
        overflow_fix.setdefault("mode", "auto")
        overflow_fix["layers"] = dict(sorted({**overflow_fix.get("layers", {}), **{name: {"remedy": "pair-bounded weights", "why": (
            f"an LSTM's u8 x s8 pairs (W and R rows, inputs 2p and 2p + 1) sum in int16 without VNNI: its hidden units' "
            f"weight steps widened (up to x{ratio:.2f}) so that no pair's codes pass 128")} for name, ratio in widened.items()}}.items()))
    order = {name: i for i, name in enumerate(inputs.m.producer)}
    placed.activations.sort(key=lambda s: order.get(s.tensor, -1))
    _final_warnings(inputs, report)
    return Plan(placed.activations, placed.weights, placed.int8_layers, report.fp32, report.warnings, kept.ignored,
                overflow_fix, asked.transformer, kept.unrepresentable, lstms, float_lstms)


def _lone_sums_float(inputs: Inputs, kept, asked: requests.Requests, moved: moves.Moves):
    """Step 3b: an Add whose two quantizers would serve it alone reads float, and the requests are asked again without
    it, until no other Add is left so: one reading float frees its inputs' other readers (minimol's residual stream,
    each block's sum read by the next block's Add and by a gated message's Add, 56 then 40 more; 50 standalone
    FakeQuantizes in OpenVINO's runtime graph -> 27, NNCF's 25; docs/benchmarks.md#mm26)."""
    lone = moves.lone_sums(inputs, asked, moved)
    while lone:
        kept = replace(kept, nodes=kept.nodes | lone)
        asked, moved = _asked_and_moved(inputs, kept, Report())
        lone = moves.lone_sums(inputs, asked, moved) - kept.nodes
    return kept, asked, moved


def _asked_and_moved(inputs: Inputs, kept, report: Report) -> tuple[requests.Requests, moves.Moves]:
    """Steps 2 and 3: what each op asks to have quantized, and the requests moved up through
    pass-through ops and Concat (pooling asks only next to a quantized neighbour, known once the
    moves are: then moved again)."""
    asked = requests.request(inputs, kept, report)
    moved = moves.Moves()
    moves.move_up(inputs, kept, asked, moved)
    if asked.pools:
        requests.request_pools(inputs, kept, asked)
        moves.move_up(inputs, kept, asked, moved)
    return asked, moved


def _final_warnings(inputs: Inputs, report: Report) -> None:
    """The linear layers left FP32 for a reason the user did not choose, and a model quantized already."""
    unexpected = {k: v for k, v in report.fp32.items()
                  if "excluded" not in v and not v.startswith(("no activation input", "ignored pattern", "default exclusion"))}
    if unexpected:
        report.warnings.append(
            f"{len(unexpected)} Conv/ConvTranspose/MatMul/Gemm layer(s) stay FP32: "
            + "; ".join(f"{k} ({v})" for k, v in list(unexpected.items())[:3]) + (" ..." if len(unexpected) > 3 else "")
        )
    already = M.already_quantized(inputs.m.proto)
    if already:
        report.warnings.append(already)
