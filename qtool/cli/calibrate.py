"""`qtool calibrate`: images through the model, histograms, thresholds, calibration file."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import click

from .. import calibration, collect, data, model, thresholds
from ..errors import QtoolError
from ..exporters import tensorrt
from ..fileio import check_output_path, write_atomic
from ..histogram import is_power_of_two
from . import EPILOG, cli, emit, progress

log = logging.getLogger("qtool")


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(dir_okay=True, path_type=Path))
@click.option("--images", "images_dir", required=True, type=click.Path(path_type=Path), help="Folder of calibration images (JPEG/PNG/BMP, sorted by name, searched recursively).")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N images.")
@click.option("--size", help="HxW to resize to; needed only when the model's height/width are dynamic.")
@click.option("--resize", type=click.Choice(data.RESIZE_MODES), default="stretch", show_default=True, help="How images are fitted to HxW (letterbox pads with grey 114).")
@click.option("--scale", "scale_text", default="1/255", show_default=True, help="Pixel multiplier, a number or fraction.")
@click.option("--mean", help="Per-channel mean subtracted after scaling, e.g. 0.485,0.456,0.406.")
@click.option("--std", help="Per-channel std divided by after the mean, e.g. 0.229,0.224,0.225.")
@click.option("--bgr", is_flag=True, help="Feed channels in BGR order (OpenCV-trained models).")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), help="Input layout [default: inferred from the model input].")
@click.option("--batch-size", type=click.IntRange(min=1), help="Images per inference [default: the model's fixed batch, else 8].")
@click.option("--bins", type=int, default=2048, show_default=True, help="Histogram bins per tensor (a power of two).")
@click.option("--method", "method_text", default="entropy", show_default=True, help=f"Threshold method: {', '.join(thresholds.METHODS)}.")
@click.option("--kl-variant", type=click.Choice(thresholds.KL_VARIANTS), default="nvidia", show_default=True, help="Whose entropy search to reproduce.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Calibration file [default: <model stem>.calib.json here].")
@click.option("--trt-table", type=click.Path(path_type=Path), help="Also write a TensorRT INT8 calibration cache here.")
@click.option("--trt-version", default=tensorrt.DEFAULT_VERSION, show_default=True, help="TensorRT version the cache header names (must match the builder).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.pass_context
def calibrate(ctx, model_path, images_dir, limit, size, resize, scale_text, mean, std, bgr, layout, batch_size, bins, method_text, kl_variant, output, trt_table, trt_version, as_json):
    """Run MODEL on calibration images and write per-tensor INT8 ranges.

    Every float activation tensor is histogrammed (|x|, --bins bins) while the images stream
    through onnxruntime, and its clipping threshold is chosen by --method. The calibration file
    keeps the histograms, so thresholds can be recomputed without running the model again.
    """
    started = time.perf_counter()
    try:
        method = thresholds.parse_method(method_text)
    except ValueError as e:
        raise QtoolError(f"--method: {e}") from None
    if bins < 256 or not is_power_of_two(bins):
        raise QtoolError(f"--bins {bins} must be a power of two >= 256 (e.g. 2048), so histograms merge exactly")
    trt_number = tensorrt.version_number(trt_version) if trt_table else None
    output = output or Path(f"{model_path.stem}.calib.json")
    output = check_output_path(output, inputs=(model_path,))
    if trt_table:
        trt_table = check_output_path(trt_table, inputs=(model_path,))
        if trt_table.resolve() == output.resolve():
            raise QtoolError("--trt-table and -o name the same file; choose two paths")

    loaded = model.load_model(model_path)
    spec = model.image_input(loaded.proto)
    pre = data.resolve_preprocess(
        spec, size=data.parse_size(size), layout=layout, resize=resize,
        scale=data.parse_scale(scale_text), mean=mean, std=std, bgr=bgr,
    )
    fixed_batch = spec.dims[0]
    if fixed_batch is not None and batch_size not in (None, fixed_batch):
        raise QtoolError(f"the model has a fixed batch of {fixed_batch}; --batch-size {batch_size} cannot be used")
    batch_size = fixed_batch or batch_size or 8
    images = data.list_images(images_dir, limit)
    if fixed_batch and len(images) % fixed_batch:
        raise QtoolError(
            f"{len(images)} images do not fill batches of {batch_size} (the model's fixed batch); "
            f"use --limit {len(images) - len(images) % batch_size or batch_size}"
        )

    types = model.tensor_types(loaded.proto)
    names = model.activation_tensors(loaded.proto, types)
    session = collect.make_session(model.with_outputs(loaded.proto, names, types))
    log.debug("calibrating %d tensors with %d images in batches of %d", len(names), len(images), batch_size)
    with progress(len(images), not (ctx.obj["quiet"] or as_json)) as bar:
        hists = collect.collect(
            session, spec.name, names, data.batches(images, pre, batch_size), bins, bar,
            static=frozenset(names) - model.data_dependent(loaded.proto), probe_size=fixed_batch or 1,
        )

    records = [calibration.record_from_histogram(n, hists[n], method, kl_variant) for n in names]
    warnings = []
    nonfinite = [r.name for r in records if r.nonfinite]
    if nonfinite:
        warnings.append(f"{len(nonfinite)} tensor(s) had NaN/inf values (left out of the histograms): {', '.join(nonfinite[:5])}")
    zero = [r.name for r in records if r.amax == 0]
    if zero:
        warnings.append(f"{len(zero)} tensor(s) were all zero (amax 0): {', '.join(zero[:5])}")
    model_ref = os.path.relpath(loaded.path.resolve(), output.resolve().parent)
    cal = calibration.Calibration(
        model_path=Path(model_ref).as_posix(), model_sha256=loaded.sha256, method=method, num_bits=8,
        bins=bins, samples=len(images), preprocess={"input": spec.name, "source": "images", **pre.to_dict()},
        tensors=records, kl_variant=kl_variant,
    )
    if trt_table:
        cache = tensorrt.export(loaded, cal, trt_version=trt_version)
        warnings.extend(cache.warnings)
    calibration.save(cal, output)
    written = {"calibration": str(output)}
    if trt_table:
        write_atomic(trt_table, cache.data)
        written["tensorrt_cache"] = str(trt_table)
    for w in warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    summary = {
        "command": "calibrate", "model": str(model_path), "outputs": written, "tensors": len(records),
        "images": len(images), "batch_size": batch_size, "method": method, "seconds": round(seconds, 3),
        "warnings": warnings,
    }
    if trt_number is not None:
        summary["tensorrt_header"] = f"TRT-{trt_number}-EntropyCalibration2"
    text_out = f"calibrated {len(records)} tensors from {len(images)} images in {seconds:.1f} s ({method}) -> {output}"
    if trt_table:
        text_out += f"\nTensorRT cache TRT-{trt_number}-EntropyCalibration2 -> {trt_table}"
    emit(as_json, summary, text_out)


