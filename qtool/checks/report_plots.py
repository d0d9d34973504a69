"""The report's plots: matplotlib SVG drawn from the numbers qtool.checks.report computes, as
inline <svg> elements (no prolog or fixed size: they scale to their box through the viewBox).
Same numbers give the same bytes. matplotlib is optional (qtool[report]): it is imported only
when a plot is drawn, and require_matplotlib says how to install it."""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import QtoolError

_FLOOR = 0.5  # where empty bins sit on the log count axis
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#7f7f7f")
_TARGET_COLOR = "#e6550d"
_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "qtool", "font.size": 8}


@dataclass(frozen=True)
class HistogramPlot:
    """One quantized tensor's plot: its histogram of |x| and the thresholds drawn on it."""

    counts: np.ndarray  # counts per bin, merged to at most PLOT_BINS bins
    edges: np.ndarray  # len(counts) + 1 bin edges
    target: str  # the target's name, its threshold's label
    target_amax: float  # the threshold the target's export uses (thick orange)
    file_label: str  # e.g. "file (entropy)"
    file_amax: float  # the calibration file's amax (dashed black where it differs from the target's)
    file_differs: bool
    lines: dict[str, float]  # method -> its threshold (thin lines)


def require_matplotlib():
    """matplotlib, or a one-line QtoolError saying how to install it."""
    try:
        import matplotlib
        import matplotlib.figure
    except ImportError:
        raise QtoolError("qtool report draws its plots with matplotlib, which is not installed; pip install 'qtool[report]'") from None
    return matplotlib


def short(v: float) -> str:
    """A threshold as the page and the plots' legends write it."""
    return f"{v:.4g}"


def _count_label(v: float, _pos=None) -> str:
    return f"{v:g}" if v < 1000 else f"1e{round(math.log10(v))}"


def _svg(fig, prefix: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    return _inline(buf.getvalue(), prefix)


def histogram_svg(plot: HistogramPlot, prefix: str) -> str:
    """The histogram of one tensor with the target's threshold (thick orange), the file's amax
    (dashed black, when it differs) and every method's threshold, as an inline <svg> (ids prefixed)."""
    matplotlib = require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(5.2, 2.2))
        ax = fig.add_axes((0.12, 0.2, 0.5, 0.74))
        counts, edges = plot.counts, plot.edges
        if counts.sum() > 0 and edges[-1] > 0:
            shown = np.where(counts > 0, counts, _FLOOR)  # empty bins sit on the floor of the log axis
            ax.stairs(shown, edges, fill=True, color="#9ecae1", edgecolor="#3182bd", linewidth=0.6, baseline=_FLOOR)
            ax.set_yscale("log", nonpositive="clip")
            ax.set_ylim(_FLOOR, max(counts.max() * 2.0, 1.0))
            ax.set_xlim(0, max(edges[-1], max(plot.lines.values(), default=0.0), plot.file_amax, plot.target_amax) * 1.02)
            ax.yaxis.set_major_locator(LogLocator(base=10, numticks=6))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(_count_label))
        else:
            ax.text(0.5, 0.5, "no values (all zero)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("|x|")
        ax.set_ylabel("count (log)")
        ax.axvline(plot.target_amax, color=_TARGET_COLOR, linewidth=2.6, label=f"{plot.target}: {short(plot.target_amax)}")
        if plot.file_differs:
            ax.axvline(plot.file_amax, color="black", linewidth=1.8, linestyle=(0, (4, 2)), alpha=0.75,
                       label=f"{plot.file_label}: {short(plot.file_amax)}")
        styles = ["-", "--", "-.", ":"]
        for j, (m, v) in enumerate(plot.lines.items()):
            ax.axvline(v, color=_COLORS[j % len(_COLORS)], linewidth=0.9, linestyle=styles[j % len(styles)], label=f"{m}: {short(v)}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), fontsize=7.5, frameon=False, borderaxespad=0, handlelength=1.6)
        return _svg(fig, prefix)


def summary_svg(points: list[tuple[int, float | None, float | None]], evaluated: bool, prefix: str) -> str:
    """Error per quantized tensor in graph order: points (row number, tensor SQNR dB, output
    SQNR dB); the five worst of each series labelled with their row number (a link to the row)."""
    matplotlib = require_matplotlib()
    from matplotlib.figure import Figure

    panels = [("tensor SQNR (dB): its own quantization noise", 1)] + ([("output SQNR (dB), only this tensor quantized", 2)] if evaluated else [])
    with matplotlib.rc_context(_STYLE):
        height = 1.7 * len(panels) + 0.45
        fig = Figure(figsize=(10.0, height))
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        xs = np.arange(1, len(points) + 1)
        for ax, (title, k) in zip(axes, panels):
            ys = np.array([np.nan if p[k] is None else min(p[k], 200.0) for p in points], dtype=np.float64)
            _summary_panel(ax, xs, ys, [p[0] for p in points], title, "#6baed6" if k == 1 else "#fd8d3c")
        every = -(-len(points) // 30)  # at most 30 tick labels
        axes[-1].set_xticks(xs[::every], [str(p[0]) for p in points[::every]])
        axes[-1].set_xlabel("quantized tensors in graph order, labelled with their row #")
        axes[-1].set_xlim(0.3, len(points) + 0.7)
        fig.subplots_adjust(left=0.06, right=0.99, top=1 - 0.3 / height, bottom=0.42 / height, hspace=0.35)
        return _svg(fig, prefix)


def _summary_panel(ax, xs: np.ndarray, ys: np.ndarray, rows: list[int], title: str, color: str) -> None:
    """One series of the summary as bars (values capped at 200 dB, NaN: none), its five worst labelled."""
    finite = np.isfinite(ys)
    ax.bar(xs[finite], ys[finite], width=0.8, color=color)
    ax.set_title(title, fontsize=8, loc="left")
    ax.grid(axis="y", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    if not finite.any():
        ax.text(0.5, 0.5, "no value", ha="center", va="center", transform=ax.transAxes)
        return
    top = float(np.nanmax(ys))
    ax.set_ylim(min(0.0, float(np.nanmin(ys))), top * 1.15 + 1.0)
    for i in sorted(np.flatnonzero(finite), key=lambda i: (ys[i], i))[:5]:
        t = ax.annotate(f"#{rows[i]}", (xs[i], ys[i]), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7, color="#b30000",
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})
        t.set_url(f"#row{rows[i]}")


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
