"""Files between fsspec filesystems (a folder, a blob container), planned first: `plan_tree` says
which files a copy sends and which it skips, `copy_files` sends them. `data upload|download|sync`
are these two; their dry runs print the plan."""
from __future__ import annotations

import posixpath
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlemu.actions import Action

CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class FileCopy:
    source: str  # the path in the source filesystem
    target: str  # the path in the destination filesystem
    rel: str  # the path relative to both roots
    size: int
    skip: bool  # already there with the same size


def list_files(fs: Any, base: str) -> list[tuple[str, int]]:
    """(path, size) of the file at `base` or of every file under it; empty when nothing is there."""
    if fs.isfile(base):
        return [(base, fs.size(base))]
    if not fs.exists(base):
        return []
    return sorted((p, info["size"]) for p, info in fs.find(base, detail=True).items())


def plan_tree(src: tuple[Any, str], dst: tuple[Any | None, str], overwrite: bool = False) -> list[FileCopy]:
    """The file at src, or every file under it, to the same relative path under dst; unless
    overwrite, files already there with the same size are skipped (a re-run sends only what
    changed). A destination filesystem of None was not read: nothing is known to be there."""
    (src_fs, src_root), (dst_fs, dst_root) = src, dst
    plan = []
    for path, size in list_files(src_fs, src_root):
        rel = posixpath.relpath(path, src_root) if path != src_root else posixpath.basename(path)
        target = posixpath.join(dst_root, rel)
        same = not overwrite and dst_fs is not None and dst_fs.exists(target) and dst_fs.size(target) == size
        plan.append(FileCopy(path, target, rel, size, skip=same))
    return plan


def copy_file(src_fs: Any, source: str, dst_fs: Any, target: str) -> None:
    dst_fs.makedirs(posixpath.dirname(target), exist_ok=True)  # a no-op on blob storage
    with src_fs.open(source, "rb") as reader, dst_fs.open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer, CHUNK)


def get_file(fs: Any, remote: str, target: Path) -> None:
    """One file down to this machine."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(remote, str(target))


def run_transfer(plan: list[Action], progress: Callable[[int, int], None] | None = None) -> int:
    """Carry out a transfer's plan (its copy and skip steps carry their size) with a progress
    callback (bytes done, bytes in all); returns the bytes covered."""
    total, done = sum(a.detail.get("size", 0) for a in plan), 0
    for action in plan:
        if action.run is not None:
            action.run()
        if "size" in action.detail:
            done += action.detail["size"]
            if progress:
                progress(done, total)
    return total


def copy_files(src_fs: Any, dst_fs: Any, plan: list[FileCopy],
               progress: Callable[[int, int], None] | None = None) -> tuple[list[str], list[str]]:
    """Carry out a plan_tree plan; returns the relative paths copied and those skipped."""
    total, done, copied, skipped = sum(f.size for f in plan), 0, [], []
    for f in plan:
        if f.skip:
            skipped.append(f.rel)
        else:
            copy_file(src_fs, f.source, dst_fs, f.target)
            copied.append(f.rel)
        done += f.size
        if progress:
            progress(done, total)
    return copied, skipped


def sync_tree(src: tuple[Any, str], dst: tuple[Any, str], progress: Callable[[int, int], None] | None = None,
              overwrite: bool = False) -> tuple[list[str], list[str]]:
    """plan_tree, then copy_files: returns the relative paths copied and those skipped."""
    return copy_files(src[0], dst[0], plan_tree(src, dst, overwrite), progress)
