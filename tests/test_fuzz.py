"""Fuzzing: corrupted models, images and calibration files never crash qtool.

Every outcome must be success (0) or a user error (1) with a one-line message: no traceback,
no internal error. Bounded example counts keep CI fast.
"""

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from qtool.cli import cli

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_BYTES = (ROOT / "sample_models" / "digits_cnn.onnx").read_bytes()
PNG_BYTES = (ROOT / "calib_images" / "digit_0000.png").read_bytes()
FUZZ = settings(max_examples=int(os.environ.get("QTOOL_FUZZ_EXAMPLES", "25")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, pos, value in edits:
        if not buf:
            break
        i = pos % len(buf)
        if kind == "flip":
            buf[i] ^= 1 << (value % 8)
        elif kind == "set":
            buf[i] = value % 256
        elif kind == "cut":
            del buf[i:]
        else:
            buf[i:i] = bytes([value % 256]) * (1 + value % 7)
    return bytes(buf)


EDITS = st.lists(st.tuples(st.sampled_from(["flip", "set", "cut", "insert"]), st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=6)


def _clean_outcome(r, listing: bool = False):
    """Exit 0, or exit 1 with one `error:` line: the whole output, or with `listing` stderr (stdout
    may then hold a listing, as inspect's)."""
    assert r.exit_code in (0, 1), r.output
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    if r.exit_code == 1:
        text = r.stderr if listing else r.output
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), text


@FUZZ
@given(EDITS)
def test_corrupted_model(tmp_path, edits):
    (tmp_path / "imgs").mkdir(exist_ok=True)
    (tmp_path / "imgs" / "a.png").write_bytes(PNG_BYTES)
    model = tmp_path / "m.onnx"
    model.write_bytes(_mutate(SAMPLE_BYTES, edits))
    _clean_outcome(CliRunner().invoke(cli, ["calibrate", str(model), "--images", str(tmp_path / "imgs"), "-o", str(tmp_path / "o.json")]))


@FUZZ
@given(st.lists(EDITS, min_size=1, max_size=3))
def test_corrupted_images(tmp_path, image_edits):
    folder = tmp_path / "imgs"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for i, edits in enumerate(image_edits):
        (folder / f"{i}.png").write_bytes(_mutate(PNG_BYTES, edits))
    args = ["calibrate", str(ROOT / "sample_models" / "digits_cnn.onnx"), "--images", str(folder), "-o", str(tmp_path / "o.json")]
    _clean_outcome(CliRunner().invoke(cli, args))
    _clean_outcome(CliRunner().invoke(cli, args + ["--on-bad-image", "skip"]))


# numbers at the edges of what fits (int64, float64 exact integers, float32 and float64 ranges)
# and markers replaced by deeply nested brackets once the document is text (json.dumps cannot nest so deep)
_EDGES = st.sampled_from([2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63 - 1, 2 ** 53 + 1, 10 ** 400, 1e308, -1e308, 3.5e38, 5e-324,
                          1e-300, -0.0, "\x00deep:50", "\x00deep:5000"])
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5) | _EDGES,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def _dumps(doc) -> str:
    """JSON text of doc, with every "\x00deep:N" marker replaced by N nested empty lists."""
    return re.sub(r'"\\u0000deep:(\d+)"', lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), json.dumps(doc))


def _calibration(tmp_path) -> dict:
    cal = tmp_path / "good.calib.json"
    if not cal.exists():
        r = CliRunner().invoke(cli, ["calibrate", str(ROOT / "sample_models" / "digits_cnn.onnx"), "--images", str(ROOT / "calib_images"), "--limit", "4", "-o", str(cal)])
        assert r.exit_code == 0, r.output
    return json.loads(cal.read_text())


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1 << 16), _JSON), min_size=1, max_size=4), EDITS, st.booleans())
def test_corrupted_calibration_file(tmp_path, replacements, edits, as_bytes):
    doc = _calibration(tmp_path)
    for pos, value in replacements:  # replace a field somewhere in the document with random JSON
        node = doc
        for _ in range(4):
            if isinstance(node, dict) and node:
                key = sorted(node)[pos % len(node)]
                if not isinstance(node[key], (dict, list)) or pos % 3 == 0:
                    node[key] = value
                    break
                node = node[key]
            elif isinstance(node, list) and node:
                node[pos % len(node)] = value
                break
    text = _dumps(doc).encode()
    bad = tmp_path / "bad.calib.json"
    bad.write_bytes(_mutate(text, edits) if as_bytes else text)
    model = str(ROOT / "sample_models" / "digits_cnn.onnx")
    for target in ("tensorrt",):
        _clean_outcome(CliRunner().invoke(cli, ["export", model, "--target", target, "--calib", str(bad), "-o", str(tmp_path / "o.cache")]))
    _clean_outcome(CliRunner().invoke(cli, ["inspect", str(bad)]))
    _clean_outcome(CliRunner().invoke(cli, ["merge", str(bad), str(tmp_path / "good.calib.json"), "-o", str(tmp_path / "m.json")]))

    _clean_outcome(CliRunner().invoke(cli, ["recompute", str(bad), "--method", "mse", "-o", str(tmp_path / "r.json")]))


