"""The zoo bench: qtool against NNCF and onnxruntime's quantizer on every model of the zoo, one row each.

Reads zoo folders as bench/zoo_models lays them out (<zoo>/<name>/model.onnx, calib/NNNN.npz, held/NNNN.npz,
meta.json; npz keys = input names, one inference each) and runs, per model, every step in a CHILD process with a
timeout, so a native abort, crash or hang in qtool, OpenVINO, NNCF or onnxruntime becomes the row's entry
("abort(134)", "segv(139)", "timeout"), never the bench's end (PYTHONFAULTHANDLER=1: the JSON keeps the
failing step's last stderr lines, with the Python stack of a native crash). qtool runs as a user runs it: `python -m qtool`, with
this checkout first on PYTHONPATH (the header prints which qtool the children import).

  calibrate  `qtool calibrate model.onnx --data calib`: exit, wall time, peak RSS of its whole process tree (RSS
             summed over the tree, polled every 20 ms), over the peak RSS of plain onnxruntime (a default
             InferenceSession running the same calibration inputs in a child): the "RSS x" column;
  export     `qtool export --target openvino`, `qdq`, `tensorrt --trt-version 11.4`: exit of each (o/q/t), the
             error line kept in the JSON;
  inspect    `qtool inspect <the tensorrt file> --trt-version 11.4`: ok, or how many parser rules it breaks;
  qtool      `qtool evaluate model.onnx --data held --target openvino --runtime openvino --json`: the worst output's
             SQNR of the exact simulation of the file ("sim") and of OpenVINO running it on this CPU ("run"); where
             that fails, again without --runtime for the simulation alone; `--target qdq`'s simulation (JSON only);
  nncf       nncf.quantize(ov.convert_model(model.onnx), nncf.Dataset(calibration feeds), subset_size=all of them),
             default preset and model_type=TRANSFORMER, each compiled on CPU with INFERENCE_PRECISION_HINT f32 and
             scored on the held-out feeds against FP32 = model.onnx run by OpenVINO at f32;
  ort        onnxruntime.quantization.quantize_static(model, QDQ, its defaults: per-tensor int8 MinMax) over the
             calibration feeds, run by onnxruntime CPU against FP32 onnxruntime;
  latency    OpenVINO on the first held-out feed, every model compiled with f32 precision, LATENCY hint, 1 stream:
             qtool's openvino file, NNCF's better preset (by SQNR) and FP32 (NNCF's and FP32 alone where qtool
             writes no file: whether int8 pays there; all at the feed's shapes where one
             compiles only at static shapes) take turns in --rounds rounds, each
             running ~--round-seconds per round in 10 slices taken in turn A,B,C, C,B,A, ... (so a change in the
             machine's load falls on all alike); per round the median latency of each, per pair the ratio in each
             round; the table shows the median ratio over rounds (the JSON also their min and max, and the load).

A model whose outputs are all integers computed from float tensors (a tagger exported with its ArgMax, an ensemble's
Where of two taggers' labels, values cast to uint8) is scored by
every tool on the float tensors the labels are computed from, as `qtool evaluate` does: NNCF and onnxruntime
quantize and run a copy that also outputs them (scored_model).

SQNR everywhere is qtool's (qtool.checks.evaluation, the accumulator `qtool evaluate` uses): 10 log10(sum ref^2 /
sum (ref - q)^2) over all values of an output across the held-out feeds, in float64, values where FP32 is NaN/inf
skipped, an int8 NaN/inf where FP32 is finite = -inf; the worst (lowest) over the float outputs. "lead" below is
qtool's OpenVINO run dB minus the better NNCF preset's (both measured by OpenVINO on this CPU).

Prints the machine (CPU model and vnni/bf16 flags, qtool's git commit, openvino/onnxruntime/nncf versions, date),
one markdown table and a summary (failures, median lead, count within 0.5 dB of NNCF or ahead, |run - sim| > 1 dB,
geometric-mean latency ratios), and writes everything to --out as JSON; a run of some models merges into the
file's other rows.

Usage (from the repository root; nncf is a bench-only dependency):
  python bench/zoo.py [--zoo DIR] [--models a,b] [--skip nncf,ort,latency] [--out FILE] [--work DIR]
                      [--peers DIR] [--reuse-peers]
                      [--timeout 1800] [--rounds 5] [--round-seconds 0.5] [--materialize] [--table-only]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ZOO = Path.home() / ".cache" / "qtool-bench" / "zoo"
WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "zoo"
PEERS = Path.home() / ".cache" / "qtool-bench" / "zoo-peers"
TRT_VERSION = "11.4"
COSTLY = ("nncf", "ort", "latency")
NNCF_PRESETS = ("default", "transformer")
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
SIGNALS = {signal.SIGABRT: "abort", signal.SIGSEGV: "segv", signal.SIGKILL: "killed", signal.SIGBUS: "bus",
           signal.SIGFPE: "fpe", signal.SIGILL: "ill", signal.SIGTERM: "term"}


class BenchError(Exception):
    """Bad bench input: printed as one `error: ...` line, exit 1."""


# ---------------------------------------------------------------- numbers in JSON


def num(value) -> float | str | None:
    """A JSON-safe float: rounded, +-inf and NaN as the strings qtool's --json writes."""
    if value is None:
        return None
    value = float(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return round(value, 4)


def unnum(value) -> float | None:
    """num()'s inverse (also reads qtool evaluate --json numbers)."""
    if value is None:
        return None
    return float(value)  # float("inf"), float("-inf"), float("nan") parse the strings


# ---------------------------------------------------------------- child processes


def status_of(rc: int | None, timed_out: bool) -> str:
    """"ok", "exit(N)", "abort(134)" (a signal as the shell's 128 + N), "timeout"."""
    if timed_out:
        return "timeout"
    if rc == 0:
        return "ok"
    if rc is not None and rc < 0:
        return f"{SIGNALS.get(-rc, 'signal')}({128 - rc})"
    return f"exit({rc})"


# kcmp(2)'s syscall number by machine, and its KCMP_VM: whether two processes share one address space
_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
KCMP_VM = 1


def one_space(a: int, b: int) -> bool:
    """Whether processes `a` and `b` share one address space (kcmp(2), KCMP_VM): a child between vfork and exec, as
    subprocess starts every child on Linux, runs in its parent's memory; False where that cannot be told."""
    if _KCMP is None:
        return False
    try:
        return _libc().syscall(_KCMP, ctypes.c_long(a), ctypes.c_long(b), ctypes.c_long(KCMP_VM), ctypes.c_long(0),
                               ctypes.c_long(0)) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, opened once (tree_rss asks one_space for every child at every poll)."""
    return ctypes.CDLL(None, use_errno=True)


def tree_rss(proc) -> int:
    """RSS of a psutil.Process and all its descendants, in bytes (0 for those already gone). A child that shares its
    parent's address space (started by vfork, not yet exec'd: its RSS is its parent's pages) is counted once, in
    its parent: summed, a moment of `qtool calibrate` starting a helper read twice its memory."""
    import psutil

    total = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in members:
        try:
            if p is not proc and one_space(p.pid, p.ppid()):
                continue
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def error_line(stderr: str) -> str:
    """qtool's `error: ...` line, else the last line (a traceback's exception, a runtime's abort message)."""
    stderr = stderr.split("Fatal Python error:")[0]  # faulthandler's report follows the runtime's own message
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error:"):
            more = lines[i + 1:]  # a message that goes on below (a runtime's exception quoted): its last line too
            return (lines[i] + (f" ... {more[-1]}" if more else ""))[:300]
    return lines[-1][:300] if lines else ""


def run_child(cmd: list[str], timeout: float, cwd: Path) -> dict:
    """Run cmd in its own session; exit status, wall seconds, peak RSS of its process tree, stdout, error line.
    On timeout (or the bench's own interruption) the child's whole process group is killed."""
    import psutil

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               PYTHONFAULTHANDLER="1")  # a native abort or crash leaves the Python stack in the JSON's stderr_tail
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env, start_new_session=True)
        watched = psutil.Process(proc.pid)
        peak, timed_out = 0, False
        try:
            while proc.poll() is None:
                peak = max(peak, tree_rss(watched))
                if time.perf_counter() - start > timeout:
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:
            if proc.poll() is None or timed_out:
                _kill_group(proc.pid)
                proc.wait()
        seconds = time.perf_counter() - start
        _kill_group(proc.pid)  # helpers the child left behind
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    status = status_of(proc.returncode, timed_out)
    step = {"status": status, "rc": None if timed_out else proc.returncode, "seconds": round(seconds, 2),
            "peak_rss_mb": round(peak / 2**20, 1), "error": "" if status == "ok" else error_line(stderr) or status,
            "stdout": stdout}
    if status != "ok":
        step["stderr_tail"] = stderr.splitlines()[-40:]
    return step


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def qtool_step(args: list, timeout: float, cwd: Path, parse_json: bool = False) -> dict:
    """`python -m qtool ARGS` as a step; with parse_json, its stdout's JSON document as "result"."""
    step = run_child([sys.executable, "-m", "qtool", *map(str, args)], timeout, cwd)
    stdout = step.pop("stdout")
    if parse_json:
        try:
            step["result"] = json.loads(stdout)
        except json.JSONDecodeError:
            step["result"] = None
    return step


