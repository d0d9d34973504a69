"""`qtool export`: a calibration (and its model) to a target format (qtool.api.export_file)."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from .. import api
from . import EPILOG, call, cli, finish, policy_options


def option(keyword: str, command: str = "export"):
    """The click option of the export option `keyword`, as qtool.targets.OPTIONS declares it
    (`command` "evaluate": with evaluate's help)."""
    o = api.OPTIONS[keyword]
    kwargs: dict = {"help": (o.help if command == "export" else o.evaluate).format(latest=api.TRT_LATEST_VERSION)}
    if o.negated:  # a --no-... switch: the keyword False
        kwargs.update(flag_value=False, default=True)
    if o.choices:
        kwargs["type"] = click.Choice(o.choices)
    if o.multiple:
        kwargs["multiple"] = True
    if o.metavar:
        kwargs["metavar"] = o.metavar
    return click.option(o.flag, keyword, **kwargs)


def complete_targets(incomplete: str) -> list:
    """Shell completion of --target (the option stays free text so a typo gets a did-you-mean)."""
    from click.shell_completion import CompletionItem

    return [CompletionItem(t) for t in api.TARGETS if t.startswith(incomplete.lower())]


def parse_target(text: str) -> str:
    target = text.strip().lower()
    if target not in api.TARGETS:
        near = difflib.get_close_matches(target, api.TARGETS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise click.BadParameter(f"{text!r} is not one of {', '.join(api.TARGETS)}{hint}", param_hint="'--target'")
    return target


@cli.command(epilog=EPILOG)
@click.argument("model_path", metavar="[MODEL]", required=False, type=click.Path(path_type=Path))
@click.option("--target", required=True, help=f"Output format: {', '.join(api.TARGETS)}.", shell_complete=lambda ctx, param, incomplete: complete_targets(incomplete))
@click.option("--calib", type=click.Path(path_type=Path), help="Calibration file [default: the single *.calib.json here].")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output file [default: <model stem> + the target's suffix, here].")
@option("trt_version")
@option("fmt")
@option("algorithm")
@option("method")
@option("high_precision")
@option("precision")
@option("weights")
@option("include")
@option("exclude")
@option("cpu")
@option("weights_7bit")
@option("smooth_quant")
@click.option("--keep-fp32", type=click.IntRange(min=1), metavar="N", help="openvino/qdq: also keep in FP32 the layers reading the N quantized tensors that qtool evaluate --tensors ranks most harmful on the inputs of --images/--data (preprocessed as the calibration file records), in the target's own model, simulated exactly.")
@click.option("--max-drop", metavar="BUDGET", help="openvino/qdq: keep in FP32 the fewest layers, worst ranked first, that bring the int8 model within BUDGET on --images/--data: a worst output SQNR (e.g. 30dB) or a top-1 agreement drop (e.g. 1%); each step measures the target's model exactly (simulated: the same on every CPU); exit 1 when --max-fp32 tensors are not enough.")
@click.option("--max-fp32", type=click.IntRange(min=1), default=20, show_default=True, help="With --max-drop: the most quantized tensors whose layers may be kept in FP32.")
@click.option("--images", "images", type=click.Path(path_type=Path), help="With --keep-fp32/--max-drop: held-out images to rank and measure on.")
@click.option("--data", "data", type=click.Path(path_type=Path), help="With --keep-fp32/--max-drop: held-out .npy/.npz files.")
@click.option("--limit", type=click.IntRange(min=1), help="With --keep-fp32/--max-drop: use only the first N images or data files.")
@option("ignored_patterns")
@option("bias_correction")
@policy_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def export(model_path, target, calib, output, trt_version, fmt, algorithm, method, high_precision, precision, weights, include,
           exclude, cpu, weights_7bit, smooth_quant, keep_fp32, max_drop, max_fp32, images, data, limit, ignored_patterns, bias_correction,
           weight_bits, activation_bits, scale_kind, activations, rounding, policy, as_json):
    """Write the calibrated ranges of MODEL in a target format.

    With no MODEL, the model recorded in the calibration file is used; either way it must be
    byte-identical (SHA-256) to the one calibrated.
    """
    outcome = call(api.export_file, model_path, target=parse_target(target), calib=calib, output=output, trt_version=trt_version,
                   fmt=fmt, algorithm=algorithm, method=method, high_precision=high_precision, precision=precision, weights=weights,
                   include=include, exclude=exclude, cpu=cpu, weights_7bit=weights_7bit, smooth_quant=smooth_quant, keep_fp32=keep_fp32,
                   max_drop=max_drop, max_fp32=max_fp32, images=images, data=data, limit=limit,
                   ignored_patterns=ignored_patterns, bias_correction=bias_correction, weight_bits=weight_bits,
                   activation_bits=activation_bits, scale_kind=scale_kind, activations=activations, rounding=rounding,
                   policy=policy)
    finish(outcome, as_json)
