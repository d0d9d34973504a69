"""One self-contained HTML page about a calibration file: per tensor, its histogram with the
threshold every method would pick, and numbers to sort by.

Per tensor (a row of the table):
  plot      the stored histogram of |x| (log counts; bins merged in powers of two down to at
            most PLOT_BINS so the page stays small), a vertical line per threshold method
            (thresholds.METHODS, percentile:P as PERCENTILES) recomputed from the histogram
            with TensorRecord.threshold, and the file's own amax as a thick dashed line.
  clipped   share of the calibrated values above the file's amax (calibration.clipped_fraction).
  KL        NVIDIA's entropy-calibration divergence KL(P||Q) at the file's amax (the quantity
            its entropy search minimises, its h[0] = h[1] convention included); empty when
            the tensor is all zero.
  SQNR      from `qtool evaluate --json` results, when given: the output SQNR with only this
            tensor quantized (empty for tensors that are not quantizer sites). The evaluation also
            says which range the export really quantizes each tensor with; where that is not the
            file's amax (a range shared by a Concat or pass-through group, or max |x| in place of a
            degenerate threshold) it is drawn and noted in orange.
The table sorts by clicking a column heading, or on opening with #sort=clipped|kl|sqnr|order in the
address (a few lines of inline script; without script the page shows graph order). Plots are matplotlib SVG, inline, ids made unique per plot; nothing is
fetched from the network. Same inputs give the same bytes.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import calibration, thresholds
from .calibration import Calibration, TensorRecord
from .errors import QtoolError
from .evaluation import format_db, from_json_number

PLOT_BINS = 256
_FLOOR = 0.5
PERCENTILES = ("99.99",)
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2")


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


def kl_divergence(record: TensorRecord, amax: float, num_bits: int = 8) -> float | None:
    """NVIDIA's KL(P||Q) for clipping `record`'s histogram at `amax` (None: no data)."""
    h = np.asarray(record.counts, dtype=np.int64)
    n = h.size
    if n == 0 or h.sum() == 0 or record.hist_range <= 0:
        return None
    width = record.hist_range / n
    i = int(min(max(math.ceil(amax / width - 1e-9), 1), n))
    h = h.copy()
    if n > 1:
        h[0] = h[1]
    if h[:i].sum() == 0:
        return None
    nbins = 1 << (num_bits - 1 + int(record.unsigned))
    value = float(thresholds.reference_divergence(h, i, nbins))
    return value if math.isfinite(value) else (math.inf if value > 0 else None)


@dataclass
class Row:
    order: int
    record: TensorRecord
    thresholds: dict[str, float]
    clipped: float
    kl: float | None
    sqnr: float | None  # from the evaluation
    quantized_amax: float | None = None  # the range the export quantizes with (from the evaluation)
    policy: str = ""  # the quantizer's policy (from the evaluation)


def load_evaluation(path: Path, cal: Calibration) -> dict:
    """`qtool evaluate --json` output for the model `cal` calibrates."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QtoolError(f"evaluation file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QtoolError(f"{str(path)!r} is not readable JSON ({e}); give the output of qtool evaluate --json") from None
    if not isinstance(doc, dict) or doc.get("command") != "evaluate":
        raise QtoolError(f"{str(path)!r} is not the output of qtool evaluate --json")
    if doc.get("model_sha256") != cal.model_sha256:
        raise QtoolError(f"{str(path)!r} evaluates another model than the calibration file's (SHA-256 differs)")
    try:
        tensors, ranges, weights, policies = {}, {}, [], {}
        for t in doc.get("tensors", []):
            tensors[str(t["tensor"])] = from_json_number(t["sqnr_db"])
            policies[str(t["tensor"])] = str(t.get("policy", ""))
            if t["kind"] == "weight":
                weights.append((str(t["tensor"]), from_json_number(t["sqnr_db"]), [str(x) for x in t.get("layers", [])],
                                str(t.get("policy", ""))))
            if t.get("range") is not None:
                amax = float(t["range"]["amax"])
                for name in [t["tensor"], *t["range"].get("shared_with", [])]:
                    ranges.setdefault(str(name), amax)
        outputs = [(str(o["name"]), from_json_number(o["sqnr_db"]), from_json_number(o.get("cosine")),
                    from_json_number(o.get("top1_agreement"))) for o in doc.get("outputs", [])]
        samples = int(doc.get("samples", 0))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise QtoolError(f"{str(path)!r} is a damaged evaluation file (bad or missing field: {e})") from None
    return {"tensors": tensors, "ranges": ranges, "weights": weights, "outputs": outputs, "samples": samples, "policies": policies}


