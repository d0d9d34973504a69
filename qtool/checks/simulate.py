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
that on x86 CPUs without VNNI can saturate (qtool.quantizers.cpu).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..collection import collect
from ..errors import QtoolError
from ..model import graph as G
from ..model.writer import ModelFile

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
        from ..targets.qdq import upgrade_opset

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


def simulation(model: onnx.ModelProto | bytes):
    """An onnxruntime session computing the file's arithmetic exactly, on any CPU: FakeQuantize as
    float ops, no graph optimization (Q/DQ stay float ops). A ModelProto given is rewritten in place."""
    if isinstance(model, ModelFile):  # a big model's export: its graph, the weights where they are
        proto = onnx.ModelProto()
        proto.CopyFrom(model.model)
    else:
        proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else model
    proto = fake_quantize_as_float_ops(proto)
    return collect.make_session(proto, optimized=True)  # optimized=True: ORT_DISABLE_ALL, the graph run as it is


class OpenVINOSession:
    """OpenVINO's CPU plugin on a model, behind onnxruntime's `run(names, feeds)`. `precision`: the
    float precision of the unquantized layers, "f32" or "default" (OpenVINO's choice on this CPU: bf16
    with AVX-512 BF16 or AMX, qtool.quantizers.cpu), stated in the config either way; `float_precision`
    is the one it runs them in ("f32", "bf16", "f16")."""

    def __init__(self, data: bytes, config: dict | None = None, precision: str = "f32"):
        ov = openvino()
        core = ov.Core()
        chosen = core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name() if precision == "default" else precision
        try:
            self.compiled = core.compile_model(core.read_model(data, b""), "CPU", {**(config or {}), "INFERENCE_PRECISION_HINT": chosen})
        except Exception as e:
            raise QtoolError(f"OpenVINO cannot compile the model: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
        self.request = self.compiled.create_infer_request()
        self.float_precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()

    def run(self, names, feeds):
        """The outputs `names` (None: all) for the inputs `feeds`."""
        result = self.request.infer(feeds)
        ports = self.compiled.outputs if names is None else [self.compiled.output(n) for n in names]
        return [np.array(result[p]) for p in ports]


def openvino():
    """The openvino module, or a one-line error saying how to install it."""
    try:
        import openvino
    except ImportError:
        raise QtoolError("OpenVINO is not installed: pip install openvino (or 'qtool[test]')") from None
    return openvino


def runtime(name: str, data: bytes):
    """The real runtime on this CPU running the file `data`: OpenVINO ('openvino', f32 inference
    precision, int8 where the file quantizes) or onnxruntime ('onnxruntime', default optimizations:
    its int8 kernels for Q/DQ; float layers in f32 too)."""
    data = bytes(data)  # a big model's export (ModelFile) as one file
    if name == "openvino":
        return OpenVINOSession(data)
    if name == "onnxruntime":
        return collect.make_session(onnx.load_model_from_string(data))
    raise QtoolError(f"runtime {name!r} is not one of {', '.join(RUNTIMES)}")
