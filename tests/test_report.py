"""`qtool report`: one self-contained HTML page of a calibration file as one target's export uses
it (quantized tensors first with the export's own thresholds and scales, the rest folded, a
summary plot); rendered in headless Chromium when one is installed (scripts/screenshot_report.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from required import module, require

from qtool import calibration
from qtool.checks import report, report_page, report_plots

module("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"
HELDOUT = ROOT / "sample_models" / "digits_heldout.npz"
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import screenshot_report  # noqa: E402 (scripts/ is not a package)
import zoo  # noqa: E402
from runcli import invoke, ok  # noqa: E402


class Page(HTMLParser):
    """The page's quantized rows (their data-* attributes, text, <svg> count), the folded rows,
    where <details> and the summary plot are, ids and links."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.folded: list[dict] = []
        self.external: list[str] = []
        self.ids: list[str] = []
        self.links: list[str] = []
        self.svgs_outside_rows = 0
        self.summary_svgs = 0
        self.summary_text = ""
        self.details_depth = 0
        self.quantized_in_details = 0
        self._row = None
        self._summary = 0
        self._folded = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        for key in ("src", "href", "xlink:href"):
            if a.get(key):
                (self.links if a[key].startswith("#") else self.external).append(a[key])
        if tag == "link" or (tag == "script" and "src" in a):
            self.external.append(str(a))
        if tag == "details":
            self.details_depth += 1
        if tag == "div" and a.get("class") == "summary":
            self._summary = 1
        elif tag == "div" and self._summary:
            self._summary += 1
        if tag == "tr" and "data-order" in a:
            self._row = {**a, "svgs": 0, "text": ""}
            self.rows.append(self._row)
            self.quantized_in_details += self.details_depth > 0
        elif tag == "tr" and "data-unquantized" in a:
            self._folded = {**a, "text": "", "in_details": self.details_depth > 0}
            self.folded.append(self._folded)
        elif tag == "svg":
            if self._row is not None:
                self._row["svgs"] += 1
            elif self._summary:
                self.summary_svgs += 1
            else:
                self.svgs_outside_rows += 1

    def handle_endtag(self, tag):
        if tag == "tr":
            self._row = self._folded = None
        if tag == "details":
            self.details_depth -= 1
        if tag == "div" and self._summary:
            self._summary -= 1

    def handle_data(self, data):
        if self._row is not None:
            self._row["text"] += data
        if self._folded is not None:
            self._folded["text"] += data
        if self._summary:
            self.summary_text += data


def parse(text: str) -> Page:
    p = Page()
    p.feed(text)
    return p


