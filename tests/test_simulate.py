"""qtool.checks.simulate: the exact arithmetic of an exported file, the same on every CPU.

FakeQuantize rewritten into float ONNX ops is checked against numpy versions of OpenVINO's
formula (float32, the same operations: bit for bit; float64: qtool.quantizers.grids.fake_quantize) and
against OpenVINO itself on a model whose int8 sums cannot saturate (7-bit weights: |w| <= 63,
so a u8 x s8 pair sums to at most 2 * 255 * 63 < 32767 on any CPU).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from required import module

import qtool
from qtool.checks import simulate
from qtool.quantizers import cpu_kinds, grids

DOMAIN = "org.openvinotoolkit"


def fq_model(lo, hi, levels: int, shape, elem_type=TensorProto.FLOAT, opset: int = 13, out_lo=None, out_hi=None) -> onnx.ModelProto:
    """x -> FakeQuantize(x, lo, hi, out_lo, out_hi) -> Identity -> y."""
    dtype = np.float16 if elem_type == TensorProto.FLOAT16 else np.float32
    arrays = {"il": lo, "ih": hi, "ol": lo if out_lo is None else out_lo, "oh": hi if out_hi is None else out_hi}
    inits = [numpy_helper.from_array(np.asarray(v, dtype), k) for k, v in arrays.items()]
    nodes = [helper.make_node("FakeQuantize", ["x", "il", "ih", "ol", "oh"], ["fq"], name="fq", domain=DOMAIN, levels=levels),
             helper.make_node("Identity", ["fq"], ["y"], name="id")]
    g = helper.make_graph(nodes, "fq", [helper.make_tensor_value_info("x", elem_type, list(shape))],
                          [helper.make_tensor_value_info("y", elem_type, list(shape))], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1)])


def formula32(x, il, ih, ol, oh, levels):
    """OpenVINO's formula in float32, operation for operation as the rewrite computes it."""
    x, il, ih, ol, oh = (np.asarray(a, np.float32) for a in (x, il, ih, ol, oh))
    n = np.float32(levels - 1)
    q = np.round((x - il) / (ih - il) * n) / n * (oh - ol) + ol  # np.round: half to even
    return np.where(x <= np.minimum(il, ih), ol, np.where(x > np.maximum(il, ih), oh, q)).astype(np.float32)


def simulated(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return simulate.simulation(m.SerializeToString()).run(["y"], {"x": x})[0]


@pytest.mark.parametrize("case", ["unsigned", "signed", "per-channel", "output range", "7-bit weights"])
def test_fake_quantize_as_float_ops_is_openvinos_formula_bit_for_bit(case):
    rng = np.random.default_rng(7)
    shape = (4, 6, 5, 5)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    lo, hi, levels, out = np.float32(0.0), np.float32(2.5), 256, {}
    if case == "signed":
        lo, hi = np.float32(-1.7 * 128 / 127), np.float32(1.7)
    elif case == "per-channel":
        hi = rng.uniform(0.5, 4, (1, 6, 1, 1)).astype(np.float32)
        lo = -hi
        levels = 255
    elif case == "output range":
        lo, hi = np.float32(-1.0), np.float32(3.0)
        out = {"out_lo": np.float32(-2.0), "out_hi": np.float32(5.0)}
    elif case == "7-bit weights":
        hi = np.float32(2.0)
        lo, levels = -hi, 127
    step = (np.asarray(hi, np.float32) - lo) / np.float32(levels - 1)
    # values on the boundaries, on the grid, and exactly halfway between grid points (ties: half to even)
    x[0, :, 0, :3] = np.stack([np.broadcast_to(lo, (1, 6, 1, 1)).reshape(6), np.broadcast_to(hi, (1, 6, 1, 1)).reshape(6),
                               np.broadcast_to(lo + 2.5 * step, (1, 6, 1, 1)).reshape(6)], axis=1)
    x[1, 0, 0, 0] = np.nan
    m = fq_model(lo, hi, levels, shape, **out)
    got = simulated(m, x)
    want = formula32(x, lo, hi, out.get("out_lo", lo), out.get("out_hi", hi), levels)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[1, 0, 0, 0])
    # the float64 reference (qtool.quantizers.grids): the same grid point wherever float32 is not within an ulp of a tie
    ref = grids.fake_quantize(x, lo, hi, out.get("out_lo", lo), out.get("out_hi", hi), levels)
    t = (x.astype(np.float64) - lo) / (np.asarray(hi, np.float64) - lo) * (levels - 1)
    clear = np.isfinite(x) & (np.abs(t - np.floor(t) - 0.5) > 1e-4)
    np.testing.assert_allclose(got[clear], ref[clear], rtol=0, atol=1e-5 * float(np.max(np.abs(out.get("out_hi", hi)))) + 1e-6)


