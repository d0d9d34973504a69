"""Helper processes for large calibrations.

One Python process runs the per-tensor work of its worker threads one at a time (the GIL):
PP-OCRv5 rec, 400 images on 2 cores, took 12.1 s as one process of two worker threads and 9.9 s
as two processes of one worker each; the YOLOv8n look-alike 7.6 s against 6.5 s. So a large
calibration takes its inputs in this process and in helpers: each helper is `python -m
qtool.collection.procs`, builds its own onnxruntime session for the same model, asks this process for the
next input whenever it is ready for one, and at the end hands back what its accumulator gathered
(collect.Partial), which adds in exactly: the result does not depend on which process saw which
input.

Protocol (pickles over the helper's stdin and stdout): this process sends the Job; the helper
sends ("next", samples done since its last message) and gets an input index, or None when there
are no more; at the end it sends ("done", Partial, skipped inputs, samples done since its last
message) or ("error", one-line message).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import Opt, QtoolError
from ..feeds.data import ImageRuns


@dataclass
class Job:
    """What a helper needs to take runs as this process does."""

    model: bytes  # the model with the fetched tensors as outputs (model.with_outputs), serialized
    external_folder: str | None  # where its external weights are (qtool.runtime.onnxruntime.session)
    fetched: list[str]
    keep: frozenset[str]  # fetched in NCHW (qtool.runtime.nchwc.fetching_session)
    names: list[str]  # the tensors to histogram, none of them fetched once per probe (collect's `static`)
    bins: int
    stats: dict | None  # {tensor: stats.SampleStats} to gather, as collect takes them
    derived: dict
    images: ImageRuns
    skip: bool  # unreadable inputs are left out and reported, instead of stopping the run


class Claims:
    """Input indices 0..count-1, each handed out once, in order, to whoever asks first."""

    def __init__(self, count: int):
        self.next, self.count = 0, count
        self.taken: dict[object, int] = {}  # {who: how many it took}
        self.lock = threading.Lock()

    def take(self, who: object = None) -> int | None:
        with self.lock:
            if self.next >= self.count:
                return None
            self.next += 1
            self.taken[who] = self.taken.get(who, 0) + 1
            return self.next - 1

    def stop(self) -> None:
        """Hand out nothing more."""
        with self.lock:
            self.next = self.count


def claimed_runs(images: ImageRuns, take: Callable[[], int | None], skipped: list | None) -> Iterator[tuple[dict, int]]:
    """Runs of the images `take()` hands out until it gives None; unreadable ones as
    data.batches treats them (an error, or (path, reason) appended to `skipped`)."""
    while (i := take()) is not None:
        yield from images.run(i, skipped)


class Locked:
    """A progress bar several threads update."""

    def __init__(self, progress):
        self.progress, self.lock = progress, threading.Lock()

    def update(self, n: int) -> None:
        with self.lock:
            self.progress.update(n)


class Helper:
    """A helper process, from this side: it starts at once and takes inputs from `claims` while
    this process takes its own; finish() waits for what it gathered, close() ends it."""

    COMMAND = [sys.executable, "-m", "qtool.collection.procs"]

    def __init__(self, job: Job, claims: Claims, progress=None):
        self.claims, self.progress = claims, progress
        self.part: object = None
        self.closing = False  # close() ends it: that is no failure
        self.skipped: list = []
        self.error: BaseException | None = None
        self.log = tempfile.TemporaryFile()  # its stderr, for the message if it fails
        env = dict(os.environ)
        root = Path(__file__).resolve().parent.parent
        if root.name not in ("site-packages", "dist-packages"):  # a checkout or an editable install: this very qtool
            env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(self.COMMAND, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.thread = threading.Thread(target=self._serve, args=(job,), name="qtool-helper", daemon=True)
        self.thread.start()

    def _send(self, message) -> None:
        pickle.dump(message, self.proc.stdin, pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def _count(self, samples: int) -> None:
        if samples and self.progress is not None:
            self.progress.update(samples)

    def _serve(self, job: Job) -> None:
        try:
            self._send(job)
            while True:
                message = pickle.load(self.proc.stdout)
                if message[0] == "next":
                    self._count(message[1])
                    self._send(self.claims.take(self))
                elif message[0] == "done":
                    _, self.part, self.skipped, samples = message
                    self._count(samples)
                    return
                else:
                    self.error = QtoolError(message[1])
                    self.claims.stop()
                    return
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):  # it ended: a crash, or close()
            took = self._took()
            self.error = self._ended(took)
            if took:  # what it took is lost: the run cannot be complete
                self.claims.stop()

    def _ended(self, took: int) -> BaseException:
        """Why the helper ended early: killed by a signal (the OOM killer sends SIGKILL), with
        inputs it took, is the user's to act on; anything else is a bug."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None and code < 0 and took and not self.closing:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            likely = ", likely out of memory" if -code == signal.SIGKILL else ""
            return QtoolError("a calibration helper process was killed ({name}{likely}), nothing was written; free memory, calibrate in "
                              "parts ({shard}, then qtool merge), or run on one core (taskset -c 0 qtool ...) so "
                              "no helper process starts", name=name, likely=likely, shard=Opt("shard", metavar="K/N"))
        return RuntimeError(f"a calibration helper process ended unexpectedly: {self._last_words()}")

    def _took(self) -> int:
        with self.claims.lock:
            return self.claims.taken.get(self, 0)

    def _last_words(self) -> str:
        self.log.seek(0)
        lines = self.log.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else f"exit code {self.proc.poll()}"

    def finish(self):
        """What the helper gathered (a collect.Partial), once the inputs are all handed out, or
        None if it took none: it is then ended without waiting for it to start, and only an
        error of the inputs or the model it reported counts. Raises its error."""
        took = self._took()
        if not took:
            self.close()
        self.thread.join()
        if self.error is not None and (took or isinstance(self.error, QtoolError)):
            raise self.error
        return self.part if took else None

    def close(self) -> None:
        """End the helper (if still running) and everything this side holds of it."""
        self.closing = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.thread.join()  # it ends once the pipes are
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # a write it never read
                pass
        self.log.close()


