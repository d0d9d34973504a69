"""Step 10: the LSTMs a target runs in int8 (`Rules.int8_lstm`: OpenVINO's CPU plugin), each as one
`RecurrentSite`, the numbers its writer stores.

OpenVINO's CPU plugin runs an LSTMSequence in int8 when its X is a dequantized u8 tensor, its initial
hidden state H a dequantized u8 tensor or a constant, and W and R int8 constants times a scale
(openvinotoolkit/openvino src/plugins/intel_cpu/src/transformations/cpu_opset/common/pass/
convert_fq_rnn_to_quantized_rnn.cpp). It then takes one scale and shift for the data, X's, and one
scale vector for the weights, W's: oneDNN's int8 RNN computes the gates from the u8 codes of X and of
the hidden state on that one grid and requantizes every step's hidden state onto it. So:

* the hidden state's grid: 8-bit, zero point 128, covering the calibrated max |h| (the LSTM's Y and
  Y_h, the state input's; 1 when none is recorded: o * tanh(c) stays in (-1, 1)) times one of WIDENINGS,
  the one of least estimated error (`gate_error`): a wider grid coarsens h (and Y, which the kernel
  outputs on it) but shrinks W / a toward R (below), which share one scale per unit; for an LSTM that grid leaves
  under its floor (below), also the NARROWER ones and its own h's (where a state input was calibrated wider), by the
  simulation (`_narrower`);
* X read through one FakeQuantize from its own range (its threshold, narrowed to the calibrated min or max on a
  side X does not reach, 0 on a code: `x_levels`) onto that grid, an affine re-encoding x' = a x + b that W / a and
  the bias (minus b times the rows of the stored W / a) undo exactly. NNCF quantizes X at its own range instead, which then holds the hidden state too:
  Silero VAD's ReLU input [0, 9] leaves no negative h (its hn at -6.6 dB), ddddocr's +-6.3 a step of
  0.05 for h (11.7 dB);
* W and R symmetric int8 with one scale per hidden unit, shared by the four gates, both directions,
  W and R: the plugin reads only W's scales and, from an ONNX LSTM (gates i, o, f, c), applies them to
  its reordered gates (f, i, c, o); with a scale per gate row, OpenVINO 2026.4 ran Silero VAD's LSTM
  alone at -1.5 dB from the file's arithmetic (a random one at 18 dB), with one per row or per direction
  it kept a bidirectional LSTM in f32; per unit it computes the file's numbers (150 dB:
  bench/openvino_quirks.py, case 5);
* the initial hidden state always read through a FakeQuantize onto the grid (the plugin reads its u8
  codes on X's grid), zeros made from X's shape where the LSTM has none: a state OpenVINO cannot fold
  into a constant (zeros of a dynamic batch, a graph input) and reads as float fails the plugin's
  pattern, and OpenVINO 2026.4 then refuses the int8 weights ("expects Constant for port 4"). Where X's batch
  is declared fixed the writer adds no state (OpenVINO folds such zeros to a constant, and a forward LSTM so
  fed ran 0.8-1.7 dB from the file; without one it computes the file's numbers).

On a CPU without VNNI (AVX2), oneDNN's int8 RNN (brgemm:avx2, the weights in 4-input blocks) multiplies
the u8 codes by the s8 weights with vpmaddubsw, whose sums of two products (inputs 2p and 2p + 1 of W's and
R's rows) saturate at int16, as in Conv and MatMul (uxlfoundation/oneDNN src/cpu/x64/brgemm/
jit_brgemm_kernel.cpp, dot_product; src/cpu/x64/rnn/rnn_brgemm_utils.cpp pads the reduction to 4). With
the guard (`pairs`: a file for any CPU) each hidden unit's scale widens until no pair of its rows' codes
sums past 128 on either sign (255 x 128 < 2^15): then those kernels compute the file's numbers exactly
(`pair_bound`). Measured with oneDNN capped at AVX2 on this VNNI CPU (ONEDNN_MAX_CPU_ISA=AVX2: the same
JIT kernels a Haswell runs); QEMU 7.2's Haswell cannot tell: it does not run OpenVINO's LSTM right, not
even in FP32 (tests/avx2.py).

An LSTM is left float, and the export's warnings and summary (`float_lstm`) say why, when its int8 arithmetic,
simulated in numpy over sequences drawn from X's calibrated histogram against the float LSTM (`simulate`: X's
FakeQuantize, the codes, the hidden state rounded at every step; an LSTM whose X is another's Y, `fed_by`, over that
one's simulated Y: drawn values are white noise where an LSTM's output is smooth), leaves less than MIN_SQNR_DB at its output (where
it cannot run, the one-step estimate `gate_error`, which also chooses the grid). The floor rises
by what a model output the LSTM reaches through a Sigmoid loses more than its logit (`sigmoid_tail`): a score far in
the sigmoid's tail has the logit's absolute error as its relative one (oww_hey_mycroft's wake-word score near 1e-5:
its second LSTM, 38-39 dB at its own output, cost the score 28 dB).
An LSTM is left float (as before) when the user excluded it, its input or its initial state, when its
input has no finite range or is not float32, when W or R is not a constant or not finite, when it has
sequence_lens, peepholes, clip, input_forget or the batch-first layout, or when it states its activations, even ONNX's
defaults (as tf2onnx does): OpenVINO 2026.4 runs such an LSTM as a TensorIterator in f32 (thai_oskut_ws),
so quantizing it would cost precision for nothing. Models below opset 9 (no ConstantOfShape) too.

Two int8 LSTMs of one direction, hidden size and input width (stacked bidirectional ones whose input is 2 x hidden:
brainmaze's seizure detector, 200 = 2 x 100; an ensemble's twin networks) OpenVINO 2026.4 ran with one primitive, the
first one's weights or quantization (its run -1.9..-0.4 dB where the file computes 28-34; bench/openvino_quirks.py
case 8): the CPU plugin's runtime cache keys an RNN by its data and weight descriptors, cell, activation and direction,
not by its scales (openvinotoolkit/openvino src/plugins/intel_cpu/src/nodes/rnn.cpp, RNNKey::hash and operator==
leave out `attr`). So each such LSTM after the first gets `pad` zero input features (the writer pads X before its
FakeQuantize and appends as many zero columns to W): the same numbers, a width no other int8 LSTM has, its own
primitive (case 8 with one zero feature: 149-150 dB, as with the cache off). Before, only the first ran in int8, the
others in f32 (tashkeel's ensemble 1.5x, the seizure detector 1.25x NNCF's latency).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ... import blas
from ...model import graph as G
from ...model import lazy
from ...statistics import noise
from .exclusions import Kept
from .state import Inputs

GRID_ZERO_POINT = 128  # the hidden state's grid: u8 codes, 128 the code of 0
LEVELS = 256
WEIGHT_MAX = 127  # symmetric narrow int8 codes
# without VNNI a pair of u8 x s8 products sums in int16: 255 x 128 = 32640 fits (either sign), so a pair's codes may sum to
# 128 of one sign; codes rounded from values summing to at most 127 steps sum to at most 128
PAIR_STEPS = 127
# the hidden state's grids tried, in multiples of its calibrated max |h|: a wider one coarsens h but lets W / a shrink
# toward R where X's range is wide (a = the grid's width / X's), and W and R share one scale per unit
WIDENINGS = (1.0, 1.5, 2.0, 3.0)
# grids narrower than the calibrated max |h| (of Y, Y_h and the state input), tried by the simulation (`_narrower`) with
# the grid of the LSTM's own h where a state input was calibrated wider, for an LSTM under its floor on the estimate's
# grid. voicefilter_lite's third LSTM (the zoo's h0 feeds drawn over +-1.07, its own h within +-0.32): simulated 18.8 dB
# on the state's range (float: 1.4x NNCF's latency on AVX2), 24.8 on 0.5 x, 29.2 on its own h's peak (0.30 x), so int8
# there: OpenVINO's run of the model's worst output 28.59 -> 28.50 dB (docs/benchmarks.md#lat16)
NARROWER = (0.5, 0.75)
# below it an LSTM stays float, by its simulated error (`simulate`; the estimate where it cannot run). An int8
# activation quantizer leaves 20-40 dB at a linear layer's output (the attention core's rule, MIN_SQNR_DB of its
# target): an LSTM in that range runs int8 as they do. tashkeel_rawi_v3's first LSTM (simulated 21.4 dB, 24.1 over its
# real calibration inputs) has no better int8 under the kernel's constraints (grids of 1-6 x max |h|, X's range clipped
# to 0.35-1 x, weight scales 0.3-1 x: 24.1 at best); float, it cost the model 1.3-1.7x NNCF's latency for 7.7 dB (24.8
# -> 32.5; NNCF 6.0). The floor was 27 on the one-step estimate, which reads 2-9 dB high where X's tail or the error
# carried through time count (a Student's t X: 25.0 estimated, 16.5 run)
MIN_SQNR_DB = 20.0
# the estimate reads the bulk of |x| and |h|, their smallest 99%: an LSTM's gates saturate at X's rare largest values (so
# their errors matter little there) and its output follows the typical steps; by power alone, a few large values hid the
# rounding of the typical ones (an embedding with 0.5% of its entries large: its LSTM at 35 dB by power, 16 by the bulk,
# the int8 file 14 dB below the float one; tests/test_recurrent.py test_lstm_whose_int8_costs_stays_float). Rare values
# past 1% of X's are in the bulk, and hide the rest again (the 95% bulk saw them, but called the VAD look-alike's LSTM
# 25 dB: it costs 1.6 dB there)
BULK = 0.99


@dataclass(frozen=True)
class RecurrentSite:
    """One LSTM run in int8: what its writer stores (a FakeQuantize of X from x_range onto grid, the int8
    W and R codes times `scale`, the new bias, a FakeQuantize of `state` onto grid)."""

    node: str
    x_range: tuple[float, float]  # the input's range (its threshold), mapped onto the grid
    grid: tuple[float, float]  # the 8-bit grid of the re-encoded input and the hidden state: -128 and 127 steps
    state: str | None  # the initial hidden state read through the grid; None: none, zeros made from X's shape
    w_codes: np.ndarray  # int8 [dirs, 4H, input]: W / a on the grid of `scale`
    r_codes: np.ndarray  # int8 [dirs, 4H, H]
    scale: np.ndarray  # float32 [1, 4H, 1]: one per hidden unit, repeated for the four gates
    bias: np.ndarray  # float32 [dirs, 8H]: B with b times the stored W / a taken out
    widened: float = 1.0  # the largest ratio by which `pair_bound` widened a unit's scale (1: none)
    pad: int = 0  # zero input features appended to X and zero columns to W: a primitive of its own in OpenVINO (module doc)


def _plain_lstm(node) -> bool:
    """An LSTM of the standard domain without what the int8 kernel does not compute."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
        return False
    if any(len(node.input) > k and node.input[k] for k in (4, 7)):  # sequence_lens (not measured), peepholes
        return False
    if G.attr(node, "clip") is not None or G.attr(node, "activations") is not None:
        return False
    return not int(G.attr(node, "input_forget", 0)) and not int(G.attr(node, "layout", 0))


