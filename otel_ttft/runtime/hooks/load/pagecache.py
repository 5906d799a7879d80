"""How much of a file already sits in the page cache: tells a cold checkpoint read from a warm one.

A read-only mmap plus one ``mincore`` call: no data is read, the cost is one byte per page of
bookkeeping. Linux only; returns None anywhere it cannot answer.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os


def open_libc() -> ctypes.CDLL:
    """libc with the three calls typed (``mmap``, ``munmap``, ``mincore``). Finding it runs
    ``ldconfig``: a caller that asks often keeps the handle (the load family's state does) and
    passes it to :func:`resident_ratio`."""
    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                         ctypes.c_int, ctypes.c_long)
    lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return lib


def resident_ratio(path: str | os.PathLike, *, libc: ctypes.CDLL | None = None) -> float | None:
    """Fraction (0..1) of the file's pages resident in the page cache right now (``libc`` from
    :func:`open_libc`, found afresh when not given)."""
    try:
        libc = libc if libc is not None else open_libc()
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 1.0
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in bytes(vec)) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: str | os.PathLike) -> bool:
    """Drop a file's pages from the cache (POSIX_FADV_DONTNEED), for cold reads. Dirty pages
    (a file written in the last half minute) cannot be dropped, only written back, so they are
    written back first; pages some process has mapped stay (``resident_ratio`` tells)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        # Allowed on a read-only descriptor, a no-op for clean files; a file system without it
        # still has its clean pages dropped by the advice below.
        with contextlib.suppress(OSError):
            os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def filesystem_type(path: str | os.PathLike, mounts: str | os.PathLike = "/proc/mounts"
                    ) -> str | None:
    """The mount type serving ``path`` (longest matching mount point in ``mounts``)."""
    try:
        real = os.path.realpath(path)
        best, fstype = "", None
        with open(mounts) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1]
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and \
                        len(mount) >= len(best):
                    best, fstype = mount, parts[2]
        return fstype
    except OSError:
        return None
