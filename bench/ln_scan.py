"""Which models have a LayerNorm centring, and how qtool's CPU placement reads it (docs/benchmarks.md#ln31).

    python ln_scan.py [--zoo DIR] [--dev DIR] [--json OUT]

For every zoo model (<zoo>/<name>/model.onnx) and dev model (<dev>/models/**/*.onnx): the centrings x - mean(x) of a
decomposed LayerNorm (Sub(x, ReduceMean(x)); other spellings qtool.quantizers.patterns.is_normalization knows, a
ReduceSum times 1/n, counted apart), the fused LayerNormalization ops, whether transformer_structure calls the model a
transformer (NNCF's transformer preset: every LayerNorm input float), and what else reads a centring's input x beside
its mean and its Sub (a linear layer reading x asks it quantized whatever the LayerNorm does)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import onnx

from qtool.model import graph as G
from qtool.quantizers import patterns as P

LINEAR = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
FUSED = {"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "GroupNormalization",
         "InstanceNormalization", "MeanVarianceNormalization"}


def _centrings(m: G.Index) -> tuple[list[onnx.NodeProto], list[onnx.NodeProto]]:
    """(Sub(x, ReduceMean(x)) nodes, other Subs is_normalization calls a centring: x minus a statistic of x)."""
    on_mean, other = [], []
    for n in m.graph.node:
        if n.op_type != "Sub" or not P.standard(n) or len(n.input) != 2:
            continue
        mean = P.producer(m, n.input[1])
        if mean is not None and mean.op_type == "ReduceMean" and mean.input[:1] == n.input[:1]:
            on_mean.append(n)
        elif P.is_normalization(m, n):
            other.append(n)
    return on_mean, other


def scan(path: Path) -> dict:
    """The row of one model."""
    proto = onnx.load(str(path), load_external_data=False)
    m = G.Index(proto)
    on_mean, other = _centrings(m)
    fused = Counter(n.op_type for n in m.graph.node if n.op_type in FUSED)
    readers: Counter = Counter()
    for sub in on_mean:
        mean = P.producer(m, sub.input[1])
        for r, _slot in m.readers.get(sub.input[0], ()):
            if r.name not in (sub.name, mean.name):
                readers[r.op_type] += 1
        src = P.producer(m, sub.input[0])
        readers["<- " + (src.op_type if src is not None else "graph input")] += 1
    return {"centrings": len(on_mean), "other_centrings": len(other), "fused": dict(fused),
            "transformer": bool(P.transformer_structure(m)), "x_readers": dict(readers), "nodes": len(m.graph.node)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zoo", type=Path, default=Path.home() / ".cache" / "qtool-bench" / "zoo")
    ap.add_argument("--dev", type=Path, default=Path.home() / ".cache" / "qtool-dev")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--all", action="store_true", help="print models without a centring too")
    args = ap.parse_args()
    paths = {p.parent.name: p for p in sorted(args.zoo.glob("*/model.onnx"))}
    paths.update({"dev:" + str(p.relative_to(args.dev / "models")): p for p in sorted((args.dev / "models").rglob("*.onnx"))})
    rows = {}
    for name, path in paths.items():
        try:
            rows[name] = scan(path)
        except Exception as exc:  # a model onnx cannot read is reported, not fatal
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        r = rows[name]
        if args.all or "error" in r or r["centrings"] or r["other_centrings"] or r["fused"]:
            print(name, json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
