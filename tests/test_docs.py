"""The README is a front page and the manual in docs/ is a site that builds and keeps up with the code:
mkdocs builds it strictly (every link and anchor resolves), the README stays short with both set-up
commands, the layouts in the architecture page and the README name exactly what the tree holds, the
command-line reference names every option each command takes, and the manual's examples run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
GLOBAL_FLAGS = {"--help", "--json", "--quiet", "--verbose"}  # every command's, documented once (cli.md, Output)
COMMANDS = ("calibrate", "recompute", "merge", "export", "inspect", "evaluate", "report")


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _block(text: str, marker: str, fence: str = "text") -> str:
    """The fenced block right after the HTML comment starting with `marker`."""
    found = re.search(rf"<!-- {re.escape(marker)}.*?-->\n```{fence}\n(.*?)```", text, re.S)
    assert found, f"no block after <!-- {marker} -->"
    return found.group(1)


def test_the_manual_builds_with_every_link_and_anchor_resolved(tmp_path):
    """mkdocs is in the test extra: a missing mkdocs fails here rather than skipping the check."""
    r = _run("-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "benchmarks" / "index.html").exists()
    assert (tmp_path / "site" / "report-1280px.png").exists()


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert [p for p in pages if f": {p}\n" not in nav] == []


def test_the_readme_is_a_front_page_with_both_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    commands = _block(text, "ci:commands", "sh").splitlines()
    assert commands == ["pip install . && qtool calibrate sample_models/digits_cnn.onnx --images calib_images --trt-table digits_cnn.cache",
                        "pip install '.[test]' && ruff check && python -m pytest -q"]
    for page in re.findall(r"\]\((docs/[^)#]+)", text):  # links into the manual resolve (mkdocs checks the manual's own)
        assert (ROOT / page).exists(), page


def _layout(block: str) -> set[str]:
    """Paths named by an indented tree: two spaces per level, a name (a package ends with /), a description."""
    paths, stack = set(), []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0, f"odd indentation: {line!r}"
        name = line.split()[0]
        stack = stack[:indent // 2] + [name]
        assert len(stack) == indent // 2 + 1, f"a line deeper than its parent: {line!r}"
        assert all(s.endswith("/") for s in stack[:-1]), f"a child of a module: {line!r}"
        paths.add("".join(stack).rstrip("/"))
    return paths


def _tree() -> set[str]:
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "qtool").rglob("*.py") if "__pycache__" not in p.parts}
    packages = {str(Path(m).parent) for m in modules if m.endswith("__init__.py")}
    return modules | packages


def test_the_architecture_page_names_every_module_and_package_of_qtool():
    named = _layout(_block((DOCS / "architecture.md").read_text(encoding="utf-8"), "layout: qtool/"))
    tree = _tree()
    assert len(tree) > 40
    assert sorted(named - tree) == [], "named in docs/architecture.md's layout but not in qtool/"
    assert sorted(tree - named) == [], "in qtool/ but not in docs/architecture.md's layout"


def test_the_layout_parser_reads_nesting():
    assert _layout("qtool/\n  a.py   x\n  b/     y\n    c.py  z\n  d.py\n") == {"qtool", "qtool/a.py", "qtool/b", "qtool/b/c.py", "qtool/d.py"}


def test_the_readme_layout_names_every_folder_of_the_repository():
    block = _block(README.read_text(encoding="utf-8"), "layout: repository")
    named = {line.split()[0].rstrip("/") for line in block.splitlines() if line.strip()}
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_")) and p.name not in ("site", "build")
               and not p.name.endswith(".egg-info") and any(p.iterdir())}
    assert named == folders


def _flags() -> dict[str, set[str]]:
    """Per command, the long flags `qtool COMMAND --help` lists (the option column, not the descriptions)."""
    script = ("import sys\nfrom qtool.cli import main\n"
              f"for command in {COMMANDS!r}:\n"
              "    print('=== ' + command, flush=True)\n"
              "    try:\n        main([command, '--help'])\n    except SystemExit:\n        pass\n")
    r = _run("-c", script)
    assert r.returncode == 0, r.stderr
    flags: dict[str, set[str]] = {}
    for line in r.stdout.splitlines():
        if line.startswith("=== "):
            command = flags.setdefault(line[4:], set())
        elif column := re.match(r"\s{2}(-\S.*?)(?:\s{2,}|$)", line):
            command |= set(re.findall(r"--[a-z][a-z0-9-]*", column.group(1)))
    return {c: f - GLOBAL_FLAGS for c, f in flags.items()}


def test_the_command_line_reference_names_every_option_of_every_command():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    missing, helps = {}, _flags()
    assert sorted(helps) == sorted(COMMANDS)
    for command in COMMANDS:
        section = re.search(rf"^## qtool {command} \{{#{command}\}}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
        assert section, f"docs/cli.md has no section for qtool {command}"
        flags = helps[command]
        assert flags, command
        gone = sorted(f for f in flags if not re.search(rf"`[^`]*{re.escape(f)}(?![a-z0-9-])", section.group(1)))
        if gone:
            missing[command] = gone
    assert missing == {}


def test_the_readme_tour_runs(tmp_path):
    """The 5-minute tour's commands, in order, in a folder holding sample_models/ and calib_images/."""
    text = README.read_text(encoding="utf-8")
    tour = re.search(r"^## A 5-minute tour\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    script = "".join(re.findall(r"```sh\n(.*?)```", tour, re.S))
    assert script.count("qtool export --target") >= 4 and "qtool evaluate" in script and "qtool report" in script
    for folder in ("sample_models", "calib_images"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    bin_dir = Path(sys.executable).parent  # the qtool console script beside this Python
    env = {**os.environ, "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("digits_cnn.trt.onnx", "digits_cnn.cache", "digits_cnn.openvino.onnx", "digits_cnn.qdq.onnx", "report.html"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_the_policy_examples_in_json_and_toml_say_the_same(tmp_path):
    from qtool.quantizers.policy import load_rules

    text = (DOCS / "policies.md").read_text(encoding="utf-8")
    json_rules = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    toml_rules = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    (tmp_path / "p.json").write_text(json_rules)
    (tmp_path / "p.toml").write_text(toml_rules)
    rules = [[(r.match, r.pattern, r.changes, r.kinds) for r in load_rules(tmp_path / name)] for name in ("p.json", "p.toml")]
    assert rules[0] == rules[1] and len(rules[0]) == 4


def test_the_manuals_python_example_runs(tmp_path, monkeypatch, capsys):
    block = _block((DOCS / "python-api.md").read_text(encoding="utf-8"), "test:python-api-full", "python")
    for folder in ("sample_models", "calib_images"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(block, "docs/python-api.md", "exec"), namespace)
    assert (tmp_path / "digits.calib.json").exists() and (tmp_path / "digits.openvino.onnx").exists()
    assert capsys.readouterr().out.startswith("logits SQNR ")
    assert [t.name for t in namespace["both"].tensors] == [t.name for t in namespace["cal"].tensors]


def test_no_test_skips_what_ci_installs():
    """A test needing a module or a program CI installs asks tests/required.py (a skip here, a failure
    under CI), never pytest.importorskip or a skipif of its own."""
    tests = Path(__file__).resolve().parent
    banned = ("importor" + "skip(", "find_browser() is " + "None")  # split: this file is read too
    found = {p.name: [b for b in banned if b in p.read_text(encoding="utf-8")] for p in sorted(tests.glob("*.py"))}
    assert {name: hits for name, hits in found.items() if hits} == {}