def scales(path: Path, op: str) -> dict[str, np.ndarray]:
    """{tensor: scale} of the `op` nodes an export named `<tensor>/<op>` (qtool's naming)."""
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type == op and n.name.endswith(f"/{op}"):
            out[n.name[: -len(op) - 1]] = inits[n.input[1] if op == "QuantizeLinear" else n.input[2]]
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    calib = d / "digits.calib.json"
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "-o", calib))
    (d / "held").mkdir()
    np.save(d / "held" / "x.npy", np.load(HELDOUT)["x"][:64])
    r = ok(invoke("-q", "evaluate", SAMPLE, "--calib", calib, "--data", d / "held", "--json", "--tensors"))
    (d / "eval.json").write_text(r.stdout)
    out = d / "digits.report.html"
    summary = json.loads(ok(invoke("report", calib, "-o", out, "--evaluation", d / "eval.json", "--json")).stdout)
    return {"dir": d, "calib": calib, "eval": d / "eval.json", "html": out, "summary": summary}


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """resnet_like (residual Adds, MaxPool, a Conv TensorRT leaves FP32) calibrated on random inputs."""
    d = tmp_path_factory.mktemp("resnet")
    onnx.save(zoo.resnet_like(), d / "resnet.onnx")
    (d / "data").mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.save(d / "data" / f"{i}.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    ok(invoke("-q", "calibrate", d / "resnet.onnx", "--data", d / "data", "-o", d / "resnet.calib.json"))
    return d


# ---------------------------------------------------------------- the target's quantizers, from the export


@pytest.mark.parametrize("target", ["qdq", "openvino"])
def test_cpu_target_lists_the_exports_quantizers_first_with_its_scales(work, tmp_path, target):
    out, exported = tmp_path / "r.html", tmp_path / f"m.{target}.onnx"
    ok(invoke("-q", "report", work["calib"], "--target", target, "-o", out))
    ok(invoke("-q", "export", SAMPLE, "--calib", work["calib"], "--target", target, "-o", exported))
    page = parse(out.read_text(encoding="utf-8"))
    cal = calibration.load(work["calib"])
    names = {t.name for t in cal.tensors}
    if target == "qdq":
        written = scales(exported, "QuantizeLinear")  # activations only: weights are int8 initializers -> DQ
    else:
        m = onnx.load(str(exported))
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        written = {n.name[: -len("/FakeQuantize")]: inits[n.input[2]] for n in m.graph.node
                   if n.op_type == "FakeQuantize" and n.name[: -len("/FakeQuantize")] in names}  # input_high of activations
    reported = {r["data-tensor"]: r for r in page.rows}
    assert set(reported) == set(written) and len(written) >= 5
    for name, value in written.items():
        row = reported[name]
        if target == "qdq":
            assert np.float32(float(row["data-scale"])) == value  # the very scale the file holds
        else:
            assert np.float32(float(row["data-high"])) == value
    # graph order, and the unquantized rest folded
    orders = [int(r["data-order"]) for r in page.rows]
    assert orders == sorted(orders) and page.quantized_in_details == 0
    assert page.folded and all(f["in_details"] for f in page.folded)
    assert sorted(orders + [int(f["data-unquantized"]) for f in page.folded]) == list(range(1, len(cal.tensors) + 1))
    assert all(r["svgs"] == 1 for r in page.rows) and page.svgs_outside_rows == 0 and page.summary_svgs == 1


@pytest.mark.parametrize("method", [None, "entropy"])
def test_tensorrt_86_reports_its_fp32_qdq_scales_and_says_the_default_is_a_cache(resnet, tmp_path, method):
    calib = resnet / "resnet.calib.json"
    extra = ("--method", method) if method else ()
    out, exported = tmp_path / "r.html", tmp_path / "m.trt.onnx"
    ok(invoke("-q", "report", calib, "--target", "tensorrt", "--trt-version", "8.6", "-o", out, *extra))
    ok(invoke("-q", "export", resnet / "resnet.onnx", "--calib", calib, "--target", "tensorrt", "--trt-version", "8.6",
              "--format", "qdq", "-o", exported, *extra))
    text = out.read_text(encoding="utf-8")
    reported = {row["data-tensor"]: row for row in parse(text).rows}
    names = {t.name for t in calibration.load(calib).tensors}
    written = {k: v for k, v in scales(exported, "QuantizeLinear").items() if k in names}  # activations, not weights
    assert set(reported) == set(written)
    for name, value in written.items():
        assert value.dtype == np.float32 and np.float32(float(reported[name]["data-scale"])) == value
    assert "TensorRT 8.6.1, Q/DQ model" in text and "writes a calibration cache for TensorRT 8.x by default" in text
    assert f"thresholds: {method or 'mse'}" in text
    r = invoke("report", calib, "--target", "tensorrt", "--trt-version", "7.2.3", "-o", tmp_path / "x.html")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "calibration cache only" in r.stderr


def test_tensorrt_lists_its_qdq_scales_and_exclusions(resnet, tmp_path):
    calib = resnet / "resnet.calib.json"
    out, exported = tmp_path / "r.html", tmp_path / "m.trt.onnx"
    r = json.loads(ok(invoke("report", calib, "--target", "tensorrt", "-o", out, "--json")).stdout)
    assert r["target"] == "tensorrt" and r["target_from"] == "given with --target"
    ok(invoke("-q", "export", resnet / "resnet.onnx", "--calib", calib, "--target", "tensorrt", "-o", exported))
    text = out.read_text(encoding="utf-8")
    page = parse(text)
    cal = calibration.load(calib)
    written = {k: v for k, v in scales(exported, "QuantizeLinear").items() if k in {t.name for t in cal.tensors}}
    reported = {row["data-tensor"]: row for row in page.rows}
    assert set(reported) == set(written) and r["quantized"] == len(written) >= 4
    for name, value in written.items():
        assert value.dtype == np.float16 and np.float16(float(reported[name]["data-scale"])) == value
        amax = float(reported[name]["data-amax"])
        assert np.float16(np.float32(amax) / np.float32(127)) == value  # threshold and scale agree
    assert "TensorRT 11.4.0, Q/DQ model" in text and "thresholds: mse" in text
    # ModelOpt's small-Conv exclusion keeps /narrow/Conv in FP32: listed, its input not quantized
    assert "/narrow/Conv" in text and "/narrow/Slice_output_0" not in reported


def test_threshold_clipped_and_source_describe_the_exported_threshold(work):
    """The issue's complaint: clipped/KL described the file's entropy threshold, not the exported one."""
    text = work["html"].read_text(encoding="utf-8")
    page = parse(text)
    cal = calibration.load(work["calib"])
    records = {t.name: t for t in cal.tensors}
    differ = 0
    for row in page.rows:
        rec, amax = records[row["data-tensor"]], float(row["data-amax"])
        assert float(row["data-clipped"]) == pytest.approx(calibration.clipped_fraction(rec, amax), abs=1e-12)
        assert f"qdq: {amax:.4g}" in row["text"]  # the target's line in the plot's legend
        if abs(amax - rec.amax) > 1e-6 * amax:
            differ += 1
            assert f"file (entropy): {rec.amax:.4g}" in row["text"]
    assert differ >= 1  # the sample's qdq thresholds (auto) are not the file's entropy ones
    assert re.search(r"auto: (entropy|mse|percentile:[0-9.]+), unsigned grid", text)
    assert "range shared with" in text  # the sample's Concat group


def test_tensor_sqnr_is_the_histograms_quantization_noise():
    """tensor_sqnr equals a direct simulation on values spread as the histogram says."""
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 1000, 64).tolist()
    rec = calibration.TensorRecord("t", 0.0, 4.0, 3.0, counts, 4.0)
    step, limit = 3.0 / 127, 3.0
    edges = rec.edges()
    x = np.concatenate([np.linspace(a, b, 8, endpoint=False) + (b - a) / 16 for a, b in zip(edges[:-1], edges[1:])])
    w = np.repeat(np.asarray(counts, np.float64), 8)
    q = np.minimum(np.rint(x / step) * step, limit)
    expected = 10 * np.log10(np.dot(w, x ** 2) / np.dot(w, (x - q) ** 2))
    assert report.tensor_sqnr(rec, step, limit) == pytest.approx(expected, rel=1e-9)
    assert report.tensor_sqnr(rec, step, 2.0) < report.tensor_sqnr(rec, step, limit)  # more clipping, more noise
    assert report.tensor_sqnr(calibration.TensorRecord("z", 0.0, 0.0, 0.0, [0], 0.0), step, limit) is None


