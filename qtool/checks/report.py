"""One self-contained HTML page about a calibration file as one target's export will use it.

From top to bottom:
  summary   which target and why, its placement's counts, the preprocessing as a table, the
            evaluation's output metrics (with `qtool evaluate --json`), and one plot of the error
            of every quantized tensor in graph order: the tensor's own SQNR under the export's
            quantizer (estimated from its histogram), and with an evaluation the output SQNR with
            only that tensor quantized.
  quantized the tensors the target's placement quantizes (the same code the export runs:
            each target's `shown`, qtool.targets), in
            graph order: the threshold and scale the export writes, where that threshold comes
            from, the share of values it clips, and a histogram of |x| (log counts) with the
            target's threshold, the file's amax and every method's threshold drawn on it.
  folded    (<details>) the calibrated tensors the target leaves float, the layers it keeps in
            FP32 and the weight quantizers.
The quantized table sorts by clicking a heading, or on opening with #sort=KEY in the address.
Plots are matplotlib SVG, inline, scaled to the column (nothing wider than the window); nothing is
fetched from the network. Same inputs give the same bytes.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import calibration, targets
from ..calibration import Calibration, TensorRecord
from ..errors import Opt, QtoolError
from ..quantizers.quantizer import Quantizer
from ..statistics import thresholds
from .evaluation import format_db, from_json_number

TARGETS = tuple(sorted(targets.names()))
DEFAULT_TARGET = "qdq"
MAX_EVALUATION_BYTES = 64 << 20  # qtool evaluate --json of a model with 10^4 tensors is a few MB
MAX_EVALUATION_DEPTH = 16  # its JSON nests 5 levels
PLOT_BINS = 256
_FLOOR = 0.5
PERCENTILES = ("99.99",)
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#7f7f7f")
_TARGET_COLOR = "#e6550d"


def require_matplotlib():
    """matplotlib, or a one-line QtoolError saying how to install it."""
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError:
        raise QtoolError("qtool report draws its plots with matplotlib, which is not installed; pip install 'qtool[report]'") from None
    return matplotlib


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
    shown: targets.Shown  # the target's view of its export (thresholds, scales as the file holds them, SmoothQuant)
    notes: list[str] = field(default_factory=list)


# What the page shows of an activation quantizer, as the target's export writes it


def amax(q: Quantizer) -> float:
    """The threshold the export quantizes with."""
    return float(q.range.amax)


def _file_scale(plan: TargetPlan, q: Quantizer) -> float | None:
    """The per-tensor scale as the file holds it on the int8 symmetric grid, when the target shows one (a signed-only Q/DQ target)."""
    return None if plan.shown.scales is None else plan.shown.scales[q.tensor]


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
    view = plan.shown
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
            readers = targets.taking(key)
            raise QtoolError("{option} applies to {first}{others}, not {target}", option=Opt(key), first=Opt("target", readers[0]),
                             others="".join(f" or {t}" for t in readers[1:]), target=target)
    view = targets.get(target).module().shown(loaded, cal, method=method, **options)
    used, plan = view.cal, view.plan
    return TargetPlan(target, view.title, why, view.method or used.method, {s.tensor: s for s in plan.activations}, list(plan.weights),
                      len(plan.int8_layers), dict(plan.fp32_layers), dict(plan.unrepresentable), {t.name: t for t in used.tensors},
                      view, list(view.notes))


def tensor_sqnr(record: TensorRecord, step: float, limit: float) -> float | None:
    """The tensor's own SQNR (dB) under a quantizer with grid step `step` that clips |x| at
    `limit`, from its histogram of |x| with values spread evenly inside each bin (as
    thresholds.quantization_error; zero is on every qtool grid, so the lattice is k * step):
    10 log10(E[x^2] / E[(x - q(x))^2]); None when the tensor is all zero."""
    counts = np.asarray(record.counts, dtype=np.float64)
    total = float(counts.sum())
    if total <= 0 or record.hist_range <= 0 or not (step > 0 and math.isfinite(step)):
        return None
    x = thresholds.bin_points(record.edges())
    q = np.minimum(np.rint(x / step) * step, limit)
    noise = float(np.dot(counts, ((x - q) ** 2).mean(axis=1)) / total)
    power = float(np.dot(counts, (x ** 2).mean(axis=1)) / total)
    if power <= 0:
        return None
    return math.inf if noise <= 0 else 10.0 * math.log10(power / noise)


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
        raise QtoolError(f"{name!r} evaluates another model than the calibration file's (SHA-256 differs)")
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


# ---------------------------------------------------------------- plots


def _merged(record: TensorRecord) -> tuple[np.ndarray, np.ndarray]:
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


def _count_label(v: float, _pos=None) -> str:
    return f"{v:g}" if v < 1000 else f"1e{round(math.log10(v))}"


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-30)


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _svg(fig, prefix: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return _inline(buf.getvalue(), prefix)


def plot_svg(record: TensorRecord, lines: dict[str, float], file_label: str, target_label: str, target_amax: float,
             prefix: str) -> str:
    """The histogram of one tensor with the target's threshold (thick orange), the file's amax
    (dashed black, when it differs) and `lines` {method: threshold}, as an inline <svg>."""
    matplotlib = require_matplotlib()
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qtool", "font.size": 8}):
        fig = Figure(figsize=(5.2, 2.2))
        ax = fig.add_axes((0.12, 0.2, 0.5, 0.74))
        counts, edges = _merged(record)
        if counts.sum() > 0 and edges[-1] > 0:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

            shown = np.where(counts > 0, counts, _FLOOR)  # empty bins sit on the floor of the log axis
            ax.stairs(shown, edges, fill=True, color="#9ecae1", edgecolor="#3182bd", linewidth=0.6, baseline=_FLOOR)
            ax.set_yscale("log", nonpositive="clip")
            ax.set_ylim(_FLOOR, max(counts.max() * 2.0, 1.0))
            ax.set_xlim(0, max(edges[-1], max(lines.values(), default=0.0), record.amax, target_amax) * 1.02)
            ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(_count_label))
        else:
            ax.text(0.5, 0.5, "no values (all zero)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("|x|")
        ax.set_ylabel("count (log)")
        ax.axvline(target_amax, color=_TARGET_COLOR, linewidth=2.6, label=f"{target_label}: {_fmt(target_amax)}")
        if _differs(record.amax, target_amax):
            ax.axvline(record.amax, color="black", linewidth=1.8, linestyle=(0, (4, 2)), alpha=0.75, label=f"{file_label}: {_fmt(record.amax)}")
        styles = ["-", "--", "-.", ":"]
        for j, (m, v) in enumerate(lines.items()):
            ax.axvline(v, color=_COLORS[j % len(_COLORS)], linewidth=0.9, linestyle=styles[j % len(styles)], label=f"{m}: {_fmt(v)}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), fontsize=7.5, frameon=False, borderaxespad=0, handlelength=1.6)
        return _svg(fig, prefix)


def summary_svg(points: list[tuple[int, float | None, float | None]], evaluated: bool, prefix: str) -> str:
    """Error per quantized tensor in graph order: points (row number, tensor SQNR dB, output
    SQNR dB); the five worst of each series labelled with their row number (a link to the row)."""
    matplotlib = require_matplotlib()
    from matplotlib.figure import Figure

    panels = [("tensor SQNR (dB): its own quantization noise", 1)] + ([("output SQNR (dB), only this tensor quantized", 2)] if evaluated else [])
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qtool", "font.size": 8}):
        height = 1.7 * len(panels) + 0.45
        fig = Figure(figsize=(10.0, height))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        xs = np.arange(1, len(points) + 1)
        for ax, (title, k) in zip(axes, panels):
            ys = np.array([np.nan if p[k] is None else min(p[k], 200.0) for p in points], dtype=np.float64)
            finite = np.isfinite(ys)
            ax.bar(xs[finite], ys[finite], width=0.8, color="#6baed6" if k == 1 else "#fd8d3c")
            ax.set_title(title, fontsize=8, loc="left")
            ax.grid(axis="y", color="#dddddd", linewidth=0.5)
            ax.set_axisbelow(True)
            if finite.any():
                top = float(np.nanmax(ys))
                ax.set_ylim(min(0.0, float(np.nanmin(ys))), top * 1.15 + 1.0)
                for i in sorted(np.flatnonzero(finite), key=lambda i: (ys[i], i))[:5]:
                    t = ax.annotate(f"#{points[i][0]}", (xs[i], ys[i]), xytext=(0, 2), textcoords="offset points",
                                    ha="center", va="bottom", fontsize=7, color="#b30000",
                                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
                    t.set_url(f"#row{points[i][0]}")
            else:
                ax.text(0.5, 0.5, "no value", ha="center", va="center", transform=ax.transAxes)
        every = -(-len(points) // 30)  # at most 30 tick labels
        axes[-1].set_xticks(xs[::every], [str(p[0]) for p in points[::every]])
        axes[-1].set_xlabel("quantized tensors in graph order, labelled with their row #")
        axes[-1].set_xlim(0.3, len(points) + 0.7)
        fig.subplots_adjust(left=0.06, right=0.99, top=1 - 0.3 / height, bottom=0.42 / height, hspace=0.35)
        return _svg(fig, prefix)


def _inline(svg: str, prefix: str) -> str:
    """matplotlib's SVG document as an element: no prolog, metadata or fixed size (it scales to
    its box through the viewBox), path coordinates to 0.01 pt, ids kept only where referenced
    and then prefixed (unique within the page)."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    head_end = svg.index(">")
    head = re.sub(r'\s(width|height)="[^"]*"', "", svg[:head_end])
    svg = head + svg[head_end:]
    svg = re.sub(r'\bd="([^"]*)"', lambda m: 'd="' + re.sub(r"(\.\d\d)\d+", r"\1", " ".join(m.group(1).split())) + '"', svg)
    used = set(re.findall(r"url\(#([^)]+)\)", svg)) | set(re.findall(r'href="#([^"]+)"', svg))
    used = {u for u in used if not u.startswith("row")}
    svg = re.sub(r'\sid="([^"]+)"', lambda m: f' id="{prefix}{m.group(1)}"' if m.group(1) in used else "", svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: m.group(0) if m.group(1).startswith("row") else f'href="#{prefix}{m.group(1)}"', svg)
    return svg.strip()