def rows(cal: Calibration, evaluation: dict | None = None) -> list[Row]:
    result = []
    sens = evaluation["tensors"] if evaluation else {}
    ranges = evaluation["ranges"] if evaluation else {}
    policies = evaluation.get("policies", {}) if evaluation else {}
    for k, rec in enumerate(cal.tensors):
        ths = {}
        for m in methods():
            try:
                ths[m] = rec.threshold(m, cal.kl_variant, num_bits=cal.num_bits)
            except ValueError as e:
                raise QtoolError(f"tensor {rec.name!r}: cannot compute the {m} threshold ({e})") from None
        result.append(Row(k, rec, ths, calibration.clipped_fraction(rec), kl_divergence(rec, rec.amax, cal.num_bits),
                          sens.get(rec.name), ranges.get(rec.name), policies.get(rec.name, "")))
    return result


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


def plot_svg(row: Row, method: str, prefix: str) -> str:
    """The histogram plot of one tensor as an inline <svg> element."""
    matplotlib = require_matplotlib()
    from matplotlib.figure import Figure

    rec = row.record
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "qtool", "font.size": 8}):
        fig = Figure(figsize=(6.4, 2.4))
        ax = fig.add_axes((0.1, 0.18, 0.61, 0.74))
        counts, edges = _merged(rec)
        if counts.sum() > 0 and edges[-1] > 0:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

            shown = np.where(counts > 0, counts, _FLOOR)  # empty bins sit on the floor of the log axis
            ax.stairs(shown, edges, fill=True, color="#9ecae1", edgecolor="#3182bd", linewidth=0.6, baseline=_FLOOR)
            ax.set_yscale("log", nonpositive="clip")
            ax.set_ylim(_FLOOR, max(counts.max() * 2.0, 1.0))
            ax.set_xlim(0, max(edges[-1], max(row.thresholds.values(), default=0.0), rec.amax) * 1.02)
            ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(_count_label))
        else:
            ax.text(0.5, 0.5, "no values (all zero)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("|x|")
        ax.set_ylabel("count (log)")
        styles = ["-", "--", "-.", ":"]
        for j, (m, v) in enumerate(row.thresholds.items()):
            ax.axvline(v, color=_COLORS[j % len(_COLORS)], linewidth=1.1, linestyle=styles[j % len(styles)], label=f"{m}: {_fmt(v)}")
        ax.axvline(rec.amax, color="black", linewidth=2.2, linestyle=(0, (4, 2)), alpha=0.75, label=f"file ({method}): {_fmt(rec.amax)}")
        if row.quantized_amax is not None and _differs(row.quantized_amax, rec.amax):
            ax.axvline(row.quantized_amax, color="#e6550d", linewidth=2.2, alpha=0.8, label=f"quantized at: {_fmt(row.quantized_amax)}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False, borderaxespad=0)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return _inline(buf.getvalue(), prefix)


def _inline(svg: str, prefix: str) -> str:
    """matplotlib's SVG document as an element: no prolog or metadata, path coordinates to
    0.01 pt, ids kept only where referenced and then prefixed (unique within the page)."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    svg = re.sub(r'\bd="([^"]*)"', lambda m: 'd="' + re.sub(r"(\.\d\d)\d+", r"\1", " ".join(m.group(1).split())) + '"', svg)
    used = set(re.findall(r"url\(#([^)]+)\)", svg)) | set(re.findall(r'href="#([^"]+)"', svg))
    svg = re.sub(r'\sid="([^"]+)"', lambda m: f' id="{prefix}{m.group(1)}"' if m.group(1) in used else "", svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', svg)
    return svg.strip()


def _quantized_note(row: Row) -> str:
    q = row.quantized_amax
    if q is None or not _differs(q, row.record.amax):
        return ""
    counts = np.asarray(row.record.counts, dtype=np.float64)
    left = row.record.edges()[:-1]
    share = float(counts[left >= q].sum() / counts.sum()) if counts.sum() > 0 and q < row.record.absmax else 0.0
    return f"<span class=\"note\" title=\"the range the export uses (shared or degenerate-threshold fallback)\">quantized at {_fmt(q)}, clips {share * 100:.3f} %</span>"


def _attr(v: float | None) -> str:
    if v is None or math.isnan(v):
        return ""
    return "Infinity" if v == math.inf else "-Infinity" if v == -math.inf else repr(float(v))


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.35em;margin:0 0 .3em} .meta{color:#555;font-size:.9em;margin:.2em 0}
table{border-collapse:collapse;font-size:.86em} th,td{border-bottom:1px solid #ddd;padding:.3em .5em;vertical-align:middle;text-align:right}
th{background:#f3f3f3;position:sticky;top:0;z-index:1} th.sort{cursor:pointer;color:#0645ad;white-space:nowrap}
th.sort:hover{text-decoration:underline} th.left{text-align:left} td.name{white-space:normal;text-align:left;font-family:ui-monospace,Consolas,monospace;min-width:14em;max-width:22em;word-break:break-all}
td{white-space:nowrap} td.plot{padding:0} td.plot svg{width:640px;height:240px;display:block} .bad{color:#b30000;font-weight:600}
table.outputs{margin:.5em 0 1em} .note{color:#e6550d;font-size:.85em;display:block;white-space:normal;max-width:9em;margin-left:auto}
"""

_SCRIPT = """
(function(){
  var table=document.getElementById('tensors'), body=table.tBodies[0], dir={};
  var first={order:1, clipped:-1, kl:-1, sqnr:1, absmax:-1, amax:-1};
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


def render(cal: Calibration, calib_name: str, evaluation: dict | None = None) -> bytes:
    """The report page for `cal` (calib_name: how to name the file on the page)."""
    require_matplotlib()
    table = rows(cal, evaluation)
    e = html.escape
    parts = [
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<title>qtool report: {e(calib_name)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n",
        f"<h1>Calibration report: {e(calib_name)}</h1>\n",
        (
            f"<p class=\"meta\">model {e(cal.model_path)} (SHA-256 {e(cal.model_sha256[:16])}…) · method {e(cal.method)}"
            f"{' (' + e(cal.kl_variant) + ')' if cal.method == 'entropy' else ''} · {cal.num_bits} bits · {cal.bins} bins · "
            f"{cal.samples} samples · {len(cal.tensors)} tensors</p>\n"
        ),
        f"<p class=\"meta\">preprocessing: {e(json.dumps(cal.preprocess))}</p>\n",
    ]
    if evaluation:
        parts.append(f"<p class=\"meta\">qtool evaluate on {evaluation['samples']} samples: the int8 model (QDQ simulation) against FP32</p>\n")
        parts.append("<table class=\"outputs\"><thead><tr><th class=\"left\">output</th><th>SQNR dB</th><th>cosine</th><th>top-1 agreement</th></tr></thead><tbody>\n")
        for name, sqnr, cos, top1 in evaluation["outputs"]:
            parts.append(
                f"<tr><td class=\"name\">{e(name)}</td><td>{format_db(sqnr) if sqnr is not None else ''}</td>"
                f"<td>{'' if cos is None else f'{cos:.5f}'}</td><td>{'' if top1 is None else f'{top1 * 100:.2f} %'}</td></tr>\n"
            )
        parts.append("</tbody></table>\n")
        if evaluation["weights"]:
            parts.append(
                "<details><summary class=\"meta\">weight quantizers (per channel, not in the calibration file): output SQNR "
                "with only that weight quantized, worst first</summary>\n<table class=\"outputs\"><thead><tr>"
                "<th class=\"left\">weight</th><th>SQNR dB</th><th class=\"left\">layers</th><th class=\"left\">policy</th>"
                "</tr></thead><tbody>\n"
            )
            for name, sqnr, layers, policy in evaluation["weights"]:
                parts.append(
                    f"<tr><td class=\"name\">{e(name)}</td><td>{'' if sqnr is None else format_db(sqnr)}</td>"
                    f"<td class=\"name\">{e(', '.join(layers))}</td><td class=\"name\">{e(policy)}</td></tr>\n"
                )
            parts.append("</tbody></table></details>\n")
    parts.append(
        "<p class=\"meta\">Click a column heading to sort. clipped: share of calibrated values above the file's amax; "
        "KL: NVIDIA's entropy divergence at that amax"
        + ("; SQNR: output SQNR (dB) with only this tensor quantized, from qtool evaluate; in orange, where the export "
           "quantizes with another range than the file's amax (a range shared by a Concat or pass-through group, or max |x| "
           "for a degenerate threshold)" if evaluation else "")
        + ". Plots: histogram of |x| with each method's threshold.</p>\n"
    )
    heads = [("order", "#"), (None, "tensor"), (None, "min"), ("absmax", "max |x|"), ("amax", "amax"),
             ("clipped", "clipped"), ("kl", "KL")]
    if evaluation:
        heads.append(("sqnr", "SQNR dB"))
    heads.append((None, "histogram and thresholds"))
    parts.append("<table id=\"tensors\"><thead><tr>")
    for key, label in heads:
        if key:
            parts.append(f"<th class=\"sort\" data-key=\"{key}\" aria-sort=\"none\">{e(label)}<span></span></th>")
        else:
            left = ' class="left"' if label == "tensor" else ""
            parts.append(f"<th{left}>{e(label)}</th>")
    parts.append("</tr></thead>\n<tbody>\n")
    for row in table:
        rec = row.record
        data_attrs = (f"data-order=\"{row.order}\" data-absmax=\"{_attr(rec.absmax)}\" data-amax=\"{_attr(rec.amax)}\" "
                      f"data-clipped=\"{_attr(row.clipped)}\" data-kl=\"{_attr(row.kl)}\" data-sqnr=\"{_attr(row.sqnr)}\"")
        clipped_cls = " class=\"bad\"" if row.clipped > calibration.MAX_CLIPPED else ""
        cells = [
            f"<td>{row.order + 1}</td>", f"<td class=\"name\">{e(rec.name)}</td>", f"<td>{_fmt(rec.min)}</td>",
            f"<td>{_fmt(rec.absmax)}</td>", f"<td>{_fmt(rec.amax)}{_quantized_note(row)}</td>", f"<td{clipped_cls}>{row.clipped * 100:.3f} %</td>",
            f"<td>{'' if row.kl is None else f'{row.kl:.4g}'}</td>",
        ]
        if evaluation:
            policy = f"<br><small>{e(row.policy)}</small>" if row.policy else ""
            cells.append(f"<td>{'' if row.sqnr is None else format_db(row.sqnr)}{policy}</td>")
        cells.append(f"<td class=\"plot\">{plot_svg(row, cal.method, f't{row.order}-')}</td>")
        parts.append(f"<tr {data_attrs}>" + "".join(cells) + "</tr>\n")
    parts.append(f"</tbody></table>\n<script>{_SCRIPT}</script>\n</body>\n</html>\n")
    return "".join(parts).encode("utf-8")
