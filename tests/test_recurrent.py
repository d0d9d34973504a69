"""Recurrent nets (issue 49, classes 3 and 4) on a look-alike of Silero VAD's sequence model (tests/zoo.py
stft_lstm_vad_like): an STFT magnitude, a Conv encoder and an LSTM over the time-first axis with its h/c
states as inputs and outputs; and of ddddocr's beta captcha reader (crnn_bilstm_like): a Conv encoder and a
bidirectional LSTM with zero initial states."""

from __future__ import annotations

import subprocess
import sys

import avx2
import numpy as np
import onnx
import pytest
import required
import zoo

import qtool
from qtool.quantizers import cpu_kinds
from qtool.quantizers.placement import recurrent

HIDDEN = 16


def _blocks(rng, n):
    """Audio-like blocks [time, 64]: a few tones whose loudness changes block to block by tens of dB, a little noise."""
    feeds = []
    for _ in range(n):
        blocks = int(rng.integers(24, 40))
        t = np.arange(blocks * 64) / 8000
        loudness = np.repeat(np.exp(rng.normal(-2, 1.2, blocks)), 64)
        f = rng.uniform(200, 3000, 3)
        x = loudness * (np.sin(2 * np.pi * f[0] * t) + 0.5 * np.sin(2 * np.pi * f[1] * t + 1) + 0.3 * np.sin(2 * np.pi * f[2] * t))
        x = x + rng.normal(0, 0.003, x.size)
        zeros = np.zeros((1, 1, HIDDEN), np.float32)
        feeds.append({"input": x.reshape(blocks, 64).astype(np.float32), "h": zeros, "c": zeros})
    return feeds


@pytest.fixture(scope="module")
def vad():
    model = zoo.stft_lstm_vad_like(hidden=HIDDEN)
    feeds = _blocks(np.random.default_rng(3), 36)
    return model, qtool.calibrate(model, data=feeds[:24]), feeds[24:]


def _quantized(data: bytes) -> set[str]:
    m = onnx.load_from_string(data)
    return {n.input[0] for n in m.graph.node if n.op_type in ("FakeQuantize", "QuantizeLinear")}


@pytest.fixture(scope="module")
def crnn():
    return _crnn(zoo.crnn_bilstm_like())


@pytest.fixture(scope="module")
def crnn_computed():
    """The same reader, its LSTM's W and R reordered from Paddle's gate order by a Split and a Concat (paddle2onnx's
    PP-OCRv2 recogniser): read as the constants they are (qtool.model.folding), else the LSTM stayed f32 in
    OpenVINO where NNCF's ran u8 (qtool's file 1.08x NNCF's time)."""
    return _crnn(zoo.crnn_bilstm_like(computed_weights=True))


