"""Mixed precision by an accuracy budget: keep in FP32 the fewest layers that bring the int8
model within the budget (NNCF's quantize_with_accuracy_control, with qtool evaluate's metrics).

The budget is the worst output SQNR in dB (`30dB`) or a top-1 agreement drop (`1%`: at least 99 %
of the samples keep FP32's top-1 class, on outputs shaped like class scores). Candidates are the
quantized tensors ranked as `qtool evaluate` ranks them (worst first, with the layers reading
each), in the target's own model (QDQ or OpenVINO FakeQuantize); every trial builds that target's
model with the first k candidates' layers in FP32 and measures its exact simulation
(qtool.checks.simulate, the same on every CPU) on the held-out inputs: k = 1, 2, 4, ... until the budget is met, then a bisection
between the last two, so about 2 log2(k) exports. The metric is not strictly monotonic in k; the
result is the smallest k found that meets it, confirmed by its own measurement.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass, field

import onnx

from .. import targets
from ..errors import Opt, QtoolError, Words, opts
from ..model import data_inputs
from ..options import ExportOptions
from ..runtime import onnxruntime, openvino
from ..targets import get
from . import evaluation as ev
from . import simulate


@dataclass(frozen=True)
class Budget:
    metric: str  # "sqnr" (worst output SQNR, dB) or "top1" (worst top-1 agreement, 0..1)
    bound: float  # the least acceptable value

    def value(self, outputs: list[ev.OutputMetrics]) -> float:
        if self.metric == "sqnr":
            return min((o.sqnr_db for o in outputs), default=math.nan)
        found = [o.top1_agreement for o in outputs if o.top1_agreement is not None]
        if not found:
            raise QtoolError("{top1} needs outputs shaped like class scores ([N, classes]); use {db} (output SQNR)",
                             top1=Opt("max_drop", "N%"), db=Opt("max_drop", "<dB>"))
        return min(found)

    def met(self, value: float) -> bool:
        return not math.isnan(value) and value >= self.bound

    def describe(self, value: float | None = None) -> str:
        if self.metric == "sqnr":
            return f"{value:.2f} dB" if value is not None else f"output SQNR >= {self.bound:g} dB"
        return f"{value * 100:.2f} %" if value is not None else f"top-1 agreement >= {self.bound * 100:g} %"


def parse_budget(text: str) -> Budget:
    """'30dB' or '30' -> worst output SQNR >= 30 dB; '1%' -> top-1 agreement >= 99 %."""
    t = text.strip().lower().replace(" ", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(db|%)?", t)
    if not m:
        raise QtoolError("{given} is not a budget: give an output SQNR in dB (e.g. 30dB) or a top-1 drop in % (e.g. 1%)",
                         given=Opt("max_drop", text, quoted=True))
    number = float(m.group(1))
    if m.group(2) == "%":
        if not 0 <= number < 100:
            raise QtoolError("{given}: a top-1 drop must be from 0 to 100 %", given=Opt("max_drop", text, quoted=True))
        return Budget("top1", 1 - number / 100)
    return Budget("sqnr", number)


@dataclass
class BudgetResult:
    met: bool
    value: float  # the metric of the chosen model
    exclude: list[str]  # layers kept in FP32 (for --exclude)
    tensors: list[dict]  # the candidates they stand for, worst first
    trials: list[dict] = field(default_factory=list)  # {"fp32_tensors": k, "value": v} per export measured


def meet(loaded, cal, runs: ev.Runs, budget: Budget, max_fp32: int, options: ExportOptions) -> BudgetResult:
    """The fewest ranked tensors (at most `max_fp32`) whose layers kept in FP32 meet `budget`.
    options.target: one whose writer builds any subset of its quantizers (openvino, qdq), whose model is
    ranked and measured with these export options; one preparation serves the ranking and every
    trial, each the model export writes, simulated exactly."""
    bias_correction = options.bias_correction
    names, _ = ev._float_outputs(loaded.proto)
    if not names:
        raise QtoolError("{max_drop}: the model has no float outputs to measure", max_drop=Opt("max_drop"))
    module, prepared = ev.prepare(loaded, cal, options, Words("{max_drop}", opts("max_drop")))
    reference = ev._Reference(runs, ev._session(loaded, loaded.proto), names)
    trials: list[dict] = []

    def trial(k: int, extra: list[str]) -> float:
        model = ev.built(module, prepared, cal, prepared.place(extra) if extra else prepared.plan, bias_correction)
        accs, _ = ev._compare(reference, simulate.simulation(model), names)
        value = budget.value(ev.output_metrics(names, accs))
        trials.append({"fp32_tensors": k, "value": ev.json_number(value, 6)})
        return value

    base = trial(0, [])
    if budget.met(base):
        return BudgetResult(True, base, [], [], trials)
    steps = ev.walk(prepared, ev.sensitivities(module, prepared, cal, reference, names, bias_correction=bias_correction,
                                                rules=targets.get(options.target).rules), max_fp32)
    if not steps:
        return BudgetResult(False, base, [], [], trials)
    values: dict[int, float] = {}
    k, low = 1, 0
    while True:  # doubling: the first k that meets the budget, or all candidates
        k = min(k, len(steps))
        values[k] = trial(k, steps[k - 1][1])
        if budget.met(values[k]) or k == len(steps):
            break
        low, k = k, 2 * k
    high = k
    if not budget.met(values[high]):
        return BudgetResult(False, values[high], steps[high - 1][1], [s[0] for s in steps[:high]], trials)
    while high - low > 1:  # bisection between the last failing and the first passing k
        mid = (low + high) // 2
        values[mid] = trial(mid, steps[mid - 1][1])
        low, high = (low, mid) if budget.met(values[mid]) else (mid, high)
    return BudgetResult(True, values[high], steps[high - 1][1], [s[0] for s in steps[:high]], trials)


def one_sample(proto: onnx.ModelProto, feeds: dict) -> dict:
    """The first sample of a held-out batch (held-out images come 8 to a batch), so that the
    latency is one input's, as the summary says; a model with a fixed batch keeps its batch."""
    dynamic = {s.name for s in data_inputs(proto) if s.dims and s.dims[0] is None}
    return {k: (v[:1] if k in dynamic and getattr(v, "ndim", 0) else v) for k, v in feeds.items()}


def latency_ms(target: str, model_bytes: bytes, feeds: dict, runs: int = 30) -> float | None:
    """Median latency (ms) of one run on `feeds` in the target's runtime (qtool.targets): OpenVINO
    (None when it is not installed), or onnxruntime (default optimizations, one thread per core, as
    a deployment runs it)."""
    if get(target).runtime == "openvino":
        try:
            openvino.package()
        except QtoolError:
            return None
        session = openvino.Session(bytes(model_bytes), {"PERFORMANCE_HINT": "LATENCY"}, precision="default")  # as deployed
    else:
        session = onnxruntime.session(onnx.load_model_from_string(bytes(model_bytes)))

    def infer():
        session.run(None, feeds)
    for _ in range(5):
        infer()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        infer()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000
