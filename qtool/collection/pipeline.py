"""Calibration as a library function: inputs (image folder, .npy/.npz folder or an in-memory
loader) through the model, histograms, thresholds -> a Calibration. `qtool calibrate` and
qtool.calibrate() both run `run`, so they give byte-identical files for the same inputs."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import TensorProto

from .. import calibration, model
from ..errors import Opt, QtoolError
from ..feeds import data
from ..model import branches, dynamic, lazy, shapes
from ..model.graph import Index
from ..model.spill import runnable
from ..options import CalibrateOptions
from ..quantizers import patterns, smoothquant
from ..runtime import nchwc
from ..statistics import histogram, thresholds
from ..statistics.stats import linear_inputs, new_stats
from . import collect, procs, segments

log = logging.getLogger("qtool")

# Auto batch size: as many images as keep one batch's exposed activations under this budget.
BATCH_BYTES = 64 << 20
MAX_AUTO_BATCH = 32
# Workers (each holds one batch's activations): as many as there are cores and this budget allows.
IN_FLIGHT_BYTES = 512 << 20
# Calibrations that bin this many activation bytes in all (or an unknown amount) use the compiled
# binning kernel (histogram.start_loading: ~0.4 s of one core and 100-125 MB of RSS while it
# loads, numba's compiler and llvmlite's code included, ~40 MB once loaded and LLVM's pages let go,
# then 3-4x numpy's speed, bench/binning.py). Below it the kernel's RSS is much of what calibrate
# adds to a small model's plain inference, and numpy costs little time: zoo models binning 0.6-1.8
# GB over 64 inputs took 0.87-1.14x the kernel's CPU time with numpy, at ~100 MB less peak RSS
# (measured before LLVM's pages were let go); 2.1-2.7 GB 1.06-1.66x (convolutions, whose
# inference is cheap for the bytes it makes, the most), 3.3-8.5 GB 1.4-1.9x (docs/benchmarks.md,
# calibration speed). With data files whose activations cannot be sized before running, the
# first run's fetched bytes times the files decide.
KERNEL_BYTES = 2 << 30
# ... and only where its memory keeps calibrate within twice plain inference's peak RSS (issue 49).
# Loading it (numba's import and its load of the cached kernel) adds ~90 MB to the process's RSS
# while it loads (LLVM's code pages, let go once loaded) and holds ~40 MB after (numba's objects,
# LLVM's heap), measured on this machine; the zoo's small models (ppocr_cls, madmom_key_cnn,
# madmom_beats_tcn, nudenet_320n: 72-100 MB plain) binned 2-9 GB and loaded it, to 2.1-2.9x
# their plain run's peak (docs/benchmarks.md #mem17). The decision waits for the first run: then
# the process's RSS with one run's activations is known, and plain inference's peak is estimated
# from below (PLAIN_FLOOR, the model's file and the most the first run's fetched tensors hold at
# once in graph order: onnxruntime's arena holds at least that); where the kernel would not fit
# under twice that, numpy bins (the same counts: histogram.add_bins).
KERNEL_LOAD_RSS = 96 << 20
KERNEL_HELD_RSS = 44 << 20
# Plain inference's process before its model: the interpreter, numpy and onnxruntime with a session
# (62-72 MB measured on this machine for zoo models of a few MB: oww_embedding 68, ppocr_cls 72).
PLAIN_FLOOR = 60 << 20
# Calibrations that bin this many bytes, one image per run, run side by side in processes
# instead of threads (procs: each process has its own GIL) when the cores allow more than one
# worker: a helper's start (~1 s of one core: imports, session, kernel) pays from there on.
HELPER_BYTES = 512 << 20
# Runs whose fetched activations would pass RUN_BYTES (for the first run's input shapes) run as a
# chain of sessions (segments), each segment's activations about twice the largest tensor's bytes
# (at least SEGMENT_BYTES), histogrammed and dropped before the next segment runs: a run then holds
# one segment's activations and what later segments read, not all of them at once, about what plain
# inference's working set holds (CRAFT at 640x640 fetches 1.16 GB per run, 100 MB at most in one tensor).
RUN_BYTES = 64 << 20
SEGMENT_BYTES = 16 << 20
# ... and so do runs of fewer bytes that would take calibrate past twice plain inference's peak RSS
# (issue 49): calibrate holds CALIBRATE_FLOOR and the model's file before its runs (its imports,
# onnx and qtool beside plain inference's numpy and onnxruntime, ~74 MB; its sessions and
# onnxruntime's code pages: ppocr_cls, a 0.6 MB model, 94-100 MB measured before its first run),
# then a run's fetched bytes, which onnxruntime's arena keeps from run to run; plain inference's
# peak is estimated from below (_plain_bytes). ppocr_cls (51 MB a run of 6 crops, 72 MB plain):
# 166 MB unsplit, 139 MB in segments (docs/benchmarks.md #mem18).
CALIBRATE_FLOOR = 96 << 20
# Runs side by side each hold the activations they fetch (onnxruntime's arena keeps them until they
# are histogrammed): every run in flight beyond the first adds one run's fetched bytes. Plain
# inference's process holds the interpreter, numpy and onnxruntime (~47 MB), the model's weights
# and its working activations; calibrate's imports hold ~25 MB more (onnx, qtool). Runs go side by
# side only while each further run's fetched bytes fit in the model file's bytes plus RUN_ROOM,
# what twice that floor leaves beside calibrate's larger imports: a small model whose every
# activation a run fetches (tens of MB for a few MB of weights) runs one run at a time, on all
# the cores (dfn3_enc: 63 MB a run, 2 MB of weights; two workers took calibrate to 3.2x plain
# inference's peak RSS, one 2.1x; docs/benchmarks.md, calibration speed, session 14).
RUN_ROOM = 16 << 20
# Each helper holds its own interpreter, onnxruntime and kernel (~300 MB): beyond this many, the
# workers for the other cores are threads of this process, as before.
MAX_HELPERS = 3


def image_bytes(proto, names, spec: model.InputSpec, pre: data.Preprocess) -> dict[str, int]:
    """Bytes of the activations of one image, those whose shape inference can tell."""
    hwc = (pre.channels, pre.height, pre.width) if pre.layout == "nchw" else (pre.height, pre.width, pre.channels)
    return model.tensor_bytes(proto, names, {spec.name: (1, *hwc)})


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _parallelism(batches: int, batch_bytes: int | None) -> tuple[int, int]:
    """(workers, onnxruntime threads per run): batches side by side first, cores left over
    go to each run."""
    cores = _cores()
    room = IN_FLIGHT_BYTES // batch_bytes if batch_bytes else 4
    workers = max(1, min(cores, batches, room))
    return workers, max(1, cores // workers)


def _beside(workers: int, threads: int, per_run: int | None, model_bytes: int, segmented: bool = False) -> tuple[int, int]:
    """(workers, threads) with no more runs side by side than RUN_ROOM allows for runs fetching
    `per_run` bytes each (None: not known before running) of a model of `model_bytes` on disk;
    the cores a worker less leaves go to each run. A run over RUN_BYTES goes in segments and
    holds one segment at a time: unchanged until its segments are known, then `segmented`, with
    `per_run` the most one segment holds (segments.held)."""
    if not per_run or (per_run > RUN_BYTES and not segmented):
        return workers, threads
    most = 1 + (model_bytes + RUN_ROOM) // per_run
    if workers <= most:
        return workers, threads
    return most, max(1, _cores() // most)


def _file_bytes(loaded: model.LoadedModel) -> int:
    """The bytes of the model's file and of the external data files it refers to: what plain
    inference reads of it."""
    folder = loaded.path.parent
    return sum((folder / f).stat().st_size for f in [loaded.path.name, *loaded.external_files] if (folder / f).is_file())


def _session_bytes(loaded: model.LoadedModel) -> int:
    """The bytes of the model calibrate's sessions hold: the model's file (_file_bytes), or for a model onnxruntime
    quantized dynamically, read as the float model it was made from (model.as_float: `given`), that model's weights,
    float32 where plain inference holds int8 (ddddocr's OCR model: 52 MB against its 13 MB file; 2 workers of 11 MB
    runs went side by side in the room twice plain inference left beside the file, to 2.5x its peak RSS)."""
    file_bytes = _file_bytes(loaded)
    if loaded.given is None:
        return file_bytes
    weights = sum(lazy.nbytes(t) for t in loaded.proto.graph.initializer if t.data_type != TensorProto.STRING)
    return max(file_bytes, weights)


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
    images: data.ImageRuns | None = None  # the runs by index, when each is one image (helpers can take them)
    least_bytes: int = 0  # exposed activations of one batch that shape inference can tell
    dims: dict | None = None  # the first run's input shapes, when known before running
    first: dict | None = None  # the first run's feeds, when read before running (segments.sizes), until sized


def _image_source(loaded, names, options: CalibrateOptions, preprocess: dict) -> _Source:
    images_dir, limit, shard, on_bad_image, batch_size = options.images, options.limit, options.shard, options.on_bad_image, options.batch_size
    spec = model.image_input(loaded.proto)
    pre = data.resolve_preprocess(spec, **preprocess)
    fixed_batch = spec.dims[0]
    if fixed_batch is not None and batch_size not in (None, fixed_batch):
        raise QtoolError("the model has a fixed batch of {fixed}; {given} cannot be used", fixed=fixed_batch,
                         given=Opt("batch_size", batch_size))
    sizes = image_bytes(loaded.proto, names, spec, pre)
    per_image = (sum(sizes.values()) or None) if len(sizes) == len(names) else None
    auto = max(1, min(MAX_AUTO_BATCH, BATCH_BYTES // per_image)) if per_image else 1
    batch_size = fixed_batch or batch_size or auto
    everything = data.list_images(images_dir, limit)
    inputs = data.take_shard(everything, shard)
    if not inputs:
        raise QtoolError(f"shard {shard[0]}/{shard[1]} of {len(everything)} images is empty; use fewer shards")
    if fixed_batch and len(inputs) % fixed_batch:
        raise QtoolError("{count} images do not fill batches of {fixed} (the model's fixed batch); use {limit}", count=len(inputs),
                         fixed=fixed_batch, limit=Opt("limit", len(inputs) - len(inputs) % fixed_batch or fixed_batch))
    skipped: list | None = [] if on_bad_image == "skip" else None
    runs = data.image_runs(inputs, pre, spec.name, batch_size, skipped)
    if fixed_batch and skipped is not None:
        runs = _full_batches(runs, fixed_batch, skipped)
    # tensors computed from the input's shape only (decode grids) are counted per image
    static = frozenset(names) - model.data_dependent(loaded.proto)
    images = data.ImageRuns(inputs, pre, spec.name) if batch_size == 1 else None
    hwc = (pre.channels, pre.height, pre.width) if pre.layout == "nchw" else (pre.height, pre.width, pre.channels)
    return _Source(inputs, runs, {"source": "images", "input": spec.name, **pre.to_dict()},
                   batch_size, static, fixed_batch or 1, skipped, per_image and per_image * batch_size, images,
                   sum(sizes.values()) * batch_size, {spec.name: (batch_size, *hwc)})


def _data_source(loaded, data_dir, limit, shard) -> _Source:
    specs = model.data_inputs(loaded.proto)
    if not specs:
        raise QtoolError("the model has no inputs to feed; nothing to calibrate")
    everything = data.list_arrays(data_dir, limit, specs)
    inputs = data.take_shard(everything, shard)
    if not inputs:
        raise QtoolError(f"shard {shard[0]}/{shard[1]} of {len(everything)} data files is empty; use fewer shards")
    # the largest run's shapes (segments, workers): files of other sizes (text lines of other widths) run on the plan
    # sized for it; a bad file is reported where it is run, after the model's own errors
    largest = inputs[_largest_file(inputs, {s.name for s in specs})]
    try:
        first = largest.feeds() if isinstance(largest, data.Samples) else data.load_arrays(largest, specs)
        dims = {name: value.shape for name, value in first[0].items()}
    except QtoolError:
        first, dims = None, None
    return _Source(inputs, data.array_runs(inputs, specs), {"source": "data", "inputs": [s.name for s in specs]}, dims=dims,
                   first=first[0] if first else None)




def _largest_file(inputs: list, names: set[str]) -> int:
    """The position in `inputs` (data.list_arrays') of the .npy/.npz file whose arrays for the inputs `names` hold the
    most values, read from the arrays' headers alone (0 for samples of one file, or where a header cannot be read:
    that file is reported where it is run). A plan sized for the first file held runs up to 7.8x its size beside it
    (trueocr_rec's text lines: 17 x 88 pixels wide in the first file, 15 x 776 in the last; 2.6x plain inference's
    peak RSS)."""
    if not inputs or isinstance(inputs[0], data.Samples):
        return 0
    sizes = [_array_values(path, names) for path in inputs]
    return max(range(len(inputs)), key=lambda k: (sizes[k], -k))


def _array_values(path: Path, names: set[str]) -> int:
    """The values a .npy file's array, or a .npz file's arrays named in `names` (all of them when none is), hold,
    from their headers (numpy's .npy format: magic, then the header); 0 when one cannot be read."""
    try:
        if path.suffix.lower() == ".npy":
            with open(path, "rb") as f:
                return _header_values(f)
        with zipfile.ZipFile(path) as z:
            members = [m for m in z.namelist() if m.endswith(".npy")]
            wanted = [m for m in members if m[:-4] in names] or members
            total = 0
            for m in wanted:
                with z.open(m) as f:
                    total += _header_values(f)
            return total
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        return 0


def _header_values(f) -> int:
    version = np.lib.format.read_magic(f)
    shape = (np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0)(f)[0]
    return int(np.prod(shape, dtype=np.int64))


def _memory_source(loaded, loader, limit, shard) -> _Source:
    """An in-memory loader: any iterable of {input name: ndarray} (batch axis first), one run each."""
    specs = model.data_inputs(loaded.proto)
    if not specs:
        raise QtoolError("the model has no inputs to feed; nothing to calibrate")
    if isinstance(loader, (str, bytes, dict)) or not isinstance(loader, Iterable):
        raise QtoolError("data= takes an iterable of {input name: array} dicts (or arrays for a single-input model), e.g. a list or a generator")
    items = iter(loader)
    if limit is not None or shard is not None:
        items = itertools.islice(items, limit)
        if shard is not None:
            items = itertools.islice(items, shard[0] - 1, None, shard[1])
    return _Source([], _Counted(data.memory_runs(items, specs)), {"source": "data", "inputs": [s.name for s in specs]})


class _Counted:
    """An iterator that counts what it gave (the items of an in-memory loader)."""

    def __init__(self, items):
        self.items, self.count = iter(items), 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.items)
        self.count += 1
        return item