# ---------------------------------------------------------------- summary plot, evaluation, layout


def test_summary_plot_labels_the_worst_tensors_and_links_their_rows(work):
    text = work["html"].read_text(encoding="utf-8")
    page = parse(text)
    assert page.summary_svgs == 1
    for key in ("data-tsqnr", "data-sqnr"):
        values = sorted((float(r[key]), int(r["data-order"])) for r in page.rows if r[key])
        for _, order in values[:5]:
            assert f"#{order}" in page.summary_text and f"#row{order}" in page.links and f"row{order}" in page.ids
    labelled = set(re.findall(r"#(\d+)", page.summary_text))
    worst = {str(o) for key in ("data-tsqnr", "data-sqnr") for _, o in sorted((float(r[key]), int(r["data-order"])) for r in page.rows if r[key])[:5]}
    assert labelled == worst
    assert len(page.ids) == len(set(page.ids)) and page.external == []  # unique ids; nothing fetched


def test_evaluation_sqnr_default_target_and_mismatch(work, tmp_path):
    ev = json.loads(work["eval"].read_text())
    assert work["summary"]["target"] == ev["target"] == "qdq" and work["summary"]["target_from"] == "the target of the --evaluation file"
    page = parse(work["html"].read_text(encoding="utf-8"))
    sens = {t["tensor"]: t["sqnr_db"] for t in ev["tensors"] if t["kind"] == "activation"}
    assert {r["data-tensor"] for r in page.rows} == set(sens)
    for row in page.rows:
        assert float(row["data-sqnr"]) == pytest.approx(sens[row["data-tensor"]], abs=1e-9)
    out = tmp_path / "x.html"
    r = invoke("report", work["calib"], "--target", "openvino", "--evaluation", work["eval"], "-o", out)
    assert r.exit_code == 1 and "measures --target qdq" in r.stderr and r.stderr.count("\n") == 1 and not out.exists()
    r = json.loads(ok(invoke("report", work["calib"], "-o", out, "--json")).stdout)
    assert r["target"] == "qdq" and "qtool evaluate's default" in r["target_from"]


