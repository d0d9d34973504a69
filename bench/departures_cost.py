"""What `qtool evaluate --runtime openvino`'s departures pass costs beside the simulation alone, on one exported file.

The departures pass (qtool.checks.evaluation.departures) runs when OpenVINO's run of a file is more than 1 dB from
evaluate's simulation: it names the quantized layers where the run leaves the file's arithmetic. Each step below runs
in a child process of its own (wall time, peak RSS from os.wait4), with the qtool of --qtool (default: this checkout)
first on PYTHONPATH:

  simulation  `qtool evaluate FILE --data HELD --target openvino --json`: the FP32 model and the file's exact
              simulation over the held-out inputs (what every evaluate does);
  departures  departures(...) alone on the same inputs (no FP32 run: it compares OpenVINO's run with the simulation
              at every quantized layer's output): the layers it names, with their dB.

Prints one line per step and the departures pass's ratios to the simulation alone (time, peak RSS), measured in this
run. Run it before and after a change to the departures pass (--qtool another checkout) on the same machine: the
layers named must be the same.

Usage: python bench/departures_cost.py FILE HELD_DIR [--qtool DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import glob, json, sys, time
import numpy as np
from types import SimpleNamespace
from qtool.checks import evaluation
file, held = sys.argv[1], sys.argv[2]

class Feeds:  # the held-out inputs, as evaluate's reference gives them to departures (feeds only)
    def feeds(self):
        for f in sorted(glob.glob(held + "/*.npz")):
            with np.load(f) as z:
                yield {k: z[k] for k in z.files}

start = time.perf_counter()
found = evaluation.departures(Feeds(), open(file, "rb").read(), "openvino", SimpleNamespace(static=""))
print(json.dumps({"seconds": time.perf_counter() - start, "departures": [d.to_json() for d in found]}))
"""


def measured(cmd: list[str], qtool: str) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MB, stdout) of `cmd` in a child process (os.wait4's maxrss of that child alone)."""
    env = dict(os.environ, PYTHONPATH=qtool + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out_path = f"/tmp/departures_cost.{os.getpid()}.out"
    start = time.perf_counter()
    with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=qtool)  # its qtool, not the one in the cwd
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    text, errs = open(out_path).read(), open(out_path + ".err").read()
    os.remove(out_path), os.remove(out_path + ".err")
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: {' '.join(cmd[:4])} ... exited {os.waitstatus_to_exitcode(status)}: "
                 f"{errs.strip().splitlines()[-1] if errs.strip() else ''}")
    return wall, usage.ru_maxrss / 1024, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("held")
    ap.add_argument("--qtool", default=HERE, help="the checkout whose qtool runs (default: this one)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    sim_s, sim_mb, _ = measured([sys.executable, "-m", "qtool", "evaluate", a.file, "--data", a.held, "--target", "openvino",
                                 "--json", "-q"], a.qtool)
    dep_s, dep_mb, text = measured([sys.executable, "-c", CHILD, a.file, a.held], a.qtool)
    found = json.loads(text.strip().splitlines()[-1])
    print(f"qtool: {a.qtool}")
    print(f"simulation alone: {sim_s:8.1f} s {sim_mb:8.0f} MB peak")
    print(f"departures pass:  {dep_s:8.1f} s {dep_mb:8.0f} MB peak  ({dep_s / sim_s:.2f}x the time, {dep_mb / sim_mb:.2f}x the peak)")
    for d in found["departures"]:
        print(f"  {d['layer']}: {d['upstream_sqnr_db']} -> {d['sqnr_db']} dB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"qtool": a.qtool, "simulation": [sim_s, sim_mb], "departures": [dep_s, dep_mb], "named": found["departures"]}, f, indent=1)


if __name__ == "__main__":
    main()
