"""`auto` or max |x| per range group, by the output error of ONE export build (session 15, helper fid15).

Per zoo model: calibrate on calib/ (or reuse --work's file), export for OpenVINO once, and simulate that one file
(qtool.checks.simulate: the FakeQuantize arithmetic as float ops) with the range initializers of the candidate groups
made inputs of one onnxruntime session, so that each variant is a feed, not a build. A candidate group is an
activation quantizer (with the tensors it shares its range with) whose exported range clips the group's calibrated
[min, max] by more than --stretch (the ratio max |x| / threshold): its "max" variant is its FakeQuantize range
multiplied by that ratio (zero point and grid shape kept: both ends scaled). Each group is switched alone on the
chosen calibration inputs; a group whose switch raises the worst output's SQNR by more than --margin dB is chosen,
and all chosen groups are switched together. Decided on the first half, the second half and all calibration inputs
(the decision's stability across input subsets); scored on the held-out inputs by the simulation and by OpenVINO's
run of the file with the chosen groups' ranges written in.

Sums in float64 per input, added with math.fsum in the order of the inputs' file names: the decision does not
depend on the order inputs arrive in.

  python bench/tails_choice.py --zoo DIR --models a,b [--work DIR] [--out FILE.json] [--margin 0.05] [--stretch 1.02]

--rule P1,P2,... (session 16, helper fid16): no switching; the OpenVINO export built once per value of
qtool.statistics.thresholds.TYPICAL_PEAK (the input-free stretch at export; "off" for none, 0 for every clipping
group), each file simulated on the calibration and held-out inputs and run by OpenVINO on the held-out ones.

  python bench/tails_choice.py --zoo DIR --models a,b --rule off,0.5,0 [--work DIR] [--out FILE.json]

A value P:E (session 17, helper fid17) also sets qtool.statistics.thresholds.EXTREME to E (a group whose calibrated max
|x| is beyond E x its typical peak keeps its clipped range; "inf" for none kept, the default without ":E" too).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import qtool.api as api
from qtool import calibration, model
from qtool.checks import evaluation, simulate
from qtool.runtime import onnxruntime
from qtool.targets import options_for


def feeds(folder: Path) -> list[dict]:
    return [dict(np.load(p)) for p in sorted(folder.glob("*.npz"))]


def float_outputs(proto) -> list[str]:
    return [o.name for o in proto.graph.output if o.type.tensor_type.elem_type in (1, 10, 11)]


def sums(ref: list[np.ndarray], out: list[np.ndarray]) -> list[tuple[float, float]]:
    found = []
    for r, o in zip(ref, out):
        r = np.asarray(r, dtype=np.float64).ravel()
        o = np.asarray(o, dtype=np.float64).ravel()
        keep = np.isfinite(r)
        r, o = r[keep], o[keep]
        d = r - o
        noise = float(np.dot(d, d)) if np.all(np.isfinite(d)) else math.inf
        found.append((float(np.dot(r, r)), noise))
    return found


def worst_db(per_input: list[list[tuple[float, float]]]) -> float:
    """The worst output's SQNR over these inputs (math.fsum: independent of their order)."""
    worst = math.inf
    for k in range(len(per_input[0])):
        sig = math.fsum(p[k][0] for p in per_input)
        noise = math.fsum(p[k][1] for p in per_input)
        db = math.inf if noise == 0 else (-math.inf if not math.isfinite(noise) or sig == 0 else 10 * math.log10(sig / noise))
        worst = min(worst, db)
    return worst


def groups_of(proto, plan, cal, stretch: float) -> list[dict]:
    """The candidate range groups: their range initializers, the ratio that makes their range cover [min, max]."""
    inits = {t.name: t for t in proto.graph.initializer}
    fqs = [n for n in proto.graph.node if n.op_type == "FakeQuantize"]
    by_lo: dict[str, list] = {}
    for n in fqs:
        by_lo.setdefault(n.input[1], []).append(n)
    records = {t.name: t for t in cal.tensors}
    seen, found = set(), []
    for q in plan.quantizers:
        if q.is_weight or q.channel_amax is not None:
            continue
        tensors = sorted({q.tensor, *q.shared_with})
        key = tuple(tensors)
        lo_names = sorted({n.input[1] for n in fqs if n.input[0] == q.tensor}
                          | {lo for lo in by_lo if lo.startswith(f"{q.tensor}/fq/input_low")})
        if not lo_names:
            continue
        recs = [records[t] for t in tensors if t in records]
        if not recs:
            continue
        top = max(r.max for r in recs)
        bottom = min(r.min for r in recs)
        names, ratio = [], 1.0
        for lo_name in lo_names:
            hi_name = by_lo[lo_name][0].input[2]
            lo = numpy_helper.to_array(inits[lo_name]).astype(np.float64)
            hi = numpy_helper.to_array(inits[hi_name]).astype(np.float64)
            if lo.size != 1:
                continue
            lo, hi = float(lo.ravel()[0]), float(hi.ravel()[0])
            if hi > 0:
                ratio = max(ratio, top / hi)
            if lo < 0:
                ratio = max(ratio, bottom / lo)
            names += [lo_name, hi_name]
        if key in seen:
            for g in found:
                if g["key"] == key:
                    g["inits"] = sorted(set(g["inits"]) | set(names))
            continue
        seen.add(key)
        if names and ratio > stretch:
            found.append({"key": key, "tensor": q.tensor, "inits": sorted(set(names)), "ratio": ratio})
    return found


