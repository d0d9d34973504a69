"""The placement's first step: what stays float before any op asks for a quantizer. The user's
--exclude (nodes and tensors) and --include, NNCF's ignored patterns and the rules' default
exclusions (nodes), and the tensors whose range no 8-bit grid can represent."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ...errors import QtoolError
from ...model import graph as G
from .. import patterns as P
from .state import Choices, Inputs, Report


@dataclass
class Kept:
    """Nodes and tensors no quantizer touches."""

    nodes: set[str]  # the user's excluded nodes, and the nodes of ignored patterns and default exclusions
    tensors: set[str]  # the user's excluded tensors, and the unrepresentable ones
    ignored: dict[str, str]  # node -> the ignored pattern or default exclusion that keeps it FP32
    unrepresentable: dict[str, str]  # tensor -> why no 8-bit grid represents its range


def kept_float(inputs: Inputs, choices: Choices, report: Report) -> Kept:
    """Reads the user's exclude/include and ignored_patterns, the rules' ignored patterns and
    default exclusions, the records. Decides what stays float; the linear layers among the
    ignored nodes go to report.fp32 (with the pattern's name)."""
    m, rules = inputs.m, inputs.rules
    nodes, tensors = _resolve_names(m, list(choices.exclude))
    included, _ = _resolve_names(m, list(choices.include), "--include")
    found: dict[str, str] = {}
    if rules.ignored_patterns and choices.ignored_patterns:
        found.update(P.ignored_nodes(m))
    if rules.exclusions is not None:
        found.update(rules.exclusions(m))
    for rounding, computing in P.length_roundings(m).items():  # every target: a length must not round otherwise
        for name in computing:
            found.setdefault(name, f"default exclusion: computes the count {rounding} rounds into a length")
    unused = sorted(included - set(found))
    if unused:
        report.warnings.append(f"--include: {_listed(unused)} not excluded by default; nothing to include")
    ignored = {k: v for k, v in found.items() if k not in included}
    for name, why in ignored.items():
        if m.nodes[name].op_type in rules.linear and name not in nodes:
            report.fp32[name] = why if why.startswith("default exclusion") else f"ignored pattern {why}"
    nodes |= set(ignored)
    unrepresentable = _unrepresentable(inputs, tensors, report)
    # what the model's own Q/DQ pairs quantize gets no second quantizer (qtool.model.prequantized)
    return Kept(nodes, tensors | set(unrepresentable) | inputs.own.tensors, ignored, unrepresentable)


def _unrepresentable(inputs: Inputs, excluded: set[str], report: Report) -> dict[str, str]:
    """Tensors whose range no 8-bit grid represents stay float on every target: infinite or
    NaN values, |x| >= 1e30 (float32 has no precision left for q * step + low: at q = 255
    the grid of [-3.4e38, 0] gives -2e31, not 0) or an additive attention mask (a huge
    negative constant or 0, even when calibration saw no padding). Those the user has not
    excluded already, with why."""
    found = P.unrepresentable(inputs.m, inputs.records)
    unrepresentable = {t: why for t, why in found.items() if inputs.m.is_data(t) and t not in excluded}
    if unrepresentable:
        report.warnings.append(
            f"{len(unrepresentable)} tensor(s) have a range no 8-bit grid can represent and stay float (their readers "
            "read the float tensor): " + "; ".join(f"{t} ({why})" for t, why in list(unrepresentable.items())[:5])
            + (" ..." if len(unrepresentable) > 5 else ""))
    return unrepresentable


def _resolve_names(m: G.Index, names: list[str], option: str = "--exclude") -> tuple[set[str], set[str]]:
    node_names = set(m.nodes)
    tensor_names = set(m.producer) | m.inputs | set(m.constants)
    nodes, tensors, unknown = set(), set(), []
    for name in names:
        if name in node_names:
            nodes.add(name)
        if name in tensor_names:
            tensors.add(name)
        if name not in node_names and name not in tensor_names:
            unknown.append(name)
    if unknown:
        known = sorted(node_names | tensor_names)
        hints = []
        for u in unknown:
            near = difflib.get_close_matches(u, known, n=1)
            hints.append(f"{u!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise QtoolError(f"{option}: no node or tensor named {', '.join(hints)} in the model")
    return nodes, tensors


def _listed(names, limit: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")
