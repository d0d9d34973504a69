"""Calibrate's memory, session 30 (kokoro_ja_int8): a run in segments lets go of collect's scratch buffers after each
segment's outputs, and histograms the Add/Sub/Mul outputs a segment returns for later segments as they come instead of
computing them again beside them."""

import weakref

import numpy as np
import onnx
from test_memk23 import _adain_resblocks, _files

from qtool import api
from qtool.collection import collect, pipeline, segments


def test_scratch_buffers_are_let_go_after_each_part_of_a_run(monkeypatch):
    """Kept in a per-thread pool from run to run, the scratch buffers of computed tensors (here a * 2 and b * 2) stayed
    beside every later segment's outputs, sized for the longest input met (kokoro_ja_int8: three of 14.2 MB through
    every segment of a 61-token input). Each part's are now gone before the next part is asked for."""
    made = []

    def apply(ufunc, operands, buffer):
        out = real_apply(ufunc, operands, buffer)
        if buffer is not None:
            made.append(weakref.ref(out.base))
        return out

    real_apply = collect._apply
    monkeypatch.setattr(collect, "_apply", apply)
    two = collect.Constant(1, "two", np.array(2, np.float32))
    derived = {"a2": collect.Derived("Mul", ("a",), two), "b2": collect.Derived("Mul", ("b",), two)}
    acc = collect._Accumulator(["a", "a2", "b", "b2"], 64, None, derived, {})
    assert acc.scratch == {"a2", "b2"}
    rng = np.random.default_rng(30)
    alive_between = []

    def parts():
        yield [("a", rng.standard_normal((1, 4, 4096)).astype(np.float32))]
        alive_between.append(sum(r() is not None for r in made))
        yield [("b", rng.standard_normal((1, 4, 4096)).astype(np.float32))]

    for _ in range(2):
        acc.fill_parts(parts(), 1)
    assert len(made) == 4, made
    assert alive_between == [0, 0]  # part a's buffer is gone when part b comes
    assert all(r() is None for r in made)  # and no run keeps one for the next
    acc.count(2)
    assert acc.hists["a2"].size == acc.hists["a"].size == 2 * 4 * 4096
    assert acc.hists["a2"].max == 2 * acc.hists["a"].max


def test_carried_derivations_leave_out_concatenations_and_what_blocked_tensors_make():
    """A tensor computed from one in blocked layout is computed in that layout (its statistics sum in its order), where
    a segment returns it in NCHW: it stays computed. Concatenations are never computed, only put together."""
    two = collect.Constant(1, "two", np.array(2, np.float32))
    derived = {"s": collect.Derived("Add", ("a", "b")), "t": collect.Derived("Mul", ("s",), two),
               "u": collect.Derived("Add", ("c", "d")), "cat": collect.Derived("concat", ("c", "d"))}
    carried = {"s", "t", "cat"}
    kept, taken = collect.carried_derivations(derived, carried, {})
    assert taken == {"s", "t"} and set(kept) == {"u", "cat"}
    kept, taken = collect.carried_derivations(derived, carried, {"a": object()})
    assert taken == set() and kept == derived
    kept, taken = collect.carried_derivations(derived, {"u"}, {"a": object()})
    assert taken == {"u"} and set(kept) == {"s", "t", "cat"}


def test_sums_segments_carry_come_from_the_segments_and_the_file_is_the_same(tmp_path, monkeypatch):
    """The AdaIN resblocks of Kokoro's vocoder cut into segments: each residual sum, which collect computes from fetched
    tensors, is carried to the segment that reads it next. collect computed it again, and kept its copy beside the
    segments' own until the next residual Add's other input came (kokoro_ja_int8: 85 MB of such copies at a 61-token
    input's peak). It is now histogrammed as the segment returns it, not computed, and the file is the one session's."""
    path = tmp_path / "adain.onnx"
    onnx.save(_adain_resblocks(steps=512), path)
    folder = _files(tmp_path, steps=512)
    computed, sessions, files = [], [], {}
    real_derive = collect._Accumulator.derive

    def derive(self, name, *args, **kwargs):
        computed.append(name)
        return real_derive(self, name, *args, **kwargs)

    class Seen(segments.Segmented):
        def __init__(self, *args):
            super().__init__(*args)
            sessions.append(self)

    monkeypatch.setattr(collect._Accumulator, "derive", derive)
    monkeypatch.setattr(segments, "Segmented", Seen)
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 10)
    sums = {f"/res{b}/sum" for b in range(3)}
    for label, run_bytes in (("one", 1 << 40), ("segments", 1 << 10)):
        monkeypatch.setattr(pipeline, "RUN_BYTES", run_bytes)
        computed.clear()
        out = tmp_path / f"{label}.calib.json"
        api.calibrate_files(path, data=folder, output=out)
        files[label] = out.read_bytes()
        if label == "one":
            assert not sessions and sums <= set(computed)
        else:
            assert len(sessions) == 1 and len(sessions[0].sessions) >= 3
            carried = {t for step in sessions[0].steps for t in step[1]}  # Segmented.carried
            assert carried == sessions[0].carried
            carried &= sums
            assert carried, sessions[0].carried
            assert not carried & set(computed), carried & set(computed)
            assert set(computed)  # the others still are
    assert files["one"] == files["segments"]
