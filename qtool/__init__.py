"""qtool: INT8 calibration for ONNX models. The Python API (see qtool.api and the README):

    cal = qtool.calibrate("model.onnx", images="imgs/", size=(320, 320))
    qtool.export("model.onnx", cal, target="openvino", path="model.openvino.onnx")
"""

__version__ = "0.1.0"

from .api import calibrate, evaluate, export, merge, recompute
from .calibration import Calibration
from .errors import QtoolError
from .evaluation import Evaluation
from .policy import Policies, Policy

__all__ = ["Calibration", "Evaluation", "Policies", "Policy", "QtoolError", "calibrate", "evaluate", "export", "merge",
           "recompute", "__version__"]