def _constant(inputs: Inputs, t: str) -> np.ndarray | None:
    const = inputs.m.constants.get(t)
    if const is None:
        return None
    try:
        values = np.asarray(lazy.value(const), dtype=np.float64)
    except Exception:  # external data not loaded, damaged tensor: the LSTM stays float
        return None
    return values if np.all(np.isfinite(values)) else None


def lstm_sites(inputs: Inputs, kept: Kept, pairs: bool = False) -> tuple[list[RecurrentSite], dict[str, str]]:
    """The LSTMs to run in int8, in graph order, and those left float by their simulated error (node -> why); `pairs`:
    their weights' pairs bounded for CPUs without VNNI (`pair_bound`)."""
    m, out, floats = inputs.m, [], {}
    if G.default_opset(m.proto) < 9:  # the zero state is a ConstantOfShape
        return out, floats
    sequences: dict[str, np.ndarray] = {}  # LSTM node -> its simulated float Y [steps, batch, dirs x hidden]
    for node in m.graph.node:
        if not _plain_lstm(node) or node.name in kept.nodes:
            continue
        x = node.input[0]
        threshold = inputs.thresholds.get(x)
        if (x in kept.tensors or not inputs.quantizable_act(x) or m.types.get(x) != 1 or threshold is None
                or not np.isfinite(threshold.amax) or threshold.amax <= 0):
            continue
        w, r = (_constant(inputs, node.input[k]) for k in (1, 2))
        if w is None or r is None or w.ndim != 3 or r.ndim != 3 or w.shape[1] % 4:
            continue
        dirs, gates, hidden = w.shape[0], w.shape[1], w.shape[1] // 4
        bias = _constant(inputs, node.input[3]) if len(node.input) > 3 and node.input[3] else np.zeros((dirs, 2 * gates))
        if bias is None or bias.shape != (dirs, 2 * gates) or r.shape != (dirs, gates, hidden):
            continue
        state = _state_input(node)
        if state is not None and (state in kept.tensors or m.types.get(state) != 1):
            continue
        site, error = _best_site(inputs, node, threshold, state, w, r, bias, pairs)
        tail = sigmoid_tail(inputs, node)
        floor = MIN_SQNR_DB + (tail[1] if tail else 0.0)
        simulated, upstream = None, fed_by(m, x)
        fed = sequences.get(upstream.name) if upstream is not None else None
        if fed is not None and fed.shape[2] != w.shape[2]:
            fed = None  # X is not the whole Y of that LSTM (one direction of it, or beside other features): drawn
        if site is not None and error is not None:
            simulated, sequences[node.name] = simulate(site, w, r, bias, inputs.records.get(x), fed, reverse=_reverse(node))
        if simulated is not None and simulated < floor:  # under its floor on the estimate's grid: the narrower ones
            site, simulated = _narrower(site, simulated, inputs, node, threshold, w, r, bias, pairs, fed)
        measured = simulated if simulated is not None else error["sqnr_db"] if error is not None else None
        if site is not None and measured is not None and measured < floor:
            raised = f" ({MIN_SQNR_DB:g} + {tail[1]:.1f}: output {tail[0]!r} in a sigmoid's tail)" if tail else ""
            source = f"{upstream.name}'s simulated output" if fed is not None else "the calibration"
            how = (f"simulated over {SIM_BATCH} x {SIM_STEPS} steps from {source}; one step's estimate {error['sqnr_db']:.1f} dB"
                   if simulated is not None else "estimated from the calibration")
            floats[node.name] = (f"int8 error: {measured:.1f} dB SQNR at its output < {floor:.3g} dB{raised} ({how}: X {error['x_db']:.1f}, "
                                 f"h {error['h_db']:.1f}, W {error['w_db']:.1f}, R {error['r_db']:.1f}, Y {error['y_db']:.1f} dB)")
        elif site is not None:
            out.append(site)
    return _padded(out), floats