def test_fp16_and_old_opsets_are_simulated_too():
    rng = np.random.default_rng(3)
    x = rng.uniform(-2, 2, (2, 8)).astype(np.float32)
    m16 = fq_model(np.float16(-1.5), np.float16(1.5), 256, x.shape, TensorProto.FLOAT16)
    got = simulated(m16, x.astype(np.float16))
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, formula32(x.astype(np.float16), np.float16(-1.5), np.float16(1.5), np.float16(-1.5),
                                                 np.float16(1.5), 256).astype(np.float16))
    m10 = fq_model(np.float32(-1.5), np.float32(1.5), 256, x.shape, opset=10)  # Round needs opset 11: converted
    np.testing.assert_array_equal(simulated(m10, x), formula32(x, -1.5, 1.5, -1.5, 1.5, 256))
    rewritten = simulate.fake_quantize_as_float_ops(fq_model(np.float32(0), np.float32(1), 256, x.shape))
    assert not any(n.domain == DOMAIN for n in rewritten.graph.node) and DOMAIN not in {o.domain for o in rewritten.opset_import}


def test_cpu_flags_say_whether_int8_pair_sums_can_saturate():
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma f16c\nbugs\t\t: sysret_ss_attrs\n"
    assert cpu_kinds.from_cpuinfo(avx2) == {"fpu", "sse2", "avx2", "fma", "f16c"} and not cpu_kinds.has_vnni_flags(cpu_kinds.from_cpuinfo(avx2))
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert cpu_kinds.has_vnni_flags(cpu_kinds.from_cpuinfo(avx2.replace("avx2", f"avx2 {flag}")))
    assert cpu_kinds.from_cpuinfo("Features\t: fp asimd asimddp\n") == {"fp", "asimd", "asimddp"} and cpu_kinds.from_cpuinfo("nothing") is None
    assert cpu_kinds.has_vnni() == (cpu_kinds.vnni() is True) and isinstance(cpu_kinds.has_vnni(), bool)


def test_the_simulation_runs_without_graph_optimization():
    """No int8 kernel can run: onnxruntime keeps QuantizeLinear/DequantizeLinear as float ops."""
    m = fq_model(np.float32(0), np.float32(1), 256, (1, 4))
    session = simulate.simulation(m)
    assert session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL


# ---------------------------------------------------------------- against OpenVINO itself


