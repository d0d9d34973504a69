"""Peephole LSTMs for OpenVINO: written as Scans, so that OpenVINO computes what the model says.

OpenVINO 2026.4's ONNX frontend drops an LSTM's peephole weights P (input 7): its run of the FP32 model equals
onnxruntime's with P set to zero, every step's gates missing their P * c terms (bench/zoo.py: madmom's beat and
downbeat networks, -3.7..6 dB from onnxruntime's FP32 in OpenVINO's FP32 and int8 runs alike, NNCF unable to compile
them). The OpenVINO export writes each such LSTM as ONNX's equations over plain ops, one Scan per direction: the input
products x W^T + Wb + Rb of every step as one MatMul before it ([time, batch, 4H]), its one scan input, in chunks of
STEPS steps ([time / STEPS, STEPS, batch, 4H]); the body, STEPS steps unrolled, adds per step [h, c_{t-1}] times
[R^T; the peepholes of i and f as diagonals] (h R^T and the peepholes on c_{t-1} in one MatMul), splits the gates
(ONNX's order i, o, f, c), adds the peephole on c_t (o) and carries h and c; the outputs Y, Y_h and Y_c are the
Scans' outputs stacked as the LSTM lays them out. The same numbers in float (the MatMuls sum in another order: 110+
dB from the LSTM in onnxruntime and in OpenVINO, 115-145 in OpenVINO on madmom's networks).

A dynamic time axis: the products are padded with zeros to a multiple of STEPS after the last step in the direction of
processing (at the end going forward, at the start in reverse: the Scan takes the chunks and the body their steps
last first), Y sliced back to the real steps and Y_h, Y_c taken from the last real step (Y, and a scan output of the
cells when Y_c is read), never from the states the Scan carries out of the padded steps. Before opset 11 (Pad's pads
input, Gather's negative indices) one step per iteration, no padding.

One scan input per Scan: OpenVINO 2026.4 ran a Scan with four scan inputs (the gates' products apart) right at the
first step and wrong from the second. The cost is time: OpenVINO runs a Scan iteration by iteration, its nodes one by
one, ~16 us per iteration besides them (madmom's networks 8-9x the time of the LSTM primitive that drops the
peepholes one step per iteration, 5-6x at 16; docs/benchmarks.md #zoo-hunt10).

Only LSTMs whose other attributes ONNX's defaults give are written (no sequence_lens, clip, input_forget, batch-first
layout; activations absent or stated as the defaults Sigmoid, Tanh, Tanh), with constant finite W, R, B and P, at
opset 9 or later (Scan's scan_input_directions); the others are left as they are.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..model import graph as G

DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


def _constant(index: G.Index, t: str) -> np.ndarray | None:
    tensor = index.initializers.get(t)
    if tensor is None:
        return None
    try:
        values = numpy_helper.to_array(tensor)
    except Exception:  # external data not loaded, damaged tensor: left as it is
        return None
    if values.dtype != np.float32 or not np.all(np.isfinite(values)):
        return None
    return values


def _writable(index: G.Index, node: onnx.NodeProto) -> dict[str, np.ndarray] | None:
    """W, R, B, P of a peephole LSTM this module writes as Scans; None for any other node."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx"):
        return None
    if len(node.input) < 8 or not node.input[7] or node.input[4]:  # no peepholes, or sequence_lens
        return None
    if G.attr(node, "clip") is not None or int(G.attr(node, "input_forget", 0)) or int(G.attr(node, "layout", 0)):
        return None
    activations = G.attr(node, "activations")
    if activations is not None:
        names = [a.decode() if isinstance(a, bytes) else a for a in activations]
        if any(n.lower() != d.lower() for n, d in zip(names, DEFAULT_ACTIVATIONS * 2)) or len(names) % 3:
            return None
        if G.attr(node, "activation_alpha") is not None or G.attr(node, "activation_beta") is not None:
            return None
    hidden = G.attr(node, "hidden_size")
    dirs = 2 if G.text_attr(node, "direction", "forward") == "bidirectional" else 1
    if hidden is None:
        return None
    hidden = int(hidden)
    w, r, p = (_constant(index, node.input[k]) for k in (1, 2, 7))
    b = _constant(index, node.input[3]) if node.input[3] else np.zeros((dirs, 8 * hidden), np.float32)
    if w is None or r is None or p is None or b is None:
        return None
    if w.shape[:2] != (dirs, 4 * hidden) or r.shape != (dirs, 4 * hidden, hidden) or b.shape != (dirs, 8 * hidden) \
            or p.shape != (dirs, 3 * hidden):
        return None
    return {"w": w, "r": r, "b": b, "p": p}


