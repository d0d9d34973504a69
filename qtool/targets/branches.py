"""Quantizers inside If branches: each branch placed by its target's writer as a model of its own.

A target whose record says it places quantizers in If branches (`Target.branches`) has its
writer's file finished here: for every If node of the file's main graph, each branch is made a
model of its own (qtool.model.branches.standalone: its outer-scope reads are its inputs), the
writer runs on it with the same calibration and options (the same rules as at the top level, the
branch's own If nodes handled the same way in turn), and the placed graph is put back in the
branch, the outer-scope names implicit again. Names the writer made that the rest of the model
also uses are renamed. A branch whose writer fails, or that nothing recorded reaches (a branch no
calibration input took), stays float; the summary adds each branch's counts to the file's.
Passes that need the whole model see one branch at a time: bias correction and SmoothQuant read
the calibration's statistics of the branch's own tensors (calibrate records none per channel
inside branches: they do nothing there). evaluate --tensors, --keep-fp32 and --max-drop build their models
from the main graph's placement alone (the branches stay float there). Loop and Scan bodies are not
opened: every target's export warns of the layers in them, which stay float.
"""

from __future__ import annotations

import dataclasses

import onnx

from ..errors import QtoolError
from ..model import branches, float16, tensor_types
from ..model import graph as G
from . import WrittenFile, get

LAYERS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")  # the layers a loop body keeps float (said once)
CHECKER = "the exported model fails onnx.checker"  # graph.finish's warning where the input model fails it too

# the summary's counts, added up over the file and its branches (its other numbers are the file's)
COUNTS = ("activation_quantizers", "weight_quantizers", "int8_layers", "fp32_layers", "bias_corrected_layers", "gptq_layers")


def refused(target: str, proto: onnx.ModelProto) -> QtoolError | None:
    """Why `target`'s export of `proto` quantizes nothing when the reason is that its layers are inside If
    branches, where the target places no quantizer (None otherwise)."""
    if get(target).branches or not branches.has_branches(proto):
        return None
    nodes = ", ".join(repr(n.name or n.output[0]) for n in branches.if_nodes(proto.graph)[:3])
    return QtoolError(f"the {target} export would quantize nothing: the model's layers are inside If branches ({nodes}), where the "
                      f"{target} target places no quantizer (its Q/DQ rules inside conditionals are not established); export "
                      "--target qdq or openvino, which quantize inside If branches; no file written")


def finished(loaded, cal, options, export, result: WrittenFile) -> WrittenFile:
    """The writer's `result` for `loaded` with quantizers placed inside its If branches too (module doc);
    `result` itself when the target does not place them there or the model has no If."""
    bodies = _float_bodies(loaded.proto)
    if bodies is not None:
        result = dataclasses.replace(result, warnings=result.warnings + [bodies])
    if not get(options.target).branches or not branches.has_branches(loaded.proto) or not isinstance(result.data, bytes):
        return result
    model = onnx.load_model_from_string(result.data)
    summaries, warnings = [result.summary], list(result.warnings)
    if not _place(model, loaded, cal, options, export, summaries, warnings):
        return result
    data, more = G.finish(model, loaded.proto)
    return WrittenFile(data, warnings + more, _merged(summaries))


def layers_inside(proto: onnx.ModelProto) -> list[str]:
    """The layers (LAYERS) inside the If branches of `proto`'s main graph, at any depth."""
    return [m.name or m.output[0] for n in branches.if_nodes(proto.graph) for which in branches.BRANCHES
            for m in G.all_nodes(branches.branch(n, which)) if m.op_type in LAYERS]


def _float_bodies(proto: onnx.ModelProto) -> str | None:
    """The warning for layers inside Loop and Scan bodies (at any depth), which stay float, or None."""
    layers = [m.name or m.output[0] for n in G.all_nodes(proto.graph) if n.op_type in ("Loop", "Scan")
              for sub in G.subgraphs(n) for m in G.all_nodes(sub) if m.op_type in LAYERS]
    if not layers:
        return None
    return (f"{len(layers)} layer(s) inside Loop/Scan bodies stay float ({', '.join(layers[:3])}{', ...' if len(layers) > 3 else ''}): "
            "qtool quantizes inside If branches, not loop bodies")


