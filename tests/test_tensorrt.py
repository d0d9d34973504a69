"""TensorRT export: cache header and hex (golden), dynamic-range and onnxruntime formats, coverage
of every activation tensor with pass-through inheritance, and the pure pass-through walk."""

import struct

import numpy as np
import onnx
import pytest
import zoo
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from qtool import model
from qtool.calibration import Calibration, TensorRecord
from qtool.errors import QtoolError
from qtool.targets import options_for, tensorrt
from qtool.targets.tensorrt import passthrough
from qtool.targets.tensorrt.files import (
    ZERO_AMAX_FALLBACK,
    decode_version,
    hex_amax,
    hex_scale,
    read_cache,
    read_dynamic_range,
    read_ort_table,
    scale_hex,
    version_number,
    write_cache,
    write_dynamic_range,
    write_ort_table,
)

FLOAT = TensorProto.FLOAT


def f32(x):
    return float(np.float32(x))


def cache_round_trip(amax):
    """What TensorRT reads back for amax: float32(float32(amax) / 127) * 127 in float32."""
    return f32(np.float32(np.float32(amax) / np.float32(127)) * np.float32(127))


# ----------------------------------------------------------------------------- golden: header, hex

# a major.minor is its GA release (NVIDIA/TensorRT CHANGELOG.md: "8.6.1 GA", "8.6.0 EA"); a major its newest
@pytest.mark.parametrize("version,number", [("8.6.1", 8601), ("8.2.5", 8205), ("10.3.0", 100300), ("8.6", 8601), ("10.13.2", 101302),
                                            ("8.6.1.6", 8601), ("7.2.3", 7203), ("7.2", 7201), ("8", 8601), ("8.x", 8601),
                                            ("10.0", 100001), ("10", 101600), ("10.X", 101600), ("10.17.0", 101700)])
def test_version_numbers(version, number):
    assert version_number(version) == number


@pytest.mark.parametrize("bad", ["eight", "8.6.1a", "6.0.1", "8.100.0", "8.10.0", "10.3.100", "8.3", "8.3.0", "12", "9.9", "", "10.x.1"])
def test_bad_versions(bad):
    with pytest.raises(QtoolError):
        version_number(bad)


@pytest.mark.parametrize("version,header", [
    ("8.6.1", "TRT-8601-EntropyCalibration2"),
    ("8.2.5", "TRT-8205-EntropyCalibration2"),
    ("10.3.0", "TRT-100300-EntropyCalibration2"),
])
def test_golden_headers(version, header):
    text, _ = write_cache({"images": 1.0}, version)
    assert text.splitlines()[0] == header
    parsed, _ = read_cache(text)
    assert decode_version(parsed["version"]) == version
    assert write_cache({"images": 1.0}, version, "MinMaxCalibration")[0].splitlines()[0] == header.replace("EntropyCalibration2", "MinMaxCalibration")


@pytest.mark.parametrize("number,version", [(8601, "8.6.1"), (8205, "8.2.5"), (100300, "10.3.0"), (7103, "7.1.3"), (101302, "10.13.2"), (42, None), (20000, None)])
def test_decode_version(number, version):
    assert decode_version(number) == version


def test_known_hex():
    # one entry worked by hand: 3caa54fc <-> scale 0.020792 <-> amax 2.6406
    assert round(hex_scale("3caa54fc"), 6) == 0.020792
    assert round(hex_amax("3caa54fc"), 4) == 2.6406
    assert scale_hex(hex_amax("3caa54fc")) == "3caa54fc"
    assert scale_hex(127.0) == "3f800000"  # scale 1.0
    assert scale_hex(1.0) == struct.pack(">f", np.float32(1) / np.float32(127)).hex() == "3c010204"  # reference example
    assert write_cache({"t": hex_amax("3caa54fc")})[0] == "TRT-8601-EntropyCalibration2\nt: 3caa54fc\n"


