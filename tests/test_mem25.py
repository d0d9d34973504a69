"""Calibrate's memory, session 25 (issue 49: docs/benchmarks.md #mem25)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What the command line's process holds when shape inference's child is started: a child, until it runs its own
# program, shares its parent's pages, which a process tree's RSS sum counts twice.
_AT_START = """
import sys
import qtool.launch  # the command line's entry (the console script, python -m qtool)
from qtool.model import shapes
child = shapes._child
print(child is not None and child.proc.poll() is None, "onnxruntime" in sys.modules)
print(child is not None and child.ready)
"""


def _run(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_command_line_starts_shape_inference_s_child_before_onnxruntime_and_the_model():
    assert _run(_AT_START) == ["True", "False", "True"]


def test_a_program_that_imports_qtool_starts_it_on_first_use():
    code = _AT_START.replace("import qtool.launch", "import qtool")
    assert _run(code) == ["False", "False", "False"]


def _bench_zoo():
    """bench/zoo.py (not tests/zoo.py, the look-alikes, which `import zoo` finds in a whole run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_zoo", ROOT / "bench" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_tells_a_process_that_shares_an_address_space():
    import os
    import threading

    zoo = _bench_zoo()
    if zoo._KCMP is None:
        return  # kcmp(2)'s number unknown on this machine: nothing is told (every process counted)
    ids, go = [], threading.Event()
    thread = threading.Thread(target=lambda: (ids.append(threading.get_native_id()), go.wait(10)))
    thread.start()
    while not ids:
        pass
    try:
        assert zoo.one_space(os.getpid(), ids[0])  # a thread: this process's memory
    finally:
        go.set()
        thread.join()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert not zoo.one_space(child.pid, os.getpid())  # exec'd: its own
    finally:
        child.kill()
        child.wait()


class _Proc:
    def __init__(self, pid, parent, rss, kids=()):
        self.pid, self.parent, self.rss, self.kids = pid, parent, rss, list(kids)

    def children(self, recursive=False):
        return self.kids

    def ppid(self):
        return self.parent

    def memory_info(self):
        return type("Info", (), {"rss": self.rss})


def test_the_bench_counts_a_vforked_child_once(monkeypatch):
    """calibrate starting a process (subprocess: vfork, then exec) read, summed, twice its memory for a moment: ddddocr_ocr
    190 MB against 176 otherwise, 1 ms polls."""
    zoo = _bench_zoo()
    twin, helper = _Proc(11, 10, 95 << 20), _Proc(12, 10, 20 << 20)
    root = _Proc(10, 1, 95 << 20, [twin, helper])
    monkeypatch.setattr(zoo, "one_space", lambda a, b: a == 11 and b == 10, raising=False)
    assert zoo.tree_rss(root) == 115 << 20


def test_the_size_probe_s_session_packs_no_weights(monkeypatch):
    """The size probe runs once, for shapes: its kernels read their weights as they are (onnxruntime's LSTM, MatMul
    and Conv kernels otherwise pack a copy as the session is made: ddddocr_ocr's probe 175 MB in-process, 149 without)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from qtool.collection import segments
    from qtool.runtime import onnxruntime

    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.ones(64 * 64, np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made, opened = [], onnxruntime.session
    monkeypatch.setattr(onnxruntime, "session", lambda *a, **k: made.append(k) or opened(*a, **k))
    found = segments.probed(model, ["h"], {"x": np.ones((4, 64), np.float32)})
    assert found == {"h": 4 * 64 * 4} and len(onnx.ModelProto.FromString(model.SerializeToString()).graph.node) == 2
    assert [k.get("prepack", True) for k in made] == [False]

