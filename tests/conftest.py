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