def python_step(name: str, folder: Path, work: Path, timeout: float, extra: list[str] = ()) -> dict:
    """This file's child step `name` (CHILD_STEPS) in a fresh interpreter; its JSON result as "result"."""
    result_file = work / f"{child_result_name(name, extra)}.json"
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model-dir", str(folder), "--work", str(work),
           *extra]
    step = run_child(cmd, timeout, work)
    step.pop("stdout")
    if step["status"] == "exit(1)":
        step["status"] = "exception"  # Python's exit status for an uncaught exception: the error line is its message
    step["result"] = json.loads(result_file.read_text()) if step["status"] == "ok" and result_file.exists() else None
    if step["status"] == "ok" and step["result"] is None:
        step["status"], step["error"] = "no result", f"{name} wrote no {result_file.name}"
    return step


# ---------------------------------------------------------------- child steps (run inside the child process)


def feed_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.npz"))


def load_feed(path: Path) -> dict:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def sqnr_scores(pairs, names: list[str]) -> dict:
    """Per float output its SQNR over all pairs (reference outputs, int8 outputs), and the worst; qtool's
    accumulator (qtool.checks.evaluation._Acc, what `qtool evaluate` sums with) does the float64, NaN-safe sums."""
    from qtool.checks.evaluation import _Acc

    accs: list | None = None
    floats: list[bool] = []
    for ref, out in pairs:
        if accs is None:
            accs = [_Acc() for _ in ref]
            floats = [np.issubdtype(np.asarray(r).dtype, np.floating) for r in ref]
        for acc, is_float, r, o in zip(accs, floats, ref, out):
            if is_float:
                acc.update(np.asarray(r), np.asarray(o))
    outputs = {n: acc.sqnr() for n, acc, f in zip(names, accs or [], floats) if f}
    values = list(outputs.values())
    worst = math.nan if not values or any(math.isnan(v) for v in values) else min(values)
    return {"sqnr_db": num(worst), "outputs": {n: num(v) for n, v in outputs.items()}}


