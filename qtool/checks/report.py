"""`qtool report`: the data of one self-contained HTML page about a calibration file as one
target's export will use it (qtool.checks.report_page lays it out from a jinja2 template,
qtool.checks.report_plots draws its plots).

What the page holds (Page), from top to bottom:
  summary   which target and why, its placement's counts, the preprocessing as a table, the
            evaluation's output metrics (with `qtool evaluate --json`), and one plot of the error
            of every quantized tensor in graph order: the tensor's own SQNR under the export's
            quantizer (estimated from its histogram, qtool.statistics.noise), and with an
            evaluation the output SQNR with only that tensor quantized.
  quantized the tensors the target's placement quantizes (the same code the export runs:
            each target's `report_view`, qtool.targets), in
            graph order: the threshold and scale the export writes, where that threshold comes
            from, the share of values it clips, and a histogram of |x| (log counts) with the
            target's threshold, the file's amax and every method's threshold drawn on it.
  folded    the calibrated tensors the target leaves float, the layers it keeps in FP32 and the
            weight quantizers.
Everything here is plain data (numbers, names, sentences); no HTML. Same inputs give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import calibration, targets
from ..calibration import Calibration, TensorRecord
from ..errors import Opt, QtoolError
from ..options import DEFAULT_TARGET
from ..quantizers.quantizer import Quantizer
from ..statistics import noise, thresholds
from .evaluation import from_json_number
from .report_plots import HistogramPlot, require_matplotlib

TARGETS = tuple(sorted(targets.names()))
MAX_EVALUATION_BYTES = 64 << 20  # qtool evaluate --json of a model with 10^4 tensors is a few MB
MAX_EVALUATION_DEPTH = 16  # its JSON nests 5 levels
PLOT_BINS = 256
PERCENTILES = ("99.99",)


def methods() -> list[str]:
    """Every method of thresholds.METHODS, percentile:P expanded to PERCENTILES."""
    out = []
    for m in thresholds.METHODS:
        if m.endswith(":P"):
            out.extend(thresholds.parse_method(m[:-1] + p) for p in PERCENTILES)
        else:
            out.append(thresholds.parse_method(m))
    return out


# ---------------------------------------------------------------- what the target's export does


@dataclass
class TargetPlan:
    target: str
    title: str  # e.g. "QDQ model (onnxruntime)"
    why: str  # why this target
    method: str  # the threshold method the export uses (before fallbacks and shared ranges)
    sites: dict[str, Quantizer]  # tensor -> activation quantizer, placement order
    weights: list[Quantizer]
    int8_layers: int
    fp32_layers: dict[str, str]
    unrepresentable: dict[str, str]
    records: dict[str, TensorRecord]  # the calibration the export reads (SmoothQuant: the smoothed tensors')
    view: targets.ReportView  # the target's view of its export (thresholds, scales as the file holds them, SmoothQuant)
    notes: list[str] = field(default_factory=list)


# What the page shows of an activation quantizer, as the target's export writes it


def amax(q: Quantizer) -> float:
    """The threshold the export quantizes with."""
    return float(q.range.amax)


def _file_scale(plan: TargetPlan, q: Quantizer) -> float | None:
    """The per-tensor scale as the file holds it on the int8 symmetric grid, when the target shows one (a signed-only Q/DQ target)."""
    return None if plan.view.scales is None else plan.view.scales[q.tensor]


def scale(plan: TargetPlan, q: Quantizer) -> float | None:
    """The scale in the exported file (None: per channel)."""
    fixed = _file_scale(plan, q)
    if fixed is not None:
        return fixed
    p = q.params()
    return None if np.ndim(p.scale) > 0 else float(p.scale)


def zero_point(plan: TargetPlan, q: Quantizer) -> int:
    if _file_scale(plan, q) is not None:
        return 0
    p = q.params()
    return 0 if np.ndim(p.scale) > 0 else int(p.zero_point)


def channels(plan: TargetPlan, q: Quantizer) -> int:
    """The number of channels of a per-channel quantizer (0: per tensor)."""
    if _file_scale(plan, q) is not None:
        return 0
    p = q.params()
    return int(np.size(p.scale)) if np.ndim(p.scale) > 0 else 0


def grid(plan: TargetPlan, q: Quantizer) -> str:
    """e.g. "int8 symmetric", "uint8 asymmetric"."""
    if _file_scale(plan, q) is not None:
        return "int8 symmetric"
    p = q.params()
    symmetric = bool(np.all(np.asarray(p.zero_point) == 0))
    kind = f"{'' if p.grid.signed else 'u'}int{q.policy.bits} {'symmetric' if symmetric else 'asymmetric'}"
    return kind + (" per channel" if np.ndim(p.scale) > 0 else "")


def covered(plan: TargetPlan, q: Quantizer) -> tuple[float, float]:
    """The range the grid covers."""
    fixed = _file_scale(plan, q)
    if fixed is not None:
        return -128 * fixed, 127 * fixed
    p = q.params()
    return float(np.min(p.input_low)), float(np.max(p.input_high))


def source(plan: TargetPlan, q: Quantizer) -> str:
    """Where the exported threshold of `q` comes from, in a few words."""
    view = plan.view
    if view.smoothing is not None and q.tensor in (view.smoothing.amax or {}):
        return "max |x| of the SmoothQuant-scaled tensor"
    return _source(plan.records[q.tensor], view.thresholds.get(q.tensor), view.method, view.cal, q.shared_with)


def default_target(evaluation: dict | None) -> tuple[str, str]:
    """(target, why) when --target is not given."""
    if evaluation is not None:
        return evaluation["target"], "the target of the --evaluation file"
    others = " or ".join(f"--target {t}" for t in TARGETS if t != DEFAULT_TARGET)
    return DEFAULT_TARGET, f"qtool evaluate's default: the QDQ model onnxruntime runs; {others} for the others"


def _source(rec: TensorRecord, th, method: str | None, cal: Calibration, shared: list[str]) -> str:
    """Where the exported threshold of `rec` comes from, in a few words."""
    if shared:
        return f"range shared with {len(shared)} tensor(s) of its Concat/pass-through group"
    if th is not None and th.degenerate:
        return f"max |x|: the {method or cal.method} threshold would clip {th.clipped * 100:.1f} %"
    grid = "unsigned" if th is not None and th.unsigned else "signed"
    if method is None:
        searched = rec.unsigned and grid == "signed" and cal.method in calibration.GRID_DEPENDENT
        return f"{cal.method} (the file's{', searched again on the signed grid' if searched else ''})"
    if method == "auto":
        chosen, _ = thresholds.auto_choice(np.asarray(rec.counts, dtype=np.int64), rec.edges(), absmax=rec.absmax,
                                           unsigned=grid == "unsigned", kl_variant=cal.kl_variant, num_bits=cal.num_bits)
        return f"auto: {chosen}, {grid} grid"
    return f"{method}, {grid} grid"


def _layers(site) -> list[str]:
    return sorted({name for name, _slot in site.readers})


def target_plan(loaded, cal: Calibration, target: str, *, why: str, method: str | None = None, **options) -> TargetPlan:
    """The quantizers `target`'s export (default options, `method` and the target's own export
    `options`, keywords of qtool.targets.OPTIONS, as export takes them) places in `loaded`, the model `cal`
    calibrates: the target's own `shown`."""
    if target not in TARGETS:
        raise QtoolError("{target} is not one of {targets}", target=Opt("target", target, quoted=True), targets=", ".join(TARGETS))
    if method is not None:
        try:
            thresholds.parse_method(method)
        except ValueError as e:
            raise QtoolError("{method}: {why}", method=Opt("method"), why=str(e)) from None
    for key in options:
        if key not in targets.get(target).options:
            readers = targets.reading(key)
            raise QtoolError("{option} applies to {first}{others}, not {target}", option=Opt(key), first=Opt("target", readers[0]),
                             others="".join(f" or {t}" for t in readers[1:]), target=target)
    view = targets.get(target).module().report_view(loaded, cal, method=method, **options)
    used, plan = view.cal, view.plan
    return TargetPlan(target, view.title, why, view.method or used.method, {s.tensor: s for s in plan.activations}, list(plan.weights),
                      len(plan.int8_layers), dict(plan.fp32_layers), dict(plan.unrepresentable), {t.name: t for t in used.tensors},
                      view, list(view.notes))


