"""The host's file operations on a node's disk, which the job can write: never follow a link there.

A job is untrusted code, and it is root on its node: it can replace any folder of its disk with a
symbolic link (to `/`, to another run's record) or leave a fifo behind. The platform therefore
touches a node's disk only while no job process runs on the node, checks every folder on the way
with lstat, and removes links and special files before it copies or uploads anything from there.
"""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path


class UnsafePath(RuntimeError):
    """A path the platform was about to use leads out of the node's disk."""


def _real_dirs(root: Path, parts: tuple[str, ...]) -> Path:
    """root/parts..., each made a real folder: a link or file in the way is removed, not followed."""
    path = root
    for part in parts:
        if part in ("", ".", "..") or "/" in part:
            raise UnsafePath(f"{part!r} is not a folder name")
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            path.mkdir()
            continue
        if not stat.S_ISDIR(mode):
            path.unlink()  # the job's link or file: the platform owns this name
            path.mkdir()
    return path


def fresh_dir(root: Path, rel: str) -> Path:
    """An empty folder at root/rel, every folder on the way real (created as needed)."""
    if stat.S_ISLNK(os.lstat(root).st_mode):
        raise UnsafePath(f"{root} is a link")
    *parents, leaf = Path(rel).parts
    parent = _real_dirs(root, tuple(parents))
    target = parent / leaf
    remove(target)
    target.mkdir()
    return target


def inside(root: Path, rel: str) -> Path | None:
    """root/rel when every folder on the way is a real folder (no link), else None."""
    path = root
    for part in Path(rel).parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except FileNotFoundError:
            return None
    return path


def remove(path: Path) -> None:
    """Remove a file, link or tree without following links (shutil.rmtree is fd-based on Linux)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def strip_links(root: Path) -> list[str]:
    """Remove every symbolic link and special file (fifo, socket, device) under root, so that what
    is left can be copied or uploaded by ordinary code; returns what was removed, relative to root.
    Azure ML uploads files; a link the job made would be resolved on the host, not on the node."""
    removed = []
    if not root.is_dir() or root.is_symlink():
        return removed
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                path.unlink()
                removed.append(str(path.relative_to(root)))
        dirs[:] = [d for d in dirs if not Path(folder, d).is_symlink() and Path(folder, d).exists()]
    return removed


def wipe(root: Path) -> None:
    """Empty a node's disk or scratch folder: nothing a run left there is seen by the next run on
    the node. Only what lies on root's own file system goes: a mount point under it (software
    mirrored into a container's /root) is another file system, and removing it from the host
    would detach it inside the node's mount namespace."""
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(top.st_mode):
        _clear(root, top.st_dev)


def _clear(folder: Path, dev: int) -> bool:
    """Remove what is in folder on device dev; True when folder is left empty."""
    empty = True
    for entry in os.scandir(folder):
        info = entry.stat(follow_symlinks=False)
        if info.st_dev != dev:
            empty = False
        elif stat.S_ISDIR(info.st_mode):
            if _clear(Path(entry.path), dev):
                os.rmdir(entry.path)
            else:
                empty = False
        else:
            os.unlink(entry.path)
    return empty


def copy_file(root: Path, rel: str, dest: Path) -> bool:
    """Copy root/rel to dest while the job may be changing the disk: every step is opened with
    O_NOFOLLOW, so a link swapped in at any moment fails the copy instead of leading elsewhere.
    False when the file is not there (or not a regular file)."""
    *parents, leaf = Path(rel).parts
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)]
    try:
        for part in parents:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1]))
        if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
            return False
        partial = dest.with_name(f".{dest.name}.partial")
        with open(fds.pop(), "rb") as src, open(partial, "wb") as out:
            shutil.copyfileobj(src, out)
        os.replace(partial, dest)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)
