"""The read-only file system the mount serves: a folder of an fsspec filesystem, as Azure ML's data
runtime serves a v2 `ro_mount` input.

- Listings are fetched per folder when first read (nothing is downloaded to list), and with them
  every child's attributes: a file's size is known without opening it.
- Attributes and listings are kept for DATASET_MOUNT_ATTRIBUTE_CACHE_TTL, by default forever: a
  blob changed in storage during the mount keeps its old attributes and its cached copy (the stale
  read users meet on AmlCompute) until the TTL passes.
- Whole-file mode (the default): open() downloads that one file into the cache and returns when it
  is there. A file that cannot fit the cache is streamed in blocks instead.
- Where attributes never expire, files are cached whole and the cache has no size limit (the
  defaults), the kernel opens files without asking the server (FUSE's no-open: the first open
  answers ENOSYS), keeps their pages across opens and sends no release, and close sends no flush:
  a warm read of a file read before is the page cache's. A read that misses the page cache comes
  by path and downloads the file into the cache when it is not there (its first read waits, not
  its open; a denied file fails there). What still reaches the server per open is Python's
  isatty() (an ioctl FUSE always forwards), ~60 us whatever answers it (docs/dataruntime.md).
- Block mode: a read fetches the blocks it touches and starts fetching the next
  READ_BUFFER_BLOCK_COUNT; blocks are cached under the same size limit, so a file larger than the
  disk reads through with bounded disk use.
"""
from __future__ import annotations

import errno
import itertools
import os
import posixpath
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mfusepy

from amlemu.storage.dataruntime.cache import RANGE, DiskCache, mtime_of, version_of
from amlemu.storage.dataruntime.logs import RuntimeLog
from amlemu.storage.dataruntime.settings import Settings


KEPT_COPIES = 64  # no-open: the cached copies kept open between reads


@dataclass
class Handle:
    path: str
    remote: str
    version: str
    size: int
    fd: int | None = None  # whole-file mode: the cached copy
    last: tuple[int, bytes] | None = None  # block mode: the block read last (FUSE reads 128 KiB at a time)


