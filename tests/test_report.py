"""`qtool report`: one self-contained HTML page, a plot per tensor, sortable; rendered in
headless Chromium when one is installed (scripts/screenshot_report.py)."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from qtool import calibration, report, thresholds

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_models" / "digits_cnn.onnx"
IMAGES = ROOT / "calib_images"
HELDOUT = ROOT / "sample_models" / "digits_heldout.npz"
sys.path.insert(0, str(ROOT / "scripts"))
import screenshot_report  # noqa: E402 (scripts/ is not a package)
from runcli import invoke  # noqa: E402


def ok(result):
    assert result.exit_code == 0 and result.exception is None, (result.output, result.exception)
    return result


class Page(HTMLParser):
    """Rows of the tensor table: their data-* attributes, and the <svg> elements in each."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.svgs_outside_rows = 0
        self.external: list[str] = []
        self.ids: list[str] = []
        self._in_row = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        for key in ("src", "href", "xlink:href"):
            if a.get(key) and not a[key].startswith("#"):
                self.external.append(a[key])
        if tag == "link" or (tag == "script" and "src" in a):
            self.external.append(str(a))
        if tag == "tr" and "data-order" in a:
            self._in_row = True
            self.rows.append({**a, "svgs": 0, "text": ""})
        elif tag == "svg":
            if self._in_row:
                self.rows[-1]["svgs"] += 1
            else:
                self.svgs_outside_rows += 1

    def handle_endtag(self, tag):
        if tag == "tr":
            self._in_row = False

    def handle_data(self, data):
        if self._in_row:
            self.rows[-1]["text"] += data


def parse(path: Path) -> Page:
    p = Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    calib = d / "digits.calib.json"
    ok(invoke("-q", "calibrate", SAMPLE, "--images", IMAGES, "-o", calib))
    (d / "held").mkdir()
    np.save(d / "held" / "x.npy", np.load(HELDOUT)["x"][:200])
    r = ok(invoke("evaluate", SAMPLE, "--calib", calib, "--data", d / "held", "--json", "--tensors"))
    (d / "eval.json").write_text(r.stdout)
    out = d / "digits.report.html"
    summary = json.loads(ok(invoke("report", calib, "-o", out, "--evaluation", d / "eval.json", "--json")).stdout)
    return {"dir": d, "calib": calib, "eval": d / "eval.json", "html": out, "summary": summary}


def test_one_plot_per_tensor_self_contained(work):
    cal = calibration.load(work["calib"])
    page = parse(work["html"])
    assert [r["data-order"] for r in page.rows] == [str(i) for i in range(len(cal.tensors))] and len(page.rows) == 21
    assert all(r["svgs"] == 1 for r in page.rows) and page.svgs_outside_rows == 0
    for row, rec in zip(page.rows, cal.tensors):
        assert rec.name in row["text"]
    assert page.external == []  # nothing fetched: no src/href/link to anything outside the page
    text = work["html"].read_text(encoding="utf-8")
    assert "@import" not in text and "url(http" not in text
    assert len(page.ids) == len(set(page.ids))  # inline SVGs must not share ids
    assert work["summary"]["tensors"] == 21 and work["summary"]["outputs"]["report"] == str(work["html"])


def test_every_method_threshold_is_drawn(work):
    text = work["html"].read_text(encoding="utf-8")
    cal = calibration.load(work["calib"])
    rec = next(t for t in cal.tensors if t.name == "/stem/stem.2/Relu_output_0")
    assert report.methods() == [m if not m.endswith(":P") else "percentile:99.99" for m in thresholds.METHODS]
    for m in report.methods():
        assert f"{m}: {rec.threshold(m, cal.kl_variant):.4g}" in text  # the legend names each line
    assert f"file ({cal.method}): {rec.amax:.4g}" in text


def test_sort_keys_and_sqnr_from_the_evaluation(work):
    page = parse(work["html"])
    ev = json.loads(work["eval"].read_text())
    sens = {t["tensor"]: t["sqnr_db"] for t in ev["tensors"]}
    cal = calibration.load(work["calib"])
    for row, rec in zip(page.rows, cal.tensors):
        assert 0 <= float(row["data-clipped"]) <= 1
        assert row["data-kl"] == "" or float(row["data-kl"]) >= 0
        if rec.name in sens:
            assert float(row["data-sqnr"]) == pytest.approx(sens[rec.name], abs=1e-9)
        else:
            assert row["data-sqnr"] == ""
    assert sum(r["data-sqnr"] != "" for r in page.rows) == sum(t["kind"] == "activation" for t in ev["tensors"])
    # the Concat group's shared range is not the file's amax for this input: drawn and noted
    row = next(r for r in page.rows if "/branch_relu/branch_relu.2/Relu_output_0" in r["text"])
    shared = next(t["range"]["amax"] for t in ev["tensors"] if t["tensor"] == "/branch_relu/branch_relu.2/Relu_output_0")
    assert f"quantized at {shared:.4g}" in row["text"] and f"quantized at: {shared:.4g}" in row["text"]
    assert sum("quantized at" in r["text"] for r in page.rows) >= 1
    text = work["html"].read_text(encoding="utf-8")
    for t in ev["tensors"]:
        if t["kind"] == "weight":  # no histogram to plot, listed apart
            assert f">{t['tensor']}</td><td>{t['sqnr_db']:.2f}</td>" in text