def _crnn(model):
    rng = np.random.default_rng(5)
    feeds = []
    for _ in range(24):  # strokes on a noisy background, widths as captchas vary
        width = int(rng.integers(12, 24)) * 2
        image = rng.uniform(0, 0.2, (1, 1, 8, width))
        for col in rng.choice(width, width // 3, replace=False):
            image[0, 0, rng.integers(0, 4):rng.integers(4, 8), col] += rng.uniform(0.5, 1.0)
        feeds.append({"input1": image.astype(np.float32)})
    return model, qtool.calibrate(model, data=feeds[:16]), feeds[16:]


@pytest.mark.parametrize("target", ["openvino", "qdq", "tensorrt"])
def test_no_quantizer_on_the_squares_of_a_magnitude_and_the_lstm_float_but_for_openvino(vad, target):
    """sqrt(re^2 + im^2): the squares span twice their roots' dynamic range, so no quantizer goes on them (the Add of
    the magnitude computes in float; the Sqrt output is quantized for the Conv that reads it). The LSTM keeps its
    inputs, weights and states float on onnxruntime and TensorRT; OpenVINO reads its input and initial hidden state
    through FakeQuantize nodes onto one grid, and its weights as int8 (test_openvino_runs_the_lstm_in_int8), in the
    default file (any CPU) as in --cpu vnni's."""
    model, cal, _ = vad
    data = qtool.export(model, cal, target=target)
    quantized = _quantized(data)
    assert not {"/stft/Pow_output_0", "/stft/Pow_1_output_0"} & quantized
    lstm = next(n for n in onnx.load_from_string(data).graph.node if n.op_type == "LSTM")
    if target == "openvino":
        vnni = next(n for n in onnx.load_from_string(qtool.export(model, cal, target=target, cpu="vnni")).graph.node if n.op_type == "LSTM")
        assert vnni.input[1:4] != ["lstm.W", "lstm.R", "lstm.B"] and vnni.input[6] == "c"
        assert {"/Transpose_output_0", "h"} <= quantized and "c" not in quantized
        assert lstm.input[1:4] != ["lstm.W", "lstm.R", "lstm.B"] and lstm.input[6] == "c"
    else:
        assert not {"/Transpose_output_0", "h", "c", "lstm.W", "lstm.R", "lstm.B"} & quantized
        assert list(lstm.input[1:4]) == ["lstm.W", "lstm.R", "lstm.B"]
    if target != "tensorrt":  # the CPU rules quantize the magnitude where the encoder's Conv reads it
        assert "/stft/Sqrt_output_0" in quantized


@pytest.mark.parametrize("case", ["vad", "crnn"])
def test_openvino_lstm_file_layout(case, request):
    """The LSTM's input through one FakeQuantize from its own range onto the hidden state's grid (zero point 128; |h| < 1,
    the grid at most recurrent.WIDENINGS' widest),
    the initial state (a graph input) through that grid, W and R int8 times one scale of [1, 4H, 1], the same for
    the four gates (OpenVINO's CPU plugin takes only W's scales, not reordered with its gates). In the default file
    (any CPU) no pair of a row's codes (inputs 2p, 2p + 1) sums past 128 of one sign: 255 x 128 fits int16, where AVX2's
    vpmaddubsw sums a pair of u8 x s8 products; the --cpu vnni file's pairs reach past it."""
    model, cal, _ = request.getfixturevalue(case)
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {o: n for n in m.graph.node for o in n.output}
    lstm = next(n for n in m.graph.node if n.op_type == "LSTM")
    fq = made[lstm.input[0]]
    assert fq.op_type == "FakeQuantize"
    il, ih, ol, oh = (float(inits[t]) for t in fq.input[1:])
    step = (oh - ol) / 255
    assert ol == pytest.approx(-128 * step, rel=1e-6) and 0 < oh <= max(recurrent.WIDENINGS) + 1e-6 and (il, ih) != (ol, oh)
    if case == "vad":
        state = made[lstm.input[5]]
        assert state.op_type == "FakeQuantize" and [float(inits[t]) for t in state.input[1:]] == [ol, oh, ol, oh]
    scales = set()
    for slot in (1, 2):
        mul = made[lstm.input[slot]]
        cast = made[mul.input[0]]
        assert mul.op_type == "Mul" and cast.op_type == "Cast" and inits[cast.input[0]].dtype == np.int8
        scales.add(mul.input[1])
    (scale,) = scales
    hidden = lstm.attribute[[a.name for a in lstm.attribute].index("hidden_size")].i
    assert inits[scale].shape == (1, 4 * hidden, 1)
    gates = inits[scale].reshape(4, hidden)
    assert np.all(gates == gates[0])
    codes = [inits[made[made[lstm.input[slot]].input[0]].input[0]].astype(np.float64) for slot in (1, 2)]
    assert max(recurrent.pair_bound(c).max() for c in codes) <= 128
    vnni = onnx.load_from_string(qtool.export(model, cal, target="openvino", cpu="vnni"))
    assert max(recurrent.pair_bound(onnx.numpy_helper.to_array(t).astype(np.float64)).max()
               for t in vnni.graph.initializer if t.data_type == onnx.TensorProto.INT8) > 128


@pytest.mark.parametrize("cpu", ["any", "vnni"])
@pytest.mark.parametrize("case", ["vad", "crnn", "crnn_computed"])
def test_openvino_runs_the_lstm_in_int8(case, cpu, request):
    """OpenVINO runs the file's LSTM in int8 (a u8 RNNSeq; both directions of the bidirectional one), computing
    the file's numbers within 1 dB: per gate and direction scales, OpenVINO ran the look-alike VAD's LSTM apart
    from the file and kept the bidirectional one f32. Before, both ran f32 (ddddocr_beta 1.5x NNCF's latency).
    The default file (any CPU) on every CPU, --cpu vnni's on one with VNNI (test_avx2_kernels_compute_the_default_file)."""
    required.module("openvino")
    import openvino as ov

    model, cal, held = request.getfixturevalue(case)
    data = qtool.export(model, cal, target="openvino", cpu=cpu)
    core = ov.Core()
    compiled = core.compile_model(core.read_model(data, b""), "CPU", cpu_kinds.PINNED_F32)
    rnn = [str(op.get_rt_info()["runtimePrecision"].astype(str)) for op in compiled.get_runtime_model().get_ops()
           if str(op.get_rt_info()["layerType"].astype(str)) == "RNNSeq"]
    assert rnn == ["u8"] * (2 if case.startswith("crnn") else 1), rnn
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino", cpu=cpu)
    exact = {o.name: o.sqnr_db for o in result.outputs}
    run = {o.name: o.sqnr_db for o in result.runtime.outputs}
    assert min(exact.values()) > 20, exact
    if cpu == "any" or cpu_kinds.vnni():  # without VNNI, --cpu vnni's pairs of u8 x s8 products can saturate
        assert all(abs(run[k] - exact[k]) < 1.0 for k in exact), (exact, run)


def test_states_of_the_lstm_keep_their_precision(vad):
    """The speech probabilities and the LSTM's final states, in the file's exact arithmetic and run by OpenVINO:
    with the squares quantized the states were at 13 dB (speech 38 dB); the magnitude in float gives 27 (52)."""
    required.module("openvino")
    model, cal, held = vad
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino")
    exact = {o.name: o.sqnr_db for o in result.outputs}
    run = {o.name: o.sqnr_db for o in result.runtime.outputs}
    assert min(exact["hn"], exact["cn"]) > 20 and exact["speech_probs"] > 45, exact
    assert all(abs(run[k] - exact[k]) < 1.0 for k in exact), (exact, run)


def _bilstm(states: str, hidden=8, feat=16) -> onnx.ModelProto:
    """x [time, batch, 16], the batch dynamic -> a bidirectional LSTM, its initial states none ("absent") or zeros of
    [2, batch, hidden] made from x's shape ("zeros", as tf2onnx and torch exports make them)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, s).astype(np.float32), n)
             for n, s in (("W", (2, 4 * hidden, feat)), ("R", (2, 4 * hidden, hidden)), ("B", (2, 8 * hidden)))]
    nodes, lstm_in = [], ["x", "W", "R", "B"]
    if states == "zeros":
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("one", [1]), ("two", [2]), ("hidden", [hidden]))]
        nodes += [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["batch"], axis=0),
                  helper.make_node("Concat", ["two", "batch", "hidden"], ["dims"], axis=0),
                  helper.make_node("ConstantOfShape", ["dims"], ["zeros"], value=numpy_helper.from_array(np.zeros(1, np.float32)))]
        lstm_in += ["", "zeros", "zeros"]
    nodes.append(helper.make_node("LSTM", lstm_in, ["Y"], name="bilstm", hidden_size=hidden, direction="bidirectional"))
    graph = helper.make_graph(nodes, "bilstm", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["time", "batch", feat])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["time", 2, "batch", hidden])], inits)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize("states", ["absent", "zeros"])
def test_openvino_int8_lstm_of_a_dynamic_batch(states):
    """Initial states OpenVINO cannot fold into a constant (zeros of a dynamic batch, or none): read as float they
    fail the CPU plugin's int8 pattern and OpenVINO 2026.4 refused the file ("expects Constant for port 4"). Read
    through the grid's FakeQuantize (made from x's shape where there are none) it runs both directions in u8,
    computing the file's numbers."""
    required.module("openvino")
    import openvino as ov

    model = _bilstm(states)
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.normal(0, 1, (10 + i, 2, 16)).astype(np.float32)} for i in range(8)]
    cal = qtool.calibrate(model, data=feeds[:5])
    data = qtool.export(model, cal, target="openvino")
    core = ov.Core()
    compiled = core.compile_model(core.read_model(data, b""), "CPU", cpu_kinds.PINNED_F32)
    rnn = [str(op.get_rt_info()["runtimePrecision"].astype(str)) for op in compiled.get_runtime_model().get_ops()
           if str(op.get_rt_info()["layerType"].astype(str)) == "RNNSeq"]
    assert rnn == ["u8", "u8"], rnn
    result = qtool.evaluate(model, cal, data=feeds[5:], target="openvino", runtime="openvino")
    exact, run = result.outputs[0].sqnr_db, result.runtime.outputs[0].sqnr_db
    assert exact > 25 and abs(run - exact) < 0.1, (exact, run)