def _padded(sites: list[RecurrentSite]) -> list[RecurrentSite]:
    """`sites`, each LSTM that shares its (directions, hidden size, input width) with an earlier one given the fewest
    zero input features that make its width one no other site has (OpenVINO's runtime cache: module doc)."""
    def key(site: RecurrentSite, pad: int = 0) -> tuple[int, int, int]:
        dirs, gates, width = site.w_codes.shape
        return dirs, gates, width + pad

    natural = {key(site) for site in sites}
    used: set[tuple[int, int, int]] = set()
    out = []
    for site in sites:
        pad = 0
        if key(site) in used:
            pad = 1
            while key(site, pad) in used or key(site, pad) in natural:
                pad += 1
            site = replace(site, pad=pad)
        used.add(key(site, pad))
        out.append(site)
    return out


def _best_site(inputs: Inputs, node, threshold, state: str | None, w: np.ndarray, r: np.ndarray, bias: np.ndarray,
               pairs: bool) -> tuple[RecurrentSite | None, dict | None]:
    """The LSTM's int8 site on the hidden state's grid (of WIDENINGS) whose estimated error (`gate_error`) is least,
    with that estimate; without the histograms to estimate it, the grid of the calibrated max |h| and None."""
    records = inputs.records
    x_record, h_record = records.get(node.input[0]), records.get(node.output[0]) if node.output else None
    best, best_error = None, None
    for widen in WIDENINGS:
        site = _site(node.name, inputs, node, threshold, state, w, r, bias, pairs, widen)
        if site is None:
            return None, None
        error = gate_error(site, w, r, x_record, h_record)
        if error is None:
            return site, None
        if best_error is None or error["sqnr_db"] > best_error["sqnr_db"]:
            best, best_error = site, error
    return best, best_error


