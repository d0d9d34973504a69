"""The code's shape stays readable: options travel as objects, not as long parameter lists; functions
are short enough to read at once; the API words its errors from their structure, never by rewriting
text (issue 42)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "qtool"
MAX_PARAMETERS = 10  # outside qtool/cli, whose click commands take one parameter per option
MAX_LINES = 60
LONG_ALLOWED = 3  # functions over MAX_LINES (the numba kernel's one loop reads best whole)


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT), node


def parameters(node: ast.FunctionDef) -> int:
    a = node.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_the_counters_count_what_they_say():
    f = ast.parse("def f(a, /, b, *c, d, e=1, **g):\n    pass\n").body[0]
    assert parameters(f) == 6 and f.end_lineno - f.lineno + 1 == 2


def test_no_function_outside_the_command_line_takes_more_than_ten_parameters():
    many = [f"{path}:{node.lineno} {node.name} ({parameters(node)})" for path, node in _functions()
            if parameters(node) > MAX_PARAMETERS and path.parts[1] != "cli"]
    assert many == []


def test_at_most_three_functions_run_past_sixty_lines():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)" for path, node in _functions()
            if node.end_lineno - node.lineno + 1 > MAX_LINES]
    assert len(long) <= LONG_ALLOWED, long


def test_the_api_uses_no_regular_expression():
    tree = ast.parse((PACKAGE / "api.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "re" not in imported


def test_tensorrt_is_named_only_in_its_package_the_registry_and_the_api():
    """A target is one subpackage (issue 50): outside qtool/targets/tensorrt/, only the registry and the
    API's docs name TensorRT, in code or comments."""
    naming = sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                    if "tensorrt" in p.read_text().lower() and "tensorrt" not in p.relative_to(PACKAGE).parts[:2])
    assert naming == ["qtool/api.py", "qtool/targets/__init__.py"], naming
