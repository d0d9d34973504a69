"""How good is the int8 model that ships: a target's export against FP32, per output and per quantizer.

The int8 model is the target's file (qtool.targets: a Q/DQ or FakeQuantize ONNX model), built in
memory by the target's writer with the export's options, and run as qtool.checks.simulate's exact
simulation of its arithmetic: the same number on every CPU. On request the real runtime on this
CPU runs the same file too (the target's runtime: OpenVINO, or onnxruntime's int8 kernels); its
numbers are reported beside the
simulation's, with a warning where they differ by more than RUNTIME_GAP_DB on an output. The
reference is the FP32 model. All statistics are float64 and accumulated over every sample, so they
do not depend on the batch size.

Per compared (float) model output:
  sqnr_db   10 log10(sum ref^2 / sum (ref - q)^2) over all elements of all samples.
            +inf when the int8 output equals the FP32 output exactly (no noise), -inf when the
            FP32 output is all zero and the int8 one is not, or the int8 output is NaN/inf
            where the FP32 one is finite. Elements where FP32 itself is NaN/inf are skipped
            (counted in `skipped`, their share of all in `skipped_share`); an output with no
            finite FP32 value at all is refused (a QtoolError naming it): it has nothing to
            compare, and its SQNR would read as +inf.
  cosine    sum(ref q) / (|ref| |q|) over everything; 1.0 when both are all zero, 0.0 when
            exactly one is.
  top1      share of samples whose argmax agrees, for outputs that look like class scores:
            shape [N, C] with C >= 2 once singleton axes after the batch axis are dropped.

Per quantizer (on request; the targets whose writers build any subset of their quantizers; "quantized tensor": every activation
quantizer and every weight quantizer of the placement): the model with only that quantizer
applied as the target's export writes it (a weight quantizer with the bias shift of the layers
reading it), simulated, its SQNR on each output, and the worst (lowest) of those as the tensor's
score; sorted worst first. JSON has no infinity, so
json_number() writes +inf/-inf as the strings "inf"/"-inf" (and NaN as "nan").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto

from .. import provenance, targets
from ..collection import collect
from ..errors import Opt, QtoolError, Words, opts
from ..model import graph as G
from ..model import prequantized, shapes, tensor_types
from ..model.writer import ModelFile
from ..options import DEFAULT_TARGET, ExportOptions, method
from ..quantizers import cpu_kinds, placement
from ..quantizers import patterns as P
from ..runtime import onnxruntime, openvino
from ..targets import TARGETS, branches, exporter
from . import simulate

Feeds = dict[str, np.ndarray]
Runs = Callable[[], Iterable[tuple[Feeds, int]]]  # a fresh iterator of (feeds, samples) per call

# Inputs and FP32 outputs of all runs are kept in memory up to this size, so the per-quantizer
# passes do not decode the inputs and run the FP32 model again; beyond it they do.
CACHE_BYTES = 512 << 20

RANKED = targets.ranked()  # targets whose writers build a model of any subset of quantizers (prepare/quantized)
RUNTIME_GAP_DB = 1.0  # runtime and simulation further apart than this on an output: a warning names the likely cause
_CAP_DB = 100.0  # SQNRs above this are float rounding alone (nothing quantized): no gap between them is reported
EXCHANGE_P = 0.05  # a gap as large in at least this share of the input-by-input swaps of run and simulation: drift, not a cause
_EXACT_SWAPS = 16  # up to this many inputs every swap is enumerated (2**16); beyond, EXCHANGE_DRAWS random ones
EXCHANGE_DRAWS = 4096


# ---------------------------------------------------------------- metrics


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise) for sums of squares; +inf without noise, -inf without signal."""
    signal, noise = float(signal), float(noise)
    if math.isnan(signal) or math.isnan(noise):
        return math.nan
    if noise == 0:
        return math.inf
    if signal == 0 or math.isinf(noise):
        return -math.inf
    if math.isinf(signal):
        return math.inf
    return 10.0 * (math.log10(signal) - math.log10(noise))


def cosine(dot: float, ref_sq: float, out_sq: float) -> float:
    """dot / (|ref| |out|): 1.0 when both are all zero, 0.0 when exactly one is."""
    if ref_sq == 0 and out_sq == 0:
        return 1.0
    if ref_sq == 0 or out_sq == 0:
        return 0.0
    value = float(dot) / (math.sqrt(ref_sq) * math.sqrt(out_sq))
    return max(-1.0, min(1.0, value)) if math.isfinite(value) else math.nan


def looks_like_class_scores(shape: tuple[int, ...]) -> bool:
    """[N, C] with C >= 2 once singleton axes after the batch axis are dropped."""
    if len(shape) < 2:
        return False
    rest = [d for d in shape[1:] if d != 1]
    return len(rest) == 1 and rest[0] >= 2


def json_number(value: float | None, digits: int = 4):
    """A JSON-safe number: rounded when finite, the strings 'inf', '-inf', 'nan' otherwise."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(value, digits)


def from_json_number(value) -> float | None:
    """Inverse of json_number (for files written by qtool evaluate --json)."""
    if value is None:
        return None
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number or 'inf'/'-inf'/'nan', got {value!r}")
    return float(value)


def format_db(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.2f}"


def _finite_pairs(r: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(r, o, skipped, broken): the pairs compared, where the reference `r` is finite (the others skipped) and the
    output `o` too (the others broken: the quantized model lost a finite value)."""
    finite = np.isfinite(r)
    skipped = int((~finite).sum())
    if skipped:
        r, o = r[finite], o[finite]
    ok = np.isfinite(o)
    broken = int((~ok).sum())
    if broken:
        r, o = r[ok], o[ok]
    return r, o, skipped, broken


class _Acc:
    """Float64 running sums comparing one output of the quantized model with FP32; with
    per_sample, also each sample's sum of ref^2 and of (ref - q)^2 for `gap_interval` (`rows`: None
    once an update's first axis is not its samples)."""

    def __init__(self, per_sample: bool = False):
        self.signal = self.noise = self.dot = self.out_sq = 0.0
        self.broken = 0  # elements where FP32 is finite and the int8 model's is not
        self.agree = self.top1_samples = 0
        self.samples = self.skipped = self.shape_mismatches = self.elements = 0
        self.classes = True
        self.rows: list[tuple[np.ndarray, np.ndarray]] | None = [] if per_sample else None

    def update(self, ref: np.ndarray, out: np.ndarray, count: int | None = None) -> None:
        if ref.shape != out.shape:
            self.shape_mismatches += 1
            self.rows = None
            return
        r = np.asarray(ref, dtype=np.float64).ravel()
        o = np.asarray(out, dtype=np.float64).ravel()
        if self.rows is not None:
            if ref.ndim == 0 or ref.shape[0] != count:
                self.rows = None
            else:
                r2, d2 = r.reshape(count, -1), (r - o).reshape(count, -1)
                self.rows.append((np.einsum("ij,ij->i", r2, r2), np.einsum("ij,ij->i", d2, d2)))
        self.samples += ref.shape[0] if ref.ndim else 1
        self.elements += r.size
        self.classes = self.classes and looks_like_class_scores(ref.shape)
        r, o, skipped, broken = _finite_pairs(r, o)
        all_finite = not skipped
        self.skipped += skipped
        self.broken += broken
        diff = r - o
        with np.errstate(over="ignore", invalid="ignore"):
            self.signal += float(np.dot(r, r))
            self.noise += float(np.dot(diff, diff))
            self.dot += float(np.dot(r, o))
            self.out_sq += float(np.dot(o, o))
        if self.classes and all_finite:
            n = ref.shape[0]
            a, b = ref.reshape(n, -1), out.reshape(n, -1)
            self.agree += int((np.argmax(a, axis=1) == np.argmax(b, axis=1)).sum())
            self.top1_samples += n

    def sqnr(self) -> float:
        if self.shape_mismatches and not self.samples:  # no run compared: nothing measured, not a perfect match
            return math.nan
        return -math.inf if self.broken else sqnr_db(self.signal, self.noise)

    def cosine(self) -> float:
        if self.shape_mismatches and not self.samples:
            return math.nan
        return math.nan if self.broken else cosine(self.dot, self.signal, self.out_sq)

    def top1(self) -> float | None:
        return self.agree / self.top1_samples if self.classes and self.top1_samples else None


