"""What this CPU offers int8 kernels: whether it has VNNI-class instructions.

Without them (x86 with AVX2 only), onnxruntime's MLAS and OpenVINO's oneDNN multiply u8 activations
by s8 weights with vpmaddubsw, whose pair sums saturate at int16: the int8 model such a runtime
runs can differ from the exact arithmetic of the file. VNNI (avx512_vnni, avx_vnni) and AMX
accumulate in int32 and do not saturate.
"""

from __future__ import annotations

import functools
import platform
import subprocess

VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # and any amx* flag


@functools.lru_cache(maxsize=1)
def flags() -> frozenset[str] | None:
    """The CPU's feature flags in lower case (Linux: /proc/cpuinfo; macOS: sysctl), None when
    they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            found = from_cpuinfo(f.read())
        if found is not None:
            return found
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
                                 capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        found = frozenset(out.lower().replace(".", "_").split())
        # sysctl spells them AVX512VNNI, AVXVNNI
        return found | {f for f in VNNI_FLAGS if f.replace("_", "") in found} if found else None
    return None


def from_cpuinfo(text: str) -> frozenset[str] | None:
    """The first processor's flags ("flags" on x86, "Features" on ARM) in /proc/cpuinfo's text."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.lower().split())
    return None


def has_vnni_flags(found: frozenset[str]) -> bool:
    return any(f in found for f in VNNI_FLAGS) or any(f.startswith("amx") for f in found)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def vnni() -> bool | None:
    """True/False when the flags say whether the CPU has avx512_vnni, avx_vnni or AMX; None when unknown."""
    found = flags()
    if found is None:
        return None
    return has_vnni_flags(found)


def has_vnni() -> bool:
    """Whether the CPU is known to have VNNI-class int8 instructions (False when unknown)."""
    return vnni() is True
