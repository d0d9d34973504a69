"""qtool: INT8 calibration for ONNX models. The Python API (see qtool.api and the README):

    cal = qtool.calibrate("model.onnx", images="imgs/", size=(320, 320))
    qtool.export("model.onnx", cal, target="openvino", path="model.openvino.onnx")
"""

__version__ = "0.1.0"
JSON_SCHEMA = 1  # the version of every --json document (qtool.results); raised when a key changes meaning or goes away

__all__ = ["Calibration", "Evaluation", "Policies", "Policy", "QtoolError", "calibrate", "evaluate", "export", "merge",
           "recompute", "__version__"]

# imported on first use (PEP 562): `import qtool` and the command line start without numpy and onnx
_WHERE = {"calibrate": "api", "evaluate": "api", "export": "api", "merge": "api", "recompute": "api",
          "Calibration": "calibration", "QtoolError": "errors", "Evaluation": "checks.evaluation",
          "Policies": "quantizers.policy", "Policy": "quantizers.policy"}


def __getattr__(name: str):
    import importlib

    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:  # a submodule not imported yet (`import qtool; qtool.model`), as before
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
