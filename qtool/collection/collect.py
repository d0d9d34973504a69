"""Run the model batch by batch and stream every exposed tensor into its histogram.

Calibration parallelises across batches, not inside one: each of `workers` threads takes the
next batch (decoding it), runs it through onnxruntime on one intra-op thread and histograms
the outputs into the one accumulator all workers share, each tensor's histogram and statistics
under that tensor's lock. Single-threaded runs side by side use the cores better than one run on
all of them (onnxruntime's parallel sections leave cores idle between operators), and the
histogram work of one worker overlaps the inference of the others. Histograms and statistics
are exact integer sums (histogram.TensorHistogram, stats.SampleStats), so the result does not
depend on which worker saw which batch nor in which order they added it. Each worker holds one
batch's activations at a time: memory does not grow with the number of inputs, nor with the
workers beyond their runs (one accumulator per worker held its own histograms: OSKut's 1071
tensors, 17 MB a worker).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
import onnx

from .. import blas, model
from ..runtime import nchwc, onnxruntime
from ..statistics import histogram
from ..statistics.histogram import Extrema, TensorHistogram
from ..statistics.stats import real_tokens
from . import segments

Feeds = dict[str, np.ndarray]

GIL_SWITCH_SECONDS = 0.0005  # while workers run (Python's default is 0.005)


class _Ahead:
    """An iterator over `items` that prepares the next item in a background thread when told
    to (start), so that it is ready when asked for. A lone worker starts it once its run is
    done: decoding while onnxruntime runs on every core slows that run by more than the decode
    takes (PP-OCRv5 det: 129 -> 144 ms per run), while the histograms beside it lose only its
    time. Exceptions raised while preparing surface at the same position."""

    _done = object()

    def __init__(self, items: Iterable):
        self.items = iter(items)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="qtool-prefetch")
        self.pending = None

    def start(self) -> None:
        if self.pending is None:
            self.pending = self.pool.submit(next, self.items, self._done)

    def __iter__(self):
        return self

    def __next__(self):
        pending, self.pending = self.pending, None
        item = pending.result() if pending is not None else next(self.items, self._done)
        if item is self._done:
            raise StopIteration
        return item

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def prefetch(items: Iterable) -> Iterator:
    """Yield from `items`, preparing the next item in a background thread while the caller
    uses this one (image decoding overlaps inference). Exceptions raised while preparing
    surface at the same position."""
    ahead = _Ahead(items)
    try:
        ahead.start()
        for item in ahead:
            ahead.start()
            yield item
    finally:
        ahead.close()


@dataclass(frozen=True)
class Constant:
    """The constant operand of an Add/Sub/Mul that collect computes."""

    slot: int  # 0: first operand, 1: second
    name: str
    value: np.ndarray = field(compare=False)


@dataclass(frozen=True)
class Derived:
    """How collect gets a tensor without fetching it from onnxruntime."""

    op: str  # "concat": its parts put together (histograms add); "Add", "Sub", "Mul": of its parts
    parts: tuple[str, ...]  # the tensors it is computed from: two, or one and `constant`
    constant: Constant | None = None


_UFUNCS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def derivations(proto: onnx.ModelProto, names: list[str], types: dict[str, int], static: frozenset[str] = frozenset(),
                stats: dict | None = None) -> dict[str, Derived]:
    """The `derived` argument of collect: tensors of `names` that need not be fetched.

    Concatenations (model.concatenations): left out when they touch a static tensor, when a
    part is itself a concatenation, or when their per-channel statistics run along another axis.
    Add/Sub/Mul outputs of two tensors of `names` (model.arithmetic) or of one and a constant
    (model.constant_arithmetic): left out when they touch a static tensor or an input is a
    concatenation left out of the fetch. Computed, not fetched, whatever their size: onnxruntime
    then writes less, and the output lives only while it is binned, not for the whole run's
    histograms (PP-OCRv5 det at 640, 60 images on a 2-core AMD EPYC: 5.9-6.2 s and 678 MB of
    peak RSS computing all, 6.4-6.6 s and 810 MB fetching those over 2 MB; a 2-core Intel
    Sapphire Rapids measured computing those 4 % slower). In graph order, every derivation
    reads fetched tensors and Add/Sub/Mul outputs computed before it."""
    cat = {out: tuple(parts) for out, (axis, parts) in model.concatenations(proto, names).items()
           if not {out, *parts} & static and (stats is None or out not in stats or stats[out].axis in (None, axis))}
    ops = {out: Derived(op, (a, b)) for out, (op, a, b) in model.arithmetic(proto, names, types).items()}
    ops.update({out: Derived(op, (x,), Constant(slot, c, value))
                for out, (op, x, slot, c, value) in model.constant_arithmetic(proto, names, types).items()})
    ops = {out: d for out, d in ops.items() if out not in cat and not {out, *d.parts} & static
           and not set(d.parts) & cat.keys()}
    cat = {out: parts for out, parts in cat.items() if not set(parts) & cat.keys()}
    return {n: Derived("concat", cat[n]) if n in cat else ops[n] for n in names if n in cat or n in ops}


def carried_derivations(derived: dict[str, Derived], carried: frozenset[str] | set[str], blocked) -> tuple[dict[str, Derived], frozenset[str]]:
    """(`derived` without the Add/Sub/Mul outputs a run in segments returns anyway, the ones taken out): a segment
    returns what later segments read (segments.Segmented.carried), and collect histograms such a tensor as it comes
    instead of computing it again beside it (the same float32 operation, one rounding, on the same inputs: the same
    values). Kept and computed, those copies stood beside the segments' own until their derived readers' other inputs
    came, segments later: kokoro_ja_int8's resblock sums and AdaIN outputs, 14.2 MB each on a 61-token input. Not one
    computed from a tensor in blocked layout (`blocked`), which is computed in that layout (its per-channel
    statistics sum in its order) where a segment returns it in NCHW."""
    from_blocked = set(blocked)
    for name, d in derived.items():  # graph order: parts before what is computed of them
        if from_blocked & set(d.parts):
            from_blocked.add(name)
    taken = frozenset(n for n, d in derived.items() if d.op != "concat" and n in carried and n not in from_blocked)
    return {n: d for n, d in derived.items() if n not in taken}, taken


def _serial(items: deque, fn) -> None:
    while items:
        fn(*items.popleft())


class _Team:
    """This thread and `size` - 1 others, for one worker's run outputs: each takes the next
    tensor when done with its last (every tensor has its own histogram and statistics)."""

    def __init__(self, size: int):
        self.size = size
        self.pool = ThreadPoolExecutor(size - 1, thread_name_prefix="qtool-fill") if size > 1 else None

    def share(self, items: deque, fn) -> None:
        """fn(*item) for every item, in `items` order, each taken off `items` as it starts (the
        item's values are let go as soon as it is done); the first error is raised once all stopped."""
        if self.pool is None or len(items) < 2:
            return _serial(items, fn)
        failed = threading.Event()

        def drain() -> None:
            while not failed.is_set():
                try:
                    item = items.popleft()  # atomic: no item is taken twice
                except IndexError:
                    return
                try:
                    fn(*item)
                except BaseException:
                    failed.set()
                    raise
                del item

        futures = [self.pool.submit(drain) for _ in range(self.size - 1)]
        try:
            drain()
        finally:
            done, _ = wait(futures)
        for f in done:
            f.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class _Accumulator:
    """The histograms and per-sample statistics the workers add their runs to (`locks`: one per
    tensor where several workers share it); accumulators (another process's) add exactly.

    Derived tensors are not run: an Add/Sub/Mul output is computed from its inputs (and
    constant) batch by batch and then treated as if fetched; a concatenation's statistics come
    from its parts batch by batch and its histogram from theirs at the end. Tensors in `blocks`
    arrive in onnxruntime's blocked layout (nchwc): histograms do not mind, statistics read the
    layout, and an operation on two such tensors (or on one and a scalar) is computed in it."""

    def __init__(self, names: list[str], bins: int, stats: dict | None, derived: dict[str, Derived], blocks: dict[str, int]):
        self.hists = {n: TensorHistogram(bins=bins) for n in names if n not in derived or derived[n].op != "concat"}
        self.stats = {n: s.fresh() for n, s in stats.items()} if stats else {}
        # Add/Sub/Mul outputs, and the statistics of concatenations, as soon as the last of their
        # inputs is histogrammed (from the CPU caches, on the thread that did it)
        self.computed = {n: _UFUNCS[d.op] for n, d in derived.items() if d.op != "concat"}
        self.concats = {n for n, d in derived.items() if d.op == "concat" and n in self.stats}
        self.inputs = {n: tuple(dict.fromkeys(d.parts)) for n, d in derived.items() if n in self.computed or n in self.concats}
        self.readers: dict[str, list[str]] = {}  # {input: [outputs]}
        for n, parts in self.inputs.items():
            for part in parts:
                self.readers.setdefault(part, []).append(n)
        self.parts = {n: d.parts for n, d in derived.items()}
        self.constants = {n: d.constant for n, d in derived.items() if d.constant is not None}
        # computed tensors whose every reader is computed from them alone, on the same thread
        # right after them: they go into scratch memory of that thread, reused within a run
        # (written while in the CPU caches, instead of into fresh pages; _Filling.free_buffers)
        concat_parts = {p for n in self.concats for p in self.inputs[n]}
        self.scratch = {n for n in self.computed if n not in concat_parts
                        and all(r in self.constants for r in self.readers.get(n, ()))}
        self.locks: dict[str, threading.Lock] = {}  # {tensor: its lock}, where workers share this accumulator (share())
        self.blocks = blocks
        self.rows: dict[tuple[str, int], np.ndarray] = {}
        self.seen = 0

    def share(self) -> None:
        """Let several worker threads fill this accumulator at once: each tensor's histogram and
        statistics are then updated under that tensor's own lock, and `seen` under one."""
        self.locks = {n: threading.Lock() for n in {*self.hists, *self.stats}}
        self.seen_lock = threading.Lock()

    def count(self, samples: int) -> None:
        """Add a run's samples to `seen`."""
        lock = getattr(self, "seen_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            self.seen += samples

    def fill(self, pairs, samples: int, team: _Team | None = None, tokens: np.ndarray | None = None) -> None:
        """Histogram (and gather the statistics of) one run's outputs, `pairs` of (name, value),
        on the threads of `team`; `tokens`: the run's real tokens (stats.real_tokens), which the
        channel means are taken over. A list of pairs is emptied."""
        self.fill_parts([pairs], samples, team, tokens)

    def fill_parts(self, parts: Iterable, samples: int, team: _Team | None = None, tokens: np.ndarray | None = None) -> None:
        """fill, for a run whose outputs come in parts (segments.Segmented: one per segment),
        each dropped here once histogrammed (what derived tensors still need is kept until
        they are computed)."""
        filling = _Filling(self, samples, tokens)
        share = team.share if team is not None else _serial
        for pairs in parts:
            todo = deque((name, value, self._block(name, value)) for name, value in pairs)
            # each tensor is let go once histogrammed (and read by the derived tensors that need
            # it), not when the whole run is: the other worker's run takes its place meanwhile
            # (a list given is emptied: its caller keeps no reference to what it held)
            if isinstance(pairs, list):
                pairs.clear()
            del pairs
            share(todo, filling.add)
            filling.pools = threading.local()  # the part's scratch buffers let go before the next part is run
        # a concatenation with an empty part (which adds nothing) waits for it in vain
        share(deque((n, self.parts[n]) for n in self.concats if 0 < filling.waiting[n] < len(self.inputs[n])), filling.gather)

    def _block(self, name: str, value: np.ndarray) -> int | None:
        block = self.blocks.get(name)
        if block and not nchwc.blocked_shape(value, block):
            raise AssertionError(f"{name} came from onnxruntime with shape {value.shape}, not in blocks of {block} channels")
        return block

    def derive(self, name: str, inputs: list[tuple], buffer: np.ndarray | None = None) -> tuple[np.ndarray, int | None]:
        """An Add/Sub/Mul output from its kept inputs: (value, its channel block or None),
        written into `buffer` (bytes, grown when too small) when one is given."""
        ufunc, constant = self.computed[name], self.constants.get(name)
        if constant is not None:
            (x, _, _, bx), c = inputs[0], constant.value
            if bx and c.size == 1 and c.ndim <= x.ndim:  # a scalar: the same on the blocks
                c, block = c.reshape(()), bx
            elif bx and _per_channel(c, x.shape):  # one per channel (a bias): laid out as x's blocks
                operands = (self._row(name, c, x.shape[3], bx), nchwc.view5(x, bx))
                z = _apply(ufunc, operands if constant.slot == 0 else operands[::-1], buffer)
                return z.reshape(z.shape[0], -1, *z.shape[2:4]), bx
            else:
                x, block = (nchwc.unblocked(x, bx) if bx else x), None
            return _apply(ufunc, (c, x) if constant.slot == 0 else (x, c), buffer), block
        (x, _, _, bx), (y, _, _, by) = inputs
        if bx and bx == by:  # elementwise on the blocks: the blocked form of the result
            z = _apply(ufunc, (nchwc.view5(x, bx), nchwc.view5(y, by)), buffer)
            return z.reshape(z.shape[0], -1, *z.shape[2:4]), bx
        x = nchwc.unblocked(x, bx) if bx else x
        y = nchwc.unblocked(y, by) if by else y
        return _apply(ufunc, (x, y), buffer), None

    def _row(self, name: str, c: np.ndarray, width: int, block: int) -> np.ndarray:
        """A per-channel constant as a row of blocks of x's width, [1, C/B, 1, W, B]: numpy adds
        it along whole rows (0.2 ns/value here) instead of a block at a time (0.3)."""
        key = name, width
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = np.ascontiguousarray(np.broadcast_to(c.reshape(1, -1, 1, 1, block), (1, c.size // block, 1, width, block)))
        return row

    def merge(self, other: _Accumulator) -> None:
        for name, hist in other.hists.items():
            self.hists[name].merge(hist)
        for name, stats in other.stats.items():
            self.stats[name] = self.stats[name].merge(stats)
        self.seen += other.seen


class _Filling:
    """One run's outputs going into an accumulator `acc` (_Accumulator.fill), on any number of
    threads: each tensor histogrammed, then the derived tensors it was the last missing input
    of computed (or, for concatenations, their statistics gathered) on the same thread."""

    def __init__(self, acc: _Accumulator, samples: int, tokens: np.ndarray | None = None):
        self.acc, self.samples, self.tokens = acc, samples, tokens
        self.kept: dict[str, tuple] = {}  # {input of a derived tensor: (value, rows, extrema, block)}
        self.waiting = {n: len(parts) for n, parts in acc.inputs.items()}  # inputs not yet kept
        self.unread = {n: len(readers) for n, readers in acc.readers.items()}  # derived tensors yet to read each
        self.lock = threading.Lock()
        self.pools = threading.local()

    def free_buffers(self) -> list[np.ndarray]:
        """This thread's free scratch buffers for the part of the run being filled (fill_parts lets them go after
        each part: a run in segments then holds none while its next segment runs). Kept from run to run, each
        thread's pool held buffers of the longest input its runs had met beside the next runs' tensors, and a run in
        segments held them beside every segment's (kokoro_ja_int8 on a 61-token input: 3 buffers of 14.2 MB, its
        audio-rate tensors, through every segment, and more run after run)."""
        pool = getattr(self.pools, "free", None)
        if pool is None:
            pool = self.pools.free = []
        return pool

    def one(self, name: str, value: np.ndarray, block: int | None) -> list[str]:
        """Histogram one tensor; the derived tensors (to compute, or concatenations whose
        statistics to gather) it was the last missing input of."""
        acc, samples = self.acc, self.samples
        # one sample per entry of the first axis when it has the batch's size, else one in all
        rows = samples if samples > 1 and value.ndim >= 1 and value.shape[0] == samples else 1
        stats = acc.stats.get(name)
        lock = acc.locks.get(name)
        with lock if lock is not None else contextlib.nullcontext():
            extrema = acc.hists[name].update(value, rows, stats.segments(value, rows, block) if stats is not None else 1)
            if extrema is None:
                return []
            if stats is not None:
                stats.update([value], rows, extrema, [block], self.tokens)
        if name in acc.readers:
            self.kept[name] = value, rows, extrema, block
        ready = []
        for out in acc.readers.get(name, ()):
            with self.lock:
                self.waiting[out] -= 1
                if self.waiting[out] == 0:
                    ready.append(out)
        return ready

    def done(self, out: str) -> None:
        """The derived tensor `out` is computed (or its statistics gathered): inputs no other
        derived tensor reads are let go."""
        for p in self.acc.inputs[out]:
            with self.lock:
                self.unread[p] -= 1
                last = self.unread[p] == 0
            if last:
                self.kept.pop(p, None)

    def add(self, name: str, value: np.ndarray, block: int | None) -> None:
        """Histogram one fetched tensor, and the derived tensors ready after it."""
        acc, kept = self.acc, self.kept
        ready = self.one(name, value, block)
        free = self.free_buffers()
        held: dict[str, list] = {}  # scratch of this thread in use: {tensor: [buffer, readers to come]}
        while ready:
            out = ready.pop()
            if out in acc.concats:
                self.gather(out, acc.parts[out])
                self.done(out)
                continue
            parts = acc.parts[out]
            buffer = (free.pop() if free else _NO_BYTES) if out in acc.scratch else None
            value, block = acc.derive(out, [kept[p] for p in parts], buffer)
            self.done(out)
            for p in parts:  # a scratch input all of whose readers are done is free again
                if p in held:
                    held[p][1] -= 1
                    if held[p][1] == 0:
                        free.append(held.pop(p)[0])
            ready += self.one(out, value, block)
            if out in acc.scratch:  # value is a view of the bytes it was written into
                readers = len(acc.readers.get(out, ()))
                if readers:
                    held[out] = [value.base, readers]
                else:
                    free.append(value.base)

    def gather(self, name: str, parts: tuple[str, ...]) -> None:
        """A concatenation's statistics, from its parts kept in this run."""
        got = [self.kept[p] for p in parts if p in self.kept]
        if got:
            rows = got[0][1]
            if any(g[1] != rows for g in got):
                raise AssertionError(f"the parts of {name} split into different samples")
            extrema = Extrema([min(g[2].lo[r] for g in got) for r in range(rows)],
                              [max(g[2].hi[r] for g in got) for r in range(rows)],
                              [sum(g[2].nonfinite[r] for g in got) for r in range(rows)])
            lock = self.acc.locks.get(name)
            with lock if lock is not None else contextlib.nullcontext():
                self.acc.stats[name].update([g[0] for g in got], rows, extrema, [g[3] for g in got], self.tokens)


_NO_BYTES = np.empty(0, np.uint8)


def _per_channel(c: np.ndarray, shape: tuple[int, ...]) -> bool:
    """Whether the constant `c`, broadcast against an NCHW tensor of `shape`, holds one value
    per channel and makes nothing larger: [C, 1, 1] or [1, C, 1, 1]."""
    if c.ndim > 4 or len(shape) != 4:
        return False
    full = (1,) * (4 - c.ndim) + c.shape
    return full == (1, shape[1], 1, 1)


def _apply(ufunc, operands: tuple, buffer: np.ndarray | None) -> np.ndarray:
    """ufunc(*operands), into the bytes (uint8) of `buffer` when given, or of new ones when
    it is too small: then the result's base is the buffer."""
    if buffer is None:
        return ufunc(*operands)
    shape = np.broadcast_shapes(*(np.shape(o) for o in operands))
    dtype = np.result_type(*operands)
    size = math.prod(shape) * dtype.itemsize
    if buffer.size < size:
        buffer = np.empty(size, np.uint8)
    return ufunc(*operands, out=buffer[:size].view(dtype).reshape(shape))


@dataclass(frozen=True)
class Plan:
    """What collect gathers: a histogram of `bins` bins of every tensor in `names`, and how each
    is got from the session.

    Tensors in `static` do not depend on input values (only on the input shape: decode grids and
    the like, with fixed-size batched inputs). Their histogram comes from one run on the first
    `probe_size` samples, counted once per `probe_size` samples seen, so it does not depend on
    the batch size.
    `derived`: tensors not fetched from the session but computed from fetched ones (see
    `derivations`): the results are the same as fetching them.
    `blocked`: fetched tensors the session returns in blocked layout (see nchwc.fetching_session),
    with the same results."""

    names: list[str]
    bins: int
    static: frozenset[str] = frozenset()
    probe_size: int = 1
    derived: dict[str, Derived] = field(default_factory=dict)
    blocked: dict[str, nchwc.Blocked] = field(default_factory=dict)
    # derived tensors a run in segments returns anyway, fetched instead (carried_derivations): the first run's fetched
    # bytes, which the binning kernel's choice reads, leave them out as before
    taken: frozenset[str] = frozenset()

    def fetches(self) -> tuple[list[str], list[str]]:
        """(tensors fetched per run, tensors fetched once), after checking the plan."""
        varying = [n for n in self.names if n not in self.static and n not in self.derived]
        available = set(varying)
        for name, d in self.derived.items():  # in graph order: every input fetched or computed before
            if not set(d.parts) <= available:
                raise ValueError(f"{name} must be derived from fetched tensors or Add/Sub/Mul outputs computed before it")
            if d.op != "concat":
                available.add(name)
        if not set(self.blocked) <= set(varying):
            raise ValueError("only fetched tensors that depend on the input can come in blocked layout")
        return varying, [n for n in self.names if n in self.static]


@dataclass(frozen=True)
class Schedule:
    """How collect spreads its work over threads; the results are the same whatever it is.

    `workers` threads each take the next run, run the session (give it one intra-op thread per
    worker) and histogram the outputs into their own accumulators, merged at the end.
    `spread`: threads each worker histograms its outputs on (when fewer workers than cores fit
    in memory, the cores that ran onnxruntime's parallel sections share the histograms).
    `kernel`: bin with the compiled kernel (histogram.start_loading), which the first run's
    histograms wait for; worth its load time when the runs bin hundreds of MB. Or a function of
    the bytes of each tensor the first run fetched ({name: bytes}): whether to load it then (the
    runs' sizes, and what the process holds with them, known from then on; loading it costs ~90
    MB of memory while it loads, numba's compiler included, ~40 MB after: a small model's whole
    plain inference)."""

    workers: int = 1
    spread: int = 1
    kernel: bool | Callable[[int], bool] = True


def collect(session: onnxruntime.Session | segments.Segmented, plan: Plan, runs: Iterable[tuple[Feeds, int]], progress=None,
            stats: dict | None = None, schedule: Schedule = Schedule(), helpers: Iterable = ()
            ) -> tuple[dict[str, TensorHistogram], int]:
    """Histograms of every tensor of `plan` over all runs, and the number of samples seen.

    `runs` yields (feeds, samples); `progress.update(samples)` follows them.
    `stats`: {tensor: stats.SampleStats}, replaced by the collected statistics.
    `helpers`: other processes taking runs of the same inputs (procs.Helper): once this process's
    runs are done, what each gathered (its `finish()`) adds in exactly.
    """
    acc = accumulate(session, plan, runs, progress, stats, schedule)
    for helper in helpers:
        part = helper.finish()
        if part is not None:
            acc.merge(part)
    return _assemble(acc, plan, stats)


@dataclass
class Partial:
    """What an accumulator gathered, as another process hands it over (see `accumulate`)."""

    hists: dict[str, TensorHistogram]
    stats: dict
    seen: int


@blas.one_thread()  # numpy's products (the Grams) run beside the session's threads and the other workers'
def accumulate(session: onnxruntime.Session | segments.Segmented, plan: Plan, runs: Iterable[tuple[Feeds, int]], progress=None,
               stats: dict | None = None, schedule: Schedule = Schedule()) -> _Accumulator:
    """collect's histograms and statistics before they are put together: Concat outputs still
    as their parts, tensors fetched once counted once (the arguments are collect's)."""
    varying, fixed = plan.fetches()
    sources = [plan.blocked[n].source if n in plan.blocked else n for n in varying]
    blocks = {n: b.block for n, b in plan.blocked.items()}
    # one accumulator, shared by the workers (one per worker held its histograms and statistics once more each)
    acc = _Accumulator(plan.names, plan.bins, stats, plan.derived, blocks)
    teams = [_Team(max(1, schedule.spread)) for _ in range(max(1, schedule.workers))]
    if len(teams) > 1:
        acc.share()
    # one worker with threads to spare (a run too large for two in memory): the next inputs are
    # decoded while this run is histogrammed, instead of after
    ahead = _Ahead(runs) if len(teams) == 1 and schedule.spread > 1 else None
    source = ahead if ahead is not None else iter(runs)
    lock = threading.Lock()  # guards `source` (decoding happens in next()) and `progress`

    segmented = isinstance(session, segments.Segmented)
    first_run = [True]  # the first run is taken alone, before the workers start
    wanted = set(varying)
    fetched: dict[str, int] = {}  # bytes of each tensor the first run fetched (a deferred kernel decision)

    def parts_of(feeds: Feeds):
        for part in session.runs(feeds, wanted):
            if first_run[0]:
                fetched.update((name, value.nbytes) for name, value in part if name not in plan.taken)
            part.reverse()  # the list itself, which fill_parts empties (the segments hold no other reference)
            yield part

    def take(team: _Team, feeds: Feeds, count: int) -> None:
        if segmented:  # each segment's outputs histogrammed and dropped before the next segment runs
            if ahead is not None:
                ahead.start()
            histogram.wait_for_kernel()
            acc.fill_parts(parts_of(feeds), count, team, real_tokens(feeds))
            # what the run freed goes back to the system before the next: its segments' blocks under
            # MMAP_BYTES, freed in the heaps of the threads that ran them, stayed there in pieces too
            # small for the next run's (trueocr_det, 16 pages: 344 -> 272 MB of peak RSS, the same CPU time)
            onnxruntime.trim()
            acc.count(count)
            if progress is not None:
                with lock:
                    progress.update(count)
            return
        # binning with numpy while the kernel loads slows both (YOLOv8n look-alike, 100 images:
        # 2.75-3.23 s against 2.70-2.87 waiting), and a run's activations beside the compiler's
        # pages while it loads (before histogram lets them go) would add to the peak; a no-op
        # when nothing loads it
        histogram.wait_for_kernel()
        outputs = onnxruntime.run(session, sources, feeds) if varying else []
        if first_run[0]:
            fetched.update((name, value.nbytes) for name, value in zip(varying, outputs))
        if ahead is not None:
            ahead.start()
        pairs = list(zip(varying, outputs))
        del outputs  # fill lets each go once histogrammed
        pairs.reverse()  # last computed first: those are still in the CPU caches (names are in graph order)
        acc.fill(pairs, count, team, real_tokens(feeds))
        acc.count(count)
        if progress is not None:
            with lock:
                progress.update(count)

    if schedule.kernel is True:
        histogram.start_loading()
    # what sizing the runs and making the sessions freed (a probe's or a shape computation's session, the
    # optimized copy of the blocked layout) goes back to the system before the runs make their own
    # (ppocrv5_textline_ori: 77 MB of heap held through its runs)
    onnxruntime.trim()
    try:
        first = next(source, None)
        if first is not None:
            if fixed:
                probe = {k: v[:plan.probe_size] for k, v in first[0].items()}
                acc.fill(zip(fixed, onnxruntime.run(session, fixed, probe)), plan.probe_size)
            # the first batch alone, while the binning kernel loads: it is then ready before the
            # workers start (their runs beside the load stall on the GIL it holds)
            take(teams[0], *first)
            first_run[0] = False
            if callable(schedule.kernel) and schedule.kernel(fetched):
                # loaded before the workers start: its load (numba's compiler) does not come on
                # top of their runs' activations
                histogram.start_loading()
                histogram.wait_for_kernel()
        _run_workers(teams, source, lock, take)
    finally:
        for team in teams:
            team.close()
        if ahead is not None:
            ahead.close()
    return acc


def _run_workers(teams: list, source, lock: threading.Lock, take) -> None:
    """One thread per worker (its team) takes the next run until `source` is empty; the first error
    stops the others after their current run and is raised."""
    stop = threading.Event()

    def work(team: _Team) -> None:
        while not stop.is_set():
            with lock:
                item = next(source, None)
            if item is None:
                return
            take(team, *item)

    switch = sys.getswitchinterval()
    # workers hand the GIL back and forth between their numpy/kernel calls: short turns keep
    # one from waiting for another's whole Python slice
    sys.setswitchinterval(min(switch, GIL_SWITCH_SECONDS))
    try:
        with ThreadPoolExecutor(len(teams), thread_name_prefix="qtool-collect") as pool:
            futures = [pool.submit(work, team) for team in teams]
            try:
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                for f in done:
                    f.result()
            finally:  # an error or an interrupt: the other workers stop after their current run
                stop.set()
    finally:
        sys.setswitchinterval(switch)


def _assemble(acc: _Accumulator, plan: Plan, stats: dict | None) -> tuple[dict[str, TensorHistogram], int]:
    """The histograms per tensor (Concat outputs summed from their parts, tensors fetched once
    counted per probe), the statistics written into `stats`, and the samples seen."""
    seen = acc.seen
    hists = {}
    for name in plan.names:
        d = plan.derived.get(name)
        if d is not None and d.op == "concat":
            hists[name] = TensorHistogram(bins=plan.bins)
            for part in d.parts:
                hists[name].merge(acc.hists[part])
        else:
            hists[name] = acc.hists[name]
    if stats is not None:
        for st in acc.stats.values():  # no pending sums in what the calibration holds (readers of channel_sums read them)
            st.flush()
        stats.update(acc.stats)
    fixed = [n for n in plan.names if n in plan.static]
    if fixed:
        if seen % plan.probe_size:
            raise ValueError("the number of samples must be a multiple of probe_size")
        for name in fixed:
            hists[name].repeat(seen // plan.probe_size)
            if stats is not None and name in stats:
                stats[name].repeat(seen // plan.probe_size)
    return hists, seen
