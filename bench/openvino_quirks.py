"""Where OpenVINO computes something else than a FakeQuantize file says, on this CPU: small
reproducers of the behaviours qtool's OpenVINO export works around or documents
(docs/targets/openvino.md). Rerun after an OpenVINO upgrade: each line says whether the installed
version still behaves so (f32 inference precision; "exact" is the file's arithmetic,
qtool.checks.simulate). Weights stay within +-63 so that no u8 x s8 pair sum passes int16: the
lines mean the same on AVX2-only CPUs (tests/avx2.py) as on VNNI ones.

1. rounding dropped: Conv -> bias -> FakeQuantize -> residual Add -> FakeQuantize. OpenVINO 2026.4
   fuses them into one Convolution and applies the middle FakeQuantize as a clamp, without
   rounding (PP-OCRv6 det's run 1.5 dB closer to FP32 than its file's arithmetic; CenterNet table detectors' 1.1-2.2
   dB, a table classifier's 9.7 dB run vs file). Only with the FakeQuantize after the Add fused too: without it the
   middle one rounds. qtool's simulation computes the FakeQuantize it so fuses as a clamp (simulate.sum_fused_clamps).
   Printed: the run's SQNR against the file's arithmetic as written, against the same graph with that FakeQuantize a
   Clip, against qtool's simulation, and (no FakeQuantize after the Add) against the file and qtool's simulation.
2. negative signs folded wrong: Mul by per-channel float signs [1, -1, 1] -> FakeQuantize -> Conv
   on an input of dynamic shape. OpenVINO 2026.4 folds the Mul into the FakeQuantize and computes
   it wrong; the signs stored int8 and Cast to float (qtool's flipped channels) run right.
   Printed: the run's SQNR against the exact output for both forms.
3. the same below a Transpose of an NHWC input (qtool flips only quantizers on a graph input or a
   Cast of one, the Transposes moved below the Mul).
4. reduction fused wrong: ReduceMax (or ReduceMin) -> FakeQuantize -> MatMul with int8 weights. OpenVINO
   2026.4 fuses the FakeQuantize into the Reduce node and, with the int8 MatMul reading it, computes
   something else (AttaCut's Thai segmenter: 7 dB where its file's arithmetic gives 43). The same
   FakeQuantize on the reduction's input (qtool's file: the same numbers, max and min commute with
   it) runs right. Printed: run vs exact for both orders, for each reduction.
5. LSTM weight scales per gate: an ONNX LSTM with X from a FakeQuantize and W, R int8 times a scale, which
   OpenVINO runs in int8 (a u8 RNNSeq, qtool.quantizers.placement.recurrent). With one scale per row of W
   and R (gate and unit), OpenVINO 2026.4 computes something else (it reads only W's scales and applies
   them to its reordered gates); per direction it keeps a bidirectional LSTM in f32. With one scale per
   hidden unit, shared by the gates, the directions, W and R (qtool's file) it computes the file's
   numbers (the exact simulation rounds the hidden state onto X's grid every step, as OpenVINO's int8
   kernel does; an LSTM OpenVINO leaves f32 does not, so it too reads some 37 dB from the file).
   Printed: run vs exact and the RNNSeq precision for each layout, forward and bidirectional (2026.4:
   forward 18 / 151 / 150 dB, u8; bidirectional f32, f32, and 150 dB u8 per unit).
6. a Conv's bias dropped to its first channel: x -> FakeQuantize -> Conv with a bias -> FakeQuantize, the Conv's
   output shape read (Shape -> Gather -> Concat -> Resize of another input to its height, a U-Net's upsampling to its
   skip's size) on a dynamic-shape input. OpenVINO 2026.4 moves that ShapeOf onto the Convolution before its bias
   (its ONNX frontend reads a Conv's bias as Convolution -> Add), so the Convolution has two readers and the CPU
   plugin does not fuse the bias into it; it folds the bias Add into the FakeQuantize after it instead
   (FusePerformedAsScaleShiftAndFakeQuantize) and that FakeQuantize, per tensor, applies the first channel's bias to
   every channel (CRAFT's text detector: 2.35 dB where its file's arithmetic gives 20.55). The bias as an explicit Add
   after a Conv without one (qtool's file: the same numbers) runs right. Printed: run vs exact for both forms.
7. a Conv's bias dropped to its first channel, its batch read far from it: x (dynamic batch) -> FakeQuantize -> Conv
   with a bias -> Relu -> FakeQuantize -> Conv, whose output's batch size a Shape -> Gather -> ConstantOfShape reads
   (an LSTM's zero initial state; an ONNX LSTM reading the Conv's features does as much). The ONNX frontend reads every
   biased Conv's output shape to reshape its bias, and OptimizeSymbolsUsedAsValues (openvinotoolkit/openvino src/common/
   transformations/src/transformations/symbolic_transformations/symbol_optimization.cpp) re-reads every value of the
   batch dimension from the first such ShapeOf that carries its symbol, as a Convolution copies its input's batch:
   the first Convolution's pre-bias output gets a second reader, and case 6 follows (a seizure detector's spectrogram
   CNN into two LSTMs: 7.85 dB for its file's 48.65). A Reshape's target is not affected (OpenVINO rewrites it to copy
   the dimension). Printed: run vs exact with the bias in the Conv, with it an Add after it, and without the batch read.
8. two int8 LSTMs of one shape: x -> FakeQuantize -> bidirectional LSTM (int8 W, R per hidden unit, as in case 5) ->
   Transpose/Reshape to [T, 1, 2 x hidden] -> FakeQuantize onto its grid -> a second such LSTM whose input is
   2 x hidden wide, as the first's is (W and R of the same shapes, other values). OpenVINO 2026.4 runs the second
   with the first one's weights or quantization (brainmaze's seizure detector: 1.45 dB at the second LSTM's output,
   65 at its input); with its runtime cache off (CPU_RUNTIME_CACHE_CAPACITY=0) it computes the file's numbers; forward
   LSTMs alike: the plugin's runtime cache keys an RNN by its descriptors, not its scales (openvinotoolkit/openvino
   src/plugins/intel_cpu/src/nodes/rnn.cpp, RNNKey). qtool pads the second one's input with a zero feature (and W
   with a zero column): the same numbers, a primitive of its own (149-150 dB). Printed: run vs exact, bidirectional
   with the cache, without it and padded (qtool's file), and forward, forward padded.
9. (watched, runs right) two branches' u8 tensors of unequal ranges meeting at a Sub -> Abs -> FakeQuantize -> int8
   MatMul (a siamese network's |a - b| of two embeddings: CapSpot's similarity model, whose branches' last
   FakeQuantizes are [0, 9.809] and [0, 9.832]). OpenVINO 2026.4's low-precision transformations fold one branch's
   dequantization scale into the other and run Sub, Abs and the FakeQuantize as one u8 Eltwise (its original layers: a
   Multiply, the Sub, a Multiply, the Abs, the FakeQuantize): run vs file 129 dB, the file's arithmetic. The difference cancels most of the branches' values, so a code one branch's run flips
   upstream (float rounding, growing layer by layer) weighs ~24 dB more at the Abs: capspot_sim's run 2.1 dB from
   its simulation on 8 inputs is that drift (0.8 dB on 196; qtool evaluate's swap test), not this Eltwise.
   Printed: run vs exact, the runtime layer holding the Sub and its precision.
10. (watched: why qtool leaves GRUs float) x -> FakeQuantize -> GRU with int8 W and R times one scale per hidden unit,
   as case 5's LSTM. OpenVINO 2026.4 runs it as a u8 RNNSeq only with linear_before_reset=0 (run vs the file's float
   arithmetic ~40 dB: its hidden state requantized every step, as for LSTMs); with linear_before_reset=1, what torch
   exports (a romanizer's bidirectional GRUs), the model does not compile ("could not create a primitive descriptor
   for the LBR GRU forward propagation primitive"). Printed: run vs file and the RNNSeq precisions, or the failure.
11. a boolean mask's Add lost: a > b (a causal triangle) -> Cast to float -> Mul by finfo(float32).min -> Add a padding
   mask of ones (ConstantOfShape of a dynamic shape, Unsqueezed) -> Equal 0 -> Where(min, mask), the additive causal
   mask Hugging Face decoders build; one FakeQuantize anywhere in the model (on another input here). OpenVINO 2026.4's
   low-precision transformations read the Cast and Mul as a u8 tensor and its dequantization scale and move the
   Multiply through the Add, computing (x + y / c) * c (openvinotoolkit/openvino src/common/low_precision_transformations/
   src/add.cpp); 1 / c is subnormal for |c| > 1 / FLT_MIN (8.5e37) and the ones are lost: Equal is true wherever the
   triangle is 0 and every position is masked (t5_title_decoder's self-attention: each softmax row uniform, its file at
   7 dB where its arithmetic gives 25). With c = -8e37 it runs right; written Where(a > b, c, c * 0) (qtool's file: the
   same numbers) too. Printed: run vs exact for min, -1e38, -8e37 and the Where form.

Usage: PYTHONPATH=. python bench/openvino_quirks.py (this checkout's qtool, not an installed one)
12. a fetched tensor handed back as zeros: x -> FakeQuantize -> Conv -> c, read by a FakeQuantize and by a
   GlobalAveragePool -> FakeQuantize -> 1x1 Conv -> Sigmoid -> Mul (a squeeze-excitation). Fetched as an extra output
   beside c, OpenVINO 2026.4 returns the GlobalAveragePool's output as zeros; alone it is right (PP-OCRv6 tiny det:
   qtool evaluate named those pools as where the run leaves the file, at 0 dB). Not a file's arithmetic: evaluate's
   departures measure each layer they name, and its quantized inputs, fetched alone. Printed: run vs exact, both ways.
13. reductions' axes dropped: x [2, 3, 4] -> ReduceLogSumExp (ReduceLogSum, ReduceL1) with axes [-1] at opset 13 (their
   version 13, axes still an attribute; opsets 13-17). OpenVINO 2026.4's ONNX frontend reduces every axis: a scalar
   where the model says [2, 3] (a reCAPTCHA tile classifier's mask head does not convert: "Conversion is failed for:
   Concat"). Version 11 (opset 12) and the same ops written as qtool's OpenVINO file writes them (qtool.targets.
   reductions: ReduceSum over Abs, Log of ReduceSum, Log(ReduceSum(Exp(x - max))) + max) run right. No FakeQuantize:
   the frontend, not the plugin. Printed: the run's shape, and run vs onnxruntime for opset 12 and the spelled form.
14. a float squeeze-excitation Mul at dynamic shapes: x -> FakeQuantize -> Conv -> c; c -> FakeQuantize -> cq ->
   GlobalAveragePool -> FakeQuantize -> 1x1 Conv -> Relu -> FakeQuantize -> 1x1 Conv -> HardSigmoid -> s; Mul(c, s),
   the float c (the Mul not quantized) -> FakeQuantize -> Add cq (PP-OCR's residual SE block). On an input of dynamic
   shape OpenVINO 2026.4 computes something else (~4 dB against the file's arithmetic; ~50 with the shapes static,
   float rounding through the FakeQuantizes); the Mul reading cq (qtool's file: every reader of c reads one quantized
   tensor) runs right. Why qtool quantizes the SE gating Mul: with it float, ppocrv6_tiny_det's run is 0 dB where its
   file's arithmetic gives 19.7 (docs/benchmarks.md #behind11). Printed: run vs exact, dynamic and static, and with
   the Mul reading cq.
15. an int8 Conv without a bias read twice: x -> FakeQuantize -> Conv (int8 weights, no bias or an all-zero one) -> y, and
   y - ReduceMean(y) (a VAD decoder's centring in an If branch; y - Relu(y), Relu(y) beside y as an output, FakeQuantize(y)
   beside y as an output go the same way; a Conv with a nonzero bias, a MatMul, a ConvTranspose run right). OpenVINO
   2026.4 hands one reader the Conv's output scaled by its dequantization again (y * s where the file says y: the mean
   ~0, so the output is y; a float16 VAD look-alike's decoder, tests/zoo.py fp16_branch_vad_like: 14 dB run where its
   file's arithmetic gives 45.6). With a bias of float32's smallest normal (qtool's file: the same numbers) it runs right.
   Printed: run vs exact without a bias, with a zero bias and with the tiny one.
16. MatMul input grids with a zero point: x -> FakeQuantize -> MatMul (Gemm) with int8 weights times a scale per
   output, and x -> FakeQuantize, y -> FakeQuantize -> MatMul of the two (attention's Q K^T), x's grid asymmetric
   ([-0.5, 3], a zero point), symmetric (i8, [-2 x 128/127, 2]) or unsigned ([0, 3], u8 without one). OpenVINO 2026.4
   runs the constant-weight one in int8 on every grid: a u8 FullyConnected with the zero point subtracted (exec type
   FullyConnected, not FullyConnectedQuantizedLegacy; as fast, 20 x 336 x 336 rows on one thread); but the MatMul of
   two computed tensors only without a zero point: with one it dequantizes both inputs and runs the MatMul in f32
   (qtool's file keeps the grid `auto` chose: symmetric there, PP-OCRv6 rec ran int8 and lost 0.97 dB, no faster; targets/
   cpu.py, beside OPENVINO). The same with oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2: jit_gemm for the
   FullyConnected). Printed: run vs exact and the runtime layer's type and input precision, per grid.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qtool.checks import simulate

DOMAIN = "org.openvinotoolkit"
SAME = 100.0  # dB: run and reference agree up to float rounding
LSTM_SAME = 60.0  # dB: an int8 LSTM's integer gate sums against the file's float ones, 20 steps of float rounding


def _model(nodes, inputs: dict[str, list], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "quirk", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 8
    return m


def _fq(x: str, lo: str, hi: str, out: str) -> onnx.NodeProto:
    return helper.make_node("FakeQuantize", [x, lo, hi, lo, hi], [out], domain=DOMAIN, levels=256)


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    err = float(((ref - got) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(max(float((ref ** 2).sum()), 1e-30) / err)


def _run(m: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return np.asarray(simulate.runtime("openvino", m.SerializeToString()).run(None, feeds)[0])


def _exact(m: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return np.asarray(simulate.simulation(m.SerializeToString()).run(None, feeds)[0])


def rounding_dropped(rng) -> tuple[float, float, float, float, float]:
    """(run vs the file as written, vs it with the middle FakeQuantize a Clip, vs qtool's simulation; without the
    FakeQuantize after the Add: run vs the file as written, vs qtool's simulation), dB."""
    c = 16
    inits = {"w8": rng.integers(-63, 64, (c, c, 3, 3)).astype(np.int8), "ws": np.full((c, 1, 1, 1), 0.004, np.float32),
             "b": rng.normal(0, 0.1, (1, c, 1, 1)).astype(np.float32),
             "lo_x": np.float32(0), "hi_x": np.float32(1),
             "lo": np.float32(-1.5 * 128 / 127), "hi": np.float32(1.5),  # the conv output's grid: clips its tails
             "lo_y": np.float32(-1 * 128 / 127), "hi_y": np.float32(1),
             "lo_o": np.float32(-2.5 * 128 / 127), "hi_o": np.float32(2.5)}

    def graph(middle: onnx.NodeProto, last: bool = True) -> onnx.ModelProto:
        # int8 weights as qtool and NNCF store them (Cast and Mul by the per-channel step): an int8 Conv in OpenVINO
        nodes = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"]),
                 _fq("x", "lo_x", "hi_x", "xq"), helper.make_node("Conv", ["xq", "w"], ["conv"], pads=[1, 1, 1, 1]),
                 helper.make_node("Add", ["conv", "b"], ["biased"]), middle,
                 _fq("y", "lo_y", "hi_y", "yq"), helper.make_node("Add", ["yq", "mid"], ["sum" if last else "out"])]
        return _model(nodes + ([_fq("sum", "lo_o", "hi_o", "out")] if last else []), {"x": [1, c, 24, 24], "y": [1, c, 24, 24]}, inits)

    feeds = {"x": rng.uniform(0, 1, (1, c, 24, 24)).astype(np.float32), "y": rng.normal(0, 0.4, (1, c, 24, 24)).astype(np.float32)}
    out = []
    for last in (True, False):
        file = graph(_fq("biased", "lo", "hi", "mid"), last)
        run = _run(file, feeds)
        written = np.asarray(simulate.simulation(file.SerializeToString(), as_openvino=False).run(None, feeds)[0])
        out.append(_sqnr(written, run))
        if last:
            out.append(_sqnr(_exact(graph(helper.make_node("Clip", ["biased", "lo", "hi"], ["mid"])), feeds), run))
        out.append(_sqnr(_exact(file, feeds), run))
    return tuple(out)


