"""Calibration cost vs plain inference, and memory, on the YOLOv8n look-alike and real models.

For each model (the n-scale YOLOv8 look-alike of bench/detector.py at 320x320, and the real
PP-OCRv5 det at 640x640, PP-OCRv5 rec at 48x320 and MTCNN O-Net at 48x48 that
../shared/tools/fetch_dev_models.sh downloads, preprocessed as bench/fidelity.py says), prints,
measured in this run on this machine:
  - plain: a decode-and-run loop over N images with a default onnxruntime session (qtool's own
    decoding, so both sides decode alike),
  - `qtool calibrate` on the same images, and the ratio calibrate / plain (plain and qtool runs
    alternate --repeat times; medians compared, each round's ratio shown, and the fastest of each
    side compared: interference on a shared machine only slows a run),
  - the floor: onnxruntime alone with every tensor qtool fetches exposed, run as qtool runs it
    (one thread per run, one run per core side by side, decoding included), outputs dropped,
  - qtool's peak RSS at 100 and at N images, its helper process's added (memory is flat when they agree),
  - a per-image phase profile of collection on one thread (one worker, one onnxruntime thread:
    the phases add up to the time per image): decode, onnxruntime, binning (|x| -> bin counts,
    with the min/max of the same pass once a tensor's range is known), min/max (numpy's, where
    binning is not that one pass), per-sample statistics, derived tensors, Python overhead (the rest of the time spent
    handling outputs), and the fixed cost after collection (thresholds and file writing),
  - a bound for exact histograms: the floor plus the profile's binning of every value, spread
    over all cores without loss. Calibrate's time above it is statistics, derived tensors,
    Python and the cores' contention: all that code outside the kernel can cut.
Images: the photos of fetch_dev_models.sh (repeated when fewer than N), else generated ones.
Each measurement runs in a fresh process so peak RSS is its own.

Usage: python bench/calibrate_vs_inference.py [--images 400] [--repeat 3] [--models yolov8n,...]
                                              [--profile-images 60] [--skip-ort] [--json OUT] [--compare OLD]
(--compare: the --json of a run on another commit, whose ratio and profile print beside.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
WORK = Path(tempfile.gettempdir()) / "qtool-bench"
DEV = Path.home() / ".cache" / "qtool-dev"

# qtool calibrate options for bench/fidelity.py's preprocessing names
PREPROCESS = {
    "yolo": [],
    "imagenet": ["--bgr", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225"],
    "half": ["--bgr", "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"],
    "mtcnn": ["--scale", "1", "--mean", "127.5,127.5,127.5", "--std", "128,128,128", "--layout", "nhwc"],
}
# bench name: (bench/fidelity.py name or None for the look-alike, HxW)
MODELS = {
    "yolov8n": (None, (320, 320)),
    "ppocrv5_det": ("ppocrv5_det", (640, 640)),
    "ppocrv5_rec": ("ppocrv5_rec", (48, 320)),
    "mtcnn_onet": ("mtcnn_onet", (48, 48)),
}


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def model_path(name: str) -> Path:
    fid, _ = MODELS[name]
    if fid is None:
        path = WORK / "yolov8n_like.onnx"
        if not path.exists():
            import onnx
            from detector import detector

            WORK.mkdir(exist_ok=True)
            onnx.save(detector(), path)
        return path
    from fidelity import MODELS as FIDELITY

    return DEV / "models" / FIDELITY[fid][0]


def calibrate_args(name: str) -> list[str]:
    fid, (h, w) = MODELS[name]
    if fid is None:
        pre = "yolo"
    else:
        from fidelity import MODELS as FIDELITY

        pre = FIDELITY[fid][3]
    return ["--size", f"{h}x{w}", *PREPROCESS[pre]]


def images(n: int) -> Path:
    """A folder of n images: the dev photos repeated, else generated ones."""
    folder = WORK / f"photos{n}"
    if folder.exists() and len(list(folder.glob("*.jpg"))) == n:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    source = sorted((DEV / "photos").glob("*.jpg"))
    if not source:
        from detector import photos

        source = photos(WORK / "generated", 400)
    for i in range(n):
        link = folder / f"{i:05d}.jpg"
        if not link.exists():
            os.symlink(source[i % len(source)], link)
    return folder


def preprocess(name: str, proto):
    """The data.Preprocess qtool calibrate resolves for this model's options."""
    from qtool import model as qmodel
    from qtool.feeds import data

    args = calibrate_args(name)
    opt = {k: args[args.index(k) + 1] if k in args else None for k in ("--mean", "--std", "--layout", "--scale")}
    h, w = MODELS[name][1]
    return data.resolve_preprocess(qmodel.image_input(proto), size=(h, w), layout=opt["--layout"], resize="stretch",
                                   scale=data.parse_scale(opt["--scale"] or "1/255"), mean=opt["--mean"], std=opt["--std"],
                                   bgr="--bgr" in args)