def test_evaluation_without_ranking_or_with_other_thresholds(work, tmp_path):
    held = work["dir"] / "held"
    r = ok(invoke("-q", "evaluate", SAMPLE, "--calib", work["calib"], "--data", held, "--json", "--no-tensors"))
    (tmp_path / "plain.json").write_text(r.stdout)
    ok(invoke("-q", "report", work["calib"], "--evaluation", tmp_path / "plain.json", "-o", tmp_path / "plain.html"))
    text = (tmp_path / "plain.html").read_text(encoding="utf-8")
    assert "logits" in text and "output SQNR" not in text and parse(text).rows[0]["data-sqnr"] == ""  # outputs only
    r = ok(invoke("-q", "evaluate", SAMPLE, "--calib", work["calib"], "--data", held, "--json", "--tensors", "--method", "max", "--limit", "8"))
    (tmp_path / "max.json").write_text(r.stdout)
    ok(invoke("-q", "report", work["calib"], "--evaluation", tmp_path / "max.json", "-o", tmp_path / "max.html"))
    assert "were evaluated with another threshold than this page" in (tmp_path / "max.html").read_text(encoding="utf-8")
    ok(invoke("-q", "report", work["calib"], "--evaluation", tmp_path / "max.json", "--method", "max", "-o", tmp_path / "same.html"))
    assert "another threshold" not in (tmp_path / "same.html").read_text(encoding="utf-8")


def test_preprocessing_is_a_table(work):
    text = work["html"].read_text(encoding="utf-8")
    block = text[text.index("<table class=\"preprocessing\">"):]
    block = block[: block.index("</table>")]
    assert "<td class=\"key\">resize</td><td class=\"left\">stretch</td>" in block
    assert "<td class=\"key\">height</td><td class=\"left\">32</td>" in block
    assert "{" not in block  # no raw JSON


def test_layout_never_wider_than_the_window(work):
    """No fixed width: every plot scales through its viewBox, tables scroll inside their box."""
    text = work["html"].read_text(encoding="utf-8")
    style = text[text.index("<style>"): text.index("</style>")]
    assert "svg{max-width:100%;height:auto" in style and ".scroll{max-width:100%;overflow-x:auto}" in style
    assert not re.search(r"(?<!max-)width:\s*\d+px", style)  # only max-widths in pixels
    assert 'name="viewport"' in text
    for head in re.findall(r"<svg\b[^>]*>", text):
        assert "viewBox=" in head and not re.search(r"\s(width|height)=", head)
    assert text.count("<table") == text.count("<div class=\"scroll\"><table")  # every table in a scrolling box


