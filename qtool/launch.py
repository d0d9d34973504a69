"""The `qtool` console script and `python -m qtool`: Ctrl-C while the command line's modules are
still importing, or before its handlers are in place, exits 130 quietly, as it does later
(qtool.cli.main)."""

import sys


def main() -> None:
    try:
        from .cli import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