def _narrower(site: RecurrentSite, simulated: float, inputs: Inputs, node, threshold, w: np.ndarray, r: np.ndarray,
              bias: np.ndarray, pairs: bool, fed: np.ndarray | None) -> tuple[RecurrentSite, float]:
    """Of `site` (simulated at `simulated` dB) and the sites on NARROWER grids, the one of the highest simulated SQNR,
    with it. The estimate reads one step of the bulk, where a grid clipping h's rare peaks loses more through time than it
    says (tashkeel_bilstm's second LSTM: 0.75 x max |h| estimated best, simulated 27.2 dB against 32.3 on max |h|): a
    narrower grid is taken by the simulation only, and only for an LSTM that would otherwise stay float."""
    state, records = _state_input(node), inputs.records
    own = [records[t].absmax for t in node.output[:2] if t and t in records]
    state_peak = records[state].absmax if state is not None and state in records else 0.0
    widenings = set(NARROWER)
    if own and state_peak > max(own) > 0:  # a state input calibrated wider than the LSTM's own h: the grid of its own too
        widenings.add(max(own) / state_peak)
    for widen in sorted(widenings):
        other = _site(node.name, inputs, node, threshold, state, w, r, bias, pairs, widen)
        figure = simulate(other, w, r, bias, records.get(node.input[0]), fed, reverse=_reverse(node))[0] if other else None
        if figure is not None and figure > simulated:
            site, simulated = other, figure
    return site, simulated


def _state_input(node) -> str | None:
    """An LSTM's initial hidden state input (initial_h), or None where it starts from zeros."""
    return node.input[5] if len(node.input) > 5 and node.input[5] else None


def _reverse(node) -> bool:
    return G.text_attr(node, "direction", "forward") == "reverse"


