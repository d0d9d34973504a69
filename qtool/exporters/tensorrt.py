"""TensorRT INT8 calibration cache (what `trtexec --calib=FILE` and IInt8Calibrator read).

Format (reference section 4; NVIDIA/TensorRT samples/common/sampleEngines.cpp
`readScalesFromCalibrationCache`):
    TRT-<version>-<algorithm>
    <tensor name>: <8 hex digits: big-endian IEEE-754 float32 of scale = amax / 127>
TensorRT 8.x encodes version major*1000 + minor*100 + patch, 10.x major*10000 + minor*100 + patch.
A header that does not match the builder makes TensorRT ignore the cache and recalibrate.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np

from ..errors import QtoolError

ALGORITHMS = ("EntropyCalibration2", "MinMaxCalibration", "EntropyCalibration", "LegacyCalibration")
DEFAULT_VERSION = "8.6.1"
# Written for an all-zero (or never-seen) tensor: any positive range quantizes zeros exactly,
# while a zero scale would make TensorRT divide by zero.
ZERO_AMAX_FALLBACK = 1.0


def version_number(version: str) -> int:
    """'8.6.1' -> 8601, '10.3.0' -> 100300 (the number in the cache header)."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)?", version.strip())
    if not m:
        raise QtoolError(f"--trt-version {version!r} is not a version like 8.6.1 or 10.3.0")
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if major < 7 or minor > 99 or patch > 99:
        raise QtoolError(f"--trt-version {version!r} is not a TensorRT version with INT8 calibration caches (7.x to 10.x)")
    return major * (10000 if major >= 10 else 1000) + minor * 100 + patch


def scale_hex(amax: float) -> str:
    """amax -> 8 lowercase hex digits of float32(amax / 127), most significant byte first."""
    scale = np.float32(amax) / np.float32(127.0)
    return struct.pack(">f", scale).hex()


def hex_amax(text: str) -> float:
    """8 hex digits -> amax (= decoded scale * 127)."""
    (scale,) = struct.unpack(">f", bytes.fromhex(text))
    return float(np.float32(scale) * np.float32(127.0))


def write_cache(amax: dict[str, float], version: str = DEFAULT_VERSION, algorithm: str = "EntropyCalibration2") -> tuple[str, list[str]]:
    """Cache text for {tensor name: amax} in the given order, and warnings for the user."""
    if algorithm not in ALGORITHMS:
        raise QtoolError(f"unknown TensorRT calibration algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    lines = [f"TRT-{version_number(version)}-{algorithm}"]
    warnings = []
    if int(version.split(".")[0]) >= 11:
        warnings.append("TensorRT 11 and later have no calibration-cache INT8; use explicit quantization (QDQ) there")
    replaced = []
    for name, value in amax.items():
        if "\n" in name:
            raise QtoolError(f"tensor name {name!r} contains a newline and cannot be written to a TensorRT cache")
        if not (math.isfinite(value) and value > 0):
            replaced.append(name)
            value = ZERO_AMAX_FALLBACK
        lines.append(f"{name}: {scale_hex(value)}")
    if replaced:
        warnings.append(
            f"{len(replaced)} tensor(s) had amax 0 (all values zero) and got amax {ZERO_AMAX_FALLBACK} in the cache: "
            + ", ".join(replaced[:5]) + (" ..." if len(replaced) > 5 else "")
        )
    return "\n".join(lines) + "\n", warnings


def read_cache(text: str) -> tuple[dict, dict[str, float]]:
    """Parse a cache into ({'version': int, 'algorithm': str}, {name: amax})."""
    lines = text.splitlines()
    if not lines:
        raise QtoolError("the TensorRT cache is empty")
    m = re.fullmatch(r"TRT-(\d+)-(\w+)", lines[0].strip())
    if not m:
        raise QtoolError(f"not a TensorRT calibration cache: first line is {lines[0][:60]!r}, expected TRT-<version>-<algorithm>")
    header = {"version": int(m.group(1)), "algorithm": m.group(2)}
    entries: dict[str, float] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")  # trtexec splits at the last colon
        value = value.strip()
        if not sep or not re.fullmatch(r"[0-9a-fA-F]{8}", value):
            raise QtoolError(f"TensorRT cache line {n} is not '<name>: <8 hex digits>': {line[:80]!r}")
        entries[name] = hex_amax(value)
    return header, entries


def suffix(**_options) -> str:
    """Default output file suffix."""
    return ".cache"
CALIBRATOR_ALGORITHMS = {"entropy2": "EntropyCalibration2", "minmax": "MinMaxCalibration"}


def cache_amax(cal, algorithm: str = "entropy2") -> dict[str, float]:
    """The amax TensorRT should use per tensor.

    TensorRT's implicit INT8 is symmetric signed (scale = amax / 127) even after ReLU, so an
    entropy calibration is re-searched with the signed grid (128 levels) from the stored
    histograms; other methods keep their amax; minmax uses max |x|.
    """
    if algorithm == "minmax":
        return {t.name: t.absmax for t in cal.tensors}
    if cal.method == "entropy":
        return {t.name: t.threshold("entropy", cal.kl_variant, unsigned=False, num_bits=cal.num_bits) for t in cal.tensors}
    return cal.amax()


def export(loaded, cal, *, trt_version: str = DEFAULT_VERSION, algorithm: str = "entropy2", **_options):
    """TensorRT calibration cache for `cal`."""
    from . import ExportResult

    if algorithm not in CALIBRATOR_ALGORITHMS:
        raise QtoolError(f"--algorithm {algorithm!r} is not one of {', '.join(CALIBRATOR_ALGORITHMS)}")
    header_algorithm = CALIBRATOR_ALGORITHMS[algorithm]
    text, warnings = write_cache(cache_amax(cal, algorithm), trt_version, header_algorithm)
    summary = {"header": text.splitlines()[0], "entries": len(text.splitlines()) - 1}
    return ExportResult(text.encode(), warnings, summary)