def ov_outputs(compiled, feed: dict) -> list[np.ndarray]:
    res = compiled(feed)
    return [np.array(res[o], copy=True) for o in compiled.outputs]


def ov_names(compiled) -> list[str]:
    names = []
    for i, o in enumerate(compiled.outputs):
        try:
            names.append(o.get_any_name())
        except RuntimeError:
            names.append(f"output{i}")
    return names


def child_plain(folder: Path, work: Path, args) -> dict:
    """Plain onnxruntime over the calibration inputs (one file at a time, as qtool streams them)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    files = feed_files(folder / "calib")
    for f in files:
        session.run(None, load_feed(f))
    return {"runs": len(files)}


def scored_model(folder: Path, work: Path) -> Path:
    """The model the peers quantize and score: model.onnx, or where its outputs are all integers computed from float
    tensors, a copy in `work` also outputting their float sources, the tensors `qtool evaluate` scores instead
    (qtool.checks.evaluation.label_scored)."""
    import onnx

    from qtool.checks.evaluation import label_scored

    path = folder / "model.onnx"
    proto, scored = label_scored(onnx.load(str(path)))
    if not scored:
        return path
    out = work / "scored.onnx"
    onnx.save(proto, str(out))
    return out


def child_nncf(folder: Path, work: Path, args) -> dict:
    """nncf.quantize with one preset, saved as IR; scored in OpenVINO (f32) against FP32 OpenVINO (f32)."""
    import nncf
    import openvino as ov

    preset = args.preset
    calib = [load_feed(f) for f in feed_files(folder / "calib")]
    source = scored_model(folder, work)
    start = time.perf_counter()
    model = ov.convert_model(str(source))
    options = {"model_type": nncf.ModelType.TRANSFORMER} if preset == "transformer" else {}
    quantized = nncf.quantize(model, nncf.Dataset(calib), subset_size=len(calib), **options)
    seconds = time.perf_counter() - start
    del calib
    xml = work / f"nncf_{preset}.xml"
    ov.save_model(quantized, str(xml), compress_to_fp16=False)
    core = ov.Core()
    fp32 = core.compile_model(str(source), "CPU", F32)
    int8 = core.compile_model(str(xml), "CPU", F32)
    held = feed_files(folder / "held")
    pairs = ((ov_outputs(fp32, feed), ov_outputs(int8, feed)) for feed in map(load_feed, held))
    return {"preset": preset, "quantize_seconds": round(seconds, 2), "xml": str(xml), "held": len(held),
            **sqnr_scores(pairs, ov_names(fp32))}


def child_ort(folder: Path, work: Path, args) -> dict:
    """onnxruntime's quantize_static with its defaults; scored in onnxruntime CPU against FP32 onnxruntime."""
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, files):
            self.files = iter(files)

        def get_next(self):
            path = next(self.files, None)
            return None if path is None else load_feed(path)

    out = work / "ort.qdq.onnx"
    source = scored_model(folder, work)
    start = time.perf_counter()
    quantize_static(str(source), str(out), Reader(feed_files(folder / "calib")))
    seconds = time.perf_counter() - start
    providers = ["CPUExecutionProvider"]
    fp32 = ort.InferenceSession(str(source), providers=providers)
    int8 = ort.InferenceSession(str(out), providers=providers)
    held = feed_files(folder / "held")
    pairs = ((fp32.run(None, feed), int8.run(None, feed)) for feed in map(load_feed, held))
    return {"quantize_seconds": round(seconds, 2), "held": len(held),
            **sqnr_scores(pairs, [o.name for o in fp32.get_outputs()])}


