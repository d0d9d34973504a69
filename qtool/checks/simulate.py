"""Running an exported file: the exact arithmetic it describes, or the real runtime on this CPU.

The simulation is the same on every machine: onnxruntime with graph optimization off
(ORT_DISABLE_ALL), so QuantizeLinear/DequantizeLinear stay float operations and no int8 kernel
runs, and OpenVINO's FakeQuantize nodes rewritten into float ONNX ops computing OpenVINO's formula
(openvinotoolkit/openvino docs, FakeQuantize-1):

    x <= min(il, ih)  -> ol
    x >  max(il, ih)  -> oh
    otherwise         -> round((x - il) / (ih - il) * (levels - 1)) / (levels - 1) * (oh - ol) + ol

with round half to even, in float32 (FP16 tensors are cast to float32 and back). A real runtime
(OpenVINO on "CPU" in f32 precision, onnxruntime with its default optimizations) runs int8 kernels
that on x86 CPUs without VNNI can saturate (qtool.quantizers.cpu_kinds).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import QtoolError
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


def _float_ops(model: onnx.ModelProto, namer: G.Namer, node: onnx.NodeProto, elem_type: int) -> list[onnx.NodeProto]:
    """The nodes computing `node` (a FakeQuantize) with OpenVINO's formula; the last one writes its output."""
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
    q = op("Add", op("Mul", op("Div", op("Round", t), steps), op("Sub", oh, ol)), ol)
    lo = op("Min", il, ih)
    below = op("Or", op("Less", x, lo), op("Equal", x, lo))
    y = op("Where", below, ol, op("Where", op("Greater", x, op("Max", il, ih)), oh, q))
    if elem_type != TensorProto.FLOAT:
        y = op("Cast", y, to=elem_type)
    nodes[-1].output[0] = base
    return nodes


def fake_quantize_as_float_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every main-graph FakeQuantize replaced, in place, by float ONNX ops computing
    OpenVINO's formula (a model below opset 11 is converted first, into a new model: Round needs 11)."""
    if not any(is_fake_quantize(n) for n in model.graph.node):
        return model
    if G.default_opset(model) < ROUND_OPSET:
        model, _ = upgrade_opset(model, ROUND_OPSET, why="FakeQuantize as float ops (Round)")
    namer = G.Namer(model)
    types = _elem_types(model)
    nodes: list[onnx.NodeProto] = []
    for n in model.graph.node:
        if is_fake_quantize(n):
            elem_type = next((types[r] for r in n.input[1:] if r in types), types.get(n.input[0], TensorProto.FLOAT))
            nodes += _float_ops(model, namer, n, elem_type)
        else:
            nodes.append(n)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if not any(n.domain == DOMAIN for n in model.graph.node):
        kept = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return model


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


def simulation(model: onnx.ModelProto | bytes, outputs: list[str] = ()):
    """An onnxruntime session computing the file's arithmetic exactly, on any CPU: FakeQuantize as
    float ops, no graph optimization (Q/DQ stay float ops). A ModelProto given is rewritten in place.
    `outputs`: tensors to fetch beside the graph's outputs (added once the FakeQuantize nodes are rewritten)."""
    if isinstance(model, ModelFile):  # a big model's export: its graph, the weights where they are
        proto = onnx.ModelProto()
        proto.CopyFrom(model.model)
    else:
        proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else model
    proto = with_outputs(fake_quantize_as_float_ops(proto), list(outputs))
    return onnxruntime.session(proto, optimization="none")  # ORT_DISABLE_ALL: the graph run as it is


def runtime(name: str, data: bytes, like=None):
    """The real runtime on this CPU running the file `data`: OpenVINO ('openvino', f32 inference
    precision, int8 where the file quantizes) or onnxruntime ('onnxruntime', default optimizations:
    its int8 kernels for Q/DQ; float layers in f32 too). `like`: a session of this function's that
    the new one is compared with, compiled the same way (OpenVINO: at the inputs' shapes where it
    compiled that one so)."""
    data = bytes(data)  # a big model's export (ModelFile) as one file
    if name == "openvino":
        return openvino.Session(data, static=getattr(like, "static", ""))
    if name == "onnxruntime":
        return onnxruntime.session(onnx.load_model_from_string(data))
    raise QtoolError(f"runtime {name!r} is not one of {', '.join(RUNTIMES)}")
