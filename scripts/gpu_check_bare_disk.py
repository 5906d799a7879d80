"""The disk side of the bare GPU check: the page cache read with ``mincore`` (the script's own
reading, not our hook's), a file dropped from it, a plain sequential read, and a safetensors
checkpoint written in the format itself."""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import time
from typing import Any

MiB = 1 << 20


def resident(path: str) -> float:
    """The file's share resident in the page cache: ``mincore`` over a mapping of Python's own
    ``mmap`` (the script's reading, another route than our hook's ``libc.mmap``). A private,
    writable mapping only to reach its address; nothing is written, nothing is read."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    if not pages:
        return 1.0
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        anchor = ctypes.c_char.from_buffer(mapped)
        failed = libc.mincore(ctypes.addressof(anchor), size, vec)
        del anchor
    finally:
        mapped.close()
    if failed:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in bytes(vec)) / pages


def drop(path: str) -> float:
    """The file out of the page cache (written back, then ``POSIX_FADV_DONTNEED``); what
    ``mincore`` still finds resident."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident(path)


def plain_read_gb_per_s(path: str) -> float:
    """The dropped file read sequentially with read(2), 16 MiB at a time."""
    start, total = time.perf_counter(), 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(16 * MiB):
            total += len(chunk)
    return total / (time.perf_counter() - start) / 1e9


def write_checkpoint(torch: Any, directory: str, mib: int) -> tuple[str, int]:
    """A safetensors shard of ``mib`` MiB (bf16 tensors of 64 MiB, each one value), written in
    the format itself (an 8-byte header size, a JSON header, the data: safetensors' own writer
    needs numpy, which the image may not have); its path and tensor bytes."""
    import json
    import struct

    count, numel = max(mib // 64, 1), 32 * MiB
    header: dict[str, Any] = {}
    for i in range(count):
        start = i * numel * 2
        header[f"model.layers.{i}.mlp.weight"] = {"dtype": "BF16", "shape": [numel],
                                                  "data_offsets": [start, start + numel * 2]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    fd, path = tempfile.mkstemp(suffix=".safetensors", dir=directory)
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for i in range(count):
            bf16 = struct.pack("<f", float(i % 7))[2:]  # a float32's upper half
            chunk = bf16 * (4 * MiB)
            for _ in range(numel * 2 // len(chunk)):
                f.write(chunk)
    return path, count * numel * 2


def shapes_of(path: str) -> dict[str, list[int]]:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {name: f.get_slice(name).get_shape() for name in f.keys()}  # noqa: SIM118
