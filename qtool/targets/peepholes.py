"""Peephole LSTMs for OpenVINO: written as Scans, so that OpenVINO computes what the model says.

OpenVINO 2026.4's ONNX frontend drops an LSTM's peephole weights P (input 7): its run of the FP32 model equals
onnxruntime's with P set to zero, every step's gates missing their P * c terms (bench/zoo.py: madmom's beat and
downbeat networks, -3.7..6 dB from onnxruntime's FP32 in OpenVINO's FP32 and int8 runs alike, NNCF unable to compile
them). The OpenVINO export writes each such LSTM as ONNX's equations over plain ops, one Scan per direction: the input
products x W^T + Wb + Rb of every step as one MatMul before it ([time, batch, 4H]), its one scan input; the step body
adds h R^T, splits the gates (ONNX's order i, o, f, c), adds the peepholes on c_{t-1} (i, f) and c_t (o) and carries
h and c; the outputs Y, Y_h and Y_c are the Scans' outputs stacked as the LSTM lays them out. The same numbers in
float (the MatMuls sum in another order: 110+ dB from the LSTM in onnxruntime, 115-145 in OpenVINO on madmom's
networks).

One scan input per Scan: OpenVINO 2026.4 ran a Scan with four scan inputs (the gates' products apart) right at the
first step and wrong from the second. The cost is time: OpenVINO runs a Scan step by step, its nodes one by one
(madmom's networks 8-9x the time of the LSTM primitive that drops the peepholes; docs/benchmarks.md #zoo-hunt10).

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


class _Writer:
    """Nodes and initializers of one LSTM's Scans, every name fresh in the model."""

    def __init__(self, model: onnx.ModelProto, namer: G.Namer, base: str, opset: int):
        self.model, self.namer, self.base, self.opset = model, namer, base, opset
        self.nodes: list[onnx.NodeProto] = []

    def const(self, value, name: str, into: list | None = None) -> str:
        name = self.namer.fresh(f"{self.base}/scan_{name}")
        (self.model.graph.initializer if into is None else into).append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], into: list | None = None, **attrs) -> str:
        out = self.namer.fresh(f"{self.base}/scan_{kind}")
        (self.nodes if into is None else into).append(
            helper.make_node(kind, inputs, [out], name=self.namer.fresh(f"{self.base}/Scan{kind}"), **attrs))
        return out

    def unsqueeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(np.array([axis], np.int64), "axis")])
        return self.op("Unsqueeze", [x], axes=[axis])

    def split(self, x: str, hidden: int, into: list) -> list[str]:
        """x [batch, 4H] split into its four gates' [batch, H]."""
        outs = [self.namer.fresh(f"{self.base}/scan_gate{g}") for g in range(4)]
        name = self.namer.fresh(f"{self.base}/ScanSplit")
        if self.opset >= 13:
            sizes = self.const(np.array([hidden] * 4, np.int64), "split", self.body_inits)
            into.append(helper.make_node("Split", [x, sizes], outs, name=name, axis=1))
        else:
            into.append(helper.make_node("Split", [x], outs, name=name, axis=1, split=[hidden] * 4))
        return outs

    def body(self, r: np.ndarray, p: np.ndarray, hidden: int) -> onnx.GraphProto:
        """One step of one direction (r [4H, H], p [3H]): states h, c, scan input x_t = x W^T + Wb + Rb [batch, 4H];
        outputs h', c' and y_t = h'."""
        nodes: list[onnx.NodeProto] = []
        self.body_inits: list[onnx.TensorProto] = []
        inits = self.body_inits
        h_in, c_in, x_t = (self.namer.fresh(f"{self.base}/scan_{k}") for k in ("h_in", "c_in", "x_t"))
        gates = self.op("Add", [x_t, self.op("MatMul", [h_in, self.const(np.ascontiguousarray(r.T), "r", inits)], nodes)], nodes)
        pre = self.split(gates, hidden, nodes)  # ONNX's order i, o, f, c
        p_i, p_o, p_f = (self.const(p[k * hidden:(k + 1) * hidden].copy(), f"p{k}", inits) for k in range(3))
        i = self.op("Sigmoid", [self.op("Add", [pre[0], self.op("Mul", [c_in, p_i], nodes)], nodes)], nodes)
        f = self.op("Sigmoid", [self.op("Add", [pre[2], self.op("Mul", [c_in, p_f], nodes)], nodes)], nodes)
        c_out = self.op("Add", [self.op("Mul", [f, c_in], nodes), self.op("Mul", [i, self.op("Tanh", [pre[3]], nodes)], nodes)], nodes)
        o = self.op("Sigmoid", [self.op("Add", [pre[1], self.op("Mul", [c_out, p_o], nodes)], nodes)], nodes)
        h_out = self.op("Mul", [o, self.op("Tanh", [c_out], nodes)], nodes)
        outs = [self.namer.fresh(f"{self.base}/scan_{k}") for k in ("h_out", "c_out", "y_t")]
        nodes += [helper.make_node("Identity", [h_out], [outs[0]], name=self.namer.fresh(f"{self.base}/ScanIdentity")),
                  helper.make_node("Identity", [c_out], [outs[1]], name=self.namer.fresh(f"{self.base}/ScanIdentity")),
                  helper.make_node("Identity", [h_out], [outs[2]], name=self.namer.fresh(f"{self.base}/ScanIdentity"))]
        state = ["batch", hidden]  # stated: onnxruntime's Scan needs its body's outputs shaped
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                  ((h_in, state), (c_in, state), (x_t, ["batch", 4 * hidden]))]
        return helper.make_graph(nodes, self.namer.fresh(f"{self.base}/scan_body"), inputs,
                                 [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in outs], inits)


