"""A YOLOv8n look-alike (random weights) for benchmarks: the nano model as Ultralytics exports it.

Built with onnx.helper so benchmarks need nothing but the runtime dependencies. The graph follows
ultralytics' yolov8.yaml at scale n (depth 0.33, width 0.25) exported by torch.onnx at opset 17
with the default fixed input (1x3x320x320 here): channel widths 16/32/64/128/256, Conv + SiLU
(Sigmoid * Mul), C2f blocks (1x1 conv, Split in two, 1 or 2 bottlenecks of two 3x3 convs with a
residual Add in the backbone, Concat, 1x1 conv), SPPF (MaxPool x3 + Concat), the FPN/PAN neck
with Resize and Concat, and the Detect head (64-channel box and 80-channel class branches per
level) with its decode: Reshape/Concat over the levels, Split, DFL (Reshape, Transpose, Softmax,
1x1 conv with weights 0..15), dist2bbox against constant anchors (Sub/Add/Div/Concat), Mul by
the strides, Sigmoid on the classes. Its plain inference costs what the real YOLOv8n's does.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.n = 0

    def name(self, kind: str) -> str:
        self.n += 1
        return f"/model/{kind}_{self.n}"

    def const(self, value: np.ndarray, kind: str = "const") -> str:
        name = self.name(kind)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int = 3, s: int = 1, act: bool = True) -> str:
        base = self.name("conv")
        w = (self.rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
        self.inits += [numpy_helper.from_array(w, base + ".weight"), numpy_helper.from_array(b, base + ".bias")]
        out = base + "/Conv_output_0"
        self.nodes.append(helper.make_node("Conv", [x, base + ".weight", base + ".bias"], [out], name=base + "/Conv",
                                           kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4))
        if not act:
            return out
        sig, mul = base + "/Sigmoid_output_0", base + "/Mul_output_0"
        self.nodes.append(helper.make_node("Sigmoid", [out], [sig], name=base + "/Sigmoid"))
        self.nodes.append(helper.make_node("Mul", [out, sig], [mul], name=base + "/Mul"))
        return mul

    def op(self, op: str, inputs: list[str], outputs: int = 1, **attrs) -> str | list[str]:
        base = self.name(op.lower())
        outs = [base + f"/{op}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=base + "/" + op, **attrs))
        return outs[0] if outputs == 1 else outs

    def c2f(self, x: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
        c = cout // 2
        y = self.conv(x, cin, 2 * c, 1)
        a, b = self.op("Split", [y, self.const(np.array([c, c], np.int64), "split")], outputs=2, axis=1)
        parts, cur = [a, b], b
        for _ in range(n):
            z = self.conv(self.conv(cur, c, c, 3), c, c, 3)
            cur = self.op("Add", [cur, z]) if shortcut else z
            parts.append(cur)
        return self.conv(self.op("Concat", parts, axis=1), (2 + n) * c, cout, 1)

    def sppf(self, x: str, cin: int, cout: int) -> str:
        c = cin // 2
        y = self.conv(x, cin, c, 1)
        p1 = self.op("MaxPool", [y], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
        p2 = self.op("MaxPool", [p1], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
        p3 = self.op("MaxPool", [p2], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
        return self.conv(self.op("Concat", [y, p1, p2, p3], axis=1), 4 * c, cout, 1)

    def up(self, x: str) -> str:
        return self.op("Resize", [x, "", self.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _anchors(size: int, strides=(8, 16, 32)) -> tuple[np.ndarray, np.ndarray]:
    """Ultralytics' make_anchors: cell centres (x, y) per level and each anchor's stride."""
    points, stride = [], []
    for s in strides:
        h = w = size // s
        sy, sx = np.meshgrid(np.arange(h, dtype=np.float32) + 0.5, np.arange(w, dtype=np.float32) + 0.5, indexing="ij")
        points.append(np.stack([sx.ravel(), sy.ravel()]))
        stride.append(np.full(h * w, s, np.float32))
    return np.concatenate(points, axis=1)[None], np.concatenate(stride)[None, None]


def detector(size: int = 320, width: float = 1.0, seed: int = 0, batch: int | str = 1, classes: int = 80) -> onnx.ModelProto:
    """YOLOv8n-like detector: input [batch, 3, size, size] (fixed batch 1 as Ultralytics exports
    by default; a string makes it dynamic), output [batch, 4 + classes, anchors]."""
    B = _Builder(seed)
    ch = [int(c * width) for c in (16, 32, 64, 128, 256)]
    x = B.conv("images", 3, ch[0], 3, 2)
    x = B.conv(x, ch[0], ch[1], 3, 2)
    x = B.c2f(x, ch[1], ch[1], 1, True)
    x = B.conv(x, ch[1], ch[2], 3, 2)
    p3 = B.c2f(x, ch[2], ch[2], 2, True)
    x = B.conv(p3, ch[2], ch[3], 3, 2)
    p4 = B.c2f(x, ch[3], ch[3], 2, True)
    x = B.conv(p4, ch[3], ch[4], 3, 2)
    x = B.c2f(x, ch[4], ch[4], 1, True)
    p5 = B.sppf(x, ch[4], ch[4])
    n4 = B.c2f(B.op("Concat", [B.up(p5), p4], axis=1), ch[4] + ch[3], ch[3], 1, False)
    n3 = B.c2f(B.op("Concat", [B.up(n4), p3], axis=1), ch[3] + ch[2], ch[2], 1, False)
    d4 = B.c2f(B.op("Concat", [B.conv(n3, ch[2], ch[2], 3, 2), n4], axis=1), ch[2] + ch[3], ch[3], 1, False)
    d5 = B.c2f(B.op("Concat", [B.conv(d4, ch[3], ch[3], 3, 2), p5], axis=1), ch[3] + ch[4], ch[4], 1, False)
    reg = 16
    box_c, cls_c, no = max(16, ch[2] // 4, 4 * reg), max(ch[2], min(classes, 100)), 4 * reg + classes
    levels = []
    for feat, c in ((n3, ch[2]), (d4, ch[3]), (d5, ch[4])):
        box = B.conv(B.conv(B.conv(feat, c, box_c, 3), box_c, box_c, 3), box_c, 4 * reg, 1, act=False)
        cls = B.conv(B.conv(B.conv(feat, c, cls_c, 3), cls_c, cls_c, 3), cls_c, classes, 1, act=False)
        out = B.op("Concat", [box, cls], axis=1)
        levels.append(B.op("Reshape", [out, B.const(np.array([batch if isinstance(batch, int) else 0, no, -1], np.int64),
                                                    "shape")]))
    y = B.op("Concat", levels, axis=2)
    box, cls = B.op("Split", [y, B.const(np.array([4 * reg, classes], np.int64), "split")], outputs=2, axis=1)
    # DFL: softmax over the 16 distance bins of each side, expectation by a 1x1 conv with weights 0..15
    d = B.op("Reshape", [box, B.const(np.array([batch if isinstance(batch, int) else 0, 4, reg, -1], np.int64), "shape")])
    d = B.op("Softmax", [B.op("Transpose", [d], perm=[0, 2, 1, 3])], axis=1)
    dfl = B.const(np.arange(reg, dtype=np.float32).reshape(1, reg, 1, 1), "dfl.weight")
    d = B.op("Conv", [d, dfl], kernel_shape=[1, 1])
    d = B.op("Reshape", [d, B.const(np.array([batch if isinstance(batch, int) else 0, 4, -1], np.int64), "shape")])
    lt, rb = B.op("Split", [d, B.const(np.array([2, 2], np.int64), "split")], outputs=2, axis=1)
    points, strides = _anchors(size)
    anchors, stride = B.const(points, "anchors"), B.const(strides, "strides")
    x1y1 = B.op("Sub", [anchors, lt])
    x2y2 = B.op("Add", [anchors, rb])
    centre = B.op("Div", [B.op("Add", [x1y1, x2y2]), B.const(np.array(2.0, np.float32), "two")])
    wh = B.op("Sub", [x2y2, x1y1])
    dbox = B.op("Mul", [B.op("Concat", [centre, wh], axis=1), stride])
    B.nodes.append(helper.make_node("Concat", [dbox, B.op("Sigmoid", [cls])], ["output0"], axis=1, name="/model/out/Concat"))
    graph = helper.make_graph(
        B.nodes, "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [batch, 4 + classes, None])],
        B.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="qtool-bench", ir_version=8)
    onnx.checker.check_model(model)
    return model


def photos(folder, count: int, size: int = 384, seed: int = 0) -> list:
    """`count` smooth random RGB JPEGs (blurred noise with gradients), written once."""
    from pathlib import Path

    from PIL import Image, ImageFilter

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = sorted(folder.glob("*.jpg"))
    if len(paths) >= count:
        return paths[:count]
    rng = np.random.default_rng(seed)
    for i in range(count):
        base = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        img = Image.fromarray(base).resize((size, size), Image.BICUBIC).filter(ImageFilter.GaussianBlur(2))
        img.save(folder / f"img_{i:04d}.jpg", quality=90)
    return sorted(folder.glob("*.jpg"))[:count]