def tensor_sqnr(record: TensorRecord, step: float, limit: float) -> float | None:
    """The tensor's own SQNR (dB) under a quantizer with grid step `step` that clips |x| at
    `limit`, estimated from its histogram of |x| (qtool.statistics.noise; zero is on every qtool
    grid, so the lattice is k * step): 10 log10(E[x^2] / E[(x - q(x))^2]); None when the tensor
    is all zero."""
    if record.hist_range <= 0 or not (step > 0 and math.isfinite(step)):
        return None
    found = noise.histogram_error(record.counts, record.edges(), noise.lattice(step, limit=limit))
    return None if found is None else found.sqnr_db


def site_sqnr(record: TensorRecord, plan: TargetPlan, q: Quantizer) -> float | None:
    """tensor_sqnr under the export's quantizer (None for per-channel quantizers)."""
    step = scale(plan, q)
    if step is None:
        return None
    low, high = covered(plan, q)
    limit = max(high, min(-low, amax(q)))  # the far end of the grid on the side |x| is clipped
    return tensor_sqnr(record, step, limit)


# ---------------------------------------------------------------- the evaluation file


def load_evaluation(path: Path, cal: Calibration) -> dict:
    """`qtool evaluate --json` output for the model `cal` calibrates (read bounded, as
    calibration files are)."""
    name = str(path)
    data = calibration.read_input(path, MAX_EVALUATION_BYTES, "evaluation file")
    try:
        doc = calibration.json_document(data, MAX_EVALUATION_DEPTH)
    except ValueError as e:
        raise QtoolError(f"{name!r} is not readable JSON ({e}); give the output of qtool evaluate --json") from None
    if not isinstance(doc, dict) or doc.get("command") != "evaluate":
        raise QtoolError(f"{name!r} is not the output of qtool evaluate --json")
    if doc.get("model_sha256") != cal.model_sha256:
        raise QtoolError(f"{name!r} evaluates {str(doc.get('model'))!r} (SHA-256 {str(doc.get('model_sha256'))[:12]}), not the model the "
                         f"calibration file records, {cal.model_path!r} (SHA-256 {cal.model_sha256[:12]})")
    try:
        target = str(doc.get("target", DEFAULT_TARGET))
        tensors, ranges, weights = {}, {}, {}
        for t in doc.get("tensors", []):
            sqnr = from_json_number(t["sqnr_db"])
            if t["kind"] == "weight":
                weights[str(t["tensor"])] = sqnr
            else:
                tensors[str(t["tensor"])] = sqnr
                if t.get("range") is not None:
                    ranges[str(t["tensor"])] = float(t["range"]["amax"])
        outputs = [(str(o["name"]), from_json_number(o["sqnr_db"]), from_json_number(o.get("cosine")),
                    from_json_number(o.get("top1_agreement"))) for o in doc.get("outputs", [])]
        samples = int(doc.get("samples", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise QtoolError(f"{name!r} is a damaged evaluation file (bad or missing field: {e})") from None
    if target not in TARGETS:
        raise QtoolError(f"{name!r} evaluates an unknown target {target!r}")
    return {"target": target, "tensors": tensors, "ranges": ranges, "weights": weights, "outputs": outputs, "samples": samples}



# ---------------------------------------------------------------- the page's data


@dataclass(frozen=True)
class QuantizedRow:
    """A tensor the target quantizes, as its export writes it."""

    order: int  # 1-based position in the calibration file (graph order)
    tensor: str
    layers: list[str]  # the layers reading it
    grid: str  # e.g. "uint8 symmetric"
    low: float  # the range the grid covers
    high: float
    threshold: float  # the threshold the export quantizes with
    scale: float | None  # the scale in the file (None: per channel)
    zero_point: int
    channels: int  # a per-channel quantizer's channels (0: per tensor)
    source: str  # where the threshold comes from
    clipped: float  # share of the calibrated values above the threshold
    clips_too_much: bool  # more than calibration.MAX_CLIPPED
    tensor_sqnr: float | None  # its own SQNR (dB) under the export's quantizer (None: per channel)
    sqnr: float | None  # from the evaluation: the output SQNR (dB) with only this tensor quantized
    plot: HistogramPlot


@dataclass(frozen=True)
class FloatRow:
    """A calibrated tensor the target leaves float."""

    order: int
    tensor: str
    min: float
    absmax: float
    amax: float  # the file's
    note: str  # why it is unrepresentable in 8 bits, if it is


@dataclass(frozen=True)
class WeightRow:
    tensor: str
    layers: list[str]
    channels: int
    scale_min: float
    scale_max: float
    sqnr: float | None  # from the evaluation
    policy: str


@dataclass(frozen=True)
class EvaluationView:
    """What the page shows of `qtool evaluate --json`."""

    samples: int
    outputs: list[tuple[str, float | None, float | None, float | None]]  # (output, SQNR dB, cosine, top-1 agreement)
    other_thresholds: list[str]  # quantized tensors evaluated with another threshold than the page's
    ranked: bool  # evaluated with --tensors: an output SQNR per tensor


@dataclass(frozen=True)
class FileView:
    """The calibration file's header."""

    name: str  # how to name the file
    model: str  # the calibrated model, as the file records it
    model_sha256: str
    method: str  # e.g. "entropy (nvidia)"
    num_bits: int
    bins: int
    samples: int
    tensors: int
    preprocessing: list[tuple[str, object]]  # (setting, value), sorted


@dataclass(frozen=True)
class TargetView:
    """The target and what its placement does."""

    target: str
    title: str  # e.g. "QDQ model (onnxruntime)"
    method: str  # the threshold method the export uses
    why: str  # why this target
    int8_layers: int
    unrepresentable: int  # tensors unrepresentable in 8 bits
    notes: list[str]


@dataclass(frozen=True)
class Page:
    """Everything the report page shows, top to bottom."""

    file: FileView
    target: TargetView
    evaluation: EvaluationView | None
    quantized: list[QuantizedRow]
    unquantized: list[FloatRow]
    fp32_layers: list[tuple[str, str]]  # (layer, why), sorted
    weights: list[WeightRow]

    @property
    def summary(self) -> list[tuple[int, float | None, float | None]]:
        """The summary plot's points: (row number, tensor SQNR dB, output SQNR dB) per quantized tensor."""
        return [(r.order, r.tensor_sqnr, r.sqnr) for r in self.quantized]


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-30)


def _merged(record: TensorRecord) -> tuple[np.ndarray, np.ndarray]:
    """The record's histogram with neighbouring bins summed to at most PLOT_BINS: (counts, edges)."""
    counts = np.asarray(record.counts, dtype=np.float64)
    n = counts.size
    factor = 1
    while -(-n // factor) > PLOT_BINS:
        factor *= 2
    m = -(-n // factor)
    padded = np.zeros(m * factor)
    padded[:n] = counts
    width = record.hist_range / n if n else 0.0
    return padded.reshape(m, factor).sum(axis=1), np.arange(m + 1) * width * factor


def _quantized_row(cal: Calibration, plan: TargetPlan, order: int, rec: TensorRecord, sqnr: float | None) -> QuantizedRow:
    site = plan.sites[rec.name]
    lines = {}
    for m in methods():
        try:
            lines[m] = rec.threshold(m, cal.kl_variant, num_bits=cal.num_bits)
        except ValueError as err:
            raise QtoolError(f"tensor {rec.name!r}: cannot compute the {m} threshold ({err})") from None
    threshold, (low, high) = amax(site), covered(plan, site)
    clipped = calibration.clipped_fraction(rec, threshold)
    counts, edges = _merged(rec)
    plot = HistogramPlot(counts, edges, plan.target, threshold, f"file ({cal.method})", rec.amax, _differs(rec.amax, threshold), lines)
    return QuantizedRow(order, rec.name, _layers(site), grid(plan, site), low, high, threshold, scale(plan, site), zero_point(plan, site),
                        channels(plan, site), source(plan, site), clipped, clipped > calibration.MAX_CLIPPED, site_sqnr(rec, plan, site),
                        sqnr, plot)


def _evaluation_view(plan: TargetPlan, evaluation: dict) -> EvaluationView:
    other = sorted(t for t, a in evaluation["ranges"].items() if t in plan.sites and _differs(a, amax(plan.sites[t])))
    return EvaluationView(evaluation["samples"], list(evaluation["outputs"]), other, bool(evaluation["tensors"] or evaluation["weights"]))


def _file_view(cal: Calibration, name: str) -> FileView:
    method = cal.method + (f" ({cal.kl_variant})" if cal.method == "entropy" else "")
    return FileView(name, cal.model_path, cal.model_sha256, method, cal.num_bits, cal.bins, cal.samples, len(cal.tensors),
                    sorted(cal.preprocess.items(), key=lambda kv: kv[0]))


def _weight_rows(plan: TargetPlan, sqnr: dict[str, float | None]) -> list[WeightRow]:
    out = []
    for w in plan.weights:
        scales = np.asarray(w.params().scale, dtype=np.float64)
        out.append(WeightRow(w.tensor, _layers(w), int(scales.size), float(scales.min()), float(scales.max()), sqnr.get(w.tensor),
                             w.policy.describe()))
    return out


def page(cal: Calibration, calib_name: str, plan: TargetPlan, evaluation: dict | None = None) -> Page:
    """The report's data for `cal` as `plan`'s target exports it (evaluation: load_evaluation's):
    every calibrated tensor in graph order, then the tensors SmoothQuant added (the export's
    records of its scaled activations), split into the quantized and the float ones."""
    sens = evaluation["tensors"] if evaluation else {}
    names = {t.name for t in cal.tensors}
    added = [r for n, r in plan.records.items() if n not in names]
    quantized, unquantized = [], []
    for k, rec in enumerate([*cal.tensors, *added]):
        rec = plan.records.get(rec.name, rec)
        if rec.name in plan.sites:
            quantized.append(_quantized_row(cal, plan, k + 1, rec, sens.get(rec.name)))
        else:
            unquantized.append(FloatRow(k + 1, rec.name, rec.min, rec.absmax, rec.amax, plan.unrepresentable.get(rec.name, "")))
    view = _evaluation_view(plan, evaluation) if evaluation else None
    target = TargetView(plan.target, plan.title, plan.method, plan.why, plan.int8_layers, len(plan.unrepresentable), list(plan.notes))
    return Page(_file_view(cal, calib_name), target, view, quantized, unquantized, sorted(plan.fp32_layers.items()),
                _weight_rows(plan, evaluation["weights"] if view is not None and view.ranked else {}))


def render(cal: Calibration, calib_name: str, plan: TargetPlan, evaluation: dict | None = None) -> bytes:
    """The report page for `cal` as `plan`'s target exports it (calib_name: how to name the file)."""
    require_matplotlib()
    if evaluation is not None and evaluation["target"] != plan.target:
        raise QtoolError("the {evaluation} file measures {measured}, this report is for {shown}; give {measured} or evaluate {shown}",
                         evaluation=Opt("evaluation"), measured=Opt("target", evaluation["target"]), shown=Opt("target", plan.target))
    from . import report_page  # jinja2: imported by the one command that lays out a page (3 MB of every other)

    return report_page.html(page(cal, calib_name, plan, evaluation)).encode("utf-8")
