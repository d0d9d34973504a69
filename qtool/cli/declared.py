"""The click options of the options qtool.options (and each target's package) declares, every
command's, with the declaration's default and help (no command writes a default of its own:
tests/test_options.py checks); --target, --calib and --json as every command takes them; and the
command class whose --help shows the options in their sections."""

from __future__ import annotations

import difflib
from pathlib import Path

import click
from click.shell_completion import CompletionItem

from .. import api


def option(key: str, command: str = "export", flag: str | None = None):
    """The click option of the option `key` as qtool.options declares it: `command`'s own
    (api.COMMAND_OPTIONS: its help and default, shown) or an export option (api.OPTIONS: its default
    applied by the library, worded in its help), with `command`'s help; `flag`: another flag than the declared one."""
    own = api.COMMAND_OPTIONS.get(command, {}).get(key)
    o = own or api.OPTIONS[key]
    kwargs: dict = {"help": o.help_for(command)}
    if own is not None and o.default not in (None, ()) and not o.negated:  # a command's own default, shown
        kwargs.update(default=o.default, show_default=True)
    if "/" in o.flag:  # --x/--no-x: True, False or (no default) not given
        kwargs.setdefault("default", None)
    if o.negated:  # a --no-... switch: the key False
        kwargs.update(flag_value=False, default=o.default)
    if o.choices:
        kwargs["type"] = click.Choice(o.choices)
    if o.bounds:
        kwargs["type"] = click.IntRange(*o.bounds)
    if o.kind:
        kwargs["type"] = o.kind
    if o.path:
        kwargs["type"] = click.Path(path_type=Path)
    if o.multiple:
        kwargs["multiple"] = True
    if o.metavar:
        kwargs["metavar"] = o.metavar
    return click.option(flag or o.flag, key, **kwargs)


def options(command: str, keys: tuple[str, ...] | None = None):
    """The click options of `keys` (None: every option `command` declares, api.COMMAND_OPTIONS), in that order."""
    def decorate(function):
        for key in reversed(tuple(api.COMMAND_OPTIONS[command]) if keys is None else keys):
            function = option(key, command)(function)
        return function

    return decorate


def target_option(choices: tuple[str, ...] = api.TARGETS, **kwargs):
    """--target as every command takes it: free text, so a typo is a usage error naming the nearest
    choice (exit 2), completed from `choices` in the shell, given to the command in lower case."""

    def parse(ctx, param, text):
        if text is None:
            return None
        target = text.strip().lower()
        if target not in choices:
            near = difflib.get_close_matches(target, choices, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise click.BadParameter(f"{text!r} is not one of {', '.join(choices)}{hint}")
        return target

    def complete(ctx, param, incomplete):
        return [CompletionItem(t) for t in choices if t.startswith(incomplete.lower())]

    return click.option("--target", metavar=f"[{'|'.join(choices)}]", callback=parse, shell_complete=complete, **kwargs)


def calib_option():
    """--calib as export and evaluate take it: the calibration file, else the single one here."""
    return click.option("--calib", type=click.Path(path_type=Path), help="Calibration file [default: the single *.calib.json here].")


def json_option(what: str = "a JSON summary"):
    """--json as every command takes it: `what` as one JSON document on stdout (on a failure, the
    error's: qtool.cli)."""
    return click.option("--json", "as_json", is_flag=True, help=f"Print {what} on stdout.")


def policy_options(command):
    """The options that choose quantization policies (qtool.options.PolicyFlags), shared by export,
    evaluate and inspect (the scale kind is --scale-kind everywhere: --scale is calibrate's and
    evaluate's pixel multiplier)."""
    for key in reversed(list(api.EXPORT_GROUPS["Policy"])):
        command = option(key, "policy")(command)
    return command


class Grouped(click.Command):
    """A command whose --help lists its options in sections: first its own and the export options
    every target reads ("Options"), then each target's group in the sections it declares (qtool.targets),
    then the command's own `sections` ({title: keys})."""

    def __init__(self, *args, sections: dict[str, tuple[str, ...]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sections = sections or {}

    def section(self, key: str) -> str:
        for title, keys in self.sections.items():
            if key in keys:
                return title
        declared = api.OPTIONS.get(key)
        if declared is None or declared.section == "General":
            return "Options"
        return f"{declared.section} options"

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {"Options": []}
        rows.update({f"{title} options": [] for title in api.EXPORT_GROUPS if title != "General"})
        rows.update({title: [] for title in self.sections})
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                rows[self.section(param.name)].append(record)
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)