def child_latency(folder: Path, work: Path, args) -> dict:
    """Interleaved OpenVINO latency of the models given as LABEL=PATH (see the module docstring)."""
    import openvino as ov

    models = dict(item.split("=", 1) for item in args.models_ab)
    feed = load_feed(feed_files(folder / "held")[0])
    config = {**F32, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
    core = ov.Core()
    try:
        compiled = {label: core.compile_model(path, "CPU", config) for label, path in models.items()}
        static = False
    except RuntimeError:  # one compiles only at static shapes (madmom's Squeeze of dynamic rank): all at the feed's,
        compiled, static = {}, True  # as benchmark_app -shape and `qtool evaluate --runtime openvino` do
        for label, path in models.items():
            model = core.read_model(path)
            model.reshape({p.get_any_name(): list(feed[p.get_any_name()].shape) for p in model.inputs if p.get_any_name() in feed})
            compiled[label] = core.compile_model(model, "CPU", config)
    requests = {label: c.create_infer_request() for label, c in compiled.items()}
    runs = {label: _runs_per_round(request, feed, args.round_seconds) for label, request in requests.items()}
    per_round = {label: [] for label in requests}
    for r in range(args.rounds):
        for label, times in _round(requests, feed, runs, reverse=r % 2 == 1).items():
            per_round[label].append(float(np.median(times) * 1000))
    ratios = {}
    for a, b in (("qtool", "nncf"), ("qtool", "fp32"), ("nncf", "fp32")):
        if a in per_round and b in per_round:
            each = [x / y for x, y in zip(per_round[a], per_round[b])]
            ratios[f"{a}/{b}"] = {"median": num(np.median(each)), "min": num(min(each)), "max": num(max(each))}
    return {"ms": {label: num(np.median(v)) for label, v in per_round.items()},
            "rounds_ms": {label: [num(x) for x in v] for label, v in per_round.items()},
            "runs_per_round": runs, "ratios": ratios, "models": models, "static_shapes": static, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def _round(requests: dict, feed: dict, runs: dict[str, int], reverse: bool, slices: int = 10) -> dict[str, list[float]]:
    """One round: each model's runs in `slices` slices, the models taking turns slice by slice in the order
    A,B,C,C,B,A,... (starting reversed on odd rounds), so a change of the machine's load between slices falls
    on every model alike; each run's seconds per model."""
    labels = list(requests)[::-1] if reverse else list(requests)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(slices):
        for label in labels if i % 2 == 0 else labels[::-1]:
            request = requests[label]
            for _ in range(len(range(i, runs[label], slices))):  # this slice's share of the round's runs
                start = time.perf_counter()
                request.infer(feed)
                times[label].append(time.perf_counter() - start)
    return times


def _runs_per_round(request, feed, seconds: float) -> int:
    """Runs that take about `seconds` (after 5 warm-up runs), at least 10 (one per slice), at most 5000."""
    for _ in range(5):
        request.infer(feed)
    start = time.perf_counter()
    for _ in range(5):
        request.infer(feed)
    each = (time.perf_counter() - start) / 5
    return int(min(5000, max(10, round(seconds / max(each, 1e-6)))))


QTOOL_STEPS = ("calibrate", "export_openvino", "export_qdq", "export_tensorrt", "inspect", "evaluate_openvino",
               "evaluate_openvino_sim", "evaluate_qdq")
CHILD_STEPS = {"plain": child_plain, "nncf": child_nncf, "ort": child_ort, "latency": child_latency}


def child_result_name(step: str, extra) -> str:
    """The child's result file stem: the step, and the NNCF preset after --preset."""
    extra = list(extra)
    return step + (f"_{extra[extra.index('--preset') + 1]}" if "--preset" in extra else "")


def child_main(args) -> None:
    folder, work = Path(args.model_dir), Path(args.work)
    name = args.child + (f"_{args.preset}" if args.preset else "")
    result = CHILD_STEPS[args.child](folder, work, args)
    tmp = work / f"{name}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(work / f"{name}.json")


# ---------------------------------------------------------------- one model


def model_folders(zoo: Path, wanted: list[str] | None) -> list[Path]:
    if not zoo.is_dir():
        raise BenchError(f"zoo folder {zoo} does not exist (materialize it: python -m zoo_models, from bench/)")
    found = {p.name: p for p in sorted(zoo.iterdir())  # zoo_models' <name>.tmp (being written) and <name>.work are no models
             if (p / "meta.json").is_file() and not p.name.endswith((".tmp", ".work"))}
    if wanted is None:
        return list(found.values())
    missing = [w for w in wanted if w not in found]
    if missing:
        raise BenchError(f"no model folder with meta.json in {zoo} named {', '.join(missing)} (found: {', '.join(found) or 'none'})")
    return [found[w] for w in wanted]


def bench_model(folder: Path, work: Path, args, skip: set[str], save) -> dict:
    """Every step of one model (the module docstring); the row as it goes into the JSON, passed to save(row)
    after every step (an interrupted run keeps the steps it finished)."""
    meta = json.loads((folder / "meta.json").read_text())
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model, timeout = folder / "model.onnx", args.timeout
    steps: dict[str, dict] = {}
    row = {"name": folder.name, "domain": meta.get("domain", ""), "tags": meta.get("tags", []),
           "counts": meta.get("counts", {}), "steps": steps}

    def log(step: str) -> None:
        s = steps[step]
        print(f"  {folder.name} {step}: {s['status']} {s['seconds']:.1f}s {s['peak_rss_mb']:.0f} MB"
              + (f"  {s['error']}" if s["error"] else ""), file=sys.stderr, flush=True)
        save(row)

    calib_file = work / "m.calib.json"
    steps["calibrate"] = qtool_step(["calibrate", model, "--data", folder / "calib", "-o", calib_file, "-q"], timeout, work)
    log("calibrate")
    steps["plain"] = python_step("plain", folder, work, timeout)
    log("plain")
    files = {"openvino": work / "m.openvino.onnx", "qdq": work / "m.qdq.onnx", "tensorrt": work / "m.trt.onnx"}
    if steps["calibrate"]["status"] == "ok":
        for target, path in files.items():
            extra = ["--trt-version", TRT_VERSION] if target == "tensorrt" else []
            steps[f"export_{target}"] = qtool_step(["export", model, "--target", target, "--calib", calib_file, "-o", path,
                                                    "-q", *extra], timeout, work)
            log(f"export_{target}")
        if steps["export_tensorrt"]["status"] == "ok":
            steps["inspect"] = qtool_step(["inspect", files["tensorrt"], "--trt-version", TRT_VERSION, "--json"], timeout, work,
                                          parse_json=True)
            log("inspect")
        evaluate = ["evaluate", model, "--calib", calib_file, "--data", folder / "held", "--json", "-q", "--target"]
        steps["evaluate_openvino"] = qtool_step([*evaluate, "openvino", "--runtime", "openvino"], timeout, work, parse_json=True)
        log("evaluate_openvino")
        if steps["evaluate_openvino"]["status"] != "ok":  # OpenVINO could not run the file: the simulation alone
            steps["evaluate_openvino_sim"] = qtool_step([*evaluate, "openvino"], timeout, work, parse_json=True)
            log("evaluate_openvino_sim")
        steps["evaluate_qdq"] = qtool_step([*evaluate, "qdq"], timeout, work, parse_json=True)
        log("evaluate_qdq")
    peers = args.peers / folder.name  # the peers' files outlive the work folder: latency reads NNCF's
    if "nncf" not in skip:
        for preset in NNCF_PRESETS:
            steps[f"nncf_{preset}"] = peer_step("nncf", folder, peers, args, ["--preset", preset])
            log(f"nncf_{preset}")
    if "ort" not in skip:
        steps["ort"] = peer_step("ort", folder, peers, args)
        log("ort")
    if "latency" not in skip:
        ab = latency_models(model, files["openvino"], steps)
        if len(ab) > 1:  # qtool's file or NNCF's against FP32: where qtool writes none, whether NNCF's int8 pays
            steps["latency"] = python_step("latency", folder, work, timeout,
                                           ["--rounds", str(args.rounds), "--round-seconds", str(args.round_seconds),
                                            "--models-ab", *[f"{k}={v}" for k, v in ab.items()]])
            log("latency")
    return row


def peer_key(folder: Path) -> dict:
    """What a peer's (NNCF's, onnxruntime's) row depends on: the model, the feeds, the peers' versions."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256((folder / "model.onnx").read_bytes())
    for sub in ("calib", "held"):
        for f in feed_files(folder / sub):
            digest.update(f"{sub}/{f.name}".encode())
            digest.update(f.read_bytes())
    versions = {}
    for pkg in ("openvino", "onnxruntime", "nncf"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {"inputs_sha256": digest.hexdigest(), **versions}


def peer_step(name: str, folder: Path, peers: Path, args, extra: list[str] = ()) -> dict:
    """A peer's step run in its own folder under --peers; with --reuse-peers, its earlier step when the model, the
    feeds and the peers' versions are those it ran on (qtool's code does not enter a peer's figures)."""
    record = peers / f"{child_result_name(name, extra)}.step.json"
    key = peer_key(folder)
    if args.reuse_peers and record.exists():
        saved = json.loads(record.read_text())
        if saved.get("key") == key and saved["step"]["status"] == "ok":
            return {**saved["step"], "reused": saved.get("date")}
    peers.mkdir(parents=True, exist_ok=True)
    step = python_step(name, folder, peers, args.timeout, extra)
    record.write_text(json.dumps({"key": key, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                  "step": step}, indent=1))
    return step


def latency_models(model: Path, openvino_file: Path, steps: dict) -> dict[str, str]:
    """LABEL -> file for the latency step: qtool's openvino export (when written), NNCF's better preset, FP32."""
    ab = {}
    if steps.get("export_openvino", {}).get("status") == "ok":
        ab["qtool"] = str(openvino_file)
    best = best_nncf(steps)
    if best is not None:
        ab["nncf"] = steps[f"nncf_{best}"]["result"]["xml"]
    ab["fp32"] = str(model)
    return ab


def best_nncf(steps: dict) -> str | None:
    """The NNCF preset of the higher worst-output SQNR (NaN counts as lowest), None when neither ran."""
    scored = []
    for preset in NNCF_PRESETS:
        result = (steps.get(f"nncf_{preset}") or {}).get("result")
        if result is not None:
            value = unnum(result["sqnr_db"])
            scored.append((-math.inf if math.isnan(value) else value, preset))
    return max(scored)[1] if scored else None


# ---------------------------------------------------------------- the row's figures


def result(steps: dict, step: str) -> dict | None:
    return (steps.get(step) or {}).get("result")


def ok_result(steps: dict, step: str) -> dict | None:
    """The step's parsed output when it exited 0."""
    return result(steps, step) if (steps.get(step) or {}).get("status") == "ok" else None


def figures(row: dict) -> dict:
    """The table's numbers for one row (None where the step did not run or failed)."""
    steps = row["steps"]
    calib, plain = steps.get("calibrate", {}), steps.get("plain", {})
    ov, ov_sim, qdq = (ok_result(steps, s) for s in ("evaluate_openvino", "evaluate_openvino_sim", "evaluate_qdq"))
    sim = unnum((ov or ov_sim)["sqnr_db"]) if ov or ov_sim else None
    run = unnum(ov["runtime"]["sqnr_db"]) if ov and ov.get("runtime") else None
    nncf = {p: unnum(r["sqnr_db"]) if (r := result(steps, f"nncf_{p}")) else None for p in NNCF_PRESETS}
    best = best_nncf(steps)
    best_db = nncf[best] if best else None
    ort = result(steps, "ort")
    lat = (result(steps, "latency") or {}).get("ratios", {})
    rss_ratio = None
    if calib.get("status") == "ok" and plain.get("status") == "ok" and plain.get("peak_rss_mb"):
        rss_ratio = calib["peak_rss_mb"] / plain["peak_rss_mb"]
    return {
        "calibrate": calib.get("status"), "calibrate_s": calib.get("seconds"), "rss_ratio": rss_ratio,
        "sim": sim, "run": run, "gap": None if sim is None or run is None else run - sim,
        "qdq_sim": unnum(qdq["sqnr_db"]) if qdq else None,
        "nncf_default": nncf["default"], "nncf_transformer": nncf["transformer"], "nncf_best": best,
        "lead": None if run is None or best_db is None else run - best_db,
        "ort": unnum(ort["sqnr_db"]) if ort else None,
        "lat_q_nncf": unnum(lat["qtool/nncf"]["median"]) if "qtool/nncf" in lat else None,
        "lat_q_nncf_range": (unnum(lat["qtool/nncf"]["min"]), unnum(lat["qtool/nncf"]["max"])) if "qtool/nncf" in lat else None,
        "lat_q_fp32": unnum(lat["qtool/fp32"]["median"]) if "qtool/fp32" in lat else None,
    }


# ---------------------------------------------------------------- printing


def fmt(value, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}{suffix}"


def step_cell(steps: dict, step: str) -> str:
    """A step's status, or its failure; '-' when it did not run."""
    s = steps.get(step)
    return "-" if s is None else s["status"]


def inspect_cell(steps: dict) -> str:
    s = steps.get("inspect")
    if s is None:
        return "-"
    if s["status"] == "ok":
        return "ok"
    rules = _broken_rules(s.get("result"))
    return f"{len(rules)} broken: {', '.join(sorted(set(rules)))}" if s["status"] == "exit(1)" and rules else s["status"]


def _broken_rules(report) -> list[str]:
    """The rule of each violation `qtool inspect --trt-version --json` lists (none when it is not that JSON)."""
    violations = report.get("violations") if isinstance(report, dict) else None
    return [str(v.get("rule")) for v in violations if isinstance(v, dict)] if isinstance(violations, list) else []


def stepped(value, steps: dict, step: str, digits: int = 1, suffix: str = "") -> str:
    """A figure, or the failed step's status where it has none."""
    if value is not None:
        return fmt(value, digits, suffix)
    s = steps.get(step)
    return "-" if s is None or s["status"] == "ok" else s["status"]


HEADER = ("model", "domain/tags", "calibrate (s, RSS x plain)", "exports o/q/t", "inspect TRT", "qtool sim dB",
          "qtool OV run dB", "run-sim", "NNCF default dB", "NNCF transformer dB", "best NNCF - qtool",
          "ORT quantize_static dB", "latency qtool/NNCF (rounds' range)", "int8/FP32")


def table_row(row: dict) -> list[str]:
    steps, f = row["steps"], figures(row)
    calib = f["calibrate"] or "-"
    if calib == "ok":
        calib = f"ok {fmt(f['calibrate_s'])}s {fmt(f['rss_ratio'], 2, 'x')}"
    exports = "/".join(step_cell(steps, f"export_{t}") for t in ("openvino", "qdq", "tensorrt"))
    tags = ", ".join([row.get("domain") or "?", *row.get("tags", [])])
    name = row["name"] + ("" if row.get("run", {}).get("complete", True) else " (partial)")
    return [name, tags, calib, exports, inspect_cell(steps),
            stepped(f["sim"], steps, "evaluate_openvino_sim"), stepped(f["run"], steps, "evaluate_openvino"),
            fmt(f["gap"], 2), stepped(f["nncf_default"], steps, "nncf_default"),
            stepped(f["nncf_transformer"], steps, "nncf_transformer"),
            fmt(None if f["lead"] is None else -f["lead"], 2), stepped(f["ort"], steps, "ort"),
            stepped(f["lat_q_nncf"], steps, "latency", 2) + _range(f["lat_q_nncf_range"]),
            stepped(f["lat_q_fp32"], steps, "latency", 2)]


def _range(span) -> str:
    return "" if span is None else f" ({fmt(span[0], 2)}-{fmt(span[1], 2)})"


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def summary(results: dict) -> list[str]:
    rows = list(results.values())
    figs = {r["name"]: figures(r) for r in rows}
    crashed, refused, others = [], [], []
    for r in rows:
        for step, s in r["steps"].items():
            line = f"{r['name']} {step}: {s['status']} {s['error']}"
            if step not in QTOOL_STEPS and s["status"] != "ok":
                others.append(line)
            elif s["status"] == "exit(1)":
                refused.append(line)
            elif s["status"] != "ok":
                crashed.append(line)
    leads = [f["lead"] for f in figs.values() if f["lead"] is not None and not math.isnan(f["lead"])]
    gaps = sorted(n for n, f in figs.items() if f["gap"] is not None and abs(f["gap"]) > 1)
    out = [f"models: {len(rows)}",
           f"qtool failures (not exit 0/1: crashes, aborts, timeouts, internal errors): {len(crashed)}" + "".join(f"\n  - {c}" for c in crashed),
           f"qtool exit 1 (refused the input, or a check failed): {len(refused)}" + "".join(f"\n  - {c}" for c in refused),
           f"failures of the others (plain onnxruntime, NNCF, quantize_static, latency): {len(others)}"
           + "".join(f"\n  - {c}" for c in others),
           f"median lead of qtool (OpenVINO run) over the better NNCF preset: {fmt(np.median(leads) if leads else None, 2)} dB"
           f" over {len(leads)} models",
           f"qtool within 0.5 dB of the better NNCF preset or ahead: {sum(x >= -0.5 for x in leads)} of {len(leads)}",
           f"|OpenVINO run - simulation| > 1 dB: {len(gaps)}" + (f" ({', '.join(gaps)})" if gaps else "")]
    for key, label in (("lat_q_nncf", "qtool/NNCF"), ("lat_q_fp32", "qtool int8/FP32")):
        ratios = [f[key] for f in figs.values() if f[key] is not None and f[key] > 0]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        out.append(f"geometric-mean latency {label}: {fmt(gm, 3)} over {len(ratios)} models")
    return out


# ---------------------------------------------------------------- machine and results file


def machine() -> dict:
    """The CPU (model, cores, int8/bf16 flags), versions, the qtool the children import, date."""
    from importlib.metadata import PackageNotFoundError, version

    cpu, flags = "", set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        cpu = next((x.split(":", 1)[1].strip() for x in text.splitlines() if x.startswith("model name")), "")
        flags = set(next((x.split(":", 1)[1].split() for x in text.splitlines() if x.startswith("flags")), []))
    except OSError:
        pass
    versions = {}
    for pkg in ("openvino", "onnxruntime", "nncf", "onnx", "numpy"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    return {"cpu": cpu, "cores": os.cpu_count(),
            "flags": sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}),
            "vnni": bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}), "bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
            "qtool": git_commit(), "qtool_tree": qtool_tree(), "qtool_imported_from": imported_qtool(), "python": sys.version.split()[0], **versions,
            "loadavg": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def git(*args) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False).stdout.strip()


