"""The commands' one rule for the files they read and the files they write.

Reading: only regular files (and store directories, which the caller walks); every open is
non-blocking and checked with ``fstat``, so a FIFO, ``/dev/zero`` or a socket is a one-line
refusal, never a hang or an endless read; whole-file reads are capped, and the message names the
cap.

Writing: the target is checked before any input is read (not a directory, not a device or FIFO,
not one of the inputs, its directory exists) and again before it is replaced; the content goes
to a temporary file beside it, is fsynced, and is renamed over the target only when everything
succeeded. On any failure the temporary file is removed and an existing target is untouched.
``-`` is standard output where a command allows it: the content is spooled first, so stdout,
too, gets everything or nothing.

Every failure is an :class:`InputError` or :class:`OutputError` with a one-line message that
names the file; the commands print it and exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, BinaryIO

STDOUT = "-"
# Sidecar files a database keeps beside itself: writing over them is writing over the input.
_SIDECARS = ("-wal", "-shm", "-journal")


class _PathError(ValueError):
    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path, self.reason = os.fspath(path), reason


class InputError(_PathError):
    """A path a command cannot read as given; one line naming it."""


class OutputError(_PathError):
    """A target a command will not or cannot write; one line naming it."""


def size_text(n: int) -> str:
    """Bytes as a person reads a limit: 64 MiB, 1 GiB, 512 KiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def describe_mode(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _describe_target(st: os.stat_result) -> str:
    """What a non-regular output target is; Linux's always-full device (character 1:7, as
    /dev/full) says that writing there fails as a full disk does."""
    if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 7):
        return "a character device that is always full (no space left on device)"
    return describe_mode(st.st_mode)


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


# Write errors that say the disk is full, in the words a person looks for.
_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}


def write_failure(exc: OSError, directory: str | os.PathLike[str] | None) -> str:
    """Why a write failed, for a one-line message: a full device says so and names where
    (the file system holding ``directory``, or stdout's device when None)."""
    full = _FULL.get(exc.errno)  # type: ignore[arg-type]
    if full is None:
        return f"cannot write: {_reason(exc)}"
    where = "stdout's device" if directory is None else f"the file system holding {directory}"
    return f"cannot write: {full} ({where} is full)"


