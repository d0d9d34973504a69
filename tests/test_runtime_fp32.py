"""`qtool evaluate --runtime`: the runtime also runs the FP32 model, and a gap between its int8 run
and the file's simulation is charged to the runtime's own FP32 where that accounts for it, to the
quantized layers where the run leaves the file otherwise.

The yardsticks are computed here: OpenVINO compiled directly (INFERENCE_PRECISION_HINT f32, as
cpu_kinds.PINNED_F32 states), onnxruntime's FP32, SQNR in float64.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from required import module
from runcli import invoke, ok

from qtool.checks import evaluation as ev
from qtool.checks import simulate
from qtool.quantizers import cpu_kinds
from qtool.runtime import openvino as openvino_runtime

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"
HELDOUT = ROOT / "sample_models" / "digits_heldout.npz"



def sqnr(ref, out) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum()))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    d = tmp_path_factory.mktemp("runtime_fp32")
    calib = d / "digits.calib.json"
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "-o", calib, "--limit", "64"))
    x = np.load(HELDOUT)["x"][:96]
    np.save(d / "held.npy", x)
    out = d / "digits.openvino.onnx"
    ok(invoke("-q", "export", "--target", "openvino", "--calib", calib, "-o", out))
    return {"dir": d, "calib": calib, "held": d / "held.npy", "x": x, "file": out}


# ---------------------------------------------------------------- the attribution rule


@pytest.mark.parametrize("simulated, run, fp32, own, expected", [
    (45.5, 6.0, 6.0, 44.1, "all"),  # madmom_beats_blstm: OpenVINO's FP32 6 dB from onnxruntime's; the file's error and it add up to the run
    (math.inf, 0.0, 0.0, math.inf, "all"),  # an unquantized output: the whole gap is the runtime's FP32
    (40.0, 30.0, 31.0, 40.5, "all"),  # against its own FP32 the run is the file's
    (40.0, 20.0, 60.0, 22.0, "part"),  # its FP32 moves it by 2 dB, its int8 kernels by far more
    (40.1, 36.7, 129.6, 36.7, None),  # open_nsfw_tf: its FP32 is onnxruntime's (129.6 dB); the gap is not its FP32's
    (30.0, 31.4, 130.0, 31.4, None),  # better than the file (a fusion skips a rounding): not its FP32's either
    (30.0, math.nan, 20.0, 30.0, None),
])
def test_the_runtimes_fp32_accounts_for_a_gap_only_where_it_moves_the_run(simulated, run, fp32, own, expected):
    assert ev.runtime_floor(simulated, run, fp32, own) == expected


def _outputs(*values):
    return [ev.OutputMetrics(f"o{i}", v, 1.0, None, 8) for i, v in enumerate(values)]


def test_the_warning_charges_the_gap_to_the_runtime_or_names_the_layers(monkeypatch):
    monkeypatch.setattr(cpu_kinds, "vnni", lambda: True)
    departures = [ev.Departure("conv2", "c2", 41.0, 80.0), ev.Departure("conv5", "c5", 35.0, 60.0)]
    warnings = ev.runtime_warnings("openvino", _outputs(45.5, 40.0, 40.0), _outputs(6.0, 20.0, 40.5),
                                   None, _outputs(6.0, 60.0, 130.0), _outputs(44.1, 22.0, 40.5), departures)
    assert [w.split("'")[1] for w in warnings] == ["o0", "o1"]  # o2: within 1 dB of the file
    assert warnings[0].endswith("the gap is openvino's float computation, not the file's"), warnings[0]
    assert "openvino runs the FP32 model itself 6.00 dB from onnxruntime's FP32" in warnings[0]
    assert "conv2" not in warnings[0]
    assert "still more than 1 dB from the file's" in warnings[1] and "conv2 (80.00 -> 41.00 dB), conv5 (60.00 -> 35.00 dB)" in warnings[1]
    # without the runtime's FP32 run (an older caller), the cause and the layers alone
    [w] = ev.runtime_warnings("openvino", _outputs(40.0), _outputs(20.0), None, None, None, departures)
    assert "FP32 model itself" not in w and "int8 kernels compute otherwise" in w and "conv2" in w


def test_departures_drop_from_the_quantized_inputs_to_the_output():
    d = ev.Departure("conv", "t", 41.0, math.inf)
    assert d.drop_db == pytest.approx(59.0) and d.to_json()["upstream_sqnr_db"] == "inf"


def test_a_departure_is_named_by_the_layer_above_value_moving_ops():
    """A PyTorch export casts each Conv's output: the layer named is the Conv, not the Cast."""
    from onnx import TensorProto, helper

    from qtool.model import graph as G

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1"), helper.make_node("Cast", ["c"], ["c32"], name="cast1", to=1),
             helper.make_node("Reshape", ["c32", "s"], ["r"], name="reshape1"), helper.make_node("Relu", ["r"], ["y"], name="relu1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    index = G.Index(helper.make_model(g))
    assert [ev._layer_of(index, t) for t in ("c", "c32", "r", "y")] == ["conv1", "conv1", "conv1", "relu1"]


# ---------------------------------------------------------------- OpenVINO on this CPU


def _reference(x, names):
    session = ort.InferenceSession(str(SAMPLE), providers=["CPUExecutionProvider"])
    return ev._Reference(lambda: iter([({"input": x[i:i + 32]}, len(x[i:i + 32])) for i in range(0, len(x), 32)]),
                         session, names)


def test_openvino_runs_the_fp32_model_beside_the_file(digits):
    """The runtime's floor is OpenVINO's FP32 run against onnxruntime's, and the int8 run is
    scored against OpenVINO's FP32 too: both as OpenVINO compiled directly gives them."""
    ov = module("openvino")
    r = ok(invoke("evaluate", SAMPLE, "--calib", digits["calib"], "--data", digits["held"], "--target", "openvino",
                  "--runtime", "openvino", "--json"))
    e = json.loads(r.stdout)
    core = ov.Core()
    x = digits["x"]
    ref = ort.InferenceSession(str(SAMPLE), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    fp32 = core.compile_model(core.read_model(str(SAMPLE)), "CPU", cpu_kinds.PINNED_F32)(x)[0]
    int8 = core.compile_model(core.read_model(str(digits["file"])), "CPU", cpu_kinds.PINNED_F32)(x)[0]
    rt = e["runtime"]
    assert abs(rt["fp32_sqnr_db"] - sqnr(ref, fp32)) < 1e-3 and rt["fp32_sqnr_db"] > 80, rt  # OpenVINO's FP32 is onnxruntime's here
    assert abs(rt["vs_own_fp32_sqnr_db"] - sqnr(fp32, int8)) < 1e-3, rt
    (o,) = rt["outputs"]
    assert o["fp32_sqnr_db"] == rt["fp32_sqnr_db"] and o["vs_own_fp32_sqnr_db"] == rt["vs_own_fp32_sqnr_db"]
    for w in e["warnings"]:  # the sample's gap (a fusion skips a rounding) is not OpenVINO's FP32
        assert "the gap is openvino's float computation" not in w, w
    text = ok(invoke("evaluate", SAMPLE, "--calib", digits["calib"], "--data", digits["held"], "--target", "openvino",
                     "--runtime", "openvino")).stdout
    assert "openvino FP32 dB" in text and "vs openvino FP32 dB" in text and "the runtime's own floor" in text


def test_a_runtime_whose_fp32_differs_is_charged_with_the_gap(digits, monkeypatch):
    """OpenVINO's real sessions with the same output error added to the int8 and the FP32 run (as
    a runtime's float kernels would, in both): the gap is said to be OpenVINO's, not the file's."""
    module("openvino")
    real = simulate.runtime

    class Skewed:
        def __init__(self, session):
            self.session = session
            self.static = getattr(session, "static", "")

        def run(self, names, feeds):
            out = self.session.run(names, feeds)
            x = feeds["input"].reshape(len(feeds["input"]), -1).astype(np.float64)
            skew = np.sin(x.sum(axis=1, keepdims=True) + np.arange(out[0].shape[1]))  # the same for both runs of a sample
            return [(out[0] + 3.0 * skew * np.abs(out[0]).max()).astype(out[0].dtype)]

    monkeypatch.setattr(simulate, "runtime", lambda name, data, like=None, **kw: Skewed(real(name, data, like, **kw)))
    r = ok(invoke("evaluate", SAMPLE, "--calib", digits["calib"], "--data", digits["held"], "--target", "openvino",
                  "--runtime", "openvino", "--json"))
    e = json.loads(r.stdout)
    rt = e["runtime"]
    assert rt["fp32_sqnr_db"] < 0 and rt["sqnr_db"] < e["sqnr_db"] - 10, rt
    [w] = [w for w in e["warnings"] if w.startswith("output 'logits'")]
    assert w.endswith("the gap is openvino's float computation, not the file's"), w
    assert rt["departures"] == []  # no layers to name: its FP32 accounts for the gap


def test_departures_name_the_layers_where_openvino_leaves_the_file(digits):
    """Fetched at every quantized layer's output, OpenVINO's run of the sample's file leaves the
    simulation somewhere (its fusions: a FakeQuantize fused between a Conv and an Add is not
    rounded; float rounding elsewhere): the layers named are int8 layers of the file, each below
    the quantized tensors feeding it, worst first."""
    module("openvino")
    data = digits["file"].read_bytes()
    proto = onnx.load_model_from_string(data)
    taps = ev.layer_taps(proto)
    producers = {o: n for n in proto.graph.node for o in n.output}
    assert taps and all(simulate.is_fake_quantize(n) for t in taps for n in proto.graph.node if t in n.input[:1])
    assert any(up for up in taps.values()) and all(u in taps for up in taps.values() for u in up)
    found = ev.departures(_reference(digits["x"], ["logits"]), data, "openvino", None)
    assert found and len(found) <= ev.DEPARTURES, found
    assert [d.drop_db for d in found] == sorted((d.drop_db for d in found), reverse=True)
    for d in found:
        assert taps[d.tensor] and d.drop_db > 0 and producers[d.tensor].name == d.layer  # the sample has no Cast after a layer
        assert math.isfinite(d.sqnr_db) and d.sqnr_db < 100


def test_a_departure_is_confirmed_fetched_alone(digits, monkeypatch):
    """A runtime fetching several tensors may hand one back as something else left its buffer (OpenVINO 2026.4: zeros
    for ppocrv6_tiny_det's GlobalAveragePool outputs fetched beside the Conv output they pool, their values right
    fetched alone): a layer is named only when its departure holds, it and its quantized inputs each fetched alone."""
    module("openvino")
    data = digits["file"].read_bytes()
    taps = ev.layer_taps(onnx.load_model_from_string(data))
    victim = next(t for t, up in taps.items() if up)
    real = simulate.runtime

    class Zeroing:  # the real run, but `victim` zeros when fetched beside anything
        def __init__(self, session):
            self.session, self.static = session, getattr(session, "static", "")

        def run(self, names, feeds):
            out = self.session.run(names, feeds)
            if len(names) > 1:
                out = [np.zeros_like(np.asarray(x)) if n == victim else x for n, x in zip(names, out)]
            return out

        def __getattr__(self, name):
            return getattr(self.session, name)

    monkeypatch.setattr(simulate, "runtime", lambda name, data, like=None, **kw: Zeroing(real(name, data, like=like, **kw)))
    found = ev.departures(_reference(digits["x"], ["logits"]), data, "openvino", None)
    # 0 dB fetched beside the others, the worst were it not measured again; alone, its own figure (a departure or not)
    assert found and all(d.drop_db > 0 and 10 < d.sqnr_db < 100 for d in found), found


@pytest.mark.parametrize("when", ["compile", "run"])
def test_a_runtime_that_cannot_run_the_fp32_model_still_scores_the_file(digits, monkeypatch, when):
    """The FP32 model refused by the runtime (where the file runs): the file's figures as before,
    no floor, and a warning saying why."""
    module("openvino")
    real = simulate.runtime

    class Refusing:
        static = ""

        def run(self, names, feeds):
            raise ev.QtoolError("OpenVINO failed on inputs of shape {'input': [32, 1, 28, 28]}: refused here")

    def runtime(name, data, like=None, float_only=False):
        if like is None:
            return real(name, data)
        if when == "compile":
            raise ev.QtoolError("OpenVINO cannot compile the model: refused here")
        return Refusing()

    monkeypatch.setattr(simulate, "runtime", runtime)
    e = json.loads(ok(invoke("evaluate", SAMPLE, "--calib", digits["calib"], "--data", digits["held"], "--target", "openvino",
                             "--runtime", "openvino", "--json")).stdout)
    rt = e["runtime"]
    assert rt["fp32_sqnr_db"] is None and rt["vs_own_fp32_sqnr_db"] is None and math.isfinite(rt["sqnr_db"]), rt
    [w] = [w for w in e["warnings"] if "could not run the FP32 model" in w]
    assert "its own floor is not reported" in w and "refused here" in w


def test_departures_fetch_in_passes_of_bounded_bytes_and_name_the_same_layers(digits, monkeypatch):
    """The quantized layers' outputs are fetched in passes of at most `budget` bytes per run (their sizes by OpenVINO's
    shape inference), not all at once (a 1024x1024 detector's held 8.5 GB): the layers named and their figures are
    those of one pass."""
    module("openvino")
    data = digits["file"].read_bytes()
    one = ev.departures(_reference(digits["x"], ["logits"]), data, "openvino", None, budget=1 << 40)
    taps = list(ev.layer_taps(onnx.load_model_from_string(data)))
    probed = simulate.with_outputs(onnx.load_model_from_string(data), taps)
    sizes = openvino_runtime.output_bytes(probed.SerializeToString(), {"input": digits["x"][:32]})
    assert set(taps) <= set(sizes) and all(v > 0 for v in sizes.values())
    budget = max(sizes[t] for t in taps)  # the largest alone: several passes
    seen = []
    real = ev._groups
    monkeypatch.setattr(ev, "_groups", lambda *a: seen.append(real(*a)) or seen[-1])
    many = ev.departures(_reference(digits["x"], ["logits"]), data, "openvino", None, budget=budget)
    [groups] = seen
    assert len(groups) > 1 and sum(groups, []) == taps
    assert all(sum(sizes[t] for t in g) <= budget for g in groups)
    assert [(d.layer, round(d.sqnr_db, 6), round(d.upstream_db, 6)) for d in many] == \
        [(d.layer, round(d.sqnr_db, 6), round(d.upstream_db, 6)) for d in one]


def test_departures_sums_are_evaluates():
    """departures' streamed float64 sums (_Noise) give evaluate's SQNR (_Acc), non-finite values as it treats them."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(3, 700_000)).astype(np.float32)  # more than one block
    out = ref + rng.normal(scale=0.01, size=ref.shape).astype(np.float32)
    ref[0, :5] = np.nan
    for o in (out, np.where(np.arange(out.size).reshape(out.shape) == 7, np.inf, out).astype(np.float32)):
        acc, noise = ev._Acc(), ev._Noise()
        acc.update(ref, o)
        noise.update(ref, o)
        assert noise.sqnr() == pytest.approx(acc.sqnr(), abs=1e-9) or noise.sqnr() == acc.sqnr() == -math.inf


def test_departures_run_on_an_opset_9_file():
    """The simulation converts an opset-9 file to opset 11 (Round) before the tensors departures fetches are added as
    outputs (a graph output of no shape fails the conversion: lore_detect's file, "Field 'shape' of 'type' is
    required")."""
    module("openvino")
    from test_simulate import sum_block

    m = sum_block()
    m.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, 16, 24, 24]))
    del m.opset_import[:]
    m.opset_import.extend([onnx.helper.make_opsetid("", 9), onnx.helper.make_opsetid("org.openvinotoolkit", 1)])
    rng = np.random.default_rng(5)

    class Feeds:
        def feeds(self):
            yield {"x": rng.uniform(0, 1, (1, 16, 24, 24)).astype(np.float32), "y": rng.normal(0, 0.4, (1, 16, 24, 24)).astype(np.float32)}

    found = ev.departures(Feeds(), m.SerializeToString(), "openvino", None)  # before: a QtoolError on the conversion
    assert all(d.tensor in ("sum", "biased") and math.isfinite(d.sqnr_db) for d in found), found
