"""Time and peak memory of qtool's commands on BERT encoders of 1.3 GB and ~3 GB, next to onnxruntime and NNCF.

The models: transformers' BertModel(BertConfig(...)) with random weights (seed 0), eager attention, inputs
input_ids and attention_mask int64 [1, 128], outputs last_hidden_state and pooler_output, exported with
torch's TorchScript exporter at opset 17 in the bench venv (~/.cache/qtool-bench/transformers-venv: torch,
transformers, onnx), once, cached in ~/.cache/qtool-bench/big/<name>/model.onnx:
  - large: BERT-large (24 layers, hidden 1024, 16 heads, MLP 4096): 335 M parameters, 1.34 GB, one file;
  - xl: 36 layers, hidden 1280, 20 heads, MLP 5120: 748 M parameters, 2.99 GB; past protobuf's 2 GiB, so
    torch writes the weights as external data (one file per tensor beside model.onnx).
The inputs: --inputs (default 32) text-like .npz files (qtool calibrate --data's format): [CLS], token ids
drawn from a Zipf law over the vocabulary, [SEP], then padding (attention mask 0) to 128; lengths 16 to 128.

For each model it runs, one after the other, each as its own process (as a user runs them), and prints its
wall time and the peak memory of its whole process tree (qtool calibrate's helper processes included):
  - onnxruntime: load the model and run every input (one session, default options);
  - qtool calibrate --data; qtool export --target openvino, qdq and tensorrt (defaults); with --commands
    ...,tensorrt-fp32 also --target tensorrt --high-precision fp32 (FP32 weights: as big as the model, so
    past 2 GiB it is written with external data);
  - NNCF: ov.Core().read_model, nncf.quantize(model_type=TRANSFORMER, subset_size=all inputs), ov.save_model
    (an IR, weights int8);
and the ratios: calibrate's time over onnxruntime's, each peak over the model's size (.onnx + external
data), calibrate + OpenVINO export over NNCF. With --check, each export is then run (OpenVINO for the
OpenVINO file, onnxruntime for the QDQ and TensorRT files; outputs must be finite) and the QDQ and TensorRT
files go through onnx.checker by path (external data checked too).

Peak memory: the process tree's proportional set size (Pss, /proc/PID/smaps_rollup: a page shared by k
processes counts 1/k in each, so a mapped model file or a shared library counts once), summed over the
command's process and every descendant alive at the sample, sampled every --interval seconds (default 0.05).
`/usr/bin/time -v` is no substitute: its "Maximum resident set size" is getrusage's ru_maxrss, the largest
single process's peak, never a sum over a tree (--verify-time shows it on a parent and a child that each
hold 300 MB).

With --stacks, each qtool command runs under a sampler thread (STACKS) that reads the main process's resident set
every --interval seconds with the main thread's Python stack, and the peak is printed with qtool's frames at that
moment: where a peak is (session 18 found the OpenVINO export's so: docs/benchmarks.md #big18). The sampler adds
its own few MB and a little time; the peaks of the table are still the process tree's Pss.

nncf is a bench-only dependency (it is in the dev venv), torch and transformers live only in the bench venv.
Usage: python bench/big_models.py [--models large,xl] [--inputs 32] [--commands ort,calibrate,openvino,qdq,tensorrt,nncf]
                                  [--check] [--keep] [--work DIR] [--verify-time] [--stacks]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "qtool-bench"
VENV_PYTHON = CACHE / "transformers-venv" / "bin" / "python"
WORK = Path(tempfile.gettempdir()) / "qtool-bench" / "big_models"
SEQ = 128
# name: BertConfig arguments
MODELS = {
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    "xl": dict(hidden_size=1280, num_hidden_layers=36, num_attention_heads=20, intermediate_size=5120),
}
COMMANDS = ("ort", "calibrate", "openvino", "qdq", "tensorrt", "nncf", "tensorrt-fp32")
DEFAULT_COMMANDS = COMMANDS[:-1]
CLS, SEP, VOCAB = 101, 102, 30522


# ---------------------------------------------------------------- the models (bench venv)


def make_model(name: str, folder: Path) -> None:
    """Export BertModel(BertConfig(**MODELS[name])) with random weights to folder/model.onnx (runs in the bench venv)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(**MODELS[name], vocab_size=VOCAB, attn_implementation="eager")).eval()

    class Encoder(torch.nn.Module):  # keywords: the tracer's positional call trips transformers' decorators
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    ids = torch.full((1, SEQ), CLS, dtype=torch.int64)
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with torch.no_grad():
        torch.onnx.export(Encoder().eval(), (ids, torch.ones_like(ids)), str(staging / "model.onnx"), opset_version=17, dynamo=False,
                          input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state", "pooler_output"])
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def model_path(name: str) -> Path:
    folder = CACHE / "big" / name
    path = folder / "model.onnx"
    if not path.exists():
        if not VENV_PYTHON.exists():
            sys.exit(f"{VENV_PYTHON} is missing: create the bench venv (torch==2.13.0 CPU wheel, transformers, onnx)")
        print(f"exporting {name} with torch into {folder} ...", flush=True)
        subprocess.run([str(VENV_PYTHON), __file__, "--make", name, str(folder)], check=True)
    return path


def model_bytes(path: Path) -> int:
    """The .onnx file and every file beside it that it refers to as external data."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    locations = {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}
    return path.stat().st_size + sum((path.parent / loc).stat().st_size for loc in locations)


def make_inputs(folder: Path, count: int, seed: int = 0) -> Path:
    """`count` text-like inputs: [CLS] Zipf-distributed token ids [SEP], padded to SEQ (mask 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, VOCAB - 999, dtype=np.float64)
    p = 1 / ranks
    p /= p.sum()
    for i in range(count):
        n = int(rng.integers(16, SEQ + 1))
        ids = np.zeros((1, SEQ), np.int64)
        ids[0, 0], ids[0, n - 1] = CLS, SEP
        ids[0, 1:n - 1] = 1000 + rng.choice(len(ranks), size=n - 2, p=p)
        mask = np.zeros((1, SEQ), np.int64)
        mask[0, :n] = 1
        np.savez(folder / f"{i:04d}.npz", input_ids=ids, attention_mask=mask)
    return folder


# ---------------------------------------------------------------- measuring a process tree


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # the name may hold spaces and parentheses
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(root: int) -> tuple[int, int]:
    """(Pss summed over `root` and its descendants, number of processes)."""
    kids = _children()
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, ()))
    return sum(_pss(p) for p in seen), len(seen)