def git_commit() -> str:
    """HEAD, "-dirty" when qtool/ has uncommitted changes."""
    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", "qtool") else "")


def qtool_tree() -> str:
    """The git tree of qtool/ (what the rows depend on; bench-only commits leave it), "-dirty" as git_commit."""
    return (git("rev-parse", "--short=12", "HEAD:qtool") or "unknown") + ("-dirty" if git_commit().endswith("-dirty") else "")


def imported_qtool() -> str:
    step = run_child([sys.executable, "-c", "import qtool; print(qtool.__file__)"], 120, REPO)
    return step["stdout"].strip() if step["status"] == "ok" else f"import failed: {step['error']}"


def load_results(path: Path) -> dict:
    if not path.exists():
        return {"machine": None, "models": {}}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data.get("models"), dict):
            raise ValueError("no 'models' object")
        return data
    except (ValueError, AttributeError) as exc:
        raise BenchError(f"{path} is not a zoo results file ({exc}); move it away or pass another --out") from None


def save_results(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def print_report(data: dict) -> None:
    m = data["machine"] or {}
    print(f"# qtool zoo bench, {m.get('date')}")
    print(f"CPU: {m.get('cpu')} ({m.get('cores')} cores; vnni={m.get('vnni')}, bf16={m.get('bf16')}; {' '.join(m.get('flags', []))});"
          f" load average at the start {m.get('loadavg')}")
    print(f"qtool {m.get('qtool')} (children import {m.get('qtool_imported_from')}), openvino {m.get('openvino')}, "
          f"onnxruntime {m.get('onnxruntime')}, nncf {m.get('nncf')}, onnx {m.get('onnx')}, numpy {m.get('numpy')}, "
          f"python {m.get('python')}")
    models = data["models"]
    older = [f"{n} ({r['run']['qtool']}, {r['run']['date']})" for n, r in sorted(models.items())
             if r.get("run", {}).get("qtool_tree") != m.get("qtool_tree")]
    if older:
        print(f"rows measured with another qtool/ tree (commit, date): {', '.join(older)}")
    print()
    print(markdown([table_row(models[n]) for n in sorted(models)]))
    print()
    print("\n".join(summary(models)))


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--zoo", type=Path, default=ZOO, help=f"zoo folder [default: {ZOO}]")
    ap.add_argument("--models", help="comma-separated model folder names [default: every folder holding meta.json]")
    ap.add_argument("--skip", default="", help=f"comma-separated costly steps to skip: {', '.join(COSTLY)}")
    ap.add_argument("--out", type=Path, help="results JSON, merged with its rows of other models [default: <zoo>/results.json]")
    ap.add_argument("--work", type=Path, default=WORK, help=f"scratch folder (one subfolder per model) [default: {WORK}]")
    ap.add_argument("--peers", type=Path, default=PEERS,
                    help=f"NNCF's and onnxruntime's files and rows, one subfolder per model [default: {PEERS}]")
    ap.add_argument("--reuse-peers", action="store_true",
                    help="take NNCF's and onnxruntime's rows from --peers where the model, feeds and versions match")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per step before its process tree is killed")
    ap.add_argument("--rounds", type=int, default=5, help="latency rounds")
    ap.add_argument("--round-seconds", type=float, default=0.5, help="latency: seconds each model runs per round")
    ap.add_argument("--materialize", action="store_true",
                    help="first lay out the zoo entries (python -m zoo_models, in a child; into the default zoo)")
    ap.add_argument("--table-only", action="store_true", help="print the table of --out without running anything")
    # the child side of python_step
    ap.add_argument("--child", choices=sorted(CHILD_STEPS), help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--preset", choices=NNCF_PRESETS, help=argparse.SUPPRESS)
    ap.add_argument("--models-ab", nargs="+", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def run(args) -> None:
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(COSTLY):
        raise BenchError(f"--skip takes {', '.join(COSTLY)}, not {', '.join(sorted(skip - set(COSTLY)))}")
    if args.rounds < 1 or args.round_seconds <= 0 or args.timeout <= 0:
        raise BenchError("--rounds, --round-seconds and --timeout must be positive")
    out = args.out or args.zoo / "results.json"
    data = load_results(out)
    if args.table_only:
        print_report(data)
        return
    wanted = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    if args.materialize:
        step = run_child([sys.executable, "-m", "zoo_models", *(wanted or [])], args.timeout * 4, HERE)
        print(f"materialize: {step['status']} {step['error']}", file=sys.stderr, flush=True)
    folders = model_folders(args.zoo, wanted)
    data["machine"] = machine()
    for folder in folders:
        print(f"{folder.name} ...", file=sys.stderr, flush=True)
        run_info = {"qtool": data["machine"]["qtool"], "qtool_tree": data["machine"]["qtool_tree"],
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "skipped": sorted(skip), "complete": False}

        def save(row, name=folder.name, run_info=run_info):
            data["models"][name] = {**row, "run": run_info}
            save_results(out, data)

        row = bench_model(folder, args.work / folder.name, args, skip, save)
        run_info["complete"] = True
        save(row)
    print_report(data)
    print(f"\nresults: {out}", file=sys.stderr)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return
    try:
        run(args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
