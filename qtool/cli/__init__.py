"""Command line: the only place that prints, sets up logging, or exits. One module per command,
each parsing its arguments, calling one function of qtool.api and printing what it returns; no
module here imports another qtool module than qtool.api and qtool.errors (this one also the process
set-up: scratch, the onnxruntime log, histogram), as tests/test_layers.py checks.

Exit codes: 0 success, 1 user error (bad input or request), 2 usage error (click),
3 internal error (a bug: the traceback is saved to a file), 130 interrupted (Ctrl-C), 143 terminated
(SIGTERM), 129 hung up (SIGHUP).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import pkgutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable

import click

from .. import JSON_SCHEMA, __version__
from ..errors import QtoolError, UsageError

log = logging.getLogger("qtool")

EPILOG = "Exit codes: 0 ok, 1 bad input, bad request or failed check, 2 bad command line, 3 internal error (a bug), 130/143/129 interrupted (SIGINT/SIGTERM/SIGHUP)."


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


def _setup_logging(quiet: bool, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.ERROR if quiet else logging.DEBUG if verbose else logging.INFO)


def _restore_logging(handlers: list, propagate: bool, level: int) -> None:
    log.handlers[:] = handlers
    log.propagate = propagate
    log.setLevel(level)


# --json on the command line: every exit prints exactly one JSON document on stdout, a failure
# {"error": <the message>, "exit": <code>} (set when the group parses its arguments).
_json = {"wanted": False, "printed": False}


def _wants_json(args: list[str]) -> bool:
    """Whether `args` (the command line after `qtool`) hold --json before any `--`."""
    args = list(args)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def json_document(document: dict) -> None:
    """Print the one JSON document of this run on stdout."""
    click.echo(json.dumps(document, indent=1))
    _json["printed"] = True


def _json_error(message: str, code: int, **more) -> None:
    """With --json, the failure's document (unless the command printed its own already)."""
    if _json["wanted"] and not _json["printed"]:
        json_document({"schema": JSON_SCHEMA, "error": message, "exit": code, **more})