# OpenVINO on the feeds of an .npz (key i/name), each model's outputs into another .npz (key model/i/output)
_RUN = """
import sys
import numpy as np
import openvino as ov
feeds, out, *models = sys.argv[1:]
z = np.load(feeds)
n = max(int(k.split("/")[0]) for k in z.files) + 1
core, got = ov.Core(), {}
for m, path in enumerate(models):
    compiled = core.compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    for i in range(n):
        res = compiled({k.split("/", 1)[1]: z[k] for k in z.files if k.split("/")[0] == str(i)})
        for j, o in enumerate(compiled.outputs):
            got[f"{m}/{i}/{j}"] = np.asarray(res[o])
np.savez(out, **got)
"""


@pytest.mark.parametrize("hidden, feat", [(8, 16), (7, 13)])  # odd counts: the last input pairs with the kernel's zero padding
def test_avx2_kernels_compute_the_default_file(tmp_path, hidden, feat):
    """oneDNN held to its AVX2 kernels (tests/avx2.py run_onednn_avx2: no VNNI, the u8 x s8 products summed in pairs in
    int16 by vpmaddubsw) runs the default file's int8 LSTM (any CPU: its weights' pairs bounded) to the same numbers as
    this CPU's own kernels (and the file's, test_openvino_runs_the_lstm_in_int8); --cpu vnni's file, whose weights' pairs
    are not bounded, it runs otherwise (52 dB from the VNNI kernels' numbers). Under QEMU's Haswell neither would do."""
    required.module("openvino")
    if not avx2.is_x86():
        pytest.skip("x86 int8 kernels only")
    model = _bilstm("zeros", hidden, feat)
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.normal(0, 1, (10 + i, 2, feat)).astype(np.float32)} for i in range(8)]
    cal = qtool.calibrate(model, data=feeds[:5])
    paths = []
    for cpu in ("any", "vnni"):
        paths.append(tmp_path / f"bilstm.{cpu}.onnx")
        paths[-1].write_bytes(qtool.export(model, cal, target="openvino", cpu=cpu))
    np.savez(tmp_path / "feeds.npz", **{f"{i}/{k}": v for i, f in enumerate(feeds[5:]) for k, v in f.items()})
    (tmp_path / "run.py").write_text(_RUN)
    subprocess.run([sys.executable, tmp_path / "run.py", tmp_path / "feeds.npz", tmp_path / "here.npz", *paths], check=True,
                   capture_output=True)
    ran = avx2.run_onednn_avx2(tmp_path / "run.py", tmp_path / "feeds.npz", tmp_path / "avx2.npz", *paths)
    kernels = {line.split(",")[6] for line in ran.stdout.splitlines() if line.startswith("onednn_verbose") and ",exec,cpu,rnn," in line}
    assert kernels == {"brgemm:avx2"}, kernels
    here, held = np.load(tmp_path / "here.npz"), np.load(tmp_path / "avx2.npz")

    def sqnr(m):
        a = np.concatenate([here[k].ravel() for k in here.files if k.startswith(f"{m}/")]).astype(np.float64)
        b = np.concatenate([held[k].ravel() for k in here.files if k.startswith(f"{m}/")]).astype(np.float64)
        return 10 * np.log10(np.sum(a ** 2) / max(np.sum((a - b) ** 2), 1e-300))

    assert sqnr(0) > 100, sqnr(0)
    if cpu_kinds.vnni():  # here the VNNI kernels: the unbounded pairs saturate only in the AVX2 ones
        assert sqnr(1) < 80, sqnr(1)


