"""The `qtool` console script and `python -m qtool`: Ctrl-C while the command line's modules are
still importing exits 130 quietly, as it does later (qtool.cli.main)."""

import sys


def main() -> None:
    try:
        from .cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()