def pair_bound(values: np.ndarray) -> np.ndarray:
    """Per row of `values` [..., rows, K] (K the reduction, in the kernel's order): the largest sum of one sign's parts
    of a pair of inputs 2p, 2p + 1 (an odd K's last input pairs with the kernel's zero padding)."""
    padded = np.concatenate([values, np.zeros(values.shape[:-1] + (values.shape[-1] % 2,))], axis=-1)
    pair = padded.reshape(values.shape[:-1] + (-1, 2))
    return np.maximum(np.clip(pair, 0, None).sum(-1), np.clip(-pair, 0, None).sum(-1)).max(axis=-1)


def x_levels(amax: float, unsigned: bool, seen: tuple[float, float] | None = None) -> tuple[float, float]:
    """The range X's FakeQuantize maps onto the grid's 256 codes: [0, amax] unsigned; signed, [-amax, amax] narrowed to
    the calibrated [min, max] (`seen`) on a side X does not reach, then widened to a step's multiple on each side of 0,
    so that x = 0 lands on a code (b times the stored W / a goes into the bias, `_site`). A symmetric [-amax, amax] put 0
    half way between codes 127 and 128: every zero of X read back half a step off (an embedding whose values are mostly
    0: tashkeel_rawi_v3's first LSTM alone at 18 dB, 31 with 0 on a code; tests/test_recurrent.py
    test_zero_of_the_lstm_input_lands_on_a_code). Signed X that stays mostly on one side (a log-mel input in [-9.9, 1.2]:
    voicefilter_embedder's first LSTM) wasted half the codes on the other: X's step twice as coarse, and a = the grid's
    width / X's range half as large, so W / a twice R, whose codes share W's scale per unit (its X alone 26.6 -> 31.5
    dB over the real inputs, R's codes 20.1 -> 27.0, the LSTM 20.2 -> 23.7; test_one_sided_lstm_input_keeps_its_codes).
    With X reaching both ends, -128 and 127 steps of amax / 127, as before."""
    if unsigned:
        return 0.0, float(amax)
    lo, hi = -float(amax), float(amax)
    if seen is not None and np.isfinite(seen[0]) and np.isfinite(seen[1]):
        lo, hi = max(lo, min(float(seen[0]), 0.0)), min(hi, max(float(seen[1]), 0.0))
    if not hi - lo > 0 or min(-lo, hi) >= amax * (LEVELS - 1 - GRID_ZERO_POINT) / GRID_ZERO_POINT:
        lo, hi = -float(amax), float(amax)  # both ends reached (to a step): the symmetric codes
        zero = GRID_ZERO_POINT
    else:
        zero = int(np.clip(np.rint(-lo / ((hi - lo) / (LEVELS - 1))), 0, LEVELS - 1))
    step = max(-lo / zero if zero > 0 else 0.0, hi / (LEVELS - 1 - zero) if zero < LEVELS - 1 else 0.0)
    return -zero * step, (LEVELS - 1 - zero) * step


def _site(name: str, inputs: Inputs, node, threshold, state: str | None, w: np.ndarray, r: np.ndarray,
          bias: np.ndarray, pairs: bool, widen: float = 1.0) -> RecurrentSite | None:
    records = inputs.records
    peaks = [records[t].absmax for t in (node.output[0] if node.output else "", node.output[1] if len(node.output) > 1 else "",
                                         state or "") if t and t in records]
    h_max = (max(peaks) if peaks else 1.0) * widen
    if not np.isfinite(h_max) or h_max <= 0:
        return None
    step = h_max / (LEVELS - 1 - GRID_ZERO_POINT)
    grid = (-GRID_ZERO_POINT * step, (LEVELS - 1 - GRID_ZERO_POINT) * step)
    x_record = records.get(node.input[0])
    x_range = x_levels(threshold.amax, threshold.unsigned, (x_record.min, x_record.max) if x_record is not None else None)
    a = (grid[1] - grid[0]) / (x_range[1] - x_range[0])
    b = grid[0] - a * x_range[0]
    dirs, gates = w.shape[:2]
    hidden = gates // 4
    w_a = w / a
    peak = np.maximum(np.abs(w_a).reshape(dirs, 4, hidden, -1).max(axis=(0, 1, 3)),
                      np.abs(r).reshape(dirs, 4, hidden, -1).max(axis=(0, 1, 3)))
    unit = np.where(peak > 0, peak / WEIGHT_MAX, 1.0)
    widened = 1.0
    if pairs:  # no pair of a unit's codes (its four gates' rows of W / a and R, both directions) past PAIR_STEPS of one sign
        bound = np.maximum(pair_bound(w_a).reshape(dirs, 4, hidden).max(axis=(0, 1)),
                           pair_bound(r).reshape(dirs, 4, hidden).max(axis=(0, 1))) / PAIR_STEPS
        widened = float(max((bound / unit).max(initial=1.0), 1.0))  # a unit without weights: bound 0, unit 1
        unit = np.maximum(unit, bound)
    scale = np.tile(unit, 4).reshape(1, gates, 1)
    w_codes = np.clip(np.rint(w_a / scale), -WEIGHT_MAX, WEIGHT_MAX)
    r_codes = np.clip(np.rint(r / scale), -WEIGHT_MAX, WEIGHT_MAX)
    scale32 = scale.astype(np.float32)
    new_bias = bias.copy()
    # x'= a x + b: (W / a) x' = W x + b (W / a) 1, with the W / a the file stores (its codes times the float32 scale)
    new_bias[:, :gates] -= b * (w_codes * scale32.astype(np.float64)).sum(axis=2)
    return RecurrentSite(name, (float(x_range[0]), float(x_range[1])), (float(grid[0]), float(grid[1])), state,
                         w_codes.astype(np.int8), r_codes.astype(np.int8), scale32, new_bias.astype(np.float32), widened)