@dataclass
class Report:
    """What a calibration run saw, beside the Calibration it made."""

    inputs: int  # image or data files (items of an in-memory loader)
    samples: int
    batch_size: int | None
    warnings: list[str] = field(default_factory=list)
    skipped: list = field(default_factory=list)  # unreadable images skipped, (path, reason)


def _source(loaded, names, options: CalibrateOptions) -> _Source:
    if options.images is not None:
        image = options.image
        preprocess = dict(size=image.size, layout=image.layout, resize=image.resize, scale=image.scale, mean=image.mean, std=image.std,
                          bgr=image.bgr)
        return _image_source(loaded, names, options, preprocess)
    if options.loader is None:
        return _data_source(loaded, options.data_dir, options.limit, options.shard)
    return _memory_source(loaded, options.loader, options.limit, options.shard)


def run(loaded: model.LoadedModel, options: CalibrateOptions, progress=None) -> tuple[calibration.Calibration, Report]:
    """Calibrate `loaded` on the one source of inputs `options` gives: an image folder (preprocessed
    as options.image says, data.resolve_preprocess), a folder of .npy/.npz files, or an in-memory
    loader; with its method (default: entropy). progress: an object with update(n) (a tqdm bar), or
    None. The Calibration's model_path is the model's absolute path (calibration.relocate makes it
    relative to where the file is saved)."""
    method = thresholds.parse_method(options.method or "entropy")  # checked where `options` was built
    bins, kl_variant, shard = options.bins, options.kl_variant, options.shard
    if bins < 256 or not histogram.is_power_of_two(bins):
        raise QtoolError("{bins} must be a power of two >= 256 (e.g. 2048), so histograms merge exactly", bins=Opt("bins", bins))
    if loaded.given is not None and loaded.store is None:
        # a model onnxruntime quantized dynamically, read whole (an in-memory ModelProto): read again with its float
        # weights computed when read, as `qtool calibrate` reads it (loaded lazily), so that its sessions hold its int8
        # weights (dynamic.int8_weights) and the file is the one the command line writes
        loaded = model.as_float(dataclasses.replace(loaded, proto=loaded.given, given=None, rewritten=None, store=lazy.STORES.new()))
    # the tensors inside If branches: fetched as outputs of their If nodes (model.branches), recorded by their own names
    run_on, inside = branches.exposed(loaded.proto, _catalogue)
    types = model.tensor_types(run_on)
    names = model.activation_tensors(run_on, types)
    if inside:
        types.update(inside)
        names += [n for n in inside if n not in names]
        run_on = dataclasses.replace(loaded, proto=run_on)
    else:
        run_on = loaded
    source = _source(loaded, names, options)
    with segments.one_heap():  # onnxruntime's threads and the workers' allocate in one heap
        hists, stats, samples = _collect(run_on, names, types, source, bins, progress)
    if samples == 0:
        what = "images could be read" if options.images is not None else "inputs were given"
        raise QtoolError(f"none of the {len(source.inputs)} {what}; nothing was calibrated" if source.inputs
                         else "the loader gave no inputs; nothing was calibrated")
    _drop_unused_peaks(loaded.proto, hists, stats)
    # a branch no input took has no values: no range (its layers stay float), said once
    unseen = [n for n in inside if hists[n].size == 0]
    records = [calibration.record_from_histogram(branches.original(n), hists[n], method, kl_variant, stats=stats[n]) for n in names
               if n not in unseen]
    cal = calibration.Calibration(
        model_path=loaded.path.resolve().as_posix(), model_sha256=loaded.sha256, method=method, num_bits=8,
        bins=bins, samples=samples, preprocess=source.preprocess, tensors=records, kl_variant=kl_variant, shard=shard,
    )
    count = source.runs.count if isinstance(source.runs, _Counted) else len(source.inputs)
    warnings = [w for w in [model.already_quantized(loaded.proto), branches.unseen_warning(unseen)] if w] + _warnings(records, source.skipped,
                                                                                      model.data_dependent(loaded.proto))
    return cal, Report(count, samples, source.batch_size, warnings, list(source.skipped or []))