class DataRuntimeFS(mfusepy.Operations):
    use_ns = True

    def __init__(self, fs: Any, root: str, cache_dir: Path, log_dir: Path, settings: Settings,
                 clock: Callable[[], float] = time.monotonic, on_ready: Callable[[], None] | None = None,
                 only: str | None = None, secrets: tuple[str, ...] = ()) -> None:
        self.fs, self.root, self.settings, self.clock = fs, root.rstrip("/"), settings, clock
        self.only = only  # a uri_file input: its folder shows that one file, nothing beside it
        self.log = RuntimeLog(log_dir, secrets=secrets)
        self.cache = DiskCache(cache_dir, settings, fs, self.log.runtime)
        self.on_ready = on_ready
        self.attrs: dict[str, tuple[dict[str, Any] | None, float]] = {}  # None: known not to exist
        self.listings: dict[str, tuple[list[str], float]] = {}
        self.handles: dict[int, Handle] = {}
        self.numbers = itertools.count(1)  # 0: no handle (no-open: reads come by path)
        # No-open where nothing a later open could check may change (see the module's notes): attributes
        # never expire, whole files, no cache size to keep (the server sees only page cache misses).
        self.no_open = settings.attribute_cache_ttl is None and not settings.block_based and settings.cache_size is None
        self.opened: set[str] = set()  # no-open: the files whose first read was logged
        self.copies: OrderedDict[str, int] = OrderedDict()  # no-open: cached copies kept open (pinned), newest last
        self.mutex = threading.Lock()

    # --- attributes and listings -------------------------------------------------------------
    def _fresh(self, at: float) -> bool:
        ttl = self.settings.attribute_cache_ttl
        return ttl is None or self.clock() - at < ttl

    def remote(self, path: str) -> str:
        return f"{self.root}/{path.strip('/')}" if path.strip("/") else self.root

    def _fail(self, operation: str, path: str, exc: BaseException) -> mfusepy.FuseOSError:
        code = errno.ENOENT if isinstance(exc, FileNotFoundError) else \
            errno.EACCES if isinstance(exc, PermissionError) else getattr(exc, "errno", None) or errno.EIO
        self.log.error(operation, path, code, "" if code == errno.ENOENT else f"{type(exc).__name__}: {exc}")
        return mfusepy.FuseOSError(code)

    def info(self, path: str) -> dict[str, Any]:
        """A path's attributes: cached while fresh, from its folder's listing when listed."""
        path = "/" + path.strip("/")
        if path == "/":
            return {"type": "directory", "size": 0}
        if self.only is not None and path.split("/")[1] != self.only:
            raise self._fail("getattr", path, FileNotFoundError(path))
        with self.mutex:
            cached = self.attrs.get(path)
            parent = self.listings.get(posixpath.dirname(path))
        if cached is not None and self._fresh(cached[1]):
            if cached[0] is None:
                raise self._fail("getattr", path, FileNotFoundError(path))
            return cached[0]
        if parent is not None and self._fresh(parent[1]) and posixpath.basename(path) not in parent[0]:
            raise self._fail("getattr", path, FileNotFoundError(path))
        try:
            self._forget(posixpath.dirname(path), path)
            info = self.fs.info(self.remote(path))
        except (FileNotFoundError, PermissionError) as exc:
            with self.mutex:
                self.attrs[path] = (None, self.clock())
            raise self._fail("getattr", path, exc) from None
        with self.mutex:
            self.attrs[path] = (info, self.clock())
        return info

    def _forget(self, *paths: str) -> None:
        """fsspec's own listings cache (adlfs keeps one per instance) dropped for these paths: the
        TTL above decides how long a listing is trusted, not the filesystem's cache."""
        for path in paths:
            self.fs.invalidate_cache(self.remote(path))

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        info = self.info(path)
        directory = info.get("type") == "directory"
        mtime = int(mtime_of(info) * 1e9)
        return {"st_mode": (stat.S_IFDIR | 0o555) if directory else (stat.S_IFREG | 0o444),
                "st_nlink": 2 if directory else 1, "st_size": 0 if directory else int(info.get("size") or 0),
                "st_mtime": mtime, "st_ctime": mtime, "st_atime": mtime, "st_uid": 0, "st_gid": 0}

    def readdir(self, path: str, fh: int) -> list[str]:
        path = "/" + path.strip("/")
        if self.only is not None and path == "/":
            self.info("/" + self.only)
            return [".", "..", self.only]
        with self.mutex:
            cached = self.listings.get(path)
        if cached is not None and self._fresh(cached[1]):
            return [".", "..", *cached[0]]
        try:
            self._forget(path)
            entries = self.fs.ls(self.remote(path), detail=True)
        except (FileNotFoundError, PermissionError) as exc:
            raise self._fail("readdir", path, exc) from None
        names, now = [], self.clock()
        with self.mutex:
            for entry in entries:
                name = posixpath.basename(entry["name"].rstrip("/"))
                if not name or name in names:
                    continue
                names.append(name)
                self.attrs[posixpath.join(path, name)] = (entry, now)
            self.listings[path] = (names, now)
        self.log.runtime(f"listed {path}: {len(names)} entries")
        return [".", "..", *names]

    # --- files -------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise self._fail("open", path, OSError(errno.EROFS, "read-only mount"))
        info = self.info(path)
        if info.get("type") == "directory":
            raise mfusepy.FuseOSError(errno.EISDIR)
        if self.no_open:  # the kernel takes it as a success, and opens every file from now on itself
            raise mfusepy.FuseOSError(errno.ENOSYS)
        handle = Handle(path, self.remote(path), version_of(info), int(info.get("size") or 0))
        if not self.settings.block_based:
            self._open_whole(handle)
        number = next(self.numbers)
        with self.mutex:
            self.handles[number] = handle
        return number

    def _open_whole(self, handle: Handle, told: bool = False) -> None:
        """The handle's cached copy opened (downloaded first when missing); `told`: not logged again."""
        started = time.monotonic()
        try:
            copy = self.cache.file(self._key(handle), handle.remote, handle.size)
        except (FileNotFoundError, PermissionError) as exc:
            raise self._fail("read" if self.no_open else "open", handle.path, exc) from None
        if copy is None:
            if not told:
                self.log.runtime(f"{handle.path}: {handle.size} bytes do not fit the cache; streaming it in blocks")
            return
        handle.fd = os.open(copy, os.O_RDONLY)
        if not told:
            self.log.runtime(f"opened {handle.path} ({handle.size} bytes, whole file) in {time.monotonic() - started:.3f}s")

    def _read_by_path(self, path: str, size: int, offset: int) -> bytes:
        """No-open's read (a miss of the kernel's page cache) from the file's cached copy. The last
        KEPT_COPIES copies read stay open and pinned: a large file's reads come 128 KiB at a time,
        and opening its copy for each halved a first read's speed. Each read has a dup of the
        descriptor of its own, which a copy closed meanwhile leaves valid."""
        info = self.info(path)
        handle = Handle(path, self.remote(path), version_of(info), int(info.get("size") or 0))
        key = self._key(handle)
        with self.mutex:
            if key in self.copies:
                self.copies.move_to_end(key)
                handle.fd = os.dup(self.copies[key])
        if handle.fd is None:
            self._open_whole(handle, key in self.opened)  # downloaded when missing, pinned
            with self.mutex:
                self.opened.add(key)  # logged once downloaded and opened (a failed read is logged as one)
                if handle.fd is not None:
                    self._keep_copy(key, handle.fd)
                    handle.fd = os.dup(handle.fd)
        try:
            return self._read(handle, size, offset)
        finally:
            if handle.fd is not None:
                os.close(handle.fd)

    def _keep_copy(self, key: str, fd: int) -> None:
        """(Under the mutex.) A copy kept open; the least recently read beyond KEPT_COPIES closed and unpinned."""
        if key in self.copies:  # another read opened it meanwhile: one pin, one descriptor kept
            self._drop_copy(key, self.copies.pop(key))
        self.copies[key] = fd
        while len(self.copies) > KEPT_COPIES:
            self._drop_copy(*self.copies.popitem(last=False))

    def _drop_copy(self, key: str, fd: int) -> None:
        os.close(fd)
        self.cache.unpin(key)

    def _key(self, handle: Handle, block: int | None = None) -> str:
        return f"{handle.path}@{handle.version}" + (f"#{block}" if block is not None else "")

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        if fh == 0:
            return self._read_by_path(path, size, offset)
        return self._read(self.handles[fh], size, offset)

    def _read(self, handle: Handle, size: int, offset: int) -> bytes:
        if handle.fd is not None:
            return os.pread(handle.fd, size, offset)
        end = min(offset + size, handle.size)
        index, within = divmod(offset, self.settings.read_block_size)
        if within + end - offset <= self.settings.read_block_size:  # within one block: one copy
            return self._block(handle, index)[within:within + end - offset]
        out = bytearray()
        while offset < end:
            index, within = divmod(offset, self.settings.read_block_size)
            data = self._block(handle, index)
            piece = data[within:within + end - offset]
            if not piece:
                break
            out += piece
            offset += len(piece)
        return bytes(out)

    def _block(self, handle: Handle, index: int) -> bytes:
        if handle.last is not None and handle.last[0] == index:
            return handle.last[1]
        self._read_ahead(handle, index)
        bsize = self.settings.read_block_size
        try:
            data = self.cache.block(self._key(handle, index), handle.remote, index * bsize,
                                    min((index + 1) * bsize, handle.size))
        except (FileNotFoundError, PermissionError) as exc:
            raise self._fail("read", handle.path, exc) from None
        handle.last = (index, data)
        return data

    def _read_ahead(self, handle: Handle, index: int) -> None:
        """Start fetching the next blocks, as many as READ_BUFFER_BLOCK_COUNT says and the memory
        cache holds beside the one being read (more would evict each other before being read). Blocks
        go in aligned groups of RANGE bytes, one request a group: as the window slides one block,
        the group it reaches is fetched whole, never one 2 MiB request a block."""
        bsize, count = self.settings.read_block_size, self.settings.read_buffer_block_count
        count = min(count, max(self.settings.memory_cache_size // bsize - 2, 0))
        if count == 0:
            return
        per_group = max(min(RANGE // bsize, count), 1)
        last = (handle.size - 1) // bsize
        for group in range((index + 1) // per_group, min(index + count, last) // per_group + 1):
            blocks = range(max(group * per_group, index + 1), min((group + 1) * per_group - 1, last) + 1)
            run: list[int] = []
            for block in blocks:
                if self.cache.claim(self._key(handle, block)):
                    run.append(block)
                elif run:  # cached or being fetched: what was claimed so far goes as one request
                    self._fetch_run(handle, run)
                    run = []
            if run:
                self._fetch_run(handle, run)

    def _fetch_run(self, handle: Handle, run: list[int]) -> None:
        bsize = self.settings.read_block_size
        keys = [self._key(handle, i) for i in run]
        self.cache.pool.submit(self._quiet_prefetch, keys, handle.remote, run[0] * bsize, bsize,
                               min((run[-1] + 1) * bsize, handle.size))

    def _quiet_prefetch(self, keys: list[str], remote: str, start: int, bsize: int, end: int) -> None:
        try:
            self.cache.prefetch(keys, remote, start, bsize, end)
        except Exception as exc:  # noqa: BLE001 - a read-ahead that fails is retried by the read itself
            self.log.runtime(f"read-ahead of {remote} [{start}, {end}) failed: {type(exc).__name__}")

    def flush(self, path: str, fh: int) -> int:
        raise mfusepy.FuseOSError(errno.ENOSYS)  # nothing to write back: the kernel stops sending it

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            handle = self.handles.pop(fh, None)
        if handle is not None and handle.fd is not None:
            os.close(handle.fd)
            self.cache.unpin(self._key(handle))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": 4096, "f_frsize": 4096, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0, "f_namemax": 1024}

    # --- lifecycle ---------------------------------------------------------------------------
    def init(self, path: str) -> None:
        s = self.settings
        self.log.info(f"mounted {self.root} (block based: {str(s.block_based).lower()}, attribute cache ttl: "
                      f"{'never expires' if s.attribute_cache_ttl is None else f'{s.attribute_cache_ttl}s'}, "
                      f"cache size: {s.cache_size if s.cache_size is not None else 'unlimited'})")
        for name in s.ignored:
            self.log.info(f"{name} is read but not emulated")
        if self.on_ready is not None:
            self.on_ready()

    def destroy(self, path: str) -> None:
        with self.mutex:
            while self.copies:
                self._drop_copy(*self.copies.popitem())
        self.cache.close()
        st = self.cache.stats
        self.log.info(f"unmounted {self.root}: {st.bytes_fetched} bytes fetched, {st.files_downloaded} files, "
                      f"{st.blocks_fetched} blocks, {st.pruned} pruned, peak cache {st.peak_bytes} bytes")
