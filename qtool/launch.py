"""The `qtool` console script and `python -m qtool`: Ctrl-C while the command line's modules are
still importing, or before its handlers are in place, exits 130 quietly, as it does later
(qtool.cli.main)."""

import os
import signal
import sys
import threading

_RETRY_S = 0.05


def _on_ctrl_c(signum, frame) -> None:
    """KeyboardInterrupt, except inside an import: a C extension whose initialisation is interrupted
    fails as "initialization failed" or aborts the process (onnxruntime, nanobind modules), so the
    signal is delivered again once the import is over."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            timer = threading.Timer(_RETRY_S, os.kill, (os.getpid(), signal.SIGINT))
            timer.daemon = True
            timer.start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGINT, _on_ctrl_c)
    try:
        from .cli import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
