"""What each command does, over files: one module per command (calibrate, export, evaluate,
inspect, report, merge, recompute), each with a `run` taking the command's options as built by
qtool.options and returning an Outcome: the data the command produced (what --json prints, and
what the command line words as text, qtool.cli) and a failed check. Messages name options by key
(qtool.errors): Python words them as keywords, the command line as its flags. This module holds
what they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import QtoolError


@dataclass
class Outcome:
    """What a command over files did: `summary`, the dict its --json prints; `details`, what its text
    says beyond it (qtool.cli words the text from both); `failure`, a check that failed (the command
    line reports it after the output, exit 1)."""

    summary: dict
    failure: QtoolError | None = None
    details: dict = field(default_factory=dict)


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