def test_an_lstm_stating_its_activations_stays_float():
    """tf2onnx states the default activations; OpenVINO 2026.4 then runs the LSTM as a TensorIterator in f32
    (thai_oskut_ws), so its int8 form would cost precision for nothing: no quantizer on it."""
    model = _bilstm("absent")
    lstm = model.graph.node[-1]
    lstm.attribute.append(onnx.helper.make_attribute("activations", ["Sigmoid", "Tanh", "Tanh"] * 2))
    rng = np.random.default_rng(7)
    cal = qtool.calibrate(model, data=[{"x": rng.normal(0, 1, (10, 2, 16)).astype(np.float32)} for _ in range(3)])
    with pytest.raises(qtool.QtoolError, match="would quantize nothing"):
        qtool.export(model, cal, target="openvino")


@pytest.mark.parametrize("direction", ["bidirectional", "forward"])
def test_two_lstms_of_one_shape_both_run_int8(direction):
    """Stacked LSTMs whose W and R have the same shapes (a bidirectional one's input 2 x hidden, brainmaze's seizure
    detector): OpenVINO 2026.4 ran the second int8 one with the first's weights or quantization (-0.4 dB where the
    file computes 33.6; bench/openvino_quirks.py case 8), as its runtime cache keys an RNN by shapes, not scales. The
    second's input padded with a zero feature (and W with a zero column) gets a primitive of its own: both are int8
    (before, the second stayed f32: 1.25-1.5x NNCF's latency) and the run is the file's."""
    required.module("openvino")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden = 8
    dirs = 2 if direction == "bidirectional" else 1
    feat = dirs * hidden

    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    inits = [w(f"{p}{k}", dirs, 4 * hidden, feat if p == "W" else hidden) for k in (1, 2) for p in ("W", "R")]
    inits += [w(f"B{k}", dirs, 8 * hidden, scale=0.1) for k in (1, 2)] + [w("fc", feat, 4)]
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"))
    nodes = []
    x = "x"
    for k in (1, 2):
        nodes += [helper.make_node("LSTM", [x, f"W{k}", f"R{k}", f"B{k}"], [f"Y{k}"], name=f"lstm{k}", hidden_size=hidden,
                                   direction=direction),
                  helper.make_node("Transpose", [f"Y{k}"], [f"T{k}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"T{k}", "shape"], [f"X{k}"])]
        x = f"X{k}"
    nodes.append(helper.make_node("MatMul", [x, "fc"], ["out"], name="fc"))
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["time", 1, feat])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cal = qtool.calibrate(model, data=[{"x": rng.normal(0, 1, (20, 1, feat)).astype(np.float32)} for _ in range(8)])
    held = [{"x": rng.normal(0, 1, (20, 1, feat)).astype(np.float32)} for _ in range(4)]
    result = qtool.evaluate(model, cal, data=held, target="openvino", runtime="openvino")
    assert result.plan_summary.get("int8_lstm") == ["lstm1", "lstm2"], result.plan_summary.get("int8_lstm")
    exact, run = result.outputs[0].sqnr_db, result.runtime.outputs[0].sqnr_db
    assert exact > 25 and abs(run - exact) < 1.0, (exact, run)
    written = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    pads = [n for n in written.graph.node if n.op_type == "Pad"]
    assert len(pads) == 1 and pads[0].name.startswith("lstm2/"), [n.name for n in pads]


def test_lstms_sharing_a_width_get_widths_no_other_has():
    """The zero features each LSTM after the first of its (directions, hidden size, input width) gets: the fewest that
    give it a width no other int8 LSTM has, its natural one or an earlier padded one."""
    def site(name, dirs, hidden, width):
        codes = np.zeros((dirs, 4 * hidden, width), np.int8)
        return recurrent.RecurrentSite(name, (-1.0, 1.0), (-1.0, 1.0), None, codes, codes[..., :hidden],
                                       np.ones((1, 4 * hidden, 1), np.float32), np.zeros((dirs, 8 * hidden), np.float32))

    sites = [site("a", 2, 8, 16), site("b", 2, 8, 16), site("c", 2, 8, 17), site("d", 2, 8, 16), site("e", 1, 8, 16)]
    assert {s.node: s.pad for s in recurrent._padded(sites)} == {"a": 0, "b": 2, "c": 0, "d": 3, "e": 0}


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_an_lstm_of_a_static_batch_without_a_state_gets_none(direction):
    """x [time, 1, 8] (batch fixed) -> an LSTM without initial states: the zeros the export made from X's shape, on a
    fixed batch, OpenVINO 2026.4 folded with their FakeQuantize into a constant, and a forward LSTM so fed ran 0.8 dB
    from the file's arithmetic. Left without a state, it runs the file's numbers (in u8)."""
    required.module("openvino")
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden, feat, dirs = 16, 8, 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), n) for n, shape, s in
             (("W", (dirs, 4 * hidden, feat), 0.3), ("R", (dirs, 4 * hidden, hidden), 0.3), ("B", (dirs, 8 * hidden), 0.1))]
    graph = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], name="lstm", hidden_size=hidden, direction=direction)],
                              "static", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["time", 1, feat])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    cal = qtool.calibrate(model, data=[{"x": rng.normal(0, 1, (30, 1, feat)).astype(np.float32)} for _ in range(8)])
    result = qtool.evaluate(model, cal, data=[{"x": rng.normal(0, 1, (30, 1, feat)).astype(np.float32)} for _ in range(4)],
                            target="openvino", runtime="openvino")
    assert result.plan_summary.get("int8_lstm") == ["lstm"]
    exact, run = result.outputs[0].sqnr_db, result.runtime.outputs[0].sqnr_db
    assert exact > 25 and abs(run - exact) < 0.1, (exact, run)
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    assert not any(n.op_type == "ConstantOfShape" for n in m.graph.node)