def _plan(proto, name: str):
    """What qtool calibrate fetches for one image: (names, static, stats, derived, fetched, types)."""
    from qtool import model as qmodel
    from qtool.collection import collect
    from qtool.statistics import stats

    types = qmodel.tensor_types(proto)
    names = qmodel.activation_tensors(proto, types)
    static = frozenset(names) - qmodel.data_dependent(proto)
    st = stats.new_stats(proto, names)
    derived = collect.derivations(proto, names, types, static, st)
    return names, static, st, derived, [n for n in names if n not in derived], types


def worker(mode: str, name: str, n: int) -> dict:
    import onnx

    from qtool.feeds import data

    path = model_path(name)
    folder = images(n)
    paths = sorted(folder.glob("*.jpg"))
    if mode == "plain":
        import onnxruntime as ort

        proto = onnx.load(str(path))
        pre, feed = preprocess(name, proto), proto.graph.input[0].name
        started = time.perf_counter()
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for p in paths:
            sess.run(None, {feed: data.load_image(p, pre)[None]})
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    if mode == "exposed":
        import threading

        from qtool import model as qmodel
        from qtool.runtime import nchwc

        started = time.perf_counter()
        proto = onnx.load(str(path))
        pre, feed = preprocess(name, proto), proto.graph.input[0].name
        names, static, _, _, fetched, types = _plan(proto, name)
        sess, blocked = nchwc.fetching_session(qmodel.with_outputs(proto, fetched, types), fetched, static, threads=1)
        sources = [blocked[t].source if t in blocked else t for t in fetched]
        todo, lock = iter(paths), threading.Lock()

        def work():
            while True:
                with lock:
                    p = next(todo, None)
                    if p is None:
                        return
                    x = data.load_image(p, pre)[None]
                sess.run(sources, {feed: x})

        threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    if mode == "qtool":
        from click.testing import CliRunner

        from qtool.cli import cli

        started = time.perf_counter()
        r = CliRunner().invoke(cli, ["calibrate", str(path), "--images", str(folder), *calibrate_args(name),
                                     "-o", str(WORK / f"{name}.{n}.calib.json"), "--json"])
        seconds = time.perf_counter() - started
        assert r.exit_code == 0, r.output
        import resource

        # and its helper process's (qtool.collection.procs; Linux counts in KB): both at their peaks at once, at worst
        helper = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return {"seconds": seconds, "rss_mb": peak_rss_mb() + helper, "batch_size": json.loads(r.stdout)["batch_size"]}
    if mode == "profile":
        return profile(name, path, paths)
    if mode == "ort":
        from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, create_calibrator

        proto = onnx.load(str(path))
        pre, feed = preprocess(name, proto), proto.graph.input[0].name

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(paths)

            def get_next(self):
                p = next(self.it, None)
                return None if p is None else {feed: data.load_image(p, pre)[None]}

        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            cal = create_calibrator(str(path), augmented_model_path=str(Path(tmp) / "aug.onnx"),
                                    calibrate_method=CalibrationMethod.Entropy)
            cal.collect_data(Reader())
            cal.compute_data()
        return {"seconds": time.perf_counter() - started, "rss_mb": peak_rss_mb()}
    raise ValueError(mode)


