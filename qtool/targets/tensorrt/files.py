"""TensorRT's range files (implicit INT8, TensorRT 10 and earlier): the calibration cache, the
sampleINT8API dynamic-range file and onnxruntime's TensorRT table; how each is written and read.
The TensorRT exporter writes them, `qtool inspect` reads them.

  cache          what `trtexec --calib=FILE` and IInt8Calibrator read (
                 NVIDIA/TensorRT samples/common/sampleEngines.cpp `readScalesFromCalibrationCache`):
                     TRT-<version>-<algorithm>
                     <tensor name>: <8 hex digits: big-endian IEEE-754 float32 of scale = amax / 127>
                 TensorRT 8.x encodes version major*1000 + minor*100 + patch, 10.x
                 major*10000 + minor*100 + patch. A header that does not match the builder makes
                 TensorRT ignore the cache and recalibrate. onnxruntime's TensorRT EP reads this
                 file too with trt_int8_use_native_calibration_table=1 (it splits at the first ':').
  dynamic-range  NVIDIA/TensorRT samples/sampleINT8API `readPerTensorDynamicRangeValues`: one
                 `<tensor name>:<amax>` line per tensor, no header; the sample splits each line at
                 the first ':' and parses the rest with std::stof, then calls
                 ITensor::setDynamicRange(-amax, amax).
  ort-trt        onnxruntime's own TensorRT calibration table, read by the TensorRT EP with its
                 default trt_int8_use_native_calibration_table=0 (file named by
                 trt_int8_calibration_table_name, in trt_engine_cache_path): a FlatBuffer
                 `TrtTable { dict: [KeyValue { key: string; value: string }] }` whose value is
                 amax as decimal text, as onnxruntime.quantization.quant_utils
                 write_calibration_table writes it (onnxruntime/core/providers/tensorrt/
                 tensorrt_execution_provider_utils.h `ReadDynamicRange`). Any tensor name works.
"""

from __future__ import annotations

import math
import re
import struct

import numpy as np

from ...errors import QtoolError
from .versions import (  # noqa: F401  (re-exported: the range files' version helpers)
    CACHE_VERSION,
    GA_RELEASES,
    canonical_version,
    decode_version,
    version_number,
)

ALGORITHMS = ("EntropyCalibration2", "MinMaxCalibration", "EntropyCalibration", "LegacyCalibration")
# Written for an all-zero (or never-seen) tensor: any positive range quantizes zeros exactly,
# while a zero scale would make TensorRT divide by zero.
ZERO_AMAX_FALLBACK = 1.0


