"""The blobfuse-style cache of one node: blob paths kept as a real directory tree on the node's disk.

A file is fetched whole on first use and recorded with its ETag and fetch time; afterwards it is
served locally. While an entry (and the listing it came from) is younger than the TTL, a changed,
added or deleted blob is not noticed: the stale read AmlCompute users meet. After the TTL the entry
is revalidated by ETag (never by Last-Modified, which has 1 s resolution) and fetched again only
if it changed. The default TTL is the job's lifetime: the next job on the node revalidates.

Several processes may fill one cache at once: each path is filled under its own lock, through a
temporary file renamed into place, so a reader sees the whole old file or the whole new one.
The tree (`data/`) is what nodes see, read-only; metadata and locks stay beside it.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import posixpath
import re
import shutil
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amlemu.errors import AmlEmuError, ConfigError, NotFoundError

MB = 1024 * 1024
TTL_VAR = "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL"  # milliseconds; unset: never expires (within the job)
SIZE_VAR = "DATASET_MOUNT_CACHE_SIZE"
RESERVED_VAR = "DATASET_RESERVED_FREE_DISK_SPACE"
NOT_EMULATED = ("DATASET_MOUNT_READ_BLOCK_SIZE", "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT",
                "DATASET_MOUNT_READ_THREADS", "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED",
                "DATASET_MOUNT_MEMORY_CACHE_SIZE", "DATASET_UNMOUNT_TIMEOUT_SECONDS")
BATCH = 256  # paths locked and fetched together (one parallel transfer; bounded open lock files)
WORKERS = 8  # parallel fetches for download mode


class CacheError(AmlEmuError):
    """The node cache cannot hold what the job needs (size limit, free disk)."""


def parse_size(value: str, field: str) -> int:
    """'150MB', '10 GB', '1048576' -> bytes (binary units, as Azure ML's data runtime reads them)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)B?\s*", value.upper())
    if not match:
        raise ConfigError(field, f"'{value}' is not a size", "write bytes, or a number with KB, MB or GB")
    return int(match.group(1)) * 1024 ** " KMGT".index(match.group(2) or " ")


@dataclass(frozen=True)
class CachePolicy:
    """When a cached entry is still trusted, and how big the cache may grow."""

    ttl: float | None = None  # seconds from fetch; None: the job's lifetime
    valid_since: float = 0.0  # entries fetched before this are expired (the job's start, for ttl None)
    size_limit: int | None = None
    reserved_free: int = 150 * MB
    keep_free: int | None = None  # a negative DATASET_MOUNT_CACHE_SIZE: the disk space to leave free

    def fresh(self, fetched_at: float, now: float) -> bool:
        if fetched_at < self.valid_since:
            return False
        return self.ttl is None or now - fetched_at < self.ttl


def policy_from_env(env: dict[str, str], job_start: float = 0.0) -> tuple[CachePolicy, list[str]]:
    """The job's Azure ML data-runtime variables -> (policy, notices about knobs not emulated)."""
    def field(name: str) -> str:
        return f"environment_variables.{name}"

    ttl = None
    if env.get(TTL_VAR, "").strip():
        try:
            ttl = int(env[TTL_VAR]) / 1000
        except ValueError:
            raise ConfigError(field(TTL_VAR), f"'{env[TTL_VAR]}' is not a number of milliseconds",
                              "e.g. 120000 for blobfuse's 120 s; leave it unset for the job's lifetime") from None
        if ttl < 0:
            raise ConfigError(field(TTL_VAR), "must not be negative")
    size, keep_free = None, None
    if env.get(SIZE_VAR, "").strip():
        # Azure ML's data runtime: a positive size caps the cache, a negative one is how much of the
        # disk to leave free ("-10GB": the cache may use all but 10 GB).
        value = env[SIZE_VAR].strip()
        negative = value.startswith("-")
        parsed = parse_size(value[1:] if negative else value, field(SIZE_VAR))
        size, keep_free = (None, parsed) if negative else (parsed, None)
    reserved = parse_size(env[RESERVED_VAR], field(RESERVED_VAR)) if env.get(RESERVED_VAR, "").strip() else 150 * MB
    notices = [f"{name} is not emulated: the node cache fetches whole files" for name in NOT_EMULATED if name in env]
    return CachePolicy(ttl, 0.0 if ttl is not None else job_start, size, reserved, keep_free), notices


@dataclass(frozen=True)
class Source:
    """Where blobs come from: a datastore's fsspec filesystem and the root (container) within it."""

    key: str  # the datastore's name: the top folder in the cache tree
    fs: Any
    root: str

    def remote(self, path: str) -> str:
        return posixpath.join(self.root, path) if path else self.root


@dataclass
class SyncReport:
    files: int = 0
    downloaded: int = 0
    revalidated: int = 0  # expired, unchanged by ETag: kept without a download
    stale: int = 0  # served from the cache without asking the remote (younger than the TTL)
    removed: int = 0
    bytes: int = 0
    listed: bool = False  # the listing was fetched now (not served from the cache)

    def line(self) -> str:
        return (f"{self.files} file(s): {self.downloaded} fetched ({self.bytes / MB:.1f} MiB), "
                f"{self.revalidated} revalidated by ETag, {self.stale} served from cache, {self.removed} removed")


def etag_of(info: dict[str, Any]) -> str:
    """Blob ETag; a local file's stand-in changes with its content's size, mtime or inode."""
    if info.get("etag"):
        return str(info["etag"])
    return f"local-{info.get('size')}-{info.get('mtime')}-{info.get('ino')}"


class NodeCache:
    def __init__(self, root: Path, clock: Callable[[], float] = time.time) -> None:
        self.root, self.clock = root, clock
        self.data = root / "data"
        for sub in ("data", "locks", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript("""
                PRAGMA journal_mode=WAL;
                CREATE TABLE IF NOT EXISTS entries (key TEXT, path TEXT, etag TEXT, size INTEGER,
                    fetched_at REAL, used_at REAL, PRIMARY KEY (key, path));
                CREATE TABLE IF NOT EXISTS listings (key TEXT, prefix TEXT, fetched_at REAL, files TEXT,
                    PRIMARY KEY (key, prefix));
            """)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        # A connection per use: several threads and processes share the file; SQLite serialises them.
        db = sqlite3.connect(self.root / "meta.db", timeout=60, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit; the cache can be refilled
        try:
            yield db
        finally:
            db.close()

    def local_path(self, key: str, path: str) -> Path:
        return self.data / key / path

    # --- listing -----------------------------------------------------------------------------
    def _listing(self, source: Source, prefix: str, policy: CachePolicy, now: float) -> tuple[dict[str, list], bool]:
        """{path: [etag, size]} under prefix, served from the cache while it is fresh."""
        with self._db() as db:
            row = db.execute("SELECT fetched_at, files FROM listings WHERE key = ? AND prefix = ?",
                             (source.key, prefix)).fetchone()
        if row and policy.fresh(row[0], now):
            return json.loads(row[1]), False
        base = source.remote(prefix)
        if source.fs.isfile(base):
            found = {prefix: source.fs.info(base)}
        else:
            found = {posixpath.relpath(p, source.root): info
                     for p, info in source.fs.find(base, detail=True).items() if info.get("type") == "file"}
        if not found:
            raise NotFoundError("path", f"{prefix or '/'} in datastore {source.key}",
                                f"list what is there with `amlemu data ls azureml://datastores/{source.key}/paths/`")
        files = {p: [etag_of(info), int(info["size"])] for p, info in sorted(found.items())}
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO listings VALUES (?, ?, ?, ?)",
                       (source.key, prefix, now, json.dumps(files)))
        return files, True

    # --- entries -----------------------------------------------------------------------------
    def _lock_file(self, key: str, path: str) -> Path:
        return self.root / "locks" / hashlib.sha1(f"{key}/{path}".encode()).hexdigest()

    @contextmanager
    def _locked(self, key: str, path: str) -> Iterator[None]:
        with open(self._lock_file(key, path), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def _fill(self, source: Source, files: dict[str, list], policy: CachePolicy, now: float) -> dict[str, str]:
        """Every file present and trusted -> {path: 'stale' | 'revalidated' | 'downloaded'}.
        Paths are taken in batches under their locks and fetched with one parallel transfer per
        batch; a path another process holds is waited for, then found filled (one download)."""
        outcomes: dict[str, str] = {}
        waiting: list[str] = []
        paths = sorted(files)
        for start in range(0, len(paths), BATCH):
            with ExitStack() as held:
                mine = []
                for path in paths[start:start + BATCH]:
                    fh = held.enter_context(open(self._lock_file(source.key, path), "a"))
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        mine.append(path)
                    except BlockingIOError:
                        waiting.append(path)
                outcomes.update(self._fill_locked(source, {p: files[p] for p in mine}, policy, now))
        for path in waiting:
            with self._locked(source.key, path):
                outcomes.update(self._fill_locked(source, {path: files[path]}, policy, now))
        return outcomes

    def _fill_locked(self, source: Source, files: dict[str, list], policy: CachePolicy, now: float) -> dict[str, str]:
        if not files:
            return {}
        with self._db() as db:
            rows = {r[0]: r[1:] for r in db.execute(
                f"SELECT path, etag, size, fetched_at FROM entries WHERE key = ? AND path IN ({','.join('?' * len(files))})",
                (source.key, *files))}
        outcomes, fetch = {}, []
        for path, (etag, _) in files.items():
            row, target = rows.get(path), self.local_path(source.key, path)
            present = row is not None and target.is_file() and target.stat().st_size == row[1]
            if present and policy.fresh(row[2], now):
                outcomes[path] = "stale"
            elif present and row[0] == etag:
                outcomes[path] = "revalidated"
            else:
                outcomes[path] = "downloaded"
                fetch.append(path)
        tmps = {path: self.root / "tmp" / uuid.uuid4().hex for path in fetch}
        try:
            if fetch:  # fsspec expands and sorts the remote list: keep both lists in that order
                source.fs.get([source.remote(p) for p in fetch], [str(tmps[p]) for p in fetch])
            for path in fetch:
                target = self.local_path(source.key, path)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmps[path], target)  # readers see the whole old file or the whole new one
        finally:
            for tmp in tmps.values():
                tmp.unlink(missing_ok=True)
        with self._db() as db:
            db.execute("BEGIN")
            for path, outcome in outcomes.items():
                row = rows.get(path)
                fetched, etag = (row[2], row[0]) if outcome == "stale" else (now, files[path][0])
                db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                           (source.key, path, etag, self.local_path(source.key, path).stat().st_size, fetched, now))
            db.execute("COMMIT")
        return outcomes

    def _remove(self, key: str, path: str) -> None:
        with self._locked(key, path):
            self.local_path(key, path).unlink(missing_ok=True)
            with self._db() as db:
                db.execute("DELETE FROM entries WHERE key = ? AND path = ?", (key, path))

    # --- the one operation -------------------------------------------------------------------
    def sync(self, source: Source, prefix: str, policy: CachePolicy) -> SyncReport:
        """Make `prefix` of the source present in the tree as the policy says a mount would see it."""
        now = self.clock()
        files, listed = self._listing(source, prefix, policy, now)
        report = SyncReport(files=len(files), listed=listed)
        self._make_room(source.key, files, policy)
        for path, outcome in self._fill(source, files, policy, now).items():
            setattr(report, outcome, getattr(report, outcome) + 1)
            if outcome == "downloaded":
                report.bytes += files[path][1]
        if listed:  # blobs gone from the remote leave the tree once the listing is refreshed
            with self._db() as db:
                cached = [r[0] for r in db.execute("SELECT path FROM entries WHERE key = ?", (source.key,))]
            for path in cached:
                if _under(path, prefix) and path not in files:
                    self._remove(source.key, path)
                    report.removed += 1
        return report

    def _make_room(self, key: str, needed: dict[str, list], policy: CachePolicy) -> None:
        """Honour DATASET_MOUNT_CACHE_SIZE and DATASET_RESERVED_FREE_DISK_SPACE: evict entries this
        sync does not need, least recently used first; refuse when the job's data alone cannot fit."""
        with self._db() as db:
            rows = db.execute("SELECT key, path, size, used_at FROM entries ORDER BY used_at").fetchall()
        want = sum(size for _, size in needed.values())
        have = {(k, p): s for k, p, s, _ in rows}
        missing = sum(s for p, (_, s) in needed.items() if (key, p) not in have)
        evictable = [(k, p, s) for k, p, s, _ in rows if not (k == key and p in needed)]

        def over() -> tuple[bool, str]:
            total = sum(have.values()) + missing
            if policy.size_limit is not None and total > policy.size_limit:
                return True, f"{SIZE_VAR}={policy.size_limit} bytes"
            free = shutil.disk_usage(self.root).free
            if policy.keep_free is not None and free - missing < policy.keep_free:
                return True, f"{SIZE_VAR}=-{policy.keep_free} bytes (to leave free) with {free} bytes free"
            if free - missing < policy.reserved_free:
                return True, f"{RESERVED_VAR}={policy.reserved_free} bytes with {free} bytes free"
            return False, ""

        while over()[0] and evictable:
            k, p, _ = evictable.pop(0)
            self._remove(k, p)
            have.pop((k, p), None)
        full, why = over()
        if full:
            raise CacheError(f"the node cache cannot hold the job's data ({want} bytes) under {why}; "
                             "raise the limit, or use mode: download")


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith(prefix.rstrip("/") + "/")