class _Timer:
    """Wraps functions and adds up the time spent in them (nested wrappers count in each)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, owner, attr: str, phase: str) -> None:
        fn = getattr(owner, attr)
        totals, calls = self.seconds, self.calls
        totals.setdefault(phase, 0.0)
        calls.setdefault(phase, 0)
        clock = time.perf_counter

        def timed(*args, **kwargs):
            t = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[phase] += clock() - t
                calls[phase] += 1

        setattr(owner, attr, timed)


def profile(name: str, path: Path, paths: list[Path]) -> dict:
    """Collection on one thread, with the time of each phase per image. The functions timed are
    those of qtool's collection (collect, histogram, stats): after a change there, this follows."""
    import onnx

    from qtool import calibration
    from qtool import model as qmodel
    from qtool.collection import collect
    from qtool.feeds import data
    from qtool.runtime import nchwc
    from qtool.runtime import onnxruntime as sessions
    from qtool.statistics import histogram, stats, thresholds

    proto = onnx.load(str(path))
    pre, feed = preprocess(name, proto), proto.graph.input[0].name
    names, static, st, derived, fetched, types = _plan(proto, name)
    sess, blocked = nchwc.fetching_session(qmodel.with_outputs(proto, fetched, types), fetched, static, threads=1)
    histogram.start_loading()
    histogram.wait_for_kernel()
    timer = _Timer()
    timer.wrap(sessions, "run", "onnxruntime")
    timer.wrap(collect._Accumulator, "fill", "handling")
    timer.wrap(histogram.TensorHistogram, "update", "histogram")  # min/max, then binning
    timer.wrap(histogram, "add_bins", "binning")
    if hasattr(histogram, "binned_extrema"):  # the one-pass kernel: bins and min/max together
        timer.wrap(histogram, "binned_extrema", "binning")
    timer.wrap(stats.SampleStats, "update", "statistics")
    if hasattr(collect._Accumulator, "derive"):
        timer.wrap(collect._Accumulator, "derive", "derived")
    decode = 0.0

    def runs():
        nonlocal decode
        for p in paths:
            t = time.perf_counter()
            x = data.load_image(p, pre)[None]
            decode += time.perf_counter() - t
            yield {feed: x}, 1

    started = time.perf_counter()
    hists, seen = collect.collect(sess, collect.Plan(names, 2048, static, derived=derived, blocked=blocked), runs(), stats=st)
    total = time.perf_counter() - started
    t = time.perf_counter()
    records = [calibration.record_from_histogram(n, hists[n], "entropy", stats=st[n]) for n in names]
    search = time.perf_counter() - t
    t = time.perf_counter()
    cal = calibration.Calibration(model_path=path.name, model_sha256="0" * 64, method="entropy", num_bits=8, bins=2048,
                                  samples=seen, preprocess=pre.to_dict(), tensors=records)
    with tempfile.TemporaryDirectory() as tmp:
        calibration.save(cal, Path(tmp) / "p.calib.json")
    write = time.perf_counter() - t
    del thresholds
    s = timer.seconds
    ms = {k: v / seen * 1e3 for k, v in s.items()}
    # values binned per image: a concatenation's histogram adds its parts', a static tensor's is binned once
    binned = sum(hists[n].size for n in names if n not in static and not (n in derived and derived[n].op == "concat")) / seen
    out = {"images": seen, "tensors": len(names), "fetched": len(fetched), "total": total / seen * 1e3,
           "decode": decode / seen * 1e3, "onnxruntime": ms["onnxruntime"], "binning": ms["binning"],
           "min/max": ms["histogram"] - ms["binning"], "statistics": ms["statistics"], "derived": ms.get("derived", 0.0)}
    out["python"] = ms["handling"] - ms["histogram"] - ms["statistics"] - out["derived"]
    out["calls/img"] = {k: v / seen for k, v in timer.calls.items()}
    out["binned/img"] = binned
    out["thresholds_s"], out["write_s"] = search, write
    return out


