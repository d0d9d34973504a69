"""Calibrate's memory, session 25 (issue 49: docs/benchmarks.md #mem25)."""

import subprocess
import sys
import types
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
    # psutil is a bench dependency, not a test one: tree_rss reads only its Error class from it here
    monkeypatch.setitem(sys.modules, "psutil", types.SimpleNamespace(Error=ProcessLookupError))
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


def _snake_adain(scalar: bool = False):
    """test_memk23's AdaIN resblocks as Kokoro's export spells its vocoder's: the variance a Mul of the centred input by
    itself, and after each AdaIN a Snake, h + sin(alpha * h)^2 / alpha, its alphas per channel ([1, C, 1]; `scalar`:
    one alpha, a Mul by a constant of one value, which MatMulScaleFusion could take in)."""
    import numpy as np
    from onnx import helper, numpy_helper
    from test_memk23 import _adain_resblocks

    model = _adain_resblocks()
    g, ch = model.graph, 8
    nodes = []
    for n in g.node:
        if n.op_type == "Pow":  # d ** 2 -> d * d
            nodes.append(helper.make_node("Mul", [n.input[0], n.input[0]], list(n.output), name=n.name))
        elif n.op_type == "LeakyRelu":  # the Snake
            h, s = n.input[0], n.output[0]
            shape = [] if scalar else [1, ch, 1]
            alpha = np.full(shape, 1.3, np.float32) + (0 if scalar else np.arange(ch, dtype=np.float32).reshape(shape) / 10)
            g.initializer.extend([numpy_helper.from_array(alpha, f"{s}/alpha"),
                                  numpy_helper.from_array((1 / alpha).astype(np.float32), f"{s}/inv_alpha")])
            nodes += [helper.make_node("Mul", [h, f"{s}/alpha"], [f"{s}/ax"], name=f"{s}/ax"),
                      helper.make_node("Sin", [f"{s}/ax"], [f"{s}/sin"], name=f"{s}/sin"),
                      helper.make_node("Mul", [f"{s}/sin", f"{s}/sin"], [f"{s}/sin2"], name=f"{s}/sin2"),
                      helper.make_node("Mul", [f"{s}/sin2", f"{s}/inv_alpha"], [f"{s}/term"], name=f"{s}/term"),
                      helper.make_node("Add", [h, f"{s}/term"], [s], name=s)]
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return model


def _crossing_computed(model):
    from qtool import model as qmodel
    from qtool.collection import collect, segments

    types = qmodel.tensor_types(model)
    names = qmodel.activation_tensors(model, types)
    fetched = [n for n in names if n not in collect.derivations(model, names, types)]
    exposed = qmodel.with_outputs(model, fetched, types)
    computed = segments._computed(segments.order(exposed), exposed.graph, {o.name for o in exposed.graph.output})
    return {t for t in computed if t.endswith(("/centred", "/adain"))}, exposed, fetched, types


def test_kokoro_s_adain_centred_input_and_output_read_by_mul_and_div_block_no_cut(tmp_path, monkeypatch):
    """kokoro_ja_int8 (2.70x plain inference's peak RSS): each AdaIN's centred input (read by Mul(d, d) and Div(d, std))
    and output (read by the Snake's Mul by its alphas and Add), which collect computes, crossed every position of a
    resblock; the six 92.5 MB segments of its largest file made the peak. They no longer block cuts, and the file is
    the one session's."""
    import onnx
    from test_memk23 import _files
    from test_segments import _one_session_and_segments_write_one_file

    from qtool.collection import segments

    model = _snake_adain()
    found, exposed, fetched, types = _crossing_computed(model)
    assert found == {f"/res{b}/{t}" for b in range(4) for t in ("centred", "adain")}, found
    assert len(segments.cuts(exposed, fetched, dict.fromkeys(fetched, 1), 4, types)) >= 8
    path = tmp_path / "snake.onnx"
    onnx.save(model, path)
    _one_session_and_segments_write_one_file(path, _files(tmp_path), tmp_path, monkeypatch)


def test_a_mul_by_a_scalar_constant_still_blocks_a_cut():
    """A Mul or Div by a constant of one value may go into a MatMul after it (MatMulScaleFusion), pass after pass
    through a chain of them: the AdaIN output a scalar Snake reads still counts as crossing."""
    found, *_ = _crossing_computed(_snake_adain(scalar=True))
    assert found == {f"/res{b}/centred" for b in range(4)}, found
    from onnx import helper

    folded = _snake_adain(scalar=True)  # the alpha a node makes of the constant: onnxruntime folds it into one
    nodes = list(folded.graph.node)
    for k, n in enumerate(nodes):
        if n.name.endswith("/ax"):
            nodes.insert(k, helper.make_node("Identity", [n.input[1]], [n.input[1] + "/copy"]))
            n.input[1] += "/copy"
            break
    del folded.graph.node[:]
    folded.graph.node.extend(nodes)
    found, *_ = _crossing_computed(folded)
    assert found == {f"/res{b}/centred" for b in range(4)}, found  # res0 too