def test_write_then_read_round_trip():
    rng = np.random.default_rng(0)
    amax = {f"/layer.{i}/Conv_output_0": float(v) for i, v in enumerate(rng.uniform(1e-3, 500, 50))}
    amax["images"] = 1.0
    text, warnings = write_cache(amax, "10.3.0")
    assert text.splitlines()[0] == "TRT-100300-EntropyCalibration2"
    assert text.endswith("\n") and warnings == []
    header, back = read_cache(text)
    assert header == {"version": 100300, "algorithm": "EntropyCalibration2"}
    assert list(back) == list(amax)
    for name, value in amax.items():
        assert back[name] == cache_round_trip(value)
        assert back[name] == pytest.approx(value, rel=2.5e-7)  # two float32 roundings


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=1e-30, max_value=1e30, allow_nan=False, allow_infinity=False))
def test_every_amax_survives_the_cache_within_float32_rounding(amax):
    _, back = read_cache(write_cache({"t": amax})[0])
    assert back["t"] == cache_round_trip(amax)
    assert abs(back["t"] - amax) <= 2.5e-7 * amax


def test_zero_and_nonfinite_amax_never_reach_the_file():
    for fmt_write, read in ((lambda a: write_cache(a)[0], lambda t: read_cache(t)[1]),
                            (lambda a: write_dynamic_range(a)[0], read_dynamic_range),
                            (lambda a: write_ort_table(a)[0], read_ort_table)):
        data = fmt_write({"a": 0.0, "b": float("nan"), "c": float("inf"), "d": -1.0, "e": 2.0})
        back = read(data)
        assert set(back) == set("abcde")
        assert all(np.isfinite(v) and v > 0 for v in back.values()), back
    text, warnings = write_cache({"a": 0.0, "b": float("nan"), "c": 1.0})
    assert "00000000" not in text and "7fc00000" not in text and "7f800000" not in text
    assert warnings and "amax 0" in warnings[0]


def test_tensorrt_11_has_no_cache():
    with pytest.raises(QtoolError, match="TensorRT 11 removed implicit INT8"):
        write_cache({"a": 1.0}, "11.0.0")


def test_names_with_colons_are_written_with_a_warning():
    text, warnings = write_cache({"model/conv2d/BiasAdd:0": 2.5, "plain": 1.0})
    assert "model/conv2d/BiasAdd:0: " in text
    assert read_cache(text)[1]["model/conv2d/BiasAdd:0"] == cache_round_trip(2.5)  # trtexec: last colon
    assert len(warnings) == 1 and "onnxruntime" in warnings[0] and "model/conv2d/BiasAdd:0" in warnings[0]


def test_reader_rejects_garbage():
    for bad in ("", "hello\nx: 3caa54fc\n", "TRT-8601-EntropyCalibration2\nx 3caa54fc\n",
                "TRT-8601-EntropyCalibration2\nx:3caa54fc\n",  # trtexec reads 2 chars after the colon
                "TRT-8601-EntropyCalibration2\nx: 3caa54f\n"):
        with pytest.raises(QtoolError):
            read_cache(bad)


# ----------------------------------------------------------------------------- dynamic range

def test_dynamic_range_is_sample_int8_api_text():
    amax = {"input": 1.0, "/conv/Conv_output_0": 2.640625, "tiny": 1e-8, "big": 123456789.0, "x:0": 3.0}
    text, warnings = write_dynamic_range(amax)
    lines = text.split("\n")
    assert lines[-1] == "" and "" not in lines[:-1]  # no blank line: std::stof("") throws in the sample
    assert lines[:2] == ["input:1.0", "/conv/Conv_output_0:2.640625"]
    back = read_dynamic_range(text)
    assert "x:0" not in back and any("x:0" in w and "first ':'" in w for w in warnings)
    for name, value in back.items():
        assert value == f32(amax[name])  # exact float32, as std::stof reads it
        assert text.count(f"\n{name}:") + text.startswith(f"{name}:") == 1


def test_dynamic_range_reader_is_strict():
    for bad in ("", "a 1.0\n", "a:1.0\n\nb:2.0\n", "a:one\n", ":1.0\n"):
        with pytest.raises(QtoolError):
            read_dynamic_range(bad)


# ----------------------------------------------------------------------------- onnxruntime table