@dataclass
class OutputMetrics:
    name: str
    sqnr_db: float
    cosine: float
    top1_agreement: float | None  # share of samples in 0..1, None when not class scores
    samples: int
    skipped: int = 0  # elements where FP32 itself was NaN/inf
    elements: int = 0  # elements compared or skipped

    @property
    def skipped_share(self) -> float:
        """The share of the FP32 output's elements that were NaN/inf and not compared (0..1)."""
        return self.skipped / self.elements if self.elements else 0.0

    def to_json(self) -> dict:
        return {
            "name": self.name, "sqnr_db": json_number(self.sqnr_db), "cosine": json_number(self.cosine, 6),
            "top1_agreement": json_number(self.top1_agreement, 6), "samples": self.samples, "skipped_nonfinite": self.skipped,
            "skipped_share": json_number(self.skipped_share, 6),
        }


@dataclass
class TensorSensitivity:
    """The model with only this tensor's quantizer applied, compared with FP32."""

    tensor: str
    kind: str  # "activation" or "weight"
    layers: list[str]  # compute nodes reading the quantizer (what --keep-fp32 keeps in FP32)
    outputs: dict[str, float]  # SQNR dB per compared output
    order: int = 0  # position in the placement (graph order), the tie-breaker
    range: dict | None = None  # activations: the amax/unsigned quantized with, tensors sharing it
    policy: str = ""  # the quantizer's policy (qtool.quantizers.policy.Policy.describe)

    @property
    def sqnr_db(self) -> float:
        values = list(self.outputs.values())
        if any(math.isnan(v) for v in values):
            return math.nan
        return min(values) if values else math.nan

    def to_json(self) -> dict:
        return {
            "tensor": self.tensor, "kind": self.kind, "sqnr_db": json_number(self.sqnr_db),
            "outputs": {k: json_number(v) for k, v in self.outputs.items()}, "layers": self.layers,
            **({"range": self.range} if self.range is not None else {}), "policy": self.policy,
        }


def _rank_key(t: TensorSensitivity):
    v = t.sqnr_db
    return (-math.inf if math.isnan(v) else v, t.order)


def _worst(outputs: list[OutputMetrics]) -> float:
    values = [o.sqnr_db for o in outputs]
    if any(math.isnan(v) for v in values):
        return math.nan
    return min(values) if values else math.nan


@dataclass
class RuntimeResult:
    """The same file run by a real runtime on this CPU (its int8 kernels), against FP32."""

    name: str  # "openvino" or "onnxruntime"
    outputs: list[OutputMetrics]
    vnni: bool | None  # qtool.quantizers.cpu_kinds.vnni() of this CPU: None when unknown
    float_precision: str = "f32"  # what the runtime ran the unquantized layers in
    cpu_kind: str | None = None  # this CPU's row of qtool.quantizers.cpu_kinds.KINDS, None when unknown
    default_float: str | None = None  # the precision the runtime would choose itself on this CPU (OpenVINO: bf16 with AVX-512 BF16/AMX)
    # per output, the 95 % interval of (runtime SQNR - simulation SQNR) over the inputs (gap_interval), None where it has none
    intervals: list[tuple[float, float] | None] = field(default_factory=list)
    fp32: list[OutputMetrics] = field(default_factory=list)  # the runtime running the FP32 model, against onnxruntime's FP32: its own floor
    own: list[OutputMetrics] = field(default_factory=list)  # the int8 run against the runtime's own FP32 run
    departures: list[Departure] = field(default_factory=list)  # where its run leaves the file most (asked when a gap is not its FP32's)
    # per output, the share of the input-by-input swaps of run and simulation with a gap as large (gap_exchange), None where it has none
    exchanges: list[float | None] = field(default_factory=list)

    @property
    def worst_sqnr_db(self) -> float:
        return _worst(self.outputs)

    def to_json(self) -> dict:
        outputs = [o.to_json() for o in self.outputs]
        for i, (o, interval) in enumerate(zip(outputs, self.intervals)):
            o["vs_simulation_db_95"] = None if interval is None else [json_number(v) for v in interval]
            o["vs_simulation_swaps"] = json_number(self.exchanges[i], 6) if self.exchanges else None
            o["fp32_sqnr_db"] = json_number(self.fp32[i].sqnr_db) if self.fp32 else None
            o["vs_own_fp32_sqnr_db"] = json_number(self.own[i].sqnr_db) if self.own else None
        return {"name": self.name, "sqnr_db": json_number(self.worst_sqnr_db), "outputs": outputs,
                "fp32_sqnr_db": json_number(_worst(self.fp32)) if self.fp32 else None,
                "vs_own_fp32_sqnr_db": json_number(_worst(self.own)) if self.own else None,
                "departures": [d.to_json() for d in self.departures],
                "cpu_vnni": self.vnni, "cpu_kind": self.cpu_kind, "float_precision": self.float_precision,
                "default_float_precision": self.default_float}


@dataclass
class Departure:
    """A quantized layer's output as the runtime computes it against the simulation's, with the same
    at the quantized tensors feeding it: where the run's departure from the file grows."""

    layer: str  # the node computing `tensor` (its producer, or the node above value-moving ops such as Cast)
    tensor: str  # what a quantizer of the file reads (a FakeQuantize's or QuantizeLinear's input)
    sqnr_db: float  # runtime vs simulation at `tensor`, over every input
    upstream_db: float  # the worst of that at the nearest quantized tensors upstream (+inf: none, the inputs are exact)

    @property
    def drop_db(self) -> float:
        return min(self.upstream_db, _CAP_DB) - min(self.sqnr_db, _CAP_DB)

    def to_json(self) -> dict:
        return {"layer": self.layer, "tensor": self.tensor, "sqnr_db": json_number(self.sqnr_db),
                "upstream_sqnr_db": json_number(self.upstream_db), "drop_db": json_number(self.drop_db)}


@dataclass
class Evaluation:
    outputs: list[OutputMetrics]  # the exact simulation of the target's file
    tensors: list[TensorSensitivity]  # worst first; empty when not asked for
    samples: int
    plan_summary: dict  # the export's summary
    not_compared: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    target: str | None = DEFAULT_TARGET  # None: a file qtool did not export
    runtime: RuntimeResult | None = None  # when a runtime was asked for

    @property
    def worst_sqnr_db(self) -> float:
        return _worst(self.outputs)

    @property
    def fp32_layers(self) -> list[str]:
        """The layers the export keeps in FP32."""
        return list(self.plan_summary.get("fp32_layer_names", []))


# ---------------------------------------------------------------- the quantized model


def ranked_exporter(target: str, what: str | Words = "the per-tensor ranking"):
    """The exporter module of a target that builds models of any subset of its quantizers."""
    if target not in RANKED:
        raise QtoolError("{what} is for {first}{others}, not {target}", what=what, first=Opt("target", RANKED[0]),
                         others="".join(f" or {t}" for t in RANKED[1:]), target=target)
    return exporter(target)


def prepare(loaded, cal, options: ExportOptions, what: str | Words = "the per-tensor ranking"):
    """(options.target's exporter module, its preparation of `loaded` with the export `options`)."""
    module = ranked_exporter(options.target, what)
    inside = branches.layers_inside(loaded.proto)
    if inside:  # its models are built from the main graph's placement (qtool.targets.branches)
        raise QtoolError("{what} reads the quantizers of the main graph only: this model's layers are inside If branches "
                         "({names}); export and evaluate it without", what=what,
                         names=", ".join(inside[:2]) + (f" and {len(inside) - 2} more" if len(inside) > 2 else ""))
    return module, module.prepare(loaded, cal, options)


