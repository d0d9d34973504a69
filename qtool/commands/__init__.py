"""What each command does, over files: one module per command (calibrate, export, evaluate,
inspect, report, merge, recompute), each with a `run` taking the command's options as built by
qtool.options and returning its result (qtool.results: data, with a failed check; the command
line prints it as JSON or words it as text, qtool.cli). Messages name options by key
(qtool.errors): Python words them as keywords, the command line as its flags. This module holds
what they share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


class _Progress:
    """What the pipeline calls on a tqdm bar (update, total, refresh) over a plain callback(n)."""

    def __init__(self, callback: Callable[[int], None]):
        self.callback = callback
        self.total = None

    def update(self, n: int = 1) -> None:
        self.callback(n)

    def refresh(self) -> None:
        pass


def progress_bar(progress):
    """A tqdm bar as it is (the pipeline also sets its total), a plain callback(n) wrapped."""
    if progress is None or hasattr(progress, "update"):
        return progress
    return _Progress(progress)


def done(progress) -> None:
    """A tqdm bar closed once the inputs are done, before any warning is logged under it."""
    if hasattr(progress, "close"):
        progress.close()


def path(value) -> Path | None:
    return None if value is None else Path(value)
