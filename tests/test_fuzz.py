"""Fuzzing: corrupted models, images and calibration files never crash qtool.

Every outcome must be success (0) or a user error (1) with a one-line message: no traceback,
no internal error. Bounded example counts keep CI fast.
"""

import json
import os
import shutil
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
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


def _clean_outcome(r):
    assert r.exit_code in (0, 1), r.output
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    if r.exit_code == 1:
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.output


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


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


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
    text = json.dumps(doc).encode()
    bad = tmp_path / "bad.calib.json"
    bad.write_bytes(_mutate(text, edits) if as_bytes else text)
    model = str(ROOT / "sample_models" / "digits_cnn.onnx")
    for target in ("tensorrt",):
        _clean_outcome(CliRunner().invoke(cli, ["export", model, "--target", target, "--calib", str(bad), "-o", str(tmp_path / "o.cache")]))
    _clean_outcome(CliRunner().invoke(cli, ["inspect", str(bad)]))
    _clean_outcome(CliRunner().invoke(cli, ["merge", str(bad), str(tmp_path / "good.calib.json"), "-o", str(tmp_path / "m.json")]))