def _with_sites(module, prepared, cal, activations: list, weights: list, bias_correction: bool = True) -> onnx.ModelProto:
    """The prepared model with only these quantizers, as the target's export writes them: a weight
    quantizer comes with the bias shift of the layers reading it (the rest of the model stays FP32)."""
    layers = [name for site in weights for name, _ in site.readers]
    return built(module, prepared, cal, placement.Plan(activations, weights, layers, {}, []), bias_correction)


def built(module, prepared, cal, plan: placement.Plan | None = None, bias_correction: bool = True) -> onnx.ModelProto:
    """The target's model of `plan` (default: the prepared one), in graph order, ready to simulate."""
    model, _, _ = module.quantized(prepared, cal, plan, bias_correction)
    G.toposort(model.graph)
    return model


def compute_layers(model: onnx.ModelProto, readers: list[tuple[str, int]], rules) -> list[str]:
    """The compute nodes (Conv, Gemm, Add, pooling ...) that end up reading a quantizer read by
    `readers`: the ops the target's placement `rules` (qtool.quantizers.rules.Rules) moved it above are
    followed down to them."""
    index = G.Index(model)
    found: list[str] = []
    seen: set[str] = set()
    stack = [name for name, _ in readers]
    while stack:
        name = stack.pop(0)
        if name in seen:
            continue
        seen.add(name)
        n = index.nodes.get(name)
        if n is None:
            continue
        if P.standard(n) and rules.forwards(n.op_type):
            for o in n.output:
                stack.extend(c.name for c, _ in index.readers.get(o, ()))
        else:
            found.append(name)
    return found


# ---------------------------------------------------------------- running


class _Reference:
    """(feeds, samples, FP32 outputs) of every run, cached while small (see CACHE_BYTES); `proto`: the FP32 model, for
    errors that name its nodes."""

    def __init__(self, runs: Runs, session, names: list[str], budget: int = CACHE_BYTES, proto: onnx.ModelProto | None = None):
        self.runs, self.session, self.names, self.budget, self.proto = runs, session, names, budget, proto
        self.cached: list | None = None
        self.passes = 0

    def __iter__(self) -> Iterator[tuple[Feeds, int, list[np.ndarray]]]:
        if self.cached is not None:
            yield from self.cached
            return
        cache: list | None = [] if self.passes == 0 else None
        size = 0
        self.passes += 1
        for feeds, count in collect.prefetch(self.runs()):
            ref = onnxruntime.run(self.session, self.names, feeds)
            if cache is not None:
                size += sum(v.nbytes for v in feeds.values()) + sum(np.asarray(r).nbytes for r in ref)
                cache = cache if size <= self.budget else None
                if cache is not None:
                    cache.append((feeds, count, ref))
            yield feeds, count, ref
        if cache is not None:
            self.cached = cache

    def feeds(self) -> Iterator[Feeds]:
        """Every run's feeds, without its FP32 outputs (cached or not)."""
        if self.cached is not None:
            yield from (feeds for feeds, _count, _ref in self.cached)
            return
        for feeds, _count in collect.prefetch(self.runs()):
            yield feeds


def _inputs(session) -> set[str] | None:
    """The names of the inputs a session takes (onnxruntime's, or an openvino.Session's), None when unknown."""
    if hasattr(session, "get_inputs"):
        return {i.name for i in session.get_inputs()}
    return None


def _compare(reference: _Reference, session, names: list[str], per_sample: bool = False) -> tuple[list[_Acc], int]:
    accs = [_Acc(per_sample) for _ in names]
    samples = 0
    takes = _inputs(session)
    for feeds, count, ref in reference:
        if takes is not None:  # an input no node reads, which the exported file or its runtime dropped: not fed
            feeds = {k: v for k, v in feeds.items() if k in takes}
        out = onnxruntime.run(session, names, feeds)
        for acc, r, o in zip(accs, ref, out):
            acc.update(np.asarray(r), np.asarray(o), count)
        samples += count
    return accs, samples