def test_names_are_escaped(tmp_path):
    nasty_out = '</td><script>alert("q&a")</script>'
    nasty_relu = "r'<b>&amp;"
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x<in>&", "w1"], [nasty_out], name="mm1"), helper.make_node("Relu", [nasty_out], [nasty_relu], name="relu"),
         helper.make_node("MatMul", [nasty_relu, "w2"], ["y"], name="mm2")],
        "nasty", [helper.make_tensor_value_info("x<in>&", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), tmp_path / "nasty.onnx")
    (tmp_path / "d").mkdir()
    np.save(tmp_path / "d" / "a.npy", rng.standard_normal((16, 8)).astype(np.float32))
    ok(invoke("-q", "calibrate", tmp_path / "nasty.onnx", "--data", tmp_path / "d", "-o", tmp_path / "n.calib.json"))
    ok(invoke("-q", "report", tmp_path / "n.calib.json", "-o", tmp_path / "n.html"))
    text = (tmp_path / "n.html").read_text(encoding="utf-8")
    assert "<script>alert" not in text and "<in>" not in text and "r'<b>" not in text
    page = parse(text)
    assert {r["data-tensor"] for r in page.rows} == {"x<in>&", nasty_relu}  # the parser unescapes attributes
    assert nasty_out in page.folded[0]["text"] and "<script" not in "".join(page.external)


def test_every_text_of_the_page_is_escaped():
    """The template autoescapes: a `<script>` in any name or sentence the page shows (they come from
    the user's model and files) comes out as text; only the page's own script runs."""
    bad = '<script>alert("x")</script>'
    plot = report_plots.HistogramPlot(np.array([3.0, 1.0]), np.array([0.0, 0.5, 1.0]), bad, 0.9, bad, 1.0, True, {"max": 1.0})
    row = report.QuantizedRow(1, bad, [bad], bad, 0.0, 0.9, 0.9, 0.9 / 255, 0, 0, bad, 0.0, False, 40.0, 30.0, plot)
    page = report.Page(report.FileView(bad, bad, "0" * 64, bad, 8, 2, 1, 2, [(bad, bad), ("list", [bad, 1.5])]),
                       report.TargetView(bad, bad, bad, bad, 1, 1, [bad]),
                       report.EvaluationView(4, [(bad, 30.0, 0.99, 1.0)], [bad] * 6, True), [row],
                       [report.FloatRow(2, bad, 0.0, 1.0, 1.0, bad)], [(bad, bad)], [report.WeightRow(bad, [bad], 4, 0.1, 0.2, 25.0, bad)])
    text = report_page.html(page)
    assert text.count("<script") == 1 and text.count("</script>") == 1  # the page's own
    assert text.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") >= 20  # every field of the page
    assert text.count("alert(") == text.count("&lt;script&gt;alert(")  # the plots' legends too
    parsed = parse(text)
    assert [r["data-tensor"] for r in parsed.rows] == [bad] and bad in parsed.folded[0]["text"]


# ---------------------------------------------------------------- the --evaluation file (issue 30)


