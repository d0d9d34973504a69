"""The calibration file: per-tensor statistics and thresholds, enough to recompute them later.

JSON, written atomically and deterministically (same inputs -> same bytes): no timestamps,
keys in a fixed order, tensors in graph order.

Optional per tensor (files from older versions lack them and still load): `per_sample`, the
statistics qtool.statistics.stats.SampleStats gathers: `count` samples, `min_sum` and
`absmax_sum` (per-sample min and max |x|), `top_absmax` (the largest two samples' max |x|: whether one sample
alone reaches far beyond the rest, qtool.statistics.thresholds.lone_peak; merged by taking the two largest), for the data inputs of Conv/MatMul/Gemm
`channel_axis` and `channel_sums` (per-sample per-channel means), for depthwise-conv inputs
and the inputs of MatMul/Gemm with constant weights `channel_absmax` (max |x|
per channel: for per-channel quantizers and SmoothQuant, qtool.quantizers.smoothquant; merged by max),
and for the inputs of Conv with 2-4 input channels (an image's first layer) `channel_pairs`, the
joint histograms of channels (0, 1) and (2, 3) (qtool.statistics.pairs: exact counts, merged by
adding; the overflow guard's estimate for that layer); the sums are exact integers counting
multiples of 2**per_sample_unit_log2 (a top-level field), so shards merge exactly. They feed --method mean-minmax and the exporters'
bias correction. Optional at the top: `method_pinned: true` when the user chose the method
(calibrate or recompute --method); exports then keep the file's thresholds, otherwise each
target picks its own default method from the histograms.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .errors import Opt, QtoolError, Words
from .fileio import write_atomic
from .statistics import thresholds
from .statistics.histogram import TensorHistogram
from .statistics.stats import UNIT_LOG2, SampleStats

FORMAT = "qtool.calibration"
VERSION = 1

# Limits on what a calibration file may hold (far above any real calibration): its size, how
# deeply its JSON nests, each tensor's total count (exact in float64, where shards are folded),
# and the magnitude of ranges (float32 activations stay below 2**128).
MAX_FILE_BYTES = 512 << 20
MAX_DEPTH = 32
MAX_COUNT = 2 ** 53
MAX_MAGNITUDE = 2.0 ** 129
MIN_RANGE = 2.0 ** -160  # smallest non-zero histogram range (float32's smallest value is 2**-149)
MAX_BINS = 65536  # bins per tensor (calibrate --bins; a file's `bins`)
MAX_SUM = 2 ** 240  # per-sample sums (integers counting 2**-40): stay finite as floats
_CHUNK = 1 << 20


def read_limited(path: str | os.PathLike, limit: int, what: str | Words | Opt) -> bytes:
    """The bytes of the user's file `path`, at most `limit` of them: a regular file is checked by
    size first, anything else (a pipe, a device) is read in chunks up to the limit, so that a
    signal still stops the read. QtoolError past the limit; OSError as open/read raise it."""
    p = Path(path)
    named = what if isinstance(what, (Words, Opt)) else Words("{what} {path!r}", {"what": what, "path": str(p)})
    too_big = QtoolError("{name} is larger than {mb} MB, the most qtool reads for it; is it the right file?", name=named, mb=limit >> 20)
    with open(p, "rb") as f:
        info = os.fstat(f.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(21, "Is a directory", str(p))
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise too_big
        data = bytearray()
        while True:
            chunk = f.read(min(_CHUNK, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
            if len(data) > limit:
                raise too_big
    return bytes(data)


def read_input(path: str | os.PathLike, limit: int, what: str | Opt, directory: str | None = None) -> bytes:
    """`read_limited`, with a one-line QtoolError naming the file as `what` (an Opt: the option that
    named it) when it is missing, a directory (`directory`: what to give instead) or unreadable."""
    name = replace(what, value=str(path), quoted=True) if isinstance(what, Opt) else Words("{what} {path!r}", {"what": what, "path": str(path)})
    try:
        return read_limited(path, limit, name)
    except FileNotFoundError:
        raise QtoolError("{name} does not exist", name=name) from None
    except IsADirectoryError:
        raise QtoolError("{name} is a directory" + ("; {directory}" if directory else ""), name=name, directory=directory) from None
    except OSError as e:
        raise QtoolError("{name} cannot be read ({why})", name=name, why=e.strerror or e) from None


def json_document(data: bytes, max_depth: int):
    """The JSON document `data` holds, or ValueError saying in a few words why it holds none (not
    UTF-8, nested too deeply or deeper than `max_depth`, the parser's message)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text: byte {e.start}") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and integers too long to read
        raise ValueError(str(e)) from None
    if nesting_depth(doc, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return doc


def nesting_depth(doc, limit: int) -> int:
    """How deeply lists and dicts nest in a parsed document (counted without recursion, up to limit + 1)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


@dataclass
class TensorRecord:
    name: str
    min: float
    max: float
    amax: float
    counts: list[int]
    hist_range: float  # the histogram covers [0, hist_range] with len(counts) equal bins
    nonfinite: int = 0
    stats: SampleStats | None = None  # per-sample statistics (files from older versions have none)

    @property
    def unsigned(self) -> bool:
        """Never negative: exporters may use the range [0, amax] (and amax was searched so)."""
        return self.min >= 0

    @property
    def absmax(self) -> float:
        return max(-self.min, self.max, 0.0)

    def histogram(self, bins: int) -> TensorHistogram:
        """The streaming histogram this record was made from (for merging shards)."""
        n = len(self.counts)
        counts = np.zeros(bins, dtype=np.int64)
        counts[:n] = self.counts
        size = int(counts.sum())
        top = self.hist_range / n * bins if n and self.hist_range > 0 else 0.0
        if size == 0:
            return TensorHistogram(bins=bins, counts=counts, nonfinite=self.nonfinite)
        return TensorHistogram(bins=bins, counts=counts, top=top, min=self.min, max=self.max, nonfinite=self.nonfinite, size=size)

    def edges(self) -> np.ndarray:
        n = len(self.counts)
        return np.arange(n + 1, dtype=np.float64) * (self.hist_range / n if n else 0.0)

    def threshold(self, method: str, kl_variant: str = "nvidia", unsigned: bool | None = None, num_bits: int = 8) -> float:
        """Recompute this tensor's amax from its stored histogram (mean-minmax: from its
        per-sample statistics, NNCF's MEAN_MINMAX with the ABS_MAX reducer of symmetric quantizers:
        the mean over samples of each sample's max |x|)."""
        if thresholds.parse_method(method) == "mean-minmax":
            if self.stats is None or not self.stats.count:
                raise QtoolError(f"tensor {self.name!r} has no per-sample statistics (a calibration file from an older qtool); "
                                 "calibrate again to use mean-minmax")
            return min(self.stats.mean_absmax, self.absmax)
        counts, edges = np.asarray(self.counts, dtype=np.int64), self.edges()
        if thresholds.parse_method(method) == "auto" and self.stats is not None:
            keep = thresholds.lone_peak(counts, edges, self.stats.top_absmax, self.stats.count)
            if keep is not None:  # one input's few values far beyond every other's: searched without them
                counts, edges = counts[:keep], edges[: keep + 1]
        return thresholds.amax_for(
            method, counts, edges, absmax=min(self.absmax, float(edges[-1])),
            unsigned=self.unsigned if unsigned is None else unsigned, kl_variant=kl_variant, num_bits=num_bits,
        )


@dataclass
class Calibration:
    model_path: str  # as recorded: relative to the calibration file when possible
    model_sha256: str
    method: str
    num_bits: int
    bins: int
    samples: int
    preprocess: dict
    tensors: list[TensorRecord] = field(default_factory=list)
    kl_variant: str = "nvidia"
    shard: tuple[int, int] | None = None  # (K, N) when made with --shard K/N
    pinned: bool = False  # the user chose `method` (calibrate/recompute --method): exports keep it
    warnings: list[str] = field(default_factory=list, compare=False, repr=False)  # of the run that made it; not saved
    # (the file a relative model_path is relative to, that model_path) as load and relocate set
    # them; a model_path set since then is taken as given. Not saved
    source: tuple[str, str] | None = field(default=None, compare=False, repr=False)
    # (name, SHA-256 of the bytes) of the file this calibration was read from or last saved to, as
    # exports record it (qtool.provenance); a calibration made from it (recompute, merge) has none
    file: tuple[str, str] | None = field(default=None, init=False, compare=False, repr=False)

    def amax(self) -> dict[str, float]:
        return {t.name: t.amax for t in self.tensors}

    def method_for(self, rules, method: str | None = None) -> str | None:
        """The method a target (qtool.quantizers.rules.Rules) searches thresholds with: `method` when given,
        else none (the file's thresholds) when the user pinned the file's method, else the
        target's default method."""
        if method is not None:
            return method
        return None if self.pinned else rules.default_method

    def for_target(self, rules, method: str | None = None) -> dict[str, Threshold]:
        """The thresholds that target uses (see method_for and `decide`)."""
        return self.decide(signed=rules.signed_only, method=self.method_for(rules, method), fallback=rules.clip_fallback)

    def save(self, path: str | os.PathLike) -> None:
        """Write the calibration file (atomically; the model path recorded relative to it)."""
        save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibration:
        """Read a calibration file."""
        return load(path)

    def recompute(self, method: str, kl_variant: str | None = None) -> Calibration:
        """Every threshold searched again from the stored histograms with `method`."""
        return recompute(self, method, kl_variant or self.kl_variant)

    def decide(self, *, signed: bool, method: str | None = None, fallback: bool = True) -> dict[str, Threshold]:
        """The threshold every tensor gets on a target's grid (see `decide`)."""
        return {t.name: decide(t, signed=signed, method=method, calibrated_with=self.method, kl_variant=self.kl_variant,
                               num_bits=self.num_bits, fallback=fallback) for t in self.tensors}


# A clipping threshold is meant to cut off a thin tail. One that clips more than this share of
# the calibrated values is degenerate: the entropy search returns one when no value lies near
# zero (every candidate below the smallest |x| has divergence 0 and the last one wins), which
# would map the whole tensor to a single value.
MAX_CLIPPED = 0.10
# Methods whose threshold depends on the number of grid levels, searched again when a target's
# grid differs from the one the calibration searched on (unsigned 256 levels vs signed 128).
GRID_DEPENDENT = ("entropy", "mse", "auto")


class Threshold(NamedTuple):
    amax: float
    unsigned: bool  # the target may use [0, amax]
    clipped: float  # share of the calibrated values above the searched amax
    degenerate: bool  # clipped > MAX_CLIPPED: amax is max |x| instead (with the fallback)


def clipped_fraction(record, amax: float | None = None) -> float:
    """Share of the record's calibrated |x| values above `amax` (default: its own), from the stored histogram."""
    amax = record.amax if amax is None else amax
    counts = np.asarray(record.counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0 or amax >= record.absmax:
        return 0.0
    left = record.edges()[:-1]
    return float(counts[left >= amax].sum() / total)


def decide(record, *, signed: bool, method: str | None = None, calibrated_with: str | None = None,
           kl_variant: str = "nvidia", num_bits: int = 8, fallback: bool = True) -> Threshold:
    """The clipping threshold a target uses for one tensor: the one place every exporter, the
    report and evaluate take it from. The rule:

    1. method given: searched again from the stored histogram with it, on the target's grid
       (signed when `signed` or the tensor ever goes negative, else unsigned);
    2. else the calibration file's amax, except that a target on the signed grid searches a
       never-negative tensor again when the calibration method depends on the grid
       (GRID_DEPENDENT: entropy, mse and auto: 256 levels at calibration, 128 on the signed grid);
    3. with `fallback`, a threshold clipping more than MAX_CLIPPED of the values is replaced by
       max |x| (a calibration cache alone keeps NVIDIA's threshold as it is: its target passes fallback=False).
    """
    unsigned = record.unsigned and not signed
    if method is not None:
        amax = record.threshold(method, kl_variant, unsigned=unsigned, num_bits=num_bits)
    elif signed and record.unsigned and calibrated_with in GRID_DEPENDENT:
        amax = record.threshold(calibrated_with, kl_variant, unsigned=False, num_bits=num_bits)
    else:
        amax = float(record.amax)
    clipped = clipped_fraction(record, amax)
    degenerate = clipped > MAX_CLIPPED
    if fallback and degenerate:
        amax = float(record.absmax)
    return Threshold(float(amax), unsigned, clipped, degenerate)


def record_from_histogram(name: str, hist: TensorHistogram, method: str, kl_variant: str = "nvidia", num_bits: int = 8,
                          stats: SampleStats | None = None) -> TensorRecord:
    counts, edges = hist.trimmed()
    empty = hist.size == 0
    record = TensorRecord(
        name=name,
        min=0.0 if empty else hist.min,
        max=0.0 if empty else hist.max,
        amax=0.0,
        counts=counts.tolist(),  # int64 -> Python ints
        hist_range=float(edges[-1]),
        nonfinite=hist.nonfinite,
        stats=stats,
    )
    record.amax = record.threshold(method, kl_variant, num_bits=num_bits)
    return record


def recompute(cal: Calibration, method: str, kl_variant: str = "nvidia") -> Calibration:
    """The same calibration with every threshold recomputed from the stored histograms."""
    tensors = [replace(t, amax=t.threshold(method, kl_variant, num_bits=cal.num_bits)) for t in cal.tensors]
    return replace(cal, method=method, kl_variant=kl_variant, tensors=tensors, pinned=True)


def merge(cals: list[Calibration]) -> Calibration:
    """Combine calibrations of the same model and settings made on different inputs (e.g.
    shards): the histograms add exactly, so the result equals one run over all inputs."""
    first = cals[0]
    for other in cals[1:]:
        for what in ("model_sha256", "preprocess", "method", "pinned", "kl_variant", "bins", "num_bits"):
            if getattr(other, what) != getattr(first, what):
                raise QtoolError(f"cannot merge: the files differ in {what.replace('_', ' ')} ({getattr(first, what)!r} vs {getattr(other, what)!r})")
        if [t.name for t in other.tensors] != [t.name for t in first.tensors]:
            raise QtoolError("cannot merge: the files calibrate different tensors")
    shards = [c.shard for c in cals if c.shard]
    if shards and len(set(shards)) != len(shards):
        raise QtoolError(f"cannot merge: shard {shards[0][0]}/{shards[0][1]} given twice" if shards.count(shards[0]) > 1 else "cannot merge: a shard is given twice")
    for i, t in enumerate(first.tensors):
        if sum(sum(c.tensors[i].counts) for c in cals) > MAX_COUNT:
            raise QtoolError(f"cannot merge: tensor {t.name!r} would count more than 2**53 values")
    tensors = []
    for i, t in enumerate(first.tensors):
        # widest range first: the others fold into it (adding is exact, so the order changes nothing else)
        hists = sorted((c.tensors[i].histogram(first.bins) for c in cals), key=lambda h: -h.top)
        hist = hists[0]
        for other in hists[1:]:
            hist.merge(other)
        stats = t.stats
        for other in cals[1:]:
            theirs = other.tensors[i].stats
            stats = stats.merge(theirs) if stats is not None and theirs is not None else None
        tensors.append(record_from_histogram(t.name, hist, first.method, first.kl_variant, first.num_bits, stats))
    return replace(first, samples=sum(c.samples for c in cals), tensors=tensors, shard=None)


def to_json(cal: Calibration) -> str:
    """The calibration file's text (json_chunks, joined)."""
    return b"".join(json_chunks(cal)).decode()


# bytes json_chunks gathers before it hands them on
CHUNK_BYTES = 1 << 20


def json_chunks(cal: Calibration) -> Iterator[bytes]:
    """The calibration file's text, encoded, in pieces of about CHUNK_BYTES, as json's encoder
    makes it: never the whole text at once (a transformer's file holds its Grams: svtrv2_captcha's
    is 100 MB, which json.dumps, the substitution of the inlined lists, the final newline and the
    encoding each copied; its calibrate peaked there, at 962 MB)."""

    def tensor(t: TensorRecord) -> dict:
        out = {
            "min": t.min,
            "max": t.max,
            "amax": t.amax,
            "unsigned": t.unsigned,
            "nonfinite": t.nonfinite,
            "histogram": {"range": [0.0, t.hist_range], "counts": inline(t.counts)},
        }
        if t.stats is not None:
            stats = t.stats.to_json()
            for key in ("channel_sums", "channel_absmax", "top_absmax"):
                if key in stats:
                    stats[key] = inline(stats[key])
            out["per_sample"] = stats
        return out

    # long number lists go on one line each (indent=1 would give every number its own line)
    marker = f"qtool-inline-{uuid.uuid4().hex}-"
    lists: list[str] = []

    def inline(values) -> str:
        plain = values.tolist() if isinstance(values, np.ndarray) else [v if isinstance(v, float) else int(v) for v in values]
        lists.append(json.dumps(plain, separators=(",", ":"), allow_nan=False))
        return f"{marker}{len(lists) - 1}"

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": {"path": cal.model_path, "sha256": cal.model_sha256},
        "method": cal.method,
        "kl_variant": cal.kl_variant,
        "num_bits": cal.num_bits,
        "bins": cal.bins,
        "samples": cal.samples,
        **({"shard": f"{cal.shard[0]}/{cal.shard[1]}"} if cal.shard else {}),
        **({"method_pinned": True} if cal.pinned else {}),
        "preprocess": cal.preprocess,
        # per_sample sums (exact integers) count multiples of 2**per_sample_unit_log2
        **({"per_sample_unit_log2": UNIT_LOG2} if any(t.stats is not None for t in cal.tensors) else {}),
        "tensors": _Made({t.name: t for t in cal.tensors}, tensor),
    }
    yield from _encoded(doc, marker, lists)


class _Made(dict):
    """{name: make(record)} as json's encoder reads it: each value made when the encoder comes to
    it and let go once written (the indented encoder is json's Python one, which reads a dict
    through items()), not every tensor's document and number lists before the first is written
    (khmersm: the Python heap grew by ~60 MB for a 7.9 MB file, calibrate's peak)."""

    def __init__(self, records: dict, make):
        super().__init__()
        self.records, self.make = records, make

    def __len__(self) -> int:
        return len(self.records)

    def items(self):
        return ((name, self.make(record)) for name, record in self.records.items())


def _encoded(doc: dict, marker: str, lists: list[str]) -> Iterator[bytes]:
    """`doc` as json's encoder writes it (indent 1), each marker+k string replaced by lists[k], in
    pieces of about CHUNK_BYTES, with a final newline."""
    pattern = re.compile(f'"{marker}(\\d+)"')
    pieces: list[str] = []
    size = 0
    # the encoder yields each string whole, within one piece: the markers are replaced piece by piece
    def take(m: re.Match) -> str:  # each list is written once: let go once it is
        k = int(m.group(1))
        text, lists[k] = lists[k], ""
        return text

    for piece in json.JSONEncoder(indent=1, allow_nan=False).iterencode(doc):
        if marker in piece:
            piece = pattern.sub(take, piece)
        pieces.append(piece)
        size += len(piece)
        if size >= CHUNK_BYTES:
            yield "".join(pieces).encode()
            pieces, size = [], 0
    pieces.append("\n")
    yield "".join(pieces).encode()


def relocate(cal: Calibration, path: str | os.PathLike, source: str | os.PathLike | None = None) -> Calibration:
    """The calibration with its model path made relative to the folder of the file `path`
    (files record where their model is from where they are). A relative model path is taken
    as relative to the folder of `source` (default: the file `cal` was loaded from, unless its
    model_path was set since)."""
    model = Path(cal.model_path)
    if source is None and cal.source is not None and cal.source[1] == cal.model_path:
        source = cal.source[0]
    if not model.is_absolute() and source is not None:
        # as the OS resolves `folder/../model`: symlinked folders first, then `..`
        model = Path(os.path.realpath(Path(source).parent / model.parent)) / model.name
    if not model.is_absolute():
        return cal
    relative = Path(os.path.relpath(model, Path(path).resolve().parent)).as_posix()
    return replace(cal, model_path=relative, source=(str(path), relative))


def save(cal: Calibration, path: str | os.PathLike) -> None:
    h = hashlib.sha256()

    def hashed():
        for chunk in json_chunks(relocate(cal, path)):
            h.update(chunk)
            yield chunk

    write_atomic(path, hashed())
    cal.file = (Path(path).name, h.hexdigest())


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _mapping(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return dict(value)


def load(path: str | os.PathLike) -> Calibration:
    """Read a calibration file, refusing anything that is not one this version understands."""
    return parse(read_input(path, MAX_FILE_BYTES, "calibration file"), path)


def parse(data: bytes, path: str | os.PathLike) -> Calibration:
    """A calibration file's bytes, read from `path` (named in messages), checked as `load` does."""
    p = Path(path)
    try:
        doc = json_document(data, MAX_DEPTH)
    except ValueError as e:
        raise QtoolError(f"{str(p)!r} is not a readable calibration file ({e}); calibrate again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise QtoolError(f"{str(p)!r} is not a qtool calibration file")
    if doc.get("version") != VERSION:
        raise QtoolError(f"{str(p)!r} has format version {doc.get('version')!r}; this qtool reads version {VERSION}")
    try:
        tensors = [
            TensorRecord(
                name=str(name),
                min=_number(t["min"]),
                max=_number(t["max"]),
                amax=_number(t["amax"]),
                counts=[_count(c) for c in t["histogram"]["counts"]],
                hist_range=_number(t["histogram"]["range"][1]),
                nonfinite=_count(t.get("nonfinite", 0)),
                stats=SampleStats.from_json(t["per_sample"]) if "per_sample" in t else None,
            )
            for name, t in _mapping(doc["tensors"]).items()
        ]
        cal = Calibration(
            model_path=_text(doc["model"]["path"]),
            model_sha256=_text(doc["model"]["sha256"]),
            method=_text(doc["method"]),
            num_bits=_count(doc["num_bits"]),
            bins=_count(doc["bins"]),
            samples=_count(doc["samples"]),
            preprocess=_mapping(doc["preprocess"]),
            tensors=tensors,
            kl_variant=_text(doc.get("kl_variant", "nvidia")),
            shard=tuple(int(v) for v in _text(doc["shard"]).split("/")) if "shard" in doc else None,
            pinned=_flag(doc.get("method_pinned", False)),
            source=(str(p), _text(doc["model"]["path"])),
        )
        if any(t.stats is not None for t in tensors) and doc.get("per_sample_unit_log2") != UNIT_LOG2:
            raise ValueError(f"per_sample_unit_log2 must be {UNIT_LOG2}")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise QtoolError(f"{str(p)!r} is a damaged calibration file (bad or missing field: {str(e)[:200]}); calibrate again") from None
    problem = _invalid(cal)
    if problem:
        raise QtoolError(f"{str(p)!r} is a damaged calibration file ({problem}); calibrate again")
    cal.file = (p.name, hashlib.sha256(data).hexdigest())
    return cal


def _invalid(cal: Calibration) -> str | None:
    """What is wrong with a parsed calibration, or None."""
    try:
        thresholds.parse_method(cal.method)
    except ValueError as e:
        return str(e)
    if cal.kl_variant not in thresholds.KL_VARIANTS:
        return f"unknown KL variant {cal.kl_variant!r}"
    if not 2 <= cal.num_bits <= 16 or not 1 <= cal.bins <= MAX_BINS or cal.bins & (cal.bins - 1) or not 0 <= cal.samples <= MAX_COUNT:
        return f"bad num_bits, bins or samples (bins at most {MAX_BINS}, samples at most 2**53)"
    if cal.shard is not None and not (len(cal.shard) == 2 and 1 <= cal.shard[0] <= cal.shard[1]):
        return "bad shard"
    names = set()
    for t in cal.tensors:
        if t.name in names:
            return f"tensor {t.name!r} appears twice"
        names.add(t.name)
        if not all(math.isfinite(v) for v in (t.min, t.max, t.amax, t.hist_range)) or t.amax < 0 or t.hist_range < 0:
            return f"non-finite or negative value for tensor {t.name!r}"
        if max(abs(t.min), abs(t.max), t.amax, t.hist_range) >= MAX_MAGNITUDE or 0 < t.hist_range < MIN_RANGE:
            return f"a value of tensor {t.name!r} is out of range (|x| must stay below 2**129, as float32 values do)"
        if t.min > t.max and sum(t.counts) > 0:
            return f"min above max for tensor {t.name!r}"
        if not 1 <= len(t.counts) <= cal.bins or min(t.counts) < 0 or not 0 <= t.nonfinite <= MAX_COUNT:
            return f"bad histogram for tensor {t.name!r}"
        if sum(t.counts) > MAX_COUNT:
            return f"the histogram of tensor {t.name!r} counts more than 2**53 values"
        if t.stats is not None and not _stats_in_range(t.stats):
            return f"per-sample statistics of tensor {t.name!r} out of range"
        if cal.method == "mean-minmax" and (t.stats is None or not t.stats.count):
            return f"method mean-minmax without per-sample statistics for tensor {t.name!r}"
    return None


def _stats_in_range(stats: SampleStats) -> bool:
    sums = [stats.min_sum, stats.absmax_sum, *(stats.channel_sums or [])]
    peaks = [*(stats.channel_absmax or []), *(stats.top_absmax or [])]
    return (stats.count <= MAX_COUNT and all(abs(v) < MAX_SUM for v in sums) and all(v < MAX_MAGNITUDE for v in peaks)
            and (stats.axis is None or abs(stats.axis) < 64))
