"""What this CPU does to a quantized model, in one table: which int8 kernels run, and which float
precision OpenVINO gives the layers left unquantized.

Without VNNI-class instructions (x86 with AVX2 only), onnxruntime's MLAS and OpenVINO's oneDNN
multiply u8 activations by s8 weights with vpmaddubsw, whose pair sums saturate at int16: the int8
model such a runtime runs can differ from the exact arithmetic of the file. VNNI (avx512_vnni,
avx_vnni) and AMX accumulate in int32 and do not saturate.

OpenVINO's CPU plugin runs float layers in bf16 unless told otherwise where the CPU has AVX-512 BF16
or AMX (the default of INFERENCE_PRECISION_HINT: openvinotoolkit/openvino
src/plugins/intel_cpu/src/config.cpp, with_cpu_x86_bfloat16()), and in f16 on ARM CPUs with half
precision arithmetic (src/plugins/intel_cpu/src/utils/precision_support.cpp): a comparison of
numbers pins `INFERENCE_PRECISION_HINT: f32` (PINNED_F32). A new CPU kind is one row of KINDS.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from dataclasses import dataclass

VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # and any amx* flag
PINNED_F32 = {"INFERENCE_PRECISION_HINT": "f32"}  # OpenVINO's config for float layers in f32 on every CPU


@dataclass(frozen=True)
class Kind:
    """A kind of CPU, recognised by its flags: the first row of KINDS whose `any_of` flags (or
    flag prefixes ending in '*') the CPU has, on its architecture."""

    name: str
    arch: str  # "x86" or "arm"
    any_of: tuple[str, ...]  # () matches every CPU of `arch`
    int8_saturates: bool  # u8 x s8 pair sums saturate at int16 in OpenVINO's and onnxruntime's int8 kernels
    openvino_float: str  # the precision OpenVINO runs float layers in when the config does not say: "f32", "bf16", "f16"
    example: str  # CPUs of this kind, for the README and messages

    def matches(self, arch: str, found: frozenset[str]) -> bool:
        if arch != self.arch:
            return False
        return not self.any_of or any(f in found if not f.endswith("*") else any(g.startswith(f[:-1]) for g in found)
                                      for f in self.any_of)


KINDS = (
    Kind("amx", "x86", ("amx*",), False, "bf16", "Intel Xeon Sapphire Rapids and later"),
    Kind("avx512-bf16", "x86", ("avx512_bf16",), False, "bf16", "AMD Zen 4/5, Intel Cooper Lake"),
    Kind("vnni", "x86", VNNI_FLAGS, False, "f32", "Intel Ice Lake, Cascade Lake, Alder Lake"),
    Kind("avx2", "x86", (), True, "f32", "Intel Haswell to Comet Lake, AMD Zen 1-3"),
    Kind("arm-fp16", "arm", ("asimdhp", "fphp"), False, "f16", "ARMv8.2+ (Graviton 2/3, Apple M)"),
    Kind("arm", "arm", (), False, "f32", "older ARMv8"),
)


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


def arch() -> str | None:
    """"x86", "arm", or None for another architecture."""
    machine = platform.machine().lower()
    if is_x86():
        return "x86"
    return "arm" if machine in ("aarch64", "arm64") or machine.startswith("arm") else None


def kind_of(arch_name: str | None, found: frozenset[str] | None) -> Kind | None:
    """The first row of KINDS that a CPU of `arch_name` with flags `found` matches; None when unknown."""
    if arch_name is None or found is None:
        return None
    return next((k for k in KINDS if k.matches(arch_name, found)), None)


def kind() -> Kind | None:
    """This CPU's row of KINDS, None when its architecture or flags are unknown."""
    return kind_of(arch(), flags())


def describe(k: Kind | None = None) -> str:
    """One line on what a CPU of kind `k` (default: this one) does to an int8 model."""
    k = kind() if k is None else k
    if k is None:
        return "CPU of unknown kind (flags not readable)"
    int8 = "int8 pair sums can saturate (no VNNI)" if k.int8_saturates else "int8 exact (int32 accumulation)"
    return f"{k.name} CPU: {int8}; OpenVINO's default float precision {k.openvino_float}"
