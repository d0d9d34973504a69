"""Calibrate's memory, session 26 (issue 49: docs/benchmarks.md #mem26)."""

from __future__ import annotations

import mmap
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qtool import model as qmodel
from qtool.collection import segments
from qtool.runtime import nchwc, onnxruntime

needs_blocks = pytest.mark.skipif(nchwc.block_size() is None, reason="onnxruntime does not use a blocked layout on this machine")
needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="no /proc/self/smaps (not Linux)")


def _convs(layers: int = 4, channels: int = 64, side: int = 16) -> onnx.ModelProto:
    """Conv -> Relu, `layers` times: weights of 147 KB each (64x64x3x3), which a blocked session's optimized graph
    keeps in its weights file (nchwc.optimized_apart), and onnxruntime maps."""
    rng = np.random.default_rng(4)
    inits, nodes, x = [], [], "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), f"w{k}"))
        nodes += [helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]), helper.make_node("Relu", [f"c{k}"], [f"r{k}"])]
        x = f"r{k}"
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, side, side])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _weights_resident() -> tuple[int, int]:
    """(bytes mapped, bytes resident) of this process's mappings of onnxruntime's optimized weights files."""
    mapped = resident = 0
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):
                inside = nchwc.WEIGHTS_FILE in line
            elif inside and head == "Size:":
                mapped += int(line.split()[1]) << 10
            elif inside and head == "Rss:":
                resident += int(line.split()[1]) << 10
    return mapped, resident


@needs_blocks
@needs_proc
def test_a_segment_s_mapped_weights_are_let_go_once_it_has_run():
    """Each segment's session maps its weights file; a run that kept every segment's pages once read held them all
    beside the next run's first segments (tabledet_obj_q: 371 MB of float32 Conv weights beside its 928x928
    activations). The values are those of the unsplit run."""
    m = _convs()
    types = qmodel.tensor_types(m)
    fetched = qmodel.activation_tensors(m, types)
    exposed = qmodel.with_outputs(m, fetched, types)
    layout = nchwc.blocked_layout(exposed, fetched)
    assert layout  # the Convs' outputs come blocked: their sessions read the optimized graph's weights file
    parts = segments.split(exposed, fetched, [4])  # two Conv -> Relu blocks a segment
    chain = segments.Segmented(parts, frozenset(), 1, layout)
    assert all(chain.files)  # each segment's session maps a file of its own
    x = np.random.default_rng(6).standard_normal((1, 64, 16, 16)).astype(np.float32)
    seen = []
    got = {}
    for part in chain.runs({"x": x}, set(fetched)):
        seen.append(_weights_resident())
        got.update(part)
    assert len(seen) == 2
    assert all(mapped >= 2 * 64 * 64 * 9 * 4 for mapped, _ in seen)
    assert [resident for _, resident in seen] == [0, 0]  # let go as each segment finished
    # the same values, read again from the page cache, run after run
    session, blocked = nchwc.fetching_session(exposed, fetched, keep=frozenset(), threads=1)
    whole = dict(zip(fetched, onnxruntime.run(session, [blocked[n].source if n in blocked else n for n in fetched], {"x": x})))
    for _ in range(2):
        again = {name: value for part in chain.runs({"x": x}, set(fetched)) for name, value in part}
        for name in fetched:
            np.testing.assert_array_equal(again[name], got[name], err_msg=name)
            np.testing.assert_array_equal(got[name], whole[name], err_msg=name)


def _resident(start: int) -> int:
    """Bytes resident of this process's mapping that starts at address `start` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == start
            elif inside and head == "Rss:":
                return int(line.split()[1]) << 10
    raise AssertionError("no such mapping")


@needs_proc
def test_only_pages_nothing_wrote_are_let_go(tmp_path):
    """A private mapping's page written (copied on write: the writer's own) is not the file's: a mapping with one is
    left alone, whose pages madvise would otherwise replace with the file's; one nothing wrote is let go."""
    mappings = []
    for k in range(2):
        path = tmp_path / f"weights{k}.bin"
        path.write_bytes(bytes(range(256)) * 64)
        with open(path, "rb") as f:
            mappings.append(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    try:
        found = onnxruntime.mapped_files()
        ours = [next(m for m in found if m[0][1] == os.stat(tmp_path / f"weights{n}.bin").st_ino) for n in range(2)]
        starts = [start for _, start, _ in ours]
        clean, written = mappings
        assert clean[:4] == written[:4] == bytes([0, 1, 2, 3])
        written[0:1] = b"\xff"
        assert _resident(starts[0]) > 0 and _resident(starts[1]) > 0
        assert onnxruntime.drop_pages(frozenset(ours)) == len(clean)  # the clean one's range only
        assert _resident(starts[0]) == 0
        assert written[0] == 0xFF and _resident(starts[1]) > 0  # the written page kept
        assert clean[:4] == bytes([0, 1, 2, 3])  # read back from the file
    finally:
        for m in mappings:
            m.close()
