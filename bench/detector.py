"""A YOLOv8n-sized detector graph (random weights) for benchmarks: 320x320 input, ~300 float tensors.

Built with onnx.helper so benchmarks need nothing but the runtime dependencies. The structure
imitates a PyTorch YOLOv8 export: Conv + SiLU (Sigmoid * Mul), C2f blocks with Split/Concat and
residual Adds, SPPF (MaxPool x3 + Concat), an FPN/PAN neck with Resize and Concat, and three heads.
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

    def op(self, op: str, inputs: list[str], **attrs) -> str:
        base = self.name(op.lower())
        out = base + f"/{op}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=base + "/" + op, **attrs))
        return out

    def c2f(self, x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
        c = cout // 2
        y = self.conv(x, cin, 2 * c, 1)
        a, b = self.name("split") + "/a", self.name("split") + "/b"
        split = self.name("split_sizes")
        self.inits.append(numpy_helper.from_array(np.array([c, c], np.int64), split))
        self.nodes.append(helper.make_node("Split", [y, split], [a, b], axis=1, name=split + "/Split"))
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
        scales = self.name("scales")
        self.inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), scales))
        return self.op("Resize", [x, "", scales], mode="nearest")


def detector(size: int = 320, width: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """YOLOv8n-like detector with dynamic batch; about 300 float activation tensors."""
    B = _Builder(seed)
    ch = [int(c * width) for c in (16, 32, 64, 128, 256)]
    x = B.conv("images", 3, ch[0], 3, 2)
    x = B.conv(x, ch[0], ch[1], 3, 2)
    x = B.c2f(x, ch[1], ch[1], 1)
    x = B.conv(x, ch[1], ch[2], 3, 2)
    p3 = B.c2f(x, ch[2], ch[2], 2)
    x = B.conv(p3, ch[2], ch[3], 3, 2)
    p4 = B.c2f(x, ch[3], ch[3], 2)
    x = B.conv(p4, ch[3], ch[4], 3, 2)
    x = B.c2f(x, ch[4], ch[4], 1)
    p5 = B.sppf(x, ch[4], ch[4])
    n4 = B.c2f(B.op("Concat", [B.up(p5), p4], axis=1), ch[4] + ch[3], ch[3], 2, False)
    n3 = B.c2f(B.op("Concat", [B.up(n4), p3], axis=1), ch[3] + ch[2], ch[2], 2, False)
    d4 = B.c2f(B.op("Concat", [B.conv(n3, ch[2], ch[2], 3, 2), n4], axis=1), ch[2] + ch[3], ch[3], 2, False)
    d5 = B.c2f(B.op("Concat", [B.conv(d4, ch[3], ch[3], 3, 2), p5], axis=1), ch[3] + ch[4], ch[4], 2, False)
    heads = []
    for feat, c in ((n3, ch[2]), (d4, ch[3]), (d5, ch[4])):
        box = B.conv(B.conv(B.conv(feat, c, 64, 3), 64, 64, 3), 64, 64, 1, act=False)
        cls = B.conv(B.conv(B.conv(feat, c, 80, 3), 80, 80, 3), 80, 80, 1, act=False)
        out = B.op("Concat", [B.op("Softmax", [box], axis=1), B.op("Sigmoid", [cls])], axis=1)
        shape = B.name("shape")
        B.inits.append(numpy_helper.from_array(np.array([0, 144, -1], np.int64), shape))
        heads.append(B.op("Reshape", [out, shape]))
    y = B.op("Concat", heads, axis=2)
    B.nodes.append(helper.make_node("Sigmoid", [y], ["output0"], name="/model/out/Sigmoid"))
    graph = helper.make_graph(
        B.nodes, "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 144, None])],
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