def signs_folded(rng, nhwc: bool = False) -> tuple[float, float]:
    """(run vs exact with float signs, with int8 signs Cast to float), dB, on a dynamic-shape input
    (nhwc: an NHWC input Transposed to NCHW before the Mul, as MTCNN's)."""
    inits = {"s": np.array([1, -1, 1], np.float32).reshape(1, 3, 1, 1), "s8": np.array([1, -1, 1], np.int8).reshape(1, 3, 1, 1),
             "lo": np.float32(-1 * 128 / 127), "hi": np.float32(1), "w8": rng.integers(-63, 64, (16, 3, 3, 3)).astype(np.int8),
             "ws": np.full((16, 1, 1, 1), 0.01, np.float32)}
    x = rng.uniform(-1, 1, (1, 48, 64, 3) if nhwc else (1, 3, 48, 64)).astype(np.float32)
    out = []
    for signs in (["s"], ["s8"]):
        nodes = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"])]
        nodes += [helper.make_node("Cast", ["s8"], ["sf"], to=TensorProto.FLOAT)] if signs == ["s8"] else []
        if nhwc:
            nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]))
        nodes += [helper.make_node("Mul", ["xt" if nhwc else "x", "sf" if signs == ["s8"] else "s"], ["m"]), _fq("m", "lo", "hi", "q"),
                  helper.make_node("Conv", ["q", "w"], ["out"], pads=[1, 1, 1, 1])]
        m = _model(nodes, {"x": ["N", "H", "W", 3] if nhwc else ["N", 3, "H", "W"]}, inits)
        out.append(_sqnr(_exact(m, {"x": x}), _run(m, {"x": x})))
    return out[0], out[1]