def test_zero_of_the_lstm_input_lands_on_a_code():
    """An embedding whose entries are mostly exactly 0 (text2tashkeel's rawi_v3: 9 values of 10) into a BiLSTM: X's
    FakeQuantize maps 0 onto a code. Its symmetric range put 0 half way between two codes, every zero
    read back half a step off: the look-alike at 28.9 dB in the file's arithmetic (34.9 now), rawi_v3 at 17.6 (20.7)."""
    model = zoo.embedding_bilstm_tagger_like(zeros=0.8)
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 40, (1, 20 + i)).astype(np.int64)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {o: n for n in m.graph.node for o in n.output}
    fq = made[next(n for n in m.graph.node if n.op_type == "LSTM").input[0]]
    il, ih, ol, oh = (float(inits[t]) for t in fq.input[1:])
    code = (0 - il) / (ih - il) * 255  # X's 0 on a code (128 where X reaches both ends: recurrent.x_levels)
    assert code == pytest.approx(round(code), abs=1e-4) and (0 - ol) / (oh - ol) * 255 == pytest.approx(128, abs=1e-4)
    assert qtool.evaluate(model, cal, data=feeds[16:], target="openvino").outputs[0].sqnr_db > 32


def test_lstm_whose_int8_costs_stays_float():
    """An embedding whose entries are small but for 0.5% of them (8, rare large values) into a BiLSTM whose W is large:
    on the hidden state's grid X's typical values round to a few codes, and the int8 LSTM leaves the tagger at 21.9 dB
    where the float one gives 38.9. Its simulated error (recurrent.simulate: 19.6 dB; 19.4 while a reverse direction ran
    over the draws in forward order) keeps it float on OpenVINO, and the export says so (a warning, the summary's float_lstm). Before, every plain LSTM ran int8. (W x 6 was this test's
    until X's range was narrowed to the side X reaches, recurrent.x_levels: its int8 went 19.7 -> 25.0 dB, simulated 22.3.)"""
    model = zoo.embedding_bilstm_tagger_like(zeros=0.8, hidden=16, gain=0.1, rare=0.005, w_gain=10.0)
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 40, (1, 20 + i)).astype(np.int64)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    lstm = next(n for n in onnx.load_from_string(qtool.export(model, cal, target="openvino")).graph.node if n.op_type == "LSTM")
    assert list(lstm.input[:3]) == ["et", "W", "R"]
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.outputs[0].sqnr_db > 35, result.outputs[0].sqnr_db
    assert "/lstm/LSTM" in result.plan_summary["float_lstm"] and "int8_lstm" not in result.plan_summary
    assert any("LSTM(s) stay float: /lstm/LSTM (int8 error" in w for w in result.warnings), result.warnings


