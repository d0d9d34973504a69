"""Calibrate's memory, session 25 (issue 49: docs/benchmarks.md #mem25)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the command line's process holds when shape inference's child is started: a child, until it runs its own
# program, shares its parent's pages, which a process tree's RSS sum counts twice.
_AT_START = """
import sys
import qtool.launch  # the command line's entry (the console script, python -m qtool)
from qtool.model import shapes
child = shapes._child
print(child is not None and child.proc.poll() is None, "onnxruntime" in sys.modules)
print(child is not None and child.ready)
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_command_line_starts_shape_inference_s_child_before_onnxruntime_and_the_model():
    assert _run(_AT_START) == ["True", "False", "True"]


def test_a_program_that_imports_qtool_starts_it_on_first_use():
    code = _AT_START.replace("import qtool.launch", "import qtool")
    assert _run(code) == ["False", "False", "False"]