def reduction_fused(rng, op: str) -> tuple[float, float]:
    """(run vs exact with the FakeQuantize after `op`, with it before), dB: [1, L, C, 3] reduced over its last axis
    (keepdims 0, as torch.max(x, 3) exports), on a dynamic shape, into a MatMul with int8 weights."""
    inits = {"ax": np.array([3], np.int64), "lo": np.float32(-7.8), "hi": np.float32(15.8),
             "w8": rng.integers(-63, 64, (64, 48)).astype(np.int8), "ws": np.full((64, 1), 0.01, np.float32)}
    x = rng.normal(2, 3, (1, 54, 48, 3)).astype(np.float32)
    weights = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["wd"]),
               helper.make_node("Transpose", ["wd"], ["w"], perm=[1, 0])]
    out = []
    for after in (True, False):
        if after:
            nodes = [helper.make_node(op, ["x", "ax"], ["r"], keepdims=0), _fq("r", "lo", "hi", "q")]
        else:
            nodes = [_fq("x", "lo", "hi", "xq"), helper.make_node(op, ["xq", "ax"], ["q"], keepdims=0)]
        m = _model(nodes + weights + [helper.make_node("MatMul", ["q", "w"], ["out"])], {"x": ["N", "L", "C", 3]}, inits)
        m.opset_import[0].version = 18  # ReduceMax's axes as an input
        out.append(_sqnr(_exact(m, {"x": x}), _run(m, {"x": x})))
    return out[0], out[1]