def test_evaluation_file_is_read_bounded_and_errors_are_one_line(work, tmp_path, monkeypatch):
    doc = json.loads(work["eval"].read_text())
    cases = {
        "other.json": (json.dumps({**doc, "model_sha256": "0" * 64}), "(SHA-256 000000000000), not the model the calibration file records"),
        "bad.json": ("{not json", "not readable JSON"),
        "export.json": (json.dumps({"command": "export"}), "not the output of qtool evaluate"),
        "deep.json": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError in json
        "nested.json": (json.dumps({**doc, "x": [[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]}), "nested deeper than 16 levels"),
        "latin1.json": (b'{"command": "evaluate\xe9"}', "not UTF-8"),
        "huge_int.json": ('{"a": ' + "9" * 5000 + "}", "not readable JSON"),
        "missing.json": (None, "does not exist"),
    }
    for name, (content, message) in cases.items():
        if isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        elif content is not None:
            (tmp_path / name).write_text(content)
        out = tmp_path / f"{name}.html"
        r = invoke("report", work["calib"], "-o", out, "--evaluation", tmp_path / name)
        assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), (name, r.output)
        assert not out.exists()
    monkeypatch.setattr(report, "MAX_EVALUATION_BYTES", 1 << 20)
    (tmp_path / "big.json").write_bytes(b" " * ((1 << 20) + 1))
    r = invoke("report", work["calib"], "-o", tmp_path / "big.html", "--evaluation", tmp_path / "big.json")
    assert r.exit_code == 1 and "larger than 1 MB" in r.stderr and r.stderr.count("\n") == 1


# ---------------------------------------------------------------- files and failures


