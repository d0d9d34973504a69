"""Layers: the command line (qtool/cli) is parsing and printing over qtool.api, which holds what each
command does: the CLI imports no other qtool module, and each command's api function gives the data
the command prints (the CLI words its text), with messages naming keywords to API callers and flags
on the command line."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from runcli import invoke

from qtool import api
from qtool.cli import calibrate as cli_calibrate  # the command line words the api's result as text
from qtool.errors import QtoolError, UsageError

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "qtool" / "cli"
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"

ALLOWED = {"qtool.api", "qtool.errors", "qtool.__version__", "qtool.JSON_SCHEMA"}
PLUMBING = {"qtool.scratch", "qtool.runtime.onnxruntime", "qtool.statistics"}  # the process set-up of qtool/cli/__init__.py


def qtool_imports(source: str, package: str) -> set[str]:
    """Every qtool module (or name of the qtool package) that `source`, a module of `package`,
    imports anywhere, functions included; modules of `package` itself left out."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            if base == "qtool" or (node.module is None and node.level):
                found |= {f"{base}.{a.name}" for a in node.names}
            else:
                found.add(base)
    return {m for m in found if (m == "qtool" or m.startswith("qtool.")) and not m.startswith(package + ".") and m != package}


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    source = "from .. import api\nfrom . import cli\ndef f():\n    from ..targets import tensorrt\n    import qtool.model\n"
    assert qtool_imports(source, "qtool.cli") == {"qtool.api", "qtool.targets", "qtool.model"}
    assert qtool_imports("from .. import __version__\nfrom ..errors import QtoolError\n", "qtool.cli") == {"qtool.__version__", "qtool.errors"}