# --- reading -----------------------------------------------------------------------------------
def input_kind(path: str | os.PathLike[str]) -> str:
    """``"dir"`` or ``"file"`` for a path a command may read; InputError for anything else
    (missing, a FIFO, a device, a socket). ``stat`` never blocks, whatever the path is."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {_reason(exc)}") from None
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    raise InputError(path, f"{describe_mode(mode)}, not a regular file")


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, refused unless ``fstat`` says it is a regular file. Opened
    with O_NONBLOCK, so a FIFO without a writer cannot block the open (the flag is cleared
    again for the regular file's reads)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except OSError as exc:  # ENXIO: a socket; EACCES; ELOOP ...
        what = "a socket, not a regular file" if exc.errno == 6 else f"cannot read: {_reason(exc)}"
        raise InputError(path, what) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(path, f"{describe_mode(mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_CHUNK = 1 << 20  # what one read asks for beyond the size the file had when opened


def read_bytes(path: str | os.PathLike[str], cap: int, what: str = "this file") -> bytes:
    """The whole regular file, refused when it holds more than ``cap`` bytes (checked before
    reading, and while reading, for a file that grows). Reads what the file holds, never the
    cap: a buffer of its size, then bounded chunks to EOF (a file that grew, or one whose size
    ``stat`` does not know, as in /proc), so a large cap reserves no memory."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            raise InputError(path, f"larger than the {size_text(cap)} cap for {what}")
        chunks: list[bytes] = []
        total = 0
        try:
            want = size + 1  # one byte more than it holds: EOF seen in the first read
            while total <= cap:
                chunk = f.read(min(want, cap + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                want = _CHUNK
        except OSError as exc:
            raise InputError(path, f"cannot read: {_reason(exc)}") from None
        except MemoryError:
            raise InputError(path, f"not enough memory to read its {size_text(size)}"
                             ) from None
    if total > cap:
        raise InputError(path, f"larger than the {size_text(cap)} cap for {what}")
    if len(chunks) == 1:
        return chunks[0]
    try:
        return b"".join(chunks)
    except MemoryError:
        raise InputError(path, f"not enough memory to read its {size_text(total)}") from None


def read_header(path: str | os.PathLike[str], n: int) -> bytes:
    """The first ``n`` bytes of a regular file (to tell a database from JSON)."""
    with open_regular(path) as f:
        try:
            return f.read(n)
        except OSError as exc:
            raise InputError(path, f"cannot read: {_reason(exc)}") from None


# --- writing -----------------------------------------------------------------------------------
def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _input_files(inputs: Iterable[str], reserved: tuple[str, ...]) -> list[tuple[Path, Path]]:
    """(input as given, file that must not be written) for every input; a directory stands
    for the ``reserved`` names in it (a store's database and its sidecars, existing or not: a
    reader may create them). Other files beside them are no input: ``analyze out/demo --json
    out/demo/analysis.json`` may replace its previous analysis."""
    out: list[tuple[Path, Path]] = []
    for given in inputs:
        if given == STDOUT:
            continue
        path = Path(given)
        if path.is_dir():
            out += [(path, path / (name + s)) for name in reserved for s in ("", *_SIDECARS)]
        else:
            out.append((path, path))
            out += [(path, path.with_name(path.name + s)) for s in _SIDECARS]
    return out


class Output:
    """A file a command will write, checked when the command line is read (before any input),
    written with :meth:`open` or :meth:`write` once everything is read."""

    def __init__(self, target: str | os.PathLike[str], *,
                 inputs: Iterable[str | os.PathLike[str]] = (), reserved: Iterable[str] = (),
                 allow_stdout: bool = True) -> None:
        """``inputs``: files and directories the command reads (never written over);
        ``reserved``: names inside an input directory that count as its files even while
        absent."""
        self.target = os.fspath(target)
        self.inputs = [os.fspath(i) for i in inputs]
        self.reserved = tuple(reserved)
        self.allow_stdout = allow_stdout
        self.path = self._check()

    @property
    def is_stdout(self) -> bool:
        return self.path is None

    def __str__(self) -> str:
        return "stdout" if self.path is None else self.target

    def _check(self) -> Path | None:
        """The real path to replace (symbolic links followed), None for stdout."""
        target = self.target
        if target == STDOUT:
            if not self.allow_stdout:
                raise OutputError(target, "stdout is not possible here; give a file name")
            return None
        if not target.strip():
            raise OutputError(repr(target), "the output file name is empty")
        hint = "; give a file name" + (" (or - for stdout)" if self.allow_stdout else "")
        path = Path(target)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        except NotADirectoryError:
            raise OutputError(target, f"cannot write: {path.parent} is not a directory"
                              ) from None
        except OSError as exc:
            raise OutputError(target, f"cannot write: {_reason(exc)}") from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise OutputError(target, f"is a directory{hint}")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise OutputError(target, f"{_describe_target(st)}, not a regular file{hint}")
        real = path.resolve()
        parent = real.parent
        try:
            parent_mode = os.stat(parent).st_mode
        except FileNotFoundError:
            raise OutputError(target, f"cannot write: the directory {path.parent} does not "
                              "exist") from None
        except OSError as exc:
            raise OutputError(target, f"cannot write: {_reason(exc)}") from None
        if not stat.S_ISDIR(parent_mode):
            raise OutputError(target, f"cannot write: {path.parent} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputError(target, f"cannot write in {path.parent}: permission denied")
        identity = None if st is None else (st.st_dev, st.st_ino)
        for given, member in _input_files(self.inputs, self.reserved):
            if member.resolve() == real or (identity is not None
                                           and _identity(member) == identity):
                raise OutputError(target, f"is the input {given} (or a file of it); "
                                  "write the output elsewhere")
        return real

    @contextlib.contextmanager
    def open(self, *, binary: bool = False) -> Iterator[IO]:
        """A file to write the whole content to; it becomes the target only when the block
        ends without an exception. Write errors (disk full, file too large) are OutputError."""
        path = self._check()  # again: the target may have changed while the input was read
        where = str(self)
        spool_dir = tempfile.gettempdir() if path is None else path.parent
        try:
            spool = _spool(path)
        except OSError as exc:
            raise OutputError(where, write_failure(exc, spool_dir)) from None
        tmp = None if path is None else Path(spool.name)
        try:
            try:
                handle = spool if binary else _Text(spool)
                yield handle
                handle.flush()
                if path is not None:
                    os.fchmod(spool.fileno(), _mode_for(path))
                    os.fsync(spool.fileno())
            except OSError as exc:
                raise OutputError(where, write_failure(exc, spool_dir)) from None
            if path is None:
                spool.seek(0)
                try:
                    sys.stdout.flush()
                    shutil.copyfileobj(spool, sys.stdout.buffer)  # BrokenPipeError: the CLI's
                    sys.stdout.buffer.flush()
                except BrokenPipeError:
                    raise
                except OSError as exc:
                    raise OutputError(where, write_failure(exc, None)) from None
                return
            spool.close()
            self._check()
            try:
                os.replace(tmp, path)
                tmp = None
            except OSError as exc:
                raise OutputError(where, write_failure(exc, path.parent)) from None
            _fsync_dir(path.parent)
        finally:
            with contextlib.suppress(OSError):
                spool.close()
            if tmp is not None:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def write(self, data: str | bytes) -> None:
        """All of ``data``, or nothing."""
        with self.open(binary=isinstance(data, bytes)) as f:
            f.write(data)


class _Text:
    """UTF-8 text onto a binary file, without TextIOWrapper's close-on-collect of the file."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw

    def write(self, text: str) -> int:
        return self._raw.write(text.encode("utf-8"))

    def flush(self) -> None:
        self._raw.flush()


def _spool(path: Path | None) -> IO[bytes]:
    """Where the content goes first: beside the target (the rename is then atomic), or an
    anonymous temporary file for stdout."""
    if path is None:
        return tempfile.TemporaryFile()  # noqa: SIM115 - closed by Output.open
    return tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by Output.open
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False)


def _mode_for(path: Path) -> int:
    """An existing target keeps its permissions; a new one gets what the umask allows."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