# Steps each Scan iteration computes (its body unrolled): OpenVINO pays ~16 us per iteration besides the body's nodes
# (madmom's networks, 2259 steps: 1 step 7-11x the FP32 model's time, 8 steps 5.6-6.0x, 16 5.2-6.0x, 32 5.3-5.6x;
# docs/benchmarks.md #zoo-hunt10)
STEPS = 16


class _Writer:
    """Nodes and initializers of one LSTM's Scans, every name fresh in the model."""

    def __init__(self, model: onnx.ModelProto, namer: G.Namer, base: str, opset: int):
        self.model, self.namer, self.base, self.opset = model, namer, base, opset
        self.nodes: list[onnx.NodeProto] = []

    def const(self, value, name: str, into: list | None = None) -> str:
        name = self.namer.fresh(f"{self.base}/scan_{name}")
        (self.model.graph.initializer if into is None else into).append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, np.int64), "ints")

    def op(self, kind: str, inputs: list[str], into: list | None = None, **attrs) -> str:
        out = self.namer.fresh(f"{self.base}/scan_{kind}")
        (self.nodes if into is None else into).append(
            helper.make_node(kind, inputs, [out], name=self.namer.fresh(f"{self.base}/Scan{kind}"), **attrs))
        return out

    def split(self, x: str, parts: int, size: int, axis: int, into: list) -> list[str]:
        """x split on axis into parts pieces of size each."""
        outs = [self.namer.fresh(f"{self.base}/scan_part{g}") for g in range(parts)]
        name = self.namer.fresh(f"{self.base}/ScanSplit")
        if self.opset >= 13:
            sizes = self.const(np.array([size] * parts, np.int64), "split", self.body_inits)
            into.append(helper.make_node("Split", [x, sizes], outs, name=name, axis=axis))
        else:
            into.append(helper.make_node("Split", [x], outs, name=name, axis=axis, split=[size] * parts))
        return outs

    def body(self, r: np.ndarray, p: np.ndarray, hidden: int, steps: int, reverse: bool, cells: bool) -> onnx.GraphProto:
        """steps steps of one direction (r [4H, H], p [3H]), the last first when reverse: states h, c [1, batch, H],
        scan input a chunk of x_t = x W^T + Wb + Rb [steps, batch, 4H]; outputs h', c' and the chunk's h_t (and
        its c_t when cells) [steps, batch, H]."""
        nodes: list[onnx.NodeProto] = []
        self.body_inits: list[onnx.TensorProto] = []
        inits = self.body_inits
        h_in, c_in, chunk = (self.namer.fresh(f"{self.base}/scan_{k}") for k in ("h_in", "c_in", "x_chunk"))
        xs = self.split(chunk, steps, 1, 0, nodes) if steps > 1 else [chunk]  # each [1, batch, 4H]
        # [h, c] [1, batch, 2H] times [R^T; diagonals of P_i and P_f in the i and f columns]: h R^T plus the
        # peepholes on c_{t-1} in one MatMul (the other products exact zeros)
        hc = np.zeros((2 * hidden, 4 * hidden), np.float32)
        hc[:hidden] = r.T
        for k in (0, 2):  # ONNX's gate order i, o, f, c and P's i, o, f: i and f at k in both
            hc[hidden + np.arange(hidden), k * hidden + np.arange(hidden)] = p[k * hidden:(k + 1) * hidden]
        weights = self.const(hc, "rp", inits)
        p_o = self.const(p[hidden:2 * hidden].copy(), "p_o", inits)
        h, c = h_in, c_in
        hs, cs = [None] * steps, [None] * steps
        for t in (reversed(range(steps)) if reverse else range(steps)):
            gates = self.op("Add", [xs[t], self.op("MatMul", [self.op("Concat", [h, c], nodes, axis=2), weights], nodes)], nodes)
            pre = self.split(gates, 4, hidden, 2, nodes)  # ONNX's order i, o, f, c
            i = self.op("Sigmoid", [pre[0]], nodes)
            f = self.op("Sigmoid", [pre[2]], nodes)
            c = self.op("Add", [self.op("Mul", [f, c], nodes), self.op("Mul", [i, self.op("Tanh", [pre[3]], nodes)], nodes)], nodes)
            o = self.op("Sigmoid", [self.op("Add", [pre[1], self.op("Mul", [c, p_o], nodes)], nodes)], nodes)
            h = self.op("Mul", [o, self.op("Tanh", [c], nodes)], nodes)
            hs[t], cs[t] = h, c
        names = ["h_out", "c_out", "y_chunk"] + (["c_chunk"] if cells else [])
        outs = [self.namer.fresh(f"{self.base}/scan_{k}") for k in names]
        sources = [h, c, hs, cs][:len(outs)]
        for out, src in zip(outs, sources):
            if isinstance(src, list):
                kind, inputs, attrs = ("Concat", src, {"axis": 0}) if len(src) > 1 else ("Identity", src, {})
            else:
                kind, inputs, attrs = "Identity", [src], {}
            nodes.append(helper.make_node(kind, inputs, [out], name=self.namer.fresh(f"{self.base}/Scan{kind}"), **attrs))
        state, seq = [1, "batch", hidden], [steps, "batch", hidden]  # stated: onnxruntime's Scan needs its body's outputs shaped
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                  ((h_in, state), (c_in, state), (chunk, [steps, "batch", 4 * hidden]))]
        return helper.make_graph(nodes, self.namer.fresh(f"{self.base}/scan_body"), inputs,
                                 [helper.make_tensor_value_info(n, TensorProto.FLOAT, state if k < 2 else seq)
                                  for k, n in enumerate(outs)], inits)


