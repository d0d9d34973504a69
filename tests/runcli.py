"""Run the qtool CLI in-process, as the tests do (arguments may be paths or numbers)."""

from click.testing import CliRunner

from qtool.cli import cli


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])
