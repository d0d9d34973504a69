"""Atomic output files: an existing output is replaced whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import QtoolError


def check_output_path(path: str | os.PathLike, *, inputs: tuple = ()) -> Path:
    """Fail early (before any work) if `path` cannot be written or would overwrite an input."""
    out = Path(path)
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise QtoolError(f"output directory {str(parent)!r} does not exist; create it or choose another -o path")
    if not os.access(parent, os.W_OK):
        raise QtoolError(f"output directory {str(parent)!r} is not writable; choose another -o path")
    if out.is_dir():
        raise QtoolError(f"output path {str(out)!r} is a directory; give a file name")
    for src in inputs:
        try:
            same = out.exists() and os.path.samefile(out, src)
        except OSError:
            same = False
        if same or out.resolve() == Path(src).resolve():
            raise QtoolError(f"output path {str(out)!r} is an input file; refusing to overwrite it")
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it over `path`."""
    out = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