def _as_scans(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, weights: dict, opset: int) -> list[onnx.NodeProto]:
    """The LSTM as one Scan per direction over chunks of STEPS steps, padded and sliced back (the module doc)."""
    hidden = int(G.attr(node, "hidden_size"))
    direction = G.text_attr(node, "direction", "forward")
    steps = STEPS if opset >= 11 else 1
    e = _Writer(model, namer, node.name or "lstm", opset)
    x = node.input[0]
    shape = e.op("Shape", [x])
    batch = e.op("Gather", [shape, e.ints(1)], axis=0)
    state = e.op("Concat", [e.ints(1), batch, e.ints(hidden)], axis=0)  # [1, batch, H]
    zeros = e.op("ConstantOfShape", [state], value=numpy_helper.from_array(np.zeros(1, np.float32)))
    chunks = e.op("Concat", [e.ints(-1, steps), batch, e.ints(4 * hidden)], axis=0)  # [time / steps, steps, batch, 4H]
    rows = e.op("Concat", [e.ints(-1), batch, e.ints(hidden)], axis=0)  # [time, batch, H]
    if steps > 1:
        time = e.op("Gather", [shape, e.ints(0)], axis=0)
        k = e.ints(steps)
        pad = e.op("Mod", [e.op("Sub", [k, e.op("Mod", [time, k])]), k])  # [1]: (steps - time % steps) % steps
        pads_end = e.op("Concat", [e.ints(0, 0, 0), pad, e.ints(0, 0)], axis=0)
        pads_start = e.op("Concat", [pad, e.ints(0, 0, 0, 0, 0)], axis=0)
    wanted = [len(node.output) > k and bool(node.output[k]) for k in range(3)]
    padded = steps > 1

    def sequence(out: str, reverse: bool) -> str:  # a Scan output as [time, batch, H], the padding sliced off
        seq = e.op("Reshape", [out, rows])
        if not padded:
            return seq
        return e.op("Slice", [seq, pad, e.ints(2 ** 62)] if reverse else [seq, e.ints(0), time])

    def last(seq: str, reverse: bool) -> str:  # [1, batch, H]: the last step in the direction of processing
        return e.op("Gather", [seq, e.ints(0 if reverse else -1)], axis=0)

    ys, hs, cs = [], [], []
    for d in range(2 if direction == "bidirectional" else 1):
        def initial(slot: int, d: int = d) -> str:
            if len(node.input) > slot and node.input[slot]:
                return e.op("Reshape", [e.op("Gather", [node.input[slot], e.const(np.array([d], np.int64), f"dir{d}")], axis=0), state])
            return zeros
        b = weights["b"][d]
        products = e.op("Add", [e.op("MatMul", [x, e.const(np.ascontiguousarray(weights["w"][d].T), f"w{d}")]),
                                e.const(b[:4 * hidden] + b[4 * hidden:], f"b{d}")])  # [time, batch, 4H], one GEMM
        reverse = direction == "reverse" or d == 1
        if padded:
            products = e.op("Pad", [products, pads_start if reverse else pads_end])
        cells = padded and wanted[2]
        body = e.body(weights["r"][d], weights["p"][d], hidden, steps, reverse, cells)
        outs = [namer.fresh(f"{e.base}/scan_{k}{d}") for k in ("h", "c", "y", "cells")[:3 + cells]]
        e.nodes.append(helper.make_node("Scan", [initial(5), initial(6), e.op("Reshape", [products, chunks])], outs,
                                        name=namer.fresh(f"{e.base}/Scan"), body=body, num_scan_inputs=1,
                                        scan_input_directions=[int(reverse)], scan_output_directions=[int(reverse)] * (1 + cells)))
        y = sequence(outs[2], reverse)
        ys.append(e.op("Unsqueeze", [y], axes=[1]) if opset < 13 else e.op("Unsqueeze", [y, e.ints(1)]))
        hs.append(last(y, reverse) if padded else outs[0])
        cs.append(last(sequence(outs[3], reverse), reverse) if cells else outs[1])
    for parts, k in ((ys, 0), (hs, 1), (cs, 2)):
        if wanted[k]:
            e.nodes.append(helper.make_node("Concat", parts, [node.output[k]], name=namer.fresh(f"{e.base}/ScanConcat"),
                                            axis=1 if k == 0 else 0))
    return e.nodes