def _moments(record, step: float, top: float) -> noise.HistogramError | None:
    """A record's |x| histogram on the lattice k * step, k <= top, up to its BULK quantile (None: no histogram)."""
    if record is None or record.hist_range <= 0 or not len(record.counts):
        return None
    counts = np.asarray(record.counts, dtype=np.float64)
    cum = np.cumsum(counts)
    if cum[-1] <= 0:
        return None
    last = int(np.searchsorted(cum, BULK * cum[-1]))
    return noise.histogram_error(counts[:last + 1], record.edges()[:last + 2], noise.lattice(step, top=top))


def gate_error(site: RecurrentSite, w: np.ndarray, r: np.ndarray, x_record, h_record) -> dict | None:
    """The estimated SQNR (dB) of the int8 LSTM `site`'s output (W, R its float weights), from the calibration's
    histograms of X (`x_record`) and of the hidden state (`h_record`, the LSTM's Y), their bulk (BULK): the relative
    error of the gates' pre-activations W x + R h (each input taken as independent of the others with its tensor's
    power E[x^2], E[h^2]: the error of a row k is |W_k|^2 E[ex^2] + |R_k|^2 E[eh^2], X's and h's rounding on their grids,
    + |W_k - W^_k|^2 E[x^2] + |R_k - R^_k|^2 E[h^2], the codes', W^ back in X's units, over the rows' |W_k|^2 E[x^2] +
    |R_k|^2 E[h^2]; taken to reach h as it is) plus Y's own rounding onto the grid, E[eh^2] / E[h^2]. "sqnr_db" all of
    them, "x_db", "h_db", "w_db", "r_db", "y_db" each part alone. None without both histograms."""
    x_step = (site.x_range[1] - site.x_range[0]) / (LEVELS - 1)
    h_step = (site.grid[1] - site.grid[0]) / (LEVELS - 1)
    zero = int(np.rint(-site.x_range[0] / x_step))  # X's code of 0: 0 unsigned, 128 symmetric (`x_levels`)
    top = LEVELS - 1 - GRID_ZERO_POINT if zero == GRID_ZERO_POINT else max(zero, LEVELS - 1 - zero)  # |x|'s last code
    x = _moments(x_record, x_step, top)
    h = _moments(h_record, h_step, LEVELS - 1 - GRID_ZERO_POINT)
    if x is None or h is None:
        return None
    a = (site.grid[1] - site.grid[0]) / (site.x_range[1] - site.x_range[0])
    scale = site.scale.astype(np.float64)
    w2, r2 = float((w * w).sum()), float((r * r).sum())
    dw = float(((w - site.w_codes * scale * a) ** 2).sum())
    dr = float(((r - site.r_codes * scale) ** 2).sum())
    signal = w2 * x.power + r2 * h.power
    if not signal > 0:
        return None
    if not h.power > 0:
        return None
    parts = {"x_db": w2 * x.noise, "h_db": r2 * h.noise, "w_db": dw * x.power, "r_db": dr * h.power}
    relative = {k: v / signal for k, v in parts.items()}
    relative["y_db"] = h.noise / h.power  # Y is the hidden state on the grid: its rounding is the output's own error
    out = {"sqnr_db": noise.sqnr_db(1.0, sum(relative.values()))}
    out.update({k: noise.sqnr_db(1.0, v) for k, v in relative.items()})
    return out


def sigmoid_tail(inputs: Inputs, node) -> tuple[str, float] | None:
    """The model output the LSTM `node` reaches whose SQNR its error costs most through a Sigmoid (through ops of
    G.MOVES), and that cost in dB (`tail_gain_db`), when above 0; None otherwise."""
    m = inputs.m
    seen, todo, worst = set(), [t for t in node.output if t], None
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in m.outputs:
            source = m.producer.get(t)
            while source is not None and source.op_type in G.MOVES and source.input:
                source = m.producer.get(source.input[0])
            if source is not None and source.op_type == "Sigmoid":
                gain = tail_gain_db(inputs.records.get(source.output[0]) or inputs.records.get(t))
                if gain is not None and gain > 0 and (worst is None or gain > worst[1]):
                    worst = (t, gain)
        for reader, _ in m.readers.get(t, ()):
            todo.extend(o for o in reader.output if o)
    return worst


