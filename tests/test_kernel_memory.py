"""The binning kernel (numba) only where its memory fits calibrate's 2x bound, and the same
histograms and calibration files whichever path bins (issue 49: docs/benchmarks.md #mem17)."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import zoo
from runcli import invoke

from qtool.statistics import histogram
from qtool.statistics.histogram import TensorHistogram

ROOT = Path(__file__).resolve().parents[1]


def _small_model(folder: Path) -> Path:
    """A small Conv chain and 4 data files: a few MB of activations a run, like the zoo's small CNNs."""
    m = folder / "small.onnx"
    onnx.save(zoo.yolo_like(), m)
    (folder / "d").mkdir()
    for i in range(4):
        np.save(folder / "d" / f"{i}.npy", np.random.default_rng(i).random((1, 3, 64, 64), dtype=np.float32))
    return m


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux's /proc: the RSS the rule reads")
def test_a_small_calibration_that_bins_enough_does_not_load_numba(tmp_path):
    """The bytes rule says bin with the kernel (KERNEL_BYTES as low as it goes), but loading it
    (~90 MB while it loads, ~40 after) would take the process past twice plain inference's peak
    for this model: numpy bins, numba is never imported, and the file is the kernel's."""
    m = _small_model(tmp_path)
    code = ("import sys\n"
            "from qtool.collection import pipeline\n"
            "pipeline.KERNEL_BYTES = 1\n"
            "{fits}"
            "from qtool.cli import main\n"
            "try:\n"
            "    main(['calibrate', sys.argv[1], '--data', sys.argv[2], '-o', sys.argv[3], '-q'])\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print('numba' in sys.modules, 'llvmlite' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    files = {}
    for name, fits in (("numpy", ""), ("kernel", "pipeline._kernel_fits = lambda plain: True\n")):
        out = tmp_path / f"{name}.calib.json"
        got = subprocess.run([sys.executable, "-c", code.format(fits=fits), str(m), str(tmp_path / "d"), str(out)],
                             capture_output=True, text=True, env=env)
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines()[-1].split() == [str(name == "kernel")] * 2, (name, got.stdout, got.stderr)
        files[name] = hashlib.sha256(out.read_bytes()).hexdigest()
    assert files["numpy"] == files["kernel"]


def test_the_rule_weighs_the_kernel_against_plain_inference(monkeypatch):
    """_kernel_fits: the RSS now plus the load's, and the peak so far plus what the kernel holds,
    both within twice plain inference's estimate."""
    from qtool.collection import pipeline

    mb = 1 << 20
    monkeypatch.setattr(pipeline, "_rss", lambda: (100 * mb, 150 * mb))
    load, held = pipeline.KERNEL_LOAD_RSS, pipeline.KERNEL_HELD_RSS
    assert pipeline._kernel_fits(max(100 * mb + load, 150 * mb + held) // 2)
    assert not pipeline._kernel_fits(max(100 * mb + load, 150 * mb + held) // 2 - mb)
    monkeypatch.setattr(pipeline, "_rss", lambda: (None, None))
    assert pipeline._kernel_fits(0)  # nothing to tell by: as before


def test_plain_estimate_holds_the_tensors_alive_together():
    """_plain_bytes: PLAIN_FLOOR, the file, and the most bytes alive at once in graph order (a
    tensor from its node to its last reader; graph outputs to the end)."""
    from onnx import TensorProto, helper

    from qtool.collection import pipeline

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    plain = pipeline._plain_bytes(proto, 1000)
    # at the Add: a, b and c alive (x's last reader was the first Relu)
    assert plain({"x": 1, "a": 10, "b": 100, "c": 1000, "y": 5}) == pipeline.PLAIN_FLOOR + 1000 + 1110
    assert plain({"y": 7, "unknown": 10**9}) == pipeline.PLAIN_FLOOR + 1000 + 7


def _awkward_batches(dtype):
    rng = np.random.default_rng(17)
    n = histogram.KERNEL_MIN_SIZE * 3 + 5  # the kernel takes them, not in whole chunks
    top = 4.0
    ties = (np.arange(n) % 2048 * (top / 2048)).astype(dtype)  # every value exactly on a bin's lower edge
    ties[:7] = np.nextafter(dtype(top), dtype(0))  # just below the top
    growing = [(rng.standard_normal(n) * s).astype(dtype) for s in (0.01, 1.0, 300.0, 0.5)]  # the range doubles, folds
    bad = rng.standard_normal(n).astype(dtype)
    bad[[3, 4000, n - 1]] = [np.nan, np.inf, -np.inf]
    zeros = np.zeros(n, dtype)
    zeros[1::2] = -0.0
    tiny = (rng.standard_normal(n) * 1e-30).astype(dtype)  # a range far below 1
    rows = rng.standard_normal((3, n)).astype(dtype)
    rows[1, 11] = np.nan
    return [zeros, ties, *growing, bad, tiny, rows, ties[::-1].copy(), -ties]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_kernel_and_numpy_give_the_same_histograms_on_awkward_data(dtype, monkeypatch):
    """NaN and infinities, values on bin edges and just below the top, a range that grows by
    several doublings (bins folded), only zeros of both signs, float16 (binned as float32), rows:
    the kernel's histogram is numpy's, bit for bit."""
    histogram.start_loading()
    histogram.wait_for_kernel()
    assert histogram._ready is not None

    def run():
        h, extrema = TensorHistogram(bins=2048), []
        for b in _awkward_batches(dtype):
            e = h.update(b, rows=b.shape[0] if b.ndim == 2 else 1)
            extrema.append(repr((e.lo, e.hi, e.nonfinite)))
        return h, extrema

    fast, fast_extrema = run()
    monkeypatch.setattr(histogram, "_ready", None)  # as in a process that never loaded it
    slow, slow_extrema = run()
    assert fast.counts.tobytes() == slow.counts.tobytes() and fast_extrema == slow_extrema
    assert (fast.top, fast.min, fast.max, fast.size, fast.nonfinite) == (slow.top, slow.min, slow.max, slow.size, slow.nonfinite)
    assert fast.nonfinite == 4 and fast.counts.sum() == fast.size  # size: the finite values binned


def test_calibration_files_are_the_same_binned_either_way(tmp_path, monkeypatch):
    """One calibration of a small model, its kernel loaded or not: the same bytes."""
    from qtool.collection import pipeline

    m = _small_model(tmp_path)
    digests = []
    for fits in (True, False):
        monkeypatch.setattr(pipeline, "KERNEL_BYTES", 1)
        monkeypatch.setattr(pipeline, "_kernel_fits", lambda plain, fits=fits: fits)
        if not fits:
            monkeypatch.setattr(histogram, "_ready", None)
            monkeypatch.setattr(histogram, "_loader", None)
            monkeypatch.setattr(histogram, "start_loading", lambda: pytest.fail("loads the kernel"))
        out = tmp_path / f"{fits}.calib.json"
        r = invoke("calibrate", m, "--data", tmp_path / "d", "-o", out, "-q")
        assert r.exit_code == 0, r.output
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
