"""Sentence encoders as onnxruntime's transformer optimizer writes them, as zoo entries for bench/zoo.py.

For each encoder (all-MiniLM-L6-v2 from bench/transformers_data.py's export, paraphrase-MiniLM-L3-v2 from
fetch_dev_models.sh) two entries: <name>_opt, the model after onnxruntime.transformers.optimizer.optimize_model(
model_type="bert", num_heads=12, hidden_size=384, opt_level=0): com.microsoft EmbedLayerNormalization, Attention,
SkipLayerNormalization and BiasGelu, as optimized encoders ship; and <name>_plain, the model as exported. Inputs:
bench/transformers_data.py --genres' batches, calibration on the "docs" genre, held out on "man" (real text).

Usage:
  python bench/ort_optimized.py OUT [--dev ~/.cache/qtool-dev] [--data ~/.cache/qtool-bench/transformers]
  python bench/zoo.py --zoo OUT --out results.json
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

ENCODERS = {  # name: (model file under --data or --dev, its genres folder under --data/genres)
    "l6": ("data", "minilm6.onnx", "minilm6"),
    "l3": ("dev", "models/paraphrase-MiniLM-L3-v2.onnx", "minilm"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache/qtool-dev")
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache/qtool-bench/transformers")
    args = ap.parse_args()
    from onnxruntime.transformers import optimizer

    for name, (root, file, genres) in ENCODERS.items():
        source = (args.dev if root == "dev" else args.data) / file
        optimized = optimizer.optimize_model(str(source), model_type="bert", num_heads=12, hidden_size=384, opt_level=0,
                                             use_gpu=False)
        for kind in ("opt", "plain"):
            folder = args.out / f"{name}_{kind}"
            folder.mkdir(parents=True, exist_ok=True)
            if kind == "opt":
                optimized.save_model_to_file(str(folder / "model.onnx"))
            else:
                shutil.copy(source, folder / "model.onnx")
            for sub, genre in (("calib", "docs/calib"), ("held", "man/eval")):
                shutil.rmtree(folder / sub, ignore_errors=True)
                shutil.copytree(args.data / "genres" / genres / genre, folder / sub)
            counts = {sub: len(list((folder / sub).glob("*.npz"))) for sub in ("calib", "held")}
            tags = ["transformer", "int-input"] + (["ms-domain"] if kind == "opt" else [])
            (folder / "meta.json").write_text(json.dumps({
                "name": folder.name, "requirement": "-", "member": str(source), "domain": "text", "tags": tags, "counts": counts,
                "notes": f"{'onnxruntime transformer optimizer output' if kind == 'opt' else 'as exported'}; calib docs, held man",
            }, indent=1))
            print(folder, counts)


if __name__ == "__main__":
    main()
