"""The overflow guard for CPUs without VNNI: which int8 layers' u8 x s8 pair sums can saturate
int16 (qtool.quantizers.overflow estimates it) and the target's remedy for each: uint8 weights
(onnxruntime), pair-bounded weight steps, an input held to 7-bit codes or an image's paired input
channels negated (OpenVINO), or FP32;
or, with --weights-7bit first/all, the layers given 7-bit weights."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import numpy as np
import onnx

from ...model import graph as G
from ...model import prequantized
from ...statistics import noise
from .. import grids, overflow, patterns, policy
from ..policy import quantize
from ..quantizer import Quantizer, Range
from .moves import Moves
from .requests import Requests
from .sites import Sites
from .state import Inputs

# a MatMul of two activations (Q.K^T) stays FP32 where its estimated saturation noise passes this share of its rounding noise
# (its remedy within int8, 7-bit codes for B, would more than double that noise); measured per layer in OpenVINO on an
# AVX2 CPU (bench/saturation.py), MiniLM's Q.K^T estimated at -15 to -19 dB saturate at -5 to -20 dB, without a trace in
# the output (AVX2 and exact 28.4 dB)
ACTIVATIONS_RISK = 0.1
# where widening a layer's weights adds more than this share of its rounding noise (and saturation would cost more), the
# weights widen and the 7-bit input is not weighed against them: there its estimate misleads (ViT-S's patch embedding:
# -0.6 dB of the layer's noise by the estimate, 4 dB lost at the output). Such layers were kept FP32 before: int8, as
# NNCF runs them, cost PP-OCRv5 cls's squeeze-excitation conv 0.09 dB (bench/guard_cost.py)
WIDEN_COST = 1.0
# a 7-bit input's added noise counts this share against widened weights': an input's rounding error is independent value
# to value, and what comes after (pooling, LayerNorm's mean, attention) averages it down, where a widened weight errs
# alike at every position. bench/guard_cost.py on 8 real image models: where the two estimates lay 0.8 dB apart
# (PP-OCRv6 rec's stem) the 7-bit input came out 2.6 dB ahead at the output; where 1.9 dB or more (MTCNN, PP-OCR det
# and cls stems) the widened weights did, by 0.2 to 2.5 dB
INPUT_NOISE_WEIGHT = 0.75
# a layer of a model shipped quantized goes FP32 where its estimated saturation noise passes this share of its rounding
# noise (_shipped; ACTIVATIONS_RISK's share: about 0.4 dB of the layer's noise)
SHIPPED_RISK = 0.1


def remedies(inputs: Inputs, asked: Requests, moves: Moves, placed: Sites, remedy: str, weights_7bit: str | None) -> dict:
    """Reads the placed quantizers (with their policies) and the calibration records. Decides
    {"mode": weights_7bit or "auto", "layers": {layer: {"remedy": "uint8 weights" |
    "pair-bounded weights" | "7-bit input" | "flipped input channels" | "widened second input" | "fp32" | "7-bit weights",
    "why": ...}}}. Mode "auto" (`guard`) edits the quantizers it remedies; its FP32 layers are only
    listed (place() places again without them)."""
    mode = weights_7bit or "auto"
    if mode == "auto":
        layers = guard(inputs, asked, moves, placed, remedy)
    else:
        layers = {name: {"remedy": "7-bit weights", "why": f"--weights-7bit {mode}"}
                  for w in placed.weights if w.headroom_bits for name, _ in w.readers}
    return {"mode": mode, "layers": dict(sorted(layers.items()))}


def guard(inputs: Inputs, asked: Requests, moves: Moves, placed: Sites, remedy: str) -> dict[str, dict]:
    """Give the layers whose u8 x s8 pair sums can saturate (qtool.quantizers.overflow) the target's
    remedy. "uint8" (onnxruntime): weights stored as uint8 with zero point 128, the same values,
    which onnxruntime multiplies with its u8 x u8 kernels, exactly, on every CPU; wherever the
    saturation noise reaches 1 % of the layer's own rounding noise. "pairs" (OpenVINO, whose int8
    kernels take s8 weights only): `_bound_pairs`. A MatMul of two activations (both targets):
    FP32 where overflow.assess_activations passes ACTIVATIONS_RISK. {layer: {"remedy", "why"}}."""
    weights = {s.tensor: s for s in placed.weights}
    site_of = functools.partial(_site_of, inputs, moves, {s.tensor: s for s in placed.activations})
    raw = _raw_inputs(inputs)
    # the per-channel maxima bound a linear layer's input codes in transformers, where the bound was measured
    # (bench/guard_cost.py); calibrate records them for every model's linear inputs (SmoothQuant's decision), but
    # elsewhere the guard keeps its estimate from the histogram (unmeasured there: files unchanged)
    peaks = bool(patterns.transformer_structure(inputs.m))
    fixed: dict[str, dict] = {}
    for name in placed.int8_layers:
        n = inputs.m.nodes[name]
        wts = asked.weights_of.get(name, [])
        acts = asked.asks.get(name, [])
        if not wts and len(acts) == 2 and n.op_type == "MatMul":
            fix = _two_activations(site_of(acts[0]), site_of(acts[1]))
        elif not wts and not acts and inputs.own.pairs:
            fix = _shipped(inputs, n, raw, remedy, placed)
        elif len(wts) != 1 or len(acts) != 1:
            continue
        else:
            (slot, wt), t = wts[0], acts[0]
            site, record = site_of(t)
            wsite = weights.get(wt)
            if site is None or record is None or wsite is None or wsite.headroom_bits:
                continue
            if not peaks and n.op_type in ("MatMul", "Gemm") and getattr(record.stats, "channel_absmax", None) is not None:
                record = dataclasses.replace(record, stats=dataclasses.replace(record.stats, channel_absmax=None))
            fix = _weighted(inputs, moves, n, slot, wsite, site, record, t in raw, remedy, _sole_reader(inputs, moves, site, name))
        if fix is not None:
            fixed[name] = fix
    return fixed


def _shipped(inputs: Inputs, n: onnx.NodeProto, raw: set[str], remedy: str, placed: Sites) -> dict | None:
    """A layer of a model shipped quantized (qtool.model.prequantized: no quantizer of qtool's, its own int8 weights and
    input pair) whose u8 x s8 pair sums can saturate by the estimate (overflow.assess with the model's own codes and
    input grid): "uint8" (onnxruntime) past 1 % of its rounding noise, as `guard` for qtool's own weights: the model's
    weights become a weight quantizer of qtool's (appended to `placed`) holding the same integers and steps, stored as
    uint8 with zero point 128 (the same values; onnxruntime's u8 x u8 kernels). "pairs" (OpenVINO) past SHIPPED_RISK:
    FP32, where the layer computes the model's arithmetic exactly on its quantized input (the file writes its weights
    dequantized: qtool.targets.openvino); OpenVINO's remedies within int8 round again: the model's weights requantized on
    pair-bounded steps took madmom's onset CNN (onnxruntime's per-channel QDQ) from 55.8 to 37.5 dB in the simulation,
    u8 per tensor its run from 44.2 to 38.0 (docs/benchmarks.md#shipped-guard)."""
    if n.op_type not in ("Conv", "MatMul", "Gemm") or len(n.input) < 2 or not n.input[1]:
        return None
    weight = prequantized.weight_codes(inputs.m, n.input[1])
    grid = prequantized.activation_grid(inputs.m, n.input[0])
    record = inputs.records.get(n.input[0])
    if weight is None or grid is None or record is None:
        return None
    codes, scale, axis = weight
    act = grids.QParams(np.float64(grid[0]), np.int64(grid[1]), grids.grid(8, signed=grid[2]))
    dims = {**inputs.constant_dims, n.input[1]: list(codes.shape)}
    risk = overflow.assess(n, 1, codes.astype(np.int64), dims, record, act, correlated=n.input[0] in raw,
                           runtime="openvino" if remedy == "pairs" else "any")
    if risk is None:
        return None
    if remedy == "pairs" and risk.saturation > SHIPPED_RISK * risk.noise:
        return {"remedy": "fp32", "why": f"{risk.describe()}; the model's own int8 weights and input grid: FP32 computes them exactly"}
    if remedy != "uint8" or risk.saturation <= 0.01 * risk.noise or len(inputs.m.readers.get(n.input[1], ())) != 1 \
            or np.abs(codes.astype(np.int64)).max(initial=0) > 127:
        return None
    wsite = Quantizer.weight(n.input[1], inputs.m.types.get(n.input[1], onnx.TensorProto.FLOAT), axis, 0,
                             prequantized.dequantized(codes, scale, axis), [(n.name, 1)])
    # its step the model's (the largest |value| is 127 steps or fewer: the floor decides), so its integers the model's
    wsite.floor, wsite.stated, wsite.unsigned_storage = scale.astype(np.float64) * 127, True, True
    placed.weights.append(wsite)
    return {"remedy": "uint8 weights", "why": f"{risk.describe()}; the model's own int8 weights, as uint8"}


def _site_of(inputs: Inputs, moves: Moves, by_tensor: dict[str, Quantizer], t: str):
    """(the quantizer a layer's input `t` reads, moved up through pass-through ops, its record)."""
    site, upstream = None, t
    while site is None and upstream is not None:
        site = by_tensor.get(upstream)
        upstream = moves.upstream[upstream][0][2] if upstream in moves.upstream else None
    return site, inputs.records.get(t) or (inputs.records.get(site.tensor) if site else None)


def _two_activations(first, second) -> dict | None:
    """A MatMul of two activations ((quantizer, record) of each). Where calibration recorded both
    inputs' per-channel max |x| along the reduction (overflow.product_codes), B's step (the s8
    side, e.g. K^T) widens just enough that no pair of largest codes can pass int16
    (overflow.operand_ratio): the layer stays int8. Otherwise FP32 where the histogram estimate
    (overflow.assess_activations) passes ACTIVATIONS_RISK."""
    (a, rec_a), (b, rec_b) = first, second
    if None in (a, b, rec_a, rec_b):
        return None
    risk = overflow.assess_activations(rec_a, a.params(), rec_b, b.params())
    codes = overflow.product_codes(rec_a, a.params(), rec_b, b.params())
    symmetric_b = b.channel_amax is None and not np.any(b.params().zero_point)  # widening its range widens its step
    if risk is not None and codes is not None and a.channel_amax is None and symmetric_b:
        ratio = overflow.operand_ratio(*codes)
        if ratio <= 1:
            return None
        cost = risk.seven_bit * (ratio ** 2 - 1) / 3  # seven_bit: B's rounding noise at twice its step
        b.range = Range(b.range.amax * ratio, b.range.unsigned)
        return {"remedy": "widened second input", "why": (
            f"two activations: saturation noise {overflow.db(risk.saturation, risk.noise)} dB of the int8 noise by the histograms; "
            f"with the calibrated per-channel maxima a pair can pass int16, so its second input's step widens x{ratio:.2f}, "
            f"adding {overflow.db(cost, risk.noise)} dB")}
    if risk is not None and risk.saturation > ACTIVATIONS_RISK * risk.noise:
        return {"remedy": "fp32", "why": (
            f"two activations: saturation noise {overflow.db(risk.saturation, risk.noise)} dB of the int8 noise (7-bit "
            f"codes for its second input would add {overflow.db(risk.seven_bit, risk.noise)} dB)")}
    return None


def _weighted(inputs: Inputs, moves: Moves, n: onnx.NodeProto, slot: int, wsite: Quantizer, site: Quantizer, record,
              correlated: bool, remedy: str, sole: bool) -> dict | None:
    """A layer with one activation (quantizer `site`, `record`; `correlated`: a raw image; `sole`:
    the layer is the only one to read it) and one weight (`wsite`): the remedy for its saturation
    risk, if any (editing `wsite`, or `site`). OpenVINO: an image's first layer read by it alone
    weighs `_flipped_channels` first."""
    dims = inputs.constant_dims
    q = quantize(wsite.values, wsite.params(), wsite.policy.rounding)
    risk = overflow.assess(n, slot, q, dims, record, site.params(), correlated=correlated,
                           runtime="openvino" if remedy == "pairs" else "any")
    if risk is None:
        return None
    if remedy == "uint8" and risk.saturation > 0.01 * risk.noise:
        wsite.unsigned_storage = True
        return {"remedy": "uint8 weights", "why": risk.describe()}
    if remedy != "pairs":
        return None
    flipped = _flipped_channels(inputs, moves, n, slot, wsite, site, record, risk) if correlated and sole else None
    return flipped or _bound_pairs(n, slot, wsite, dims, record, site, risk, correlated, sole)


def _bound_pairs(n: onnx.NodeProto, slot: int, wsite: Quantizer, dims: dict, record, site: Quantizer, risk,
                 correlated: bool, sole: bool) -> dict | None:
    """OpenVINO's remedy for one layer (its int8 kernels take s8 weights only): the weight step
    of each output channel widened by the ratio `_channel_ratios` finds, at most up to the pair
    bound (overflow.pair_step), where no pair can saturate; or, where the layer alone reads its
    input (`sole`) and that costs less (counted at INPUT_NOISE_WEIGHT), the input's codes held to
    0..127 (`_seven_bit_input`), unless the widened weights would add more than WIDEN_COST of its
    rounding noise and saturation would cost more (typically an image's first layer, all of whose
    weights pair with their own sign, where no flip applies): those widen. The layer stays int8."""
    act = site.params()
    params = wsite.params()
    values = np.asarray(wsite.values, dtype=np.float64)
    layouts = overflow.reduction_rows(n, slot, values, dims, "openvino")
    if not layouts:
        return None
    outputs, length = layouts[0].shape[0], values.size // layouts[0].shape[0]  # the reduction length, padding left out
    codes = overflow.channel_codes(record, act, length) if n.op_type in ("MatMul", "Gemm") else None
    bound = _pair_bound(n, slot, values, dims, params, codes)
    if bound is None:
        return None
    amax, top = bound
    if not (top > 1 + 1e-9).any():
        return None
    pmf, mean_sq = overflow.activation_codes(record, act)
    if codes is not None or amax.ndim == 0:  # the per-channel maxima bound it (transformers), or one step for all rows
        ratio = top
        cost, sat = overflow.widening_noise(mean_sq, length, np.tile(np.broadcast_to(ratio, amax.shape), outputs // max(ratio.size, 1))), 0.0
        if codes is None and risk.saturation <= 0.01 * risk.noise:
            return None
    else:
        ratio, cost, sat = _channel_ratios(layouts[0], amax / params.grid.qmax, top, (pmf, mean_sq, length), correlated)
    widened = int((ratio > 1 + 1e-9).sum())
    if not widened:
        return None
    why = (f"{risk.describe()}; {widened} of {ratio.size} output channels' weight steps widened (up to x{float(ratio.max()):.2f}), "
           f"adding {overflow.db(cost, risk.noise)} dB, saturation noise left {overflow.db(sat, risk.noise)} dB")
    seven = _seven_bit_input(site, record, risk) if sole else None
    costly = cost + sat > WIDEN_COST * risk.noise and risk.saturation > cost + sat
    if seven is not None and not costly and INPUT_NOISE_WEIGHT * seven < cost + overflow.SATURATION_WEIGHT * sat:
        site.seven_bit_codes = True
        return {"remedy": "7-bit input", "why": (
            f"{risk.describe()}; its input's codes held to 0..127 (twice the step), adding {overflow.db(seven, risk.noise)} dB "
            f"(widening its weights' steps would add {overflow.db(cost, risk.noise)} dB and leave {overflow.db(sat, risk.noise)} dB)")}
    floor = amax * ratio
    wsite.floor = floor if wsite.floor is None else np.maximum(wsite.floor, floor)
    return {"remedy": "pair-bounded weights", "why": why}


def _pair_bound(n: onnx.NodeProto, slot: int, values: np.ndarray, dims: dict, params, codes) -> tuple[np.ndarray, np.ndarray] | None:
    """(amax of the weight quantizer `params` per channel, the ratio by which each channel's step
    must widen for no pair to pass int16 with input codes `codes`, at least 1: overflow.channel_step
    in OpenVINO's layout) of a layer's float weights `values`; None without pairs."""
    step = overflow.channel_step(n, slot, values, dims, params.axis, codes, "openvino")
    if step is None:
        return None
    amax = np.asarray(params.scale, dtype=np.float64) * params.grid.qmax
    return amax, np.maximum(step * params.grid.qmax / np.maximum(amax, np.finfo(np.float64).tiny), 1.0)


def _flipped_channels(inputs: Inputs, moves: Moves, n: onnx.NodeProto, slot: int, wsite: Quantizer, site: Quantizer,
                      record, risk: overflow.Risk) -> dict | None:
    """An image's first Conv (its input raw, read by it alone: checked by the caller; `risk` its
    estimate as the input is): the signs
    of its paired input channels (oneDNN adds channels 2p and 2p + 1 in one int16) with the
    weight steps widened where pairs can still saturate (`_channel_ratios`), all estimated with
    calibration's joint histograms of those pairs (overflow.joint_saturation) instead of one
    code for both: an image's channels move together, so where both products of a pair have one
    sign, negating one channel (and its weights) makes them opposite, and only strongly coloured
    pixels can still saturate. Every sign pattern is tried, both channels of a pair negated too:
    that keeps which products share a sign, but on an asymmetric grid it mirrors the codes (255 -
    q: a dark image's small codes become large ones, or the reverse), so it is a remedy of its own;
    on values spread evenly over the range (tests/test_overflow.py's ViT block on uniform noise) it
    changes next to nothing and is taken or not on the estimate's last decimal. Taken where some signs leave less noise than the channels as they
    are (by the same estimate); else None, and the other remedies decide as without those
    histograms. Needs an 8-bit input grid, symmetric (the negated values quantize to the negated
    codes) or, for a layer without padding (a ViT's patch embedding), asymmetric (offset - x with
    offset = input_low + input_high maps the range onto itself: code 255 - q, the bias takes
    offset x the flipped channels' weights; a layer reading the quantized tensor itself with explicit
    zero pads has them made a Pad before the flip, `_explicit_pads`: a torchvision ResNet's stem on an
    ImageNet-normalised image), 8-bit symmetric weights read by this layer alone, and the quantizer on a graph input
    (or a Cast of one: `_from_graph_input`) with only Transposes between it and the layer."""
    joint = getattr(getattr(record, "stats", None), "pairs", None)
    act, params = site.params(), wsite.params()
    flip = _flippable(inputs, n, slot, wsite, site, joint)
    if flip is None:
        return None
    offset, pads = flip
    values = np.asarray(wsite.values, dtype=np.float64)
    channels, dims = values.shape[1], inputs.constant_dims
    shape = _signs_shape(inputs, moves, site, n.input[0], values.ndim, channels)
    if shape is None or 2 * joint.pair_count() > channels:
        return None
    pmf, mean_sq = overflow.activation_codes(record, act)
    tried = []
    for pattern in itertools.product((1, -1), repeat=2 * joint.pair_count()):  # as they are first: kept on a tie
        signs = np.ones(channels)
        signs[: len(pattern)] = pattern
        flipped = values * signs.reshape(1, -1, *[1] * (values.ndim - 2))
        rows = overflow.reduction_rows(n, slot, flipped, dims, "openvino")[0]
        amax, top = _pair_bound(n, slot, flipped, dims, params, None)
        ratio, cost, sat = _channel_ratios(rows, amax / params.grid.qmax, top, (pmf, mean_sq, values.size // rows.shape[0]), True,
                                           functools.partial(overflow.joint_saturation, channels=channels, joint=joint, act=act,
                                                             signs=signs, offset=offset))
        tried.append((cost + overflow.SATURATION_WEIGHT * sat, cost, sat, ratio, signs))
    total, cost, sat, ratio, signs = min(tried, key=lambda x: x[0])
    if total >= tried[0][0]:
        return None
    site.channel_signs, site.flip_offset, site.flip_pads = signs.reshape(shape), offset, pads
    wsite.channel_signs, wsite.flip_offset = signs, offset
    widened = int((ratio > 1 + 1e-9).sum())
    if widened:
        wsite.floor = amax * ratio
    flipped = np.flatnonzero(signs < 0).tolist()
    return {"remedy": "flipped input channels", "why": (
        f"{risk.describe()}; input channel{'s' if len(flipped) > 1 else ''} {', '.join(map(str, flipped))} negated (and "
        f"{'their' if len(flipped) > 1 else 'its'} weights) and {widened} of {ratio.size} output channels' weight steps widened "
        f"(up to x{float(ratio.max()):.2f}): by the calibration pixels' channel pairs, {overflow.db(cost, risk.noise)} dB added "
        f"and {overflow.db(sat, risk.noise)} dB of saturation left, against {overflow.db(tried[0][1], risk.noise)} and "
        f"{overflow.db(tried[0][2], risk.noise)} dB with the channels as they are")}


def _flippable(inputs: Inputs, n: onnx.NodeProto, slot: int, wsite: Quantizer, site: Quantizer, joint) -> tuple | None:
    """(offset, explicit pads or None) where `_flipped_channels` may negate the input channels of
    layer `n`, else None: a Conv's input quantizer on a graph input, 8-bit per tensor, its weights
    8-bit symmetric per channel read by this layer alone, the pairs' joint histograms at hand. A
    negated value keeps a symmetric grid; an asymmetric one maps onto itself by offset - x, exact
    for a layer without padding (its padded zeros would stand for offset) or with its pads made
    explicit first: for an asymmetric grid with a zero point (a normalised image's signed range), as
    measured on anime-or-not; a never-negative input's unsigned grid (zero point 0) keeps its padded
    stem's other remedies."""
    act, params = site.params(), wsite.params()
    symmetric = act.grid.signed and not np.any(act.zero_point)
    pads = _explicit_pads(n, site) if not symmetric and np.any(act.zero_point) and not _unpadded(n) else None
    if (n.op_type != "Conv" or slot != 1 or joint is None or not joint.pair_count() or site.is_weight or site.channel_amax is not None
            or not _from_graph_input(inputs, site.tensor) or act.grid.levels != 256 or act.axis is not None
            or not (symmetric or _unpadded(n) or pads is not None) or len(wsite.readers) != 1
            or params.grid != grids.grid(8, signed=True, narrow=True) or np.any(params.zero_point) or params.axis is None):
        return None
    return (0.0 if symmetric else float(act.input_low + act.input_high)), pads


def _from_graph_input(inputs: Inputs, tensor: str) -> bool:
    """Whether `tensor` is a graph input, or one through Casts and zero Pads (a Caffe export's explicit padding):
    where the signs may multiply it (OpenVINO 2026.4 computes a Mul by per-channel float constants wrong between a
    Transpose and a FakeQuantize: MTCNN R-Net's stem at 3 dB; by int8 signs Cast to float it runs right,
    bench/openvino_quirks.py). Negation commutes with a Cast and with padding by zeros."""
    producer = inputs.m.producer
    while tensor in producer and (producer[tensor].op_type == "Cast" or patterns.zero_pad(inputs.m, producer[tensor])):
        tensor = producer[tensor].input[0]
    return tensor in inputs.m.inputs


def _unpadded(n: onnx.NodeProto) -> bool:
    """Whether a Conv pads nothing (no pads, or all zero, and no SAME auto_pad)."""
    return G.text_attr(n, "auto_pad", "NOTSET") in ("NOTSET", "VALID") and not any(G.attr(n, "pads", None) or ())


def _explicit_pads(n: onnx.NodeProto, site: Quantizer) -> tuple[int, ...] | None:
    """A Conv's explicit pads (auto_pad NOTSET) where it is the only reader of `site`'s tensor and reads it directly
    (no Transpose between: the pads are over the tensor's own axes); else None."""
    if G.text_attr(n, "auto_pad", "NOTSET") != "NOTSET" or n.input[0] != site.tensor or [r for r, _ in site.readers] != [n.name]:
        return None
    pads = tuple(int(p) for p in G.attr(n, "pads", None) or ())
    return pads if pads and any(pads) and min(pads) >= 0 else None


def _signs_shape(inputs: Inputs, moves: Moves, site: Quantizer, t: str, rank: int, channels: int) -> tuple[int, ...] | None:
    """The shape of per-channel signs (channels on axis 1 of the layer's input `t`) on the
    quantizer's tensor, through the Transposes its quantizer moved up through; None through other ops."""
    axis = 1
    while t != site.tensor:
        ups = moves.upstream.get(t)
        if not ups or len(ups) != 1:
            return None
        node = inputs.m.nodes[ups[0][0]]
        perm = G.attr(node, "perm") if node.op_type == "Transpose" else None
        if node.op_type == "Transpose" and perm is not None and len(perm) == rank:
            axis = int(perm[axis])
        elif node.op_type != "Identity":
            return None
        t = ups[0][2]
    shape = [1] * rank
    shape[axis] = channels
    return tuple(shape)


def _sole_reader(inputs: Inputs, moves: Moves, site: Quantizer, name: str) -> bool:
    """Whether layer `name` is the only node to read `site`'s quantized values, directly or
    through the pass-through ops the quantizer moved up through, and no other quantizer shares
    its range (another reader would pay a coarser input step too)."""
    todo, seen = [node for node, _ in site.readers], {site.tensor}
    while todo:
        node = todo.pop()
        moved = [o for o in inputs.m.nodes[node].output if o in moves.upstream]
        if node != name and not moved:
            return False
        seen.update(moved)
        todo.extend(r.name for o in moved for r, _ in inputs.m.readers.get(o, ()))
    return seen.issuperset(site.shared_with)


def _seven_bit_input(site: Quantizer, record, risk) -> float | None:
    """The rounding noise (units as overflow.Risk's) that holding a layer's input codes to 0..127
    (policy.seven_bit_codes: about twice the step) adds: the input's mean squared rounding error
    per value, from its histogram (`record`) at both steps (an image's values sit on its own
    8-bit levels, and text's on a white background, so it is often far from step^2 / 12), times
    sum(q^2) over the layer's integer weights (`risk`.weight_power); None where the input is not a
    per-tensor 8-bit activation with a float scale."""
    act = site.params()
    if site.is_weight or site.channel_amax is not None or act.grid.levels != 256 or site.policy.scale != "float":
        return None
    amax = float(max(act.input_high, -act.input_low))
    step = float(act.scale)
    errors = [noise.histogram_error(record.counts, record.edges(), noise.lattice(s, limit=amax))
              for s in (step, float(policy.seven_bit_codes(act).scale))]
    if None in errors:
        return None
    return float(max(errors[1].noise - errors[0].noise, 0.0) / step ** 2 * risk.weight_power)


def _channel_ratios(rows: np.ndarray, step: np.ndarray, top: np.ndarray, stats: tuple, correlated: bool,
                    saturation=None) -> tuple[np.ndarray, float, float]:
    """Per output channel (`step`, `top` per channel; `rows` [outputs, reduction], row i of
    channel i % channels): the widening ratio of least expected noise
    (overflow.least_noise_ratios, `saturation` as there), the largest over a channel's rows; with
    the rounding and saturation noise it leaves (sums over rows)."""
    reps = rows.shape[0] // step.size
    steps = np.tile(step, reps)
    ratio = overflow.least_noise_ratios(rows, steps, np.tile(top, reps), stats, correlated, saturation).reshape(reps, step.size).max(axis=0)
    cost, sat = overflow.widened_noise(rows, steps, np.tile(ratio, reps), stats, correlated, {}, saturation)
    return ratio, float(cost.sum()), float(sat.sum())


def _raw_inputs(inputs: Inputs) -> set[str]:
    """Tensors computed from a float graph input by no linear layer (the image itself, up to
    preprocessing): their neighbouring channels and positions move together."""
    raw = {i.name for i in inputs.m.graph.input if inputs.m.types.get(i.name) in inputs.float_types}
    for n in inputs.m.graph.node:
        if n.op_type not in inputs.rules.linear and any(t in raw for t in n.input):
            raw.update(o for o in n.output if o)
    return raw