class Switched:
    """One simulation session of the exported file whose candidate groups' ranges are inputs."""

    def __init__(self, data: bytes, groups: list[dict], names: list[str]):
        proto = onnx.load_model_from_string(data)
        inits = {t.name: t for t in proto.graph.initializer}
        self.base = {}
        for g in groups:
            for name in g["inits"]:
                if name in self.base:
                    continue
                t = inits[name]
                self.base[name] = numpy_helper.to_array(t).copy()
                proto.graph.initializer.remove(t)
                proto.graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
        self.groups, self.names = groups, names
        self.session = simulate.simulation(proto)

    def values(self, chosen) -> dict:
        v = dict(self.base)
        for g in chosen:
            for name in g["inits"]:
                v[name] = np.asarray(self.base[name].astype(np.float64) * g["ratio"], dtype=self.base[name].dtype)
        return v

    def run(self, feeds: dict, chosen) -> list[np.ndarray]:
        return onnxruntime.run(self.session, self.names, {**feeds, **self.values(chosen)})


def written(data: bytes, switched: Switched, chosen) -> bytes:
    """The exported file with the chosen groups' ranges written in."""
    proto = onnx.load_model_from_string(data)
    values = switched.values(chosen)
    for i, t in enumerate(proto.graph.initializer):
        if t.name in values and any(t.name in g["inits"] for g in chosen):
            proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(values[t.name], t.name))
    return proto.SerializeToString()


def decide(switched: Switched, refs, inputs, margin: float) -> tuple[list[dict], float, dict]:
    base = [sums(r, switched.run(f, [])) for f, r in zip(inputs, refs)]
    base_db = worst_db(base)
    gains, chosen = {}, []
    for g in switched.groups:
        db = worst_db([sums(r, switched.run(f, [g])) for f, r in zip(inputs, refs)])
        gains[g["tensor"]] = db - base_db
        if db - base_db > margin:
            chosen.append(g)
    return chosen, base_db, gains


