"""SHA-256 of every export qtool writes, for a refactoring that must keep them byte-identical.

Calibrates each model once (the sample model on calib_images; with --dev, the real models of
fetch_dev_models.sh on generated inputs, as bench/fidelity.py makes them, fewer of them), then writes
each export variant below and prints one line per file: `model variant sha256`. Run it before and
after a change and diff the two outputs. Runs the qtool of the tree this script lives in, as the
command line (`python -m qtool`), so the files are what a user gets.

Usage:
  python scripts/export_hashes.py [--dev ~/.cache/qtool-dev] [--text DIR] [--calib 8] [--models a,b] > hashes.txt
  --text: a bench/transformers_data.py output folder (minilm/calib/*.npz, mpnet.onnx, mpnet/calib/*.npz)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# variant name: export arguments (after `export --calib FILE -o OUT`)
VARIANTS = {
    "openvino": ["--target", "openvino"],
    "openvino-vnni": ["--target", "openvino", "--cpu", "vnni"],
    "openvino-7bit-first": ["--target", "openvino", "--weights-7bit", "first"],
    "openvino-asym-nobc": ["--target", "openvino", "--activations", "auto", "--no-bias-correction"],
    "openvino-sq-off-nopat": ["--target", "openvino", "--smooth-quant", "off", "--no-ignored-patterns"],
    "qdq": ["--target", "qdq"],
    "qdq-vnni-mse": ["--target", "qdq", "--cpu", "vnni", "--method", "mse"],
    "tensorrt": ["--target", "tensorrt"],
    "tensorrt-int8w": ["--target", "tensorrt", "--weights", "int8", "--trt-version", "10.3"],
    "tensorrt-fp32hp": ["--target", "tensorrt", "--high-precision", "fp32"],
    "tensorrt-fp8": ["--target", "tensorrt", "--precision", "fp8"],
    "tensorrt-cache86": ["--target", "tensorrt", "--trt-version", "8.6"],
    "tensorrt-dynrange": ["--target", "tensorrt", "--format", "dynamic-range", "--trt-version", "10.3"],
}


def qtool(*args, cwd: Path) -> str | None:
    """Runs the command line; None when it succeeded, else `exit N: <its error line>` (a variant a model
    cannot take is a line of the output, not the end of the run)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "qtool", "-q", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True)
    return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}" if r.returncode else None


def digest(path: Path) -> str:
    """SHA-256 of the file; of an ONNX file without its provenance record (qtool.provenance names the
    calibration file by its hash and the options as given, which a refactoring may word otherwise)."""
    data = path.read_bytes()
    try:
        import onnx

        model = onnx.load_from_string(data)
    except Exception:  # not an ONNX file: a cache or a table
        return hashlib.sha256(data).hexdigest()
    kept = [p for p in model.metadata_props if p.key != "qtool.provenance"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def hash_model(name: str, model: Path, source: list[str], work: Path) -> None:
    out = work / name
    out.mkdir()
    calib = out / "m.calib.json"
    failed = qtool("calibrate", model, *source, "-o", calib, "--trt-table", out / "m.cache", cwd=out)
    print(f"{name} calibration-cache {failed or digest(out / 'm.cache')}", flush=True)
    if failed:
        return
    for variant, args in VARIANTS.items():
        path = out / f"{variant}.out"
        failed = qtool("export", "--calib", calib, "-o", path, *args, cwd=out)
        print(f"{name} {variant} {failed or digest(path)}", flush=True)


def dev_sources(dev: Path, n: int, work: Path, wanted) -> dict[str, tuple[Path, list[str]]]:
    """The fetch_dev_models.sh models with a folder of n generated calibration inputs each."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    from fidelity import MODELS, model_inputs

    photos = sorted((dev / "photos").glob("*.jpg"))
    found = {}
    for name, (file, task, shape, pre) in MODELS.items():
        if wanted and name not in wanted or not (dev / "models" / file).exists():
            continue
        folder = work / "inputs" / name
        folder.mkdir(parents=True)
        calib, _ = model_inputs(task, shape, pre, photos, n, 0)
        for i, x in enumerate(calib):
            np.save(folder / f"{i:04d}.npy", x)
        found[name] = (dev / "models" / file, ["--data", str(folder)])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dev", type=Path, help="fetch_dev_models.sh folder")
    ap.add_argument("--text", type=Path, help="bench/transformers_data.py output folder")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--models", default="", help="comma-separated subset (sample, ppocrv5_det, ..., minilm, mpnet)")
    args = ap.parse_args()
    wanted = set(filter(None, args.models.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = {"sample": (ROOT / "sample_models" / "digits_cnn.onnx", ["--images", str(ROOT / "calib_images")])}
        if args.dev:
            models.update(dev_sources(args.dev, args.calib, work, wanted))
            minilm = args.dev / "models" / "paraphrase-MiniLM-L3-v2.onnx"
            if args.text and minilm.exists():
                models["minilm"] = (minilm, ["--data", str(args.text / "minilm" / "calib"), "--limit", str(args.calib)])
        if args.text and (args.text / "mpnet.onnx").exists():
            models["mpnet"] = (args.text / "mpnet.onnx", ["--data", str(args.text / "mpnet" / "calib"), "--limit", str(args.calib)])
        for name, (model, source) in models.items():
            if not wanted or name in wanted:
                hash_model(name, model, source, work)


if __name__ == "__main__":
    main()
