"""The data runtime's mount as a folder of local placeholder files, filled on first read.

With the runtime's default settings (whole files, attributes that never expire, no cache size) a
FUSE mount still costs every open a round trip to its server: Python's buffered open() asks each
file isatty(), an ioctl the kernel always forwards to FUSE (~60 us; warm reads of 64 KiB files at
0.15x local disk, docs/dataruntime.md). Here the mount is instead the input's listing made real
on the node's cache disk: every folder, and every file as a sparse file of its size and time,
bound read-only at the mount point. Each file carries a fanotify pre-content mark (fanotify.py): its
first read, wherever it comes from (a node's container included), waits while this process
downloads the whole file into it, then the mark goes, and every later open and read is the local
file system's own.

As on the runtime: the listing is there at once and nothing is downloaded to list; a file's first
read downloads that file whole; what is never read is never fetched; a file deleted in storage
after the listing fails its first read, logged as NotFound (EIO: the errors a pre-content answer may
carry are few); writes fail with EROFS. Used only where the input fits the disk beside the
reserved free space (no pruning is ever needed) and the kernel and file system allow the marks;
else the FUSE mount serves (mountfs.py). The listener's group is also held by the process that
asked for the mount: if this process dies, reads still waiting wait on (never a placeholder's zeros).
"""
from __future__ import annotations

import errno
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amlemu.storage.dataruntime import placeholderdisk
from amlemu.storage.dataruntime.cache import DiskCache, mtime_of
from amlemu.storage.dataruntime.fanotify import FAN_ALLOW, FAN_PRE_ACCESS, Event, Group, deny_response, unsupported
from amlemu.storage.dataruntime.logs import RuntimeLog
from amlemu.storage.dataruntime.mounttable import find_mounts, is_mounted, placeholder_dir
from amlemu.storage.dataruntime.settings import Settings


# Up to this many files the placeholders are made in the cache folder itself (under 0.25 s even at
# the root disk's slowest); more get a disk of their own, where files are made 3-20x faster.
ON_CACHE_DISK_FILES = 256


def ineligible(settings: Settings) -> str | None:
    """Why these settings need the FUSE mount (None: placeholders serve them): a TTL, block mode or
    a cache size need a server that sees every open."""
    if not settings.placeholders:
        return "AMLEMU_DATASET_MOUNT_PLACEHOLDERS is false"
    if settings.attribute_cache_ttl is not None:
        return "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL is set"
    if settings.block_based:
        return "block-based caching is on"
    if settings.cache_size is not None:
        return "DATASET_MOUNT_CACHE_SIZE is set"
    return None


def bind_argv(tree: str, stage: str, point: str) -> list[list[str]]:
    """The commands that show `tree` at `point`, read-only from its first moment: made read-only at
    `stage` first and bound from there, since the copies a bind propagates (into a docker node,
    whose disk is an rslave mount) take the flags it has then and never a later remount's."""
    return [["mount", "--bind", tree, stage], ["mount", "-o", "remount,bind,ro,nosuid,nodev", stage],
            ["mount", "--bind", stage, point], ["umount", stage]]


def listing(fs: Any, root: str, only: str | None = None) -> dict[str, dict[str, Any]]:
    """The input's folders and files by path below `root` (one recursive listing; a uri_file
    input: its one file)."""
    if only is not None:
        return {only: fs.info(f"{root}/{only}")} if safe(only) else {}
    found = fs.find(root, withdirs=True, detail=True)
    base = root.rstrip("/")
    below = {name[len(base):].strip("/"): info for name, info in found.items()
             if name.rstrip("/") != base and name.startswith(base + "/")}
    return {path: info for path, info in below.items() if safe(path)}


def safe(path: str) -> bool:
    """A blob name that stays below the folder it is made in: no '..', '.', empty or NUL part (a
    blob may be named 'a/../../x'; its placeholder would be made outside the input's folder)."""
    return all(part not in ("", ".", "..") and "\0" not in part for part in path.split("/"))


