"""Running an exported file: the exact arithmetic it describes, or the real runtime on this CPU.

The simulation is the same on every machine: onnxruntime with graph optimization off
(ORT_DISABLE_ALL), so QuantizeLinear/DequantizeLinear stay float operations and no int8 kernel
runs, and OpenVINO's FakeQuantize nodes rewritten into float ONNX ops computing OpenVINO's formula
(openvinotoolkit/openvino docs, FakeQuantize-1):

    x <= min(il, ih)  -> ol
    x >  max(il, ih)  -> oh
    otherwise         -> round((x - il) / (ih - il) * (levels - 1)) / (levels - 1) * (oh - ol) + ol

with round half to even, in float32 (FP16 tensors are cast to float32 and back). An LSTM that OpenVINO
runs in int8 (its X from a FakeQuantize, W and R int8 constants times a scale: the pattern of its CPU
plugin's ConvertFqRnnToQuantizedRnn, qtool.quantizers.placement.recurrent) requantizes its hidden state at
every step onto X's output grid, which no node of the file states: the simulation computes it as a Scan
over the time steps per direction, the hidden state rounded onto that grid after each (and before the
first), as Y and Y_h carry it. Where OpenVINO's CPU plugin fuses a residual Add into the int8 Convolution that
writes one of its inputs (a "sum" post-op) and the FakeQuantize after the Add too, the FakeQuantize between that
Convolution and the Add applies as a clamp without rounding (bench/openvino_quirks.py, case 1): the simulation
computes that one so (sum_fused_clamps). A real runtime
(OpenVINO on "CPU" in f32 precision, onnxruntime with its default optimizations) runs int8 kernels
that on x86 CPUs without VNNI can saturate (qtool.quantizers.cpu_kinds).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import QtoolError
from ..model import folded_constants
from ..model import graph as G
from ..model.writer import ModelFile
from ..runtime import onnxruntime, openvino
from ..targets.qdq import upgrade_opset

DOMAIN = "org.openvinotoolkit"
ROUND_OPSET = 11  # Round, and Equal on floats
RUNTIMES = ("openvino", "onnxruntime")  # the runtimes `runtime` runs (qtool.targets.runtimes: the targets whose files each runs)


def is_fake_quantize(node: onnx.NodeProto) -> bool:
    return node.op_type == "FakeQuantize" and node.domain == DOMAIN


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types = {t.name: t.data_type for t in model.graph.initializer}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return types


def _float_ops(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, elem_type: int,
               rounded: bool = True) -> list[onnx.NodeProto]:
    """The nodes computing `node` (a FakeQuantize) with OpenVINO's formula; the last one writes its output.
    Not `rounded`: the same without the rounding onto the levels (a clamp where the ranges are equal)."""
    levels = G.attr(node, "levels")
    if levels is None or levels < 2:
        raise QtoolError(f"FakeQuantize {node.name!r} has no levels >= 2")
    base = node.output[0]
    nodes: list[onnx.NodeProto] = []

    def op(kind: str, *inputs: str, **attrs) -> str:
        out = namer.fresh(f"{base}/sim_{kind}")
        nodes.append(helper.make_node(kind, list(inputs), [out], name=namer.fresh(f"{node.name}/Sim{kind}"), **attrs))
        return out

    x, il, ih, ol, oh = node.input
    if elem_type != TensorProto.FLOAT:  # FP16 (or double) tensors: the arithmetic in float32
        x, il, ih, ol, oh = (op("Cast", v, to=TensorProto.FLOAT) for v in (x, il, ih, ol, oh))
    steps = namer.fresh(f"{base}/sim_levels")
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(levels - 1, dtype=np.float32), steps))
    t = op("Mul", op("Div", op("Sub", x, il), op("Sub", ih, il)), steps)
    q = op("Add", op("Mul", op("Div", op("Round", t) if rounded else t, steps), op("Sub", oh, ol)), ol)
    lo = op("Min", il, ih)
    below = op("Or", op("Less", x, lo), op("Equal", x, lo))
    y = op("Where", below, ol, op("Where", op("Greater", x, op("Max", il, ih)), oh, q))
    if elem_type != TensorProto.FLOAT:
        y = op("Cast", y, to=elem_type)
    nodes[-1].output[0] = base
    return nodes


# ops OpenVINO's CPU plugin fuses into the Convolution before them as post-ops (FuseConvolutionAndSimpleOperation), as
# ONNX spells them: activations, and a per-channel scale or shift (a bias, a folded BatchNorm) when the other input is
# a constant
CONV_POST_OPS = frozenset({"Relu", "Clip", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Abs", "Exp"})
SCALE_SHIFT = frozenset({"Add", "Sub", "Mul", "Div"})
SUM_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "Elu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish"})
U8_KEEPING = G.MOVES | {"MaxPool", "Pad", "DepthToSpace", "SpaceToDepth", "Split", "Slice"}  # u8 codes passed on as they are


def sum_fused_clamps(model: onnx.ModelProto) -> set[str]:
    """The FakeQuantize nodes (their outputs) OpenVINO's CPU plugin applies as a clamp, without rounding: each between an
    int8 Conv (its input from a FakeQuantize) and a residual Add, the Conv's chain (it, its post-ops, the
    FakeQuantize) read by that Add alone, where the plugin fuses the Add into that Conv as a sum post-op and the
    FakeQuantize after the Add (or after one activation after it) into it too: a post-op FakeQuantize before a sum
    with a quantized output. The Conv, of two that write an Add's inputs, as openvinotoolkit/openvino
    src/plugins/intel_cpu/src/graph_optimizer.cpp, FuseConvolutionSumAndConvolutionSumActivation, picks it: the
    first input's, when it has one reader and the second input is quantized; else the second's; and only where every
    other reader of the other input comes before the Add (the sum is written in place over it). OpenVINO 2026.4
    (bench/openvino_quirks.py, case 1)."""
    fusion = _SumFusion(model)
    return {t for add in model.graph.node if (t := fusion.clamped(add)) is not None}


class _SumFusion:
    """sum_fused_clamps' reading of one model's graph."""

    def __init__(self, model: onnx.ModelProto):
        index = G.Index(model)
        self.readers, self.producer, self.outputs = index.readers, index.producer, index.outputs
        # the constants and what OpenVINO folds: nodes that read constants alone (a shipped model's int32 bias,
        # DequantizeLinear then Reshape)
        self.constants = folded_constants(model.graph)

    def single(self, t: str) -> bool:
        return len(self.readers.get(t, [])) == 1 and t not in self.outputs

    def swish_input(self, node: onnx.NodeProto) -> str | None:
        """x where `node` is Mul(x, Sigmoid(x)) (a SiLU, one Swish post-op) and the Sigmoid has no other reader."""
        if node.op_type != "Mul" or len(node.input) != 2:
            return None
        for a, b in (node.input, node.input[::-1]):
            sig = self.producer.get(b)
            if sig is not None and sig.op_type == "Sigmoid" and sig.input[0] == a and self.single(b) and len(self.readers.get(a, [])) == 2:
                return a
        return None

    def branch(self, t: str) -> tuple[onnx.NodeProto | None, bool, bool]:
        """(the FakeQuantize ending the chain, whether an int8 Conv's chain writes `t`, whether all of it has one reader)."""
        node, lone = self.producer.get(t), self.single(t)
        while node is not None and node.op_type == "Identity" and lone:  # dropped by the ONNX frontend
            lone, node = self.single(node.input[0]), self.producer.get(node.input[0])
        fq = None
        if node is not None and is_fake_quantize(node):
            fq, lone, node = node, lone and self.single(node.input[0]), self.producer.get(node.input[0])
        while node is not None:
            x = self.swish_input(node)
            if x is not None:
                node = self.producer.get(x)
                continue
            if not (node.op_type in CONV_POST_OPS or (node.op_type in SCALE_SHIFT and len(node.input) == 2 and node.input[1] in self.constants)):
                break
            lone = lone and self.single(node.input[0])
            node = self.producer.get(node.input[0])
        if node is None or node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            return fq, False, lone
        return fq, self.quantized(node.input[0]), lone

    def quantized(self, t: str, depth: int = 0) -> bool:
        """Whether `t` holds a FakeQuantize's codes, passed on by ops that move them (a Concat of such tensors too)."""
        x = self.producer.get(t)
        if x is None or depth > 32:
            return False
        if is_fake_quantize(x):
            return True
        if x.op_type == "Concat":
            return all(self.quantized(i, depth + 1) for i in x.input)
        return x.op_type in U8_KEEPING and bool(x.input) and self.quantized(x.input[0], depth + 1)

    def before(self, add: onnx.NodeProto) -> set[str]:
        """The names of the nodes the Add depends on."""
        seen, stack = set(), list(add.input)
        while stack:
            n = self.producer.get(stack.pop())
            if n is not None and n.name not in seen:
                seen.add(n.name)
                stack.extend(n.input)
        return seen

    def clamped(self, add: onnx.NodeProto) -> str | None:
        """The output of the FakeQuantize the plugin clamps where `add` is fused as a sum, None where none is."""
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2 or \
                any(t in self.constants or t not in self.producer for t in add.input):
            return None
        out = add.output[0]
        if self.single(out) and self.readers[out][0][0].op_type in SUM_ACTIVATIONS:
            out = self.readers[out][0][0].output[0]
        if not (self.single(out) and is_fake_quantize(self.readers[out][0][0])):
            return None  # the FakeQuantize after the sum not fused into the Convolution: the one before it rounds
        (fq1, conv1, lone1), (fq2, conv2, lone2) = (self.branch(t) for t in add.input)
        quantized1, quantized2 = (is_fake_quantize(self.producer[t]) for t in add.input)
        if conv1 and conv2:
            first = (quantized2 and lone1) if (quantized1 or quantized2) else True
            if not (lone1 if first else lone2):
                first = not first
        elif conv1 or conv2:
            first = conv1
        else:
            return None
        fq, lone = (fq1, lone1) if first else (fq2, lone2)
        if fq is None or not lone:
            return None
        peer = self.producer[add.input[1 if first else 0]]
        others = [r for o in peer.output for r, _ in self.readers.get(o, []) if r is not add]
        if others and not {r.name for r in others} <= self.before(add):
            return None
        return fq.output[0]


def _int8_lstm_grid(node: onnx.NodeProto, made: dict, inits: dict) -> tuple[float, float] | None:
    """The output grid (low, high) of the FakeQuantize an LSTM's X comes from, when OpenVINO runs that LSTM in
    int8: X from a 256-level FakeQuantize with constant output ranges, W and R int8 initializers -> Cast -> Mul;
    no sequence_lens, peepholes, clip, other activations, input_forget or batch-first layout. None otherwise."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    if any(len(node.input) > k and node.input[k] for k in (4, 7)) or G.attr(node, "clip") is not None \
            or G.attr(node, "activations") is not None or int(G.attr(node, "input_forget", 0)) or int(G.attr(node, "layout", 0)):
        return None
    fq = made.get(node.input[0])
    if fq is None or not is_fake_quantize(fq) or G.attr(node, "hidden_size") is None or G.attr(fq, "levels") != 256:
        return None
    for t in node.input[1:3]:
        mul = made.get(t)
        cast = made.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
        if cast is None or cast.op_type != "Cast" or cast.input[0] not in inits or inits[cast.input[0]].data_type != TensorProto.INT8 \
                or mul.input[1] not in inits:
            return None
    if fq.input[3] not in inits or fq.input[4] not in inits:
        return None
    low, high = (float(numpy_helper.to_array(inits[t]).reshape(-1)[0]) for t in fq.input[3:5])
    return (low, high) if high > low else None


def _weight_of(t: str, made: dict, inits: dict) -> np.ndarray:
    """The float32 values of a Mul(Cast(int8), scale): as onnxruntime computes them."""
    mul = made[t]
    codes = numpy_helper.to_array(inits[made[mul.input[0]].input[0]]).astype(np.float32)
    return codes * numpy_helper.to_array(inits[mul.input[1]]).astype(np.float32)


class _Nodes:
    """Nodes and initializers appended for one LSTM's simulation, their names fresh in the model."""

    def __init__(self, model: onnx.ModelProto, namer: G.Namer, base: str, step: np.float32, zero_point: np.float32):
        self.model, self.namer, self.base, self.nodes = model, namer, base, []
        self.grid = {"step": step, "zp": zero_point, "top": np.float32(255), "bottom": np.float32(0)}

    def const(self, value, name: str) -> str:
        name = self.namer.fresh(f"{self.base}/sim_{name}")
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, kind: str, inputs: list[str], into: list | None = None, **attrs) -> str:
        out = self.namer.fresh(f"{self.base}/sim_{kind}")
        (self.nodes if into is None else into).append(
            helper.make_node(kind, inputs, [out], name=self.namer.fresh(f"{self.base}/Sim{kind}"), **attrs))
        return out

    def on_grid(self, x: str, into: list | None, consts: dict[str, str]) -> str:
        """round(x / step) + zp on [0, 255], back to float: the hidden state's u8 codes."""
        q = self.op("Add", [self.op("Round", [self.op("Div", [x, consts["step"]], into)], into), consts["zp"]], into)
        q = self.op("Max", [self.op("Min", [q, consts["top"]], into), consts["bottom"]], into)
        return self.op("Mul", [self.op("Sub", [q, consts["zp"]], into), consts["step"]], into)

    def step_body(self, w: np.ndarray, r: np.ndarray, bias: np.ndarray, hidden: int, name: str) -> onnx.GraphProto:
        """One LSTM step of one direction (w [4H, I], r [4H, H], bias [8H], ONNX's gate order i, o, f, c): state
        inputs h_in, c_in and the scan input x_t; outputs h_out (on the grid), c_out and y_t = h_out."""
        body: list[onnx.NodeProto] = []
        consts = {k: f"c_{k}" for k in self.grid}
        inits = [numpy_helper.from_array(np.asarray(v), f"c_{k}") for k, v in self.grid.items()]
        gates = []
        for g in range(4):
            rows = slice(g * hidden, (g + 1) * hidden)
            inits += [numpy_helper.from_array(np.ascontiguousarray(w[rows].T), f"w{g}"),
                      numpy_helper.from_array(np.ascontiguousarray(r[rows].T), f"r{g}"),
                      numpy_helper.from_array(bias[rows] + bias[4 * hidden + g * hidden:4 * hidden + (g + 1) * hidden], f"b{g}")]
            pre = self.op("Add", [self.op("Add", [self.op("MatMul", ["x_t", f"w{g}"], body), self.op("MatMul", ["h_in", f"r{g}"], body)], body),
                                  f"b{g}"], body)
            gates.append(self.op("Tanh" if g == 3 else "Sigmoid", [pre], body))
        i, o, f, cand = gates
        c_out = self.op("Add", [self.op("Mul", [f, "c_in"], body), self.op("Mul", [i, cand], body)], body)
        h = self.on_grid(self.op("Mul", [o, self.op("Tanh", [c_out], body)], body), body, consts)
        body += [helper.make_node("Identity", [h], ["h_out"]), helper.make_node("Identity", [c_out], ["c_out"]),
                 helper.make_node("Identity", [h], ["y_t"])]
        # shapes stated: onnxruntime's Scan needs its body's outputs shaped, which it cannot infer from a state of
        # unknown rank (a FakeQuantize of a ConstantOfShape, computed as float ops: ddddocr_beta's)
        state = ["batch", hidden]
        vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in
              (("h_in", state), ("c_in", state), ("x_t", ["batch", w.shape[1]]))]
        return helper.make_graph(body, name, vi, [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in ("h_out", "c_out", "y_t")],
                                 inits)


