"""`qtool calibrate`: inputs through the model, histograms, thresholds, calibration file."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import click

from .. import biascorrection, calibration, collect, data, histogram, model, thresholds
from ..errors import QtoolError
from ..exporters import tensorrt
from ..fileio import check_output_path, write_atomic
from . import EPILOG, cli, emit, progress

log = logging.getLogger("qtool")

# Auto batch size: as many images as keep one batch's exposed activations under this budget.
BATCH_BYTES = 64 << 20
MAX_AUTO_BATCH = 32
# Workers (each holds one batch's activations): as many as there are cores and this budget allows.
IN_FLIGHT_BYTES = 512 << 20
# Batches of this many activation bytes start loading the binning kernel before the first run.
KERNEL_EARLY_BYTES = 16 << 20


def _image_bytes(proto, names, spec: model.InputSpec, pre: data.Preprocess) -> int | None:
    """Bytes of the exposed activations of one image, when shape inference can tell."""
    hwc = (pre.channels, pre.height, pre.width) if pre.layout == "nchw" else (pre.height, pre.width, pre.channels)
    return model.activation_bytes(proto, names, {spec.name: (1, *hwc)}) or None


def _parallelism(batches: int, batch_bytes: int | None) -> tuple[int, int]:
    """(workers, onnxruntime threads per run): batches side by side first, cores left over
    go to each run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    room = IN_FLIGHT_BYTES // batch_bytes if batch_bytes else 4
    workers = max(1, min(cores, batches, room))
    return workers, max(1, cores // workers)


def _full_batches(runs, size: int, skipped: list):
    for feeds, count in runs:
        if count != size:
            raise QtoolError(
                f"after skipping {len(skipped)} unreadable image(s) the last batch has {count} of the model's fixed "
                f"batch of {size}; remove the unreadable images or use --on-bad-image fail to see them"
            )
        yield feeds, count


@dataclass
class _Source:
    """Where calibration inputs come from and how they are run."""

    inputs: list[Path]  # image or array files, after --limit and --shard
    runs: Iterable  # (feeds, samples) per inference
    preprocess: dict  # recorded in the calibration file
    batch_size: int | None = None  # None: one run per data file
    static: frozenset = frozenset()  # tensors counted once per `probe` samples
    probe: int = 1
    skipped: list | None = None  # unreadable images, with --on-bad-image skip
    batch_bytes: int | None = None  # exposed activations of one batch, when known


def _image_source(loaded, names, images_dir, limit, shard, on_bad_image, batch_size, options) -> _Source:
    spec = model.image_input(loaded.proto)
    pre = data.resolve_preprocess(spec, **options)
    fixed_batch = spec.dims[0]
    if fixed_batch is not None and batch_size not in (None, fixed_batch):
        raise QtoolError(f"the model has a fixed batch of {fixed_batch}; --batch-size {batch_size} cannot be used")
    per_image = _image_bytes(loaded.proto, names, spec, pre)
    auto = max(1, min(MAX_AUTO_BATCH, BATCH_BYTES // per_image)) if per_image else 1
    batch_size = fixed_batch or batch_size or auto
    everything = data.list_images(images_dir, limit)
    inputs = data.take_shard(everything, shard)
    if not inputs:
        raise QtoolError(f"shard {shard[0]}/{shard[1]} of {len(everything)} images is empty; use fewer shards")
    if fixed_batch and len(inputs) % fixed_batch:
        raise QtoolError(
            f"{len(inputs)} images do not fill batches of {fixed_batch} (the model's fixed batch); "
            f"use --limit {len(inputs) - len(inputs) % fixed_batch or fixed_batch}"
        )
    skipped: list | None = [] if on_bad_image == "skip" else None
    runs = data.image_runs(inputs, pre, spec.name, batch_size, skipped)
    if fixed_batch and skipped is not None:
        runs = _full_batches(runs, fixed_batch, skipped)
    # tensors computed from the input's shape only (decode grids) are counted per image
    static = frozenset(names) - model.data_dependent(loaded.proto)
    return _Source(inputs, runs, {"source": "images", "input": spec.name, **pre.to_dict()},
                   batch_size, static, fixed_batch or 1, skipped, per_image and per_image * batch_size)


def _data_source(loaded, data_dir, limit, shard) -> _Source:
    specs = model.data_inputs(loaded.proto)
    if not specs:
        raise QtoolError("the model has no inputs to feed; nothing to calibrate")
    everything = data.list_arrays(data_dir, limit)
    inputs = data.take_shard(everything, shard)
    if not inputs:
        raise QtoolError(f"shard {shard[0]}/{shard[1]} of {len(everything)} data files is empty; use fewer shards")
    return _Source(inputs, data.array_runs(inputs, specs), {"source": "data", "inputs": [s.name for s in specs]})


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="MODEL", type=click.Path(path_type=Path))
@click.option("--images", "images_dir", type=click.Path(path_type=Path), help="Folder of calibration images (JPEG/PNG/BMP, sorted by name, searched recursively).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), help="Folder of .npy (single-input models) or .npz (keys = input names) files, one run each.")
@click.option("--limit", type=click.IntRange(min=1), help="Use only the first N images or data files.")
@click.option("--on-bad-image", type=click.Choice(["fail", "skip"]), default="fail", show_default=True, help="An unreadable image stops the run, or is skipped with a warning.")
@click.option("--shard", help="K/N: calibrate only every N-th input starting with the K-th; combine shards with qtool merge.")
@click.option("--size", help="HxW to resize to; needed only when the model's height/width are dynamic.")
@click.option("--resize", type=click.Choice(data.RESIZE_MODES), default="stretch", show_default=True, help="How images are fitted to HxW (letterbox pads with grey 114).")
@click.option("--scale", "scale_text", default="1/255", show_default=True, help="Pixel multiplier, a number or fraction.")
@click.option("--mean", help="Per-channel mean subtracted after scaling, e.g. 0.485,0.456,0.406.")
@click.option("--std", help="Per-channel std divided by after the mean, e.g. 0.229,0.224,0.225.")
@click.option("--bgr", is_flag=True, help="Feed channels in BGR order (OpenCV-trained models).")
@click.option("--layout", type=click.Choice(["nchw", "nhwc"]), help="Input layout [default: inferred from the model input].")
@click.option("--batch-size", type=click.IntRange(min=1), help="Images per inference [default: the model's fixed batch, else as many as fit 64 MB of activations]; results do not depend on it.")
@click.option("--bins", type=int, default=2048, show_default=True, help="Histogram bins per tensor (a power of two).")
@click.option("--method", "method_text", default="entropy", show_default=True, help=f"Threshold method: {', '.join(thresholds.METHODS + thresholds.SAMPLE_METHODS)}.")
@click.option("--kl-variant", type=click.Choice(thresholds.KL_VARIANTS), default="nvidia", show_default=True, help="Whose entropy search to reproduce.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Calibration file [default: <model stem>.calib.json here].")
@click.option("--trt-table", type=click.Path(path_type=Path), help="Also write a TensorRT INT8 calibration cache here.")
@click.option("--trt-version", default=tensorrt.CACHE_VERSION, show_default=True, help="TensorRT version the cache header names (must match the builder; 7.x to 10.x: TensorRT 11 has no calibration cache).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.pass_context
def calibrate(ctx, model_path, images_dir, data_dir, limit, on_bad_image, shard, size, resize, scale_text, mean, std, bgr, layout,
              batch_size, bins, method_text, kl_variant, output, trt_table, trt_version, as_json):
    """Run MODEL on calibration inputs and write per-tensor INT8 ranges.

    Inputs are images (--images, single-input image models) or arrays (--data, any model).
    Every float activation tensor is histogrammed (|x|, --bins bins) while the inputs stream
    through onnxruntime, and its clipping threshold is chosen by --method. The calibration file
    keeps the histograms, so thresholds can be recomputed without running the model again.
    """
    started = time.perf_counter()
    if (images_dir is None) == (data_dir is None):
        raise QtoolError("give exactly one of --images DIR or --data DIR")
    try:
        method = thresholds.parse_method(method_text)
    except ValueError as e:
        raise QtoolError(f"--method: {e}") from None
    if bins < 256 or not histogram.is_power_of_two(bins):
        raise QtoolError(f"--bins {bins} must be a power of two >= 256 (e.g. 2048), so histograms merge exactly")
    shard_kn = data.parse_shard(shard)
    trt_number = tensorrt.version_number(trt_version) if trt_table else None
    output = output or Path(f"{model_path.stem}.calib.json")
    output = check_output_path(output, inputs=(model_path,))
    if trt_table:
        trt_table = check_output_path(trt_table, inputs=(model_path,))
        if trt_table.resolve() == output.resolve():
            raise QtoolError("--trt-table and -o name the same file; choose two paths")

    loaded = model.load_model(model_path, external_data=False)
    types = model.tensor_types(loaded.proto)
    names = model.activation_tensors(loaded.proto, types)
    if images_dir is not None:
        source = _image_source(loaded, names, images_dir, limit, shard_kn, on_bad_image, batch_size, dict(
            size=data.parse_size(size), layout=layout, resize=resize, scale=data.parse_scale(scale_text),
            mean=mean, std=std, bgr=bgr))
    else:
        source = _data_source(loaded, data_dir, limit, shard_kn)
    inputs, batch_size, skipped = source.inputs, source.batch_size, source.skipped

    # per-sample min, max |x| and per-channel means of layer inputs: for mean-minmax and bias correction
    stats = biascorrection.new_stats(loaded.proto, names)
    # a Concat's output (a Split's input) holds exactly its parts' values, an Add/Sub/Mul output is
    # one exact float32 operation on its inputs: such tensors are computed from fetched ones
    derived = collect.derivations(loaded.proto, names, types, source.static, stats)
    fetched = [n for n in names if n not in derived]

    if source.batch_bytes and source.batch_bytes >= KERNEL_EARLY_BYTES:
        histogram.start_loading()  # surely needed: loads while the session is built and the first batch runs
    workers, threads = _parallelism(-(-len(inputs) // (batch_size or 1)), source.batch_bytes)
    session, blocked = collect.fetching_session(
        model.with_outputs(loaded.proto, fetched, types), fetched, keep=source.static,
        external_folder=loaded.path.parent if loaded.external_files else None,
        threads=threads,
    )
    log.debug("calibrating %d tensors (%d computed from others, %d fetched in blocked layout) with %d inputs "
              "(batch %s, %d workers of %d threads)",
              len(names), len(derived), len(blocked), len(inputs), batch_size or "per file", workers, threads)
    with progress(len(inputs), not (ctx.obj["quiet"] or as_json)) as bar:
        hists, samples = collect.collect(session, names, source.runs, bins, bar, static=source.static, probe_size=source.probe,
                                         workers=workers, stats=stats, derived=derived, blocked=blocked)
    if samples == 0:
        raise QtoolError(f"none of the {len(inputs)} images could be read; nothing was calibrated")

    records = [calibration.record_from_histogram(n, hists[n], method, kl_variant, stats=stats[n]) for n in names]
    warnings = []
    if skipped:
        warnings.append(f"skipped {len(skipped)} unreadable image(s): " + "; ".join(reason for _, reason in skipped[:3]))
    nonfinite = [r for r in records if r.nonfinite]
    if nonfinite:
        warnings.append(
            f"{len(nonfinite)} tensor(s) had NaN/inf values, left out of the histograms: "
            + ", ".join(f"{r.name} ({r.nonfinite})" for r in nonfinite[:5])
        )
    zero = [r.name for r in records if r.amax == 0]
    if zero:
        warnings.append(f"{len(zero)} tensor(s) were all zero (amax 0): {', '.join(zero[:5])}")
    model_ref = os.path.relpath(loaded.path.resolve(), output.resolve().parent)
    cal = calibration.Calibration(
        model_path=Path(model_ref).as_posix(), model_sha256=loaded.sha256, method=method, num_bits=8,
        bins=bins, samples=samples, preprocess=source.preprocess, tensors=records, kl_variant=kl_variant,
        shard=shard_kn,
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
    what = "images" if images_dir is not None else "data files"
    summary = {
        "command": "calibrate", "model": str(model_path), "outputs": written, "tensors": len(records),
        "inputs": len(inputs), "samples": samples, "batch_size": batch_size, "method": method,
        "seconds": round(seconds, 3), "warnings": warnings,
    }
    if images_dir is not None:
        summary["images"] = len(inputs)
    if trt_number is not None:
        summary["tensorrt_header"] = f"TRT-{trt_number}-EntropyCalibration2"
    text_out = f"calibrated {len(records)} tensors from {len(inputs)} {what} in {seconds:.1f} s ({method}) -> {output}"
    if trt_table:
        text_out += f"\nTensorRT cache TRT-{trt_number}-EntropyCalibration2 -> {trt_table}"
    emit(as_json, summary, text_out)
