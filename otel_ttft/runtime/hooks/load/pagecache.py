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
from typing import Any


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
    lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return lib


MADV_POPULATE_READ = 22  # Linux 5.14: fault a range in, reading what is not cached; EINVAL before


def _missing_pages(libc: ctypes.CDLL, start: int, length: int) -> int | None:
    pages = (length + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(start, length, vec) != 0:
        return None  # not a mapping mincore answers for
    return bytes(vec).count(0)


def fault_in(tensor: Any, libc: ctypes.CDLL) -> int:
    """Bring a host tensor's pages into memory now; the bytes that were not resident (0: none,
    or not a host tensor).

    safetensors hands out tensors that view its memory map of the file: on a cold page cache the
    storage reads happen as page faults wherever the tensor is first touched, which is inside the
    copy to the device. Faulting them in here, inside the reader's timed step, puts the disk time
    in the read stage and leaves the copy to time the copy; the same pages are read either way.
    """
    if getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return 0
    nbytes = int(tensor.numel() * tensor.element_size())
    if nbytes == 0:
        return 0
    ptr = int(tensor.data_ptr())
    start = ptr & ~(mmap.PAGESIZE - 1)
    length = ptr + nbytes - start
    missing = _missing_pages(libc, start, length)
    if not missing:
        return 0
    if libc.madvise(start, length, MADV_POPULATE_READ) != 0:
        _touch(tensor)  # older kernels: one byte read per page does the same
    return min(missing * mmap.PAGESIZE, nbytes)


def _touch(tensor: Any) -> None:
    import torch  # a tensor is here: torch is imported already

    if not tensor.is_contiguous():
        return
    flat = tensor.detach().reshape(-1).view(dtype=torch.uint8)
    flat[::mmap.PAGESIZE].sum()
    flat[-1:].sum()


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
