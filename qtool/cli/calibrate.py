"""`qtool calibrate`: inputs through the model, histograms, thresholds, calibration file."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import click

from .. import calibration, data, model, pipeline, thresholds
from ..errors import QtoolError
from ..fileio import Outputs, folder_input, model_input
from ..inputs import model_json, shown_path
from ..targets import tensorrt
from ..targets.tensorrt import files as trtfiles
from . import EPILOG, cli, emit, progress

log = logging.getLogger("qtool")

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
@click.option("--method", "method_text", help=f"Threshold method: {', '.join(thresholds.METHODS + thresholds.SAMPLE_METHODS)} [default: entropy, with each export choosing its target's best method from the histograms; a method given here is kept by every export].")
@click.option("--kl-variant", type=click.Choice(thresholds.KL_VARIANTS), default="nvidia", show_default=True, help="Whose entropy search to reproduce.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Calibration file [default: <model stem>.calib.json here].")
@click.option("--trt-table", type=click.Path(path_type=Path), help="Also write a TensorRT INT8 calibration cache here.")
@click.option("--trt-version", default=tensorrt.CACHE_VERSION, show_default=True, help="TensorRT version the cache header names (must match the builder): 7.x to 10.x (TensorRT 11 has no calibration cache), as 8.6.1, 7.2.3, 8.6 (its GA release, 8.6.1), 10 or 10.x (the newest 10.x qtool knows).")
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
    if bins > calibration.MAX_BINS:
        raise QtoolError(f"--bins {bins} is too many: the maximum is {calibration.MAX_BINS} (default 2048)")
    shard_kn = data.parse_shard(shard)
    trt_number = None
    if trt_table:
        trt_version = trtfiles.canonical_version(trt_version)
        trt_number = trtfiles.version_number(trt_version)
    output = output or Path(f"{model_path.stem}.calib.json")
    outs = Outputs(inputs=(model_input(model_path), folder_input(images_dir, "a --images file"),
                           folder_input(data_dir, "a --data file")))
    output = outs.add(output, "-o")
    if trt_table:
        trt_table = outs.add(trt_table, "--trt-table")
    image_options = None
    if images_dir is not None:
        image_options = dict(size=data.parse_size(size), layout=layout, resize=resize, scale=data.parse_scale(scale_text),
                             mean=mean, std=std, bgr=bgr)
    loaded = model.load_model(model_path, external_data=False)
    if image_options is not None and image_options["size"] is not None:
        _check_size(loaded, image_options["size"])
    with progress(0, not (ctx.obj["quiet"] or as_json)) as bar, _size_hint(image_options):
        cal, report = pipeline.run(loaded, images=images_dir, data_dir=data_dir, limit=limit, shard=shard_kn,
                                   on_bad_image=on_bad_image, batch_size=batch_size, image_options=image_options, bins=bins,
                                   method=method_text or "entropy", kl_variant=kl_variant, progress=bar)
    cal.pinned = method_text is not None
    cal = calibration.relocate(cal, output)
    warnings = list(report.warnings)
    if trt_table:
        cache = tensorrt.export(loaded, cal, trt_version=trt_version, fmt="cache")
        warnings.extend(cache.warnings)
    written = {"calibration": str(output)}
    with outs:  # both files, or neither
        outs.write(output, calibration.to_json(calibration.relocate(cal, output)).encode())
        if trt_table:
            outs.write(trt_table, cache.data)
            written["tensorrt_cache"] = str(trt_table)
        outs.commit()
    for w in warnings:
        log.warning(w)
    seconds = time.perf_counter() - started
    what = "images" if images_dir is not None else "data files"
    summary = {
        "command": "calibrate", "model": model_json(model_path), "outputs": written, "tensors": len(cal.tensors),
        "inputs": report.inputs, "samples": report.samples, "skipped": len(report.skipped), "batch_size": report.batch_size, "method": cal.method,
        "seconds": round(seconds, 3), "warnings": warnings,
    }
    used = report.inputs - len(report.skipped)  # the images or files the file's samples come from
    if images_dir is not None:
        summary["images"] = used
    if trt_number is not None:
        summary["tensorrt_header"] = f"TRT-{trt_number}-EntropyCalibration2"
        summary["build"], notes = tensorrt.build_command(loaded, cal, "cache", trt_version, str(trt_table), shown_path(model_path))
        for note in notes:
            log.warning(note)
        summary["warnings"] = warnings + notes
    counted = f"{used} {what}" + (f" ({report.samples} samples)" if images_dir is None and report.samples != used else "")
    if report.skipped:
        counted += f", {len(report.skipped)} unreadable skipped"
    text_out = f"calibrated {len(cal.tensors)} tensors from {counted} in {seconds:.1f} s ({cal.method}) -> {output}"
    if trt_table:
        text_out += f"\nTensorRT {trt_version} cache TRT-{trt_number}-EntropyCalibration2 -> {trt_table}\nbuild it with: {summary['build']}"
    emit(as_json, summary, text_out)


def _check_size(loaded, size: tuple[int, int]) -> None:
    """A usage error before any work for a --size the model cannot run at (its strides tell)."""
    problem = data.size_problem(loaded.proto, model.image_input(loaded.proto).name, size)
    if problem:
        raise click.UsageError(problem)


@contextlib.contextmanager
def _size_hint(image_options):
    """onnxruntime's failure where feature maps of a --size the strides do not divide meet (when
    the graph did not tell the strides up front), with what to do about it."""
    try:
        yield
    except QtoolError as e:
        text = str(e)
        if image_options and image_options["size"] and "onnxruntime failed" in text and "dimension" in text:
            raise QtoolError(text + data.SIZE_MISMATCH_HINT) from None
        raise
