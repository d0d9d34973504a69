"""Fixtures shared by several test modules (the helper functions live in test_openvino.py,
runcli.py and zoo.py, which the tests import)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

IMAGES = Path(__file__).resolve().parents[1] / "calib_images"


@pytest.fixture
def sample_images(tmp_path):
    """make(n) -> a folder of its own holding the first n bundled sample images."""

    def make(n: int, name: str = "imgs") -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for p in sorted(IMAGES.glob("*.png"))[:n]:
            shutil.copy(p, folder / p.name)
        return folder

    return make


# Every OpenVINO compile in a test states the float precision it means (INFERENCE_PRECISION_HINT):
# OpenVINO's own default depends on the CPU (bf16 with AVX-512 BF16 or AMX, qtool.quantizers.cpu_kinds.KINDS),
# so a compile that leaves it out would make a test's precisions and numbers the CPU's luck. A test
# where OpenVINO's default itself is the point says so with @pytest.mark.openvino_default_precision.
_DEFAULT_ALLOWED = [False]


def pytest_configure(config):
    config.addinivalue_line("markers", "openvino_default_precision: the test compiles with OpenVINO's CPU-dependent default float precision")
    try:
        import openvino
    except ImportError:
        return
    compile_model = openvino.Core.compile_model

    def stated(self, model, device_name=None, config=None, **kwargs):
        given = config if isinstance(config, dict) else device_name if isinstance(device_name, dict) else {}
        if not _DEFAULT_ALLOWED[0] and "INFERENCE_PRECISION_HINT" not in given:
            raise AssertionError("an OpenVINO compile in a test must state INFERENCE_PRECISION_HINT (qtool.quantizers.cpu_kinds.PINNED_F32), "
                                 "or the test be marked openvino_default_precision")
        return compile_model(self, model, device_name, config, **kwargs)

    openvino.Core.compile_model = stated


@pytest.fixture(autouse=True)
def _openvino_default_precision(request):
    _DEFAULT_ALLOWED[0] = request.node.get_closest_marker("openvino_default_precision") is not None
    yield
    _DEFAULT_ALLOWED[0] = False