class PlaceholderMount:
    """One input's placeholders, their marks and the fills of their first reads."""

    def __init__(self, fs: Any, root: str, cache_dir: Path, log_dir: Path, settings: Settings, fsname: str,
                 only: str | None = None, secrets: tuple[str, ...] = ()) -> None:
        self.fs, self.root, self.settings, self.only = fs, root.rstrip("/"), settings, only
        self.log = RuntimeLog(log_dir, secrets=secrets)
        self.cache = DiskCache(cache_dir, settings, fs, self.log.runtime)
        self.fsname = fsname
        self.tree = cache_dir / placeholder_dir(fsname)  # on a disk of their own, where one can be made
        self.files: dict[int, tuple[str, int]] = {}  # inode -> (path below the root, size)
        self.pending: dict[int, list[Event]] = {}  # reads waiting for a fill, by inode
        self.filled: set[int] = set()
        self.lock = threading.Lock()
        self.fills = ThreadPoolExecutor(max(settings.read_threads, 1), thread_name_prefix="placeholder")
        self.group: Group | None = None
        self.on_disk = False

    def build(self, entries: dict[str, dict[str, Any]]) -> int | None:
        """The placeholders made; the bytes their files will take once read, or None (and nothing
        made) where they cannot be placeholders here (logged)."""
        total = sum(int(i.get("size") or 0) for i in entries.values() if i.get("type") != "directory")
        count = sum(1 for i in entries.values() if i.get("type") != "directory")
        free = self.cache.free_space(self.cache.root)
        reason = None
        if total + self.settings.reserved_free_disk_space > free:
            reason = f"the input's {total} bytes do not fit the {free} bytes free beside the reserved space"
        elif count > self.settings.placeholder_max_files:
            reason = (f"{count} files, more than AMLEMU_DATASET_MOUNT_PLACEHOLDER_MAX_FILES="
                      f"{self.settings.placeholder_max_files}: FUSE lists lazily")
        else:
            disk = None
            room = placeholderdisk.size_for(total, count) + self.settings.reserved_free_disk_space
            if count > ON_CACHE_DISK_FILES and room <= free:
                disk, why = placeholderdisk.make(self.cache.root, placeholderdisk.size_for(total, count))
                if disk is None:
                    self.log.runtime(f"placeholders made in the cache folder: no disk of their own ({why})")
            self.tree = (disk or self.cache.root) / placeholder_dir(self.fsname)
            self.on_disk = disk is not None  # its room taken when made: fills need no more
            self.tree.mkdir(parents=True, exist_ok=True)
            reason = unsupported(str(self.tree))
        if reason is not None:
            self.log.runtime(f"placeholders not used ({reason}): served through FUSE")
            if self.tree.is_dir():
                self.tree.rmdir()
            placeholderdisk.remove(self.cache.root)
            return None
        self.group = Group()
        started = time.monotonic()
        folders = sorted({self.tree / p for p, i in entries.items() if i.get("type") == "directory"}
                         | {(self.tree / p).parent for p, i in entries.items() if i.get("type") != "directory"})
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        base = str(self.tree)
        self.files = dict(self._placeholder(base, p, i) for p, i in entries.items() if i.get("type") != "directory")
        self.log.runtime(f"listed {self.root}: {len(self.files)} files, {len(set(folders) - {self.tree})} folders as placeholders "
                         f"in {time.monotonic() - started:.3f}s")
        return total

    def _placeholder(self, base: str, path: str, info: dict[str, Any]) -> tuple[int, tuple[str, int]]:
        """One file's placeholder (sparse, its size and time, read-only), marked; its inode's entry."""
        size, mtime = int(info.get("size") or 0), mtime_of(info)
        fd = os.open(os.path.join(base, path), os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o444)
        try:
            os.ftruncate(fd, size)
            os.utime(fd, (mtime, mtime))
            self.group.mark_open(fd)  # type: ignore[union-attr]
            return os.fstat(fd).st_ino, (path, size)
        finally:
            os.close(fd)

    def serve(self, mountpoint: str, on_ready: Callable[[int], None]) -> None:
        """Bind the placeholders at `mountpoint`, say so (`on_ready` gets the group's descriptor),
        and answer first reads until the mount is gone."""
        assert self.group is not None, "build() first"
        stage = self.tree.parent / "stage"
        stage.mkdir(exist_ok=True)
        try:
            for argv in bind_argv(str(self.tree), str(stage), mountpoint):
                subprocess.run(argv, check=True, capture_output=True, timeout=30)
        finally:
            if is_mounted(stage):  # a step failed: the stage never outlives this
                subprocess.run(["umount", "-l", str(stage)], capture_output=True, timeout=30)
            stage.rmdir()
        self.log.info(f"mounted {self.root} (block based: false, attribute cache ttl: never expires, cache size: "
                      f"unlimited; local placeholders filled on first read)")
        for name in self.settings.ignored:
            self.log.info(f"{name} is read but not emulated")
        on_ready(self.group.fd)
        try:
            self._listen()
        finally:
            self.fills.shutdown(wait=True)
            self.group.flush()
            self.group.close()
            self.cache.close()
            placeholderdisk.remove(self.cache.root)
            st = self.cache.stats
            self.log.info(f"unmounted {self.root}: {st.bytes_fetched} bytes fetched, {st.files_downloaded} files, "
                          f"0 blocks, 0 pruned, peak cache {st.peak_bytes} bytes")

    def _listen(self) -> None:
        """Events until no mount of the placeholders is left (the mount table's changes wake the wait)."""
        assert self.group is not None
        with open("/proc/self/mountinfo", "rb") as table:
            poll = select.poll()
            poll.register(self.group.fd, select.POLLIN)
            poll.register(table, select.POLLPRI | select.POLLERR)
            while True:
                ready = {fd for fd, _ in poll.poll(1000)}
                if self.group.fd in ready:
                    for event in self.group.read():
                        self._dispatch(event)
                if (table.fileno() in ready or not ready) and not find_mounts(self.fsname):
                    return

    def _dispatch(self, event: Event) -> None:
        """An access to answer: this process's own writes and files already filled at once; a
        first read waits for its file's fill (one fill however many readers)."""
        if not event.mask & FAN_PRE_ACCESS or event.pid == os.getpid():
            self.group.answer(event, FAN_ALLOW)  # type: ignore[union-attr]
            return
        ino = os.fstat(event.fd).st_ino
        with self.lock:
            if ino in self.filled or ino not in self.files:
                first = None
            else:
                first = ino not in self.pending
                self.pending.setdefault(ino, []).append(event)
        if first is None:
            self.group.answer(event, FAN_ALLOW)  # type: ignore[union-attr]
        elif first:
            self.fills.submit(self._fill, ino)

    def _fill(self, ino: int) -> None:
        path, size = self.files[ino]
        started, response = time.monotonic(), FAN_ALLOW
        try:
            if self.on_disk:
                self.cache.take(size)
            elif not self.cache.reserve(size):
                raise OSError(errno.ENOSPC, "no room left beside DATASET_RESERVED_FREE_DISK_SPACE")
            fd = os.open(self.tree / path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self.cache.write_ranges(f"{self.root}/{path}", size, fd)
            except BaseException:
                self.cache.release(size)
                raise
            finally:
                os.close(fd)
            self.group.unmark(str(self.tree / path))  # type: ignore[union-attr]
            self.cache.stats.files_downloaded += 1
            self.log.runtime(f"opened /{path} ({size} bytes, whole file) in {time.monotonic() - started:.3f}s")
        except Exception as exc:  # noqa: BLE001 - any failure is the reader's error, as a FUSE server's
            code = errno.ENOENT if isinstance(exc, FileNotFoundError) else \
                errno.EACCES if isinstance(exc, PermissionError) else getattr(exc, "errno", None) or errno.EIO
            self.log.error("read", f"/{path}", code, "" if code == errno.ENOENT else f"{type(exc).__name__}: {exc}")
            response = deny_response(code)
        with self.lock:
            waiting = self.pending.pop(ino, [])
            if response == FAN_ALLOW:
                self.filled.add(ino)
        for event in waiting:
            self.group.answer(event, response)  # type: ignore[union-attr]