def _place(model: onnx.ModelProto, loaded, cal, options, export, summaries: list[dict], warnings: list[str]) -> bool:
    """Place quantizers in the If branches of `model`'s main graph (in place); whether any branch changed."""
    recorded = {t.name for t in cal.tensors}
    # the file's types, and the model's where inference stops at the file's own ops (OpenVINO's FakeQuantize): a float16
    # model's branch reading a tensor below one would take it as float32, its FakeQuantize ranges too (onnxruntime refused);
    # a file written from the float32 twin (qtool.model.float16: no float16 weight left) has the model's float32 types
    own = tensor_types(loaded.proto)
    if not any(t.data_type == onnx.TensorProto.FLOAT16 for g in float16.graphs(model.graph) for t in g.initializer):
        own = {k: onnx.TensorProto.FLOAT if v == onnx.TensorProto.FLOAT16 else v for k, v in own.items()}
    types = {**own, **tensor_types(model)}
    scope = G.defined(model.graph)
    changed = False
    for node in branches.if_nodes(model.graph):
        for which in branches.BRANCHES:
            graph = branches.branch(node, which)
            if not (_reached(graph) & recorded):
                continue
            sub = branches.standalone(model, graph, types)
            try:
                result = export(dataclasses.replace(loaded, proto=sub, given=None, rewritten=None), cal, options)
            except QtoolError as e:
                warnings.append(f"If {node.name!r} {which}: stays float ({e})")
                continue
            if not isinstance(result.data, bytes):
                continue
            placed = onnx.load_model_from_string(result.data)
            inner = [result.summary]
            _place(placed, loaded, cal, options, export, inner, warnings)
            if not any(s.get("activation_quantizers") or s.get("weight_quantizers") or s.get("int8_lstm") for s in inner):
                continue
            _rename_clashes(placed.graph, graph, _names(model.graph) - _names(graph))
            branches.put_back(placed, graph, scope)
            for entry in placed.opset_import:
                G.ensure_opset(model, entry.domain, entry.version)
            summaries.extend(inner)
            # onnx's checker refuses a standalone branch whose outputs have no shape (a subgraph's may not): the
            # whole file is checked once its branches are back (G.finish)
            warnings.extend(f"If {node.name!r} {which}: {w}" for w in result.warnings if not w.startswith(CHECKER))
            changed = True
    return changed


def _reached(graph: onnx.GraphProto) -> set[str]:
    """Every tensor a graph and its subgraphs define."""
    names = G.defined(graph)
    for n in graph.node:
        for sub in G.subgraphs(n):
            names |= _reached(sub)
    return names


def _names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a graph and its subgraphs mention."""
    names = _reached(graph) | {o.name for o in graph.output}
    for n in graph.node:
        names.update(i for i in n.input if i)
        for sub in G.subgraphs(n):
            names |= _names(sub)
    return names


def _rename_clashes(placed: onnx.GraphProto, before: onnx.GraphProto, elsewhere: set[str]) -> None:
    """Rename (in place, at every depth) the tensors the writer added to `placed` (a branch's graph: not in
    `before`) that the rest of the model (`elsewhere`) also names: a subgraph may not redefine them."""
    added = _reached(placed) - _reached(before) - {i.name for i in placed.input}
    clashes = sorted(added & elsewhere)
    if not clashes:
        return
    taken = elsewhere | _names(placed)
    mapping = {}
    for name in clashes:
        k = 1
        while f"{name}_{k}" in taken:
            k += 1
        mapping[name] = f"{name}_{k}"
        taken.add(mapping[name])
    _rename(placed, mapping)


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    for n in graph.node:
        n.input[:] = [mapping.get(i, i) for i in n.input]
        n.output[:] = [mapping.get(o, o) for o in n.output]
        for sub in G.subgraphs(n):
            _rename(sub, mapping)
    for t in graph.initializer:
        t.name = mapping.get(t.name, t.name)
    for vi in list(graph.value_info) + list(graph.output):
        vi.name = mapping.get(vi.name, vi.name)


def _merged(summaries: list[dict]) -> dict:
    """One summary of the file's and its branches' (counts added, lists and tables joined, the rest the file's)."""
    out = dict(summaries[0])
    for more in summaries[1:]:
        for key, value in more.items():
            have = out.get(key)
            if isinstance(value, bool) or key not in out:
                out.setdefault(key, value)
            elif key in COUNTS and isinstance(value, int) and isinstance(have, int):
                out[key] = have + value
            elif isinstance(value, list) and isinstance(have, list):
                out[key] = sorted(set(have) | set(value), key=str)
            elif isinstance(value, dict) and isinstance(have, dict):
                out[key] = {**have, **value}
    out["if_branches_quantized"] = len(summaries) - 1
    return out
