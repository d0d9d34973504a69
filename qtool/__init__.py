"""qtool: INT8 calibration for ONNX models."""

__version__ = "0.1.0"