def _lstm_as_scans(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, grid: tuple[float, float], made: dict,
                   inits: dict) -> list[onnx.NodeProto]:
    """The nodes computing the LSTM `node` as OpenVINO's int8 kernel does: one Scan per direction, the hidden
    state rounded onto `grid` (256 levels) before the first step and after every step."""
    hidden = int(G.attr(node, "hidden_size"))
    direction = G.text_attr(node, "direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    w, r = _weight_of(node.input[1], made, inits), _weight_of(node.input[2], made, inits)
    bias = (numpy_helper.to_array(inits[node.input[3]]).astype(np.float32) if len(node.input) > 3 and node.input[3] in inits
            else np.zeros((dirs, 8 * hidden), np.float32))
    step = np.float32((grid[1] - grid[0]) / 255)
    e = _Nodes(model, namer, node.name or "lstm", step, np.float32(np.rint(-grid[0] / step)))
    outer = {k: e.const(v, k) for k, v in e.grid.items()}
    x = node.input[0]
    shape = e.op("Shape", [x])
    batch_hidden = e.op("Concat", [e.op("Slice", [shape, e.const(np.array([1], np.int64), "start"), e.const(np.array([2], np.int64), "end")]),
                                   e.const(np.array([hidden], np.int64), "hidden")], axis=0)
    zeros = e.op("ConstantOfShape", [batch_hidden], value=numpy_helper.from_array(np.zeros(1, np.float32)))
    row = e.const(np.array([-1, hidden], np.int64), "row")
    ys, hs, cs = [], [], []
    for d in range(dirs):
        def initial(slot: int, d: int = d) -> str:
            if len(node.input) > slot and node.input[slot]:
                return e.op("Reshape", [e.op("Gather", [node.input[slot], e.const(np.array(d, np.int64), f"dir{d}")], axis=0), row])
            return zeros
        body = e.step_body(w[d], r[d], bias[d], hidden, f"{e.base}_sim_dir{d}")
        reverse = int(direction == "reverse" or d == 1)
        outs = [namer.fresh(f"{e.base}/sim_{k}{d}") for k in ("h", "c", "y")]
        e.nodes.append(helper.make_node("Scan", [e.on_grid(initial(5), None, outer), initial(6), x], outs, name=namer.fresh(f"{e.base}/SimScan"),
                                        body=body, num_scan_inputs=1, scan_input_directions=[reverse], scan_output_directions=[reverse]))
        ys.append(e.op("Reshape", [outs[2], e.const(np.array([0, 1, -1, hidden], np.int64), "y_shape")]))
        hs.append(e.op("Reshape", [outs[0], e.const(np.array([1, -1, hidden], np.int64), "state_shape")]))
        cs.append(e.op("Reshape", [outs[1], e.const(np.array([1, -1, hidden], np.int64), "state_shape")]))
    for parts, k in ((ys, 0), (hs, 1), (cs, 2)):
        if len(node.output) > k and node.output[k]:
            e.nodes.append(helper.make_node("Concat", parts, [node.output[k]], name=namer.fresh(f"{e.base}/SimConcat"), axis=1 if k == 0 else 0))
    return e.nodes


def fake_quantize_as_float_ops(model: onnx.ModelProto, as_openvino: bool = True) -> onnx.ModelProto:
    """The model with every FakeQuantize replaced, in place, by float ONNX ops computing OpenVINO's
    formula, those inside If branches too (their constants added to the main graph, which every branch
    reads); a model below opset 11 is converted first, into a new model: Round needs 11. `as_openvino`: those
    OpenVINO's CPU plugin applies as a clamp (sum_fused_clamps) without rounding; else each as the file writes it."""
    if not any(is_fake_quantize(n) for n in G.all_nodes(model.graph)):
        return model
    if G.default_opset(model) < ROUND_OPSET:
        model, _ = upgrade_opset(model, ROUND_OPSET, why="FakeQuantize as float ops (Round)")
    _as_float_ops(model, model.graph, G.Namer(model), _elem_types(model), {}, {}, sum_fused_clamps(model) if as_openvino else set())
    if not any(n.domain == DOMAIN for n in G.all_nodes(model.graph)):
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return model


def _as_float_ops(model: onnx.ModelProto, graph: onnx.GraphProto, namer: G.Namer, types: dict[str, int], made: dict, inits: dict,
                  clamps: set[str] = frozenset()) -> None:
    """fake_quantize_as_float_ops on `graph` (the main graph or a subgraph of it; `made`, `inits`: the producers
    and initializers of the scopes around it) and its subgraphs; the FakeQuantize nodes writing `clamps` (of the
    main graph: sum_fused_clamps) without rounding."""
    made = {**made, **G.producers(graph)}
    inits = {**inits, **{t.name: t for t in graph.initializer}}
    if graph is not model.graph:
        types = {**types, **_elem_types(onnx.helper.make_model(graph))}
    nodes: list[onnx.NodeProto] = []
    for n in graph.node:
        for sub in G.subgraphs(n):
            if any(is_fake_quantize(m) for m in G.all_nodes(sub)):
                _as_float_ops(model, sub, namer, types, made, inits)
        grid = _int8_lstm_grid(n, made, inits)
        if is_fake_quantize(n):
            elem_type = next((types[r] for r in n.input[1:] if r in types), types.get(n.input[0], TensorProto.FLOAT))
            nodes += _float_ops(model, namer, n, elem_type, rounded=n.output[0] not in clamps)
        elif grid is not None:
            nodes += _lstm_as_scans(model, namer, n, grid, made, inits)
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def with_outputs(model: onnx.ModelProto, tensors: list[str]) -> onnx.ModelProto:
    """`model` (in place) with the tensors `tensors` also graph outputs, each typed as the model
    records it (float32 where it does not), shapes left to the runtime."""
    types = _elem_types(model)
    have = {o.name for o in model.graph.output}
    for t in tensors:
        if t not in have:
            model.graph.output.append(helper.make_tensor_value_info(t, types.get(t, TensorProto.FLOAT), None))
            have.add(t)
    return model


def simulation(model: onnx.ModelProto | bytes, outputs: list[str] = (), as_openvino: bool = True):
    """An onnxruntime session computing the file's arithmetic exactly, on any CPU: FakeQuantize as
    float ops, no graph optimization (Q/DQ stay float ops). A ModelProto given is rewritten in place.
    `outputs`: tensors to fetch beside the graph's outputs (added once the FakeQuantize nodes are rewritten);
    `as_openvino`: as fake_quantize_as_float_ops."""
    if isinstance(model, ModelFile):  # a big model's export: its graph, the weights where they are
        proto = onnx.ModelProto()
        proto.CopyFrom(model.model)
    else:
        proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else model
    proto = with_outputs(fake_quantize_as_float_ops(proto, as_openvino), list(outputs))
    return onnxruntime.session(proto, optimization="none")  # ORT_DISABLE_ALL: the graph run as it is


def runtime(name: str, data: bytes, like=None, float_only: bool = False):
    """The real runtime on this CPU running the file `data`: OpenVINO ('openvino', f32 inference
    precision, int8 where the file quantizes) or onnxruntime ('onnxruntime', default optimizations:
    its int8 kernels for Q/DQ; float layers in f32 too). `like`: a session of this function's that
    the new one is compared with, compiled the same way (OpenVINO: at the inputs' shapes where it
    compiled that one so). `float_only`: a model meant to run in float (FP32), which OpenVINO then quantizes nowhere
    on the fly."""
    data = bytes(data)  # a big model's export (ModelFile) as one file
    if name == "openvino":
        return openvino.Session(data, static=getattr(like, "static", ""), float_only=float_only)
    if name == "onnxruntime":
        return onnxruntime.session(onnx.load_model_from_string(data))
    raise QtoolError(f"runtime {name!r} is not one of {', '.join(RUNTIMES)}")