# ----------------------------------------------------------------------------- policy files

_RULE_KEYS = st.sampled_from(["name", "glob", "regex", "op_type", "bits", "signed", "symmetric", "per_channel", "scale",
                              "rounding", "apply_to", "junk"])
_RULE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=8), _EDGES,
    st.sampled_from(["Conv", "Gemm", "pow2", "float", "half-up", "activations", "weights", "*", "/conv*", "^/", "(a+)+$",
                     "(", ".*.*", "fc.weight"]),
    st.lists(st.sampled_from(["activations", "weights", 3, None]), max_size=3),
)
_RULES = st.lists(st.dictionaries(_RULE_KEYS, _RULE_VALUES, max_size=4) | _JSON, max_size=4)


@FUZZ
@given(st.one_of(_RULES.map(lambda r: {"rules": r}), _JSON), st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "latin-1"]),
       st.sampled_from([".json", ".toml"]), st.booleans(), EDITS)
def test_corrupted_policy_file(tmp_path, doc, encoding, suffix, mutate, edits):
    _calibration(tmp_path)
    policy = tmp_path / f"p{suffix}"
    data = _dumps(doc).encode(encoding, errors="replace")
    policy.write_bytes(_mutate(data, edits) if mutate else data)
    _clean_outcome(CliRunner().invoke(cli, ["inspect", str(tmp_path / "good.calib.json"), "--policy", str(policy)]), listing=True)


@pytest.mark.filterwarnings("ignore:Possible (nested set|set union|set difference|set intersection|set symmetric difference):FutureWarning")  # re's notes on "[[", "||", ... in generated patterns
@settings(max_examples=int(os.environ.get("QTOOL_FUZZ_EXAMPLES", "25")) * 12, deadline=None)
@given(st.text(alphabet="ab()*+?|.{}[]^$\\1,2:=<!", max_size=14))
def test_accepted_regexes_match_in_bounded_time(pattern):
    """A regex rule qtool accepts searches adversarial names quickly; one it refuses says why."""
    from qtool.quantizers import policy

    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return
    if policy.check_regex(pattern):
        return
    started = time.perf_counter()
    for name in ("a" * 60 + "!", "ab" * 30 + "!", "b" * 60, ""):
        re.search(pattern, name)
    assert time.perf_counter() - started < 1.0, pattern


# ----------------------------------------------------------------------------- TensorRT range files

_NAMES = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), min_size=1, max_size=6)
_AMAX_TEXT = st.one_of(st.floats().map(str), st.sampled_from(["nan", "-inf", "0", "-0", "1e400", "1e-50", "x", "", " 2"]))


@FUZZ
@given(st.sampled_from(["cache", "dynamic-range", "ort-trt"]), st.lists(st.tuples(_NAMES, st.integers(0, 2 ** 32 - 1), _AMAX_TEXT), max_size=5),
       st.sampled_from(["TRT-8601-EntropyCalibration2", "TRT-100300-MinMaxCalibration", "TRT-99999999999999999999-X", "TRT-1-"]),
       st.booleans(), EDITS, st.booleans())
def test_corrupted_range_files(tmp_path, kind, entries, header, mutate, edits, with_model):
    from qtool.targets.tensorrt import files as trtfiles

    if kind == "cache":
        data = "\n".join([header] + [f"{n}: {v:08x}" for n, v, _ in entries]).encode("utf-8", errors="replace") + b"\n"
    elif kind == "dynamic-range":
        data = "".join(f"{n}:{a}\n" for n, _, a in entries).encode("utf-8", errors="replace")
    else:
        data = trtfiles._flatbuffer_table(sorted((n.encode("utf-8", errors="replace"), a.encode("ascii", errors="replace")) for n, _, a in entries))
    f = tmp_path / "ranges.bin"
    f.write_bytes(_mutate(data, edits) if mutate else data)
    args = ["inspect", str(f)] + (["--model", str(ROOT / "sample_models" / "digits_cnn.onnx")] if with_model else [])
    _clean_outcome(CliRunner().invoke(cli, args), listing=True)


