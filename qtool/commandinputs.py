"""What the commands read besides their options: the calibration file (given or found), the model
it was made for (checked by SHA-256), and held-out inputs preprocessed as the file records."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from . import calibration, model
from .errors import Opt, QtoolError, opts
from .feeds import data
from .options import DEFAULT_BATCH, ImageOptions


def find_calibration(calib: Path | None) -> Path:
    """--calib, or the single *.calib.json in the current directory."""
    if calib is not None:
        return calib
    found = sorted(Path(".").glob("*.calib.json"))
    if len(found) == 1:
        return found[0]
    if not found:
        raise QtoolError("no *.calib.json in the current directory; run qtool calibrate first or pass {calib}",
                         calib=Opt("calib", metavar="FILE"))
    raise QtoolError("several calibration files here ({found}); choose one with {calib}", found=", ".join(p.name for p in found),
                     calib=Opt("calib", metavar="FILE"))


def model_json(path) -> str:
    """The `model` of every command's --json: an absolute path (normalised, symlinks kept), because a
    calibration file records its model relative to itself, not to where a pipeline step runs."""
    return os.path.abspath(path)


def shown_path(path) -> str:
    """A path for a printed command line: relative to here when below it, else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full)
    return full if rel.startswith("..") else rel


def load_checked_model(model_path: Path | None, calib_path: Path, cal: calibration.Calibration) -> model.LoadedModel:
    """The model the calibration was made for: MODEL, or the path the file records; same SHA-256."""
    path = model_path if model_path is not None else calib_path.parent / cal.model_path
    if model_path is None and not path.exists():
        raise QtoolError(f"the calibrated model {str(path)!r} (recorded in {str(calib_path)!r}) is missing; pass MODEL")
    loaded = model.load_float_model(path)
    check_model(loaded, calib_path, cal.model_path, cal.model_sha256)
    return loaded


def check_model(loaded: model.LoadedModel, calib: Path | str | None, recorded: str, sha256: str, shown: str | None = None) -> None:
    """A one-line error unless `loaded` is the model the calibration `calib` (its file; None: one in
    memory) records: the model at `recorded` (relative to the file's folder) with this SHA-256. The
    one model check of every command and of the Python API; it names both files and both models.
    `shown`: how to name `loaded` (default: its path)."""
    path = loaded.path
    what = "the calibration" if calib is None else repr(str(calib))
    if loaded.sha256 != sha256 and loaded.onnx_sha256 == sha256:
        raise QtoolError(
            f"{what} was made by an older qtool whose SHA-256 covered {str(path)!r} but not its external data "
            f"({', '.join(model.external_locations(_header(path)))}), so its weights cannot be checked; calibrate again"
        )
    if loaded.sha256 == sha256:
        return
    where = Path(recorded) if calib is None else Path(calib).parent / recorded
    given = shown or repr(str(path))
    if shown is None and os.path.exists(where) and os.path.samefile(where, path):
        raise QtoolError(f"{given} has changed since {what} was made for it (SHA-256 {sha256[:12]} then, {loaded.sha256[:12]} now); "
                         "calibrate it again")
    raise QtoolError(f"{what} records {shown_path(where)!r} (SHA-256 {sha256[:12]}), not {given} (SHA-256 {loaded.sha256[:12]}): "
                     "give the model it records, or calibrate this one")


def _header(path: Path):
    return onnx.load(str(path), load_external_data=False)


def _channels_text(values) -> str:
    return ",".join(repr(float(v)) for v in values)


def image_preprocess(spec: model.InputSpec, recorded: dict, image: ImageOptions) -> data.Preprocess:
    """The calibration file's image preprocessing, with each part `image` gives overriding its own."""
    size, resize, scale, mean, std, bgr, layout = image.size, image.resize, image.scale, image.mean, image.std, image.bgr, image.layout
    rec = recorded if recorded.get("source") == "images" else {}
    if rec and rec.get("input") not in (None, spec.name):
        rec = {}
    try:
        rec_size = (int(rec["height"]), int(rec["width"])) if "height" in rec else None
        rec_scale = float(rec["scale"]) if "scale" in rec else None
        rec_mean = _channels_text(rec["mean"]) if "mean" in rec else None
        rec_std = _channels_text(rec["std"]) if "std" in rec else None
    except (TypeError, ValueError, KeyError):
        raise QtoolError("the calibration file's recorded image preprocessing is damaged; give {size}/{scale}/{mean}/{std}",
                         **opts("size", "scale", "mean", "std")) from None
    new_layout = layout or rec.get("layout") or data.infer_layout(spec.dims)
    if new_layout not in ("nchw", "nhwc"):
        raise QtoolError("the calibration file records an unknown layout {layout!r}; give {given}", layout=new_layout, given=Opt("layout"))
    hw = spec.dims[2:4] if new_layout == "nchw" else spec.dims[1:3]
    new_size = size if size is not None else (rec_size if None in hw else None)
    new_resize = resize or rec.get("resize", "stretch")
    if new_resize not in data.RESIZE_MODES:
        raise QtoolError("the calibration file records an unknown resize mode {resize!r}; give {given}", resize=new_resize,
                         given=Opt("resize"))
    new_scale = scale if scale is not None else (rec_scale if rec_scale is not None else 1 / 255)
    return data.resolve_preprocess(
        spec, size=new_size, layout=new_layout, resize=new_resize, scale=new_scale,
        mean=mean if mean is not None else rec_mean, std=std if std is not None else rec_std,
        bgr=bool(rec.get("bgr", False)) if bgr is None else bgr,
    )


def held_out_runs(loaded, cal, images_dir, data_dir, limit, batch_size=None, image: ImageOptions | None = None):
    """(input files, a function giving fresh runs over them): images preprocessed as the
    calibration file records, each part `image` gives overriding its own; or .npy/.npz data."""
    if images_dir is not None:
        spec = model.image_input(loaded.proto)
        pre = image_preprocess(spec, cal.preprocess, image or ImageOptions())
        fixed = spec.dims[0]
        if fixed is not None and batch_size not in (None, fixed):
            raise QtoolError("the model has a fixed batch of {fixed}; {given} cannot be used", fixed=fixed,
                             given=Opt("batch_size", batch_size))
        batch = fixed or batch_size or DEFAULT_BATCH
        inputs = data.list_images(images_dir, limit)
        if fixed and len(inputs) % fixed:
            raise QtoolError("{count} images do not fill batches of {fixed} (the model's fixed batch); use {limit}", count=len(inputs),
                             fixed=fixed, limit=Opt("limit", len(inputs) - len(inputs) % fixed or fixed))

        def runs():
            return data.image_runs(inputs, pre, spec.name, batch)
    else:
        specs = model.data_inputs(loaded.proto)
        if not specs:
            raise QtoolError("the model has no inputs to feed; nothing to evaluate")
        inputs = data.list_arrays(data_dir, limit, specs)

        def runs():
            return data.array_runs(inputs, specs)

    return inputs, runs