def warning(model: onnx.ModelProto) -> list[str]:
    """The export's warning when the model has LSTMs this module writes (none otherwise)."""
    index = G.Index(model)
    n = sum(_writable(index, node) is not None for node in model.graph.node) if G.default_opset(model) >= 9 else 0
    if not n:
        return []
    return [f"{n} LSTM(s) with peepholes written as Scans of their equations: OpenVINO drops an LSTM's peepholes "
            "(its own run of the model is wrong there); the Scans compute them, step by step, slower than its LSTM"]


def peephole_lstms_as_scans(model: onnx.ModelProto, namer: G.Namer) -> int:
    """Rewrite every writable peephole LSTM of the main graph as Scans (in place; see the module doc); the
    initializers only they read are dropped. Returns how many."""
    opset = G.default_opset(model)
    if opset < 9:
        return 0
    index = G.Index(model)
    nodes: list[onnx.NodeProto] = []
    consumed: set[str] = set()
    done = 0
    for node in model.graph.node:
        weights = _writable(index, node)
        if weights is None:
            nodes.append(node)
            continue
        nodes += _as_scans(model, namer, node, weights, opset)
        consumed.update(t for t in (node.input[1], node.input[2], node.input[3], node.input[7]) if t)
        done += 1
    if not done:
        return 0
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    still_read = set(G.consumers(model.graph)) | {o.name for o in model.graph.output}  # node inputs and subgraph reads
    kept = [t for t in model.graph.initializer if t.name not in consumed or t.name in still_read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return done
