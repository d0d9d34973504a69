"""What a command may write, and writing it.

Every output is checked, before any work, against every input the command reads (the model and
its external data files, image/data folders, policy and calibration files) by identity: device
and inode after following symlinks, or the resolved path for an output that does not exist yet.
The outputs of a command are staged (temporary files beside each target) and committed together
at the end, so a command writes all its outputs or none. A rewrite follows symlinks (the target
is updated, the link kept) and keeps the existing file's permission bits. Staged files carry the
writing process's pid (`.NAME.qtool-PID-*.tmp`): what a killed process left beside a target the
next write into that folder removes.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import Opt, QtoolError, Words
from .model import external_locations, read_model_header
from .scratch import discard as _unlink  # remove a file, whatever became of it
from .scratch import running


@dataclass(frozen=True)
class Input:
    """A path a command reads. kind: "file"; "model" (also its external data files); "folder"
    (every file under it)."""

    path: Path
    label: str | Words = "an input file"  # Words when it names an option: Words("a {images} file", images=Opt("images"))
    kind: str = "file"


def model_input(path, label: str | Words = "the model") -> Input | None:
    return None if path is None else Input(Path(path), label, "model")


def folder_input(path, label: str | Words) -> Input | None:
    return None if path is None else Input(Path(path), label, "folder")


def option_file(key: str, article: str = "a") -> Words:
    """The label of a file an option names: "a --images file" (the command line), "a images= file" (Python)."""
    return Words(f"{article} {{option}} file", {"option": Opt(key)})


def file_input(path, label: str | Words) -> Input | None:
    return None if path is None else Input(Path(path), label, "file")


def _as_input(item) -> Input | None:
    if item is None or isinstance(item, Input):
        return item
    return Input(Path(item))


def _model_files(path: Path) -> list[tuple[str, Path]]:
    """The model and the external data files it refers to (none when it cannot be read)."""
    files = [("the model", path)]
    try:
        proto = read_model_header(path, weightless=True)  # bounded: no device or FIFO read for ever
    except Exception:  # missing, unreadable or no model: the command itself says so later
        return files
    return files + [("the model's external data file", path.parent / loc) for loc in external_locations(proto)]


def _expand(inp: Input) -> list[tuple[str, Path]]:
    """(label, path) of every file `inp` stands for."""
    if inp.kind == "model":
        files = _model_files(inp.path)
        return [(inp.label if p == inp.path else label, p) for label, p in files]
    if inp.kind == "folder":
        if not inp.path.is_dir():
            return [(inp.label, inp.path)]
        found = []
        for root, _dirs, names in os.walk(inp.path, followlinks=True):
            found.extend((inp.label, Path(root) / n) for n in sorted(names))
        return found
    return [(inp.label, inp.path)]


def _identity(path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # follows symlinks
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def same_file(a, b) -> bool:
    """Whether paths `a` and `b` name one file: by device and inode when both exist, else by
    resolved path."""
    ia, ib = _identity(a), _identity(b)
    if ia is not None and ib is not None:
        return ia == ib
    return os.path.realpath(a) == os.path.realpath(b)


def _conflict(out: Path, inputs) -> tuple[str, Path] | None:
    """The first input (label, path) that `out` would overwrite."""
    ident = _identity(out)
    real = os.path.realpath(out)
    for item in inputs:
        inp = _as_input(item)
        if inp is None:
            continue
        if ident is None:
            # a new file cannot be an existing input; compare resolved paths (inputs not there yet)
            if inp.kind == "folder":
                continue
            candidates = [(inp.label, inp.path)]
        else:
            candidates = _expand(inp)
        for label, path in candidates:
            if ident is not None and _identity(path) == ident:
                return label, path
            if ident is None and os.path.realpath(path) == real:
                return label, path
    return None


def check_output_path(path: str | os.PathLike, *, inputs=(), what: str = "output path", model: bool = False) -> Path:
    """Fail early (before any work) if `path` cannot be written or would overwrite an input
    (`model`: an ONNX model, whose external data file may go beside it, qtool.model.writer.data_path).

    inputs: Input items (model_input, folder_input, file_input), or plain paths of input files.
    """
    out = Path(path)
    if out.is_dir():
        raise QtoolError(f"{what} {str(out)!r} is a directory; give a file name")
    real = Path(os.path.realpath(out))
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise QtoolError("output directory {parent!r} does not exist; create it or choose another {output} path", parent=str(parent),
                         output=Opt("output"))
    if not real.parent.is_dir():
        raise QtoolError(f"{what} {str(out)!r} is a symlink into {str(real.parent)!r}, which does not exist; choose another output path")
    try:  # the real test of writability (permissions, read-only mounts, root on /proc)
        fd, probe = tempfile.mkstemp(prefix=_prefix(real), suffix=".probe", dir=real.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        shown = parent if real.parent == Path(os.path.realpath(parent)) else real.parent
        raise QtoolError(f"output directory {str(shown)!r} is not writable ({e.strerror or e}); choose another output path") from None
    hit = _conflict(out, inputs)
    if hit is not None:
        label, src = hit
        raise QtoolError("{what} {out!r} is an input file ({label} {src!r}); refusing to overwrite it", what=what, out=str(out), label=label,
                         src=str(src))
    if model:
        _check_data_file(out, inputs)
    return out


_STAGED = re.compile(r"\..+\.qtool-(\d+)-\w+\.(tmp|bak|probe)")
_swept: set[str] = set()


def _prefix(real: Path) -> str:
    return f".{real.name}.qtool-{os.getpid()}-"


def sweep_staged(folder: Path) -> list[Path]:
    """Remove the staged files and backups that killed qtool processes of this user left in
    `folder` (their pid no longer runs); once per folder and process. Returns them."""
    key = os.path.realpath(folder)
    if key in _swept:
        return []
    _swept.add(key)
    removed = []
    try:
        entries = list(os.scandir(key))
    except OSError:
        return removed
    for entry in entries:
        m = _STAGED.fullmatch(entry.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if entry.is_file(follow_symlinks=False) and st.st_uid == os.getuid() and not running(int(m.group(1))):
            _unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class Outputs:
    """The outputs of one command: each checked when added, staged when written, and all
    committed by commit() (or none: an exception inside `with Outputs(...)` removes the staged
    files and leaves every target as it was).

        with Outputs(inputs=(model_input(m), folder_input(d, option_file("images")))) as outs:
            out = outs.add(output)
            ... work ...
            outs.write(out, data)
            outs.commit()
    """

    def __init__(self, inputs=()):
        self.inputs = list(inputs)
        self._added: list[tuple[Path, str]] = []
        self._staged: dict[str, tuple[str, Path]] = {}  # real target -> (temporary file, path as given)

    def add(self, path: str | os.PathLike, option: str = "output") -> Path:
        """`path`, checked, as the output the option `option` (its key) names."""
        out = check_output_path(path, inputs=self.inputs)
        for other, other_option in self._added:
            if same_file(out, other):
                raise QtoolError("{option} and {other} name the same file ({out!r}); choose two paths", option=Opt(option),
                                 other=Opt(other_option), out=str(out))
        self._added.append((out, option))
        return out

    def write(self, path: str | os.PathLike, data) -> None:
        """Stage `data` for `path`: a temporary file beside the file `path` names (symlinks followed).
        `data`: bytes, an iterable of bytes (calibration.json_chunks), or a model to write (qtool.model.writer.ModelFile: piece by piece, and
        when it needs external data, that file beside `path` too, staged and committed with it)."""
        from .model.writer import ModelFile, data_path

        if isinstance(data, (bytes, bytearray, memoryview)):
            self._stage(path, [data])
        elif not isinstance(data, ModelFile):  # pieces of bytes, written as they come
            self._stage(path, data)
        elif not data.external():
            self._stage(path, data.chunks())
        else:
            extra = data_path(path)
            _check_data_file(Path(path), self.inputs)
            header, chunks = data.external_chunks(extra.name)
            self._stage(extra, chunks)  # renamed before the .onnx file that refers to it
            self._stage(path, [header])

    def _stage(self, path: str | os.PathLike, chunks) -> None:
        out = Path(path)
        real = Path(os.path.realpath(out))
        key = str(real)
        if key in self._staged:
            _unlink(self._staged.pop(key)[0])
        sweep_staged(real.parent)
        try:
            fd, tmp = tempfile.mkstemp(prefix=_prefix(real), suffix=".tmp", dir=real.parent)
        except OSError as e:
            self.discard()
            raise QtoolError(f"cannot write {str(out)!r}: {e.strerror or e}; nothing was written") from None
        self._staged[key] = (tmp, out)
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            _copy_mode(real, tmp)
        except BaseException as e:
            self.discard()
            if isinstance(e, OSError):  # disk full, quota, I/O error
                raise QtoolError(f"cannot write {str(out)!r}: {e.strerror or e}; nothing was written") from None
            raise

    def commit(self) -> None:
        """Rename every staged file over its target; on a failure the targets already replaced
        are restored, so either all outputs are written or none."""
        done: list[tuple[Path, str | None]] = []  # (target, its backup: None when it did not exist)
        shown: Path | None = None
        try:
            for key, staged in list(self._staged.items()):
                tmp, shown = staged
                real = Path(key)
                backup = _backup(real)
                try:
                    os.replace(tmp, real)
                except BaseException:
                    if backup:
                        _unlink(backup)
                    raise
                done.append((real, backup))
                del self._staged[key]
        except BaseException as e:
            for real, backup in reversed(done):
                try:
                    if backup:
                        os.replace(backup, real)
                    else:
                        os.unlink(real)
                except OSError:
                    pass
            self.discard()
            if isinstance(e, OSError):
                raise QtoolError(f"cannot write {str(shown)!r}: {e.strerror or e}; nothing was written") from None
            raise
        for real, backup in done:
            if backup:
                _unlink(backup)
            _sync_dir(real.parent)

    def discard(self) -> None:
        for tmp, _ in self._staged.values():
            _unlink(tmp)
        self._staged.clear()

    def __enter__(self) -> Outputs:
        return self

    def __exit__(self, *exc) -> None:
        self.discard()  # anything not committed


def _check_data_file(out: Path, inputs) -> None:
    """A model written to `out` may need external data beside it (qtool.model.writer.data_path):
    refused before any work when that file is an input."""
    from .model.writer import data_path

    hit = _conflict(data_path(out), inputs)
    if hit is not None:
        label, src = hit
        raise QtoolError("{out!r} would write its external data over {label} {src!r}; choose another output path", out=str(out), label=label,
                         src=str(src))


def _copy_mode(real: Path, tmp: str) -> None:
    """The temporary file gets the permission bits (and, when allowed, the owner) of the file it
    replaces; a new file gets the default mode (0666 less the umask)."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        os.chmod(tmp, 0o666 & ~_umask())
        return
    if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            pass
    os.chmod(tmp, st.st_mode & 0o7777)


def _backup(real: Path) -> str | None:
    """A hard link to the existing `real` (to restore it if a later output fails), or None."""
    if not real.exists():
        return None
    for _ in range(10):
        name = str(real.parent / f"{_prefix(real)}{os.urandom(6).hex()}.bak")
        try:
            os.link(real, name)
            return name
        except FileExistsError:
            continue
        except OSError:  # no hard links here: no rollback for this file
            return None
    return None


def _sync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data) -> None:
    """Write `data` (bytes or a model: Outputs.write) to a temporary file beside `path`, fsync it,
    then rename it over `path` (the file a symlink names, keeping its mode). One output (with the
    external data a big model needs): replaced whole or not at all."""
    with Outputs() as outs:
        outs.write(path, data)
        outs.commit()
