"""onnx's shape inference of a model without its weight data, shared by every step of a command.

Shape inference reads the graph, not the weights: it runs on the model's serialization with the
data of every big float initializer left out (`weightless`: lazy ones, and in-graph ones of
INLINE_BYTES or more), at the size of the graph. The results are cached by the graph's content
(`INFERENCES`): the model module's tensor types and sizes, SmoothQuant's ranks and the FP16
converter ask about the same few graphs in one command and share one inference each. The cache is
one per process, not one per loaded model, because those steps are handed bare protos (copies and
edits of the loaded model's), which hold no link to where they came from; keyed by content, a
cached result is right for any proto it is found for.
"""

from __future__ import annotations

import hashlib

import onnx

from . import lazy, wire

WEIGHTLESS = "qtool-weightless"  # the external-data location of the initializers weightless leaves out


def _big_float(t: onnx.TensorProto) -> bool:
    return t.data_type in lazy.FLOATS and lazy.big(t)


def weightless(model: onnx.ModelProto) -> bytes:
    """The model's serialization with the data of every big float initializer left out (lazy
    ones, and in-graph ones of INLINE_BYTES or more, shown as external data of no file): what
    shape inference reads, at the size of the graph."""
    return wire.spliced(model, lambda t: lazy.is_lazy(t) or _big_float(t), lambda t: lazy.placeholder(t, WEIGHTLESS))


class Inferences:
    """onnx's shape inference results of the last few weightless graphs, by their SHA-256."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._results: dict[str, onnx.ModelProto | None] = {}

    def clear(self) -> None:
        self._results.clear()

    def of(self, data: bytes) -> onnx.ModelProto | None:
        """The inference (strict_mode off) of the weightless model `data`, or None when it fails."""
        key = hashlib.sha256(data).hexdigest()
        if key not in self._results:
            try:
                result = onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(data), strict_mode=False)
            except Exception:  # a model onnx cannot infer (custom ops): what the file declares
                result = None
            if len(self._results) >= self.keep:
                self._results.pop(next(iter(self._results)))
            self._results[key] = result
        return self._results[key]


INFERENCES = Inferences()


def inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnx's shape inference (strict_mode off) of the model without its weight data, or None when
    it fails; cached by the graph's content, so every step of a command that asks about one graph
    shares one inference. The result holds no weight data: read types and shapes from it."""
    return INFERENCES.of(weightless(model))


def with_inferred_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx.shape_inference.infer_shapes(model, strict_mode=False) (raising as it does), computed on
    the model without its weight data: a new model, the weights those of `model`."""
    result = inferred(model)
    if result is None:
        onnx.shape_inference.infer_shapes(onnx.ModelProto.FromString(weightless(model)), strict_mode=False)  # raises
        raise RuntimeError("shape inference failed")
    out = onnx.ModelProto()
    out.CopyFrom(result)
    for mine, theirs in zip(out.graph.initializer, model.graph.initializer):
        if lazy.location(mine) == WEIGHTLESS:
            mine.CopyFrom(theirs)
    return out