def measure(cmd: list[str], cwd: Path, interval: float, env=None) -> dict:
    """Run `cmd`; its wall time, the peak of its process tree's Pss and the most processes seen at once."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, most = [0], [1]
    done = threading.Event()

    def sample():
        while not done.is_set():
            pss, n = tree_pss(proc.pid)
            peak[0], most[0] = max(peak[0], pss), max(most[0], n)
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    return {"wall": wall, "peak": peak[0], "processes": most[0], "rc": proc.returncode, "stdout": out, "stderr": err}


def verify_time(interval: float) -> None:
    """What `/usr/bin/time -v` and this sampler report for a parent and a child each holding 300 MB."""
    script = textwrap.dedent("""
        import subprocess, sys, time
        hold = bytearray(300 << 20)
        for i in range(0, len(hold), 4096): hold[i] = 1
        child = subprocess.Popen([sys.executable, "-c", "h = bytearray(300 << 20)\\nfor i in range(0, len(h), 4096): h[i] = 1\\n"
                                  "import time; time.sleep(1.5)"])
        child.wait()
    """)
    timed = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", script], capture_output=True, text=True)
    line = next((x.strip() for x in timed.stderr.splitlines() if "Maximum resident" in x), "no /usr/bin/time output")
    ours = measure([sys.executable, "-c", script], Path.cwd(), interval)
    print(f"parent 300 MB + child 300 MB at once: /usr/bin/time -v: {line}; this sampler: {ours['peak'] / 2**20:.0f} MiB "
          f"over {ours['processes']} processes")


# ---------------------------------------------------------------- the commands


NNCF = """
import sys, glob, numpy as np, nncf, openvino as ov
model = ov.Core().read_model(sys.argv[1])
data = [dict(np.load(p)) for p in sorted(glob.glob(sys.argv[2] + "/*.npz"))]
q = nncf.quantize(model, nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(data))
ov.save_model(q, sys.argv[3])
"""

ORT = """
import sys, glob, numpy as np, onnxruntime as ort
s = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
for p in sorted(glob.glob(sys.argv[2] + "/*.npz")):
    s.run(None, dict(np.load(p)))
