"""Running Python on an x86 CPU with AVX2 but no VNNI: this machine when it is one, otherwise QEMU
user mode emulating one (``qemu-x86_64 -cpu Haswell-v4``, about 30 times slower).

On such CPUs onnxruntime's MLAS and OpenVINO's oneDNN multiply u8 activations by s8 weights with
vpmaddubsw, whose pair sums saturate at int16; with VNNI (or AMX) they accumulate in int32. A
test or bench that wants to see what an int8 model gives on an AVX2-only CPU runs its script with
`run_python`, which says how it ran it. No pytest here: benches import it too.

QEMU's CPU model decides the kernels onnxruntime picks (it reads CPUID): `saturates()` runs a
one-layer probe whose exact answer is twice its saturated one, so a caller can check that the
process really took the AVX2 path (under ``-cpu Nehalem`` the same probe is exact: SSE kernels
widen to int16 before multiplying).

OpenVINO's oneDNN can also be held to its AVX2 kernels on this very CPU (`run_onednn_avx2`:
ONEDNN_MAX_CPU_ISA=AVX2, the JIT kernels a Haswell runs, at native speed). QEMU 7.2 (Debian 12's)
does not run OpenVINO's LSTM right, not even in FP32: tests/test_recurrent.py's bidirectional
look-alike came out 2.9 dB from this CPU's run (oneDNN held to AVX2 here: 318 dB), Silero VAD's
states 1.8-3.7 dB; int8, 1-3 dB whatever the weights, even those whose pairs cannot saturate.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

QEMU = "qemu-x86_64"
QEMU_CPU = "Haswell-v4"  # AVX2, FMA, F16C; no AVX-512, no VNNI
FORCE_QEMU = "QTOOL_AVX2_QEMU"  # set to 1: emulate even where this CPU is AVX2-only (to test the plumbing)


class Unavailable(Exception):
    """No AVX2-only CPU can be had here (the message says why)."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def host_is_avx2_only() -> bool:
    """This CPU has AVX2 and no VNNI-class int8 instructions (avx512_vnni, avx_vnni, AMX)."""
    from qtool.quantizers import cpu_kinds

    found = cpu_kinds.flags()
    return is_x86() and found is not None and "avx2" in found and cpu_kinds.vnni() is False


@dataclass
class Ran:
    how: str  # "host" or "qemu-x86_64 -cpu Haswell-v4"
    stdout: str
    stderr: str
    seconds: float


def how(force_qemu: bool | None = None) -> list[str]:
    """The command prefix that runs this Python on an AVX2-only CPU: [] on this CPU, or QEMU's;
    Unavailable when neither can be had."""
    if force_qemu is None:
        force_qemu = os.environ.get(FORCE_QEMU, "") not in ("", "0")
    if not is_x86():
        raise Unavailable(f"not an x86-64 machine ({platform.machine()}): no x86 int8 kernels to run")
    if host_is_avx2_only() and not force_qemu:
        return []
    qemu = shutil.which(QEMU)
    if qemu is None:
        why = "emulation was asked for" if force_qemu else "this CPU is not AVX2-only (it has VNNI, or its flags are unknown)"
        raise Unavailable(f"{why} and {QEMU} is absent (Debian: apt-get install qemu-user)")
    return [qemu, "-cpu", QEMU_CPU]


def run_python(script: Path | str, *args: str, force_qemu: bool | None = None, timeout: float = 900, cwd=None) -> Ran:
    """Run `python script args` (this interpreter) on an AVX2-only CPU; CalledProcessError when it fails."""
    import time

    prefix = how(force_qemu)
    cmd = prefix + [sys.executable, str(script), *map(str, args)]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    # QEMU's TCG warns about CPUID bits it leaves out (pcid, x2apic...): noise for the caller
    stderr = "".join(line for line in r.stderr.splitlines(keepends=True) if not line.startswith(f"{QEMU}: warning: TCG doesn't support"))
    if r.returncode != 0:
        raise subprocess.CalledProcessError(r.returncode, cmd, r.stdout, stderr)
    return Ran(" ".join(Path(p).name if i == 0 else p for i, p in enumerate(prefix)) or "host", r.stdout, stderr, time.perf_counter() - start)


