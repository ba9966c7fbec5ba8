"""What the kernel's mount table says of the data runtime's mounts, read from /proc/self/mountinfo
(names and points as it escapes them): whether a folder is a mount point and of what type, where
a mount named by its fsname is now (a job may move a folder above it), and a FUSE mount's
read-ahead."""
from __future__ import annotations

import os
import re
from pathlib import Path


def is_mounted(mountpoint: str | Path) -> bool:
    return mount_type(mountpoint) is not None


def unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def placeholder_dir(fsname: str) -> str:
    """The folder name of a placeholder mount's files (placeholders.py): its fsname, as a bind
    mount has no source of its own, so the mount table finds it by this name (its root)."""
    return "tree." + re.sub(r"[^A-Za-z0-9_.-]", "_", fsname)


def find_mounts(fsname: str) -> list[str]:
    """The mount points of the mount named `fsname`, in mount order: the FUSE mounts whose source
    it is, and the binds of its placeholder folder."""
    points: list[str] = []
    tree = placeholder_dir(fsname)
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            fields, tail = line.split(), line.split(" - ", 1)[-1].split()
            fuse = len(tail) > 1 and tail[0].startswith("fuse") and unescape(tail[1]) == fsname
            if fuse or unescape(fields[3]).rsplit("/", 1)[-1] == tree:
                points.append(unescape(fields[4]))
    return points


def _last_at(mountpoint: str | Path) -> list[str] | None:
    """The mount table's line (split) of the last mount at `mountpoint`; None: nothing mounted there."""
    target, found = os.path.realpath(mountpoint), None
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            if unescape(line.split()[4]) == target:
                found = line.split()
    return found


def mount_type(mountpoint: str | Path) -> str | None:
    """The file system type of the last mount at `mountpoint` (None: nothing mounted there)."""
    fields = _last_at(mountpoint)
    return fields[fields.index("-") + 1] if fields else None


def set_readahead(mountpoint: str, kib: int) -> bool:
    """The kernel's read-ahead on a FUSE mount, which is also its largest read request: 128 KiB by
    default (a FUSE server may only lower it at init), so a sequential read was a request and a
    Python call per 128 KiB; 1 MiB here (block mode over a local folder: 246 -> 306 MB/s). Found by
    the mount table. False where it cannot be set (not root)."""
    fields = _last_at(mountpoint)
    if fields is None:
        return False
    try:
        Path(f"/sys/class/bdi/{fields[2]}/read_ahead_kb").write_text(str(kib))
    except OSError:
        return False
    return True