def test_ort_table_reads_in_onnxruntime_reader():
    from onnxruntime.quantization.CalTableFlatBuffers.TrtTable import TrtTable

    amax = {"input": 1.0, "model/conv2d/BiasAdd:0": 2.640625, "b": 1e-8, "ä": 7.5}
    data, warnings = write_ort_table(amax)
    assert warnings == [] and len(data) % 4 == 0
    table = TrtTable.GetRootAs(data, 0)
    got = {table.Dict(i).Key().decode(): table.Dict(i).Value().decode() for i in range(table.DictLength())}
    keys = [table.Dict(i).Key().decode() for i in range(table.DictLength())]
    assert keys == sorted(amax)  # sorted as onnxruntime's own writer does
    assert {k: np.float32(v) for k, v in got.items()} == {k: np.float32(v) for k, v in amax.items()}
    assert read_ort_table(data) == {k: f32(v) for k, v in amax.items()}


def test_ort_table_reader_reads_onnxruntime_writer(tmp_path):
    from onnxruntime.quantization.calibrate import TensorData
    from onnxruntime.quantization.quant_utils import write_calibration_table

    values = {"x": 1.5, "/a/Relu_output_0": 6.25, "y:0": 0.125}
    write_calibration_table({k: TensorData(lowest=np.float32(-v), highest=np.float32(v)) for k, v in values.items()}, dir=str(tmp_path))
    assert read_ort_table((tmp_path / "calibration.flatbuffers").read_bytes()) == values


def test_ort_table_reader_refuses_damaged_files():
    data, _ = write_ort_table({"input": 1.0, "/conv/Conv_output_0": 2.5})
    for cut in range(len(data)):
        try:
            read_ort_table(data[:cut])
        except QtoolError:
            continue
        pytest.fail(f"a table cut at {cut} bytes was accepted")  # strings end the file: any cut damages one
    with pytest.raises(QtoolError):
        read_ort_table(b"\xff" * 64)


# ----------------------------------------------------------------------------- pass-through walk