def lstm_scales(layout: str, dirs: int, seed: int = 1) -> tuple[float, str]:
    """(run vs exact, dB; the RNNSeq layers' runtime precisions) of an int8 LSTM whose W and R scales are per
    `layout`: "row" (gate and unit, per direction), "direction", or "unit" (shared by gates and directions).
    Its own seed: a hidden state that falls on a rounding tie may round to the other code in OpenVINO's integer
    arithmetic and change the steps after it (35 dB on the sequence of the other cases' generator)."""
    rng = np.random.default_rng(seed)
    hidden, feat, steps = 16, 12, 20
    step = 1 / 127
    w = rng.normal(0, 0.3, (dirs, 4 * hidden, feat)) * rng.uniform(0.2, 2, (dirs, 4 * hidden, 1))
    r = rng.normal(0, 0.3, (dirs, 4 * hidden, hidden)) * rng.uniform(0.2, 2, (dirs, 4 * hidden, 1))
    peak = np.maximum(np.abs(w).max(axis=2, keepdims=True), np.abs(r).max(axis=2, keepdims=True))  # [dirs, 4H, 1]
    if layout == "direction":
        peak = np.broadcast_to(peak.max(axis=1, keepdims=True), peak.shape)
    elif layout == "unit":
        peak = np.tile(peak.reshape(dirs, 4, hidden).max(axis=(0, 1)), 4).reshape(1, 4 * hidden, 1)
    scale = (peak / 127).astype(np.float32)
    inits = {"w8": np.clip(np.rint(w / scale), -127, 127).astype(np.int8), "r8": np.clip(np.rint(r / scale), -127, 127).astype(np.int8),
             "s": scale, "b": rng.normal(0, 0.1, (dirs, 8 * hidden)).astype(np.float32),
             "lo": np.float32(-2), "hi": np.float32(2), "glo": np.float32(-128 * step), "ghi": np.float32(127 * step)}
    nodes = [helper.make_node("FakeQuantize", ["x", "lo", "hi", "glo", "ghi"], ["xq"], domain=DOMAIN, levels=256),
             helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "s"], ["w"]),
             helper.make_node("Cast", ["r8"], ["rf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["rf", "s"], ["r"]),
             helper.make_node("LSTM", ["xq", "w", "r", "b"], ["out"], hidden_size=hidden,
                              direction="bidirectional" if dirs == 2 else "forward")]
    m = _model(nodes, {"x": ["T", 1, feat]}, inits)
    x = {"x": rng.uniform(-2, 2, (steps, 1, feat)).astype(np.float32)}
    session = simulate.runtime("openvino", m.SerializeToString())
    run = np.asarray(session.run(None, x)[0])
    precisions = sorted(str(op.get_rt_info()["runtimePrecision"].astype(str)) for op in session.compiled.get_runtime_model().get_ops()
                        if str(op.get_rt_info()["layerType"].astype(str)) == "RNNSeq")
    return _sqnr(_exact(m, x), run), "/".join(precisions)


def lstm_pair(dirs: int, cache: bool = True, seed: int = 1, pad: int = 0) -> float:
    """Run vs exact, dB, of two stacked int8 LSTMs whose W and R have the same shapes (case 8); `pad`: the second's
    input padded with that many zero features and its W with zero columns (qtool's file)."""
    rng = np.random.default_rng(seed)
    hidden, steps = 16, 20
    feat = dirs * hidden  # the second LSTM's input, the first one's too
    inits, nodes = {"lo": np.float32(-2), "hi": np.float32(2), "glo": np.float32(-128 / 127), "ghi": np.float32(1),
                    "shape": np.array([0, 0, -1], np.int64), "pads": np.array([0, 0, 0, 0, 0, pad], np.int64)}, []
    x = "x"
    for k in range(2):
        w = rng.normal(0, 0.3, (dirs, 4 * hidden, feat))
        r = rng.normal(0, 0.3, (dirs, 4 * hidden, hidden))
        peak = np.maximum(np.abs(w).max(axis=2), np.abs(r).max(axis=2)).reshape(dirs, 4, hidden).max(axis=(0, 1))
        scale = np.tile(peak / 127, 4).reshape(1, 4 * hidden, 1).astype(np.float32)
        w8 = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        if k == 1 and pad:
            w8 = np.concatenate([w8, np.zeros((dirs, 4 * hidden, pad), np.int8)], axis=2)
            nodes.append(helper.make_node("Pad", [x, "pads"], ["xp"]))
            x = "xp"
        inits.update({f"w8{k}": w8, f"s{k}": scale,
                      f"r8{k}": np.clip(np.rint(r / scale), -127, 127).astype(np.int8),
                      f"b{k}": rng.normal(0, 0.1, (dirs, 8 * hidden)).astype(np.float32)})
        lo = "lo" if k == 0 else "glo"
        hi = "hi" if k == 0 else "ghi"
        nodes += [helper.make_node("FakeQuantize", [x, lo, hi, "glo", "ghi"], [f"xq{k}"], domain=DOMAIN, levels=256),
                  helper.make_node("Cast", [f"w8{k}"], [f"wf{k}"], to=TensorProto.FLOAT), helper.make_node("Mul", [f"wf{k}", f"s{k}"], [f"w{k}"]),
                  helper.make_node("Cast", [f"r8{k}"], [f"rf{k}"], to=TensorProto.FLOAT), helper.make_node("Mul", [f"rf{k}", f"s{k}"], [f"r{k}"]),
                  helper.make_node("LSTM", [f"xq{k}", f"w{k}", f"r{k}", f"b{k}"], [f"y{k}"], hidden_size=hidden,
                                   direction="bidirectional" if dirs == 2 else "forward"),
                  helper.make_node("Transpose", [f"y{k}"], [f"t{k}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"t{k}", "shape"], ["out" if k else f"h{k}"])]
        x = f"h{k}"
    m = _model(nodes, {"x": ["T", 1, feat]}, inits)
    feeds = {"x": rng.uniform(-2, 2, (steps, 1, feat)).astype(np.float32)}
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": "f32", **({} if cache else {"CPU_RUNTIME_CACHE_CAPACITY": "0"})}
    core = ov.Core()
    compiled = core.compile_model(core.read_model(m.SerializeToString(), b""), "CPU", config)
    return _sqnr(_exact(m, feeds), np.asarray(compiled(feeds)[compiled.outputs[0]]))


def gru_int8(lbr: int, seed: int = 1) -> str:
    """Case 10: run vs the file's float arithmetic and the RNNSeq precisions of a forward GRU read through a
    FakeQuantize with int8 W and R per hidden unit, or why OpenVINO refused it."""
    rng = np.random.default_rng(seed)
    hidden, feat, steps = 16, 12, 20
    w, r = rng.normal(0, 0.3, (1, 3 * hidden, feat)), rng.normal(0, 0.3, (1, 3 * hidden, hidden))
    peak = np.maximum(np.abs(w).max(axis=2), np.abs(r).max(axis=2)).reshape(3, hidden).max(axis=0)
    scale = np.tile(peak / 127, 3).reshape(1, 3 * hidden, 1).astype(np.float32)
    inits = {"w8": np.clip(np.rint(w / scale), -127, 127).astype(np.int8), "r8": np.clip(np.rint(r / scale), -127, 127).astype(np.int8),
             "s": scale, "b": rng.normal(0, 0.1, (1, 6 * hidden)).astype(np.float32),
             "lo": np.float32(-2), "hi": np.float32(2), "glo": np.float32(-128 / 127), "ghi": np.float32(1)}
    nodes = [_fq("x", "lo", "hi", "xq"), helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wf", "s"], ["w"]), helper.make_node("Cast", ["r8"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["rf", "s"], ["r"]),
             helper.make_node("GRU", ["xq", "w", "r", "b"], ["out"], hidden_size=hidden, linear_before_reset=lbr)]
    nodes[0].input[3:] = ["glo", "ghi"]
    m = _model(nodes, {"x": ["T", 1, feat]}, inits)
    x = {"x": rng.uniform(-2, 2, (steps, 1, feat)).astype(np.float32)}
    try:
        session = simulate.runtime("openvino", m.SerializeToString())
        run = np.asarray(session.run(None, x)[0])
    except Exception as e:  # OpenVINO refusing it is the finding
        lines = [line for line in str(e).splitlines() if "primitive" in line or "could not" in line]
        return f"does not compile ({(lines or [str(e).splitlines()[-1]])[0].strip()[:90]})"
    precisions = sorted(str(op.get_rt_info()["runtimePrecision"].astype(str)) for op in session.compiled.get_runtime_model().get_ops()
                        if str(op.get_rt_info()["layerType"].astype(str)) == "RNNSeq")
    return f"{_sqnr(_exact(m, x), run):6.1f} ({'/'.join(precisions)})"


def bias_to_first_channel(rng) -> tuple[float, float]:
    """(run vs exact with the bias in the Conv, with it an Add after a Conv without one), dB: a Conv whose output's
    height sizes a Resize, on a dynamic shape (CRAFT's upsampling to its skip's size; OpenVINO 2026.4 moves the ShapeOf
    where a Gather reads one dimension of it, not where one Gather reads both)."""
    c = 16
    bias = rng.normal(0, 0.5, c).astype(np.float32)
    inits = {"w": (rng.integers(-63, 64, (c, c, 3, 3)) * 0.004).astype(np.float32), "b": bias, "b4": bias.reshape(1, c, 1, 1),
             "lo": np.float32(0), "hi_x": np.float32(1), "hi": np.float32(1.5), "h": np.array([2], np.int64),
             "nc": np.array([1, 4], np.int64), "w_": np.array([10], np.int64), "roi": np.array([], np.float32), "scales": np.array([], np.float32)}
    feeds = {"x": rng.uniform(0, 1, (1, c, 24, 20)).astype(np.float32), "y": rng.uniform(0, 1, (1, 4, 12, 10)).astype(np.float32)}
    out = []
    for in_conv in (True, False):
        conv = [helper.make_node("Conv", ["xq", "w", "b"], ["conv"], pads=[1, 1, 1, 1])] if in_conv else \
            [helper.make_node("Conv", ["xq", "w"], ["raw"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["raw", "b4"], ["conv"])]
        nodes = [_fq("x", "lo", "hi_x", "xq"), *conv, _fq("conv", "lo", "hi", "out"),
                 helper.make_node("Shape", ["conv"], ["shape"]), helper.make_node("Gather", ["shape", "h"], ["height"], axis=0),
                 helper.make_node("Concat", ["nc", "height", "w_"], ["sizes"], axis=0),
                 helper.make_node("Resize", ["y", "roi", "scales", "sizes"], ["up"], mode="nearest")]
        m = _model(nodes, {"x": ["N", c, "H", "W"], "y": ["N", 4, "h", "w"]}, inits)
        m.graph.output.append(helper.make_tensor_value_info("up", TensorProto.FLOAT, None))
        out.append(_sqnr(_exact(m, feeds), _run(m, feeds)))
    return out[0], out[1]


def batch_read(seed: int = 1) -> tuple[float, float, float]:
    """(run vs exact with the bias in the Conv, with it an Add after a Conv without one, without the batch read), dB:
    an int8 Conv with a bias whose quantized output another Conv reads, whose output's batch size sizes a zero tensor
    (Shape -> Gather -> ConstantOfShape, a second output), on a dynamic batch. Its own seed: where the int8 Conv's output
    falls on a rounding tie of the FakeQuantize fused into it, OpenVINO may round it to the other code (76 dB in
    every form, on the sequence of the other cases' generator)."""
    rng = np.random.default_rng(seed)
    c = 8
    bias = rng.normal(0, 0.5, c).astype(np.float32)
    inits = {"w8": rng.integers(-63, 64, (c, 1, 3, 3)).astype(np.int8), "ws": np.full((c, 1, 1, 1), 0.01, np.float32),
             "b": bias, "b3": bias.reshape(c, 1, 1), "w2": (rng.integers(-63, 64, (c, c, 3, 3)) * 0.01).astype(np.float32),
             "lo": np.float32(0), "hi_x": np.float32(1), "hi": np.float32(1.5), "batch_axis": np.array([0], np.int64)}
    feeds = {"x": rng.uniform(0, 1, (2, 1, 20, 24)).astype(np.float32)}
    out = []
    for in_conv, read in ((True, True), (False, True), (True, False)):
        conv = [helper.make_node("Conv", ["xq", "w", "b"], ["conv"], pads=[1, 1, 1, 1])] if in_conv else \
            [helper.make_node("Conv", ["xq", "w"], ["raw"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["raw", "b3"], ["conv"])]
        nodes = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"]),
                 _fq("x", "lo", "hi_x", "xq"), *conv, helper.make_node("Relu", ["conv"], ["act"]), _fq("act", "lo", "hi", "actq"),
                 helper.make_node("Conv", ["actq", "w2"], ["out"], pads=[1, 1, 1, 1])]
        if read:
            nodes += [helper.make_node("Shape", ["out"], ["shape"]), helper.make_node("Gather", ["shape", "batch_axis"], ["batch"], axis=0),
                      helper.make_node("ConstantOfShape", ["batch"], ["zeros"])]
        m = _model(nodes, {"x": ["N", 1, "H", "W"]}, inits)
        if read:
            m.graph.output.append(helper.make_tensor_value_info("zeros", TensorProto.FLOAT, None))
        out.append(_sqnr(_exact(m, feeds), _run(m, feeds)))
    return out[0], out[1], out[2]
def branches_subtracted(rng) -> tuple[float, str]:
    """(run vs exact, dB; the runtime layer holding the Sub: its type and precision) of two u8 tensors of unequal
    ranges -> Sub -> Abs -> FakeQuantize -> int8 MatMul, on inputs that nearly cancel (two views of one photo)."""
    n = 512
    inits = {"lo": np.float32(0), "ha": np.float32(9.80859375), "hb": np.float32(9.83203125), "hs": np.float32(2.9072265625),
             "w8": rng.integers(-63, 64, (64, n)).astype(np.int8), "ws": np.full((64, 1), 0.01, np.float32)}
    nodes = [_fq("a", "lo", "ha", "aq"), _fq("b", "lo", "hb", "bq"), helper.make_node("Sub", ["aq", "bq"], ["d"], name="sub"),
             helper.make_node("Abs", ["d"], ["ad"]), _fq("ad", "lo", "hs", "q"),
             helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["wd"]),
             helper.make_node("Transpose", ["wd"], ["w"], perm=[1, 0]), helper.make_node("MatMul", ["q", "w"], ["out"])]
    m = _model(nodes, {"a": ["N", n], "b": ["N", n]}, inits)
    common = rng.uniform(0, 3, (8, n)).astype(np.float32)
    feeds = {k: common + rng.normal(0, 0.05, common.shape).astype(np.float32) for k in ("a", "b")}
    session = simulate.runtime("openvino", m.SerializeToString())
    run = np.asarray(session.run(None, feeds)[0])
    held = [f"{op.get_rt_info()['layerType'].astype(str)} {op.get_rt_info()['runtimePrecision'].astype(str)}"
            for op in session.compiled.get_runtime_model().get_ops()
            if "sub" in str(op.get_rt_info()["originalLayersNames"].astype(str)).split(",")]
    return _sqnr(_exact(m, feeds), run), "/".join(held) or "none"


def mask_scale(scale: float, where: bool = False) -> float:
    """Case 11: run vs exact, dB, of a causal mask (a > b) times `scale`, as Cast and Mul or (where) Where(a > b,
    scale, scale * 0), plus a padding mask of ones of a dynamic shape, Equal 0 -> Where(scale, mask); a lone
    FakeQuantize on another input (OpenVINO runs its low-precision transformations on any model with one)."""
    t = 8
    inits = {"c": np.float32(scale), "cz": np.float32(scale) * np.float32(0), "zero": np.float32(0), "ax": np.array([1], np.int64),
             "lo": np.float32(-1), "hi": np.float32(1)}
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"])]
    nodes += [helper.make_node("Where", ["g", "c", "cz"], ["m"])] if where else \
        [helper.make_node("Cast", ["g"], ["gf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["gf", "c"], ["m"])]
    nodes += [helper.make_node("Shape", ["y"], ["ys"]),
              helper.make_node("ConstantOfShape", ["ys"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
              helper.make_node("Unsqueeze", ["ones", "ax"], ["padding"]), helper.make_node("Add", ["m", "padding"], ["s"]),
              helper.make_node("Equal", ["s", "zero"], ["e"]), helper.make_node("Where", ["e", "c", "m"], ["out"]), _fq("x", "lo", "hi", "xq")]
    m = _model(nodes, {"a": [t, 1], "b": [1, t], "y": ["N", t], "x": ["N", 4]}, inits)
    m.graph.output.append(helper.make_tensor_value_info("xq", TensorProto.FLOAT, None))
    feeds = {"a": np.arange(t, dtype=np.float32).reshape(t, 1), "b": np.arange(t, dtype=np.float32).reshape(1, t),
             "y": np.zeros((4, t), np.float32), "x": np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)}
    return _sqnr(_exact(m, feeds), _run(m, feeds))


def _se_gate(rng, c: int, kernel: int) -> tuple[dict, list]:
    """(initializers, nodes) of PP-OCR's squeeze-excitation gate as qtool's file writes it, for cases 12 and 14:
    x -> FakeQuantize -> Conv (kernel x kernel, int8 weights Cast and scaled: qtool's compressed form) -> c ->
    FakeQuantize -> cq -> GlobalAveragePool -> FakeQuantize -> 1x1 Conv -> Relu -> FakeQuantize -> 1x1 Conv ->
    HardSigmoid -> s (the gate; the caller multiplies and adds)."""
    inits = {"w8": rng.integers(-63, 64, (c, c, kernel, kernel)).astype(np.int8), "w28": rng.integers(-63, 64, (c, c, 1, 1)).astype(np.int8),
             "w38": rng.integers(-63, 64, (c, c, 1, 1)).astype(np.int8), "ws": np.full((c, 1, 1, 1), 0.004, np.float32),
             "lo": np.float32(-2), "hi": np.float32(2), "lo_x": np.float32(0), "hi_x": np.float32(1)}
    weight = lambda q, out: [helper.make_node("Cast", [q], [out + "_f"], to=TensorProto.FLOAT),  # noqa: E731
                             helper.make_node("Mul", [out + "_f", "ws"], [out])]
    pads = {"pads": [kernel // 2] * 4} if kernel > 1 else {}
    nodes = [_fq("x", "lo_x", "hi_x", "xq"), *weight("w8", "w"), helper.make_node("Conv", ["xq", "w"], ["c"], **pads),
             _fq("c", "lo", "hi", "cq"), helper.make_node("GlobalAveragePool", ["cq"], ["g"]), _fq("g", "lo", "hi", "gq"),
             *weight("w28", "w2"), helper.make_node("Conv", ["gq", "w2"], ["e"]), helper.make_node("Relu", ["e"], ["er"]),
             _fq("er", "lo_x", "hi", "erq"), *weight("w38", "w3"), helper.make_node("Conv", ["erq", "w3"], ["e3"]),
             helper.make_node("HardSigmoid", ["e3"], ["s"])]
    return inits, nodes


def pooled_fetched(rng) -> tuple[float, float]:
    """Case 12: (the GlobalAveragePool output fetched alone, fetched beside the Conv output it pools), run vs exact, dB:
    x -> FakeQuantize -> Conv (int8 weights Cast and scaled, qtool's compressed form) -> c -> FakeQuantize -> cq; cq ->
    GlobalAveragePool -> g -> FakeQuantize -> 1x1 Conv -> Relu -> 1x1 Conv -> HardSigmoid -> Mul cq -> FakeQuantize ->
    Add cq (PP-OCRv6's squeeze-excitation and residual)."""
    c = 16
    inits, nodes = _se_gate(rng, c, 3)
    nodes += [_fq("s", "lo_x", "hi_x", "sq"), helper.make_node("Mul", ["cq", "sq"], ["m"]), _fq("m", "lo", "hi", "mq"),
              helper.make_node("Add", ["mq", "cq"], ["out"])]
    feeds = {"x": rng.uniform(0, 1, (1, c, 32, 32)).astype(np.float32)}
    out = []
    for fetched in (["g"], ["g", "c"]):
        m = _model(nodes, {"x": ["N", c, "H", "W"]}, inits)
        simulate.with_outputs(m, fetched)
        exact = simulate.simulation(m.SerializeToString()).run(["g"], feeds)[0]
        run = simulate.runtime("openvino", m.SerializeToString()).run(["g"], feeds)[0]
        out.append(_sqnr(exact, run))
    return out[0], out[1]


def axes_dropped(op: str) -> tuple[str, float, float]:
    """Case 13: (the run's output shape at opset 13, run vs onnxruntime at opset 12, run vs onnxruntime of the spelled
    form at opset 13), dB: x [2, 3, 4] -> op(axes [-1], keepdims 0) -> out."""
    import onnxruntime as ort

    from qtool.model import graph as G
    from qtool.targets import reductions

    feeds = {"x": np.random.default_rng(13).uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)}

    def at(opset: int, spelled: bool = False) -> onnx.ModelProto:
        node = helper.make_node(op, ["x"], ["out"], axes=[-1], keepdims=0)
        g = helper.make_graph([node], "quirk", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        if spelled:
            reductions.spell_misread(m, G.Namer(m))
        return m

    ref = ort.InferenceSession(at(12).SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    shape = str(list(_run(at(13), feeds).shape))
    old, spelled = _run(at(12), feeds), _run(at(13, spelled=True), feeds)
    return shape, (_sqnr(ref, old) if old.shape == ref.shape else float("-inf")), \
        (_sqnr(ref, spelled) if spelled.shape == ref.shape else float("-inf"))


def se_mul_float(rng, quantized: bool = False, static: bool = False) -> float:
    """Case 14: run vs exact, dB, of a squeeze-excitation block whose gating Mul reads the Conv output c float
    (`quantized`: its quantized cq, qtool's file), on a dynamic-shape input (`static`: fixed [1, c, 32, 32])."""
    c = 16
    inits, nodes = _se_gate(rng, c, 1)
    nodes += [helper.make_node("Mul", ["cq" if quantized else "c", "s"], ["m"]), _fq("m", "lo", "hi", "mq"),
              helper.make_node("Add", ["mq", "cq"], ["out"])]
    feeds = {"x": rng.uniform(0, 1, (1, c, 32, 32)).astype(np.float32)}
    m = _model(nodes, {"x": [1, c, 32, 32] if static else ["N", c, "H", "W"]}, inits)
    return _sqnr(_exact(m, feeds), _run(m, feeds))


def unbiased_read_twice(rng, bias: float | None) -> float:
    """Case 15: run vs exact, dB, of y - ReduceMean(y) for an int8 Conv's output y with no bias (`bias` None) or a
    bias of `bias` in every channel."""
    c, k = 16, 8
    inits = {"w8": rng.integers(-63, 64, (k, c, 1)).astype(np.int8), "ws": rng.uniform(0.005, 0.02, (k, 1, 1)).astype(np.float32),
             "lo": np.float32(0), "hi": np.float32(4)}
    if bias is not None:
        inits["b"] = np.full(k, bias, np.float32)
    nodes = [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"]),
             _fq("x", "lo", "hi", "xq"), helper.make_node("Conv", ["xq", "w"] + (["b"] if bias is not None else []), ["y"], kernel_shape=[1]),
             helper.make_node("ReduceMean", ["y"], ["m"], axes=[2], keepdims=1), helper.make_node("Sub", ["y", "m"], ["out"])]
    feeds = {"x": rng.uniform(0, 4, (2, c, 32)).astype(np.float32)}
    m = _model(nodes, {"x": ["N", c, "T"]}, inits)
    return _sqnr(_exact(m, feeds), _run(m, feeds))


MATMUL_GRIDS = {"asymmetric": (-0.5, 3.0), "symmetric": (-2.0 * 128 / 127, 2.0), "unsigned": (0.0, 3.0)}


def matmul_grid(rng, grid: str, weights: bool) -> tuple[float, str]:
    """Case 16: (run vs exact, dB; the runtime MatMul/FullyConnected layer's type and input precisions) of x on
    MATMUL_GRIDS[grid] -> FakeQuantize -> MatMul with int8 weights (`weights`), or -> MatMul with y -> FakeQuantize
    (symmetric, its values within half its range: no u8 x s8 pair sum passes int16 on AVX2) of the same shape
    transposed: x [1, 2, 20, 64] times y [1, 2, 64, 20]."""
    lo, hi = MATMUL_GRIDS[grid]
    inits = {"lo": np.float32(lo), "hi": np.float32(hi), "ylo": np.float32(-128 / 127), "yhi": np.float32(1)}
    nodes = [_fq("x", "lo", "hi", "xq")]
    if weights:
        inits |= {"w8": rng.integers(-63, 64, (64, 48)).astype(np.int8), "ws": rng.uniform(0.005, 0.02, (1, 48)).astype(np.float32)}
        nodes += [helper.make_node("Cast", ["w8"], ["wf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["wf", "ws"], ["w"]),
                  helper.make_node("MatMul", ["xq", "w"], ["out"], name="mm")]
        inputs = {"x": ["N", 20, 64]}
        feeds = {"x": rng.uniform(lo, hi, (2, 20, 64)).astype(np.float32)}
    else:
        nodes += [_fq("y", "ylo", "yhi", "yq"), helper.make_node("MatMul", ["xq", "yq"], ["out"], name="mm")]
        inputs = {"x": [1, 2, 20, 64], "y": [1, 2, 64, 20]}
        feeds = {"x": rng.uniform(lo, hi, (1, 2, 20, 64)).astype(np.float32), "y": rng.uniform(-0.49, 0.49, (1, 2, 64, 20)).astype(np.float32)}
    m = _model(nodes, inputs, inits)
    session = simulate.runtime("openvino", m.SerializeToString())
    run = np.asarray(session.run(None, feeds)[0])
    held = [f"{op.get_rt_info()['layerType'].astype(str)} "
            + "x".join(str(op.input(i).get_element_type().get_type_name()) for i in range(min(2, op.get_input_size())))
            for op in session.compiled.get_runtime_model().get_ops()
            if str(op.get_rt_info()["layerType"].astype(str)) in ("MatMul", "FullyConnected")]
    return _sqnr(_exact(m, feeds), run), "/".join(held) or "none"


def main() -> None:
    import openvino as ov

    from qtool.quantizers import cpu_kinds

    rng = np.random.default_rng(0)
    print(f"OpenVINO {ov.__version__}, f32; this CPU: {'VNNI' if cpu_kinds.vnni() else 'no VNNI'}; run vs reference, dB ({SAME:.0f}+: the same)")
    vs_file, vs_clamp, vs_sim, alone_file, alone_sim = rounding_dropped(rng)
    still = vs_clamp >= SAME > vs_file
    print(f"1. Conv -> FakeQuantize -> residual Add -> FakeQuantize: run vs file {vs_file:6.1f}, vs the FakeQuantize as a clamp"
          f" {vs_clamp:6.1f}, vs qtool's simulation {vs_sim:6.1f}"
          f"  -> {'rounding still dropped' if still else 'rounds as the file says' if vs_file >= SAME else 'neither: look closer'}"
          f"{'' if vs_sim >= SAME else '; QTOOL SIMULATES IT OTHERWISE'}")
    print(f"   no FakeQuantize after the Add:                        run vs file {alone_file:6.1f}, vs qtool's simulation {alone_sim:6.1f}"
          f"  -> {'rounds as the file says' if alone_file >= SAME else 'rounding dropped here too: look closer'}")
    floats, ints = signs_folded(rng)
    print(f"2. Mul by float signs -> FakeQuantize, dynamic shape: run vs file {floats:6.1f}; int8 signs Cast: {ints:6.1f}"
          f"  -> {'float signs still miscompiled' if floats < SAME else 'float signs run right now'}"
          f"{'' if ints >= SAME else '; THE INT8 FORM IS WRONG TOO: qtool flips are affected'}")
    floats, ints = signs_folded(rng, nhwc=True)
    print(f"3. the same below a Transpose of an NHWC input:   run vs file {floats:6.1f}; int8 signs Cast: {ints:6.1f}"
          f"  -> {'float signs miscompiled' if floats < SAME else 'float signs run right'}, int8 signs {'right' if ints >= SAME else 'WRONG'}")
    for op in ("ReduceMax", "ReduceMin"):
        after, before = reduction_fused(rng, op)
        print(f"4. {op} -> FakeQuantize -> int8 MatMul:        run vs file {after:6.1f}; FakeQuantize before it: {before:6.1f}"
              f"  -> {'still fused wrong' if after < SAME else 'runs right now'}"
              f"{'' if before >= SAME else '; THE MOVED FORM IS WRONG TOO: qtool files are affected'}")
    for dirs in (1, 2):
        cells = {layout: lstm_scales(layout, dirs) for layout in ("row", "direction", "unit")}
        ok = cells["unit"][0] >= LSTM_SAME and "f32" not in cells["unit"][1]
        print(f"5. int8 LSTM, {'bidirectional' if dirs == 2 else 'forward':13}: run vs file per row "
              + ", per direction ".join(f"{db:6.1f} ({p})" for db, p in (cells["row"], cells["direction"]))
              + f", per unit {cells['unit'][0]:6.1f} ({cells['unit'][1]})"
              + f"  -> {'per-unit scales int8 and right' if ok else 'PER-UNIT SCALES DO NOT RUN AS THE FILE SAYS: qtool files are affected'}"
              + f"{'; per row now right' if cells['row'][0] >= LSTM_SAME and 'f32' not in cells['row'][1] else ''}")

    in_conv, as_add = bias_to_first_channel(rng)
    print(f"6. Conv with a bias -> FakeQuantize, its shape read: run vs file {in_conv:6.1f}; the bias an Add after it: {as_add:6.1f}"
          f"  -> {'bias still applied per tensor' if in_conv < SAME else 'runs right now'}"
          f"{'' if as_add >= SAME else '; THE ADD FORM IS WRONG TOO: qtool files are affected'}")

    in_conv, as_add, unread = batch_read()
    print(f"7. Conv with a bias -> FakeQuantize, the batch read downstream: run vs file {in_conv:6.1f}; the bias an Add after it: "
          f"{as_add:6.1f}; no batch read: {unread:6.1f}  -> {'bias still applied per tensor' if in_conv < SAME else 'runs right now'}"
          f"{'' if as_add >= SAME else '; THE ADD FORM IS WRONG TOO: qtool files are affected'}")
    cached, uncached, forward = lstm_pair(2), lstm_pair(2, cache=False), lstm_pair(1)
    padded, forward_padded = lstm_pair(2, pad=1), lstm_pair(1, pad=1)
    print(f"8. two int8 LSTMs of one shape: bidirectional run vs file {cached:6.1f}, runtime cache off {uncached:6.1f}, "
          f"padded {padded:6.1f}; forward {forward:6.1f}, padded {forward_padded:6.1f}"
          f"  -> {'the second still runs with the first one' if max(cached, forward) < LSTM_SAME <= uncached else 'runs right now' if min(cached, forward) >= LSTM_SAME else 'look closer'}"
          f"{'' if min(padded, forward_padded) >= LSTM_SAME else '; THE PADDED FORM IS WRONG TOO: qtool files are affected'}")

    subtracted, layer = branches_subtracted(rng)
    print(f"9. two u8 branches of unequal ranges -> Sub -> Abs -> FakeQuantize: run vs file {subtracted:6.1f} (the Sub in: {layer})"
          f"  -> {'runs as the file says' if subtracted >= SAME else 'SUB OF TWO BRANCHES COMPUTED OTHERWISE: qtool files are affected'}")
    print(f"10. GRU with int8 W, R per unit: linear_before_reset=0 run vs file {gru_int8(0)}; linear_before_reset=1 {gru_int8(1)}")
    lowest, big, normal, where = (mask_scale(float(np.finfo(np.float32).min)), mask_scale(-1e38), mask_scale(-8e37),
                                  mask_scale(float(np.finfo(np.float32).min), where=True))
    print(f"11. bool mask -> Cast -> Mul by a huge c -> Add ones -> Equal 0: run vs file c = finfo.min {lowest:6.1f}, -1e38 {big:6.1f}, "
          f"-8e37 {normal:6.1f}; Where form {where:6.1f}"
          f"  -> {'the Add still loses its other input' if max(lowest, big) < SAME <= normal else 'runs right now' if min(lowest, big) >= SAME else 'look closer'}"
          f"{'' if where >= SAME else '; THE WHERE FORM IS WRONG TOO: qtool files are affected'}")
    alone, beside = pooled_fetched(rng)
    print(f"12. (evaluate's departures) a GlobalAveragePool output fetched: alone, run vs file {alone:6.1f}; beside the Conv output it "
          f"pools {beside:6.1f}  -> {'still handed back wrong beside its input' if beside < 20 <= alone else 'fetched right now' if beside >= 20 else 'look closer'}")
    for op in reductions_misread():
        shape, old, spelled = axes_dropped(op)
        print(f"13. {op}(axes [-1]) of [2, 3, 4], opset 13: run's shape {shape} (the model's [2, 3]); opset 12 run vs onnxruntime "
              f"{old:6.1f}; qtool's spelled form {spelled:6.1f}  -> {'axes still dropped' if shape != '[2, 3]' else 'reads the axes now'}"
              f"{'' if spelled >= SAME else '; THE SPELLED FORM IS WRONG TOO: qtool files are affected'}")
    dynamic, static, quantized = se_mul_float(rng), se_mul_float(rng, static=True), se_mul_float(rng, quantized=True)
    print(f"14. float squeeze-excitation Mul, dynamic shape: run vs file {dynamic:6.1f}; static {static:6.1f}; the Mul reading the "
          f"quantized tensor {quantized:6.1f}  -> {'still computed otherwise' if dynamic < 20 <= static else 'runs right now' if dynamic >= 20 else 'look closer'}"
          f"{'' if quantized >= 20 else '; THE QUANTIZED FORM IS WRONG TOO: qtool files are affected'}")
    none, zero, tiny = (unbiased_read_twice(rng, None), unbiased_read_twice(rng, 0.0),
                        unbiased_read_twice(rng, float(np.finfo(np.float32).tiny)))
    print(f"15. int8 Conv without a bias, y - ReduceMean(y): run vs file {none:6.1f}; a zero bias {zero:6.1f}; a bias of 1.2e-38 {tiny:6.1f}"
          f"  -> {'a reader still handed y scaled again' if max(none, zero) < 20 <= tiny else 'runs right now' if min(none, zero) >= SAME else 'look closer'}"
          f"{'' if tiny >= SAME else '; THE TINY-BIAS FORM IS WRONG TOO: qtool files are affected'}")

    for weights in (True, False):
        cells = {grid: matmul_grid(rng, grid, weights) for grid in MATMUL_GRIDS}
        f32 = [grid for grid, (_, layer) in cells.items() if "f32" in layer]
        print(f"16. FakeQuantize -> MatMul {'with int8 weights  ' if weights else 'of two activations'}: run vs file "
              + ", ".join(f"{grid} {db:6.1f} ({layer})" for grid, (db, layer) in cells.items())
              + f"  -> {'int8 on every grid' if not f32 else 'f32 on ' + ', '.join(f32)}"
              + ("" if all(db >= SAME for db, _ in cells.values()) else "; A GRID RUNS OTHERWISE THAN THE FILE: look closer")
              + ("" if "f32" not in cells["symmetric"][1] else "; THE SYMMETRIC GRID RUNS F32 TOO: qtool files are affected"))


def reductions_misread() -> tuple[str, ...]:
    from qtool.targets import reductions

    return reductions.MISREAD


if __name__ == "__main__":
    main()
