"""OpenVINO's CPU plugin: the one place qtool compiles a model with OpenVINO.

OpenVINO is optional (pip install openvino): it is imported when a session is made, and its
absence is a one-line QtoolError saying how to install it.
"""

from __future__ import annotations

import numpy as np

from ..errors import QtoolError


def package():
    """The openvino module, or a one-line error saying how to install it."""
    try:
        import openvino  # optional: only commands that run OpenVINO need it
    except ImportError:
        raise QtoolError("OpenVINO is not installed: pip install openvino (or 'qtool[test]')") from None
    return openvino


class Session:
    """OpenVINO's CPU plugin on a model, behind onnxruntime's `run(names, feeds)`. `precision`: the
    float precision of the unquantized layers, "f32" or "default" (OpenVINO's choice on this CPU: bf16
    with AVX-512 BF16 or AMX, qtool.quantizers.cpu), stated in the config either way; `float_precision`
    is the one it runs them in ("f32", "bf16", "f16")."""

    def __init__(self, data: bytes, config: dict | None = None, precision: str = "f32"):
        core = package().Core()
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
