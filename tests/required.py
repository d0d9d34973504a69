"""What a test needs from its machine. Missing here, the test skips, saying what to install; under CI
(the environment variable CI set to true, as .ci/run sets it and CI services do) it fails instead:
.ci/run installs everything a test needs (the `test` extra, Debian's chromium and qemu-user), so
a skip there would be a test that never runs. What no install can give (another CPU architecture,
a CPU feature) stays a skip everywhere, with pytest.skip."""

from __future__ import annotations

import importlib
import os

import pytest

UNDER_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(condition, reason: str) -> None:
    """Skip the test (or the module, at module level) unless `condition`; under CI, fail."""
    if condition:
        return
    if UNDER_CI:
        pytest.fail(f"CI must run this test, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module(name: str, install: str = "pip install '.[test]'"):
    """The imported module `name`, as pytest.importorskip gives it, failing under CI."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"{name} cannot be imported ({e}); {install}")
