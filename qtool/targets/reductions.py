"""Reductions OpenVINO misreads, for the OpenVINO export: spelled with ops it reads right.

OpenVINO 2026.4's ONNX frontend reads ReduceLogSumExp, ReduceLogSum and ReduceL1 of opsets 13 to 17 (their
version 13, whose `axes` is still an attribute; 18 moved it to an input) as if they had no axes: it reduces every
axis (a [2, 3, 4] input, axes [-1], keepdims 0: a scalar where onnxruntime gives [2, 3]; with keepdims 1 [1, 1, 1]).
A graph that goes on to use the result where the reduced shape matters does not convert at all (a reCAPTCHA tile
classifier's mask head, `ReduceLogSumExp` next to a `ReduceMax` of the same axes into one Concat: "Conversion is
failed for: Concat", NNCF unable to quantize it; bench/zoo.py tesseranet_3x3), and one where it does not computes
something else. Version 11 (opsets 11-12) and ReduceMax, ReduceMin, ReduceMean, ReduceSum, ReduceProd, ReduceL2,
ReduceSumSquare at every opset convert right (bench/openvino_quirks.py case 13 checks the three).

Each such node with an `axes` attribute is written as (same axes, keepdims as the node has it):
  ReduceL1(x)        = ReduceSum(Abs(x))
  ReduceLogSum(x)    = Log(ReduceSum(x))
  ReduceLogSumExp(x) = Log(ReduceSum(Exp(x - m))) + m,  m = ReduceMax(x) kept (keepdims 1; Squeezed after the
                       Add when the node drops the axes): onnxruntime's own order, the max taken out first so that
                       Exp does not overflow (onnxruntime core/providers/cpu/reduction/reduction_ops.h,
                       ReduceAggregatorLogSumExp).
ReduceSum and Squeeze take their axes as an input from opset 13 on. Without an `axes` attribute the node reduces
every axis, which OpenVINO does too: left as it is. Nodes in subgraphs (If, Loop, Scan bodies) alike.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..model import graph as G

MISREAD = ("ReduceLogSumExp", "ReduceLogSum", "ReduceL1")
OPSETS = range(13, 18)  # the opsets whose version of the three OpenVINO misreads


def _spelled(model: onnx.ModelProto, namer: G.Namer, graph: onnx.GraphProto, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    axes = [int(a) for a in G.attr(node, "axes")]
    keep = int(G.attr(node, "keepdims", 1))
    base = node.name or node.output[0]
    ax = namer.fresh(f"{base}/axes")
    graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), ax))
    x, y = node.input[0], node.output[0]

    def t(what: str) -> str:
        return namer.fresh(f"{base}/{what}")

    def op(kind: str, inputs: list[str], out: str, **attrs) -> onnx.NodeProto:
        return helper.make_node(kind, inputs, [out], name=namer.fresh(f"{base}/{kind}"), **attrs)

    if node.op_type == "ReduceL1":
        a = t("abs")
        return [op("Abs", [x], a), op("ReduceSum", [a, ax], y, keepdims=keep)]
    if node.op_type == "ReduceLogSum":
        s = t("sum")
        return [op("ReduceSum", [x, ax], s, keepdims=keep), op("Log", [s], y)]
    m, d, e, s, lg = t("max"), t("centred"), t("exp"), t("sum"), t("log")
    out = [op("ReduceMax", [x], m, axes=axes, keepdims=1), op("Sub", [x, m], d), op("Exp", [d], e),
           op("ReduceSum", [e, ax], s, keepdims=1), op("Log", [s], lg)]
    if keep:
        return [*out, op("Add", [lg, m], y)]
    kept = t("kept")
    return [*out, op("Add", [lg, m], kept), op("Squeeze", [kept, ax], y)]


def _rewrite(model: onnx.ModelProto, namer: G.Namer, graph: onnx.GraphProto) -> int:
    done = 0
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for a in node.attribute:  # subgraphs first: their nodes are OpenVINO's too
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                done += _rewrite(model, namer, sub)
        if node.op_type in MISREAD and node.domain in ("", "ai.onnx") and G.attr(node, "axes") is not None:
            nodes += _spelled(model, namer, graph, node)
            done += 1
        else:
            nodes.append(node)
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
    return done


def spell_misread(model: onnx.ModelProto, namer: G.Namer) -> int:
    """Rewrite every ReduceLogSumExp, ReduceLogSum and ReduceL1 with an `axes` attribute at opsets 13-17 as the
    module doc says (in place); returns how many."""
    if G.default_opset(model) not in OPSETS:
        return 0
    return _rewrite(model, namer, model.graph)
