"""The calibration file: per-tensor statistics and thresholds, enough to recompute them later.

JSON, written atomically and deterministically (same inputs -> same bytes): no timestamps,
keys in a fixed order, tensors in graph order.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .errors import QtoolError
from .fileio import write_atomic
from .histogram import TensorHistogram
from . import thresholds

FORMAT = "qtool.calibration"
VERSION = 1


@dataclass
class TensorRecord:
    name: str
    min: float
    max: float
    amax: float
    counts: list[int]
    hist_range: float  # the histogram covers [0, hist_range] with len(counts) equal bins
    nonfinite: int = 0

    @property
    def unsigned(self) -> bool:
        """Never negative: exporters may use the range [0, amax] (and amax was searched so)."""
        return self.min >= 0

    @property
    def absmax(self) -> float:
        return max(-self.min, self.max, 0.0)

    def edges(self) -> np.ndarray:
        n = len(self.counts)
        return np.arange(n + 1, dtype=np.float64) * (self.hist_range / n if n else 0.0)

    def threshold(self, method: str, kl_variant: str = "nvidia", unsigned: bool | None = None, num_bits: int = 8) -> float:
        """Recompute this tensor's amax from its stored histogram."""
        return thresholds.amax_for(
            method, np.asarray(self.counts, dtype=np.int64), self.edges(), absmax=self.absmax,
            unsigned=self.unsigned if unsigned is None else unsigned, kl_variant=kl_variant, num_bits=num_bits,
        )


@dataclass
class Calibration:
    model_path: str  # as recorded: relative to the calibration file when possible
    model_sha256: str
    method: str
    num_bits: int
    bins: int
    samples: int
    preprocess: dict
    tensors: list[TensorRecord] = field(default_factory=list)
    kl_variant: str = "nvidia"

    def amax(self) -> dict[str, float]:
        return {t.name: t.amax for t in self.tensors}


def record_from_histogram(name: str, hist: TensorHistogram, method: str, kl_variant: str = "nvidia", num_bits: int = 8) -> TensorRecord:
    counts, edges = hist.trimmed()
    empty = hist.size == 0
    record = TensorRecord(
        name=name,
        min=0.0 if empty else hist.min,
        max=0.0 if empty else hist.max,
        amax=0.0,
        counts=[int(c) for c in counts],
        hist_range=float(edges[-1]),
        nonfinite=hist.nonfinite,
    )
    record.amax = record.threshold(method, kl_variant, num_bits=num_bits)
    return record


def recompute(cal: Calibration, method: str, kl_variant: str = "nvidia") -> Calibration:
    """The same calibration with every threshold recomputed from the stored histograms."""
    tensors = [replace(t, amax=t.threshold(method, kl_variant, num_bits=cal.num_bits)) for t in cal.tensors]
    return replace(cal, method=method, kl_variant=kl_variant, tensors=tensors)


def to_json(cal: Calibration) -> str:
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": {"path": cal.model_path, "sha256": cal.model_sha256},
        "method": cal.method,
        "kl_variant": cal.kl_variant,
        "num_bits": cal.num_bits,
        "bins": cal.bins,
        "samples": cal.samples,
        "preprocess": cal.preprocess,
        "tensors": {
            t.name: {
                "min": t.min,
                "max": t.max,
                "amax": t.amax,
                "unsigned": t.unsigned,
                "nonfinite": t.nonfinite,
                "histogram": {"range": [0.0, t.hist_range], "counts": t.counts},
            }
            for t in cal.tensors
        },
    }
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def save(cal: Calibration, path: str | os.PathLike) -> None:
    write_atomic(path, to_json(cal).encode())


def load(path: str | os.PathLike) -> Calibration:
    """Read a calibration file, refusing anything that is not one this version understands."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise QtoolError(f"calibration file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QtoolError(f"{str(p)!r} is not a readable calibration file ({e}); calibrate again") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise QtoolError(f"{str(p)!r} is not a qtool calibration file")
    if doc.get("version") != VERSION:
        raise QtoolError(f"{str(p)!r} has format version {doc.get('version')!r}; this qtool reads version {VERSION}")
    try:
        tensors = [
            TensorRecord(
                name=str(name),
                min=float(t["min"]),
                max=float(t["max"]),
                amax=float(t["amax"]),
                counts=[int(c) for c in t["histogram"]["counts"]],
                hist_range=float(t["histogram"]["range"][1]),
                nonfinite=int(t.get("nonfinite", 0)),
            )
            for name, t in doc["tensors"].items()
        ]
        cal = Calibration(
            model_path=str(doc["model"]["path"]),
            model_sha256=str(doc["model"]["sha256"]),
            method=str(doc["method"]),
            num_bits=int(doc["num_bits"]),
            bins=int(doc["bins"]),
            samples=int(doc["samples"]),
            preprocess=dict(doc["preprocess"]),
            tensors=tensors,
            kl_variant=str(doc.get("kl_variant", "nvidia")),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise QtoolError(f"{str(p)!r} is a damaged calibration file (bad or missing field: {e}); calibrate again") from None
    for t in cal.tensors:
        if not all(math.isfinite(v) for v in (t.min, t.max, t.amax, t.hist_range)) or t.amax < 0:
            raise QtoolError(f"{str(p)!r} has a non-finite or negative value for tensor {t.name!r}; calibrate again")
    return cal