# ---------------------------------------------------------------- the page


def _attr(v: float | None) -> str:
    if v is None or math.isnan(v):
        return ""
    return "Infinity" if v == math.inf else "-Infinity" if v == -math.inf else repr(float(v))


def _db(v: float | None) -> str:
    return "" if v is None else format_db(v)


def _value(v) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


_STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;padding:1em 1.5em;color:#222}
h1{font-size:1.35em;margin:0 0 .3em} h2{font-size:1.1em;margin:1.2em 0 .4em} .meta{color:#555;font-size:.9em;margin:.2em 0}
.target{border-left:4px solid #e6550d;padding:.3em .8em;background:#fff5eb;margin:.6em 0}
.scroll{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:.86em} th,td{border-bottom:1px solid #ddd;padding:.3em .5em;vertical-align:middle;text-align:right}
th{background:#f3f3f3;position:sticky;top:0;z-index:1} th.sort{cursor:pointer;color:#0645ad}
th.sort:hover{text-decoration:underline} .left,td.name,td.key{text-align:left}
td.name{font-family:ui-monospace,Consolas,monospace;overflow-wrap:anywhere;word-break:break-all;min-width:10em}
td.name small{display:block;color:#666;font-family:system-ui,sans-serif}
td{white-space:nowrap} td.name,td.left,td.plot{white-space:normal}
table.quantized{width:100%;table-layout:auto} table.quantized td.plot{width:42%;padding:0 0 0 .3em}
svg{max-width:100%;height:auto;display:block} td.plot svg{width:100%;max-width:620px} .summary svg{width:100%;max-width:1200px}
.bad{color:#b30000;font-weight:600} .note{color:#e6550d;font-size:.85em}
details{margin:.6em 0} summary{cursor:pointer;font-weight:600}
"""

_SCRIPT = """
(function(){
  var table=document.getElementById('quantized'); if(!table) return;
  var body=table.tBodies[0], dir={};
  var first={order:1, amax:-1, clipped:-1, tsqnr:1, sqnr:1};
  function val(tr,key){var s=tr.getAttribute('data-'+key); return s===''||s===null?null:parseFloat(s);}
  function sortBy(key){
    var d=dir[key]===undefined?first[key]:-dir[key]; dir={}; dir[key]=d;
    var trs=Array.prototype.slice.call(body.rows);
    trs.sort(function(a,b){
      var x=val(a,key), y=val(b,key);
      if(x===null&&y===null) return val(a,'order')-val(b,'order');
      if(x===null) return 1; if(y===null) return -1;
      if(x===y) return val(a,'order')-val(b,'order');
      return x<y?-d:d;
    });
    trs.forEach(function(tr){body.appendChild(tr);});
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){
      var k=th.getAttribute('data-key'); if(!k) return;
      th.setAttribute('aria-sort', k===key?(d>0?'ascending':'descending'):'none');
      th.querySelector('span').textContent = k===key?(d>0?' \\u25B2':' \\u25BC'):'';
    });
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th){
    var k=th.getAttribute('data-key'); if(k) th.addEventListener('click',function(){sortBy(k);});
  });
  var m=/sort=(\\w+)/.exec(location.hash); if(m&&first[m[1]]!==undefined) sortBy(m[1]);
})();
"""


@dataclass
class Row:
    order: int  # 1-based position in the calibration file (graph order)
    record: TensorRecord
    site: Quantizer | None
    clipped: float  # share of values above the exported threshold (the file's amax when not quantized)
    tensor_sqnr: float | None
    sqnr: float | None  # from the evaluation


def rows(cal: Calibration, plan: TargetPlan, evaluation: dict | None = None) -> list[Row]:
    """Every calibrated tensor in graph order, with the target's quantizer when it has one, then
    the tensors SmoothQuant added (the export's records of its scaled activations)."""
    sens = evaluation["tensors"] if evaluation else {}
    out = []
    names = {t.name for t in cal.tensors}
    added = [r for n, r in plan.records.items() if n not in names]
    for k, rec in enumerate([*cal.tensors, *added]):
        rec = plan.records.get(rec.name, rec)
        site = plan.sites.get(rec.name)
        threshold = amax(site) if site else rec.amax
        out.append(Row(k + 1, rec, site, calibration.clipped_fraction(rec, threshold), site_sqnr(rec, plan, site) if site else None,
                       sens.get(rec.name)))
    return out


def render(cal: Calibration, calib_name: str, plan: TargetPlan, evaluation: dict | None = None) -> bytes:
    """The report page for `cal` as `plan`'s target exports it (calib_name: how to name the file)."""
    require_matplotlib()
    if evaluation is not None and evaluation["target"] != plan.target:
        raise QtoolError("the {evaluation} file measures {measured}, this report is for {shown}; give {measured} or evaluate {shown}",
                         evaluation=Opt("evaluation"), measured=Opt("target", evaluation["target"]), shown=Opt("target", plan.target))
    table = rows(cal, plan, evaluation)
    ranked = bool(evaluation and (evaluation["tensors"] or evaluation["weights"]))  # evaluated with --tensors
    quantized = [r for r in table if r.site is not None]
    rest = [r for r in table if r.site is None]
    e = html.escape
    method_text = cal.method + (f" ({cal.kl_variant})" if cal.method == "entropy" else "")
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        f"<title>qtool report: {e(calib_name)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n",
        f"<h1>Calibration report: {e(calib_name)}</h1>\n",
        (f"<p class=\"meta\">model {e(cal.model_path)} (SHA-256 {e(cal.model_sha256[:16])}…) · file method {e(method_text)} · "
         f"{cal.num_bits} bits · {cal.bins} bins · {cal.samples} samples · {len(cal.tensors)} tensors</p>\n"),
        (f"<div class=\"target\" id=\"target\"><b>Target: {e(plan.target)}</b> — {e(plan.title)}; thresholds: {e(plan.method)}. "
         f"<span class=\"meta\">Why this target: {e(plan.why)}.</span><br>"
         f"{len(quantized)} of {len(cal.tensors)} calibrated tensors quantized, {len(plan.weights)} weight quantizers, "
         f"{plan.int8_layers} int8 layers, {len(plan.fp32_layers)} layer(s) kept FP32"
         + (f", {len(plan.unrepresentable)} tensors unrepresentable in 8 bits" if plan.unrepresentable else "") + "."
         + "".join(f"<br><span class=\"meta\">{e(n)}</span>" for n in plan.notes) + "</div>\n"),
    ]
    if evaluation:
        parts.append(f"<h2>Evaluation</h2>\n<p class=\"meta\">qtool evaluate on {evaluation['samples']} samples: the {e(plan.target)} "
                     "int8 model (exact simulation) against FP32</p>\n")
        parts.append("<div class=\"scroll\"><table class=\"outputs\"><thead><tr><th class=\"left\">output</th><th>SQNR dB</th>"
                     "<th>cosine</th><th>top-1 agreement</th></tr></thead><tbody>\n")
        for name, sqnr, cos, top1 in evaluation["outputs"]:
            parts.append(f"<tr><td class=\"name\">{e(name)}</td><td>{_db(sqnr)}</td>"
                         f"<td>{'' if cos is None else f'{cos:.5f}'}</td><td>{'' if top1 is None else f'{top1 * 100:.2f} %'}</td></tr>\n")
        parts.append("</tbody></table></div>\n")
        other = sorted(t for t, a in evaluation["ranges"].items() if t in plan.sites and _differs(a, amax(plan.sites[t])))
        if other:
            parts.append(f"<p class=\"note\">{len(other)} tensor(s) were evaluated with another threshold than this page's "
                         f"(the evaluation ran with other export options?): {e(', '.join(other[:5]))}{' …' if len(other) > 5 else ''}</p>\n")
    parts.append("<h2>Error per quantized tensor</h2>\n<div class=\"summary\">")
    parts.append(summary_svg([(r.order, r.tensor_sqnr, r.sqnr) for r in quantized], ranked, "summary-") if quantized
                 else "<p class=\"meta\">the target quantizes no tensor of this model</p>")
    parts.append("</div>\n<p class=\"meta\">Lower is worse. Tensor SQNR: signal power over the noise of the export's quantizer "
                 "(rounding and clipping at its threshold), estimated from the tensor's calibrated histogram of |x|"
                 + ("; output SQNR: from qtool evaluate --tensors, the model's worst output with only that tensor quantized" if ranked else "")
                 + ". The five worst of each are labelled with their row number.</p>\n")
    parts.append(_preprocessing(cal.preprocess))
    parts.append(_quantized_table(cal, plan, quantized, evaluation if ranked else None))
    parts.append(_folded(plan, rest, evaluation if ranked else None))
    parts.append(f"<script>{_SCRIPT}</script>\n</body>\n</html>\n")
    return "".join(parts).encode("utf-8")


def _preprocessing(pre: dict) -> str:
    e = html.escape
    out = ["<h2>Preprocessing</h2>\n<div class=\"scroll\"><table class=\"preprocessing\"><tbody>\n"]
    for key in sorted(pre):
        out.append(f"<tr><td class=\"key\">{e(str(key))}</td><td class=\"left\">{e(_value(pre[key]))}</td></tr>\n")
    if not pre:
        out.append("<tr><td class=\"left\">not recorded</td></tr>\n")
    out.append("</tbody></table></div>\n")
    return "".join(out)


def _quantized_table(cal: Calibration, plan: TargetPlan, quantized: list[Row], evaluation: dict | None) -> str:
    e = html.escape
    out = [f"<h2>Quantized by {e(plan.target)} ({len(quantized)} tensors, graph order)</h2>\n",
           "<p class=\"meta\">Click a heading to sort. Threshold and scale: what the export writes; clipped: share of the "
           "calibrated values above that threshold. Plot: histogram of |x| (log counts), the target's threshold in orange, the "
           "file's own amax dashed where it differs, and each method's threshold.</p>\n"]
    heads = [("order", "#"), (None, "tensor"), (None, "grid"), ("amax", "threshold"), (None, "scale"), (None, "from"),
             ("clipped", "clipped"), ("tsqnr", "tensor SQNR dB")]
    if evaluation:
        heads.append(("sqnr", "output SQNR dB"))
    heads.append((None, "histogram and thresholds"))
    out.append("<div class=\"scroll\"><table class=\"quantized\" id=\"quantized\"><thead><tr>")
    for key, label in heads:
        cls = " left" if label in ("tensor", "from", "grid") else ""
        if key:
            out.append(f"<th class=\"sort{cls}\" data-key=\"{key}\" aria-sort=\"none\">{e(label)}<span></span></th>")
        else:
            out.append(f"<th class=\"{cls.strip()}\">{e(label)}</th>" if cls else f"<th>{e(label)}</th>")
    out.append("</tr></thead>\n<tbody>\n")
    others = methods()
    for row in quantized:
        rec, site = row.record, row.site
        lines = {}
        for m in others:
            try:
                lines[m] = rec.threshold(m, cal.kl_variant, num_bits=cal.num_bits)
            except ValueError as err:
                raise QtoolError(f"tensor {rec.name!r}: cannot compute the {m} threshold ({err})") from None
        layers, step, zero, (low, high), threshold = _layers(site), scale(plan, site), zero_point(plan, site), covered(plan, site), amax(site)
        readers = f"<small>→ {e(', '.join(layers))}</small>" if layers else ""
        shown_scale = (f"{step:.6g}" + (f"<br><small>zero point {zero}</small>" if zero else "")
                       if step is not None else f"{channels(plan, site)} channels")
        clipped_cls = " class=\"bad\"" if row.clipped > calibration.MAX_CLIPPED else ""
        data = (f"id=\"row{row.order}\" data-order=\"{row.order}\" data-amax=\"{_attr(threshold)}\" data-clipped=\"{_attr(row.clipped)}\" "
                f"data-tsqnr=\"{_attr(row.tensor_sqnr)}\" data-sqnr=\"{_attr(row.sqnr)}\" data-tensor=\"{e(rec.name)}\" "
                f"data-scale=\"{_attr(step)}\" data-low=\"{_attr(low)}\" data-high=\"{_attr(high)}\"")
        cells = [f"<td>{row.order}</td>", f"<td class=\"name\">{e(rec.name)}{readers}</td>",
                 f"<td class=\"left\">{e(grid(plan, site))}<br><small>[{_fmt(low)}, {_fmt(high)}]</small></td>",
                 f"<td><b>{_fmt(threshold)}</b></td>", f"<td>{shown_scale}</td>", f"<td class=\"left\"><small>{e(source(plan, site))}</small></td>",
                 f"<td{clipped_cls}>{row.clipped * 100:.3f} %</td>", f"<td>{_db(row.tensor_sqnr)}</td>"]
        if evaluation:
            cells.append(f"<td>{_db(row.sqnr)}</td>")
        svg = plot_svg(rec, lines, f"file ({cal.method})", plan.target, threshold, f"t{row.order}-")
        cells.append(f"<td class=\"plot\">{svg}</td>")
        out.append(f"<tr {data}>" + "".join(cells) + "</tr>\n")
    out.append("</tbody></table></div>\n")
    return "".join(out)


def _folded(plan: TargetPlan, rest: list[Row], evaluation: dict | None) -> str:
    e = html.escape
    out = [f"<h2>Not quantized, FP32 layers, weights</h2>\n<details id=\"unquantized\"><summary>{len(rest)} calibrated tensors "
           f"{e(plan.target)} leaves float</summary>\n<div class=\"scroll\"><table class=\"unquantized\"><thead><tr><th>#</th>"
           "<th class=\"left\">tensor</th><th>min</th><th>max |x|</th><th>file amax</th><th class=\"left\">note</th></tr></thead><tbody>\n"]
    for row in rest:
        rec = row.record
        note = plan.unrepresentable.get(rec.name, "")
        out.append(f"<tr data-unquantized=\"{row.order}\"><td>{row.order}</td><td class=\"name\">{e(rec.name)}</td><td>{_fmt(rec.min)}</td>"
                   f"<td>{_fmt(rec.absmax)}</td><td>{_fmt(rec.amax)}</td><td class=\"left\">{e(note)}</td></tr>\n")
    out.append("</tbody></table></div></details>\n")
    out.append(f"<details id=\"fp32\"><summary>{len(plan.fp32_layers)} layers kept in FP32</summary>\n<div class=\"scroll\"><table>"
               "<thead><tr><th class=\"left\">layer</th><th class=\"left\">why</th></tr></thead><tbody>\n")
    for name, why in sorted(plan.fp32_layers.items()):
        out.append(f"<tr><td class=\"name\">{e(name)}</td><td class=\"left\">{e(why)}</td></tr>\n")
    out.append("</tbody></table></div></details>\n")
    weights = evaluation["weights"] if evaluation else {}
    out.append(f"<details id=\"weights\"><summary>{len(plan.weights)} weight quantizers (per output channel)</summary>\n"
               "<div class=\"scroll\"><table><thead><tr><th class=\"left\">weight</th><th class=\"left\">layers</th><th>channels</th>"
               "<th>scale min</th><th>scale max</th>" + ("<th>output SQNR dB</th>" if evaluation else "")
               + "<th class=\"left\">policy</th></tr></thead><tbody>\n")
    for w in plan.weights:
        scales = np.asarray(w.params().scale, dtype=np.float64)
        out.append(f"<tr><td class=\"name\">{e(w.tensor)}</td><td class=\"name\">{e(', '.join(_layers(w)))}</td><td>{int(scales.size)}</td>"
                   f"<td>{float(scales.min()):.4g}</td><td>{float(scales.max()):.4g}</td>"
                   + (f"<td>{_db(weights.get(w.tensor))}</td>" if evaluation else "")
                   + f"<td class=\"left\">{e(w.policy.describe())}</td></tr>\n")
    out.append("</tbody></table></div></details>\n")
    return "".join(out)
