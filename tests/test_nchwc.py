"""onnxruntime's blocked channel layout (qtool/runtime/nchwc.py): fetching tensors before onnxruntime
reorders them to NCHW changes nothing that calibration computes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zoo

from qtool import model
from qtool.collection import collect
from qtool.runtime import nchwc, onnxruntime
from qtool.statistics import histogram
from qtool.statistics.stats import SampleStats, new_stats

BLOCK = nchwc.block_size()
needs_blocks = pytest.mark.skipif(BLOCK is None, reason="onnxruntime does not use a blocked layout on this machine")
MODELS = [(zoo.yolo_like, (2, 3, 64, 96)), (zoo.paddle_ocr_like, (2, 3, 48, 64))]


def _blocked(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW -> the logical NCHW shape over blocked memory, as onnxruntime returns it."""
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n, c // block, block, h, w).transpose(0, 1, 3, 4, 2)).reshape(n, c, h, w)


def test_blocked_memory_reads_back_as_nchw():
    x = np.arange(2 * 16 * 3 * 5, dtype=np.float32).reshape(2, 16, 3, 5)
    b = _blocked(x, 8)
    assert b.shape == x.shape and not np.array_equal(b, x)
    assert np.array_equal(nchwc.unblocked(b, 8), x)
    assert nchwc.view5(b, 8)[1, 1, 2, 4, 3] == x[1, 11, 2, 4]
    assert nchwc.blocked_shape(b, 8) and not nchwc.blocked_shape(b, 32) and not nchwc.blocked_shape(b[0], 8)


def _setup(build):
    m = build()
    types = model.tensor_types(m)
    names = model.activation_tensors(m, types)
    static = frozenset(names) - model.data_dependent(m)
    return m, types, names, static


@needs_blocks
@pytest.mark.parametrize("build, shape", MODELS)
def test_tensors_fetched_before_the_reorder_hold_the_same_values(build, shape):
    m, types, names, static = _setup(build)
    exposed = model.with_outputs(m, names, types)
    session, blocked = nchwc.fetching_session(exposed, names, keep=static, threads=1)
    assert len(blocked) >= 20 and not set(blocked) & static
    assert all(b.block == BLOCK for b in blocked.values())
    feed = {m.graph.input[0].name: np.random.default_rng(1).random(shape, dtype=np.float32)}
    want = dict(zip(names, onnxruntime.session(exposed, threads=1).run(names, feed)))
    got = dict(zip(names, session.run([blocked[n].source if n in blocked else n for n in names], feed)))
    for name in names:
        value = nchwc.unblocked(got[name], BLOCK) if name in blocked else got[name]
        assert np.array_equal(value, want[name], equal_nan=True), name
    assert any(not np.array_equal(got[n], want[n]) for n in blocked)  # the layout really differs


@needs_blocks
@pytest.mark.parametrize("build, shape", MODELS)
def test_blocked_layout_changes_no_histogram_or_statistic(build, shape):
    """Histograms, min/max and per-sample statistics (channel means, depthwise channel peaks),
    with derived tensors computed from blocked inputs (Mul with a broadcast gate included) and
    non-finite values, equal those collected from NCHW outputs."""
    m, types, names, static = _setup(build)
    stats = new_stats(m, names)
    plan = collect.derivations(m, names, types, static, stats)
    fetched = [n for n in names if n not in plan]
    exposed = model.with_outputs(m, fetched, types)
    blocked_session, blocked = nchwc.fetching_session(exposed, fetched, keep=static, threads=1)
    both = [n for n, d in plan.items() if d.op != "concat" and all(p in blocked for p in d.parts)]
    assert len(both) >= 4 and any(stats[n].axis is not None for n in both)
    rng = np.random.default_rng(6)
    feed = m.graph.input[0].name
    batches = [({feed: rng.random(shape, dtype=np.float32)}, 2) for _ in range(3)]
    batches[1][0][feed][1, 0, :4, :4] = np.nan
    results = []
    for session, layout in ((onnxruntime.session(exposed, threads=1), {}), (blocked_session, blocked)):
        stats = new_stats(m, names)
        hists, _ = collect.collect(session, collect.Plan(names, 2048, static, derived=plan, blocked=layout), iter(batches),
                                   stats=stats, schedule=collect.Schedule(workers=2))
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max, h.size, h.nonfinite) for n, h in hists.items()},
                        {n: st.to_json() for n, st in stats.items()}))
    assert any("channel_sums" in st for st in results[0][1].values())
    assert results[0] == results[1]


