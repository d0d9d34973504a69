"""The quantizers themselves: the weights read and checked, which ops run quantized (every input
they ask for has a quantizer with a range), the activation and weight quantizers they read (with
their axes and 7-bit headroom), depthwise Conv inputs per channel and each quantizer's policy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto

from ...errors import QtoolError
from ...model import dynamic, lazy
from ...model import graph as G
from ...statistics import thresholds
from ..policy import Policies, choose_symmetry
from ..quantizer import Quantizer, Range
from .exclusions import Kept
from .moves import Moves, Ranges, satisfied
from .requests import Requests
from .state import Inputs, Report


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


@dataclass
class WeightValues:
    values: dict[str, np.ndarray]  # weight tensor -> its values
    bad: set[str]  # weights excluded or holding NaN or infinity: their layers stay FP32


def read_weights(inputs: Inputs, kept: Kept, asked: Requests, report: Report) -> WeightValues:
    """Reads the weights the requests name. Decides which are usable (finite, not excluded),
    before deciding which layers run in int8."""
    found = WeightValues({}, set())
    for wts in asked.weights_of.values():
        for _, t in wts:
            if t in found.values or t in found.bad:
                continue
            if t in kept.tensors:
                found.bad.add(t)
                continue
            try:
                values = lazy.value(inputs.m.constants[t])
            except Exception as e:  # external data not loaded, damaged tensor
                raise QtoolError(f"cannot read weight {t!r}: {e}") from None
            if not np.all(np.isfinite(values)):
                report.warnings.append(f"weight {t!r} contains NaN or infinity; the layers reading it stay FP32")
                found.bad.add(t)
                continue
            found.values[t] = values
    return found


@dataclass
class Sites:
    activations: list[Quantizer]
    weights: list[Quantizer]
    int8_layers: list[str]  # Conv/ConvTranspose/MatMul/Gemm nodes with every input quantized


def decide(inputs: Inputs, kept: Kept, asked: Requests, moves: Moves, ranges: Ranges, checked: WeightValues,
           weights_7bit: str | None, report: Report) -> Sites:
    """Reads every earlier step's result. Decides which ops run quantized (every tensor they ask
    for `satisfied`, their weights usable; the linear ones that cannot go to report.fp32 with why)
    and which quantizer each of their inputs reads, moved up where the moves took it."""
    m, rules = inputs.m, inputs.rules
    ready = satisfied(kept, moves, ranges)
    readers_of_site: dict[str, list[tuple[str, int]]] = defaultdict(list)

    def need(t: str, reader: tuple[str, int]) -> None:
        if t in moves.upstream:
            for node_name, slot, up in moves.upstream[t]:
                need(up, (node_name, slot))
        elif reader not in readers_of_site[t]:
            readers_of_site[t].append(reader)

    int8_layers: list[str] = []
    weight_sites: dict[str, Quantizer] = {}
    first_linear = asked.linear_order[0] if asked.linear_order else None
    for n in m.graph.node:
        if n.name not in asked.asks:
            continue
        tensors = asked.asks[n.name]
        wts = asked.weights_of.get(n.name, [])
        if not all(ready(t) for t in tensors):
            if n.op_type in rules.linear:
                report.fp32[n.name] = ("an input's range cannot be represented" if set(tensors) & set(kept.unrepresentable)
                                       else "input excluded" if set(tensors) & kept.tensors else "an input has no calibrated range")
            continue
        if any(t in checked.bad for _, t in wts):
            report.fp32[n.name] = "weight excluded" if any(t in kept.tensors for _, t in wts) else "weight has NaN or infinity"
            continue
        for slot, t in enumerate(n.input):
            if t in tensors and (n.name, slot) in asked.wanted.get(t, []):
                need(t, (n.name, slot))
        if n.op_type in rules.linear:
            int8_layers.append(n.name)
        headroom = 1 if weights_7bit == "all" or (weights_7bit == "first" and n.name == first_linear) else 0
        for slot, t in wts:
            _add_weight(inputs, weight_sites, n, slot, t, checked.values[t], headroom)
    return Sites(_activation_sites(inputs, moves, ranges, readers_of_site), list(weight_sites.values()), int8_layers)


def _activation_sites(inputs: Inputs, moves: Moves, ranges: Ranges, readers_of_site: dict) -> list[Quantizer]:
    """A quantizer per site some op reads, with its group's range and the group's other tensors."""
    activation_sites = []
    for t in ranges.sites:
        if readers_of_site.get(t):
            root = moves.groups.find(t)
            site = Quantizer.activation(t, inputs.m.types.get(t, TensorProto.FLOAT), ranges.group_range[root], readers_of_site[t],
                                        sorted(x for x in ranges.members[root] if x != t))
            site.anchors = sorted(x for x in ranges.members[root] if x in moves.chain_ends)
            activation_sites.append(site)
    return activation_sites


def _add_weight(inputs: Inputs, weight_sites: dict[str, Quantizer], n: onnx.NodeProto, slot: int, t: str,
                values: np.ndarray, headroom: int) -> None:
    axis_of = inputs.rules.weight_axis or weight_axis
    axis = axis_of(n, slot, values.ndim)
    site = weight_sites.get(t)
    if site is None:
        weight_sites[t] = Quantizer.weight(t, inputs.m.constants[t].data_type, axis, headroom, values, [(n.name, slot)])
        return
    if site.axis != axis:  # one tensor, two layouts (a weight shared by different ops)
        site.axis = None
    site.headroom_bits = max(site.headroom_bits, headroom)
    site.readers.append((n.name, slot))


def per_channel_depthwise(inputs: Inputs, kept: Kept, activation_sites: list[Quantizer]) -> None:
    """Reads the records' per-channel max |x|. Quantizes per channel the data input of depthwise
    Convs when it is their only reader, not shared or excluded (NNCF's CPU q8_a_ch)."""
    m, dims = inputs.m, inputs.constant_dims
    for site in activation_sites:
        stats = getattr(inputs.records.get(site.tensor), "stats", None)
        peak = None if stats is None or stats.axis != 1 else stats.channel_absmax
        if peak is None or site.shared_with or site.tensor in kept.tensors:
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


def _feeds_zero_point_free(inputs: Inputs, tensors: list[str]) -> bool:
    """Whether an op `Rules.zero_point_free` names reads one of `tensors` as its data input, directly or through ops a
    quantizer moves up through (Rules.forwards): its runtime runs it in int8 only on a grid without a zero point."""
    rules, readers = inputs.rules, inputs.m.readers
    if not rules.zero_point_free:
        return False
    todo, seen = list(tensors), set(tensors)
    while todo and len(seen) < 256:
        for r, slot in readers.get(todo.pop(), ()):
            if slot == 0 and rules.zero_point_free(inputs.m, r):
                return True
            if rules.forwards(r.op_type):
                for o in r.output:
                    if o and o not in seen:
                        seen.add(o)
                        todo.append(o)
    return False


def attach_policies(inputs: Inputs, placed: Sites, policies: Policies, recompute, report: Report, stretch: bool = False) -> None:
    """Each quantizer's policy (later rules win); an activation whose policy has other bits than
    8 gets its threshold searched again for that grid (`recompute(tensor, policy)`), and an
    asymmetric one its calibrated [min, max] (over its shared-range group); with `stretch` (the rules' `stretched_tails`,
    not on a transformer: ppocrv3_rec_japan lost 1.4 dB) a range stretched to its group's calibrated [min, max] where
    `stretched` says. Warns of the policies' unused rules."""
    records = inputs.records
    ops = {name: n.op_type for name, n in inputs.m.nodes.items()}
    for site in placed.activations:
        nodes = [name for name, _ in site.readers]
        site.policy = policies.for_quantizer("activations", site.tensor, nodes, [ops[n] for n in nodes])
        group = [t for t in [site.tensor, *site.shared_with] if t in records]
        if site.policy.bits != 8 and recompute is not None and group:
            site.range = Range(max(recompute(t, site.policy) for t in group), site.range.unsigned)
        if site.policy.symmetric is not True and group:
            spans = [t for t in site.anchors if t in records] or group
            site.low = min(float(records[t].min) for t in spans)
            site.high = max(float(records[t].max) for t in spans)
            if site.policy.symmetric is None:  # auto: the finer grid, per tensor
                symmetric = (site.channel_amax is not None or _feeds_zero_point_free(inputs, [site.tensor, *site.shared_with])
                             or choose_symmetry(site.range.amax, site.low, site.high, site.policy.bits))
                site.policy = replace(site.policy, symmetric=symmetric)
            if site.policy.symmetric is False and site.channel_amax is None and len(spans) == 1:
                top = asymmetric_top(records[spans[0]], site.low, site.range.amax, site.high, site.policy.bits)
                if top > site.range.amax:  # the grid's top; its bottom stays the calibrated minimum (|min| < amax)
                    site.range = Range(top, site.range.unsigned)
        if stretch and site.channel_amax is None and group:
            site.range = stretched(site, [records[t] for t in group])
    for site in placed.weights:
        nodes = [name for name, _ in site.readers]
        site.policy = policies.for_quantizer("weights", site.tensor, nodes, [ops[n] for n in nodes])
    report.warnings += policies.unused()


# a DynamicQuantizeLinear input whose typical channel (median peak |x| over its channels) stays under this many steps
# of the model's own grid: the model rounds most channels' every value to -1, 0 or 1 step (t5_title_encoder's FFN
# products in 4 blocks of 8: median peaks 0.17-0.47 steps, the step set by outlier channels of 1e3-1e4), and its
# outputs carry that (2.4 dB from its float reading). Its other inputs: 2.3-80 steps. tests/zoo.py
# dynamic_outlier_encoder_like at 1.65 steps (gain 150) was nearer the model smoothed (20.0 dB against 17.8)
CRUSHED_STEPS = 1.0


def model_grids(inputs: Inputs, placed: Sites, report: Report) -> int:
    """A model onnxruntime quantized dynamically (read as float: qtool.model.dynamic.ModelGrids) whose own
    DynamicQuantizeLinear grids crush some input (`crushed`: most of its channels rounded to -1, 0 or 1 step): its
    outputs carry its own rounding far from its float reading (t5_title_encoder: 2.4 dB) through every later layer,
    and it is scored against that arithmetic (the model as given), so the file rounds as it does. Every input those
    nodes quantize is `stated`: SmoothQuant leaves their layers alone (smoothed, the file rounds other values, nearer
    the float reading and away from the model); and each int8 weight whose integers qtool's signed grid holds exactly
    (per tensor or per channel) takes that grid, `stated`: the model's integers, no GPTQ. t5_title_encoder in
    OpenVINO's run against the model as given: 2.5 dB before, 6.1 with its four crushed inputs' layers alone
    unsmoothed, 10.3 with all 32 (docs/benchmarks.md#dynamic-grids). Where none is crushed the model stays near its
    float reading and nothing changes (tashkeel, voicefilter: their weights' own grids cost 0.1-0.7 dB against
    qtool's per channel; tests/zoo.py dynamic_outlier_encoder_like at gain 40: 27.6 dB smoothed, 24.0 not). The
    activations keep qtool's calibrated grids: the model's own over the calibration's min and max (it takes each
    run's) ran further from it (9.1 dB). How many quantizers are the model's."""
    grids = dynamic.model_grids(inputs.m.proto)
    if grids is None:
        return 0
    own = [site for site in placed.activations if any(t in grids.activations for t in [site.tensor, *site.shared_with])]
    if not any(crushed(inputs.records[t]) for site in own for t in [site.tensor, *site.shared_with] if t in inputs.records
               and t in grids.activations):
        return 0
    for site in own:
        site.stated = True
    taken = len(own)
    for site in placed.weights:
        how = grids.weights.get(site.tensor, "")
        if how and _on_grid(site.values, site.axis if how == "per_channel" else None):  # not smoothed since
            site.policy = replace(site.policy, bits=8, signed=True, symmetric=True, per_channel=how == "per_channel")
            site.stated = True
            taken += 1
    if taken:
        report.warnings.append(f"{taken} quantizer(s) are the model's own: its DynamicQuantizeLinear grids round most channels "
                               "of some inputs to a few codes, so the file rounds as the model does (no SmoothQuant on the inputs "
                               "it quantizes, its int8 weights' integers as they are)")
    return taken


def _on_grid(values, axis: int | None) -> bool:
    """Whether `values` are integers times peak |values| / 127 (per tensor, or per channel along `axis`): the model's
    int8 weights as the float reading has them, not rescaled since (SmoothQuant folds its scales into a layer's weight)."""
    if values is None:
        return False
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or not np.all(np.isfinite(v)):
        return False
    if axis is None:
        peak = np.abs(v).max()
    else:
        peak = np.abs(v).max(axis=tuple(i for i in range(v.ndim) if i != axis % v.ndim), keepdims=True)
    if not np.all(peak > 0):
        return False
    codes = v * (127.0 / peak)
    return bool(np.abs(codes - np.rint(codes)).max() < 1e-3)


def crushed(record) -> bool:
    """Whether a DynamicQuantizeLinear's grid over this tensor's calibrated range (zero included: the model's own,
    uint8 with a zero point) leaves its typical channel fewer than CRUSHED_STEPS steps: the median of the per-channel
    peaks |x| (calibrate's SmoothQuant statistics; none recorded: False) under CRUSHED_STEPS times that step."""
    peaks = getattr(getattr(record, "stats", None), "channel_absmax", None)
    if not peaks:
        return False
    step = (max(float(record.max), 0.0) - min(float(record.min), 0.0)) / 255.0
    peak = np.asarray(peaks, dtype=np.float64)
    peak = peak[np.isfinite(peak)]
    if not (peak.size and step > 0 and np.isfinite(step)):
        return False
    return bool(np.median(peak) < CRUSHED_STEPS * step)


def stretched(site: Quantizer, records: list) -> Range:
    """The range of an activation quantizer `site` (per tensor, its policy attached) over the tensors of its group
    (`records`), stretched to cover the group's calibrated [min, max] when thresholds.stretches says (each record with
    per-sample statistics: the typical peak is the largest of the members' means over samples of their max |x|): max |x|
    for a symmetric grid, [min, max] for an asymmetric one; its grid choices stay. Held out in OpenVINO's run: table_cls
    9.5 -> 11.8 dB (NNCF 11.0), spindle_ieeg 41.7 -> 43.3, trueocr_rec 27.5 -> 29.0, none of silero_v5_encoder's; ppocrv5_det's
    mask IoU 0.9037 -> 0.9033 (docs/benchmarks.md#fid16-stretch, #fid17-extreme)."""
    stats = [getattr(r, "stats", None) for r in records]
    if not records or any(s is None or not s.count for s in stats):
        return site.range
    params = site.params()
    low, high = float(np.min(params.input_low)), float(np.max(params.input_high))
    top, bottom = max(float(r.max) for r in records), min(float(r.min) for r in records)
    reach = max(high, -low)
    over = max(top / high if high > 0 else 0.0, bottom / low if low < 0 else 0.0)  # > 1: a side clips
    if not thresholds.stretches(max(s.mean_absmax for s in stats), reach, over * reach):
        return site.range
    return Range(max(top, -bottom, site.range.amax), site.range.unsigned)


def asymmetric_top(record, low: float, amax: float, high: float, bits: int = 8) -> float:
    """The top of an asymmetric grid [low, top] over a tensor whose threshold `amax` (searched for a symmetric grid,
    which clips both grids alike: policy.choose_symmetry) lies between -low and its maximum `high`: the top in [amax,
    high] with the least expected squared error, rounding (step^2 / 12 per value in range) plus the clipped values'
    (x - top)^2, from its |x| histogram, whose bins above -low hold positive values alone. The asymmetric grid's finer
    step is then spent on clipping less: lore_detect's heads' shared input, [-5.4, 15.9] calibrated, was [-5.5, 10.6]
    (OpenVINO's run 13.4 -> 16.0 dB; docs/benchmarks.md#asymmetric-top). `amax` where nothing is to gain."""
    counts = np.asarray(record.counts, dtype=np.float64)
    if not (low < 0 and high > amax > -low) or counts.size == 0 or not (record.hist_range > 0) or counts.sum() <= 0:
        return amax
    width = record.hist_range / counts.size
    centres = (np.arange(counts.size) + 0.5) * width
    total = counts.sum()
    best, least = amax, None
    for top in np.linspace(amax, min(high, record.hist_range), 65):
        step = (top - low) / (2 ** bits - 1)
        over = centres > top
        err = (total - counts[over].sum()) * step * step / 12 + float((counts[over] * (centres[over] - top) ** 2).sum())
        if least is None or err < least:
            best, least = float(top), err
    return best
