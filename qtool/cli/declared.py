"""The click options of the options qtool.options declares (export's, evaluate's and the policy
flags), and the command class whose --help shows them in their sections."""

from __future__ import annotations

from pathlib import Path

import click

from .. import api


def option(key: str, command: str = "export", flag: str | None = None):
    """The click option of the export option `key`, as qtool.options declares it (`command`
    "evaluate": with evaluate's help; `flag`: another flag than the declared one)."""
    o = api.OPTIONS[key]
    kwargs: dict = {"help": (o.help if command != "evaluate" or o.evaluate is None else o.evaluate).format(latest=api.TRT_LATEST_VERSION)}
    if o.negated:  # a --no-... switch: the key False
        kwargs.update(flag_value=False, default=True)
    if o.choices:
        kwargs["type"] = click.Choice(o.choices)
    if o.bounds:
        kwargs["type"] = click.IntRange(*o.bounds)
    if o.path:
        kwargs["type"] = click.Path(path_type=Path)
    if o.multiple:
        kwargs["multiple"] = True
    if o.metavar:
        kwargs["metavar"] = o.metavar
    return click.option(flag or o.flag, key, **kwargs)


def policy_options(command=None, *, scale_flag: str = "--scale"):
    """The options that choose quantization policies (qtool.options.PolicyFlags), shared by export,
    evaluate and inspect (evaluate's --scale is the pixel multiplier: there the scale kind is `scale_flag`)."""
    if command is None:
        return lambda c: policy_options(c, scale_flag=scale_flag)
    for key in reversed(list(api.EXPORT_GROUPS["Policies"])):
        command = option(key, "policy", flag=scale_flag if key == "scale_kind" else None)(command)
    return command
