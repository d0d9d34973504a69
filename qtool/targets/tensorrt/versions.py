"""TensorRT versions qtool knows, and what each reads: GA releases, the cache header's number,
the ONNX opsets its parser takes for Q/DQ models, the default version and format.
"""

from __future__ import annotations

import re

from ...errors import Opt, QtoolError

# The newest TensorRT qtool knows (11.4, 2026); the default target when `tensorrt` is not installed.
LATEST_VERSION = "11.4.0"
# The header `calibrate --trt-table` writes unless told: the newest TensorRT whose implicit INT8
# is not deprecated (JetPack 5 and many deployed servers still build with it).
CACHE_VERSION = "8.6.1"


def trt11_removed(what: str) -> QtoolError:
    """TensorRT 11 reads no range file (`what`: the kind asked for)."""
    return QtoolError("TensorRT 11 removed implicit INT8 (no calibration cache, no --int8/--calib, no calibrator API), so it "
                      "cannot read a {what} file; use {qdq}, or name an older TensorRT with {version}", what=what,
                      qdq=Opt("fmt", "qdq"), version=Opt("trt_version"))

# default-domain opsets the parser of each major version takes for a Q/DQ model (9.x: 8.x rules)
OPSETS = {8: (13, 17), 9: (13, 17), 10: (13, 20), 11: (13, 25)}
FP16_OPSET = 19  # QuantizeLinear/DequantizeLinear-19 take FP16 scales
FP8_OPSET = 19  # ... and FLOAT8 types
FP8_MIN_MAJOR = 10  # the first TensorRT whose parser reads opset 19

# The GA release of each TensorRT minor: what `--trt-version MAJOR.MINOR` means (the header of a
# cache must name the builder's exact version). From NVIDIA/TensorRT CHANGELOG.md ("8.6.1 GA",
# "8.6.0 EA", "10.0.1 GA", ...) and include/NvInferVersion.h at each release commit (up to 11.1,
# July 2026); 11.2-11.4 (qtool's newest) are taken as .0: 11.x reads no cache, only its major matters.
GA_RELEASES = {
    (7, 0): 0, (7, 1): 3, (7, 2): 1,
    (8, 0): 1, (8, 2): 1, (8, 4): 1, (8, 5): 1, (8, 6): 1,
    (9, 0): 1, (9, 1): 0, (9, 2): 0, (9, 3): 0,
    (10, 0): 1, **{(10, m): 0 for m in range(1, 14)}, (10, 14): 1, (10, 15): 1, (10, 16): 0,
    **{(11, m): 0 for m in range(0, 5)},
}
KNOWN_MAJORS = sorted({major for major, _ in GA_RELEASES})
VERSION_FORMS = ("give MAJOR (e.g. 10, its newest release qtool knows), MAJOR.x, MAJOR.MINOR (e.g. 8.6: its GA release "
                 "8.6.1) or MAJOR.MINOR.PATCH (e.g. 7.2.3), TensorRT 7.x to 11.x")


def canonical_version(text) -> str:
    """A --trt-version as the user may give it -> 'MAJOR.MINOR.PATCH' of that release.

    '10' and '10.x' -> the newest 10.x qtool knows; '8.6' -> its GA release 8.6.1 (GA_RELEASES);
    '8.6.1' and '8.6.1.6' (build number dropped) as given, for a known minor or one newer than
    every minor qtool knows of that major. Anything else is a one-line error listing the forms."""
    given = str(text).strip()
    m = re.fullmatch(r"(\d{1,3})(?:\.(x|\d{1,3})(?:\.(\d{1,3})(?:\.\d{1,6})?)?)?", given.lower())
    if m and int(m.group(1)) in KNOWN_MAJORS:
        major = int(m.group(1))
        minors = sorted(mi for ma, mi in GA_RELEASES if ma == major)
        if m.group(2) in (None, "x") and m.group(3) is None:
            return f"{major}.{minors[-1]}.{GA_RELEASES[major, minors[-1]]}"
        if m.group(2) != "x":
            minor = int(m.group(2))
            if m.group(3) is None and (major, minor) in GA_RELEASES:
                return f"{major}.{minor}.{GA_RELEASES[major, minor]}"
            if m.group(3) is not None and ((major, minor) in GA_RELEASES or minor > minors[-1]):
                return f"{major}.{minor}.{int(m.group(3))}"
    raise QtoolError("{given} is not a TensorRT release qtool knows: {forms}", given=Opt("trt_version", given, quoted=True), forms=VERSION_FORMS)


def version_number(version: str) -> int:
    """'8.6.1' -> 8601, '8.6' -> 8601 (its GA release), '10.3.0' -> 100300: the number in the cache
    header, NV_TENSORRT_VERSION: major*1000 + minor*100 + patch up to 9.x (NVIDIA/TensorRT
    include/NvInferRuntimeCommon.h, 8.x), major*10000 + minor*100 + patch from 10.x
    (include/NvInferRuntimeBase.h, NV_TENSORRT_VERSION_INT)."""
    major, minor, patch = (int(p) for p in canonical_version(version).split("."))
    if major >= 11:
        raise trt11_removed("calibration cache")
    # below 10 the minor has one decimal digit in the number (8.10 would read as 9.0)
    if minor > (99 if major >= 10 else 9) or patch > 99:
        raise QtoolError("{version} is not a TensorRT version with INT8 calibration caches (7.x to 10.x)",
                         version=Opt("trt_version", version, quoted=True))
    return major * (10000 if major >= 10 else 1000) + minor * 100 + patch


def decode_version(number: int) -> str | None:
    """8601 -> '8.6.1', 100300 -> '10.3.0'; None for numbers no TensorRT writes."""
    if number >= 100000:
        major, rest = divmod(number, 10000)
    elif 7000 <= number < 10000:
        major, rest = divmod(number, 1000)
    else:
        return None
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def parse_version(text: str, known_only: bool = True) -> tuple[int, int, int]:
    """'10.3' -> (10, 3, 0); '8.6.1' and '8.6.1.6' (build number ignored) are accepted too.
    known_only: the major must be one whose rules qtool knows (8.x to 11.x)."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:\.\d+)?", str(text).strip())
    if not m:
        raise QtoolError("{version} is not a version like 8.6.1, 10.3.0 or 11.4", version=Opt("trt_version", text, quoted=True))
    major, minor, patch = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
    if known_only and major not in OPSETS:
        raise QtoolError("{version}: qtool knows TensorRT 8.x to 11.x", version=Opt("trt_version", str(text)))
    return major, minor, patch


def installed_version() -> str | None:
    """The version of the `tensorrt` Python package (MAJOR.MINOR.PATCH), when one imports."""
    try:
        import tensorrt  # optional: only its version is read
    except Exception:
        return None
    version = getattr(tensorrt, "__version__", None)
    found = re.match(r"\d+\.\d+(?:\.\d+)?", version) if isinstance(version, str) else None  # "10.3.0.26", "10.3.0.post1"
    try:
        return canonical_version(found.group(0)) if found else None
    except QtoolError:
        return None


def default_version() -> str:
    """The installed TensorRT's version, else the newest one qtool knows."""
    return installed_version() or LATEST_VERSION


def major_of(version: str) -> int:
    """The major version of a version qtool knows (7.x to 11.x)."""
    return int(canonical_version(version).split(".")[0])


def default_format(version: str) -> str:
    """What `version` builds INT8 from by default: the cache before 10, a Q/DQ model from 10."""
    return "cache" if major_of(version) < 10 else "qdq"
