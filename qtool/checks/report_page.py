"""The report's HTML: qtool.checks.report's Page laid out by the jinja2 template
templates/report.html.j2 (its style and script beside it, inlined: the page is one file that
fetches nothing), with the plots as inline SVG from qtool.checks.report_plots.

Autoescaping is on: tensor, layer and output names come from the user's model. Numbers are
formatted by the filters below, so the template holds layout only.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import jinja2
from markupsafe import Markup

from . import report_plots
from .evaluation import format_db

if TYPE_CHECKING:
    from .report import Page


def attr(v: float | None) -> str:
    """A number as a data-* attribute the page's script parses (empty: none)."""
    if v is None or math.isnan(v):
        return ""
    return "Infinity" if v == math.inf else "-Infinity" if v == -math.inf else repr(float(v))


def db(v: float | None) -> str:
    return "" if v is None else format_db(v)


def setting(v) -> str:
    """A preprocessing setting's value as text."""
    if isinstance(v, (list, tuple)):
        return ", ".join(setting(x) for x in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("qtool.checks", "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(attr=attr, db=db, setting=setting, short=report_plots.short)
    return env


_ENV = _environment()


def html(page: Page) -> str:
    """The page as one self-contained HTML document."""
    ranked = page.evaluation is not None and page.evaluation.ranked
    summary = Markup(report_plots.summary_svg(page.summary, ranked, "summary-")) if page.quantized else None
    plots = {r.order: Markup(report_plots.histogram_svg(r.plot, f"t{r.order}-")) for r in page.quantized}
    return _ENV.get_template("report.html.j2").render(page=page, ranked=ranked, plots=plots, summary=summary)