def conv_chain(seed: int = 0) -> onnx.ModelProto:
    """Conv-ReLU x3 -> GlobalAveragePool -> MatMul: no residual Add, so OpenVINO fuses nothing that
    rounds otherwise than the file (it skips an intermediate FakeQuantize's rounding inside a
    Conv + Add fusion)."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    for i, (cin, cout) in enumerate(((3, 16), (16, 16), (16, 32))):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits.append(numpy_helper.from_array((rng.standard_normal((32, 10)) * 0.3).astype(np.float32), "fc"))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"), helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
              helper.make_node("MatMul", ["flat", "fc"], ["logits"], name="fc")]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _sqnr(ref, out) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(10 * np.log10((ref ** 2).sum() / ((ref - out) ** 2).sum()))


@pytest.fixture(scope="module")
def chain():
    m = conv_chain()
    rng = np.random.default_rng(1)
    calib = [{"input": rng.uniform(0, 1, (16, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    held = rng.uniform(0, 1, (64, 3, 16, 16)).astype(np.float32)
    return m, qtool.calibrate(m, data=calib), held


def test_simulation_equals_openvino_where_nothing_can_saturate(chain):
    """The real runtime: OpenVINO's CPU plugin runs the file in int8 (u8 activations, i8 weights).
    With 7-bit weights no pair sum can saturate, so on any CPU it computes what the simulation
    does, up to float rounding in its dequantization; 8-bit weights are checked only on a CPU with
    VNNI (elsewhere vpmaddubsw may saturate them)."""
    ov = module("openvino")
    m, cal, x = chain
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    core = ov.Core()
    for weights_7bit in ("all",) + (("none",) if cpu_kinds.has_vnni() else ()):
        data = qtool.export(m, cal, target="openvino", weights_7bit=weights_7bit)
        sim = simulate.simulation(data).run(["logits"], {"input": x})[0]
        compiled = core.compile_model(core.read_model(data, b""), "CPU", cpu_kinds.PINNED_F32)
        real = compiled(x)[0]
        assert _sqnr(sim, real) > 60, (weights_7bit, _sqnr(sim, real))  # the two agree far below the int8 noise
        assert abs(_sqnr(ref, sim) - _sqnr(ref, real)) < 0.05
        assert 25 < _sqnr(ref, sim) < 45  # and that noise is really there: the model is quantized


def test_evaluate_reports_the_simulation_and_the_runtime(chain):
    module("openvino")
    m, cal, x = chain
    held = [{"input": x[i:i + 16]} for i in range(0, len(x), 16)]
    result = qtool.evaluate(m, cal, data=held, target="openvino", runtime="openvino", weights_7bit="all")
    assert result.target == "openvino" and result.runtime.name == "openvino" and result.runtime.vnni == cpu_kinds.vnni()
    assert abs(result.worst_sqnr_db - result.runtime.worst_sqnr_db) < 0.05
    assert not any("dB, the exact simulation" in w for w in result.warnings)


# ---------------------------------------------------------------- a FakeQuantize OpenVINO applies as a clamp


def sum_block(after_sum: bool = True, two_convs: bool = False, computed_bias: bool = False) -> onnx.ModelProto:
    """x -> FakeQuantize -> int8 Conv -> bias Add -> FakeQuantize m -> Add with y's FakeQuantize (or, `two_convs`, with
    a second int8 Conv's FakeQuantize m2) [-> FakeQuantize]: the residual block of a ResNet, DLA or PP-LCNet
    (bench/openvino_quirks.py, case 1). The grids clip the Conv's tails, so a clamp and a rounding differ.
    `computed_bias`: the bias an int32 DequantizeLinear then a Reshape, as a model onnxruntime quantized writes it
    and qtool's file keeps it (OpenVINO folds it to a constant)."""
    rng = np.random.default_rng(3)
    c = 16
    arrays = {"w8": rng.integers(-63, 64, (c, c, 3, 3)).astype(np.int8), "v8": rng.integers(-63, 64, (c, c, 3, 3)).astype(np.int8),
              "ws": np.full((c, 1, 1, 1), 0.004, np.float32), "b": rng.normal(0, 0.1, (1, c, 1, 1)).astype(np.float32),
              "lo_x": np.float32(0), "hi_x": np.float32(1), "lo": np.float32(-1.5 * 128 / 127), "hi": np.float32(1.5),
              "lo_y": np.float32(-1 * 128 / 127), "hi_y": np.float32(1), "lo_o": np.float32(-2.5 * 128 / 127), "hi_o": np.float32(2.5)}

    def fq(x, lo, hi, out):
        return helper.make_node("FakeQuantize", [x, lo, hi, lo, hi], [out], name=f"{out}/fq", domain=DOMAIN, levels=256)

    nodes = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"]),
             fq("x", "lo_x", "hi_x", "xq"), helper.make_node("Conv", ["xq", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv", "b"], ["biased"]), fq("biased", "lo", "hi", "m")]
    if computed_bias:
        step = np.float32(0.004 / 255)  # the input's step times the weights'
        arrays.update(b32=np.round(arrays.pop("b").ravel() / step).astype(np.int32), b_step=step, b_shape=np.array([1, c, 1, 1], np.int64))
        nodes[:0] = [helper.make_node("DequantizeLinear", ["b32", "b_step"], ["b_flat"]), helper.make_node("Reshape", ["b_flat", "b_shape"], ["b"])]
    if two_convs:  # the second Conv reads y
        nodes += [helper.make_node("Cast", ["v8"], ["vf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["vf", "ws"], ["v"]),
                  fq("y", "lo_x", "hi_x", "yq"), helper.make_node("Conv", ["yq", "v"], ["conv2"], pads=[1, 1, 1, 1]),
                  fq("conv2", "lo", "hi", "m2"), helper.make_node("Add", ["m", "m2"], ["sum" if after_sum else "out"])]
    else:
        nodes += [fq("y", "lo_y", "hi_y", "yq"), helper.make_node("Add", ["yq", "m"], ["sum" if after_sum else "out"])]
    if after_sum:
        nodes.append(fq("sum", "lo_o", "hi_o", "out"))
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1, c, 24, 24]) for k in ("x", "y")],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in arrays.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("after_sum, two_convs, computed_bias, clamped", [
    (True, False, False, {"m"}), (False, False, False, set()), (True, True, False, {"m"}), (True, False, True, {"m"})])
def test_a_fakequantize_openvino_fuses_before_a_sum_is_simulated_as_its_clamp(after_sum, two_convs, computed_bias, clamped):
    """OpenVINO 2026.4's CPU plugin fuses the residual Add into the int8 Conv as a sum post-op and, with the
    FakeQuantize after the Add fused too, applies the FakeQuantize between them as a clamp without rounding: the
    simulation computes that one so and matches the run (the file as written: 43 dB from it); without the
    FakeQuantize after the Add it rounds, and so does the simulation. Of two Convs meeting at the Add, the first
    input's is fused (its FakeQuantize clamped), the second's rounds. A bias computed from constants alone (a shipped
    model's int32 bias, sscd_int8's 16 residual blocks) is folded and fused as a constant one is."""
    ov = module("openvino")
    m = sum_block(after_sum, two_convs, computed_bias)
    assert simulate.sum_fused_clamps(m) == clamped
    rng = np.random.default_rng(4)
    feeds = {"x": rng.uniform(0, 1, (1, 16, 24, 24)).astype(np.float32),
             "y": (rng.uniform(0, 1, (1, 16, 24, 24)) if two_convs else rng.normal(0, 0.4, (1, 16, 24, 24))).astype(np.float32)}
    core = ov.Core()
    real = core.compile_model(core.read_model(m.SerializeToString(), b""), "CPU", cpu_kinds.PINNED_F32)(feeds)[0]
    sim = simulate.simulation(m.SerializeToString()).run(["out"], feeds)[0]
    written = simulate.simulation(m.SerializeToString(), as_openvino=False).run(["out"], feeds)[0]
    assert _sqnr(sim, real) > 100, _sqnr(sim, real)
    if clamped:
        assert _sqnr(written, real) < 60  # the rounding is really dropped: the file as written is another number