def test_same_inputs_same_bytes(work, tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    ok(invoke("-q", "report", work["calib"], "-o", a, "--target", "tensorrt"))
    ok(invoke("-q", "report", work["calib"], "-o", b, "--target", "tensorrt"))
    assert a.read_bytes() == b.read_bytes() and "output SQNR" not in a.read_text(encoding="utf-8")


def test_default_output_name(work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = ok(invoke("report", work["calib"]))
    assert (tmp_path / "digits.report.html").exists() and "digits.report.html" in r.stdout


def test_bad_calibration_file_output_and_options(work, tmp_path):
    (tmp_path / "x.calib.json").write_text("{}")
    r = invoke("report", tmp_path / "x.calib.json", "-o", tmp_path / "x.html")
    assert r.exit_code == 1 and "not a qtool calibration file" in r.stderr and not (tmp_path / "x.html").exists()
    r = invoke("report", work["calib"], "-o", tmp_path / "no" / "x.html")
    assert r.exit_code == 1 and "does not exist" in r.stderr
    r = invoke("report", work["calib"], "-o", work["calib"])
    assert r.exit_code == 1 and "input file" in r.stderr
    r = invoke("report", work["calib"], "-o", tmp_path / "y.html", "--target", "qdq", "--trt-version", "10.3")
    assert r.exit_code == 1 and "--trt-version applies to --target tensorrt" in r.stderr
    r = invoke("report", work["calib"], "-o", tmp_path / "y.html", "--method", "bogus")
    assert r.exit_code == 1 and r.stderr.startswith("error: --method") and r.stderr.count("\n") == 1
    assert not (tmp_path / "y.html").exists()


def test_the_model_is_found_or_named_with_model(work, tmp_path):
    moved = tmp_path / "a" / "b" / "c" / "d" / "elsewhere.calib.json"
    moved.parent.mkdir(parents=True)
    moved.write_bytes(work["calib"].read_bytes())  # its relative model path now points nowhere
    r = invoke("report", moved, "-o", tmp_path / "a.html")
    assert r.exit_code == 1 and "pass it with --model" in r.stderr and r.stderr.count("\n") == 1 and not (tmp_path / "a.html").exists()
    ok(invoke("-q", "report", moved, "--model", SAMPLE, "-o", tmp_path / "a.html"))
    r = invoke("report", moved, "--model", ROOT / "tests" / "zoo.py", "-o", tmp_path / "b.html")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and not (tmp_path / "b.html").exists()


def test_missing_matplotlib_is_one_clear_line(work, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "r.html"
    r = invoke("report", work["calib"], "-o", out)
    assert r.exit_code == 1 and r.stderr == "error: qtool report draws its plots with matplotlib, which is not installed; pip install 'qtool[report]'\n"
    assert not out.exists()


# ---------------------------------------------------------------- in a real browser

@pytest.fixture
def browser():
    """Chromium, headless (Debian: apt-get install chromium; .ci/run installs it)."""
    found = screenshot_report.find_browser()
    require(found is not None, "no Chromium installed (Debian: apt-get install chromium)")
    return found

_MEASURE = """<script>
(function(){var w=window.innerWidth, worst=0, over=[];
 document.querySelectorAll('svg, table, .scroll, .target').forEach(function(el){
   var r=el.getBoundingClientRect(); worst=Math.max(worst, r.right);
   if(el.classList.contains('scroll') && el.scrollWidth>el.clientWidth+1) over.push(el.firstElementChild.className);});
 document.body.setAttribute('data-measure', JSON.stringify({inner:w, scroll:document.documentElement.scrollWidth, right:worst, over:over}));})();
</script></body>"""


def _measure(html: Path, width: int) -> dict:
    """Chromium's layout of the page at `width` px: the widest element's right edge, the page's
    scroll width and the scrolling boxes that would need to scroll."""
    browser = screenshot_report.find_browser()
    with tempfile.TemporaryDirectory() as profile:
        probe = Path(profile) / "probe.html"
        probe.write_text(html.read_text(encoding="utf-8").replace("</body>", _MEASURE), encoding="utf-8")
        args = screenshot_report.chromium_args(browser, probe.as_uri(), profile)
        args[-1:-1] = ["--dump-dom", f"--window-size={width},1200"]
        dom = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return json.loads(re.search(r'data-measure="([^"]*)"', dom).group(1).replace("&quot;", '"'))


@pytest.mark.parametrize("width", [1280, 1920])
def test_chromium_shows_everything_within_the_window(work, width, browser):
    m = _measure(work["html"], width)
    assert m["inner"] == width and m["scroll"] <= width and m["right"] <= width and m["over"] == [], m


def test_chromium_sorts_by_output_sqnr(work, browser):
    dom = screenshot_report.dump_dom(work["html"], sort="sqnr")
    page = parse(dom)
    values = [float(r["data-sqnr"]) for r in page.rows]
    assert values == sorted(values) and len(values) >= 5


def test_tensorrt_report_of_a_transformer_shows_the_smoothed_export(tmp_path):
    """On a transformer the TensorRT export applies SmoothQuant; the report places with the same
    code (qtool.targets.tensorrt.int8.plan), so it lists exactly the export's Q/DQ scales, the
    smoothed activations among them, and says where their thresholds come from."""
    from test_transformers import bert_feeds

    onnx.save(zoo.bert_like(True), tmp_path / "bert.onnx")
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(tmp_path / "data" / f"{i}.npz", **bert_feeds(rng))
    calib = tmp_path / "bert.calib.json"
    ok(invoke("-q", "calibrate", tmp_path / "bert.onnx", "--data", tmp_path / "data", "-o", calib))
    out, exported = tmp_path / "r.html", tmp_path / "m.trt.onnx"
    ok(invoke("-q", "report", calib, "--target", "tensorrt", "-o", out))
    summary = json.loads(ok(invoke("-q", "export", tmp_path / "bert.onnx", "--calib", calib, "--target", "tensorrt",
                                   "-o", exported, "--json")).stdout)
    assert summary["smooth_quant"]["layers"]
    m = onnx.load(str(exported))
    inits = {i.name for i in m.graph.initializer}
    activations = {n.input[0] for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    written = {k: v for k, v in scales(exported, "QuantizeLinear").items() if k in activations}
    reported = {row["data-tensor"]: row for row in parse(out.read_text(encoding="utf-8")).rows}
    assert set(reported) == set(written) and written
    for name, value in written.items():
        assert np.float16(float(reported[name]["data-scale"])) == value
    smoothed = [name for name, row in reported.items() if "max |x| of the SmoothQuant-scaled tensor" in row["text"]]
    assert smoothed and all(name.endswith("/smooth_quant") for name in smoothed)
