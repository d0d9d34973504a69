"""Run the qtool CLI in-process, as the tests do (arguments may be paths or numbers)."""

from pathlib import Path

from click.testing import CliRunner

from qtool.cli import cli

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def ok(result):
    """`result` of a command that must succeed: exit 0 and no stray exception (the output shown otherwise)."""
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result