ONEDNN_AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ONEDNN_VERBOSE": "1"}


def run_onednn_avx2(script: Path | str, *args: str, timeout: float = 600, cwd=None) -> Ran:
    """Run `python script args` with oneDNN (OpenVINO's CPU plugin) held to its AVX2 kernels, here, printing
    oneDNN's verbose lines (which implementation ran each primitive) on stdout; CalledProcessError when it fails."""
    import time

    cmd = [sys.executable, str(script), *map(str, args)]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **ONEDNN_AVX2})
    if r.returncode != 0:
        raise subprocess.CalledProcessError(r.returncode, cmd, r.stdout, r.stderr)
    return Ran("ONEDNN_MAX_CPU_ISA=AVX2", r.stdout, r.stderr, time.perf_counter() - start)


# ----------------------------------------------------------------------------- the probe

PROBE_K = 64


def probe_model() -> bytes:
    """Q/DQ MatMul of a [4, 64] input of 255s by s8 weights of 127 (onnxruntime fuses it into a u8 x
    s8 int8 kernel), output quantized so that the exact product reads 200 and a pairwise-saturated
    one 101."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    exact = PROBE_K * 255 * 127
    inits = [numpy_helper.from_array(np.asarray(v), name) for name, v in (
        ("one", np.float32(1)), ("zu", np.uint8(0)), ("zs", np.int8(0)),
        ("w", np.full((PROBE_K, 8), 127, np.int8)), ("so", np.float32(exact / 200)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "one", "zu"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "one", "zu"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "one", "zs"], ["wd"]), helper.make_node("MatMul", ["xd", "wd"], ["y"]),
             helper.make_node("QuantizeLinear", ["y", "so", "zu"], ["yq"]), helper.make_node("DequantizeLinear", ["yq", "so", "zu"], ["out"])]
    g = helper.make_graph(nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, PROBE_K])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m.SerializeToString()


_PROBE_SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
k = int(sys.argv[2])
s = ort.InferenceSession(open(sys.argv[1], "rb").read(), providers=["CPUExecutionProvider"])
out = s.run(None, {"x": np.full((4, k), 255, np.float32)})[0]
print(float(out.min() / (k * 255 * 127)), float(out.max() / (k * 255 * 127)))
"""


def saturates(folder: Path, *, force_qemu: bool | None = None) -> tuple[bool, Ran]:
    """Whether onnxruntime's u8 x s8 kernel saturates pair sums on the AVX2-only CPU `run_python`
    gives (it must: that is the point), and how it ran."""
    folder = Path(folder)
    (folder / "probe.onnx").write_bytes(probe_model())
    (folder / "probe.py").write_text(_PROBE_SCRIPT)
    ran = run_python(folder / "probe.py", folder / "probe.onnx", PROBE_K, force_qemu=force_qemu, timeout=300)
    lo, hi = map(float, ran.stdout.split())
    if abs(lo - 1) < 0.02 and abs(hi - 1) < 0.02:
        return False, ran
    if abs(lo - 0.5055) < 0.02 and abs(hi - 0.5055) < 0.02:  # 32 pairs of 32767 instead of 64 x 255 x 127
        return True, ran
    raise AssertionError(f"the probe read {lo}, {hi} of the exact product: neither exact nor pairwise saturated")


def saturates_here() -> bool:
    """The probe in this process: whether this CPU's onnxruntime u8 x s8 kernel saturates."""
    import numpy as np
    import onnxruntime as ort

    s = ort.InferenceSession(probe_model(), providers=["CPUExecutionProvider"])
    out = s.run(None, {"x": np.full((4, PROBE_K), 255, np.float32)})[0]
    return bool(out.max() < 0.75 * PROBE_K * 255 * 127)
