"""`qtool inspect`: what a calibration file or a TensorRT range file holds and what it covers, the
TensorRT rules a Q/DQ model breaks, or the policy each quantizer gets."""

from __future__ import annotations

from pathlib import Path

from .. import inspection
from ..errors import Opt, UsageError, opts
from ..options import PolicyFlags
from ..results import InspectResult
from ..targets.tensorrt import checker
from ..targets.tensorrt import files as trtfiles
from . import path


def run(file, *, model=None, trt_version: str | None = None, policies: PolicyFlags | None = None) -> InspectResult:
    """What `file` holds (a calibration file, TensorRT cache, dynamic-range file or onnxruntime table,
    told apart by content), with `model` the activation tensors of that model it covers; with
    `trt_version`, `file` is a Q/DQ ONNX model checked against that TensorRT's rules; with policy
    flags (as export's), each quantizer of the calibration's model and its policy. A missing range,
    an unusable scale or a broken rule is the result's failure."""
    file, model_path = Path(file), path(model)
    if policies is not None and policies.given():
        if trt_version is not None or model_path is not None:
            raise UsageError("the policy options go with a calibration file alone (not with {trt_version} or {model})",
                             **opts("trt_version", "model"))
        return inspection.inspect_policies(file, policies.policies())
    if trt_version is not None:
        if model_path is not None:
            raise UsageError("{trt_version} checks the ONNX model given as FILE; it does not go with {model}", **opts("trt_version", "model"))
        trt_version = trtfiles.canonical_version(trt_version)
        checker.parse_version(trt_version)
        if not inspection.is_onnx_file(file):  # missing or unreadable: bad input; another kind of file: a usage error
            raise UsageError("{trt_version} checks an ONNX model's Q/DQ nodes, and {file!r} is not an ONNX model",
                             trt_version=Opt("trt_version"), file=str(file))
        return inspection.inspect_onnx(file, trt_version)
    return inspection.inspect_file(file, model_path)

