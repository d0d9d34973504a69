"""What a CPU does to a quantized model, from one table (qtool.quantizers.cpu_kinds.KINDS), checked against
the runtimes themselves on the CPU that runs the suite: a CPU kind the table gets wrong fails here,
and the fix is one row."""

from __future__ import annotations

import avx2
import numpy as np
import pytest
from required import module, require
from runcli import invoke
from test_openvino import HELDOUT, IMAGES, SAMPLE, calibrate, export, linear_precisions, ok

from qtool.quantizers import cpu_kinds

X86 = "fpu sse2 avx avx2 fma f16c"
KEPT_FP32 = "/head/head.0/Conv"  # a Conv of the sample model in the middle of int8 layers


@pytest.mark.parametrize("arch, flags, name, saturates, float_", [
    ("x86", X86, "avx2", True, "f32"),  # Haswell to Comet Lake, Zen 1-3
    ("x86", X86 + " avx512f avx512_vnni", "vnni", False, "f32"),  # Cascade/Ice Lake
    ("x86", X86 + " avx_vnni", "vnni", False, "f32"),  # Alder Lake
    ("x86", X86 + " avx512f avx512_vnni avx512_bf16", "avx512-bf16", False, "bf16"),  # Zen 4/5
    ("x86", X86 + " avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8", "amx", False, "bf16"),  # Sapphire Rapids
    ("arm", "fp asimd asimdhp asimddp", "arm-fp16", False, "f16"),
    ("arm", "fp asimd", "arm", False, "f32"),
])
def test_kinds_of_cpu(arch, flags, name, saturates, float_):
    k = cpu_kinds.kind_of(arch, frozenset(flags.split()))
    assert (k.name, k.int8_saturates, k.openvino_float) == (name, saturates, float_)
    assert name in cpu_kinds.describe(k) and float_ in cpu_kinds.describe(k)
    assert k.int8_saturates == (arch == "x86" and not cpu_kinds.has_vnni_flags(frozenset(flags.split())))


def test_unknown_cpu_is_none():
    assert cpu_kinds.kind_of(None, frozenset({"avx2"})) is None and cpu_kinds.kind_of("x86", None) is None
    assert "unknown" in cpu_kinds.describe(None) or cpu_kinds.kind() is not None


def test_the_table_says_what_openvino_chooses_on_this_cpu():
    """OpenVINO's own default float precision on this CPU is the one this CPU's row says."""
    ov = module("openvino")
    k = cpu_kinds.kind()
    require(k is not None, "this CPU's flags cannot be read")
    assert ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name() == k.openvino_float, cpu_kinds.describe(k)


def test_the_table_says_whether_onnxruntime_saturates_on_this_cpu():
    """onnxruntime's u8 x s8 kernel saturates pair sums on this CPU exactly where its row says so
    (the one-layer probe of tests/avx2.py: exact product or half of it)."""
    k = cpu_kinds.kind()
    if k is None or k.arch != "x86":
        pytest.skip(f"x86 int8 kernels only ({cpu_kinds.describe(k)})")
    assert avx2.saturates_here() == k.int8_saturates, cpu_kinds.describe(k)


def test_every_openvino_compile_in_the_suite_states_its_precision():
    """tests/conftest.py refuses an OpenVINO compile that leaves the float precision to the CPU."""
    ov = module("openvino")
    core = ov.Core()
    with pytest.raises(AssertionError, match="INFERENCE_PRECISION_HINT"):
        core.compile_model(str(SAMPLE), "CPU")
    with pytest.raises(AssertionError, match="INFERENCE_PRECISION_HINT"):
        ov.compile_model(str(SAMPLE), "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    assert core.compile_model(str(SAMPLE), "CPU", cpu_kinds.PINNED_F32).get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"


@pytest.mark.openvino_default_precision
def test_openvino_default_runs_float_layers_in_bf16_where_the_cpu_has_it(tmp_path):
    """A layer kept FP32 (here by --exclude) runs in f32 when OpenVINO is pinned to it, beside the
    int8 ones, on every CPU; OpenVINO left to itself runs that layer in the precision the table
    gives this kind of CPU (bf16 with AVX-512 BF16 or AMX, f32 on an AVX2-only CPU) and still runs
    the quantized ones in int8."""
    ov = module("openvino")
    calib = calibrate(SAMPLE, IMAGES, tmp_path / "d.calib.json")
    out = tmp_path / "d.openvino.onnx"
    summary = export("openvino", calib, out, "--exclude", KEPT_FP32)
    assert summary["fp32_layers"] >= 1, summary
    core = ov.Core()
    pinned = linear_precisions(core.compile_model(str(out), "CPU", cpu_kinds.PINNED_F32))
    kept = [n for n in pinned if n.startswith(KEPT_FP32 + "/")]  # OpenVINO's names add a suffix to the node's
    int8 = {n for n, v in pinned.items() if v in ("u8", "i8")}
    assert len(kept) == 1 and pinned[kept[0]] == "f32" and int8, pinned
    k = cpu_kinds.kind()
    if k is None:
        pytest.skip(f"the rest needs a CPU the table knows ({cpu_kinds.describe(k)})")
    default = linear_precisions(core.compile_model(str(out), "CPU"))
    assert default.get(kept[0]) == k.openvino_float, (default, pinned, k)
    assert all(default.get(n) in ("u8", "i8") for n in int8), (default, pinned)


def test_evaluate_says_what_openvino_ran_the_unquantized_layers_in(tmp_path, monkeypatch):
    """qtool evaluate --runtime openvino names the float precision (pinned f32) and, where OpenVINO
    would choose another one on this CPU, says so."""
    module("openvino")
    calib = calibrate(SAMPLE, IMAGES, tmp_path / "d.calib.json")
    held = tmp_path / "held"
    held.mkdir()
    for i, x in enumerate(np.load(HELDOUT)["x"][:16]):
        np.save(held / f"{i:02d}.npy", x[None])
    args = ("evaluate", SAMPLE, "--calib", calib, "--data", held, "--target", "openvino", "--runtime", "openvino")
    bf16 = cpu_kinds.kind_of("x86", frozenset(f"avx2 avx512f avx512_vnni avx512_bf16 {X86}".split()))
    monkeypatch.setattr(cpu_kinds, "kind", lambda: bf16)
    text = ok(invoke(*args)).stdout
    assert "avx512-bf16 kind" in text and "unquantized layers in f32 (pinned: openvino alone would run them in bf16 on this CPU)" in text
    import json

    r = json.loads(ok(invoke(*args, "--json")).stdout)["runtime"]
    assert (r["float_precision"], r["default_float_precision"], r["cpu_kind"]) == ("f32", "bf16", "avx512-bf16")
    monkeypatch.setattr(cpu_kinds, "kind", lambda: cpu_kinds.kind_of("x86", frozenset(X86.split())))
    text = ok(invoke(*args)).stdout
    assert "avx2 kind, " in text and "unquantized layers in f32)" in text and "pinned" not in text