class _Done:
    """Samples done since last asked (collect's `progress` in a helper)."""

    def __init__(self):
        self.samples = 0

    def update(self, n: int) -> None:
        self.samples += n

    def pop(self) -> int:
        n, self.samples = self.samples, 0
        return n


def main() -> None:
    """The helper process: take runs until none are left, then hand back what they gave."""
    from ..statistics import histogram

    histogram.WITHOUT_BLAS_PROBE = True
    histogram.start_loading()  # first: it takes longer than the rest of the start
    # the rest (onnx, onnxruntime) imports while the kernel loads
    import onnx

    from ..runtime import nchwc, onnxruntime
    from . import collect

    onnxruntime.quiet()

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent ends it
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever a library prints goes to the log, not into the pickles
    inp = sys.stdin.buffer
    job: Job = pickle.load(inp)
    done = _Done()

    def take() -> int | None:
        pickle.dump(("next", done.pop()), out, pickle.HIGHEST_PROTOCOL)
        out.flush()
        return pickle.load(inp)

    skipped = [] if job.skip else None
    try:
        session, blocked = nchwc.fetching_session(onnx.load_from_string(job.model), job.fetched, job.keep,
                                                  external_folder=job.external_folder, threads=1)
        plan = collect.Plan(job.names, job.bins, derived=job.derived, blocked=blocked)
        acc = collect.accumulate(session, plan, claimed_runs(job.images, take, skipped), done, job.stats)
        message = ("done", collect.Partial(acc.hists, acc.stats, acc.seen), skipped or [], done.pop())
    except QtoolError as e:
        message = ("error", str(e))
    pickle.dump(message, out, pickle.HIGHEST_PROTOCOL)
    out.flush()


if __name__ == "__main__":
    main()