def tail_gain_db(record) -> float | None:
    """How much lower (dB) a sigmoid's output y = 1 / (1 + e^-z) has its SQNR than its input z, for an error of z
    independent of z, from the calibration's histogram of y alone (z = log(y / (1 - y)) is y's): dy = y (1 - y) dz,
    so E[dy^2] / E[y^2] = E[dz^2] / E[z^2] * E[z^2] E[y^2 (1 - y)^2] / E[y^2]: the gain's square. Where y stays far in
    the tail (a detector's score at 1e-5 on inputs without what it detects: z near -11.5) the output's relative error
    is the logit's absolute one, 20 dB more than the logit's relative (oww_hey_mycroft: its second LSTM's int8 at 38 dB
    at its own output, 39 estimated, cost the wake-word score 28 dB); where y reaches 1 it is below 0 (a VAD's speech
    probabilities). None without a histogram of values in [0, 1]."""
    if record is None or record.min < 0 or record.max > 1 or record.hist_range <= 0 or not len(record.counts):
        return None
    counts = np.asarray(record.counts, dtype=np.float64)
    edges = record.edges()
    y = np.clip((edges[:-1] + edges[1:]) / 2, 1e-12, 1 - 1e-7)  # bin centres, z finite
    z = np.log(y / (1 - y))
    total, power = counts.sum(), (counts * y * y).sum()
    if not total > 0 or not power > 0:
        return None
    g2 = (counts * z * z).sum() / total * (counts * (y * (1 - y)) ** 2).sum() / power
    return float(10 * np.log10(g2)) if g2 > 0 and np.isfinite(g2) else None


# the simulation's sequences: SIM_BATCH of SIM_STEPS steps, X's values drawn from its calibrated histogram (seeded)
SIM_STEPS, SIM_BATCH, SIM_SEED = 32, 8, 0


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for any z


def _run(x: np.ndarray, w: np.ndarray, r: np.ndarray, bias: np.ndarray, on_grid=None) -> np.ndarray:
    """One forward direction of an ONNX LSTM (gates i, o, f, c; zero initial states) over x [steps, batch, input] in float64:
    its Y [steps, batch, hidden]; `on_grid` rounds the hidden state before the first step and after each (the int8
    kernel's, qtool.checks.simulate's Scan)."""
    hidden = r.shape[1]
    h, c = np.zeros((x.shape[1], hidden)), np.zeros((x.shape[1], hidden))
    if on_grid is not None:
        h = on_grid(h)
    b = bias[:4 * hidden] + bias[4 * hidden:]
    y = np.empty((x.shape[0], x.shape[1], hidden))
    for t in range(x.shape[0]):
        g = x[t] @ w.T + h @ r.T + b
        i, o, f, cand = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cand)
        h = _sigmoid(o) * np.tanh(c)
        if on_grid is not None:
            h = on_grid(h)
        y[t] = h
    return y


# ops that carry an LSTM's Y [steps, dirs, batch, hidden] to the next LSTM's X [steps, batch, dirs x hidden] without
# changing a value: Transpose and Reshape (torch), Squeeze (one direction), Slice, Squeeze and Concat of the directions
# (tf2onnx), Unsqueeze, Identity
_MOVES = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Slice", "Concat"})


def fed_by(m, t: str, depth: int = 16):
    """The LSTM whose Y tensor `t` is, its values only moved (through _MOVES, the hidden units the last axis: a
    Transpose keeping it last, a Concat on it, every input of which from that one LSTM); None otherwise."""
    source = m.producer.get(t)
    if source is None or depth <= 0:
        return None
    if source.op_type == "LSTM":
        return source if source.output and t == source.output[0] else None
    if source.op_type not in _MOVES or not source.input:
        return None
    # the units stay the last axis, so the directions' units come in turn (the order `simulate` gives its Y)
    perm = G.attr(source, "perm") if source.op_type == "Transpose" else None
    if perm is not None and list(perm)[-1] != len(perm) - 1 or source.op_type == "Concat" and G.attr(source, "axis") not in (-1, 2):
        return None
    data = [i for i in source.input if i] if source.op_type == "Concat" else [source.input[0]]
    found = [fed_by(m, i, depth - 1) for i in data]
    return found[0] if found[0] is not None and all(n is not None and n.name == found[0].name for n in found) else None