def _listed(names: list[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


# ----------------------------------------------------------------------------- hex

def scale_hex(amax: float) -> str:
    """amax -> 8 lowercase hex digits of float32(amax / 127), most significant byte first."""
    scale = np.float32(amax) / np.float32(127.0)
    return struct.pack(">f", scale).hex()


def hex_scale(text: str) -> float:
    """8 hex digits -> the float32 scale they encode."""
    (scale,) = struct.unpack(">f", bytes.fromhex(text))
    return float(scale)


def hex_amax(text: str) -> float:
    """8 hex digits -> amax (= decoded scale * 127)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.float32(hex_scale(text)) * np.float32(127.0))


def text_amax(text: str) -> float:
    """Decimal text -> the float32 value std::stof reads from it (ValueError if not a number)."""
    with np.errstate(over="ignore"):
        return float(np.float32(float(text.strip())))


def amax_text(amax: float) -> str:
    """amax as the shortest decimal that reads back (std::stof, float()) as the same float32."""
    return str(np.float32(amax))


def is_usable(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _replace_unusable(amax: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Zero or non-finite amax -> ZERO_AMAX_FALLBACK, and the names replaced."""
    replaced = [name for name, value in amax.items() if not is_usable(value)]
    if not replaced:
        return amax, []
    return {n: (v if is_usable(v) else ZERO_AMAX_FALLBACK) for n, v in amax.items()}, replaced


def _replaced_warning(replaced: list[str]) -> list[str]:
    if not replaced:
        return []
    return [
        f"{len(replaced)} tensor(s) had amax 0 (all values zero) or no finite range and got amax "
        f"{ZERO_AMAX_FALLBACK} in the output: {_listed(replaced)}"
    ]


def _lines(text: str) -> list[str]:
    """Lines as std::getline splits them: only a newline ends a line (a CR before it is ignored, as the readers do)."""
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _check_names(names, what: str) -> None:
    for name in names:
        if "\n" in name or "\r" in name:
            raise QtoolError(f"tensor name {name!r} contains a line break and cannot be written to a {what}")


# ----------------------------------------------------------------------------- cache

def write_cache(amax: dict[str, float], version: str = CACHE_VERSION, algorithm: str = "EntropyCalibration2") -> tuple[str, list[str]]:
    """Cache text for {tensor name: amax} in the given order, and warnings for the user."""
    if algorithm not in ALGORITHMS:
        raise QtoolError(f"unknown TensorRT calibration algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    lines = [f"TRT-{version_number(version)}-{algorithm}"]
    warnings = []
    _check_names(amax, "TensorRT cache")
    amax, replaced = _replace_unusable(amax)
    for name, value in amax.items():
        lines.append(f"{name}: {scale_hex(value)}")
    warnings += _replaced_warning(replaced)
    colon = [n for n in amax if ":" in n]
    if colon:
        warnings.append(
            f"{len(colon)} tensor name(s) contain ':' ({_listed(colon)}): trtexec reads them (it splits at the last ':'), "
            "but onnxruntime's TensorRT EP splits at the first ':' and cannot; for onnxruntime use --format ort-trt"
        )
    return "\n".join(lines) + "\n", warnings


def read_cache(text: str) -> tuple[dict, dict[str, float]]:
    """Parse a cache into ({'version': int, 'algorithm': str}, {name: amax}).

    Strict where TensorRT's readers are: trtexec takes the 8 characters two after the last ':',
    so an entry must be `<name>: <8 hex digits>`.
    """
    lines = _lines(text)
    if not lines:
        raise QtoolError("the TensorRT cache is empty")
    m = re.fullmatch(r"TRT-(\d{1,12})-(\w+)", lines[0].strip())  # TensorRT writes at most 6 digits
    if not m:
        raise QtoolError(f"not a TensorRT calibration cache: first line is {lines[0][:60]!r}, expected TRT-<version>-<algorithm>")
    header = {"version": int(m.group(1)), "algorithm": m.group(2)}
    entries: dict[str, float] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        m = re.fullmatch(r"(.+): ([0-9a-fA-F]{8})", line.rstrip())  # greedy: the last ': ', as trtexec
        if not m:
            raise QtoolError(f"TensorRT cache line {n} is not '<name>: <8 hex digits>': {line[:80]!r}")
        entries[m.group(1)] = hex_amax(m.group(2))
    return header, entries


def read_cache_hex(text: str) -> dict[str, str]:
    """{name: the 8 hex digits as written}, for a text already accepted by read_cache."""
    found = {}
    for line in _lines(text)[1:]:
        m = re.fullmatch(r"(.+): ([0-9a-fA-F]{8})", line.rstrip())
        if m:
            found[m.group(1)] = m.group(2).lower()
    return found


# ----------------------------------------------------------------------------- dynamic range

def write_dynamic_range(amax: dict[str, float]) -> tuple[str, list[str]]:
    """sampleINT8API text: `<name>:<amax>` per line, in the given order."""
    _check_names(amax, "dynamic-range file")
    amax, replaced = _replace_unusable(amax)
    colon = [n for n in amax if ":" in n]
    lines = [f"{name}:{amax_text(value)}" for name, value in amax.items() if ":" not in name]
    warnings = _replaced_warning(replaced)
    if colon:
        warnings.append(
            f"{len(colon)} tensor(s) with ':' in their names were left out ({_listed(colon)}): sampleINT8API splits "
            "each line at the first ':'; use --format cache (trtexec) or ort-trt for them"
        )
    return "".join(line + "\n" for line in lines), warnings


def read_dynamic_range(text: str) -> dict[str, float]:
    """Parse a sampleINT8API dynamic-range file into {name: amax as the float32 the sample reads}."""
    entries: dict[str, float] = {}
    lines = _lines(text)
    if not lines:
        raise QtoolError("the dynamic-range file is empty")
    for n, line in enumerate(lines, start=1):
        name, sep, value = line.partition(":")  # sampleINT8API splits at the first colon
        try:
            if not sep or not name:
                raise ValueError
            amax = text_amax(value)
        except ValueError:
            what = "is blank (sampleINT8API fails on blank lines)" if not line.strip() else f"is not '<name>:<amax>': {line[:80]!r}"
            raise QtoolError(f"dynamic-range line {n} {what}") from None
        entries[name] = amax
    return entries


# ----------------------------------------------------------------------------- onnxruntime table

def write_ort_table(amax: dict[str, float]) -> tuple[bytes, list[str]]:
    """onnxruntime's TensorRT calibration table (FlatBuffer TrtTable), keys sorted as onnxruntime does."""
    amax, replaced = _replace_unusable(amax)
    items = sorted((name.encode("utf-8"), amax_text(value).encode("ascii")) for name, value in amax.items())
    return _flatbuffer_table(items), _replaced_warning(replaced)


def _flatbuffer_table(items: list[tuple[bytes, bytes]]) -> bytes:
    """Serialize TrtTable{dict:[KeyValue{key,value}]}; every offset 4-byte aligned, uoffsets point forward.

    Layout: root uoffset | TrtTable vtable | TrtTable | vector of KeyValue offsets | KeyValue vtable
    (shared) | per entry: KeyValue table, key string, value string.
    """
    out = bytearray()

    def pad4():
        out.extend(b"\0" * (-len(out) % 4))

    def u32(v):
        out.extend(struct.pack("<I", v))

    def patch_u32(at, v):
        out[at:at + 4] = struct.pack("<I", v)

    u32(0)  # root offset, patched below
    table_vt = len(out)
    out.extend(struct.pack("<HHH", 6, 8, 4))  # vtable: its size, table size, dict at +4
    pad4()
    table = len(out)
    patch_u32(0, table)
    out.extend(struct.pack("<i", table - table_vt))
    dict_field = len(out)
    u32(0)
    vector = len(out)
    patch_u32(dict_field, vector - dict_field)
    u32(len(items))
    slots = len(out)
    out.extend(b"\0" * (4 * len(items)))
    kv_vt = len(out)
    out.extend(struct.pack("<HHHH", 8, 12, 4, 8))  # key at +4, value at +8
    pad4()
    for i, (key, value) in enumerate(items):
        kv = len(out)
        patch_u32(slots + 4 * i, kv - (slots + 4 * i))
        out.extend(struct.pack("<i", kv - kv_vt))
        fields = len(out)
        out.extend(b"\0" * 8)
        for j, data in enumerate((key, value)):
            at = len(out)
            patch_u32(fields + 4 * j, at - (fields + 4 * j))
            u32(len(data))
            out.extend(data + b"\0")
            pad4()
    return bytes(out)


def read_ort_table(data: bytes) -> dict[str, float]:
    """Parse onnxruntime's TensorRT calibration table into {name: amax as float32}; strict bounds checks."""
    size = len(data)

    def damaged(why: str):
        return QtoolError(f"not a readable onnxruntime TensorRT calibration table ({why})")

    def u32(at: int) -> int:
        if at < 0 or at + 4 > size:
            raise damaged(f"offset {at} outside the {size}-byte file")
        return struct.unpack_from("<I", data, at)[0]

    def u16(at: int) -> int:
        if at < 0 or at + 2 > size:
            raise damaged(f"offset {at} outside the {size}-byte file")
        return struct.unpack_from("<H", data, at)[0]

    def field(table: int, index: int) -> int | None:
        """Position of field `index` of the table at `table`, or None if absent."""
        vtable = table - struct.unpack("<i", struct.pack("<I", u32(table)))[0]
        vt_size = u16(vtable)
        if vt_size < 4 or vt_size % 2:
            raise damaged("bad vtable")
        if 4 + 2 * index >= vt_size:
            return None
        offset = u16(vtable + 4 + 2 * index)
        return table + offset if offset else None

    def indirect(at: int) -> int:
        return at + u32(at)

    def string(at: int) -> bytes:
        start = indirect(at)
        length = u32(start)
        if start + 4 + length + 1 > size or data[start + 4 + length] != 0:
            raise damaged("string runs past the end of the file")
        return data[start + 4:start + 4 + length]

    if size < 12:
        raise damaged(f"only {size} bytes")
    root = u32(0)
    dict_at = field(root, 0)
    entries: dict[str, float] = {}
    if dict_at is None:
        return entries
    vector = indirect(dict_at)
    count = u32(vector)
    if vector + 4 + 4 * count > size:
        raise damaged(f"{count} entries do not fit in the file")
    for i in range(count):
        kv = indirect(vector + 4 + 4 * i)
        key_at, value_at = field(kv, 0), field(kv, 1)
        if key_at is None or value_at is None:
            raise damaged(f"entry {i} has no key or no value")
        try:
            name = string(key_at).decode("utf-8")
            value = text_amax(string(value_at).decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            raise damaged(f"entry {i} is not a tensor name with a decimal range") from None
        entries[name] = value
    return entries
