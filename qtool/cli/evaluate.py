"""`qtool evaluate`: a target's int8 model (the exact simulation of its file, and on request the
real runtime on this CPU) against FP32 on held-out inputs (qtool.api.evaluate_files)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish
from .declared import Grouped, calib_option, json_option, option, options, policy_options, target_option

# a model shipped dynamic-int8 this far (or farther) from its float reading gets a note that its own int8 loses that much
FAR_FROM_FLOAT_DB = 20.0
SATURATION_SHOWN_DB = 3.0  # the float reading this much nearer the unsaturated integers than the model as given
HELD_OUT = ("images", "data", "limit", *api.IMAGE_KEYS, "batch_size")  # qtool.options: the inputs calibrate reads too, and ImageOptions


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="pass", file=sys.stderr, disable=not (enabled and sys.stderr.isatty()), leave=False)


@cli.command(cls=Grouped, epilog=EPILOG, sections={"Held-out inputs": HELD_OUT})
@click.argument("model_path", metavar="MODEL|FILE", type=click.Path(path_type=Path))
@calib_option()
@click.option("--reference", type=click.Path(path_type=Path), metavar="MODEL", help="FILE's FP32 model [default: the one FILE records, "
              "checked by SHA-256]; needed for a file qtool did not write.")
@options("evaluate", HELD_OUT)
@target_option(help=f"Whose export to evaluate [default: FILE's, else {api.DEFAULT_TARGET}].")
@click.option("--runtime", type=click.Choice(tuple(api.runtimes())), help="Also run the file and its FP32 model in this runtime on this CPU ("
              + "; ".join(f"{r}: {', '.join(ts)}" for r, ts in api.runtimes().items()) + ").")
@option("method", "evaluate")
@option("exclude", "evaluate")
@option("include", "evaluate")
@option("cpu", "evaluate")
@option("weights_7bit", "evaluate")
@option("smooth_quant", "evaluate")
@option("ignored_patterns", "evaluate")
@option("bias_correction", "evaluate")
@option("trt_version", "evaluate")
@option("fmt", "evaluate")
@option("high_precision", "evaluate")
@option("precision", "evaluate")
@options("evaluate", ("tensors", "fail_below"))
@policy_options
@json_option("the results as JSON (infinite SQNR as the string \"inf\")")
@click.pass_context
def evaluate(ctx, model_path, as_json, **keywords):
    """Compare a target's int8 model with FP32 on held-out inputs.

    MODEL: the FP32 model; the int8 model is the target's export (as qtool export --target writes it, built in memory),
    run as an exact simulation of the file's arithmetic: onnxruntime with graph optimization off
    (Q/DQ as float operations; OpenVINO's FakeQuantize rewritten into float ops), the same number
    on every CPU. --runtime also runs the file in that runtime on this CPU: on x86 CPUs without
    VNNI its int8 kernels can saturate. Images are preprocessed as the calibration file records
    unless flags override it. Use inputs the calibration did not see.

    FILE: an exported ONNX file, scored as it is (its nodes as written), against the FP32 model it
    records (qtool export writes its name and SHA-256 in the file; --reference for another file),
    images preprocessed as it records; the export options are the file's own.

    Per model output: SQNR in dB (10 log10 of signal power over error power, over all
    samples; +inf when identical), cosine similarity, and for outputs shaped [N, classes] the
    share of samples whose top-1 class agrees. With --tensors, per quantized tensor (activation
    or weight quantizer): the output SQNR when only that tensor is quantized, worst first, with
    the layers reading it (qtool export --keep-fp32 N keeps the layers of the N worst in FP32;
    --exclude them yourself to use this ranking on your data).
    """
    with _progress(1, not (ctx.obj["quiet"] or as_json)) as bar:
        outcome = call(api.evaluate_files, model_path, progress=bar, **keywords)
    finish(outcome, as_json, text)


def _dynamic_reference(model: str, ref: dict) -> list[str]:
    """What FP32 is for a model onnxruntime quantized dynamically (the model as given), how far qtool's float reading of
    it is, and a note where that is FAR_FROM_FLOAT_DB or more: the model's own int8 is then the larger error."""
    own = api.from_json_number(ref["float_reading_sqnr_db"])
    lines = [f"FP32 here is {model} as given, quantized dynamically by onnxruntime (its ConvInteger/MatMulInteger/"
             f"DynamicQuantizeLSTM run by onnxruntime); the export is built from qtool's float reading of it "
             f"({ref['read_as_float']}), which is {api.format_db(own)} dB from it"]
    if own is None or own >= FAR_FROM_FLOAT_DB:  # t5_title_encoder: 2.4 dB on a VNNI CPU (docs/benchmarks.md#dynamic-grids)
        return lines
    free = api.from_json_number(ref.get("unsaturated_sqnr_db"))
    free_own = api.from_json_number(ref.get("float_reading_vs_unsaturated_sqnr_db"))
    if free is not None and free_own is not None and free_own - own >= SATURATION_SHOWN_DB:  # t5_title_encoder: -18.6, 2.6
        lines.append(f"note: the model as given is {api.format_db(own)} dB from its own float reading, and most of that is this "
                     "CPU's: it has no VNNI (avx512_vnni/avx_vnni), and onnxruntime's u8 x s8 kernels add pairs of products in "
                     f"int16 with saturation; the model as given runs {api.format_db(free)} dB from the same integers computed "
                     f"without saturating (its int8 weights as uint8 with zero point + 128, {ref['unsaturated_layers']} layer(s)), "
                     f"which are {api.format_db(free_own)} dB from its float reading, as on a CPU with VNNI; a file scored against "
                     "the model as given here is scored against that loss")
    else:
        lines.append(f"note: the model as given is {api.format_db(own)} dB from its own float reading: its dynamic int8 loses that "
                     "much, and a file scored against it is scored against that loss; if you have the FP32 model it was "
                     "made from, quantize that instead")
    return lines


def text(evaluated: api.EvaluateResult) -> str:
    """What evaluate prints: the model compared, then per output SQNR, cosine and top-1 agreement (and
    the runtime's), then with --tensors the quantized tensors, most harmful first."""
    result, inputs, seconds = evaluated.evaluation, evaluated.inputs, evaluated.seconds
    what = evaluated.input_kind
    if evaluated.data_file is not None:
        what = f"{'samples in' if what == 'samples' else 'runs of'} {evaluated.data_file!r}"
    format_db = api.format_db
    q = result.plan_summary
    if evaluated.file is not None:  # an exported file, as it is
        whose = f"{result.target} export" if result.target else "not exported by qtool"
        lines = [f"{evaluated.file} ({whose}, exact simulation of its nodes) vs FP32 {evaluated.model} on {result.samples} samples "
                 f"from {inputs} {what} in {seconds:.1f} s"]
    else:
        lines = [(
            f"int8 ({result.target} export, exact simulation: {q.get('int8_layers', 0)} int8 layers"
            + (f" and {len(q['int8_lstm'])} int8 LSTM(s)" if q.get("int8_lstm") else "") + f", {q.get('activation_quantizers', 0)} "
            f"activation and {q.get('weight_quantizers', 0)} weight quantizers) vs FP32 on {result.samples} samples from {inputs} {what} "
            f"in {seconds:.1f} s"
        )]
    ref = evaluated.reference
    if ref is not None and "read_as_float" not in ref:  # a model shipped with its own Q/DQ pairs
        lines[0] = lines[0].replace(" vs FP32 ", " vs the model as given ", 1)
        lines.append(f"the model as given here is {evaluated.model}, {ref['model'].removeprefix('as given: ')}")
    elif ref is not None:  # a model onnxruntime quantized dynamically, read as float
        lines.extend(_dynamic_reference(evaluated.model, ref))
    rt = result.runtime
    width = max([len("output")] + [len(o.name) for o in result.outputs])
    head = f"{'output':<{width}}  {'SQNR dB':>8}  {'cosine':>8}  {'top-1 agree':>11}"
    if rt is not None:
        lines[0] += f"; also run by {rt.name} on this CPU ({runtime_cpu(rt)})"
        head += f"  {rt.name + ' dB':>16}  {rt.name + ' top-1':>17}"
        if rt.fp32:  # the runtime's FP32 run against onnxruntime's, and the int8 run against the runtime's FP32
            head += f"  {rt.name + ' FP32 dB':>21}  {'vs ' + rt.name + ' FP32 dB':>24}"
    lines.append(head)
    for i, o in enumerate(result.outputs):
        cos = "nan" if math.isnan(o.cosine) else f"{o.cosine:.5f}"
        line = f"{o.name:<{width}}  {format_db(o.sqnr_db):>8}  {cos:>8}  {_top1(o):>11}"
        if rt is not None:
            line += f"  {format_db(rt.outputs[i].sqnr_db):>16}  {_top1(rt.outputs[i]):>17}"
            if rt.fp32:
                line += f"  {format_db(rt.fp32[i].sqnr_db):>21}  {format_db(rt.own[i].sqnr_db):>24}"
        lines.append(line)
    if rt is not None and rt.fp32:
        lines.append(f"{rt.name} FP32 dB: {rt.name} running the FP32 model against onnxruntime's FP32 (the runtime's own floor); "
                     f"vs {rt.name} FP32 dB: its int8 run against that FP32 run")
    for o in result.outputs:
        if o.skipped:
            lines.append(f"{o.name}: {o.skipped_share * 100:.2f} % of the FP32 values ({o.skipped} of {o.elements}) were NaN/inf, not compared")
    if result.tensors:
        lines.append("quantized tensors, most harmful first (output SQNR dB with only that tensor quantized):")
        for i, t in enumerate(result.tensors, 1):
            lines.append(f"{i:>4}  {format_db(t.sqnr_db):>8}  {t.kind:<10}  {t.tensor}  -> {', '.join(t.layers) or '-'}")
    return "\n".join(lines)


def _top1(o) -> str:
    return f"{o.top1_agreement * 100:.2f} %" if o.top1_agreement is not None else "-"


def runtime_cpu(rt) -> str:
    """What the runtime's numbers depend on: the CPU's int8 instructions and the float precision of the layers left unquantized."""
    words = "VNNI" if rt.vnni else "no VNNI" if rt.vnni is False else "VNNI unknown"
    words = f"{rt.cpu_kind} kind, {words}" if rt.cpu_kind else words
    words += f"; unquantized layers in {rt.float_precision}"
    if rt.default_float and rt.default_float != rt.float_precision:
        words += f" (pinned: {rt.name} alone would run them in {rt.default_float} on this CPU)"
    return words
