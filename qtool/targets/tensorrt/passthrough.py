"""Pass-through ops: nodes whose outputs only hold values copied from their data inputs.

Reshape, Transpose, Flatten, Squeeze/Unsqueeze, Identity, Slice, Split and nearest-mode
Resize/Upsample rearrange or select input values; MaxPool picks the maximum of each window
(padding is -inf, never picked); Concat joins its inputs. So every value of such an output is a
value of one of its data inputs, and a range that covers the inputs covers the output. Backends
that quantize these ops (TensorRT implicit INT8, OpenVINO) also want input and output on the same
scale, so copying the input's range is both safe and what the backend expects.

Pure functions over an onnx.ModelProto: no I/O, the model is never modified.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import onnx

from ...model.graph import text_attr

V = TypeVar("V")

# op type -> input slots that carry data copied to the outputs (None: every input)
DATA_SLOTS: dict[str, tuple[int, ...] | None] = {
    "Reshape": (0,), "Transpose": (0,), "Flatten": (0,), "Squeeze": (0,), "Unsqueeze": (0,),
    "Identity": (0,), "Slice": (0,), "Split": (0,), "MaxPool": (0,), "Concat": None,
    "Resize": (0,), "Upsample": (0,),
}
# op type -> outputs that carry copied values (None: every output); MaxPool's 2nd output is Indices
DATA_OUTPUTS: dict[str, tuple[int, ...] | None] = {"MaxPool": (0,)}


def is_pass_through(node: onnx.NodeProto) -> bool:
    """True if every value of the node's data outputs is a value of its data inputs."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in DATA_SLOTS:
        return False
    if node.op_type in ("Resize", "Upsample"):
        return text_attr(node, "mode", "nearest") == "nearest"
    return True


def data_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs whose values a pass-through node copies (empty names left out)."""
    slots = DATA_SLOTS[node.op_type]
    picked = node.input if slots is None else [node.input[s] for s in slots if s < len(node.input)]
    return [name for name in picked if name]


def data_outputs(node: onnx.NodeProto) -> list[str]:
    slots = DATA_OUTPUTS.get(node.op_type)
    picked = node.output if slots is None else [node.output[s] for s in slots if s < len(node.output)]
    return [name for name in picked if name]


def sources(proto: onnx.ModelProto) -> dict[str, list[str]]:
    """{output of a main-graph pass-through node: the tensors whose values it copies}."""
    found: dict[str, list[str]] = {}
    for node in proto.graph.node:
        if is_pass_through(node):
            inputs = data_inputs(node)
            if inputs:
                for out in data_outputs(node):
                    found[out] = inputs
    return found


def inherit(
    proto: onnx.ModelProto,
    known: Mapping[str, V],
    merge: Callable[[Iterable[V]], V] = max,
) -> dict[str, V]:
    """Ranges for pass-through outputs missing from `known`, copied forward from their inputs.

    Walks the main graph in node order (ONNX graphs are topologically sorted), so chains such
    as Reshape -> Transpose -> Reshape are filled from the first known tensor. An output with
    several data inputs (Concat) gets `merge` of their ranges, and only when every one of them
    has a range. Returns only the new entries, {name: range}; `known` is not modified.
    Only forward: an input never takes its range from an output.
    """
    filled: dict[str, V] = {}
    for node in proto.graph.node:
        if not is_pass_through(node):
            continue
        inputs = data_inputs(node)
        if not inputs:
            continue
        ranges = []
        for name in inputs:
            if name in known:
                ranges.append(known[name])
            elif name in filled:
                ranges.append(filled[name])
            else:
                break
        else:
            value = ranges[0] if len(ranges) == 1 else merge(ranges)
            for out in data_outputs(node):
                if out not in known and out not in filled:
                    filled[out] = value
    return filled