def _paired(simulated: _Acc, measured: _Acc) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per sample (signal, simulation's noise, runtime's noise), in one canonical order (input order and batch size
    do not enter), or None without per-sample sums of both over the same samples, or with a non-finite one."""
    if simulated.rows is None or measured.rows is None or not simulated.rows:
        return None
    sig = np.concatenate([r[0] for r in simulated.rows])
    n_sim = np.concatenate([r[1] for r in simulated.rows])
    n_run = np.concatenate([r[1] for r in measured.rows])
    sig_run = np.concatenate([r[0] for r in measured.rows])
    if len(n_run) != len(sig) or not np.array_equal(sig, sig_run) or not all(np.isfinite(v).all() for v in (sig, n_sim, n_run)):
        return None
    order = np.lexsort((n_run, n_sim, sig))
    return sig[order], n_sim[order], n_run[order]


def gap_interval(simulated: _Acc, measured: _Acc, draws: int = 1000) -> tuple[float, float] | None:
    """The 2.5 and 97.5 percentiles of (runtime SQNR - simulation SQNR) over `draws` resamplings of
    the samples with replacement (both SQNRs capped at _CAP_DB), or None without per-sample sums of
    both over the same samples. The samples are put in one canonical order first, so the interval
    depends neither on the input order nor on the batch size."""
    paired = _paired(simulated, measured)
    if paired is None:
        return None
    sig, n_sim, n_run = paired
    idx = np.random.default_rng(0).integers(0, len(sig), (draws, len(sig)))
    s, a, b = sig[idx].sum(axis=1), n_sim[idx].sum(axis=1), n_run[idx].sum(axis=1)
    gaps = [min(sqnr_db(x, z), _CAP_DB) - min(sqnr_db(x, y), _CAP_DB) for x, y, z in zip(s, a, b)]
    if any(math.isnan(g) for g in gaps):
        return None
    lo, hi = np.percentile(gaps, [2.5, 97.5])
    return float(lo), float(hi)


def gap_exchange(simulated: _Acc, measured: _Acc, draws: int = EXCHANGE_DRAWS) -> float | None:
    """How often the gap (runtime SQNR - simulation SQNR, both capped at _CAP_DB) is at least as far
    from 0 as the one measured when each input's runtime error and simulation error are swapped or
    not (a paired permutation test): the share of the swaps, every one up to _EXACT_SWAPS inputs,
    `draws` random ones (seeded, over the inputs in gap_interval's canonical order) beyond. A run
    that computes the file's arithmetic and only drifts from it where a float rounding flips a code
    is as likely to be the better on each input as the simulation: a share of EXCHANGE_P or more says
    the inputs cannot tell its gap from that drift, however narrow the resampled interval (one input
    that carries most of the error makes every resample agree: capspot_sim's +2.1 dB on 8 inputs,
    interval +1.5..+8.2, is a gap as large in about half the swaps, and +0.8 dB on 196). None as for
    gap_interval."""
    paired = _paired(simulated, measured)
    if paired is None:
        return None
    sig, n_sim, n_run = paired
    n = len(sig)
    if n <= _EXACT_SWAPS:
        swaps = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(bool)
    else:
        swaps = np.random.default_rng(0).integers(0, 2, (draws, n)).astype(bool)
        swaps[0] = False  # the measured assignment itself, as in every exact enumeration
    total = float(sig.sum())
    if not total > 0:
        return None

    def capped(noise: np.ndarray) -> np.ndarray:  # min(sqnr_db(total, noise), _CAP_DB) for each sum
        with np.errstate(divide="ignore"):
            return np.minimum(10.0 * (math.log10(total) - np.log10(noise)), _CAP_DB)

    gaps = capped(np.where(swaps, n_sim, n_run).sum(axis=1)) - capped(np.where(swaps, n_run, n_sim).sum(axis=1))
    measured_gap = abs(float((capped(np.array([n_run.sum()])) - capped(np.array([n_sim.sum()])))[0]))
    return float(np.mean(np.abs(gaps) >= measured_gap - 1e-9))


_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
_VALUE_FREE = frozenset({"Shape", "Size"})  # integers that say nothing of the values


def _float_outputs(proto: onnx.ModelProto) -> tuple[list[str], list[str]]:
    compared, skipped = [], []
    for o in proto.graph.output:
        t = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
        (compared if t in _FLOAT_TYPES else skipped).append(o.name)
    return compared, skipped


def _session(loaded, proto: onnx.ModelProto):
    """The reference's session: a model quantized with its own Q/DQ pairs runs them as the float arithmetic they
    state (as the simulation does), not through onnxruntime's int8 kernels (smart-turn v3: 20 dB apart)."""
    own = prequantized.own_quantizers(G.Index(proto)).pairs
    return onnxruntime.session(proto, external_folder=loaded.path.parent if loaded.external_files else None,
                               optimization="none" if own else None)


def sensitivities(module, prepared, cal, reference: _Reference, names: list[str], progress=None,
                  bias_correction: bool = True, *, rules) -> list[TensorSensitivity]:
    """Every quantizer of the plan on its own (the target `module`'s model of it, simulated), worst
    first; each charged to the layers that read it under the target's placement `rules`."""
    result = []
    for order, site in enumerate(prepared.plan.quantizers):
        model = _with_sites(module, prepared, cal, [] if site.is_weight else [site], [site] if site.is_weight else [], bias_correction)
        accs, _ = _compare(reference, simulate.simulation(model), names)
        rng = None
        if not site.is_weight:
            rng = {"amax": site.range.amax, "unsigned": site.range.unsigned, "shared_with": list(site.shared_with)}
        result.append(TensorSensitivity(
            site.tensor, site.kind, compute_layers(prepared.model, site.readers, rules),
            {n: a.sqnr() for n, a in zip(names, accs)}, order, rng, site.policy.describe(),
        ))
        if progress is not None:
            progress.update(1)
    result.sort(key=_rank_key)
    return result


def check_request(target: str, runtime: str | None = None, per_tensor: bool = False) -> None:
    """A one-line error for a target qtool cannot evaluate so, or a runtime that does not run its file."""
    if target not in TARGETS:
        raise QtoolError(f"target {target!r} is not one of {', '.join(TARGETS)}")
    if runtime is not None:
        runtimes = targets.runtimes()
        if runtime not in runtimes:
            raise QtoolError(f"runtime {runtime!r} is not one of {', '.join(runtimes)}")
        if target not in runtimes[runtime]:
            raise QtoolError("{runtime} runs the file of {first}{others}, not {target}", runtime=Opt("runtime", runtime),
                             first=Opt("target", runtimes[runtime][0]), others="".join(f" or {t}" for t in runtimes[runtime][1:]),
                             target=target)
    if per_tensor:
        ranked_exporter(target)


def export_options(options: ExportOptions, runtime: str | None = None) -> ExportOptions:
    """The export options, checked, with the target's defaults filled in (Target.evaluation_options)."""
    method(options.method, targets.get(options.target).own_methods(options))
    return targets.get(options.target).evaluation_options(options, runtime)


def runtime_warnings(name: str, simulated: list[OutputMetrics], measured: list[OutputMetrics],
                     intervals: list[tuple[float, float] | None] | None = None, fp32: list[OutputMetrics] | None = None,
                     own: list[OutputMetrics] | None = None, departures: list[Departure] | None = None,
                     exchanges: list[float | None] | None = None, states_reference: bool = False) -> list[str]:
    """A warning per output where the runtime and the simulation are more than RUNTIME_GAP_DB apart,
    naming the likely cause. With the runtime's FP32 run (`fp32`: against onnxruntime's FP32; `own`:
    the int8 run against it), a gap the runtime's own FP32 accounts for is said to be the
    runtime's (`runtime_floor`); otherwise, with the gap's 95 % interval over the samples
    (`gap_interval`), one that holds 0, or one as large in EXCHANGE_P or more of the input-by-input
    swaps of run and simulation (`exchanges`: gap_exchange), says the inputs cannot tell them apart, and `departures`
    (the layers where the run leaves the file most) are named. A deep int8 network's run leaves
    its exact arithmetic where a float rounding flips a code, and the flip grows layer by layer:
    one input's SQNR can move by 10 dB either way (PP-OCRv5 rec: 3.4 dB worse on 8 inputs, 0.3
    better on 128; docs/benchmarks.md#guard-cost). `states_reference`: the file adds no quantizer to a model shipped
    with its own quantizers (the reference): a runtime closer to it than the simulation is then not said to skip
    roundings (_likely_cause)."""
    warnings = []
    where = _departures_text(name, departures or [])
    for i, (s, r) in enumerate(zip(simulated, measured)):
        gap = min(r.sqnr_db, _CAP_DB) - min(s.sqnr_db, _CAP_DB)
        if abs(gap) > RUNTIME_GAP_DB:  # False for NaN, and for -inf on both sides
            interval = intervals[i] if intervals else None
            said = (f"output {s.name!r}: {name} on this CPU gives {format_db(r.sqnr_db)} dB, the exact simulation of the "
                    f"file {format_db(s.sqnr_db)} dB")
            floor = runtime_floor(s.sqnr_db, r.sqnr_db, fp32[i].sqnr_db, own[i].sqnr_db) if fp32 and own else None
            if floor is not None:
                said += (f"; {name} runs the FP32 model itself {format_db(fp32[i].sqnr_db)} dB from onnxruntime's FP32, and against "
                         f"its own FP32 run the int8 run gives {format_db(own[i].sqnr_db)} dB")
                if floor == "all":
                    warnings.append(f"{said}: the gap is {name}'s float computation, not the file's")
                    continue
                said += ", still more than 1 dB from the file's"
            if interval is None:
                warnings.append(f"{said}; {_likely_cause(name, worse=gap < 0, states_reference=states_reference)}{where}")
                continue
            span = f"95 % interval of the difference {interval[0]:+.2f}..{interval[1]:+.2f} dB"
            swapped = exchanges[i] if exchanges else None
            if swapped is not None and swapped >= EXCHANGE_P and not interval[0] <= 0 <= interval[1]:
                span += (f"; but as large in {100 * swapped:.0f} % of the swaps of the run's and the simulation's errors input by "
                         "input: a few inputs carry it")
            if interval[0] <= 0 <= interval[1] or (swapped is not None and swapped >= EXCHANGE_P):
                warnings.append(f"{said}, within what these {s.samples} inputs can tell ({span}): an int8 run drifts from its "
                                f"exact arithmetic input by input; evaluate on more inputs to tell{where}")
            else:
                warnings.append(f"{said} ({span}); {_likely_cause(name, worse=gap < 0, states_reference=states_reference)}{where}")
    return warnings


def runtime_floor(simulated: float, run: float, fp32: float, own: float) -> str | None:
    """How much of a gap between a runtime's int8 run and the file's simulation (both against
    onnxruntime's FP32) the runtime's own FP32 run accounts for. None when the int8 run is not
    more than RUNTIME_GAP_DB closer to the runtime's FP32 (`own`) than to onnxruntime's (`run`):
    the runtime's FP32 makes no such difference. Otherwise "all" when against it the int8 run is
    within RUNTIME_GAP_DB of the simulation, or when the run is within RUNTIME_GAP_DB of what the
    file's error and the runtime's FP32 error (`fp32`) give together, as independent noises
    (their powers add); "part" else. SQNRs are capped at _CAP_DB (above it, float rounding alone)."""
    values = [min(v, _CAP_DB) for v in (simulated, run, fp32, own)]
    if any(math.isnan(v) for v in values) or any(v == -math.inf for v in (simulated, fp32)):
        return None
    simulated, run, fp32, own = values
    if own - run <= RUNTIME_GAP_DB:
        return None
    together = -10.0 * math.log10(10.0 ** (-simulated / 10.0) + 10.0 ** (-fp32 / 10.0))
    return "all" if abs(own - simulated) <= RUNTIME_GAP_DB or abs(run - together) <= RUNTIME_GAP_DB else "part"


def _departures_text(name: str, departures: list[Departure]) -> str:
    if not departures:
        return ""
    shown = ", ".join(f"{d.layer} ({format_db(d.upstream_db)} -> {format_db(d.sqnr_db)} dB)" for d in departures)
    return (f"; where {name} leaves the file most ({name} against the simulation at the quantized layers' outputs, fetched "
            f"beside the outputs, from the layers' quantized inputs to their output): {shown}")


def _likely_cause(runtime: str, worse: bool, states_reference: bool = False) -> str:
    """Saturation only makes a runtime worse; a runtime better than the file skips roundings, except where the file
    states the reference's own quantized arithmetic (`states_reference`): there the simulation leaves it by float order
    alone (tabledet_cls quantized by onnxruntime: the file's 70 FakeQuantize nodes computed as QuantizeLinear/
    DequantizeLinear pairs give the reference bit for bit, as FakeQuantize's formula 31.0 dB from it, OpenVINO 36.0;
    docs/benchmarks.md#sim20-gaps). A runtime worse than such a file: the same flips, carried on through a deep model
    (sscd_int8 on an AVX2 CPU, 1.1 dB under its simulation, the guard's saturation estimate 0 on all 53 layers and its
    weights narrowed to 7 bits no closer: not saturation; docs/benchmarks.md#hunt21, #lead23, #lead32)."""
    has = cpu_kinds.vnni()
    if worse and states_reference:
        guarded = ("; this CPU has no VNNI, but the default --cpu any file keeps FP32 each of the model's layers whose pair "
                   "sums the guard estimates can saturate" if cpu_kinds.is_x86() and has is False else "")
        return ("the file adds no quantizer: it states the model's own quantized arithmetic, and "
                f"{runtime}'s int8 kernels round values at rounding ties to other codes than the file's float formula, "
                "which a deep model carries on layer by layer" + guarded)
    if worse and cpu_kinds.is_x86() and has is False:
        return ("this CPU has no VNNI (avx512_vnni/avx_vnni): int8 pair sums can saturate (a --cpu vnni file is for CPUs with VNNI; "
                "the default --cpu any guards every layer)")
    if worse and cpu_kinds.is_x86() and has is None:
        return "this CPU's flags could not be read: without VNNI (avx512_vnni/avx_vnni) int8 pair sums can saturate"
    if not worse and states_reference:
        return ("the file adds no quantizer: it states the model's own quantized arithmetic, which its simulation computes with "
                "FakeQuantize's float formula ((x - low) / (high - low) * 255, rounded) where the model's QuantizeLinear divides "
                f"by its scale: values at rounding ties go to other codes, and {runtime}'s int8 kernels round them otherwise "
                "again; neither skips a rounding: both drift from the model's arithmetic by float order")
    if not worse:
        return (f"{runtime} rounds less often than the file: its fusions skip roundings (OpenVINO does not round a FakeQuantize "
                "it fuses between a Conv and an Add)")
    return f"{runtime}'s int8 kernels compute otherwise than the file (fusions, requantization)"


def evaluate(loaded, cal, runs: Runs, options: ExportOptions, *, runtime: str | None = None, per_tensor: bool = False,
             progress=None, cache_bytes: int = CACHE_BYTES) -> Evaluation:
    """Compare options.target's export of `cal` on `loaded` with the export `options` (its exact
    simulation; with `runtime`, also that runtime on this CPU) with FP32 on the inputs `runs` gives. A model whose
    outputs are all integer labels is scored on the float tensors they are computed from (with_label_scores)."""
    target = options.target
    check_request(target, runtime, per_tensor)
    loaded, scored = with_label_scores(loaded)
    names, not_compared = compared_outputs(loaded)
    options = export_options(options, runtime)
    exported = provenance.built(loaded, cal, options)
    ranked = prepare(loaded, cal, options) if per_tensor else None
    if progress is not None:  # a tqdm bar: one step per model pass over the inputs
        sites = len(ranked[1].plan.quantizers) if ranked else 0
        progress.total = 1 + (runtime is not None) + sites
        progress.refresh()
    reference = _Reference(runs, _session(loaded, loaded.proto), names, cache_bytes, loaded.proto)
    # (only a runtime's warnings read it)
    states = runtime is not None and not (exported.summary.get("activation_quantizers") or
                                          exported.summary.get("weight_quantizers")) and \
        bool(prequantized.own_quantizers(G.Index(loaded.proto)).pairs)
    outputs, samples, warnings, measured = _score(reference, names, not_compared, exported.data, runtime, progress,
                                                  fp32_file(loaded) if runtime is not None else None, states_reference=states)
    tensors = []
    if ranked is not None:
        tensors = sensitivities(*ranked, cal, reference, names, progress, options.bias_correction,
                                rules=targets.get(target).rules)
    if scored:
        warnings.insert(0, scored_warning(scored, "the export"))
    return Evaluation(outputs, tensors, samples, exported.summary, not_compared, list(exported.warnings) + warnings, target, measured)


def label_sources(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """{integer or bool output: the float tensors it is computed from}: walking back from the output through the
    tensors that are not float (labels, masks, indices, Where/Equal of them) to the float tensors an op turns into
    them (ArgMax of the logits, Cast of a float, Greater of a score), those the graph computes from its inputs. Int8
    changes those float tensors; the integer output shows it only as a label that flips (a char-BERT word tagger
    exported with its ArgMax: sudachi-b-imitator; an ensemble picking one of two taggers' labels with Where; a
    spectrogram cast to uint8). Not through Shape or Size, whose integers do not depend on the values."""
    made_by = G.producers(proto.graph)
    constant = {t.name for t in proto.graph.initializer} | {i.name for i in proto.graph.input}
    types = None
    found: dict[str, list[str]] = {}
    for o in proto.graph.output:
        if types is None:
            types = tensor_types(proto)
        if types.get(o.name) in _FLOAT_TYPES:
            continue
        sources: list[str] = []
        seen, todo = set(), [o.name]
        while todo:
            node = made_by.get(todo.pop())
            if node is None or id(node) in seen or node.op_type in _VALUE_FREE or node.op_type == "Constant":
                continue
            seen.add(id(node))
            for name in node.input:
                if not name or name in constant:
                    continue
                if types.get(name) in _FLOAT_TYPES:
                    if made_by.get(name) is not None and made_by[name].op_type != "Constant" and name not in sources:
                        sources.append(name)
                else:
                    todo.append(name)
        if sources:
            found[o.name] = sources
    return found


def with_label_scores(loaded):
    """(loaded, {}) when the model has a float output or no label output; else (a copy of loaded whose graph also
    outputs the float tensors its integer label outputs are computed from, {label output: that tensor}): the
    export built from it carries them as outputs too, so simulation and runtime are scored on them."""
    proto, scored = label_scored(loaded.proto)
    return (replace(loaded, proto=proto), scored) if scored else (loaded, {})


def label_scored(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """(proto, {}) when it has a float output or no label output; else (a copy also outputting the float tensors
    label_sources finds, with their inferred types and shapes, {label output: that tensor}). The zoo bench scores
    NNCF's and onnxruntime's files on the same tensors."""
    if _float_outputs(proto)[0]:
        return proto, {}
    scored = label_sources(proto)
    if not scored:
        return proto, {}
    inferred = shapes.inferred(proto) or proto  # the tensors' types and shapes, as inferred
    known = {vi.name: vi for vi in inferred.graph.value_info if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
    types = tensor_types(proto)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for name in _sources(scored):
        if name in known:
            copy.graph.output.append(known[name])
        else:  # rank unknown
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    return copy, scored


def ranked_tensors(loaded, cal, runs: Runs, options: ExportOptions, cache_bytes: int = CACHE_BYTES) -> list:
    """evaluate(..., per_tensor=True)'s ranking of the quantizers alone (no export built, nothing scored)."""
    check_request(options.target, None, True)
    names, _ = compared_outputs(loaded)
    options = export_options(options, None)
    reference = _Reference(runs, _session(loaded, loaded.proto), names, cache_bytes, loaded.proto)
    return sensitivities(*prepare(loaded, cal, options), cal, reference, names, None, options.bias_correction,
                         rules=targets.get(options.target).rules)


def evaluate_file(loaded, data, runs: Runs, *, target: str | None = None, runtime: str | None = None, progress=None,
                  cache_bytes: int = CACHE_BYTES) -> Evaluation:
    """Compare an exported file (`data`: its ModelProto, as written) with its FP32 model `loaded` on
    the inputs `runs` gives: the exact simulation of the file's nodes as they are, and with
    `runtime` that runtime on this CPU (`target`: whose export it is, None for a file qtool did not
    write). The numbers evaluate gives for the export it builds, when the file is that export. A model whose
    outputs are all integer labels is scored on the float tensors they are computed from, in the file as in it."""
    loaded, scored = with_label_scores(loaded)
    if scored:
        data = _exposing(data, _sources(scored), loaded.proto)
    names, not_compared = compared_outputs(loaded)
    if progress is not None:
        progress.total = 1 + (runtime is not None)
        progress.refresh()
    reference = _Reference(runs, _session(loaded, loaded.proto), names, cache_bytes, loaded.proto)
    outputs, samples, warnings, measured = _score(reference, names, not_compared, data, runtime, progress,
                                                  fp32_file(loaded) if runtime is not None else None)
    if scored:
        warnings.insert(0, scored_warning(scored, "the file"))
    return Evaluation(outputs, [], samples, {}, not_compared, warnings, target, measured)


def _sources(scored: dict[str, list[str]]) -> list[str]:
    return list(dict.fromkeys(t for ts in scored.values() for t in ts))


def scored_warning(scored: dict[str, list[str]], where: str) -> str:
    return ("the model's outputs are integers: scored instead the float tensor(s) they are computed from ("
            + "; ".join(f"{o}: {', '.join(ts)}" for o, ts in scored.items()) + f"), as graph outputs of {where} evaluated")


def _exposing(data, names: list[str], like: onnx.ModelProto):
    """The exported file `data` (bytes or a ModelFile) with the tensors `names` added to its graph outputs (their
    value infos as `like` declares them); a one-line error when the file computes none of that name."""
    if isinstance(data, ModelFile):
        proto = onnx.ModelProto()
        proto.CopyFrom(data.model)
    else:
        proto = onnx.load_model_from_string(bytes(data))
    made = {o for n in proto.graph.node for o in n.output}
    missing = [n for n in names if n not in made]
    if missing:
        raise QtoolError(f"the model's outputs are integers, and the file computes none of the float tensor(s) they are "
                         f"computed from in the model ({', '.join(missing)}): nothing to compare")
    declared = {o.name: o for o in like.graph.output}
    proto.graph.output.extend(declared[n] for n in names)
    return ModelFile(proto) if isinstance(data, ModelFile) else proto.SerializeToString()


def compared_outputs(loaded) -> tuple[list[str], list[str]]:
    """(the model's float outputs, the others), or a one-line error when it has no float output."""
    names, not_compared = _float_outputs(loaded.proto)
    if not names:
        raise QtoolError("the model has no float outputs to compare (SQNR needs float outputs)")
    return names, not_compared


def _score(reference: _Reference, names: list[str], not_compared: list[str], data, runtime: str | None,
           progress, fp32=None, states_reference: bool = False) -> tuple[list[OutputMetrics], int, list[str], RuntimeResult | None]:
    """The file `data` against FP32 (`reference`): its exact simulation, with `runtime` also that
    runtime on this CPU running the file and the FP32 model `fp32` (its bytes: fp32_file); (per-output
    metrics, samples, warnings, the runtime's result). `states_reference`: the file adds no quantizer to a reference that
    is a model's own quantized arithmetic (runtime_warnings)."""
    accs, samples = _compare(reference, simulate.simulation(data), names, per_sample=runtime is not None)
    if samples == 0:
        raise QtoolError("no inputs to evaluate on")
    check_finite_reference(names, accs)
    check_compared(names, accs, reference.proto)
    if progress is not None:
        progress.update(1)
    outputs = output_metrics(names, accs)
    warnings = _output_warnings(names, accs)
    if not_compared:
        warnings.append(f"non-float output(s) not compared: {', '.join(not_compared)}")
    measured = None
    if runtime is not None:
        session = simulate.runtime(runtime, data)
        base, failed = None, ""
        if fp32 is not None:
            try:
                base = simulate.runtime(runtime, fp32, like=session, float_only=True)
            except QtoolError as e:  # the file runs: its figures stand without the runtime's floor
                failed = str(e)
        r_accs, f_accs, o_accs, run_failed = _compare_runtime(reference, session, base, names)
        failed = failed or run_failed
        if failed:
            base = None
            warnings.append(f"{runtime} could not run the FP32 model, so its own floor is not reported: {failed}")
        kind = cpu_kinds.kind()
        default = (kind.openvino_float if kind else None) if runtime == "openvino" else "f32"
        measured = RuntimeResult(runtime, output_metrics(names, r_accs), cpu_kinds.vnni(), getattr(session, "float_precision", "f32"),
                                 kind.name if kind else None, default, [gap_interval(a, b) for a, b in zip(accs, r_accs)],
                                 output_metrics(names, f_accs) if base is not None else [],
                                 output_metrics(names, o_accs) if base is not None else [],
                                 exchanges=[gap_exchange(a, b) for a, b in zip(accs, r_accs)])
        if progress is not None:
            progress.update(1)
        static = getattr(session, "static", "")
        if static:
            warnings.append(f"{runtime} compiles the file only at static shapes ({static}): it ran at the held-out "
                            "inputs' shapes, as benchmark_app -shape does")
        warnings += [f"{runtime}: {w}" for w in _output_warnings(names, r_accs)]
        if base is not None:
            warnings += [f"{runtime} running the FP32 model: {w}" for w in _output_warnings(names, f_accs)]
        # the compiled file and FP32 model go before departures compiles its own (a detector's, held beside it: GBs)
        del session, base
        if _unexplained_gap(outputs, measured):  # where the run's departure from the file grows
            try:
                measured.departures = departures(reference, data, runtime, SimpleNamespace(static=static), progress)
            except QtoolError as e:
                warnings.append(f"{runtime} could not run the file with its quantized layers' outputs fetched to tell where it "
                                f"leaves the file: {e}")
        warnings += runtime_warnings(runtime, outputs, measured.outputs, measured.intervals, measured.fp32, measured.own,
                                     measured.departures, measured.exchanges, states_reference)
    return outputs, samples, warnings, measured


def _unexplained_gap(simulated: list[OutputMetrics], measured: RuntimeResult) -> bool:
    """Whether an output's run is more than RUNTIME_GAP_DB from the simulation and the runtime's own
    FP32 run does not account for all of it (runtime_floor)."""
    for i, (s, r) in enumerate(zip(simulated, measured.outputs)):
        if abs(min(r.sqnr_db, _CAP_DB) - min(s.sqnr_db, _CAP_DB)) > RUNTIME_GAP_DB:
            if not (measured.fp32 and measured.own) or runtime_floor(s.sqnr_db, r.sqnr_db, measured.fp32[i].sqnr_db,
                                                                       measured.own[i].sqnr_db) != "all":
                return True
    return False


def _compare_runtime(reference: _Reference, run, base, names: list[str]) -> tuple[list[_Acc], list[_Acc], list[_Acc], str]:
    """One pass of the runtime's int8 run (`run`) and its FP32 run (`base`, or None): accumulators
    of the int8 run against onnxruntime's FP32 (per sample), of `base` against it, of the int8
    run against `base` (the last two empty without `base`), and why `base` failed on an input
    ("" when it did not; it is not run after)."""
    r_accs = [_Acc(True) for _ in names]
    f_accs = [_Acc() for _ in names] if base is not None else []
    o_accs = [_Acc() for _ in names] if base is not None else []
    failed = ""
    takes, base_takes = _inputs(run), _inputs(base) if base is not None else None
    for feeds, count, ref in reference:
        out = onnxruntime.run(run, names, {k: v for k, v in feeds.items() if takes is None or k in takes})
        for acc, r, o in zip(r_accs, ref, out):
            acc.update(np.asarray(r), np.asarray(o), count)
        if base is not None and not failed:
            try:
                own = onnxruntime.run(base, names, {k: v for k, v in feeds.items() if base_takes is None or k in base_takes})
            except QtoolError as e:
                failed = str(e)
                continue
            for f, o_acc, r, b, o in zip(f_accs, o_accs, ref, own, out):
                f.update(np.asarray(r), np.asarray(b), count)
                o_acc.update(np.asarray(b), np.asarray(o), count)
    return r_accs, f_accs, o_accs, failed


DEPARTURES = 3  # layers a runtime's warning names
CONFIRMED = DEPARTURES + 2  # candidates measured again, it and its quantized inputs each fetched alone (departures)
DEPARTURE_BYTES = 256 << 20  # quantized layers' outputs fetched per run in one pass of departures (more: more passes)


class _Noise:
    """Float64 sums of ref^2 and (ref - out)^2 of one tensor over the runs, streamed a block at a time (no
    full-size float64 copy): departures' measure. Values where ref is not finite are skipped; a non-finite out
    where ref is finite makes it -inf; a run of another shape is not compared (as _Acc)."""

    BLOCK = 1 << 20

    def __init__(self):
        self.signal = self.noise = 0.0
        self.broken = 0

    def update(self, ref: np.ndarray, out: np.ndarray) -> None:
        if ref.shape != out.shape:
            return
        r, o = ref.reshape(-1), out.reshape(-1)
        for i in range(0, r.size, self.BLOCK):
            a, b, _, broken = _finite_pairs(r[i:i + self.BLOCK].astype(np.float64), o[i:i + self.BLOCK].astype(np.float64))
            self.broken += broken
            d = a - b
            with np.errstate(over="ignore", invalid="ignore"):
                self.signal += float(np.dot(a, a))
                self.noise += float(np.dot(d, d))

    def sqnr(self) -> float:
        return -math.inf if self.broken else sqnr_db(self.signal, self.noise)


def _groups(tensors: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    """`tensors` in graph order, cut into runs of consecutive ones whose sizes (bytes per run) sum to at most
    `budget` (one alone where it is larger); all in one where a size is unknown."""
    if any(t not in sizes for t in tensors):
        return [tensors]
    groups: list[list[str]] = [[]]
    held = 0
    for t in tensors:
        if groups[-1] and held + sizes[t] > budget:
            groups.append([])
            held = 0
        groups[-1].append(t)
        held += sizes[t]
    return groups


def layer_taps(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """The tensors a quantizer of the file reads that the inputs compute (a FakeQuantize's or a
    QuantizeLinear's data input, not a weight's), in graph order, each with the nearest such
    tensors upstream of it."""
    from ..model import data_dependent  # qtool.model's: the file's FakeQuantize nodes keep its types from being inferred

    index = G.Index(proto)
    live = data_dependent(proto)
    taps = [n.input[0] for n in proto.graph.node
            if (simulate.is_fake_quantize(n) or (n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx")))
            and n.input[0] in live and n.input[0] in index.producer]
    taps = list(dict.fromkeys(taps))
    tapped = set(taps)
    found: dict[str, list[str]] = {}
    for t in taps:
        up, seen, stack = [], set(), list(index.producer[t].input)
        while stack:
            x = stack.pop()
            if not x or x in seen:
                continue
            seen.add(x)
            if x in tapped:
                up.append(x)
            elif x in index.producer:
                stack.extend(index.producer[x].input)
        found[t] = sorted(up)
    return found


def _fetching(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `proto` with the tensors `names` also graph outputs."""
    return simulate.with_outputs(G.copied(proto), names)


def _simulating(proto: onnx.ModelProto, names: list[str]):
    """The simulation of `proto` fetching `names`, added once its FakeQuantize nodes are rewritten (an opset-9 file is
    converted to opset 11 first, which a graph output of no shape would fail)."""
    return simulate.simulation(G.copied(proto), names)


def _departed(reference, proto: onnx.ModelProto, data, runtime: str, like, names: list[str], sim=None) -> dict[str, float]:
    """The runtime's run of the file `proto` (`data` as given: bytes or a ModelFile) against its simulation at the
    tensors `names`, the runtime's model fetching those alone (the simulation: `sim`, else one fetching those
    alone; it computes the same values whatever it fetches), each pair compared as it comes (departures)."""
    probed = _fetching(proto, names)
    run = simulate.runtime(runtime, ModelFile(probed) if isinstance(data, ModelFile) else probed.SerializeToString(), like=like)
    sim = sim or _simulating(proto, names)
    accs = {t: _Noise() for t in names}
    takes, sim_takes = _inputs(run), _inputs(sim)
    for feeds in reference.feeds():  # not the FP32 outputs: each pass ran the FP32 model again where uncached
        a = onnxruntime.run(sim, names, {k: v for k, v in feeds.items() if sim_takes is None or k in sim_takes})
        b = onnxruntime.run(run, names, {k: v for k, v in feeds.items() if takes is None or k in takes})
        for i, t in enumerate(names):
            accs[t].update(np.asarray(a[i]), np.asarray(b[i]))
            a[i] = b[i] = None  # each pair let go once compared
    return {t: accs[t].sqnr() for t in names}


def departures(reference: _Reference, data, runtime: str, like, progress=None, budget: int = DEPARTURE_BYTES) -> list[Departure]:
    """Where the runtime's run of the file leaves its exact arithmetic: both run again with every quantized
    layer's output fetched (layer_taps), the runtime's against the simulation's at each; the DEPARTURES layers whose
    output is furthest below their quantized inputs' (Departure.drop_db), worst first. Those outputs are fetched
    in passes of at most `budget` bytes per run (their sizes by OpenVINO's shape inference at the first run's
    shapes; one pass where it cannot tell), each compared as it comes (float64 sums, streamed): the memory a pass
    holds is bounded, not the sum of every layer's output. Fetching an intermediate tensor can change the runtime's
    fusions, so these are where it departs, not by how much the unfetched run does; and fetching
    many can give a tensor's buffer as something else wrote it (OpenVINO 2026.4 returned zeros for
    ppocrv6_tiny_det's two GlobalAveragePool outputs fetched beside 130 others, their values fetched
    alone; the same fetched beside the Conv output it pools): each layer named is measured again, it and each of
    its quantized inputs fetched alone (the CONFIRMED worst)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(data.model if isinstance(data, ModelFile) else onnx.load_model_from_string(bytes(data)))
    taps = layer_taps(proto)
    if not taps:
        return []
    fetched = list(taps)
    index = G.Index(proto)
    layers = {t: _layer_of(index, t) for t in fetched}

    def measured(names: list[str], sim=None) -> dict[str, float]:
        return _departed(reference, proto, data, runtime, like, names, sim)

    def found_at(sqnr: dict[str, float], tensors) -> list[Departure]:
        out = [Departure(layers[t], t, sqnr[t], min((sqnr[u] for u in taps[t]), default=math.inf)) for t in tensors]
        # a tap with no quantized tensor upstream is reached through float layers alone: not an int8 layer's departure
        return [d for d in out if taps[d.tensor] and not math.isnan(d.drop_db) and d.drop_db > 0]

    first = next(iter(reference.feeds()), {})
    sizes = openvino.output_bytes(_fetching(proto, fetched).SerializeToString(), first) if runtime == "openvino" else {}
    del first
    sqnr: dict[str, float] = {}
    for group in _groups(fetched, sizes, budget):
        sqnr.update(measured(group))
    found = sorted(found_at(sqnr, fetched), key=lambda d: -d.drop_db)
    if progress is not None:
        progress.update(1)
    alone: dict[str, float] = {}  # each tensor fetched alone (fetched beside its producer's input it was zeros too)
    confirmed: list[Departure] = []
    wanted = list(dict.fromkeys(t for d in found[:CONFIRMED] for t in (d.tensor, *taps[d.tensor])))
    sim = _simulating(proto, wanted) if wanted else None  # one for all of them: its values are exact
    for d in found[:CONFIRMED]:
        for t in (d.tensor, *taps[d.tensor]):
            if t not in alone:
                alone.update(measured([t], sim))
        confirmed += found_at(alone, [d.tensor])
        if len(confirmed) == DEPARTURES:
            break
    confirmed.sort(key=lambda d: -d.drop_db)
    return confirmed


def _layer_of(index, tensor: str) -> str:
    """The node computing `tensor`: its producer, or above ops that only move or retype values (a
    PyTorch export's Cast after each Conv) the node they read from."""
    node = index.producer[tensor]
    seen = set()
    while node.op_type in G.REFORMS and node.input and node.input[0] in index.producer and node.name not in seen:
        seen.add(node.name)
        node = index.producer[node.input[0]]
    return node.name or node.op_type


def fp32_file(loaded) -> bytes | ModelFile:
    """The FP32 model `loaded` as one file, for a runtime to compile (its weights in it); a model shipped with its own
    Q/DQ pairs with them as the float ops of their arithmetic, the reference's (prequantized.pairs_as_float_ops)."""
    if loaded.store is not None:  # a big model's lazy weights: written piece by piece
        return ModelFile(loaded.proto)
    own = prequantized.own_quantizers(G.Index(loaded.proto)).pairs
    if not loaded.external_files:
        return (prequantized.pairs_as_float_ops(loaded.proto) if own else loaded.proto).SerializeToString()
    proto = prequantized.pairs_as_float_ops(loaded.proto) if own else onnx.ModelProto()
    if not own:
        proto.CopyFrom(loaded.proto)
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(proto, str(loaded.path.parent))
    return proto.SerializeToString()


def check_finite_reference(names: list[str], accs: list[_Acc]) -> None:
    """A one-line error for the first output whose FP32 values are all NaN/inf on these inputs:
    nothing to compare (its SQNR would read +inf, its cosine 1)."""
    for n, a in zip(names, accs):
        if a.elements and a.skipped == a.elements:
            raise QtoolError(f"output {n!r}: the FP32 model gives no finite value on these inputs (all {a.elements} are NaN/inf), "
                             "so there is nothing to compare: check the inputs' preprocessing, dtypes and value ranges")


# ops whose integers can set a shape: patterns' roundings (Round, Floor, Ceil) and the selecting ops
ROUNDING = P.ROUNDINGS | {"NonZero", "TopK", "NonMaxSuppression"}


def check_compared(names: list[str], accs: list[_Acc], model: onnx.ModelProto | None = None) -> None:
    """A one-line error for the first output the int8 model gave another shape than FP32 in every run: nothing was
    compared (an SQNR of no values would read +inf). Its shape depends on values the model computes, as a
    text-to-speech model's audio length on rounded durations or a detector's box count on its scores: naming the
    model's rounding and selecting nodes that can set it (ROUNDING), the first few."""
    for n, a in zip(names, accs):
        if a.shape_mismatches and not a.samples:
            found = [node.name or node.op_type for node in (model.graph.node if model is not None else []) if node.op_type in ROUNDING]
            where = f" (the model's {', '.join(found[:3])}{' ...' if len(found) > 3 else ''})" if found else ""
            raise QtoolError(f"output {n!r}: the int8 model gave it another shape than FP32 in all {a.shape_mismatches} runs, "
                             f"so nothing was compared: its shape depends on values the model computes{where}; --exclude "
                             "the layers those values come from to keep them FP32")


def judged(ev: Evaluation) -> list[tuple[OutputMetrics, str | None]]:
    """Per compared output, the number a quality gate (--fail-below) judges, and whose it is: the
    simulation's (None), or with a runtime the worse of the runtime's run and the simulation
    (the runtime's name when it is the runtime's)."""
    if ev.runtime is None:
        return [(o, None) for o in ev.outputs]
    found = []
    for s, r in zip(ev.outputs, ev.runtime.outputs):
        worse = math.isnan(r.sqnr_db) or (not math.isnan(s.sqnr_db) and r.sqnr_db < s.sqnr_db)
        found.append((r, ev.runtime.name) if worse else (s, None))
    return found


def _output_warnings(names: list[str], accs: list[_Acc]) -> list[str]:
    warnings = []
    for n, a in zip(names, accs):
        if a.shape_mismatches:
            warnings.append(f"output {n!r} had a different shape in the int8 model in {a.shape_mismatches} run(s); those runs were not compared")
        if a.broken:
            warnings.append(f"output {n!r}: the int8 model gave {a.broken} NaN/inf value(s) where FP32 is finite")
        if a.skipped:
            warnings.append(f"output {n!r}: {a.skipped} of {a.elements} FP32 values ({100 * a.skipped / a.elements:.2f} %) were "
                            "NaN/inf and were not compared")
    return warnings


def output_metrics(names: list[str], accs: list[_Acc]) -> list[OutputMetrics]:
    return [OutputMetrics(n, a.sqnr(), a.cosine(), a.top1(), a.samples, a.skipped, a.elements) for n, a in zip(names, accs)]


def to_json(ev: Evaluation) -> dict:
    return {
        "samples": ev.samples,
        "target": ev.target,
        "sqnr_db": json_number(ev.worst_sqnr_db),
        "outputs": [o.to_json() for o in ev.outputs],
        "runtime": ev.runtime.to_json() if ev.runtime is not None else None,
        "not_compared": ev.not_compared,
        "quantization": dict(ev.plan_summary),
        "tensors": [{"rank": i + 1, **t.to_json()} for i, t in enumerate(ev.tensors)],
    }


# ---------------------------------------------------------------- mixed precision


@dataclass
class KeepFp32:
    exclude: list[str]  # node names for --exclude
    tensors: list[dict]  # the chosen quantized tensors: tensor, sqnr_db, layers
    warnings: list[str]


def walk(prepared, ranking: list[TensorSensitivity], count: int) -> list[tuple[dict, list[str]]]:
    """Up to `count` steps down the ranking, worst first: (the tensor, the layers kept in FP32 so
    far). A tensor already unquantized by an earlier step's layers is skipped, so each step really
    removes one more quantizer."""
    steps: list[tuple[dict, list[str]]] = []
    extra: list[str] = []
    current = prepared.plan
    for t in ranking:
        if len(steps) == count:
            break
        present = {s.tensor for s in current.activations} | {s.tensor for s in current.weights}
        new = [n for n in t.layers if n not in extra]
        if t.tensor not in present or not new:
            continue
        extra = extra + new
        steps.append(({"tensor": t.tensor, "ranking_sqnr_db": json_number(t.sqnr_db), "layers": new}, extra))
        current = prepared.place(extra)
    return steps


def keep_fp32(loaded, cal, count: int, runs: Runs, options: ExportOptions) -> KeepFp32:
    """The layers to keep in FP32 so that the `count` quantized tensors ranked most harmful
    (as evaluate ranks them, on `runs`, in options.target's own model) are no longer quantized.
    options: the export's, so the ranking is of the placement exported.
    Walking the ranking worst first, a tensor already unquantized by an earlier choice is
    skipped, so `count` tensors really go."""
    names, _ = _float_outputs(loaded.proto)
    if not names:
        raise QtoolError("{keep_fp32}: the model has no float outputs to rank layers by", keep_fp32=Opt("keep_fp32"))
    module, prepared = prepare(loaded, cal, options, Words("{keep_fp32}", opts("keep_fp32")))
    reference = _Reference(runs, _session(loaded, loaded.proto), names)
    ranking = sensitivities(module, prepared, cal, reference, names, bias_correction=options.bias_correction,
                            rules=targets.get(options.target).rules)
    steps = walk(prepared, ranking, count)
    chosen = [tensor for tensor, _ in steps]
    extra = steps[-1][1] if steps else []
    warnings = []
    if len(chosen) < count:
        warnings.append(f"--keep-fp32 {count}: only {len(chosen)} quantized tensor(s) could be kept in FP32")
    return KeepFp32(extra, chosen, warnings)