# ----------------------------------------------------------------------------- numbers on the command line

_INT_TEXT = st.one_of(st.integers(-2 ** 70, 2 ** 70), st.sampled_from([0, 1, 8, 256, 2048, 65536, 65537, 2 ** 20, 2 ** 30, 2 ** 63, 10 ** 30])).map(str)


@FUZZ
@given(st.fixed_dictionaries({}, optional={
    "--bins": st.one_of(_INT_TEXT, st.sampled_from([str(2 ** k) for k in range(0, 70, 3)])),
    "--size": st.one_of(st.tuples(st.sampled_from([-1, 0, 1, 8, 16, 8193, 20000, 2 ** 31, 10 ** 30]), st.sampled_from([0, 4, 8, 9000, 2 ** 40]))
                        .map(lambda hw: f"{hw[0]}x{hw[1]}"), st.text(max_size=6)),
    "--limit": _INT_TEXT, "--batch-size": _INT_TEXT,
    "--shard": st.tuples(_INT_TEXT, _INT_TEXT).map("/".join) | st.text(max_size=4),
    "--scale": st.one_of(st.floats().map(str), st.sampled_from(["1/0", "0", "1e400", "1/255", "-2", "nan", "x"])),
    "--mean": st.sampled_from(["0.5", "0"]) | st.lists(st.floats(), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v))),
    "--std": st.sampled_from(["0.5", "1"]) | st.lists(st.floats(), min_size=1, max_size=3).map(lambda v: ",".join(map(str, v))),
}))
def test_cli_numbers(tmp_path, options):
    """Absurd, negative, huge or malformed numbers: a usage error (2), a one-line error (1) or a run."""
    import onnx
    from onnx import TensorProto, helper

    model = tmp_path / "dyn.onnx"
    if not model.exists():  # dynamic height and width, so that --size applies
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, "h", "w"])
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), model)
    options.setdefault("--size", "8x8")
    options.setdefault("--limit", "2")
    args = ["calibrate", str(model), "--images", str(ROOT / "calib_images"), "-o", str(tmp_path / "o.json")]
    for k, v in options.items():
        args += [k, v]
    r = CliRunner().invoke(cli, args)
    event(f"exit {r.exit_code}")
    if r.exit_code == 2:  # click refused the option (e.g. --limit 0, a value starting with '-')
        assert "Traceback" not in r.output and "internal error" not in r.output, r.output
        return
    _clean_outcome(r, listing=True)


_RANGES = st.one_of(st.integers(-175, 140).map(lambda k: 2.0 ** k), st.floats(min_value=0, allow_nan=False), st.just(0.0))
_COUNTS = st.lists(st.one_of(st.integers(0, 2 ** 64), st.sampled_from([0, 1, 2 ** 53, 2 ** 62, 2 ** 63 - 1])), min_size=1, max_size=6)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 100), _RANGES, _COUNTS, st.floats(allow_nan=False), st.floats(allow_nan=False)), min_size=1, max_size=4),
       st.sampled_from(["entropy", "mse", "max", "percentile:99.9", "auto", "percentile:1e400", "percentile:nan", "percentile:0", "mean-minmax", "x"]))
def test_merged_and_recomputed_numbers(tmp_path, edits, method):
    """Histogram ranges anywhere from 2**-175 to 2**140, counts up to 2**64, any min/max: merging
    two such files, recomputing and exporting is a result or a one-line error."""
    doc = _calibration(tmp_path)
    names = sorted(doc["tensors"])
    files = []
    for side in (0, 1):
        d = json.loads(json.dumps(doc))
        for pos, top, counts, lo, hi in edits[side::2] or edits:
            t = d["tensors"][names[pos % len(names)]]
            t["histogram"] = {"range": [0.0, top], "counts": counts}
            t.update(min=min(lo, hi), max=max(lo, hi), amax=abs(hi))
        f = tmp_path / f"side{side}.calib.json"
        f.write_text(json.dumps(d))
        files.append(f)
    merged = tmp_path / "merged.calib.json"
    r = CliRunner().invoke(cli, ["merge", str(files[0]), str(files[1]), "-o", str(merged)])
    _clean_outcome(r)
    event(f"merge exit {r.exit_code}")
    source = merged if r.exit_code == 0 else files[0]
    _clean_outcome(CliRunner().invoke(cli, ["recompute", str(source), "--method", method, "-o", str(tmp_path / "r.json")]))
    _clean_outcome(CliRunner().invoke(cli, ["export", "--target", "qdq", "--calib", str(source), "-o", str(tmp_path / "x.onnx")]))