def _drawn(x_record, width: int) -> np.ndarray | None:
    """SIM_BATCH sequences of SIM_STEPS steps [steps, batch, width] of values drawn from X's calibrated histogram (seeded;
    uniform in a bin; a random sign where X has negative values, the one its calibrated min or max allows past the
    other's); None without a histogram."""
    if x_record is None or x_record.hist_range <= 0 or not len(x_record.counts):
        return None
    counts = np.asarray(x_record.counts, dtype=np.float64)
    if not counts.sum() > 0:
        return None
    rng = np.random.default_rng(SIM_SEED)
    n = SIM_STEPS * SIM_BATCH * width
    edges = x_record.edges()
    k = rng.choice(len(counts), size=n, p=counts / counts.sum())
    x = edges[k] + rng.random(n) * (edges[k + 1] - edges[k])
    if x_record.min < 0:  # a random sign, but where |x| passes the calibrated max (or -min) only the other side's
        sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        top, bottom = max(x_record.max, 0.0), -x_record.min  # past both (a bin's last values): the wider side's
        sign = np.where((x > top) & (x > bottom), 1.0 if top >= bottom else -1.0,
                        np.where(x > top, -1.0, np.where(x > bottom, 1.0, sign)))
        x = sign * x
    return x.reshape(SIM_STEPS, SIM_BATCH, width)


@blas.one_thread()  # 32 small products a step: BLAS's threads cost 15x beside other work (2.1 s -> 0.13 s)
def simulate(site: RecurrentSite, w: np.ndarray, r: np.ndarray, bias: np.ndarray, x_record,
             fed: np.ndarray | None = None, reverse: bool = False) -> tuple[float | None, np.ndarray | None]:
    """The SQNR (dB) of the int8 LSTM `site`'s Y against the float LSTM's (W, R, `bias` its float weights), and the
    float LSTM's Y [steps, batch, dirs x hidden] (its directions' units in turn, as the next LSTM reads them), over
    SIM_BATCH sequences of SIM_STEPS steps: `fed` (the simulated Y of the LSTM whose output X is: `fed_by`) or, without
    it, X's values drawn from its calibrated histogram (`_drawn`), both LSTMs from zero states, in float64: X through
    its FakeQuantize onto the grid (its clipping too, which the bulk estimate leaves out), the W and R codes times their
    unit scales, the hidden state rounded onto the grid at every step, so the error carried through time; a reverse
    direction (the second of a bidirectional LSTM, the one of a `reverse` LSTM) over the steps reversed. The estimate (`gate_error`) reads one step of the bulk: a Student's t X (3
    degrees) estimated at 25 dB ran int8 at 16.5 (simulated: 18.3; 16.9 while a reverse direction ran over the
    draws in forward order). Drawn values are white noise in time and across
    units where an LSTM's output, the hidden state, is smooth and correlated: over the zoo's 11 LSTMs fed by LSTMs the
    drawn simulation read 0.4-10.5 dB below the same LSTM over its real calibration inputs (voicefilter_embedder's
    second: 19.7 drawn, 30.2 real, so it stayed float), fed the simulated Y before it 3.6 below to 0.4 above (29.7;
    docs/benchmarks.md#lstm-fed-by-lstm; tests/zoo.py stacked_lstm_like: drawn 16.9, fed 29.0, real 24.1). (None, None)
    without a histogram of X and no `fed`."""
    x = fed if fed is not None else _drawn(x_record, w.shape[2])
    if x is None:
        return None, None
    (x_lo, x_hi), (lo, hi) = site.x_range, site.grid
    x_step, step = (x_hi - x_lo) / (LEVELS - 1), (hi - lo) / (LEVELS - 1)
    x_grid = lo + np.rint((np.clip(x, x_lo, x_hi) - x_lo) / x_step) * step  # X's FakeQuantize: its range onto the grid
    zero = np.rint(-lo / step)

    def on_grid(h: np.ndarray) -> np.ndarray:
        return (np.clip(np.rint(h / step) + zero, 0, LEVELS - 1) - zero) * step

    scale = site.scale.astype(np.float64)[0]
    w8, r8 = site.w_codes * scale, site.r_codes * scale
    b8 = site.bias.astype(np.float64)
    ref, err, ys = 0.0, 0.0, []
    for d in range(w.shape[0]):  # a reverse direction over the steps reversed, its Y back in time order
        order = slice(None, None, -1 if d or reverse else 1)
        y = _run(x[order], w[d], r[d], bias[d])
        y8 = _run(x_grid[order], w8[d], r8[d], b8[d], on_grid)
        ref, err = ref + float((y * y).sum()), err + float(((y - y8) ** 2).sum())
        ys.append(y[order])
    return (noise.sqnr_db(ref, err) if ref > 0 else None), np.concatenate(ys, axis=2)