def measure(mode: str, name: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", mode, "--model", name, "--images", str(n)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(name: str, n: int, repeat: int, profile_images: int, before: dict | None = None) -> dict:
    import onnx

    from qtool import model as qmodel

    proto = onnx.load(str(model_path(name)))
    h, w = MODELS[name][1]
    print(f"\n== {name}: {len(qmodel.activation_tensors(proto))} float activation tensors, {h}x{w} input, "
          f"{os.cpu_count()} CPUs", flush=True)
    # plain and qtool alternate, --repeat times each: the machine's drift hits both alike
    rounds = [(measure("plain", name, n), measure("qtool", name, n)) for _ in range(repeat)]
    plain = sorted((r[0] for r in rounds), key=lambda m: m["seconds"])[len(rounds) // 2]
    ours = sorted((r[1] for r in rounds), key=lambda m: m["seconds"])[len(rounds) // 2]
    exposed = measure("exposed", name, n)
    small = measure("qtool", name, 100)
    prof = measure("profile", name, profile_images)
    ratio = ours["seconds"] / plain["seconds"]
    each = ", ".join(f"{q['seconds'] / p['seconds']:.2f}" for p, q in rounds)
    print(f"plain inference, {n} images incl. decoding: {plain['seconds']:.2f} s ({plain['seconds'] / n * 1e3:.1f} ms/img)")
    print(f"qtool calibrate, {n} images:               {ours['seconds']:.2f} s (batch {ours['batch_size']})")
    print(f"ratio calibrate / plain inference:         {ratio:.2f}  (goal <= 1.8; each round: {each})")
    # this machine's interference only ever slows a run: the fastest of each side is the least disturbed
    best = min(q["seconds"] for _, q in rounds) / min(p["seconds"] for p, _ in rounds)
    print(f"fastest calibrate / fastest plain:         {best:.2f}  (plain s each round: "
          + ", ".join(f"{p['seconds']:.2f}" for p, _ in rounds) + ")")
    print(f"floor: tensors exposed, no histograms:     {exposed['seconds']:.2f} s, ratio {exposed['seconds'] / plain['seconds']:.2f}")
    print(f"qtool peak RSS (with its helper process): 100 images {small['rss_mb']:.0f} MB, {n} images {ours['rss_mb']:.0f} MB "
          f"({(ours['rss_mb'] / small['rss_mb'] - 1) * 100:+.1f} %)")
    phases = ["decode", "onnxruntime", "binning", "min/max", "statistics", "derived", "python"]
    print(f"profile, one thread, {prof['images']} images, {prof['fetched']} of {prof['tensors']} tensors fetched, ms/img: "
          + ", ".join(f"{k} {prof[k]:.2f}" for k in phases) + f"; total {prof['total']:.2f}")
    print(f"fixed cost: thresholds for {prof['tensors']} tensors {prof['thresholds_s']:.2f} s, file {prof['write_s']:.2f} s",
          flush=True)
    # what exact histograms cost at least: the floor's runs plus the binning of every value at the speed the profile
    # measured, spread over all cores without loss (statistics, derived tensors and Python left out)
    cores = os.cpu_count() or 1
    bound = exposed["seconds"] + n * prof["binning"] / 1e3 / cores
    print(f"{f'bound: floor + binning on {cores} cores:':<43}{bound:.2f} s, ratio {bound / plain['seconds']:.2f}  "
          f"({prof['binned/img'] / 1e6:.1f} M values/img binned at {prof['binning'] / prof['binned/img'] * 1e6:.2f} ns/value)")
    if before:  # a --json file of an earlier run (another commit): the same lines, then
        was = before["profile"]
        print(f"before (--compare): ratio {before['ratio']:.2f}, floor {before['floor']:.2f}, peak RSS {before['rss_n']:.0f} MB; "
              f"profile ms/img: " + ", ".join(f"{k} {was[k]:.2f}" for k in phases) + f"; total {was['total']:.2f}")
    return {"ratio": ratio, "rounds": each, "best": best, "plain_s": plain["seconds"], "qtool_s": ours["seconds"],
            "floor": exposed["seconds"] / plain["seconds"], "bound": bound / plain["seconds"], "rss_100": small["rss_mb"], "rss_n": ours["rss_mb"], "profile": prof}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of: " + ", ".join(MODELS))
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--skip-ort", action="store_true", help="skip onnxruntime's entropy calibrator (32 images, look-alike)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds of plain and qtool runs (medians compared)")
    ap.add_argument("--profile-images", type=int, default=60)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--compare", type=Path, help="a --json file of an earlier run: print its ratio and profile beside")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.images)))
        return
    # numba compiles the binning kernels at their first use after a fresh install or checkout and
    # caches them: load them once here, so that no timed round pays the compilation
    subprocess.run([sys.executable, "-c", "from qtool.statistics import histogram; histogram._load_kernel()"], check=True)
    results = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if MODELS[name][0] is not None and not model_path(name).exists():
            print(f"\n== {name}: missing {model_path(name)}: run ../shared/tools/fetch_dev_models.sh")
            continue
        earlier = json.loads(args.compare.read_text()).get(name) if args.compare else None
        results[name] = bench(name, args.images, args.repeat, args.profile_images, earlier)
    if not args.skip_ort and "yolov8n" in results:
        ort_r = measure("ort", "yolov8n", 32)
        q32 = measure("qtool", "yolov8n", 32)
        print(f"\nonnxruntime entropy calibrator, yolov8n, 32 images: {ort_r['seconds']:.2f} s, peak RSS {ort_r['rss_mb']:.0f} MB")
        print(f"qtool calibrate, 32 images: {q32['seconds']:.2f} s, peak RSS {q32['rss_mb']:.0f} MB "
              f"({ort_r['seconds'] / q32['seconds']:.1f}x faster, {ort_r['rss_mb'] / q32['rss_mb']:.1f}x less memory)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