def _as_scans(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, weights: dict, opset: int) -> list[onnx.NodeProto]:
    hidden = int(G.attr(node, "hidden_size"))
    direction = G.text_attr(node, "direction", "forward")
    e = _Writer(model, namer, node.name or "lstm", opset)
    x = node.input[0]
    batch_hidden = e.op("Concat", [e.op("Slice", [e.op("Shape", [x]), e.const(np.array([1], np.int64), "start"),
                                                  e.const(np.array([2], np.int64), "end")]),
                                   e.const(np.array([hidden], np.int64), "hidden")], axis=0)
    zeros = e.op("ConstantOfShape", [batch_hidden], value=numpy_helper.from_array(np.zeros(1, np.float32)))
    row = e.const(np.array([-1, hidden], np.int64), "row")
    ys, hs, cs = [], [], []
    for d in range(2 if direction == "bidirectional" else 1):
        def initial(slot: int, d: int = d) -> str:
            if len(node.input) > slot and node.input[slot]:
                return e.op("Reshape", [e.op("Gather", [node.input[slot], e.const(np.array(d, np.int64), f"dir{d}")], axis=0), row])
            return zeros
        b = weights["b"][d]
        products = e.op("Add", [e.op("MatMul", [x, e.const(np.ascontiguousarray(weights["w"][d].T), f"w{d}")]),
                                e.const(b[:4 * hidden] + b[4 * hidden:], f"b{d}")])  # [time, batch, 4H], one GEMM
        body = e.body(weights["r"][d], weights["p"][d], hidden)
        reverse = int(direction == "reverse" or d == 1)
        outs = [namer.fresh(f"{e.base}/scan_{k}{d}") for k in ("h", "c", "y")]
        e.nodes.append(helper.make_node("Scan", [initial(5), initial(6), products], outs, name=namer.fresh(f"{e.base}/Scan"), body=body,
                                        num_scan_inputs=1, scan_input_directions=[reverse], scan_output_directions=[reverse]))
        ys.append(e.unsqueeze(outs[2], 1))
        hs.append(e.unsqueeze(outs[0], 0))
        cs.append(e.unsqueeze(outs[1], 0))
    for parts, k in ((ys, 0), (hs, 1), (cs, 2)):
        if len(node.output) > k and node.output[k]:
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
    still_read = {t for n in model.graph.node for t in n.input} | set(G.consumers(model.graph)) | {o.name for o in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name not in consumed or t.name in still_read]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return done
