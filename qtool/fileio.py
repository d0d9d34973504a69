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
    try:  # the real test of writability (permissions, read-only mounts, root on /proc)
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise QtoolError(f"output directory {str(parent)!r} is not writable ({e.strerror or e}); choose another output path") from None
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
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if str(out.parent) else ".")
    except OSError as e:
        raise QtoolError(f"cannot write {str(out)!r}: {e.strerror or e}; choose another output path") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):  # disk full, quota, I/O error
            raise QtoolError(f"cannot write {str(out)!r}: {e.strerror or e}; nothing was written") from None
        raise