def _catalogue(proto) -> tuple[list[str], dict[str, int]]:
    """The float activations of a model to record and its tensor types (branches.exposed's catalogue)."""
    types = model.tensor_types(proto)
    return model.activation_tensors(proto, types), types


def _statistics(proto, names) -> dict:
    """The statistics recorded beside the histograms: per-sample min, max |x| and per-channel means of layer
    inputs (for mean-minmax and bias correction) and per-channel max |x| of linear-layer inputs (for SmoothQuant at
    export; their Grams in transformers)."""
    stats = new_stats(proto, names, smooth=_transformer(proto))
    inside = [n for n in names if branches.original(n) != n]
    if inside:  # a branch tensor's statistics are those its readers inside the branches ask for
        flat = branches.flattened(proto)
        found = new_stats(flat, [branches.original(n) for n in inside], smooth=_transformer(flat))
        stats.update({n: found[branches.original(n)] for n in inside})
    return stats


def _collect(loaded, names, types, source: _Source, bins: int, progress):
    stats = _statistics(loaded.proto, names)
    # a Concat's output (a Split's input) holds exactly its parts' values, an Add/Sub/Mul output is
    # one exact float32 operation on its inputs: such tensors are computed from fetched ones
    derived = collect.derivations(loaded.proto, names, types, source.static, stats)
    fetched = [n for n in names if n not in derived]
    batches = -(-len(source.inputs) // (source.batch_size or 1)) if source.inputs else os.cpu_count() or 1
    folder = loaded.path.parent if loaded.external_files else None
    # bytes of each fetched tensor for the first run's input shapes (from its feeds where shape inference cannot tell)
    sizes = segments.sizes(loaded.proto, fetched, source.dims, source.first, folder) if source.dims else {}
    source.first = None
    kernel, limit, room, (workers, threads) = _bounds(loaded, len(names) * bins * 8, fetched, sizes, source, batches, derived)
    fewer = _within_bound(workers, (run := _run_bytes(fetched, sizes, source)) and run + _dequantized_bytes(loaded.proto), room)
    if progress is not None and source.inputs and hasattr(progress, "total"):  # a tqdm bar: now its length is known
        progress.total = len(source.inputs)
        progress.refresh()
    # shape inference's process ends before sessions are made (segments.split starts it again)
    shapes.close_child()
    helpers: list = []
    try:
        # the model itself with the fetched tensors as outputs until the sessions are made (a copy
        # would hold its weights twice while onnxruntime makes its own)
        with model.exposing(loaded.proto, fetched, types) as exposed:
            exposed = dynamic.int8_weights(exposed, min(workers, fewer)) or exposed  # a dynamic model's int8 weights
            helpers = _helpers(exposed, folder, fetched, names, source, bins, stats, derived, workers, progress)
            # runs helper processes share (each with its own single session) are not split: threads side
            # by side queue for one interpreter lock (PP-OCRv5 det, 60 images at 640x640: 35-38 s with a
            # helper, 69-73 s in segments on two threads)
            positions = _segment_cuts(exposed, fetched, types, sizes, limit) if folder is None and not helpers else []
            spread = threads
            if positions:  # each worker holds a segment's activations: as many as the model's bytes allow; the
                # sessions keep their threads (onnxruntime's convolutions give other floats on other thread counts:
                # centerface's file changed with one worker of two threads), the cores left go to the histograms
                held = segments.held(exposed, fetched, sizes, positions)
                workers, spread = _beside(workers, threads, held, _file_bytes(loaded), segmented=True)
                fewer = _within_bound(workers, held, room)
            if fewer < workers and not helpers:  # the cores a worker less leaves go to the histograms
                workers, spread = fewer, max(spread, _cores() // fewer)
            if helpers:
                progress = helpers[0].progress
                workers, threads, spread = workers - len(helpers), 1, 1
                skipped = [] if source.skipped is not None else None
                runs = procs.claimed_runs(source.images, helpers[0].claims.take, skipped)
            else:
                runs = source.runs
            session, blocked, positions = _session(exposed, fetched, positions, source.static, folder, threads)
        log.debug("calibrating %d tensors (%d computed from others, %d fetched in blocked layout) with %d inputs "
                  "(batch %s, %d workers of %d threads, %d helper processes, %d segments)", len(names), len(derived), len(blocked),
                  len(source.inputs), source.batch_size or "per file", workers, threads, len(helpers), len(positions) + 1)
        shapes.close_child()
        derived, taken = collect.carried_derivations(derived, session.carried if positions else frozenset(), blocked)
        plan = collect.Plan(names, bins, source.static, source.probe, derived, blocked, taken)
        hists, samples = collect.collect(session, plan, runs, progress, stats, collect.Schedule(workers, spread, kernel), helpers)
    finally:
        for helper in helpers:
            helper.close()
    if helpers and skipped is not None:  # in input order, as one process would have met them
        order = {path: k for k, path in enumerate(source.images.paths)}
        source.skipped[:] = sorted(skipped + [s for h in helpers for s in h.skipped], key=lambda s: order[s[0]])
    return hists, stats, samples


def _bounds(loaded, accumulator: int, fetched: list[str], sizes: dict[str, int], source: _Source, batches: int,
            derived: dict | None = None):
    """(collect.Schedule's kernel, the most bytes a run may fetch unsplit (beside the tensors collect computes from
    them, `derived`: _computed_bytes), the room twice plain inference leaves for the runs in flight (_bound_room),
    (workers, threads) by the cores and the model's bytes).
    A run under RUN_BYTES split for the 2x bound (_run_limit) keeps the workers and threads it has unsplit,
    and runs side by side only while the 2x bound leaves room for each (_within_bound) keep their sessions'
    threads: onnxruntime's convolutions give other floats on other thread counts (madmom_key_cnn's file
    changed on 2 workers of 1 thread in segments, against 1 of 2 unsplit)."""
    plain = _plain_bytes(loaded.proto, _file_bytes(loaded))
    estimate = plain(sizes) if sizes else None
    computed = _computed_bytes(loaded.proto, derived, source.dims) if sizes and derived else 0
    return (_kernel(fetched, sizes, source, batches, plain), _run_limit(estimate, _session_bytes(loaded), computed),
            _bound_room(estimate, _session_bytes(loaded), accumulator),
            _beside(*_parallelism(batches, source.batch_bytes), _run_bytes(fetched, sizes, source), _file_bytes(loaded)))


def _session(exposed, fetched: list[str], positions: list[int], static: frozenset, folder, threads: int):
    """(the session the runs fetch from, its tensors in blocked layout, the cuts it has): the
    segments `positions` cut, or where a part onnxruntime will not load alone or there are no
    cuts, the whole model in one session."""
    # shape inference's process (which segments.cuts starts, ~20 MB; split ends the one it uses) ends before a session is made:
    # ddddocr_ocr's layout probe and its segments' sessions, made beside it, were calibrate's peak RSS (205 MB: 185 in
    # calibrate's process, 20 in that one; docs/benchmarks.md #mem22)
    shapes.close_child()
    if positions:
        try:
            layout = nchwc.blocked_layout(exposed, fetched, static)
            session = segments.Segmented(segments.split(exposed, fetched, positions), static, threads, layout)
            return session, session.blocked, positions
        except Exception as e:
            log.debug("no segments (%s): one session", e)
    session, blocked = nchwc.fetching_session(exposed, fetched, keep=static, external_folder=folder, threads=threads)
    return session, blocked, []


def _run_limit(plain: int | None, file_bytes: int, computed: int = 0) -> int:
    """The most bytes a run may fetch unsplit: RUN_BYTES, and no more than what twice `plain`
    (plain inference's peak, _plain_bytes; None: not known) leaves beside CALIBRATE_FLOOR, the
    model's file and the `computed` bytes collect computes from the fetched tensors in that run
    (_computed_bytes)."""
    if plain is None:
        return RUN_BYTES
    return max(0, min(RUN_BYTES, 2 * plain - CALIBRATE_FLOOR - file_bytes - computed))


def _computed_bytes(proto, derived: dict, dims: dict | None) -> int:
    """The bytes of the tensors collect computes from fetched ones in a run (collect.derivations' Add/Sub/Mul outputs,
    not the concatenations, whose parts are histogrammed alone), for the input shapes `dims`, as far as shape
    inference tells. An unsplit run holds them beside the fetched tensors: onnxruntime's arena keeps what the run
    fetched from run to run, and each computed tensor is a new array while it is histogrammed and read
    (atspm_funcnet_pair: 29 MB fetched, 32 MB computed, +58 MB of RSS in the runs, unsplit: 2.07x plain inference's
    peak; split, 1.8x)."""
    made = [n for n, d in derived.items() if d.op != "concat"]
    if not made or not dims:
        return 0
    return sum(model.tensor_bytes(proto, made, dims).values())


def _bound_room(plain: int | None, file_bytes: int, accumulator: int) -> int | None:
    """The bytes twice `plain` (plain inference's peak, _plain_bytes; None: not known) leaves for
    the runs in flight beside CALIBRATE_FLOOR, the model's file and `accumulator` (the histograms,
    one set however many workers fill them); None where not known."""
    return None if plain is None else 2 * plain - CALIBRATE_FLOOR - file_bytes - accumulator


def _dequantized_bytes(proto) -> int:
    """The bytes of the float32 weights the model's own DequantizeLinear nodes make of its initializers (a Q/DQ model's:
    onnxruntime leaves them unfolded, and with its activations fetched runs each layer in float from them), which a run
    makes in its arena beside its activations, where plain inference runs the layers' int8 kernels on the integers.
    effword_resnet50_qint8 (84 MB of them from 21 MB of int8): two runs side by side took calibrate 218 -> 245 MB,
    twice plain inference's 117 (docs/benchmarks.md #mem24)."""
    inits = {t.name: t for t in proto.graph.initializer}
    return sum(4 * int(np.prod(inits[n.input[0]].dims, dtype=np.int64)) for n in proto.graph.node
               if n.op_type == "DequantizeLinear" and n.input and n.input[0] in inits)


def _within_bound(workers: int, per_run: int | None, room: int | None) -> int:
    """The most of `workers` runs of `per_run` bytes each (one segment's, for a run in segments) that
    fit in `room` (_bound_room) side by side, one at least (thai_oskut_ws: 2 workers of 19 MB runs
    beside 17 MB of histograms, 166 MB against 82 of plain inference)."""
    if not per_run or room is None:
        return workers
    return max(1, min(workers, room // per_run))


def _segment_cuts(exposed, fetched: list[str], types, sizes: dict[str, int], limit: int = RUN_BYTES) -> list[int]:
    """Where to cut the exposed model into segments (segments.cuts), when one run's fetched
    activations would pass `limit` (_run_limit; `sizes`: segments.sizes for the first run's
    input shapes); [] otherwise. (A model loaded lazily keeps its weights where they lie: each
    segment refers to its own.)"""
    if sum(sizes.values()) <= limit:
        return []
    return segments.cuts(exposed, fetched, sizes, max(SEGMENT_BYTES, 2 * max(sizes.values())), types)


def _run_bytes(fetched: list[str], sizes: dict[str, int], source: _Source) -> int | None:
    """The bytes one run fetches, when known before running (`sizes`: segments.sizes)."""
    return source.batch_bytes or (sum(sizes.values()) if len(sizes) == len(fetched) else None)


def _kernel(fetched: list[str], sizes: dict[str, int], source: _Source, batches: int, plain=None):
    """collect.Schedule's `kernel`: False where the runs bin less than KERNEL_BYTES in all, else
    a function of the bytes of each tensor the first run fetched: whether the calibration bins
    KERNEL_BYTES (the first run's bytes times the files, where `sizes`, segments.sizes', left them
    unsized; an in-memory loader's count is unknown: as if it did) and the kernel's memory fits
    beside what the process holds then (_kernel_fits; `plain`: _plain_bytes)."""
    per_run = _run_bytes(fetched, sizes, source)
    if per_run and per_run * batches < KERNEL_BYTES:
        return False
    files = len(source.inputs)

    def kernel(first: dict[str, int]) -> bool:
        if not per_run and files and sum(first.values()) * files < KERNEL_BYTES:
            return False
        return plain is None or _kernel_fits(plain(first))
    return kernel


def _plain_bytes(proto, file_bytes: int):
    """A function of {tensor: bytes} of one run (the fetched ones) giving a lower bound of plain
    inference's peak RSS on that run: PLAIN_FLOOR, the model's file and the most those tensors
    hold at once, each from the node that makes it to its last reader in graph order (onnxruntime
    holds at least that; its arena, its convolutions' buffers and fused copies more)."""
    made, last = segments.lifetimes(proto.graph.node)
    ends = len(proto.graph.node)
    for o in proto.graph.output:
        last[o.name] = ends
    for i in proto.graph.input:
        made.setdefault(i.name, 0)

    def plain(sizes: dict[str, int]) -> int:
        change = [0] * (ends + 2)
        for t, n in sizes.items():
            if t in made:
                change[made[t]] += n
                change[max(made[t], last.get(t, made[t])) + 1] -= n
        most = held = 0
        for c in change:
            held += c
            most = max(most, held)
        return PLAIN_FLOOR + file_bytes + most
    return plain


def _kernel_fits(plain: int) -> bool:
    """Whether loading the kernel now keeps calibrate's peak RSS within twice `plain` (plain
    inference's, estimated from below): the RSS now plus its load's, and the peak so far (a run's
    activations, which the next runs make again) plus what it holds once loaded."""
    now, peak = _rss()
    if now is None:
        return True  # nothing to tell by (not Linux): as before
    return max(now + KERNEL_LOAD_RSS, peak + KERNEL_HELD_RSS) <= 2 * plain


def _rss() -> tuple[int | None, int | None]:
    """(this process's resident bytes, its peak): /proc/self/status's VmRSS and VmHWM; (None, None)
    where it is not there."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    found[line[:5]] = int(line.split()[1]) << 10
    except (OSError, ValueError):
        return None, None
    if len(found) < 2:
        return None, None
    return found["VmRSS"], found["VmHWM"]


def _transformer(proto) -> bool:
    return bool(patterns.transformer_structure(Index(proto)))


def _drop_unused_peaks(proto, hists, stats) -> None:
    """Beyond transformers, the per-channel maxima of linear-layer inputs serve SmoothQuant's "auto" only from
    smoothquant.MIN_ROWS values per channel: fewer are not kept (an unrolled RNN's 80 Gemm inputs, one row per
    step: 3 MB more JSON to write and read, +10 % calibration time)."""
    if _transformer(proto):
        return
    for n in linear_inputs(proto):
        st = stats.get(n)
        if st is not None and st.channel_absmax and hists[n].size / len(st.channel_absmax) < smoothquant.MIN_ROWS:
            st.channel_absmax, st.track_absmax = None, False


def _helpers(exposed, folder, fetched, names, source: _Source, bins, stats, derived, workers, progress) -> list:
    """Helper processes (procs) for the workers but this process's own (up to MAX_HELPERS),
    started now so that they get ready while this process builds its session; none when the
    calibration is small, its runs are not one image each, or the cores allow one worker."""
    if workers < 2 or source.images is None or source.least_bytes * len(source.images) < HELPER_BYTES:
        return []
    try:
        model_bytes, spill = runnable(exposed)  # a big model's weights: read by path (folder "/")
    except ValueError:  # over protobuf's 2 GB: the weights stay external, threads it is
        return []
    if spill is not None:
        spilled = bool(spill.path)
        spill.close()
        if spilled:  # weights computed in this process (none when calibrating): threads
            return []
        folder = "/"
    static = source.static
    job = procs.Job(model_bytes, None if folder is None else str(folder), fetched, static,
                    [n for n in names if n not in static], bins, {n: s for n, s in stats.items() if n not in static},
                    derived, source.images, source.skipped is not None)
    claims = procs.Claims(len(source.images))
    shared = procs.Locked(progress) if progress is not None else None
    helpers = []
    try:
        for _ in range(min(workers - 1, MAX_HELPERS)):
            helpers.append(procs.Helper(job, claims, shared))
    except OSError as e:  # no Python to start (an embedded interpreter): worker threads instead
        log.debug("no helper process (%s): worker threads instead", e)
        for helper in helpers:
            helper.close()
        return []
    return helpers


def _warnings(records, skipped, dependent: set[str] | None = None) -> list[str]:
    """Warnings about the calibrated values. `dependent`: the tensors that depend on input values;
    an all-zero tensor outside it (computed from constants and shapes, e.g. a ConstantOfShape
    of zeros) is left out of the all-zero warning: the user cannot act on it."""
    warnings = []
    if skipped:
        warnings.append(f"skipped {len(skipped)} unreadable image(s): " + "; ".join(reason for _, reason in skipped[:3]))
    nonfinite = [r for r in records if r.nonfinite]
    if nonfinite:
        warnings.append(
            f"{len(nonfinite)} tensor(s) had NaN/inf values, left out of the histograms: "
            + ", ".join(f"{r.name} ({r.nonfinite})" for r in nonfinite[:5])
        )
    zero = [r.name for r in records if r.amax == 0 and (dependent is None or r.name in dependent)]
    if zero:
        warnings.append(f"{len(zero)} tensor(s) were all zero (amax 0): {', '.join(zero[:5])}")
    return warnings