def chain_model():
    """image[1,3,8,8] -> Conv -> Relu -> Reshape/Transpose/Reshape/Transpose chain, Concat with the
    Conv, MaxPool, Split, Add, nearest Resize, Slice, Unsqueeze/Squeeze, Flatten, Identity -> out;
    on the side a linear Resize, and a float shape computation feeding a nearest Resize's sizes."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32), "w1"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b1"),
        numpy_helper.from_array(np.array([1, 4, 64], np.int64), "shape_flat"),
        numpy_helper.from_array(np.array([1, 8, 8, 4], np.int64), "shape_nhwc"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up2"),
        numpy_helper.from_array(np.array([0, 0, 0, 0], np.int64), "s_start"),
        numpy_helper.from_array(np.array([1, 4, 6, 6], np.int64), "s_end"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([4, 4], np.int64), "split_sizes"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["image", "w1", "b1"], ["conv"], pads=[1, 1, 1, 1]),
        n("Relu", ["conv"], ["relu"]),
        n("Reshape", ["relu", "shape_flat"], ["flat"]),
        n("Transpose", ["flat"], ["flat_t"], perm=[0, 2, 1]),
        n("Reshape", ["flat_t", "shape_nhwc"], ["nhwc"]),
        n("Transpose", ["nhwc"], ["nchw"], perm=[0, 3, 1, 2]),
        n("Concat", ["nchw", "conv"], ["cat"], axis=1),
        n("MaxPool", ["cat"], ["pool", "pool_idx"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Split", ["pool", "split_sizes"], ["part_a", "part_b"], axis=1),
        n("Add", ["part_a", "part_b"], ["sum"]),
        n("Resize", ["sum", "", "up2"], ["up"], mode="nearest"),
        n("Resize", ["sum", "", "up2"], ["up_linear"], mode="linear"),
        n("Slice", ["up", "s_start", "s_end"], ["crop"]),
        n("Unsqueeze", ["crop", "axis0"], ["crop5"]),
        n("Squeeze", ["crop5", "axis0"], ["crop4"]),
        n("Flatten", ["crop4"], ["flat2"], axis=1),
        n("Identity", ["flat2"], ["out"]),
        # float shape arithmetic, never an activation: Shape -> Cast -> Mul -> Cast -> Resize sizes
        n("Shape", ["up_linear"], ["lin_shape"]),
        n("Cast", ["lin_shape"], ["lin_shape_f"], to=FLOAT),
        n("Mul", ["lin_shape_f", "one"], ["lin_shape_same"]),
        n("Cast", ["lin_shape_same"], ["lin_sizes"], to=TensorProto.INT64),
        n("Resize", ["up_linear", "", "", "lin_sizes"], ["lin_resized"]),
        n("ReduceMax", ["lin_resized"], ["lin_max"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "chains",
        [helper.make_tensor_value_info("image", FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", FLOAT, [1, 144]), helper.make_tensor_value_info("lin_max", FLOAT, [])],
        initializer=inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    onnx.checker.check_model(m, full_check=True)
    return m


PASS_THROUGH_OUTPUTS = ["flat", "flat_t", "nhwc", "nchw", "cat", "pool", "part_a", "part_b",
                        "up", "crop", "crop5", "crop4", "flat2", "out", "lin_resized"]


def test_chain_model_catalogue():
    names = model.activation_tensors(chain_model())
    assert names == ["image", "conv", "relu", "flat", "flat_t", "nhwc", "nchw", "cat", "pool", "part_a", "part_b",
                     "sum", "up", "up_linear", "crop", "crop5", "crop4", "flat2", "out", "lin_resized", "lin_max"]


def test_pass_through_fills_forward_chains():
    m = chain_model()
    known = {"image": 1.0, "conv": 5.0, "relu": 4.0, "sum": 3.0, "up_linear": 2.5}
    filled = passthrough.inherit(m, known)
    assert filled == {
        "flat": 4.0, "flat_t": 4.0, "nhwc": 4.0, "nchw": 4.0,
        "cat": 5.0, "pool": 5.0, "part_a": 5.0, "part_b": 5.0,  # Concat: the largest of its inputs
        "up": 3.0, "crop": 3.0, "crop5": 3.0, "crop4": 3.0, "flat2": 3.0, "out": 3.0,
        "lin_resized": 2.5,
    }
    assert "up_linear" not in passthrough.inherit(m, {"sum": 3.0})  # linear Resize interpolates: not pass-through
    assert passthrough.sources(m)["pool"] == ["cat"] and "pool_idx" not in passthrough.sources(m)
    assert passthrough.sources(m)["cat"] == ["nchw", "conv"] and passthrough.sources(m)["flat"] == ["relu"]


def test_pass_through_never_overwrites_and_needs_every_concat_input():
    m = chain_model()
    filled = passthrough.inherit(m, {"relu": 4.0, "flat_t": 9.0})
    assert "flat_t" not in filled and filled["nhwc"] == 9.0 and filled["flat"] == 4.0
    assert "cat" not in filled  # conv unknown: the Concat's range cannot be known
    assert passthrough.inherit(m, {}) == {}
    assert passthrough.inherit(m, {"conv": (-1.0, 2.0), "relu": (0.0, 3.0)},
                               merge=lambda rs: (min(r[0] for r in rs), max(r[1] for r in rs)))["pool"] == (-1.0, 3.0)


def test_pass_through_is_pure():
    m = chain_model()
    before = m.SerializeToString()
    known = {"relu": 4.0}
    passthrough.inherit(m, known)
    assert m.SerializeToString() == before and known == {"relu": 4.0}


def test_resize_mode_default_is_nearest():
    node = helper.make_node("Resize", ["x", "", "s"], ["y"])
    assert passthrough.is_pass_through(node)
    assert not passthrough.is_pass_through(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic"))
    assert not passthrough.is_pass_through(helper.make_node("Relu", ["x"], ["y"]))
    assert not passthrough.is_pass_through(helper.make_node("Reshape", ["x", "s"], ["y"], domain="com.example"))


# ----------------------------------------------------------------------------- export coverage

def fake_calibration(names, amax, method="max"):
    records = [TensorRecord(name=n, min=-amax[n], max=amax[n], amax=amax[n], counts=[1], hist_range=max(amax[n], 1.0)) for n in names]
    return Calibration(model_path="m.onnx", model_sha256="0" * 64, method=method, num_bits=8, bins=2048,
                       samples=1, preprocess={}, tensors=records)


class Loaded:
    def __init__(self, proto):
        self.proto = proto


def test_export_fills_pass_through_outputs_missing_from_the_calibration():
    m = chain_model()
    names = model.activation_tensors(m)
    amax = {n: float(i + 1) for i, n in enumerate(names)}
    own = [n for n in names if n not in PASS_THROUGH_OUTPUTS]
    result = tensorrt.export(Loaded(m), fake_calibration(own, amax), options_for("tensorrt", fmt="cache"))
    header, back = read_cache(result.data.decode())
    assert list(back) == names  # every activation tensor, graph order, inputs and outputs included
    assert result.summary["coverage"] == {"activation_tensors": len(names), "written": len(names),
                                          "inherited": len(PASS_THROUGH_OUTPUTS), "missing": 0, "dropped": 0}
    assert back["out"] == cache_round_trip(amax["sum"])
    assert back["cat"] == cache_round_trip(max(amax["relu"], amax["conv"]))
    assert result.warnings == []


def test_export_replaces_zero_ranges_of_pass_through_outputs_by_the_inputs():
    m = chain_model()
    names = model.activation_tensors(m)
    amax = dict.fromkeys(names, 2.0) | {"flat": 0.0, "lin_max": 0.0}
    _, back = read_cache(tensorrt.export(Loaded(m), fake_calibration(names, amax), options_for("tensorrt", fmt="cache")).data.decode())
    assert back["flat"] == cache_round_trip(2.0)  # from relu
    assert back["lin_max"] == cache_round_trip(ZERO_AMAX_FALLBACK)  # nothing to inherit


def test_export_warns_about_missing_tensors_and_drops_shape_tensors():
    m = zoo.yolo_like()
    names = model.activation_tensors(m)
    assert not set(zoo.YOLO_SHAPE_ONLY_FLOATS) & set(names)
    lost = [n for n in names if "Conv_output" in n][:3]
    cal_names = [n for n in names if n not in lost] + zoo.YOLO_SHAPE_ONLY_FLOATS
    cal = fake_calibration(cal_names, dict.fromkeys(cal_names, 1.5))
    for fmt, read in (("cache", lambda d: read_cache(d.decode())[1]), ("dynamic-range", lambda d: read_dynamic_range(d.decode())), ("ort-trt", read_ort_table)):
        result = tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt=fmt))
        written = read(result.data)
        assert not set(zoo.YOLO_SHAPE_ONLY_FLOATS) & set(written), fmt  # shape tensors never appear
        assert set(written) == set(names) - set(lost), fmt
        assert any("3 activation tensor(s)" in w and lost[0] in w for w in result.warnings)
        assert any("3 calibrated tensor(s)" in w for w in result.warnings)
        assert result.summary["coverage"]["missing"] == 3 and result.summary["coverage"]["dropped"] == 3


def test_export_formats_and_suffixes():
    m = chain_model()
    names = model.activation_tensors(m)
    cal = fake_calibration(names, dict.fromkeys(names, 3.0))
    assert tensorrt.suffix(options_for("tensorrt", fmt="cache")) == ".cache"
    assert tensorrt.suffix(options_for("tensorrt", fmt="dynamic-range")) == ".dynamic_range.txt"
    assert tensorrt.suffix(options_for("tensorrt", fmt="ort-trt")) == ".calibration.flatbuffers"
    with pytest.raises(QtoolError, match="cache, dynamic-range, ort-trt"):
        tensorrt.suffix(options_for("tensorrt", fmt="onnx"))
    with pytest.raises(QtoolError, match="cache, dynamic-range, ort-trt"):
        tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="dynamic_range"))
    with pytest.raises(QtoolError):
        tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="dynamic-range", trt_version="banana"))
    text = tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="dynamic-range")).data.decode()
    assert text.splitlines() == [f"{n}:3.0" for n in names]
    minmax = tensorrt.export(Loaded(m), cal, options_for("tensorrt", algorithm="minmax", trt_version="10.3.0", fmt="cache"))
    assert minmax.data.decode().startswith("TRT-100300-MinMaxCalibration\n")
    assert any("deprecate" in w for w in minmax.warnings)
    with pytest.raises(QtoolError, match="TensorRT 11 removed implicit INT8"):
        tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="ort-trt", trt_version="11.0"))


def test_export_of_tf2onnx_names_warns_about_colons():
    m = zoo.nhwc_model()
    names = model.activation_tensors(m)
    cal = fake_calibration(names, dict.fromkeys(names, 2.0))
    cache = tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="cache"))
    assert any("':'" in w and "onnxruntime" in w for w in cache.warnings)
    assert set(read_cache(cache.data.decode())[1]) == set(names)
    assert set(read_ort_table(tensorrt.export(Loaded(m), cal, options_for("tensorrt", fmt="ort-trt")).data)) == set(names)