def test_the_command_line_imports_only_the_api():
    modules = sorted(CLI.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        imported = qtool_imports(path.read_text(), "qtool.cli")
        allowed = ALLOWED | (PLUMBING if path.name == "__init__.py" else set())
        assert imported <= allowed, (path.name, sorted(imported - allowed))
        if path.name != "__init__.py":
            assert "qtool.api" in imported, path.name  # each command calls the api


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """A calibration by the api and by the command line, of the same inputs."""
    d = tmp_path_factory.mktemp("layers")
    outcome = api.calibrate_files(SAMPLE, images=IMAGES, limit=8, output=d / "api.calib.json", trt_table=d / "api.cache")
    cli = invoke("calibrate", SAMPLE, "--images", IMAGES, "--limit", 8, "-o", d / "cli.calib.json", "--trt-table", d / "cli.cache", "--json")
    assert cli.exit_code == 0, cli.output
    return d, outcome, json.loads(cli.stdout)


def _same(a: dict, b: dict, *paths) -> None:
    """Equal summaries apart from the time taken and the output paths given."""
    a, b = dict(a), dict(b)
    for s in (a, b):
        s.pop("seconds")
        for key in paths:
            s.pop(key)
    assert a == b


def test_calibrate_files_is_the_command(calibrated):
    d, outcome, summary = calibrated
    assert (d / "api.calib.json").read_bytes() == (d / "cli.calib.json").read_bytes()
    assert (d / "api.cache").read_bytes() == (d / "cli.cache").read_bytes()
    assert isinstance(outcome, api.CalibrateResult) and outcome.images == 8 and outcome.target_facts["tensorrt_header"].startswith("TRT-")
    assert outcome.outputs == {"calibration": str(d / "api.calib.json"), "tensorrt_cache": str(d / "api.cache")}
    _same(outcome.to_json(), summary, "outputs", "build")
    assert summary["schema"] == 1 and summary["command"] == "calibrate"
    assert cli_calibrate.text(outcome).startswith(f"calibrated {summary['tensors']} tensors from 8 images in ")


def test_messages_name_keywords_in_the_api_and_flags_on_the_command_line(calibrated, tmp_path):
    d, _, _ = calibrated
    with pytest.raises(QtoolError, match=r"^give exactly one of images= or data=$"):
        api.calibrate_files(SAMPLE, output=tmp_path / "x.calib.json")
    with pytest.raises(QtoolError, match=r"^keep_fp32= measures on real inputs: give exactly one of images= or data=$"):
        api.export_file(SAMPLE, target="qdq", calib=d / "api.calib.json", output=tmp_path / "x.onnx", keep_fp32=2)
    r = invoke("export", SAMPLE, "--target", "qdq", "--calib", d / "api.calib.json", "-o", tmp_path / "x.onnx", "--keep-fp32", 2)
    assert r.exit_code == 1 and r.stderr == "error: --keep-fp32 measures on real inputs: give exactly one of --images DIR or --data DIR\n"
    assert not (tmp_path / "x.onnx").exists()


def test_a_usage_error_is_a_qtool_error_in_the_api_and_exit_2_with_the_usage_line(calibrated):
    d, _, _ = calibrated
    with pytest.raises(UsageError, match=r"^trt_version= checks the ONNX model given as FILE; it does not go with model=$"):
        api.inspect_file(d / "api.calib.json", model=SAMPLE, trt_version="10")
    assert issubclass(UsageError, QtoolError)
    r = invoke("inspect", d / "api.calib.json", "--model", SAMPLE, "--trt-version", "10")
    assert r.exit_code == 2 and r.stderr.startswith("Usage: ") and r.stderr.splitlines()[0].endswith(" inspect [OPTIONS] FILE")
    assert "Error: --trt-version checks the ONNX model given as FILE; it does not go with --model" in r.stderr
    with pytest.raises(UsageError, match=r"^weight_bits= applies to target='openvino' or qdq, not tensorrt$"):
        api.export_file(SAMPLE, target="tensorrt", calib=d / "api.calib.json", weight_bits=4)
    r = invoke("export", SAMPLE, "--target", "tensorrt", "--calib", d / "api.calib.json", "--weight-bits", 4)
    assert r.exit_code == 2 and "Error: --weight-bits applies to --target openvino or qdq, not tensorrt" in r.stderr


def test_inspect_file_gives_what_json_prints_and_a_failed_check(calibrated):
    d, _, _ = calibrated
    outcome = api.inspect_file(d / "api.calib.json", model=SAMPLE)
    r = invoke("inspect", d / "api.calib.json", "--model", SAMPLE, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout) == outcome.to_json() and outcome.failure is None
    assert outcome.coverage["percent"] == 100.0
    cache = api.inspect_file(d / "api.cache")
    assert cache.kind == "tensorrt-cache" and cache.unusable == () and cache.failure is None
    assert {t["name"] for t in cache.tensors} <= {t["name"] for t in outcome.tensors}


def test_evaluate_files_reports_a_failed_gate_after_its_results(calibrated):
    d, _, _ = calibrated
    outcome = api.evaluate_files(SAMPLE, calib=d / "api.calib.json", images=IMAGES, limit=8, fail_below=500)
    assert outcome.passed is False and outcome.inputs == 8 and outcome.input_kind == "images"
    assert str(outcome.failure).startswith("output ") and str(outcome.failure).endswith(" dB is below fail_below=500 dB")
    r = invoke("evaluate", SAMPLE, "--calib", d / "api.calib.json", "--images", IMAGES, "--limit", 8, "--fail-below", 500, "--json")
    flags = str(outcome.failure).replace("fail_below=", "--fail-below ")
    assert r.exit_code == 1 and r.stderr == f"error: {flags}\n"
    printed = json.loads(r.stdout)
    assert (printed.pop("error"), printed.pop("exit")) == (flags, 1)  # --json's one document says the failure too
    _same(printed, outcome.to_json())


# README, Layout: the packages in import order; each module imports only from its own layer and those before it
ORDER = ["errors", "scratch", "blas", "model", "runtime", "fileio", "feeds", "statistics", "calibration", "quantizers", "options", "collection",
         "targets", "provenance", "checks", "results", "commandinputs", "inspection", "commands", "api", "cli", "launch", "__main__"]


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "qtool"


def _imports_of(path: Path) -> tuple[str, list[str]]:
    """The module `path` is and every qtool module or name it imports (relative imports resolved)."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
    return name, _resolved(path.read_text(), name if rel[-1] == "__init__" else name.rsplit(".", 1)[0])


def _resolved(source: str, package: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module or ""
            found += [f"{base}.{a.name}" for a in node.names] if base == "qtool" else [base]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.startswith("qtool.")]


def test_each_layer_imports_only_the_layers_before_it():
    modules = sorted((ROOT / "qtool").rglob("*.py"))
    assert len(modules) > 40
    wrong = []
    for path in modules:
        me, imported = _imports_of(path)
        for other in imported:
            mine, theirs = _layer(me), _layer(other)
            if "qtool" in (mine, theirs) or mine == theirs or other in ("qtool.__version__", "qtool.JSON_SCHEMA"):
                continue
            assert mine in ORDER and theirs in ORDER, f"{me} imports {other}: a layer missing from ORDER (and README's Layout)"
            if ORDER.index(theirs) > ORDER.index(mine):
                wrong.append(f"{me} imports {other}")
    assert wrong == []


def test_only_the_runtime_layer_makes_sessions():
    """Every onnxruntime session and OpenVINO compile is made in qtool/runtime (one home for
    providers, log level, threads, optimization level, weights on disk, float precision)."""
    found = []
    for path in sorted((ROOT / "qtool").rglob("*.py")):
        if "runtime" in path.relative_to(ROOT / "qtool").parts:
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {word}" for word in ("InferenceSession(", "SessionOptions(", "compile_model(", ".Core(")
                  if word in text]
    assert found == []


def test_the_layer_check_resolves_every_import_form():
    source = "from ..targets import tensorrt\nfrom . import thresholds\ndef f():\n    from .. import api\n    import qtool.model.graph\n"
    assert _resolved(source, "qtool.statistics") == ["qtool.targets", "qtool.statistics", "qtool.api", "qtool.model.graph"]
    assert [_layer(m) for m in _resolved(source, "qtool.statistics")] == ["targets", "statistics", "api", "model"]


def test_no_module_outside_the_targets_branches_on_a_target_name():
    """What a target does differently is asked of it (qtool.targets: rules, writer hooks), never
    decided by comparing its name: no `target == "tensorrt"` outside qtool/targets."""
    found = []
    for path in sorted((ROOT / "qtool").rglob("*.py")):
        if "targets" in path.relative_to(ROOT).parts:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in _target_name_tests(path.read_text())]
    assert found == []


def _target_name_tests(source: str) -> list[int]:
    """Lines comparing a target (a name with "target" in it) to a target's name ("openvino" is also
    a runtime's name: compared to a runtime it is not counted)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = any(isinstance(c, ast.Constant) and c.value in api.TARGETS for c in operands)
            if named and any("target" in _last_name(o) for o in operands):
                lines.append(node.lineno)
    return lines


def _last_name(node: ast.AST) -> str:
    """What an operand finally names: `target`, `self.target`, `options["target"]` (a call's result: nothing)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    return ""


def test_the_target_name_check_tells_a_target_from_a_runtime():
    source = 'if target == "tensorrt":\n    pass\nif get(target).runtime == "openvino":\n    pass\nok = name in ("qdq", "x")\n'
    assert _target_name_tests(source) == [1]
    assert _target_name_tests('if options["target"] != "qdq":\n    pass\n') == [1]