class _Group(click.Group):
    """Turns QtoolError into a one-line message and exit 1, and a bug into exit 3 (with --json,
    each also a JSON document on stdout, as is a usage error). The commands are imported when
    first looked up (main's handling of Ctrl-C covers those imports), and each also takes -q/-v
    after its name."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _json.update(wanted=_wants_json(args), printed=False)
        return super().parse_args(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str):
        _register_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context):
        _register_commands()
        return super().list_commands(ctx)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        cmd.params.extend([
            click.Option(["-q", "--quiet"], is_flag=True, expose_value=False, callback=_late_flag,
                         help="As `qtool -q`: only errors on stderr; no progress bar."),
            click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_late_flag,
                         help="As `qtool -v`: debug messages on stderr."),
        ])
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except QtoolError as e:
            command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            message = e.worded(flags(command))
            _json_error(message, 1)
            click.echo(f"error: {message}", err=True)
            ctx.exit(1)
        except click.ClickException as e:
            _json_error(e.format_message(), e.exit_code)
            raise
        except (click.exceptions.Exit, click.exceptions.Abort, KeyboardInterrupt):
            raise
        except Exception as e:
            if _caused_by_ctrl_c(e):  # e.g. onnxruntime's import turns it into "initialization failed"
                raise KeyboardInterrupt from e
            where = _save_traceback()
            message = f"internal error (a bug in qtool): {type(e).__name__}: {e}; traceback saved to {where}"
            _json_error(message, 3, traceback=where)
            click.echo(message, err=True)
            ctx.exit(3)


def _caused_by_ctrl_c(error: BaseException) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@click.group(cls=_Group, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qtool")
@click.option("-q", "--quiet", is_flag=True, help="Only errors on stderr; no progress bar.")
@click.option("-v", "--verbose", is_flag=True, help="Debug messages on stderr.")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """INT8 calibration for ONNX models."""
    from ..statistics import histogram

    before = log.handlers[:], log.propagate, log.level
    ctx.call_on_close(lambda: _restore_logging(*before))  # run in-process, the caller's logging is as it was after
    _setup_logging(quiet, verbose)
    histogram.WITHOUT_BLAS_PROBE = True  # a command's process is qtool's
    ctx.obj = {"quiet": quiet, "verbose": verbose}
    _quiet_onnxruntime()


def _late_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """-q/-v given after the command: the same as before it."""
    if not value or ctx.obj is None:
        return
    ctx.obj[param.name] = True
    _setup_logging(ctx.obj["quiet"], ctx.obj["verbose"])


def _quiet_onnxruntime() -> None:
    """onnxruntime's default logger writes warnings (coloured, on stderr) for sessions and at
    import; a command says what matters itself (see qtool.runtime.onnxruntime)."""
    from ..runtime.onnxruntime import quiet

    quiet()


def progress(total: int, enabled: bool):
    """A tqdm bar on a terminal; else no bar at all (tqdm and the multiprocessing lock it makes not
    even imported: 1 MB of a small calibration's memory)."""
    if not (enabled and sys.stderr.isatty()):
        return contextlib.nullcontext()
    from tqdm import tqdm

    return tqdm(total=total, unit="img", file=sys.stderr, leave=False)


def flags(command: click.Command | None) -> dict[str, str]:
    """Option key -> the flag that gives it on `command` (each option's parameter is named by its key;
    the first of its flags: -o for output), for the messages of qtool.errors."""
    if command is None:
        return {}
    return {p.name: p.opts[0] for p in command.params if isinstance(p, click.Option)}


def call(function, /, *args, **kwargs):
    """`function` of qtool.api; a request it calls a usage error is click's (exit 2, with the
    command's usage line), its options named by the flags of the command."""
    try:
        return function(*args, **kwargs)
    except UsageError as e:
        raise click.UsageError(e.worded(flags(click.get_current_context().command))) from None


def finish(result, as_json: bool, text: Callable) -> None:
    """Print what a command did (its result as JSON, or `text(result)`); then a failed check it
    reports is an error (exit 1; in the JSON document too, as its "error" and "exit")."""
    failure = getattr(result, "failure", None)
    if as_json:
        document = result.to_json()
        if failure:
            document = {**document, "error": failure.worded(flags(click.get_current_context().command)), "exit": 1}
        json_document(document)
    else:
        click.echo(text(result))
    if failure:
        raise failure


def _save_traceback() -> str:
    fd, path = tempfile.mkstemp(prefix="qtool-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exc(file=f)
    return path


class _Signalled(SystemExit):
    """SIGTERM or SIGHUP: exit 128 + the signal's number."""


def _terminated(signum, frame):
    # unwinds like an exception, so staged outputs are removed on the way out
    raise _Signalled(128 + signum)


def _exit_now(code: int) -> None:
    """Exit after a signal without waiting for other threads. CPython runs a signal handler
    between any two bytecodes, so the exception it raises may have left an import lock held
    that a thread still importing waits for; exiting normally then waits for that thread for
    ever. The temporary directory goes first (os._exit skips atexit)."""
    from .. import scratch

    scratch.remove()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps every outcome to a documented exit code."""
    from .. import scratch

    signal.signal(signal.SIGTERM, _terminated)
    if hasattr(signal, "SIGHUP"):  # the terminal closed
        signal.signal(signal.SIGHUP, _terminated)
    try:
        scratch.sweep()  # what killed qtool processes left
        rv = cli.main(args=argv, prog_name="qtool", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _json_error("interrupted", 130)
        click.echo("interrupted", err=True)
        _exit_now(130)
    except _Signalled as e:
        _json_error(f"interrupted by signal {e.code - 128}", e.code)
        _exit_now(e.code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


_registered = False


def _register_commands() -> None:
    """Import every module of this package (once): each defines one command on `cli`."""
    global _registered
    if _registered:
        return
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}")
    _registered = True
