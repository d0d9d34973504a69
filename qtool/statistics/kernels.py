"""The compiled loops of histogram.py (numba; imported only when histogram starts loading them,
so a run that never bins much pays neither numba's import nor their load).

Defined at module level so numba caches their machine code beside this file: a later process
loads them instead of compiling. Every loop computes exactly what histogram.py's numpy path
computes (tests/test_histogram.py and test_nchwc.py hold them to it).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

CHUNK = 512  # 2 KB of indices beside 32 KB of counters: L1-sized
WAYS = 8
# a chunk of m values adds at most m // WAYS + 1 to a counter; flush before one could pass 65535
ROOM = 65535 - (CHUNK // WAYS + 1)


@intrinsic
def prefetch(typingctx, array, index):
    """prefetch(a, i) in compiled code: a hint that a[i] (1-D) is read soon. LLVM's
    llvm.prefetch (read, keep in every cache level): it never faults and changes nothing."""

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte], ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]))
        builder.call(fn, [builder.bitcast(ptr, byte), i32(0), i32(3), i32(1)])  # read, all levels, data
        return context.get_dummy_value()

    return types.void(array, index), codegen


@njit(nogil=True, cache=True)
def add_bins(x, bits, ubits, factor, counts, ends):  # pragma: no cover - compiled
    """|x| -> bin -> count, and each row's min and max, in one read of the data instead of
    numpy's four array passes for the bins and two for the extrema.

    Bin indices are computed a chunk at a time (a loop the compiler vectorizes: it indexes a
    view of the chunk, since x[start + i] would need a negative-index check per value), then
    counted into eight sub-histograms: neighbouring activations often share a bin, and one
    counter would make every increment wait for the previous one (four measured 1.4x slower
    on real models' activations; sixteen no longer fit the L1 cache). Value i of a chunk
    counts in sub-histogram i % 8, whose counter of bin b sits at b * 8 + i % 8: the index
    loop computes that address, so the counting loop only loads, adds and stores (on a Zen 5,
    0.36-0.41 against 0.41-0.44 ns/value for rows of sub-histograms, bench/binning.py). The
    sub-histograms count in 16 bits (32 KB for 2048 bins: they stay in the L1 cache beside
    the data) and move into a 64-bit total before a counter can wrap. The total reaches
    `counts` only when every value was below the top (none in slot n, where values at or
    beyond it and NaN go): a caller that guessed the range can try again with another.

    The extrema are those of the order of integer keys: a float's bits as a signed integer,
    with the magnitude bits flipped when negative, order as the floats do (-0.0 just below
    +0.0; NaN beyond the infinities). `ends` [2, rows] gets the bits of each row's smallest
    and largest float in that order (as a float array's integer view: the caller reads them as
    floats). They come from three plain reductions of the bits, which the compiler vectorizes
    at the data's width (computing the keys in the loop widened them to 64 bits: 0.21 against
    0.09 ns/value): the signed max is the largest float's bits when one is non-negative, else
    the signed min is (all negative: the smallest magnitude); the unsigned max is the smallest
    float's bits when one is negative (the largest magnitude), else the signed min is.

    Each chunk starts by asking the memory for the next one, a prefetch per cache line: the
    counting, which reads no new data, then overlaps its arrival (activations come cold from
    onnxruntime: on one image's of each bench model, 0.70-0.80 ns/value without, 0.61-0.70 with;
    bench/binning.py prints the kernel's ns/value).
    """
    n = counts.size
    sub = np.zeros((n + 1) * WAYS, np.uint16)  # counter w of bin b at b * WAYS + w
    total = np.zeros(n + 1, np.int64)
    idx = np.empty(CHUNK, np.uint32)
    line = 64 // x.itemsize  # values per cache line
    limit = x.dtype.type(n)
    load = 0
    rows, cols = x.shape
    for r in range(rows):
        xr, br, ur = x[r], bits[r], ubits[r]
        smin, smax, umax = br[0], br[0], ur[0]
        for start in range(0, cols, CHUNK):
            m = min(CHUNK, cols - start)
            xs, bs, us = xr[start : start + m], br[start : start + m], ur[start : start + m]
            for p in range(start + CHUNK, min(start + 2 * CHUNK, cols), line):
                prefetch(xr, p)
            for i in range(m):
                f = abs(xs[i]) * factor
                idx[i] = (np.uint32(f) if f < limit else np.uint32(n)) * np.uint32(WAYS) + np.uint32(i % WAYS)
            for i in range(m):
                smin, smax, umax = min(smin, bs[i]), max(smax, bs[i]), max(umax, us[i])
            for i in range(m):
                sub[idx[i]] += np.uint16(1)
            load += m // WAYS + 1
            if load > ROOM:  # by values, not chunks: rows of a few values do not flush more often
                for j in range(n + 1):
                    for w in range(WAYS):
                        total[j] += np.int64(sub[j * WAYS + w])
                sub[:] = 0
                load = 0
        ends[1, r] = smax if smax >= 0 else smin
        if smin >= 0:
            ends[0, r] = smin
        else:  # stored alone, as ends' signed integer (an expression mixing the two would be a float)
            ends[0, r] = umax
    for j in range(n + 1):
        for w in range(WAYS):
            total[j] += np.int64(sub[j * WAYS + w])
    if total[n] == 0:
        for j in range(n):
            counts[j] += total[j]
    return total[n]


@njit(nogil=True, cache=True)
def ordered_sums(v, out, hi, lo, track):  # pragma: no cover - compiled
    """Sums over axes 1 and 3 of [samples, outer, groups, inner, lanes], for every (sample,
    group, lane), in float64, one value after the other: what np.add.accumulate does, with
    the lanes (contiguous) summed side by side (a loop over views of rows of lanes, which
    the compiler vectorizes). With `track`, also the max and min of every (group, lane)."""
    rows, outer, groups, inner, lanes = v.shape
    for r in range(rows):
        vr = v[r]
        for g in range(groups):
            acc, first = out[r, g], vr[0, g, 0]
            top, bottom = hi[g], lo[g]
            for j in range(lanes):
                acc[j] = first[j]
                if track and r == 0:
                    top[j], bottom[j] = first[j], first[j]
            for o in range(outer):
                block = vr[o, g]
                for i in range(1 if o == 0 else 0, inner):
                    row = block[i]
                    for j in range(lanes):
                        acc[j] += row[j]
                    if track:
                        for j in range(lanes):
                            top[j] = max(top[j], row[j])
                            bottom[j] = min(bottom[j], row[j])
            if track and r > 0:
                for j in range(lanes):
                    top[j], bottom[j] = max(top[j], first[j]), min(bottom[j], first[j])
