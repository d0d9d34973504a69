"""Options as data (qtool.options): the same bad option is worded with its flag on the command line
and as its keyword from Python (qtool.errors), the objects are checked where they are built, and
--help shows export's and evaluate's options in the sections the declaration gives them."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from runcli import invoke
from test_layers import IMAGES, SAMPLE

import qtool
from qtool import api
from qtool.cli import cli
from qtool.errors import QtoolError, UsageError
from qtool.options import COMMANDS, DEFAULT_TARGET, IMAGE_KEYS, CalibrateOptions, ExportOptions
from qtool.targets import options_for
from qtool.targets.cpu import CpuOptions
from qtool.targets.tensorrt.options import TensorRTOptions


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    d = tmp_path_factory.mktemp("options")
    api.calibrate_files(SAMPLE, images=IMAGES, limit=8, output=d / "s.calib.json")
    return d / "s.calib.json"


def _error(r) -> str:
    """The one error line of a failed run (a usage error: click's "Error: " line)."""
    lines = [line for line in r.stderr.splitlines() if line.startswith(("error: ", "Error: "))]
    assert len(lines) == 1, r.stderr
    return lines[0].split(": ", 1)[1]


CASES = [  # (command line, the same request in Python, exit code, the flag's wording, the keyword's wording)
    (["calibrate", SAMPLE, "--images", IMAGES, "--size", "3x"], lambda c, t: api.calibrate_files(SAMPLE, images=IMAGES, size="3x"),
     1, "--size '3x' is not HxW, e.g. --size 320x320", "size='3x' is not HxW, e.g. size=(320, 320)"),
    (["calibrate", SAMPLE], lambda c, t: api.calibrate_files(SAMPLE), 1,
     "give exactly one of --images DIR or --data DIR", "give exactly one of images= or data="),
    (["export", "--target", "tensorrt", "--trt-version", "banana"],
     lambda c, t: api.export_file(target="tensorrt", calib=c, output=t / "x.onnx", trt_version="banana"), 1,
     "--trt-version 'banana' is not a TensorRT release qtool knows", "trt_version='banana' is not a TensorRT release qtool knows"),
    (["export", "--target", "tensorrt", "--cpu", "vnni"], lambda c, t: api.export_file(target="tensorrt", calib=c, cpu="vnni"), 2,
     "--cpu applies to --target openvino or qdq, not tensorrt", "cpu= applies to target='openvino' or qdq, not tensorrt"),
    (["export", "--target", "openvino", "--format", "cache"], lambda c, t: api.export_file(target="openvino", calib=c, fmt="cache"), 2,
     "--format applies to --target tensorrt, not openvino", "fmt= applies to target='tensorrt', not openvino"),
    (["evaluate", SAMPLE, "--images", IMAGES, "--fail-below", "inf"],
     lambda c, t: api.evaluate_files(SAMPLE, calib=c, images=IMAGES, fail_below=float("inf")), 1,
     "--fail-below inf must be a finite number of decibels", "fail_below='inf' must be a finite number of decibels"),
    (["export", "--target", "qdq", "--policy", "nope.json"],
     lambda c, t: api.export_file(target="qdq", calib=c, output=t / "x.onnx", policy="nope.json"), 1,
     "--policy 'nope.json' does not exist", "policy='nope.json' does not exist"),
    (["evaluate", SAMPLE, "--data", IMAGES, "--size", "28x28"],
     lambda c, t: api.evaluate_files(SAMPLE, calib=c, data=IMAGES, size=(28, 28)), 1,
     "--size applies to --images; .npy/.npz data is fed as it is", "size= applies to images=; .npy/.npz data is fed as it is"),
]


@pytest.mark.parametrize(("argv", "python", "code", "flags", "keywords"), CASES, ids=[" ".join(map(str, c[0][:3])) for c in CASES])
def test_the_same_bad_option_names_the_flag_on_the_command_line_and_the_keyword_in_python(calib, tmp_path, monkeypatch, argv, python,
                                                                                          code, flags, keywords):
    monkeypatch.chdir(tmp_path)
    argv = [*argv, "--calib", calib] if argv[0] in ("export", "evaluate") else argv
    r = invoke(*argv)
    assert r.exit_code == code and _error(r).startswith(flags), r.stderr
    with pytest.raises(UsageError if code == 2 else QtoolError) as raised:
        python(calib, tmp_path)
    assert str(raised.value).startswith(keywords)
    assert raised.value.worded({}).startswith(flags.replace("--format", "--fmt"))  # any front end words it: here --key


def test_options_are_checked_where_they_are_built():
    with pytest.raises(QtoolError, match=r"^fmt='dynamic_range' is not one of qdq, cache, dynamic-range, ort-trt$"):
        TensorRTOptions(fmt="dynamic_range")
    with pytest.raises(UsageError, match=r"^trt_version= applies to target='tensorrt', not qdq$"):
        options_for("qdq", trt_version="10.3")
    with pytest.raises(QtoolError, match=r"^target='tflite' is not one of tensorrt, openvino, qdq$"):
        options_for("tflite")
    with pytest.raises(QtoolError, match=r"^unknown option sise=: it takes "):
        CalibrateOptions.build(images="x", sise=(320, 320))
    with pytest.raises(QtoolError, match=r"^unknown option sise=: it takes "):
        qtool.calibrate(SAMPLE, images=IMAGES, sise=(320, 320))
    with pytest.raises(QtoolError, match=r"^wieght_bits= is not an export option$"):
        options_for("qdq", wieght_bits=4)
    built = options_for("openvino", cpu="vnni", exclude="conv1", weight_bits=4)
    assert built.own.cpu == "vnni" and built.exclude == ("conv1",) and built.own.policies.weights.bits == 4
    assert built == ExportOptions("openvino", exclude=("conv1",), own=CpuOptions("vnni", policies=built.own.policies))
    assert CalibrateOptions.build(images="imgs", size="32x48", scale=0.5).image.size == (32, 48)


def _sections(text: str) -> dict[str, list[str]]:
    """Heading -> the flags listed under it, in a --help text."""
    found: dict[str, list[str]] = {}
    heading = None
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line):
            heading = line[:-1]
            found[heading] = []
        elif heading and re.match(r"  -", line):
            found[heading].append(re.findall(r"--[a-z0-9-]+", line)[0])
    return found


