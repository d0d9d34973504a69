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
* Element-wise Add/Sub/Mul/Div/Max/Min: both inputs, when both carry data. Not when the op is
  part of an activation or normalisation of a single tensor, which OpenVINO fuses into one op
  (x*sigmoid(x) -> Swish, x*HardSigmoid(x) / x*clip(x+3,0,6)/6 -> HSwish, GELU, a decomposed
  LayerNorm). The gating Mul of a squeeze-excitation block is quantized like any other
  (NNCF's SE_BLOCK pattern marks it PATTERN_NODE_TO_EXCLUDE: left out of the ignored nodes),
  so every reader of the block input reads one quantized tensor.
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
* AveragePool, GlobalAveragePool, ReduceMean, Resize: the data input; not the ReduceMean of squares
  in a decomposed LayerNorm (OpenVINO fuses the normalisation into MVN, whose input NNCF
  quantizes), and the centring Sub(x, ReduceMean(x)) reads the same quantized x as the mean.
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
* MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze, Slice, Split pass ranges through: when everything that reads their output wants it quantized, the
  quantizer moves up to their input (one quantizer, the op runs on integers). Concat does the
  same for all its inputs, which then share one range (NNCF's unified scales), the Concat
  output's calibrated range.
* One quantizer per tensor, whatever the number of readers; only readers that asked for the
  quantized tensor read it.

Ranges: activations from qtool.calibration.decide (the file's amax on the target's grid, with the
clipping fallback); weights from the weights
(qtool.quantizers.quant). The result is a `Plan`; exporters add FakeQuantize or Q/DQ nodes from it.
"""

from __future__ import annotations

import difflib
import functools
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto

from .. import model as M
from ..calibration import MAX_CLIPPED, Threshold, decide
from ..errors import Opt, QtoolError
from ..model import graph as G
from ..model import weights
from . import overflow
from . import patterns as P
from .policy import Policies, choose_symmetry, quantize
from .quantizer import Quantizer, Range
from .rules import Rules

WEIGHTS_7BIT = (None, "auto", "first", "all", "none")  # None: auto
# a MatMul of two activations (Q.K^T) stays FP32 where its estimated saturation noise passes this share of its rounding noise
# (its remedy within int8, 7-bit codes for B, would more than double that noise); measured per layer in OpenVINO on an
# AVX2 CPU (bench/saturation.py), MiniLM's Q.K^T estimated at -15 to -19 dB saturate at -5 to -20 dB, without a trace in
# the output (AVX2 and exact 28.4 dB)
ACTIVATIONS_RISK = 0.1
WIDEN_COST = 1.0  # the overflow guard keeps a layer FP32 only where widening its weights adds more than this share of its rounding noise
# NNCF's ModelType.TRANSFORMER ignored metatypes (src/nncf/quantization/algorithms/min_max/onnx_backend.py and
# openvino_backend.py, get_ignored_metatypes: Add, Pow, Squeeze, Sub, AveragePool, GlobalAveragePool, ReduceMean,
# ReduceL2, ReduceSum, Div, Max, Sqrt, Reciprocal, BatchNorm, comparisons; Mul too except on CPU_SPR): besides
# the element-wise ops, the pooling ops among them get no quantizer either
_TRANSFORMER_FLOAT = {"AveragePool", "GlobalAveragePool", "ReduceMean", "ReduceL2", "ReduceSum"}


@dataclass
class Plan:
    activations: list[Quantizer]
    weights: list[Quantizer]
    int8_layers: list[str]  # Conv/ConvTranspose/MatMul/Gemm nodes with every input quantized
    fp32_layers: dict[str, str]  # such nodes left in FP32, with the reason
    warnings: list[str]
    ignored: dict[str, str] = field(default_factory=dict)  # node -> the ignored pattern it is part of
    overflow: dict = field(default_factory=dict)  # the overflow guard: mode, remedy, layers given it (with why)
    transformer: dict = field(default_factory=dict)  # the transformer structure found (counts), when the CPU rules' transformer preset applies
    unrepresentable: dict = field(default_factory=dict)  # tensor -> why no 8-bit grid can represent its range (kept float)

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
        exclusions: dict[str, str] = {}
        for node, name in self.ignored.items():
            if name.startswith("default exclusion"):
                exclusions[node] = name.removeprefix("default exclusion: ")
            else:
                patterns[name] = patterns.get(name, 0) + 1
        if patterns:
            out["ignored_pattern_nodes"] = dict(sorted(patterns.items()))
        if exclusions:
            out["default_exclusions"] = dict(sorted(exclusions.items()))
        if self.overflow:
            out["overflow_fix"] = self.overflow
        if self.transformer:
            out["transformer"] = self.transformer
        if self.unrepresentable:
            out["unrepresentable"] = dict(sorted(self.unrepresentable.items()))
        return out


class _Groups:
    """Union-find over tensor names: tensors that must share one range."""

    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def weight_axis(node: onnx.NodeProto, slot: int, rank: int) -> int | None:
    """The output-channel axis of a constant input of a linear layer (None: per tensor)."""
    op = node.op_type
    if op == "Conv":
        return 0 if slot == 1 and rank >= 2 else None
    if op == "ConvTranspose":  # W is [C_in, C_out/group, k...]; per channel only when group == 1
        return 1 if slot == 1 and rank >= 2 and int(G.attr(node, "group", 1)) == 1 else None
    if op == "Gemm":  # Y = op(A) @ op(B): rows of A, columns of B
        if slot == 0:
            return 1 if int(G.attr(node, "transA", 0)) else 0
        return 0 if int(G.attr(node, "transB", 0)) else 1
    if op == "MatMul":
        if rank < 2:
            return None
        return rank - 1 if slot == 1 else rank - 2
    return None


def _resolve_names(m: G.Index, names: list[str], option: str = "--exclude") -> tuple[set[str], set[str]]:
    node_names = set(m.nodes)
    tensor_names = set(m.producer) | m.inputs | set(m.constants)
    nodes, tensors, unknown = set(), set(), []
    for name in names:
        if name in node_names:
            nodes.add(name)
        if name in tensor_names:
            tensors.add(name)
        if name not in node_names and name not in tensor_names:
            unknown.append(name)
    if unknown:
        known = sorted(node_names | tensor_names)
        hints = []
        for u in unknown:
            near = difflib.get_close_matches(u, known, n=1)
            hints.append(f"{u!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise QtoolError(f"{option}: no node or tensor named {', '.join(hints)} in the model")
    return nodes, tensors


def _listed(names, limit: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


class _Placer:
    """One placement run: the graph, the target's rules and the decisions taken so far."""

    def __init__(self, proto: onnx.ModelProto, records: dict, rules: Rules, float_types: tuple[int, ...],
                 thresholds: dict[str, Threshold] | None):
        self.m = G.Index(proto)
        self.records = records
        self.thresholds = thresholds if thresholds is not None else {
            name: decide(rec, signed=rules.signed_only, fallback=rules.clip_fallback) for name, rec in records.items()}
        self.rules = rules
        self.float_types = float_types
        self.warnings: list[str] = []
        self.fp32: dict[str, str] = {}  # linear node -> why it stays FP32
        self.ignored: dict[str, str] = {}  # node -> the pattern or default exclusion that keeps it FP32
        self.excluded_nodes: set[str] = set()
        self.excluded_tensors: set[str] = set()
        self.wanted: dict[str, list[tuple[str, int]]] = defaultdict(list)  # tensor -> (node, slot) asking for it quantized
        self.asks: dict[str, list[str]] = {}  # node -> tensors it needs quantized
        self.weights_of: dict[str, list[tuple[int, str]]] = {}
        self.linear_order: list[str] = []
        self.groups = _Groups()
        self.moved: dict[str, list[tuple[str, int, str]]] = {}  # tensor -> [(node, slot, upstream tensor)]
        self.concat_outputs: set[str] = set()
        self._satisfied: dict[str, bool] = {}
        self.pools: list[onnx.NodeProto] = []  # pooling ops waiting for a quantized neighbour
        self.transformer: dict[str, int] = {}  # the transformer structure found (CPU rules: NNCF's transformer preset)
        self.unrepresentable: dict[str, str] = {}  # tensor -> why its range cannot be quantized

    @functools.cached_property
    def constant_dims(self) -> dict[str, list[int]]:
        return {name: list(t.dims) for name, t in self.m.constants.items()}

    def quantizable_act(self, t: str) -> bool:
        return self.m.is_data(t) and self.m.types.get(t) in self.float_types

    # ------------------------------------------------------------ 0. what stays FP32
    def exclude(self, exclude, include, ignored_patterns: bool) -> None:
        m, rules = self.m, self.rules
        self.excluded_nodes, self.excluded_tensors = _resolve_names(m, list(exclude))
        included, _ = _resolve_names(m, list(include), "--include")
        found: dict[str, str] = {}
        if rules.ignored_patterns and ignored_patterns:
            found.update(P.ignored_nodes(m))
        if rules.exclusions is not None:
            found.update(rules.exclusions(m))
        unused = sorted(included - set(found))
        if unused:
            self.warnings.append(f"--include: {_listed(unused)} not excluded by default; nothing to include")
        self.ignored = {k: v for k, v in found.items() if k not in included}
        for name, why in self.ignored.items():
            if m.nodes[name].op_type in rules.linear and name not in self.excluded_nodes:
                self.fp32[name] = why if why.startswith("default exclusion") else f"ignored pattern {why}"
        self.excluded_nodes |= set(self.ignored)
        self._unrepresentable()
        if rules.nncf_patterns:
            self.transformer = P.transformer_structure(m)

    def _unrepresentable(self) -> None:
        """Tensors whose range no 8-bit grid represents stay float on every target: infinite or
        NaN values, |x| >= 1e30 (float32 has no precision left for q * step + low: at q = 255
        the grid of [-3.4e38, 0] gives -2e31, not 0) or an additive attention mask (a huge
        negative constant or 0, even when calibration saw no padding)."""
        found = P.unrepresentable(self.m, self.records)
        self.unrepresentable = {t: why for t, why in found.items() if self.m.is_data(t) and t not in self.excluded_tensors}
        if self.unrepresentable:
            self.excluded_tensors |= set(self.unrepresentable)
            self.warnings.append(
                f"{len(self.unrepresentable)} tensor(s) have a range no 8-bit grid can represent and stay float (their readers "
                "read the float tensor): " + "; ".join(f"{t} ({why})" for t, why in list(self.unrepresentable.items())[:5])
                + (" ..." if len(self.unrepresentable) > 5 else ""))

    # ------------------------------------------------------------ 1. what each op asks for
    def request(self) -> None:
        for n in self.m.graph.node:
            if not P.standard(n) or n.name in self.excluded_nodes:
                if n.op_type in self.rules.linear and n.name in self.excluded_nodes and n.name not in self.fp32:
                    self.fp32[n.name] = "excluded"
                continue
            acts, wts = self._node_requests(n)
            if acts is None:
                continue
            if n.op_type in self.rules.pooling and self.rules.pooling_needs_neighbour:
                self.pools.append(n)
                continue
            self._ask(n, acts, wts)

    def request_pools(self) -> None:
        """Pooling next to a quantized neighbour only: its output is quantized for a reader
        (after the moves through pass-through ops) or its input is quantized anyway."""
        for n in reversed(self.pools):
            if self.wanted.get(n.input[0]) or any(self.wanted.get(o) for o in n.output):
                self._ask(n, [(0, n.input[0])], [])

    def _ask(self, n: onnx.NodeProto, acts: list[tuple[int, str]], wts: list[tuple[int, str]]) -> None:
        self.asks[n.name] = [t for _, t in acts]
        self.weights_of[n.name] = wts
        for slot, t in acts:
            self.wanted[t].append((n.name, slot))
        if n.op_type == "ReduceMean" and self.rules.nncf_patterns:  # a decomposed LayerNorm reads one quantized input
            for sub, slot in self.m.readers.get(n.output[0], ()):
                if sub.op_type == "Sub" and slot == 1 and sub.input[0] == n.input[0] and P.standard(sub) and sub.name not in self.excluded_nodes:
                    self.asks[sub.name] = [n.input[0]]
                    self.wanted[n.input[0]].append((sub.name, 0))

    def _node_requests(self, n: onnx.NodeProto):
        """(activation inputs, constant weights) node `n` wants quantized, or (None, None)."""
        op, m, rules = n.op_type, self.m, self.rules
        if op in rules.linear:
            return self._linear_requests(n)
        if self.transformer and (op in rules.elementwise or op in _TRANSFORMER_FLOAT):
            return None, None  # NNCF's transformer preset: the residual stream, norms, masks and scales stay float
        if op in rules.elementwise:
            if len(n.input) != 2 or not all(self.quantizable_act(t) for t in n.input):
                return None, None
            if rules.nncf_patterns and P.is_fused_elementwise(m, n):
                return None, None
            return [(0, n.input[0]), (1, n.input[1])], []
        if op == "Add" and rules.residual_input is not None:
            skip = rules.residual_input(m, n)
            if skip is None or not self.quantizable_act(n.input[skip]):
                return None, None
            return [(skip, n.input[skip])], []
        if op in rules.pooling:
            if not n.input or not self.quantizable_act(n.input[0]) or (rules.nncf_patterns and P.is_variance(m, n)):
                return None, None
            return [(0, n.input[0])], []
        return None, None

    def _linear_requests(self, n: onnx.NodeProto):
        m, op = self.m, n.op_type
        acts: list[tuple[int, str]] = []
        wts: list[tuple[int, str]] = []
        slots = (0, 1) if len(n.input) >= 2 else ()
        reason = "" if slots else "fewer than two inputs"
        for slot in slots:
            t = n.input[slot]
            if t in m.constants and m.constants[t].data_type in self.float_types and (op in ("MatMul", "Gemm") or slot == 1):
                wts.append((slot, t))
            elif self.quantizable_act(t) and not (op in ("Conv", "ConvTranspose") and slot == 1):
                acts.append((slot, t))
            else:
                reason = f"input {t!r} is neither a calibrated activation nor a float constant weight"
        if not acts and not reason:
            reason = "no activation input (constant folding will compute it)"
        if reason:
            self.fp32[n.name] = reason
            return None, None
        self.linear_order.append(n.name)
        return acts, wts

    # ------------------------------------------------------------ 2. moves through pass-through ops
    def propagate(self) -> None:
        """Move requests up through pass-through ops and Concat (reverse topological order, so
        every reader of a tensor has asked before its producer is visited)."""
        m, wanted = self.m, self.wanted
        for n in reversed(m.graph.node):
            if not P.standard(n) or n.name in self.excluded_nodes or not n.output:
                continue
            op = n.op_type
            if not self.rules.forwards(op):
                continue
            outs = [o for o in n.output if o]
            if not outs or any(
                o in m.outputs or o in self.excluded_tensors or not wanted.get(o)
                or len(wanted[o]) != len(m.readers.get(o, ())) for o in outs
            ):
                continue  # someone reads an output unquantized: keep the quantizer below this op
            slots = range(len(n.input)) if op == "Concat" else [0]
            ups = [(s, n.input[s]) for s in slots if n.input[s]]
            if not ups or not all(self.quantizable_act(t) and t not in self.excluded_tensors for _, t in ups):
                continue
            for o in outs:
                self.moved[o] = [(n.name, s, t) for s, t in ups]
                for _, t in ups:
                    self.groups.union(o, t)
            for s, t in ups:
                if (n.name, s) not in wanted[t]:
                    wanted[t].append((n.name, s))
            if op == "Concat":
                self.concat_outputs.update(outs)
        if self.rules.concat_shares_quantized_inputs:
            self._share_concat_ranges()

    def _share_concat_ranges(self) -> None:
        """A Concat whose output is quantized shares its range with every input quantized for
        other readers (a runtime would otherwise requantize after moving Q across the Concat)."""
        for n in self.m.graph.node:
            if n.op_type != "Concat" or not P.standard(n) or not n.output or n.output[0] in self.moved:
                continue
            out = n.output[0]
            if not self.wanted.get(out):
                continue
            for t in n.input:
                if t and self.wanted.get(t):
                    self.groups.union(out, t)
                    self.concat_outputs.add(out)

    # ------------------------------------------------------------ 3. ranges per shared group
    def ranges(self) -> None:
        """Per group, the Concat outputs' calibrated range if the group has one, else the widest
        range of the tensors actually quantized."""
        records, rules = self.thresholds, self.rules
        self.sites = [t for t in self.wanted if self.wanted[t] and t not in self.moved]
        site_set = set(self.sites)
        self.members: dict[str, list[str]] = defaultdict(list)
        for t in set(self.wanted) | set(self.moved):
            self.members[self.groups.find(t)].append(t)
        self.group_range: dict[str, Range | None] = {}
        missing: list[str] = []
        zero: list[str] = []
        degenerate: list[str] = []
        for root, names in self.members.items():
            anchors = [t for t in names if t in self.concat_outputs and t in records]
            if not anchors:
                anchors = [t for t in names if t in site_set and t in records]
            if not anchors:
                self.group_range[root] = None
                missing.extend(t for t in names if t in site_set and t not in records)
                continue
            decided = [self.thresholds[t] for t in anchors]
            if rules.clip_fallback:
                degenerate += [t for t, d in zip(anchors, decided) if d.degenerate]
            amax = max(d.amax for d in decided)
            unsigned = all(d.unsigned for d in decided)
            if not (np.isfinite(amax) and amax > 0):
                zero.append(anchors[0])
                amax = 1.0
            self.group_range[root] = Range(amax, unsigned)
        self._range_warnings(missing, degenerate, zero)

    def _range_warnings(self, missing: list[str], degenerate: list[str], zero: list[str]) -> None:
        if missing:
            self.warnings.append(
                f"{len(missing)} tensor(s) to quantize are not in the calibration file, their readers stay FP32 "
                f"(was the file made for this model?): " + ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
            )
        if degenerate:
            self.warnings.append(
                f"{len(degenerate)} calibrated threshold(s) clip more than {MAX_CLIPPED:.0%} of the tensor's values "
                "(typically a tensor that is never near zero, e.g. a sigmoid output); their maximum |x| is used instead: "
                + ", ".join(sorted(degenerate)[:5]) + (" ..." if len(degenerate) > 5 else "")
            )
        if zero:
            self.warnings.append(f"{len(zero)} range(s) had amax 0 (tensor always zero) and got [0, 1]: " + ", ".join(sorted(zero)[:5]))

    def satisfied(self, t: str) -> bool:
        cache = self._satisfied
        if t not in cache:
            cache[t] = False  # guards against cycles in malformed graphs
            if t in self.excluded_tensors:
                cache[t] = False
            elif t in self.moved:
                cache[t] = all(self.satisfied(u) for _, _, u in self.moved[t])
            else:
                cache[t] = self.group_range.get(self.groups.find(t)) is not None
        return cache[t]

    # ------------------------------------------------------------ 4. weights
    def read_weights(self) -> None:
        """Weight values, checked before deciding which layers run in int8."""
        self.weight_values: dict[str, np.ndarray] = {}
        self.bad_weights: set[str] = set()
        for wts in self.weights_of.values():
            for _, t in wts:
                if t in self.weight_values or t in self.bad_weights:
                    continue
                if t in self.excluded_tensors:
                    self.bad_weights.add(t)
                    continue
                try:
                    values = weights.value(self.m.constants[t])
                except Exception as e:  # external data not loaded, damaged tensor
                    raise QtoolError(f"cannot read weight {t!r}: {e}") from None
                if not np.all(np.isfinite(values)):
                    self.warnings.append(f"weight {t!r} contains NaN or infinity; the layers reading it stay FP32")
                    self.bad_weights.add(t)
                    continue
                self.weight_values[t] = values

    # ------------------------------------------------------------ 5. decide per op
    def decide(self, weights_7bit: str | None) -> tuple[list[Quantizer], list[Quantizer], list[str]]:
        """Which ops run quantized, and which quantizer each of their inputs reads."""
        m = self.m
        readers_of_site: dict[str, list[tuple[str, int]]] = defaultdict(list)

        def need(t: str, reader: tuple[str, int]) -> None:
            if t in self.moved:
                for node_name, slot, up in self.moved[t]:
                    need(up, (node_name, slot))
            elif reader not in readers_of_site[t]:
                readers_of_site[t].append(reader)

        int8_layers: list[str] = []
        weight_sites: dict[str, Quantizer] = {}
        first_linear = self.linear_order[0] if self.linear_order else None
        for n in m.graph.node:
            if n.name not in self.asks:
                continue
            tensors = self.asks[n.name]
            wts = self.weights_of.get(n.name, [])
            if not all(self.satisfied(t) for t in tensors):
                if n.op_type in self.rules.linear:
                    self.fp32[n.name] = ("an input's range cannot be represented" if set(tensors) & set(self.unrepresentable)
                                         else "input excluded" if set(tensors) & self.excluded_tensors else "an input has no calibrated range")
                continue
            if any(t in self.bad_weights for _, t in wts):
                self.fp32[n.name] = "weight excluded" if any(t in self.excluded_tensors for _, t in wts) else "weight has NaN or infinity"
                continue
            for slot, t in enumerate(n.input):
                if t in tensors and (n.name, slot) in self.wanted.get(t, []):
                    need(t, (n.name, slot))
            if n.op_type in self.rules.linear:
                int8_layers.append(n.name)
            headroom = 1 if weights_7bit == "all" or (weights_7bit == "first" and n.name == first_linear) else 0
            for slot, t in wts:
                self._add_weight(weight_sites, n, slot, t, headroom)
        activation_sites = []
        for t in self.sites:
            if readers_of_site.get(t):
                root = self.groups.find(t)
                activation_sites.append(Quantizer.activation(
                    t, m.types.get(t, TensorProto.FLOAT), self.group_range[root], readers_of_site[t],
                    sorted(x for x in self.members[root] if x != t),
                ))
        return activation_sites, list(weight_sites.values()), int8_layers

    def _add_weight(self, weight_sites: dict[str, Quantizer], n: onnx.NodeProto, slot: int, t: str, headroom: int) -> None:
        values = self.weight_values[t]
        axis_of = self.rules.weight_axis or weight_axis
        axis = axis_of(n, slot, values.ndim)
        site = weight_sites.get(t)
        if site is None:
            weight_sites[t] = Quantizer.weight(t, self.m.constants[t].data_type, axis, headroom, values, [(n.name, slot)])
            return
        if site.axis != axis:  # one tensor, two layouts (a weight shared by different ops)
            site.axis = None
        site.headroom_bits = max(site.headroom_bits, headroom)
        site.readers.append((n.name, slot))

    # ------------------------------------------------------------ 6. policies
    def attach_policies(self, activation_sites: list[Quantizer], weight_sites: list[Quantizer],
                        policies: Policies, recompute) -> None:
        """Each quantizer's policy (later rules win); an activation whose policy has other bits than
        8 gets its threshold searched again for that grid (`recompute(tensor, policy)`), and an
        asymmetric one its calibrated [min, max] (over its shared-range group)."""
        ops = {name: n.op_type for name, n in self.m.nodes.items()}
        for site in activation_sites:
            nodes = [name for name, _ in site.readers]
            site.policy = policies.for_quantizer("activations", site.tensor, nodes, [ops[n] for n in nodes])
            group = [t for t in [site.tensor, *site.shared_with] if t in self.records]
            if site.policy.bits != 8 and recompute is not None and group:
                site.range = Range(max(recompute(t, site.policy) for t in group), site.range.unsigned)
            if site.policy.symmetric is not True and group:
                site.low = min(float(self.records[t].min) for t in group)
                site.high = max(float(self.records[t].max) for t in group)
                if site.policy.symmetric is None:  # auto: the finer grid, per tensor
                    symmetric = site.channel_amax is not None or choose_symmetry(site.range.amax, site.low, site.high, site.policy.bits)
                    site.policy = replace(site.policy, symmetric=symmetric)
        for site in weight_sites:
            nodes = [name for name, _ in site.readers]
            site.policy = policies.for_quantizer("weights", site.tensor, nodes, [ops[n] for n in nodes])
        self.warnings += policies.unused()

    # ------------------------------------------------------------ 7. depthwise inputs per channel
    def per_channel_depthwise(self, activation_sites: list[Quantizer]) -> None:
        m = self.m
        dims = self.constant_dims
        for site in activation_sites:
            stats = getattr(self.records.get(site.tensor), "stats", None)
            peak = None if stats is None or stats.axis != 1 else stats.channel_absmax
            if peak is None or site.shared_with or site.tensor in self.excluded_tensors:
                continue
            convs = [m.nodes[name] for name, slot in site.readers if slot == 0]
            if len(convs) != len(site.readers) or not all(G.is_depthwise(c, dims) for c in convs):
                continue
            if any(int(dims[c.input[1]][0]) != len(peak) for c in convs):
                continue
            amax = np.asarray(peak, dtype=np.float64)
            fallback = float(amax.max()) if amax.size and amax.max() > 0 else 1.0
            site.channel_amax = np.where((amax > 0) & np.isfinite(amax), amax, fallback)
            site.axis = 1
            site.rank = len(dims[convs[0].input[1]])

    # ------------------------------------------------------------ 8. overflow on CPUs without VNNI
    def guard_overflow(self, activation_sites: list[Quantizer], weight_sites: list[Quantizer], int8_layers: list[str],
                       remedy: str) -> dict[str, dict]:
        """Give the layers whose u8 x s8 pair sums can saturate (qtool.quantizers.overflow) the target's
        remedy. "uint8" (onnxruntime): weights stored as uint8 with zero point 128, the same values,
        which onnxruntime multiplies with its u8 x u8 kernels, exactly, on every CPU; wherever the
        saturation noise reaches 1 % of the layer's own rounding noise. "pairs" (OpenVINO, whose int8
        kernels take s8 weights only): `_bound_pairs`. A MatMul of two activations (both targets):
        FP32 where overflow.assess_activations passes ACTIVATIONS_RISK.
        {layer: {"remedy": "uint8 weights" | "pair-bounded weights" | "fp32", "why": ...}}; FP32
        layers are only listed (place() places again without them)."""
        by_tensor = {s.tensor: s for s in activation_sites}
        weights = {s.tensor: s for s in weight_sites}
        dims = self.constant_dims
        raw = self._raw_inputs()
        fixed: dict[str, dict] = {}

        def site_of(t: str):
            """(the quantizer a layer's input `t` reads, moved up through pass-through ops, its record)."""
            site, upstream = None, t
            while site is None and upstream is not None:
                site = by_tensor.get(upstream)
                upstream = self.moved[upstream][0][2] if upstream in self.moved else None
            return site, self.records.get(t) or (self.records.get(site.tensor) if site else None)

        for name in int8_layers:
            n = self.m.nodes[name]
            wts = self.weights_of.get(name, [])
            acts = self.asks.get(name, [])
            if not wts and len(acts) == 2 and n.op_type == "MatMul":
                (a, rec_a), (b, rec_b) = site_of(acts[0]), site_of(acts[1])
                risk = None if None in (a, b, rec_a, rec_b) else overflow.assess_activations(rec_a, a.params(), rec_b, b.params())
                if risk is not None and risk.saturation > ACTIVATIONS_RISK * risk.noise:
                    fixed[name] = {"remedy": "fp32", "why": (
                        f"two activations: saturation noise {overflow.db(risk.saturation, risk.noise)} dB of the int8 noise (7-bit "
                        f"codes for its second input would add {overflow.db(risk.seven_bit, risk.noise)} dB)")}
                continue
            if len(wts) != 1 or len(acts) != 1:
                continue
            (slot, wt), t = wts[0], acts[0]
            site, record = site_of(t)
            wsite = weights.get(wt)
            if site is None or record is None or wsite is None or wsite.headroom_bits:
                continue
            q = quantize(wsite.values, wsite.params(), wsite.policy.rounding)
            risk = overflow.assess(n, slot, q, dims, record, site.params(), correlated=t in raw,
                                   runtime="openvino" if remedy == "pairs" else "any")
            if risk is None:
                continue
            if remedy == "uint8" and risk.saturation > 0.01 * risk.noise:
                wsite.unsigned_storage = True
                fixed[name] = {"remedy": "uint8 weights", "why": risk.describe()}
            elif remedy == "pairs":
                why = self._bound_pairs(n, slot, wsite, dims, record, site.params(), risk)
                if why is not None:
                    fixed[name] = why
        return fixed

    def _bound_pairs(self, n: onnx.NodeProto, slot: int, wsite: Quantizer, dims: dict, record, act, risk) -> dict | None:
        """OpenVINO's remedy for one layer (its int8 kernels take s8 weights only): the weight step
        of the output channels whose same-sign pairs can pass int16 widened just enough
        (overflow.pair_step), where a pair can saturate: from the calibrated per-channel max |x|
        where calibration recorded it (transformers: every such channel counts), else where the
        histogram estimate reaches 1 % of the layer's rounding noise. The layer stays FP32 only
        where that costs more than WIDEN_COST of its noise and saturation would cost more
        (typically an image's first layer, all of whose weights pair with their own sign)."""
        params = wsite.params()
        values = np.asarray(wsite.values, dtype=np.float64)
        k = overflow.reduction_rows(n, slot, values, dims, "openvino")
        if not k:
            return None
        outputs, length = k[0].shape[0], values.size // k[0].shape[0]  # the reduction length, padding left out
        codes = overflow.channel_codes(record, act, length) if n.op_type in ("MatMul", "Gemm") else None
        step = overflow.channel_step(n, slot, values, dims, params.axis, codes, "openvino")
        floor = None if step is None else step * params.grid.qmax
        amax = np.asarray(params.scale, dtype=np.float64) * params.grid.qmax
        ratio = np.maximum(floor / amax, 1.0) if floor is not None else np.ones(1)
        if not (ratio > 1 + 1e-9).any() or (codes is None and risk.saturation <= 0.01 * risk.noise):
            return None
        _, mean_sq = overflow.activation_codes(record, act)
        rows = np.broadcast_to(ratio, amax.shape) if amax.ndim else ratio
        cost = overflow.widening_noise(mean_sq, length, np.tile(rows, outputs // rows.size))
        why = (f"{risk.describe()}; {int((rows > 1 + 1e-9).sum())} of {rows.size} output channels' weight steps widened "
               f"(up to x{float(rows.max()):.2f}) so no pair can saturate, adding {overflow.db(cost, risk.noise)} dB")
        if cost > WIDEN_COST * risk.noise and risk.saturation > cost:
            return {"remedy": "fp32", "why": why}
        wsite.floor = floor if wsite.floor is None else np.maximum(wsite.floor, floor)
        return {"remedy": "pair-bounded weights", "why": why}

    def _raw_inputs(self) -> set[str]:
        """Tensors computed from a float graph input by no linear layer (the image itself, up to
        preprocessing): their neighbouring channels and positions move together."""
        raw = {i.name for i in self.m.graph.input if self.m.types.get(i.name) in self.float_types}
        for n in self.m.graph.node:
            if n.op_type not in self.rules.linear and any(t in raw for t in n.input):
                raw.update(o for o in n.output if o)
        return raw

    def final_warnings(self) -> None:
        unexpected = {k: v for k, v in self.fp32.items()
                      if "excluded" not in v and not v.startswith(("no activation input", "ignored pattern", "default exclusion"))}
        if unexpected:
            self.warnings.append(
                f"{len(unexpected)} Conv/ConvTranspose/MatMul/Gemm layer(s) stay FP32: "
                + "; ".join(f"{k} ({v})" for k, v in list(unexpected.items())[:3]) + (" ..." if len(unexpected) > 3 else "")
            )
        already = M.already_quantized(self.m.proto)
        if already:
            self.warnings.append(already)


def place(proto: onnx.ModelProto, records: dict, *, rules: Rules, thresholds: dict[str, Threshold] | None = None,
          policies: Policies | None = None, recompute=None, exclude: list[str] | tuple = (),
          include: list[str] | tuple = (), weights_7bit: str | None = None, overflow_remedy: str | None = None,
          float_types: tuple[int, ...] = (TensorProto.FLOAT,), ignored_patterns: bool = True,
          depthwise_per_channel: bool = True) -> Plan:
    """The quantizers for `proto` (whose nodes must have unique names) under a target's `rules`,
    given the calibration records {tensor name: TensorRecord}. float_types: element types the
    target can quantize. thresholds: the amax per tensor (qtool.calibration.decide; default: the
    records' own, on the rules' grid, with the rules' clipping fallback). policies: the policy
    of each quantizer (qtool.quantizers.policy; default: none, every quantizer 8-bit symmetric), with
    `recompute(tensor, policy) -> amax` for activation grids of other bits. exclude: nodes/tensors kept FP32; include: nodes the rules' default
    exclusions or ignored patterns would keep FP32, quantized anyway. ignored_patterns=False turns
    NNCF's ignored patterns off; depthwise_per_channel=False keeps depthwise Conv inputs per tensor."""
    if weights_7bit not in WEIGHTS_7BIT:
        raise QtoolError("{option} must be one of {choices}, not {given!r}", option=Opt("weights_7bit"), choices=", ".join(WEIGHTS_7BIT[1:]),
                         given=weights_7bit)
    p = _Placer(proto, records, rules, float_types, thresholds)
    p.exclude(exclude, include, ignored_patterns)
    p.request()
    p.propagate()
    if p.pools:
        p.request_pools()
        p.propagate()
    p.ranges()
    p.read_weights()
    activation_sites, weight_sites, int8_layers = p.decide(weights_7bit)
    if rules.depthwise_per_channel and depthwise_per_channel:
        p.per_channel_depthwise(activation_sites)
    if policies is not None:
        p.attach_policies(activation_sites, weight_sites, policies, recompute)
    overflow_fix: dict = {}
    if overflow_remedy is not None:
        mode = weights_7bit or "auto"
        if mode == "auto":
            layers = p.guard_overflow(activation_sites, weight_sites, int8_layers, overflow_remedy)
            fp32 = sorted(name for name, fix in layers.items() if fix["remedy"] == "fp32")
            if fp32:  # place again with those layers in FP32 (the guard may then find no more)
                plan = place(proto, records, rules=rules, thresholds=thresholds, policies=policies, recompute=recompute,
                             exclude=[*exclude, *fp32], include=include, weights_7bit=weights_7bit, overflow_remedy=overflow_remedy,
                             float_types=float_types, ignored_patterns=ignored_patterns, depthwise_per_channel=depthwise_per_channel)
                plan.overflow["layers"] = dict(sorted({**plan.overflow["layers"], **{k: layers[k] for k in fp32}}.items()))
                plan.fp32_layers.update(dict.fromkeys(fp32, "kept FP32 by the overflow guard"))
                return plan
        else:
            layers = {name: {"remedy": "7-bit weights", "why": f"--weights-7bit {mode}"}
                      for w in weight_sites if w.headroom_bits for name, _ in w.readers}
        overflow_fix = {"mode": mode, "layers": dict(sorted(layers.items()))}
    order = {name: i for i, name in enumerate(p.m.producer)}
    activation_sites.sort(key=lambda s: order.get(s.tensor, -1))
    p.final_warnings()
    return Plan(activation_sites, weight_sites, int8_layers, p.fp32, p.warnings, p.ignored, overflow_fix, p.transformer, p.unrepresentable)
