"""The default CPU export is right on CPUs without VNNI too, whatever CPU runs the suite.

On x86 CPUs with AVX2 but no VNNI, onnxruntime multiplies u8 activations by s8 weights with
vpmaddubsw, whose pair sums saturate at int16: before the overflow fix, the bundled sample's
default QDQ export agreed with FP32's top-1 on 45 % of its held-out digits there (99.5 % in the
exact simulation). Here onnxruntime runs the export with its default optimizations (its real int8
kernels) on an AVX2-only CPU: this one where it is one, otherwise QEMU user mode emulating a
Haswell (tests/avx2.py), skipped with the reason where neither can be had.
"""

from __future__ import annotations

import json

import avx2
import numpy as np
import onnxruntime as ort
import pytest
from required import require
from runcli import invoke
from test_openvino import HELDOUT, IMAGES, SAMPLE, ok

# the digits, then the probe, in one process (QEMU takes ~10 s to start Python with onnxruntime)
SCRIPT = """
import sys
import numpy as np
import onnxruntime as ort
model, heldout, probe, out, k = sys.argv[1:]
x = np.load(heldout)["x"]
s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])  # default optimizations: the int8 kernels
logits = s.run(None, {s.get_inputs()[0].name: x})[0]
p = ort.InferenceSession(probe, providers=["CPUExecutionProvider"])
k = int(k)
ratio = float(p.run(None, {"x": np.full((4, k), 255, np.float32)})[0].max() / (k * 255 * 127))
np.savez(out, logits=logits, probe=ratio)
"""


def _avx2_or_skip(force_qemu=None):
    """The prefix running Python on an AVX2-only CPU; with none to be had, a skip (not x86) or, where
    qemu-user would give one, required (under CI a failure)."""
    if not avx2.is_x86():
        pytest.skip(f"x86 int8 kernels only ({avx2.platform.machine()})")
    try:
        return avx2.how(force_qemu)
    except avx2.Unavailable as e:
        require(False, str(e))


def _agreement(logits, fp32) -> float:
    return float((np.argmax(logits, axis=1) == np.argmax(fp32, axis=1)).mean() * 100)


@pytest.mark.skipif(not avx2.is_x86(), reason="x86 int8 kernels only")
def test_the_probe_saturates_exactly_where_the_cpu_has_no_vnni():
    """This CPU's flags (qtool.quantizers.cpu_kinds) and its onnxruntime's u8 x s8 kernel tell the same story."""
    from qtool.quantizers import cpu_kinds

    require(cpu_kinds.vnni() is not None, "this CPU's flags cannot be read")
    assert avx2.saturates_here() == (not cpu_kinds.has_vnni())


def test_qemu_emulates_an_avx2_only_cpu(tmp_path):
    """The QEMU path, even on a CPU that needs none: onnxruntime under ``-cpu Haswell-v4`` takes
    its saturating AVX2 kernel (the probe reads half the exact product)."""
    _avx2_or_skip(force_qemu=True)
    saturated, ran = avx2.saturates(tmp_path, force_qemu=True)
    assert ran.how == f"qemu-x86_64 -cpu {avx2.QEMU_CPU}" and saturated, ran


def test_default_qdq_export_of_the_sample_agrees_with_fp32_on_an_avx2_only_cpu(tmp_path):
    calib = tmp_path / "digits.calib.json"
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "-o", calib))
    out = tmp_path / "digits.qdq.onnx"
    ok(invoke("export", "--target", "qdq", "--calib", calib, "-o", out, "--json"))
    x = np.load(HELDOUT)["x"]
    fp32 = ort.InferenceSession(str(SAMPLE), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]

    # the exact simulation: Q/DQ as float operations, the same on every CPU
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    exact = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    assert _agreement(exact, fp32) >= 98.0, _agreement(exact, fp32)

    # the real int8 kernels of an AVX2-only CPU: this one, or QEMU emulating one
    _avx2_or_skip()
    (tmp_path / "probe.onnx").write_bytes(avx2.probe_model())
    (tmp_path / "run.py").write_text(SCRIPT)
    ran = avx2.run_python(tmp_path / "run.py", out, HELDOUT, tmp_path / "probe.onnx", tmp_path / "real.npz", avx2.PROBE_K)
    got = np.load(tmp_path / "real.npz")
    assert abs(float(got["probe"]) - 0.5055) < 0.02, (ran.how, float(got["probe"]))  # it really ran saturating kernels
    real = got["logits"]
    assert real.shape == fp32.shape and np.isfinite(real).all()
    agreement = _agreement(real, fp32)
    assert agreement >= 98.0, json.dumps({"ran": ran.how, "agreement": agreement, "exact_agreement": _agreement(exact, fp32)})