def rule_rows(args) -> None:
    """--rule: every value of TYPICAL_PEAK built and scored (see the module docstring)."""
    from qtool.statistics import thresholds
    from qtool.targets.cpu import OPENVINO

    rows = json.loads(args.out.read_text()) if args.out.exists() else {}
    counted = {"asked": 0, "stretched": 0}
    plain = thresholds.stretches

    def counting(*a):
        found = plain(*a)
        counted["asked"] += 1
        counted["stretched"] += int(found)
        return found

    thresholds.stretches = counting
    for name in args.models.split(","):
        folder = args.zoo / name
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        calib_file = work / "auto.calib.json"
        if not calib_file.exists():
            api.calibrate_files(folder / "model.onnx", data=str(folder / "calib"), output=calib_file)
        cal = calibration.load(calib_file)
        loaded = model.load_float_model(folder / "model.onnx")
        names = float_outputs(loaded.proto)
        ref_session = onnxruntime.session(loaded.proto)
        calib, held = feeds(folder / "calib"), feeds(folder / "held")
        ref_c = [onnxruntime.run(ref_session, names, f) for f in calib]
        ref_h = [onnxruntime.run(ref_session, names, f) for f in held]
        row = rows.setdefault(name, {})
        for value in args.rule.split(","):
            counted.update(asked=0, stretched=0)
            peak, _, extreme = value.partition(":")  # TYPICAL_PEAK[:EXTREME]
            thresholds.TYPICAL_PEAK = math.inf if peak == "off" else float(peak)
            thresholds.EXTREME = float(extreme) if extreme else math.inf
            t0 = time.perf_counter()
            data = api.export(folder / "model.onnx", cal, target="openvino")
            t_export = time.perf_counter() - t0
            assert OPENVINO.stretched_tails
            sim = simulate.simulation(onnx.load_model_from_string(data))
            calib_db = worst_db([sums(r, onnxruntime.run(sim, names, f)) for f, r in zip(calib, ref_c)])
            held_db = worst_db([sums(r, onnxruntime.run(sim, names, f)) for f, r in zip(held, ref_h)])
            ov = simulate.runtime("openvino", data)
            ov_db = worst_db([sums(r, ov.run(names, f)) for f, r in zip(held, ref_h)])
            row[value] = {"stretched": counted["stretched"], "asked": counted["asked"], "calib_sim": calib_db,
                          "held_sim": held_db, "held_ov": ov_db, "export_s": t_export}
            args.out.write_text(json.dumps(rows, indent=1))
            print(f"{name} TYPICAL_PEAK {value}: {counted['stretched']}/{counted['asked']} sites stretched; calib sim "
                  f"{calib_db:.2f} held sim {held_db:.2f} held OV {ov_db:.2f} (export {t_export:.1f}s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoo", type=Path, required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/fid15/tails"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/fid15/tails.json"))
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--stretch", type=float, default=1.02)
    ap.add_argument("--openvino", action="store_true", help="also OpenVINO's run of both files on the held-out inputs")
    ap.add_argument("--per-model", action="store_true",
                    help="no group switched alone: only every candidate group at max |x| against none (2 passes per subset)")
    ap.add_argument("--rule", help="values of TYPICAL_PEAK[:EXTREME] to build and score (off: none), comma-separated")
    args = ap.parse_args()
    if args.rule:
        rule_rows(args)
        return
    rows = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in args.models.split(","):
        folder = args.zoo / name
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        calib_file = work / "auto.calib.json"
        t0 = time.perf_counter()
        if not calib_file.exists():
            api.calibrate_files(folder / "model.onnx", data=str(folder / "calib"), output=calib_file)
        t_cal = time.perf_counter() - t0
        cal = calibration.load(calib_file)
        t0 = time.perf_counter()
        data = api.export(folder / "model.onnx", cal, target="openvino")
        t_export = time.perf_counter() - t0
        loaded = model.load_float_model(folder / "model.onnx")
        t0 = time.perf_counter()
        module, prepared = evaluation.prepare(loaded, cal, options_for("openvino"))
        t_prepare = time.perf_counter() - t0
        used = prepared.cal if prepared.cal is not None else cal
        proto = onnx.load_model_from_string(data)
        groups = groups_of(proto, prepared.plan, used, args.stretch)
        names = float_outputs(loaded.proto)
        ref_session = onnxruntime.session(loaded.proto)
        calib, held = feeds(folder / "calib"), feeds(folder / "held")
        ref_c = [onnxruntime.run(ref_session, names, f) for f in calib]
        ref_h = [onnxruntime.run(ref_session, names, f) for f in held]
        t0 = time.perf_counter()
        switched = Switched(data, groups, names)
        half = len(calib) // 2
        decisions = {}
        for label, sel in (("first", slice(0, half)), ("second", slice(half, None)), ("all", slice(None))):
            if args.per_model:
                base_db = worst_db([sums(r, switched.run(f, [])) for f, r in zip(calib[sel], ref_c[sel])])
                every_db = worst_db([sums(r, switched.run(f, groups)) for f, r in zip(calib[sel], ref_c[sel])]) if groups else base_db
                chosen = groups if every_db - base_db > args.margin else []
                decisions[label] = {"chosen": [g["tensor"] for g in chosen], "base_db": base_db, "combined_db": every_db, "gains": {}}
                continue
            chosen, base_db, gains = decide(switched, ref_c[sel], calib[sel], args.margin)
            comb = worst_db([sums(r, switched.run(f, chosen)) for f, r in zip(calib[sel], ref_c[sel])]) if chosen else base_db
            decisions[label] = {"chosen": [g["tensor"] for g in chosen], "base_db": base_db, "combined_db": comb,
                                "gains": gains}
        t_decide = time.perf_counter() - t0
        chosen = [g for g in groups if g["tensor"] in decisions["all"]["chosen"]]
        every = groups
        held_row = {}
        for label, sel in (("auto", []), ("chosen", chosen), ("every_candidate_max", every))[:2 if args.per_model else 3]:
            held_row[label] = worst_db([sums(r, switched.run(f, sel)) for f, r in zip(held, ref_h)])
        if args.openvino:
            for label, sel in (("auto", []), ("chosen", chosen)):
                sess = simulate.runtime("openvino", written(data, switched, sel) if sel else data)
                held_row["ov_" + label] = worst_db([sums(r, sess.run(names, f)) for f, r in zip(held, ref_h)])
        row = {"groups": len(groups), "activation_quantizers": sum(1 for q in prepared.plan.quantizers if not q.is_weight),
               "ratios": {g["tensor"]: round(g["ratio"], 3) for g in groups}, "decisions": decisions, "held": held_row,
               "seconds": {"calibrate": t_cal, "export": t_export, "prepare": t_prepare, "decide_3_subsets": t_decide},
               "inputs": {"calib": len(calib), "held": len(held)}}
        rows[name] = row
        args.out.write_text(json.dumps(rows, indent=1))
        d = decisions
        print(f"{name}: {len(groups)} candidate groups of {row['activation_quantizers']}; chosen first/second/all "
              f"{len(d['first']['chosen'])}/{len(d['second']['chosen'])}/{len(d['all']['chosen'])} "
              f"(all: {d['all']['chosen']}); calib all {d['all']['base_db']:.2f} -> {d['all']['combined_db']:.2f}; "
              f"held sim auto {held_row['auto']:.2f} chosen {held_row['chosen']:.2f}"
              + (f"; OV run auto {held_row['ov_auto']:.2f} chosen {held_row['ov_chosen']:.2f}" if args.openvino else "")
              + f"; export {t_export:.1f}s decide {t_decide:.1f}s", flush=True)


if __name__ == "__main__":
    main()
