"""qtool's temporary files: one directory per process, `qtool-<pid>-*` in the system's temporary
folder, created when first needed and removed at exit (a normal one, an exception, or a signal
the CLI turns into an exit). A process killed outright (SIGKILL, the OOM killer) cannot clean up:
the next qtool command removes the directories of this user's qtool processes that no longer run.

A file a library insists on writing by path (onnxruntime's optimized model) is kept in memory
where the system allows it (a Linux memfd, gone with the process however it ends), and in that
directory elsewhere.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_NAME = re.compile(r"qtool-(\d+)-[a-z0-9_]{8}")
# earlier qtool versions wrote onnxruntime's optimized model to a directory of this name, without
# the pid: one holding only that file and untouched for an hour is a killed run's
_OLD_NAME = re.compile(r"qtool-[a-z0-9_]{8}")
_OLD_AGE = 3600
_dir: tuple[int, Path] | None = None  # (the pid that made it, the directory)


def directory() -> Path:
    """This process's temporary directory (made on first use, removed at exit)."""
    global _dir
    if _dir is None or _dir[0] != os.getpid():  # a forked child makes its own
        sweep()
        _dir = (os.getpid(), Path(tempfile.mkdtemp(prefix=f"qtool-{os.getpid()}-")))
        atexit.register(remove)
    return _dir[1]


def release() -> None:
    """Remove this process's temporary directory now if nothing is in it (it is made again when next needed): a
    process killed outright afterwards leaves nothing (calibrate's optimized weights: qtool.runtime.nchwc)."""
    global _dir
    if _dir is not None and _dir[0] == os.getpid():
        try:
            os.rmdir(_dir[1])
        except OSError:  # something is in it: kept until exit
            return
        _dir = None


def remove() -> None:
    """Remove this process's temporary directory, if it made one."""
    global _dir
    if _dir is not None and _dir[0] == os.getpid():
        shutil.rmtree(_dir[1], ignore_errors=True)
        _dir = None


def running(pid: int) -> bool:
    """Whether process `pid` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: running
        return True
    return True


def sweep(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the temporary directories that qtool processes of this user left when killed (their
    pid no longer runs); returns them."""
    root = Path(root if root is not None else tempfile.gettempdir())
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        m = _NAME.fullmatch(entry.name)
        old = m is None and _OLD_NAME.fullmatch(entry.name)
        if not (m or old) or (m and int(m.group(1)) == os.getpid()):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.getuid():
                continue
            if m and running(int(m.group(1))):
                continue
            if old and (time.time() - st.st_mtime < _OLD_AGE or os.listdir(entry.path) not in ([], ["optimized.onnx"])):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _memfd(name: str) -> int | None:
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError:
        return None


def _read_all(fd: int) -> bytes:
    with os.fdopen(os.dup(fd), "rb", buffering=0) as f:  # one allocation: readall sizes it from fstat
        f.seek(0)
        return f.readall()


def written_by(write: Callable[[str], object], name: str) -> bytes:
    """The bytes `write(path)` writes to the file `path`: a file in memory where the system has
    them, else a file in directory(), removed before this returns."""
    fd = _memfd(name)
    if fd is not None:
        try:
            write(f"/proc/self/fd/{fd}")
            return _read_all(fd)
        finally:
            os.close(fd)
    path = directory() / f"{os.urandom(4).hex()}-{name}"
    try:
        write(str(path))
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def open_file(name: str) -> tuple[int, str]:
    """(descriptor, path) of a new empty file in directory() that another library opens by its
    real path (onnxruntime refuses a memfd's /proc path for external data); close_file removes it."""
    path = directory() / f"{os.urandom(4).hex()}-{name}"
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), str(path)


def discard(path: str) -> None:
    """Remove the file `path`, whatever became of it (gone already, or not removable: left)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def close_file(fd: int, path: str) -> None:
    os.close(fd)
    Path(path).unlink(missing_ok=True)
