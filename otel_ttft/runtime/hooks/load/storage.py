"""Where a checkpoint lives: file system, network/FUSE flag, block device and whether it spins.

Evidence for "was the read slow because of the storage": read from /proc/mounts and /sys only,
never by touching the file's data. Every answer is None where this machine does not show it
(an overlay or tmpfs has no block device; a container may hide /sys).
"""

from __future__ import annotations

import os

from otel_ttft.runtime.hooks.load import pagecache

# Mount types whose reads leave the machine or go through a user-space daemon.
_REMOTE_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "glusterfs", "9p",
              "virtiofs", "gpfs", "beegfs", "afs", "fuse", "fuseblk"}


def is_remote(fs_type: str | None) -> bool | None:
    """True for network file systems and any FUSE mount (s3fs, gcsfuse, blobfuse: fuse.*)."""
    if not fs_type:
        return None
    return fs_type in _REMOTE_FS or fs_type.startswith("fuse.")


def block_device(path: str | os.PathLike) -> tuple[str | None, bool | None]:
    """(device name, rotational) of the block device holding ``path``, where /sys shows it."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None, None
    sys_dir = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    try:
        name = os.path.basename(os.path.realpath(sys_dir))
    except OSError:
        return None, None
    if not os.path.exists(sys_dir):
        return None, None
    rotational = None
    # A partition has no queue/ of its own: its parent disk's answers for it.
    for queue in (f"{sys_dir}/queue/rotational", f"{sys_dir}/../queue/rotational"):
        try:
            with open(queue) as f:
                rotational = f.read().strip() == "1"
            break
        except OSError:
            continue
    return name, rotational


def evidence(paths: list[str]) -> dict[str, object]:
    """Storage facts for a set of checkpoint files (the first file's mount speaks for all)."""
    if not paths:
        return {}
    first = paths[0]
    fs_type = pagecache.filesystem_type(first)
    device, rotational = block_device(first)
    return {"fs_type": fs_type, "remote": is_remote(fs_type), "device": device,
            "rotational": rotational}