"""

CHECK_OV = """
import sys, glob, numpy as np, openvino as ov
c = ov.Core().compile_model(sys.argv[1], "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
for p in sorted(glob.glob(sys.argv[2] + "/*.npz"))[:2]:
    outs = c(dict(np.load(p)))
    assert all(np.isfinite(v).all() for v in outs.values()), "non-finite output"
print("OpenVINO runs it, outputs finite")
"""

CHECK_ORT = """
import sys, glob, numpy as np, onnx, onnxruntime as ort
onnx.checker.check_model(sys.argv[1])  # by path: external data checked too
o = ort.SessionOptions(); o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
for p in sorted(glob.glob(sys.argv[2] + "/*.npz"))[:2]:
    assert all(np.isfinite(v).all() for v in s.run(None, dict(np.load(p)))), "non-finite output"
print("onnx.checker passes, onnxruntime runs it, outputs finite")
"""


# qtool's command line (argv[2:]) with a thread sampling the resident set (statm) and the main thread's stack every
# argv[1] seconds; at the end, the peak and the stack then go to stderr's last lines, after a "PEAK" line.
STACKS = """
import os, sys, threading, time
interval, page, main_thread = float(sys.argv[1]), os.sysconf("SC_PAGE_SIZE"), threading.get_ident()
peak, started, done = [0, 0.0, []], time.perf_counter(), threading.Event()
def sample():
    while not done.is_set():
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * page
        if rss > peak[0]:
            # names only, and no frame held after: a frame kept past its return keeps its locals (a memoryview of a
            # mapped model: qtool's mmap.close() then fails, "cannot close exported pointers exist")
            frame, stack = sys._current_frames().get(main_thread), []
            while frame is not None:
                stack.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
                frame = frame.f_back
            peak[:] = rss, time.perf_counter() - started, stack[::-1]
        done.wait(interval)
threading.Thread(target=sample, daemon=True).start()
sys.argv = ["qtool"] + sys.argv[2:]
try:
    from qtool.cli import main
    main()
finally:
    done.set()
    ours = [k for k, (path, _, _) in enumerate(peak[2]) if "/qtool/" in path]
    frames = [f"{path[path.rindex('/qtool/') + 1:] if k in ours else os.path.basename(path)}:{line} {name}"
              for k, (path, line, name) in enumerate(peak[2])]
    shown = frames[ours[0] + 2:] if ours else frames  # from below qtool's command line
    sys.stderr.write(f"PEAK {peak[0] / 1e9:.2f} GB resident at {peak[1]:.1f} s in\\n  " + "\\n  ".join(shown[-10:]) + "\\n")
"""


def commands(path: Path, data: Path, work: Path, stacks: float | None = None) -> dict[str, list[str]]:
    py = sys.executable
    qtool = [py, "-m", "qtool", "-q"] if stacks is None else [py, "-c", STACKS, str(stacks), "-q"]
    calib = str(work / "model.calib.json")
    return {
        "ort": [py, "-c", ORT, str(path), str(data)],
        "calibrate": qtool + ["calibrate", str(path), "--data", str(data), "-o", calib],
        "openvino": qtool + ["export", str(path), "--calib", calib, "--target", "openvino", "-o", str(work / "model.openvino.onnx")],
        "qdq": qtool + ["export", str(path), "--calib", calib, "--target", "qdq", "-o", str(work / "model.qdq.onnx")],
        "tensorrt": qtool + ["export", str(path), "--calib", calib, "--target", "tensorrt", "-o", str(work / "model.trt.onnx")],
        # FP32 weights (Q/DQ pairs): an export as big as its model, with external data past 2 GiB
        "tensorrt-fp32": qtool + ["export", str(path), "--calib", calib, "--target", "tensorrt", "--high-precision", "fp32",
                                  "-o", str(work / "model.trt32.onnx")],
        "nncf": [py, "-c", NNCF, str(path), str(data), str(work / "nncf" / "model.xml")],
    }


def written(work: Path, command: str) -> int:
    """Bytes of what a command wrote (its file and any external data beside it)."""
    names = {"openvino": "model.openvino", "qdq": "model.qdq", "tensorrt": "model.trt", "calibrate": "model.calib",
             "tensorrt-fp32": "model.trt32"}
    if command == "nncf":
        return sum(f.stat().st_size for f in (work / "nncf").glob("model.*"))
    if command not in names:
        return 0
    return sum(f.stat().st_size for f in work.iterdir() if f.name.startswith(names[command] + "."))


def run_model(name: str, args) -> None:
    path = model_path(name)
    size = model_bytes(path)
    work = args.work / name
    shutil.rmtree(work, ignore_errors=True)
    (work / "nncf").mkdir(parents=True)
    data = make_inputs(work / "data", args.inputs)
    cmds = commands(path, data, work, args.interval if args.stacks else None)
    print(f"\n{name}: {path} ({size / 1e9:.2f} GB, {args.inputs} inputs [1, {SEQ}])", flush=True)
    print(f"{'command':<10} {'wall s':>8} {'peak GB':>8} {'peak/model':>10} {'procs':>5} {'written MB':>10}", flush=True)
    results = {}
    for c in args.commands:
        r = measure(cmds[c], work, args.interval)
        results[c] = r
        said = r["stderr"][:r["stderr"].rindex("PEAK ")] if args.stacks and "PEAK " in r["stderr"] else r["stderr"]
        status = "" if r["rc"] == 0 else f"  FAILED (exit {r['rc']}): {said.strip().splitlines()[-1] if said.strip() else ''}"
        print(f"{c:<10} {r['wall']:8.1f} {r['peak'] / 1e9:8.2f} {r['peak'] / size:10.2f} {r['processes']:5d} "
              f"{written(work, c) / 1e6:10.1f}{status}", flush=True)
        if args.stacks and "PEAK " in r["stderr"]:
            print("  " + r["stderr"][r["stderr"].rindex("PEAK "):].rstrip().replace("\n", "\n  "), flush=True)
    ok = {c: r for c, r in results.items() if r["rc"] == 0}
    if "ort" in ok and "calibrate" in ok:
        print(f"calibrate / onnxruntime time: {ok['calibrate']['wall'] / ok['ort']['wall']:.2f}")
    if {"calibrate", "openvino", "nncf"} <= ok.keys():
        both = ok["calibrate"]["wall"] + ok["openvino"]["wall"]
        print(f"calibrate + openvino export / NNCF time: {both / ok['nncf']['wall']:.2f}")
    qtool_peaks = [r["peak"] for c, r in ok.items() if c in ("calibrate", "openvino", "qdq", "tensorrt")]
    if qtool_peaks:
        print(f"largest qtool peak / model size: {max(qtool_peaks) / size:.2f}")
    if args.check:
        checks = {"openvino": CHECK_OV, "qdq": CHECK_ORT, "tensorrt": CHECK_ORT, "tensorrt-fp32": CHECK_ORT}
        files = {"openvino": "model.openvino.onnx", "qdq": "model.qdq.onnx", "tensorrt": "model.trt.onnx",
                 "tensorrt-fp32": "model.trt32.onnx"}
        for c, script in checks.items():
            if c in ok:
                r = subprocess.run([sys.executable, "-c", script, str(work / files[c]), str(data)], capture_output=True, text=True)
                said = r.stdout.strip() if r.returncode == 0 else "FAILED: " + (r.stderr.strip().splitlines() or ["?"])[-1]
                extra = " (external data: " + ", ".join(sorted(f.name for f in work.glob(files[c] + ".data"))) + ")" \
                    if (work / (files[c] + ".data")).exists() else ""
                print(f"check {c}: {said}{extra}", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"model": name, "bytes": size, **{c: {k: r[k] for k in ("wall", "peak", "processes", "rc")}
                                                                    for c, r in results.items()}}) + "\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="large,xl")
    ap.add_argument("--inputs", type=int, default=32)
    ap.add_argument("--commands", default=",".join(DEFAULT_COMMANDS), help=f"any of {', '.join(COMMANDS)}")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between memory samples")
    ap.add_argument("--check", action="store_true", help="run each export and onnx.checker on the Q/DQ files")
    ap.add_argument("--keep", action="store_true", help="keep the outputs in --work")
    ap.add_argument("--work", type=Path, default=WORK)
    ap.add_argument("--json", help="append one JSON line per model to this file")
    ap.add_argument("--verify-time", action="store_true", help="compare /usr/bin/time -v with this sampler, then stop")
    ap.add_argument("--stacks", action="store_true", help="print each qtool command's resident peak with its Python stack then")
    ap.add_argument("--make", nargs=2, metavar=("NAME", "FOLDER"), help=argparse.SUPPRESS)  # in the bench venv
    args = ap.parse_args()
    if args.make:
        make_model(args.make[0], Path(args.make[1]))
        return
    if args.verify_time:
        verify_time(args.interval)
        return
    args.commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = set(args.commands) - set(COMMANDS)
    if unknown:
        sys.exit(f"unknown commands {sorted(unknown)}; choose among {', '.join(COMMANDS)}")
    for name in args.models.split(","):
        run_model(name.strip(), args)


if __name__ == "__main__":
    main()