def test_the_report_shows_each_quantizers_policy(work, tmp_path):
    r = ok(invoke("evaluate", SAMPLE, "--calib", work["calib"], "--data", work["dir"] / "held", "--json", "--no-tensors"))
    assert json.loads(r.stdout)["tensors"] == []
    r = ok(invoke("evaluate", SAMPLE, "--calib", work["calib"], "--data", work["dir"] / "held", "--json", "--tensors", "--weight-bits", "4",
                  "--limit", "1"))
    (tmp_path / "eval.json").write_text(r.stdout)
    out = tmp_path / "r.html"
    ok(invoke("-q", "report", work["calib"], "-o", out, "--evaluation", tmp_path / "eval.json"))
    text = out.read_text(encoding="utf-8")
    assert "4-bit signed symmetric per-channel float scale, half-even" in text  # the weights table
    assert "8-bit auto symmetric per-tensor float scale, half-even" in text  # an activation row


def test_kl_is_lowest_at_the_entropy_threshold(work):
    """The KL column is the divergence NVIDIA's entropy search minimises."""
    cal = calibration.load(work["calib"])
    for rec in cal.tensors[:6]:
        at_entropy = report.kl_divergence(rec, rec.threshold("entropy", "nvidia"))
        at_max = report.kl_divergence(rec, rec.absmax)
        assert at_entropy is not None and at_entropy <= at_max + 1e-12


def test_same_inputs_same_bytes_and_no_evaluation_column(work):
    a, b = work["dir"] / "a.html", work["dir"] / "b.html"
    ok(invoke("-q", "report", work["calib"], "-o", a))
    ok(invoke("-q", "report", work["calib"], "-o", b))
    assert a.read_bytes() == b.read_bytes()
    assert "SQNR dB" not in a.read_text(encoding="utf-8") and len(parse(a).rows) == 21


def test_all_zero_tensor_plots_a_note():
    rec = calibration.TensorRecord("z", 0.0, 0.0, 0.0, [0], 0.0)
    cal = calibration.Calibration("m.onnx", "0" * 64, "entropy", 8, 2048, 1, {"source": "data", "inputs": ["z"]}, [rec])
    html = report.render(cal, "z.calib.json").decode()
    assert "no values (all zero)" in html and html.count("<svg") == 1
    assert report.kl_divergence(rec, 0.0) is None


def test_default_output_name(work, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = ok(invoke("report", work["calib"]))
    assert (tmp_path / "digits.report.html").exists() and "digits.report.html" in r.stdout


def test_evaluation_of_another_model_is_refused(work, tmp_path):
    doc = json.loads(work["eval"].read_text())
    (tmp_path / "other.json").write_text(json.dumps({**doc, "model_sha256": "0" * 64}))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "export.json").write_text(json.dumps({"command": "export"}))
    for name, message in (("other.json", "another model"), ("bad.json", "not readable JSON"), ("export.json", "not the output of qtool evaluate"),
                          ("missing.json", "does not exist")):
        out = tmp_path / f"{name}.html"
        r = invoke("report", work["calib"], "-o", out, "--evaluation", tmp_path / name)
        assert r.exit_code == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.output
        assert not out.exists()


def test_bad_calibration_file_and_output(work, tmp_path):
    (tmp_path / "x.calib.json").write_text("{}")
    r = invoke("report", tmp_path / "x.calib.json", "-o", tmp_path / "x.html")
    assert r.exit_code == 1 and "not a qtool calibration file" in r.stderr and not (tmp_path / "x.html").exists()
    r = invoke("report", work["calib"], "-o", tmp_path / "no" / "x.html")
    assert r.exit_code == 1 and "does not exist" in r.stderr
    r = invoke("report", work["calib"], "-o", work["calib"])
    assert r.exit_code == 1 and "input file" in r.stderr


def test_missing_matplotlib_is_one_clear_line(work, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "r.html"
    r = invoke("report", work["calib"], "-o", out)
    assert r.exit_code == 1 and r.stderr == "error: qtool report draws its plots with matplotlib, which is not installed; pip install 'qtool[report]'\n"
    assert not out.exists()


# ---------------------------------------------------------------- in a real browser

needs_browser = pytest.mark.skipif(screenshot_report.find_browser() is None, reason="no Chromium installed")


@needs_browser
def test_chromium_renders_every_plot_and_sorts(work, tmp_path):
    dom = screenshot_report.dump_dom(work["html"], sort="sqnr")
    page = Page()
    page.feed(dom)
    assert len(page.rows) == 21 and all(r["svgs"] == 1 for r in page.rows)
    ev = json.loads(work["eval"].read_text())
    worst_activation = next(t["tensor"] for t in ev["tensors"] if t["kind"] == "activation")
    assert worst_activation in page.rows[0]["text"]  # the page's script sorted worst first
    values = [float(r["data-sqnr"]) for r in page.rows if r["data-sqnr"]]
    assert values == sorted(values) and all(r["data-sqnr"] == "" for r in page.rows[len(values):])
    png = tmp_path / "report.png"
    screenshot_report.screenshot(work["html"], png, size="1300x900")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1300, 900)