def test_hidden_state_grid_widened_by_the_estimate():
    """x ~ N(0, 6) into a BiLSTM: X's range is ~6 x the hidden state's, so W / a (a = the grid's width / X's) is ~6 x
    R and, W and R sharing one scale per unit, R's codes are coarse. A grid of 1.5 x the calibrated max |h| (of
    recurrent.WIDENINGS, chosen by the estimated error) gives 28.2 dB in the file's arithmetic where the grid of max |h|
    gave 27.2 (the zoo: ddddocr_beta 25.9 -> 28.1, seizure_modelA 34.5 -> 39.3)."""
    model = _bilstm("zeros", 8, 16)
    rng = np.random.default_rng(7)
    feeds = [{"x": (rng.normal(0, 1, (10 + i, 2, 16)) * 6).astype(np.float32)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {o: n for n in m.graph.node for o in n.output}
    fq = made[next(n for n in m.graph.node if n.op_type == "LSTM").input[0]]
    high, h_max = float(inits[fq.input[4]]), next(t.absmax for t in cal.tensors if t.name == "Y")
    assert high > 1.2 * h_max, (high, h_max)
    assert qtool.evaluate(model, cal, data=feeds[16:], target="openvino").outputs[0].sqnr_db > 27.8


def test_export_of_nothing_but_a_float_lstm_says_why():
    """A model whose only op OpenVINO quantizes is an LSTM that its simulated error keeps float (heavy-tailed x: Student's
    t, 3 degrees, x 4; int8 at 16.5 dB, simulated 16.9; the one-step estimate, blind to X's clipped tail and to the error
    carried through time, 25.0, which ran it int8 at the floor of 20): the export refuses with one line naming the LSTM
    and why, not "no op of the model is one openvino quantizes"."""
    model = _bilstm("zeros", 8, 16)
    rng = np.random.default_rng(7)
    cal = qtool.calibrate(model, data=[{"x": (rng.standard_t(3, (10 + i, 2, 16)) * 4).astype(np.float32)} for i in range(16)])
    with pytest.raises(qtool.QtoolError, match=r"export would quantize nothing: its LSTM\(s\) stay float, .*bilstm: int8 error"):
        qtool.export(model, cal, target="openvino")


@pytest.mark.parametrize("offset", [-9.0, 0.0])
def test_lstm_before_a_score_in_a_sigmoids_tail(offset):
    """A wake-word head (tests/zoo.py lstm_wake_word_like: LSTM -> Dense -> Sigmoid): its score near 1e-4 (offset
    -9) is far in the sigmoid's tail, where the score's relative error is the logit's absolute one, ~19 dB more than
    the LSTM's own (recurrent.tail_gain_db): its int8 LSTM, estimated at 36 dB at its output, cost the score 5.7 dB
    (36.1 where the float LSTM gives 41.8; oww_hey_mycroft's second LSTM: 38 dB at its output, 28 dB at the score).
    The floor rises by that gain, so it stays float; with the score around 0.5 (offset 0) it runs int8."""
    model = zoo.lstm_wake_word_like(offset=offset)
    rng = np.random.default_rng(2)
    feeds = [{"frames": rng.normal(0, 1, (16 + i, 1, 16)).astype(np.float32)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    if offset:
        assert "int8_lstm" not in result.plan_summary, result.plan_summary
        assert "in a sigmoid's tail" in result.plan_summary["float_lstm"]["/lstm/LSTM"]
        assert result.outputs[0].sqnr_db > 39, result.outputs[0].sqnr_db
    else:
        assert result.plan_summary["int8_lstm"] == ["/lstm/LSTM"]


def test_lstm_at_the_error_of_an_int8_layer_runs_int8():
    """A mostly-zero embedding with rare large entries into a BiLSTM (text2tashkeel rawi_v3's first LSTM): its int8
    LSTM simulated at 24.8 dB (estimated 23.1; the model at 26.0 dB in the file's arithmetic, 29.1 since X's range is
    narrowed to the side it reaches, 37.1 with it float), in
    the 20-40 dB an int8 activation quantizer leaves at a linear layer's output (recurrent.MIN_SQNR_DB): it runs int8,
    as NNCF's does (at 6.0 dB on rawi_v3, where its float LSTM cost 1.3-1.7x NNCF's latency). Before, the floor (27)
    kept it float."""
    model = zoo.embedding_bilstm_tagger_like(zeros=0.9, hidden=16, gain=0.5, rare=0.002, w_gain=2.0)
    rng = np.random.default_rng(1)
    feeds = [{"ids": rng.integers(0, 40, (1, 20 + i)).astype(np.int64)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary.get("int8_lstm") == ["/lstm/LSTM"], result.plan_summary
    assert result.outputs[0].sqnr_db > 25, result.outputs[0].sqnr_db


def test_sigmoid_tail_gain_from_the_output_histogram():
    """tail_gain_db reads only the sigmoid output's histogram (z = log(y / (1 - y))): scores all near 1e-4 lose
    ~20 log10(|logit(1e-4)|) = 19.3 dB more than their logit; scores spread up to 1 lose less (below 0 dB); values
    outside [0, 1] are no sigmoid's (None)."""
    from qtool.calibration import TensorRecord

    def record(values):
        values = np.asarray(values, np.float64)
        top = float(values.max())
        counts, _ = np.histogram(values, bins=2048, range=(0, top))
        return TensorRecord("y", float(values.min()), top, top, counts.tolist(), top)

    rng = np.random.default_rng(0)
    tail = recurrent.tail_gain_db(record(rng.uniform(0.9e-4, 1.1e-4, 10000)))
    assert tail == pytest.approx(20 * np.log10(np.log(1e4)), abs=0.2), tail
    assert recurrent.tail_gain_db(record(rng.uniform(0.0, 1.0, 10000))) < 0
    assert recurrent.tail_gain_db(record(rng.uniform(-1.0, 1.0, 10000))) is None


def _log_mel_lstm(feat=16, hidden=32, gain=2.0, seed=5) -> onnx.ModelProto:
    """x [time, batch, feat] -> a forward LSTM whose gates are centred on the typical x (-3.3), W and R ~ N(0, gain^2 / fan-in):
    VoiceFilter-Lite's speaker embedder's first LSTM, fed 40 log10 mel energies."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.normal(0, gain / np.sqrt(feat), (1, 4 * hidden, feat))
    r = rng.normal(0, gain / np.sqrt(hidden), (1, 4 * hidden, hidden))
    b = np.zeros((1, 8 * hidden))
    b[0, :4 * hidden] = 3.3 * w[0].sum(axis=1)
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (("W", w), ("R", r), ("B", b))]
    graph = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], name="lstm", hidden_size=hidden)], "log_mel_lstm",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["time", "batch", feat])],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["time", 1, "batch", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_one_sided_lstm_input_keeps_its_codes():
    """log10 mel energies (in [-10, -0.2], mostly near -3) into an LSTM (voicefilter_embedder's first): X's FakeQuantize
    maps [-amax, max] (0 on a code) onto the grid, not [-amax, amax], whose positive half X never reaches: X's step half
    as coarse and R's codes, sharing W / a's scale per unit, finer (recurrent.x_levels). The look-alike 22.6 -> 25.3 dB in
    the file's arithmetic; voicefilter_embedder's LSTM 18.3 -> 22.1 dB over its real inputs, simulated 11.0 -> 26.3 (its
    simulation drew positive values X never has, now only below the calibrated max), so it runs int8."""
    model = _log_mel_lstm()
    rng = np.random.default_rng(7)
    feeds = [{"x": np.clip(np.log10(rng.gamma(0.5, 1e-3, (40 + i, 1, 16)) * np.exp(rng.normal(0, 2, (40 + i, 1, 1))) + 1e-10),
                           -10, 1.2).astype(np.float32)} for i in range(24)]
    cal = qtool.calibrate(model, data=feeds[:16])
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {o: n for n in m.graph.node for o in n.output}
    fq = made[next(n for n in m.graph.node if n.op_type == "LSTM").input[0]]
    il, ih = (float(inits[t]) for t in fq.input[1:3])
    x_max = max(next(t.max for t in cal.tensors if t.name == "x"), 0.0)  # all below 0 here: [-amax, 0]
    assert x_max <= ih < x_max + (ih - il) / 255 and il < -9, (il, ih, x_max)
    assert (0 - il) / (ih - il) * 255 == pytest.approx(round((0 - il) / (ih - il) * 255), abs=1e-3)  # 0 on a code
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary.get("int8_lstm") == ["lstm"], result.plan_summary
    assert result.outputs[0].sqnr_db > 24.5, result.outputs[0].sqnr_db


def test_lstm_input_range_narrowed_only_to_the_side_it_reaches():
    """recurrent.x_levels: X reaching both ends (to a step) keeps the symmetric codes (-128 and 127 steps of amax / 127);
    one side short of amax is narrowed to its calibrated end, widened to put 0 on a code; unsigned X [0, amax]."""
    assert recurrent.x_levels(1.0, False) == recurrent.x_levels(1.0, False, (-1.2, 1.1)) == recurrent.x_levels(1.0, False, (-0.995, 1.0))
    assert recurrent.x_levels(1.0, False) == pytest.approx((-128 / 127, 1.0))
    lo, hi = recurrent.x_levels(9.5, False, (-9.9, 1.25))
    step = (hi - lo) / 255
    assert lo == pytest.approx(-9.5, abs=step) and 1.25 <= hi < 1.25 + step and -lo / step == pytest.approx(round(-lo / step))
    lo, hi = recurrent.x_levels(9.5, False, (-0.3, 9.9))
    assert -0.3 - (hi - lo) / 255 < lo <= -0.3 and hi == pytest.approx(9.5, abs=(hi - lo) / 255)
    assert recurrent.x_levels(2.0, True, (0.0, 1.0)) == (0.0, 2.0)


def test_stacked_lstm_simulated_on_the_output_before_it():
    """Two stacked LSTMs (tests/zoo.py stacked_lstm_like: the first's units correlated, its output smooth in time, as
    a trained LSTM's): the second's X drawn independently per unit and step from its histogram simulated it at 16.9 dB
    and kept it float, where over the real inputs its int8 leaves 24.1 dB at its output. Fed the first's simulated
    output (recurrent.fed_by: X is its Y through Transpose and Reshape) it simulates at 29.0 and runs int8, the model
    at 20.1 dB (23.0 with it float); the warning of a float one names the simulated output it was fed."""
    model = zoo.stacked_lstm_like()
    feeds = zoo.smooth_frames(24)
    cal = qtool.calibrate(model, data=feeds[:16])
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary.get("int8_lstm") == ["/lstm1/LSTM", "/lstm2/LSTM"], result.plan_summary
    assert result.outputs[0].sqnr_db > 19, result.outputs[0].sqnr_db
    harder = zoo.stacked_lstm_like(gain=6.0)  # the second's int8 past its floor on any input
    cal = qtool.calibrate(harder, data=feeds[:16])
    result = qtool.evaluate(harder, cal, data=feeds[16:], target="openvino")
    assert "from /lstm1/LSTM's simulated output" in result.plan_summary["float_lstm"]["/lstm2/LSTM"], result.plan_summary


def test_an_lstm_fed_by_another_through_moves_only():
    """recurrent.fed_by: an LSTM's X is another's Y when only moved (Transpose and Reshape as torch exports them; Slice,
    Squeeze and Concat of both directions as tf2onnx does); not through an op that changes values, a Concat with another
    tensor, nor a Transpose that moves the hidden units off the last axis (their order would not be the simulation's)."""
    from onnx import helper

    from qtool.model import graph as G

    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["Y"], name="a"),
             helper.make_node("Transpose", ["Y"], ["T"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["T", "s"], ["torch"]),
             helper.make_node("Slice", ["Y", "s0", "e0", "ax"], ["f"]), helper.make_node("Slice", ["Y", "s1", "e1", "ax"], ["b"]),
             helper.make_node("Squeeze", ["f", "ax"], ["fs"]), helper.make_node("Squeeze", ["b", "ax"], ["bs"]),
             helper.make_node("Concat", ["fs", "bs"], ["tf"], axis=2),
             helper.make_node("Concat", ["fs", "x"], ["mixed"], axis=2),
             helper.make_node("Tanh", ["torch"], ["changed"]),
             helper.make_node("Transpose", ["Y"], ["units_first"], perm=[3, 0, 2, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)], [])
    m = G.Index(helper.make_model(graph))
    assert recurrent.fed_by(m, "torch").name == recurrent.fed_by(m, "tf").name == "a"
    assert [recurrent.fed_by(m, t) for t in ("mixed", "changed", "x", "units_first")] == [None] * 4


def test_a_reverse_lstm_simulated_over_the_steps_reversed():
    """recurrent.simulate of a one-direction `reverse` LSTM (two LSTMs, one each way, where an exporter does not write a
    bidirectional one) runs its steps last to first, as onnxruntime runs it: on a fed sequence (smooth in time, unlike
    white draws, whose order does not matter) it ran them forward."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    steps, batch, feat, hidden = 12, 2, 6, 5
    w = rng.normal(0, 0.5, (1, 4 * hidden, feat))
    r = rng.normal(0, 0.5, (1, 4 * hidden, hidden))
    b = rng.normal(0, 0.2, (1, 8 * hidden))
    x = np.cumsum(rng.normal(0, 0.3, (steps, batch, feat)), axis=0)  # a random walk: smooth in time
    unit = np.abs(np.concatenate([w, r], axis=2)).max(axis=(0, 2)).reshape(4, hidden).max(axis=0) / 127
    scale = np.tile(unit, 4).reshape(1, -1, 1)
    site = recurrent.RecurrentSite("lstm", (float(x.min()), float(x.max())), (-1.0, 1.0), None,
                                   np.rint(w / scale).astype(np.int8), np.rint(r / scale).astype(np.int8),
                                   scale.astype(np.float32), b.astype(np.float32))
    db, y = recurrent.simulate(site, w, r, b, None, x, reverse=True)
    node = helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hidden, direction="reverse")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, feat])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(a.astype(np.float32), n) for a, n in ((w, "w"), (r, "r"), (b, "b"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x.astype(np.float32)})[0]
    assert np.allclose(y, ref[:, 0], atol=1e-4), np.abs(y - ref[:, 0]).max()  # Y [steps, batch, hidden], in time order
    forward_db, _ = recurrent.simulate(site, w, r, b, None, x[::-1].copy())
    assert db is not None and db == pytest.approx(forward_db)  # the same as a forward LSTM over the steps reversed


def test_lstm_under_its_floor_on_a_wide_state_grid_runs_on_its_own_h():
    """A streaming LSTM whose state input was calibrated over (-1, 1) (tests/zoo.py streaming_lstm_like: the feeds' h0
    drawn uniformly, as the zoo's are for VoiceFilter-Lite) while its own h, its output gate biased shut, stays under 0.1:
    on the grid of the state's range its h rounds to a few codes, simulated at 18.5 dB, and it stayed float. The grid of
    its own h's peak (recurrent._narrower, tried by the simulation for an LSTM under its floor) runs it int8, at the
    error the same LSTM has int8 where the state is calibrated over its own range (output 23.0 dB; 23.3 with h0 drawn
    over (-0.5, 0.5), where its grid was already narrow enough; 27.3 with the LSTM float)."""
    model = zoo.streaming_lstm_like()
    feeds, rng = zoo.smooth_frames(24), np.random.default_rng(12)
    for f in feeds:
        f["h0"], f["c0"] = (rng.uniform(-1, 1, (1, 1, 32)).astype(np.float32) for _ in range(2))
    cal = qtool.calibrate(model, data=feeds[:16])
    result = qtool.evaluate(model, cal, data=feeds[16:], target="openvino")
    assert result.plan_summary.get("int8_lstm") == ["/lstm/LSTM"], result.plan_summary
    assert result.outputs[0].sqnr_db > 22, [o.sqnr_db for o in result.outputs]
    m = onnx.load_from_string(qtool.export(model, cal, target="openvino"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    made = {o: n for n in m.graph.node for o in n.output}
    fq = made[next(n for n in m.graph.node if n.op_type == "LSTM").input[0]]
    peaks = {t.name: t.absmax for t in cal.tensors}
    assert float(inits[fq.input[4]]) < 0.5 * peaks["h0"] and float(inits[fq.input[4]]) >= 0.99 * max(peaks["Y"], peaks["Y_h"])