def test_export_help_shows_each_target_s_options_in_their_own_section():
    r = invoke("export", "--help")
    assert r.exit_code == 0
    sections = _sections(r.stdout)
    assert list(sections) == ["Options", "TensorRT options", "OpenVINO/qdq options", "Policy options", "Mixed precision (openvino/qdq)"]
    assert sections["TensorRT options"] == ["--trt-version", "--format", "--algorithm", "--high-precision", "--precision", "--weights"]
    assert sections["OpenVINO/qdq options"] == ["--cpu", "--weights-7bit", "--no-ignored-patterns"]
    assert sections["Policy options"] == ["--weight-bits", "--activation-bits", "--scale-kind", "--activations", "--rounding", "--policy"]
    assert sections["Mixed precision (openvino/qdq)"] == ["--keep-fp32", "--max-drop", "--max-fp32", "--images", "--data", "--limit"]
    assert {"--target", "--calib", "--method", "--exclude", "--include", "--smooth-quant", "--no-bias-correction"} <= set(sections["Options"])
    listed = [flag for flags in sections.values() for flag in flags]
    assert len(listed) == len(set(listed))  # each option once


def test_evaluate_help_groups_its_options_too():
    sections = _sections(invoke("evaluate", "--help").stdout)
    assert list(sections) == ["Options", "TensorRT options", "OpenVINO/qdq options", "Policy options", "Held-out inputs"]
    assert sections["TensorRT options"] == ["--trt-version", "--format", "--high-precision", "--precision"]
    assert "--scale-kind" in sections["Policy options"] and "--scale" in sections["Held-out inputs"]
    assert sections["Held-out inputs"][:3] == ["--images", "--data", "--limit"]


def test_each_flag_has_one_meaning_across_commands():
    """--scale is the pixel multiplier (calibrate, evaluate), --scale-kind the scale kind (export,
    evaluate, inspect); a flag two commands share means the same in both."""
    helps = {}
    for command in ("calibrate", "export", "evaluate", "inspect"):
        for line in invoke(command, "--help").stdout.splitlines():
            m = re.match(r"  (?:-\w, )?(--[a-z0-9-]+)", line)
            if m:
                helps.setdefault(m.group(1), set()).add(command)
    assert helps["--scale"] == {"calibrate", "evaluate"} and helps["--scale-kind"] == {"export", "evaluate", "inspect"}
    r = invoke("export", "--target", "qdq", "--scale", "pow2")
    assert r.exit_code == 2 and "--scale-kind" in r.stderr


def _help_lines(text: str) -> dict[str, int]:
    """Flag -> the lines of its help in a --help text (the flag's own line counted when the help starts on it)."""
    found: dict[str, int] = {}
    flag = None
    for line in text.splitlines():
        m = re.match(r"  (?:-\w, )?(--[a-z0-9-]+)\S*(?: \S+)?( {2,}\S)?", line)
        if m:
            flag = m.group(1)
            found[flag] = 1 if m.group(2) else 0
        elif flag and line.startswith("      ") and line.strip():
            found[flag] += 1
        else:
            flag = None
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_each_option_s_help_is_at_most_three_lines_the_rest_is_in_the_docs(command):
    r = CliRunner().invoke(cli, [command, "--help"], terminal_width=80)
    assert r.exit_code == 0 and max(map(len, r.stdout.splitlines())) <= 80
    lines = _help_lines(r.stdout)
    assert len(lines) >= 4 and {f: n for f, n in lines.items() if n > 3} == {}
    if command == "export":
        assert len(r.stdout.splitlines()) < 100