def test_operations_on_mixed_layouts():
    """Add of a blocked and an NCHW tensor (computed in NCHW), Mul of two blocked tensors with a
    broadcast [N, C, 1, 1] gate (computed in blocks), and a concatenation of mixed parts give
    what all-NCHW inputs give."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 16, 3, 5)).astype(np.float32)
    b = rng.standard_normal((2, 16, 3, 5)).astype(np.float32)
    g = rng.random((2, 16, 1, 1)).astype(np.float32)
    names = ["a", "b", "g", "sum", "gated", "cat"]
    derived = {"sum": collect.Derived("Add", ("a", "b")), "gated": collect.Derived("Mul", ("a", "g")),
               "cat": collect.Derived("concat", ("a", "b"))}
    results = []
    for blocks, feed in (({}, [("a", a), ("b", b), ("g", g)]),
                         ({"a": 8, "g": 8}, [("a", _blocked(a, 8)), ("b", b), ("g", _blocked(g, 8))])):
        stats = {n: SampleStats(axis=1, track_absmax=True) for n in names}
        acc = collect._Accumulator(names, 256, stats, derived, blocks)
        acc.fill(feed, 2)
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max) for n, h in acc.hists.items()},
                        {n: st.to_json() for n, st in acc.stats.items()}))
    assert results[0] == results[1]
    assert len(results[0][1]["cat"]["channel_sums"]) == 32 and results[0][1]["gated"]["channel_absmax"]


def test_operations_with_constants_on_both_layouts():
    """Add/Sub/Mul of a tensor and a constant (scalar or per channel, either operand; in chains
    that reuse scratch memory, run after run) give what fetching their outputs gives, from NCHW
    and from blocked inputs."""
    rng = np.random.default_rng(4)
    runs = [rng.standard_normal((2, 16, 3, 5)).astype(np.float32) for _ in range(3)]
    scale, shift, half = np.float32([2.5]), np.float32(-0.75), np.float32([[[1.5]]])
    bias = rng.standard_normal((16, 1, 1)).astype(np.float32)
    names = ["a", "m", "u", "s", "t", "v", "b", "r"]
    derived = {"m": collect.Derived("Mul", ("a",), collect.Constant(1, "scale", scale)),  # a * 2.5
               "u": collect.Derived("Mul", ("m",), collect.Constant(1, "scale", scale)),  # m * 2.5, after s and t
               "s": collect.Derived("Add", ("m",), collect.Constant(1, "shift", shift)),  # m - 0.75
               "t": collect.Derived("Sub", ("s",), collect.Constant(0, "half", half)),  # 1.5 - s
               "v": collect.Derived("Mul", ("s",), collect.Constant(1, "scale", scale)),  # s * 2.5, before t
               "b": collect.Derived("Add", ("a",), collect.Constant(0, "bias", bias)),  # bias + a
               "r": collect.Derived("Mul", ("t", "b"))}

    def values(a):
        m = a * scale
        s = m + shift
        t = half - s
        b = bias + a
        return {"a": a, "m": m, "u": m * scale, "s": s, "t": t, "v": s * scale, "b": b, "r": t * b}

    results = []
    for plan, blocks, layout in (({}, {}, lambda x: x), (derived, {}, lambda x: x), (derived, {"a": 8}, lambda x: _blocked(x, 8))):
        stats = {n: SampleStats(axis=1, track_absmax=True) for n in names}
        acc = collect._Accumulator(names, 256, stats, plan, blocks)
        for a in runs:
            v = values(a)
            acc.fill([("a", layout(a))] + [(n, v[n]) for n in names[1:] if n not in plan], 2)
        results.append(({n: (h.top, h.counts.tolist(), h.min, h.max) for n, h in acc.hists.items()},
                        {n: st.to_json() for n, st in acc.stats.items()}))
    assert results[1] == results[0] and results[2] == results[0]
    assert collect._Accumulator(names, 256, {}, derived, {}).scratch == {"m", "u", "s", "v", "r"}  # t is read by r too


def test_ordered_sums_kernel_and_numpy_agree():
    """The blocked channel sums: the kernel and numpy add in the same order (values spread over
    many orders of magnitude, where the order shows), and a sample's sums do not depend on the
    batch around it."""
    rng = np.random.default_rng(3)
    v = (rng.standard_normal((3, 2, 4, 777, 8)) * np.exp(rng.standard_normal((3, 2, 4, 777, 8)) * 8)).astype(np.float32)
    by_numpy = histogram.ordered_sums(v)
    histogram.start_loading()
    histogram.wait_for_kernel()
    by_kernel = histogram.ordered_sums(v)
    assert by_kernel.shape == (3, 4, 8) and np.array_equal(by_numpy, by_kernel)
    assert np.array_equal(histogram.ordered_sums(v[1:2]), by_kernel[1:2])
    assert np.allclose(by_kernel, v.astype(np.float64).sum(axis=(1, 3)), rtol=1e-9, atol=0)
    assert not np.array_equal(histogram.ordered_sums(v[:, :, :, ::-1]), by_kernel)  # the order is real
    # with the per-lane max |x| of the same read: numpy's, zeros included
    v[:, :, 1, :, 3] = 0.0
    v[1, 0, 1, 5, 3] = -0.0
    sums, peaks = histogram.ordered_sums(v, peaks=True)
    numpy_peaks = np.maximum(v.max(axis=(0, 1, 3)), -v.min(axis=(0, 1, 3))).reshape(-1).astype(np.float64)
    assert np.array_equal(sums, histogram.ordered_sums(v)) and np.array_equal(peaks, numpy_peaks)
    assert np.array_equal(np.signbit(peaks), np.signbit(numpy_peaks)) and peaks[11] == 0


def test_models_with_external_weights_are_fetched_in_nchw():
    m, types, names, _ = _setup(zoo.yolo_like)
    _, blocked = nchwc.fetching_session(model.with_outputs(m, names, types), names, external_folder=".", threads=1)
    assert blocked == {}


@needs_blocks
def test_calibration_file_is_the_same_in_either_layout(tmp_path, monkeypatch):
    import onnx
    from PIL import Image
    from runcli import invoke

    path = tmp_path / "yolo.onnx"
    onnx.save(zoo.yolo_like(), str(path))
    rng = np.random.default_rng(4)
    (tmp_path / "images").mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (40 + 4 * i, 56, 3), dtype=np.uint8)).save(tmp_path / "images" / f"{i}.png")
    files = []
    for layout in ("blocked", "nchw"):
        if layout == "nchw":
            monkeypatch.setattr(nchwc, "block_size", lambda: None)
        out = tmp_path / f"{layout}.calib.json"
        result = invoke("-v", "calibrate", path, "--images", tmp_path / "images", "--size", "64x96", "-o", out)
        assert result.exit_code == 0, result.output
        count = int(re.search(r"(\d+) fetched in blocked layout", result.output).group(1))
        assert (count > 0) == (layout == "blocked")
        files.append(out.read_bytes())
    assert files[0] == files[1]


@needs_blocks
def test_a_model_loaded_lazily_is_fetched_in_blocked_layout_as_one_read_whole(tmp_path, monkeypatch):
    """calibrate loads every model lazily: onnxruntime's optimized copy then refers to the weights by their paths
    from the root, and its session reads them from there (before: it would not load, and every tensor came in NCHW,
    DeepFilterNet3's encoder 16 of 48); the same calibration file as fetched in NCHW."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from runcli import invoke

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.2).astype(np.float32), f"w{k}") for k in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="conv0"), helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"), helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Add", ["r1", "bias"], ["y"], name="add")]  # a weight onnxruntime keeps as it reads it
    inits.append(numpy_helper.from_array(rng.standard_normal((16, 20, 20)).astype(np.float32), "bias"))
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 20, 20])], initializer=inits)
    path = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    (tmp_path / "data").mkdir()
    for i in range(4):
        np.savez(tmp_path / "data" / f"{i}.npz", x=rng.standard_normal((1, 16, 20, 20)).astype(np.float32))
    files = []
    for layout in ("blocked", "nchw"):
        if layout == "nchw":
            monkeypatch.setattr(nchwc, "block_size", lambda: None)
        out = tmp_path / f"{layout}.calib.json"
        result = invoke("-v", "calibrate", path, "--data", tmp_path / "data", "-o", out)
        assert result.exit_code == 0, result.output
        count = int(re.search(r"(\d+) fetched in blocked layout", result.output).group(1))
        assert (count > 0) == (layout == "blocked"), result.output
        files.append(out.read_bytes())
    assert files[0] == files[1]
