"""The TensorRT target's options, declared as data (qtool.options.option): its export option group
(`TensorRTOptions`, the "TensorRT" section of export's and evaluate's --help), the cache calibrate
writes beside the calibration file (`CalibrateCache`: --trt-table, --trt-version) and the check
`qtool inspect --trt-version` runs (`InspectRules`). The registry (qtool.targets) names them; the
command line, the API and the option checks read them from there. Light: no writer imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from ...options import _check_choices, declared_options, option
from .versions import CACHE_VERSION, LATEST_VERSION


@dataclass(frozen=True)
class TensorRTOptions:
    """What the TensorRT writer reads beside the general export options (the rest of each help is in docs/cli.md)."""

    SECTIONS: ClassVar = ("TensorRT",)

    trt_version: str | None = option(
        None, "--trt-version",
        f"The TensorRT that builds the engine, 7.x to 11.x [default: the installed one's, else {LATEST_VERSION}].",
        evaluate="The TensorRT the Q/DQ model is for, as qtool export.",
        report="The TensorRT version, as qtool export [default: the installed one's, else the newest qtool knows].")
    fmt: str | None = option(
        None, "--format", "qdq (a Q/DQ model; 10.x/11.x default) or a range file: cache (8.x/9.x default), dynamic-range, "
        "ort-trt.", choices=("qdq", "cache", "dynamic-range", "ort-trt"),
        evaluate="qdq (default): the only format with a model to run.")
    algorithm: str = option(
        "entropy2", "--algorithm", "entropy2 (default: TensorRT's EntropyCalibration2) or minmax (max |x|).", choices=("entropy2", "minmax"))
    precision: str = option(
        "int8", "--precision", "qdq: int8 (default) or fp8 (E4M3, TensorRT 10 and later).",
        choices=("int8", "fp8"), evaluate="int8 (default) or fp8, as qtool export.")
    high_precision: str | None = option(
        None, "--high-precision", "qdq: the unquantized layers' type [default: fp16 for 10.x and later].",
        choices=("fp16", "fp32"), evaluate="The type of the unquantized layers, as qtool export.")
    weights: str | None = option(
        None, "--weights", "qdq: FP32 weights through Q/DQ (int8's default), or stored int8 (10.x+) or fp8.", choices=("fp32", "int8", "fp8"))

    def __post_init__(self):
        _check_choices(self)

    @classmethod
    def build(cls, given: dict) -> TensorRTOptions:
        """From the keywords of `given` that are its fields (taken out of it)."""
        return cls(**{k: given.pop(k) for k in list(given) if k in declared_options(cls)})

    @classmethod
    def sections(cls) -> dict[str, type]:
        return {cls.SECTIONS[0]: cls}

    def own_methods(self) -> tuple[str, ...]:
        """Threshold methods the writer searches itself: FP8's e4m3-mse (qtool.targets.tensorrt.fp8)."""
        return ("e4m3-mse",) if self.precision == "fp8" else ()


@dataclass(frozen=True)
class CalibrateCache:
    """`qtool calibrate --trt-table FILE`: a TensorRT INT8 calibration cache written with the
    calibration file (both or neither), for the TensorRT --trt-version names."""

    SECTION: ClassVar = "TensorRT cache"
    OUTPUT: ClassVar = "tensorrt_cache"  # its key among the written files (--json's outputs)

    trt_table: Path | None = option(None, "--trt-table", "Also write a TensorRT INT8 calibration cache here.", path=True)
    trt_version: str = option(
        CACHE_VERSION, "--trt-version", "The TensorRT the cache header names, 7.x to 10.x (the builder's).")

    @classmethod
    def build(cls, given: dict) -> CalibrateCache:
        return cls(**{k: given.pop(k) for k in list(given) if k in declared_options(cls) and given[k] is not None})

    @property
    def path(self) -> Path | None:
        """The file to write (None: none asked for)."""
        return None if self.trt_table is None else Path(self.trt_table)

    def checked(self) -> CalibrateCache:
        """The version as MAJOR.MINOR.PATCH, one a cache header can name (a one-line error otherwise)."""
        from .files import canonical_version, version_number

        version = canonical_version(self.trt_version)
        version_number(version)
        return replace(self, trt_version=version)

    def write(self, loaded, cal, model_path: str) -> tuple[bytes, list[str], dict, str]:
        """(the cache's bytes, warnings, what calibrate's summary adds, the line it prints) for `cal`
        of `loaded` (`model_path`: the model as the build line names it)."""
        from ...options import ExportOptions
        from . import build_command, export
        from .files import version_number

        cache = export(loaded, cal, ExportOptions("tensorrt", own=TensorRTOptions(trt_version=self.trt_version, fmt="cache")))
        header = f"TRT-{version_number(self.trt_version)}-EntropyCalibration2"
        build, notes = build_command(loaded, cal, "cache", self.trt_version, str(self.path), model_path)
        line = f"TensorRT {self.trt_version} cache {header} -> {self.path}\nbuild it with: {build}"
        return cache.data, list(cache.warnings), {"tensorrt_header": header, "build": build, "notes": notes}, line


@dataclass(frozen=True)
class InspectRules:
    """`qtool inspect MODEL.onnx --trt-version X`: the Q/DQ model checked against TensorRT X's ONNX parser rules."""

    trt_version: str | None = option(
        None, "--trt-version", "FILE is a Q/DQ ONNX model: list every way it breaks this TensorRT's ONNX parser rules (e.g. 8.6, "
        "10.3, 11.4); exit 1 if any.")