def _literal_defaults(path: Path) -> list[str]:
    """file:line of each call in `path` given a `default=` holding a literal (other than None)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        for kw in node.keywords if isinstance(node, ast.Call) else ():
            if kw.arg == "default" and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                if any(isinstance(n, ast.Constant) for n in ast.walk(kw.value)):
                    found.append(f"{path.name}:{kw.value.lineno}")
    return found


def _commands():
    with click.Context(cli) as ctx:
        return {name: cli.get_command(ctx, name) for name in COMMANDS}


def test_each_default_is_written_once_in_its_declaration(tmp_path):
    """No click option of qtool/cli writes a default of its own (a literal `default=`); each default a
    command shows is its declaration's (qtool.options, a target's package), and the API builds the
    same options from no keyword as from the command line's defaults."""
    hits = [hit for path in sorted((Path(qtool.__file__).parent / "cli").glob("*.py")) for hit in _literal_defaults(path)]
    assert hits == []
    bad = tmp_path / "bad.py"
    bad.write_text('import click\n@click.option("--resize", default="stretch")\ndef f(resize): pass\n')
    assert _literal_defaults(bad) == ["bad.py:2"]  # the scan sees one
    shown = {}
    for name, command in _commands().items():
        declared = api.COMMAND_OPTIONS[name]
        for p in command.params:
            if not isinstance(p, click.Option):
                continue
            default = p.to_info_dict()["default"]  # click's "not given" as None
            if p.name in declared:
                assert default == declared[p.name].default, (name, p.name)
                shown[(name, p.name)] = default
            elif p.name in api.OPTIONS:  # an export option: the library applies its default
                assert default in (None, ()) or api.OPTIONS[p.name].negated and default is True, (name, p.name)
            else:  # a path, a target, --json, -q/-v: nothing, or a flag left off
                assert default in (None, False), (name, p.name)
    assert shown[("calibrate", "resize")] == "stretch" and shown[("calibrate", "scale")] == "1/255"
    assert shown[("calibrate", "bins")] == 2048 and shown[("calibrate", "kl_variant")] == "nvidia"
    assert shown[("calibrate", "trt_version")] == api.TRT_CACHE_VERSION and shown[("export", "max_fp32")] == 20
    assert shown[("recompute", "kl_variant")] is None and shown[("evaluate", "resize")] is None  # the file's
    cal = _commands()["calibrate"]
    given = {p.name: p.to_info_dict()["default"] for p in cal.params if p.name in CalibrateOptions.__dataclass_fields__ or p.name in IMAGE_KEYS}
    assert CalibrateOptions.build(**{**given, "images": "x"}) == CalibrateOptions.build(images="x") == CalibrateOptions(images=Path("x"))


@pytest.mark.parametrize("command", ["export", "evaluate", "report"])
def test_target_is_one_option_a_typo_names_the_nearest(calib, command):
    first = {"export": [], "evaluate": [SAMPLE, "--images", IMAGES], "report": [calib]}[command]
    r = invoke(command, *first, "--target", "OpenVin0", "--calib" if command != "report" else "--model", calib if command != "report"
               else SAMPLE)
    assert r.exit_code == 2 and "did you mean 'openvino'" in r.stderr, r.stderr


def test_evaluate_and_report_take_the_target_a_file_records_and_refuse_another(calib, tmp_path, monkeypatch):
    """The default --target is the one an exported FILE records, else DEFAULT_TARGET; naming another is an
    error, qdq (the default) too."""
    monkeypatch.chdir(tmp_path)
    ok = invoke("export", "--target", "openvino", "--calib", calib, SAMPLE, "-o", tmp_path / "s.openvino.onnx")
    assert ok.exit_code == 0, ok.output
    for named in (["--target", "qdq"], ["--target", "tensorrt"]):
        r = invoke("evaluate", tmp_path / "s.openvino.onnx", "--images", IMAGES, "--limit", "2", *named)
        assert r.exit_code == 1 and _error(r).startswith(f"{' '.join(named)}: ") and "is an openvino export" in r.stderr, r.stderr
    r = invoke("evaluate", tmp_path / "s.openvino.onnx", "--images", IMAGES, "--limit", "2", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["target"] == "openvino", r.output
    assert DEFAULT_TARGET == "qdq" and f"else {DEFAULT_TARGET}]" in invoke("evaluate", "--help").stdout.replace("\n", " ")


def test_the_api_s_evaluate_takes_evaluate_s_keywords(calib):
    """qtool.evaluate builds qtool evaluate's options object (no keyword picked apart by hand): the
    held-out and image keywords, checked where built."""
    cal = qtool.Calibration.load(calib)
    ours = qtool.evaluate(SAMPLE, cal, target="openvino", images=IMAGES, limit=4, batch_size=2, scale="1/255")
    files = api.evaluate_files(SAMPLE, calib=calib, target="openvino", images=IMAGES, limit=4)
    assert [o.sqnr_db for o in ours.outputs] == [o.sqnr_db for o in files.evaluation.outputs]
    with pytest.raises(QtoolError, match=r"^limit=0 must be at least 1$"):
        qtool.evaluate(SAMPLE, cal, images=IMAGES, limit=0)
    with pytest.raises(QtoolError, match=r"^size= applies to images=; "):
        qtool.evaluate(SAMPLE, cal, data=IMAGES, size=(28, 28))
