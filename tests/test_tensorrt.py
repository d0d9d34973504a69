"""TensorRT calibration cache: header, hex encoding, round trip."""

import numpy as np
import pytest

from qtool.errors import QtoolError
from qtool.exporters.tensorrt import hex_amax, read_cache, scale_hex, version_number, write_cache


@pytest.mark.parametrize("version,number", [("8.6.1", 8601), ("8.2.5", 8205), ("10.3.0", 100300), ("8.6", 8600), ("10.13.2", 101302)])
def test_version_numbers(version, number):
    assert version_number(version) == number


@pytest.mark.parametrize("bad", ["8", "eight", "8.6.1a", "6.0.1", "8.100.0"])
def test_bad_versions(bad):
    with pytest.raises(QtoolError):
        version_number(bad)


def test_known_hex():
    # reference section 4: 3caa54fc <-> scale 0.020792 <-> amax 2.6406
    assert abs(hex_amax("3caa54fc") - 2.6406) < 1e-4
    assert scale_hex(hex_amax("3caa54fc")) == "3caa54fc"
    assert scale_hex(127.0) == "3f800000"  # scale 1.0


def test_write_then_read_round_trip():
    rng = np.random.default_rng(0)
    amax = {f"/layer.{i}/Conv_output_0": float(v) for i, v in enumerate(rng.uniform(1e-3, 500, 50))}
    amax["images"] = 1.0
    amax["odd:name"] = 2.5
    text, warnings = write_cache(amax, "10.3.0")
    assert text.splitlines()[0] == "TRT-100300-EntropyCalibration2"
    assert text.endswith("\n") and warnings == []
    header, back = read_cache(text)
    assert header == {"version": 100300, "algorithm": "EntropyCalibration2"}
    assert list(back) == list(amax)
    for name, value in amax.items():
        assert back[name] == pytest.approx(value, rel=2e-7)


def test_zero_and_nonfinite_amax_never_reach_the_file():
    text, warnings = write_cache({"a": 0.0, "b": float("nan"), "c": 1.0})
    assert "00000000" not in text and "7fc00000" not in text
    assert all(v > 0 and np.isfinite(v) for v in read_cache(text)[1].values())
    assert warnings and "amax 0" in warnings[0]


def test_tensorrt_11_warns():
    _, warnings = write_cache({"a": 1.0}, "11.0.0")
    assert any("TensorRT 11" in w for w in warnings)


def test_reader_rejects_garbage():
    with pytest.raises(QtoolError):
        read_cache("")
    with pytest.raises(QtoolError):
        read_cache("hello\nx: 3caa54fc\n")
    with pytest.raises(QtoolError):
        read_cache("TRT-8601-EntropyCalibration2\nx 3caa54fc\n")
