"""The data runtime's mount (issue 32): Azure ML's v2 `ro_mount` semantics served by a host-side FUSE
mount over an fsspec filesystem: listing without downloads, one file fetched per open, block mode
with bounded disk use, the attribute cache's TTL, LRU pruning, the runtime's errors and logs, and an
unmount that leaves nothing behind."""
from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import wait_until
from fsspec.implementations.local import LocalFileSystem

from amlemu.actions import execute
from amlemu.cluster.store import Store
from amlemu.errors import BackendError, ConfigError
from amlemu.home import default_cache
from amlemu.storage.datastores import DEFAULT, Datastores
from amlemu.storage.dataruntime.cache import DiskCache
from amlemu.storage.dataruntime import settings as drs
from amlemu.storage.dataruntime.mount import (READAHEAD_KIB, ThreadMount, find_mounts, fuse_options, is_mounted,
                                              mount_type, plan_unmount, start_process, unmount, unmount_argv)
from amlemu.storage.dataruntime.mountfs import DataRuntimeFS

KB = 1024
pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse (scripts/setup.sh)")


class CountingFS(LocalFileSystem):
    """A local filesystem that counts the bytes the mount fetches, and can refuse paths."""

    cachable = False

    def __init__(self) -> None:
        super().__init__()
        self.fetched: dict[str, int] = {}
        self.denied: set[str] = set()

    def cat_file(self, path, start=None, end=None, **kwargs):  # type: ignore[no-untyped-def,override]
        if any(str(path).endswith(d) for d in self.denied):
            raise PermissionError(path)
        data = super().cat_file(path, start=start, end=end, **kwargs)
        self.fetched[os.path.basename(path)] = self.fetched.get(os.path.basename(path), 0) + len(data)
        return data


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "shards").mkdir(parents=True)
    for i in range(40):
        (root / "shards" / f"part-{i:03d}.bin").write_bytes(bytes([i]) * (16 * KB + i))
    (root / "labels.csv").write_text("a,b\n1,2\n")
    return root


@pytest.fixture
def mounted(tmp_path: Path, data: Path) -> Iterator:
    """mount(env) -> (mount, counting fs, clock); every mount is unmounted and checked gone."""
    mounts: list[ThreadMount] = []

    def mount(env: dict[str, str] | None = None) -> tuple[ThreadMount, CountingFS, Clock]:
        fs, clock, n = CountingFS(), Clock(), len(mounts)
        settings = drs.from_env(env or {}, cores=1)
        ops = DataRuntimeFS(fs, str(data), tmp_path / f"cache{n}", tmp_path / f"logs{n}", settings, clock=clock)
        (tmp_path / f"mnt{n}").mkdir()
        mounts.append(ThreadMount(ops, tmp_path / f"mnt{n}", tmp_path / f"state{n}", settings))
        return mounts[-1], fs, clock

    yield mount
    for m in mounts:
        m.unmount()
        assert not is_mounted(m.mountpoint) and not m.thread.is_alive()


def test_settings_defaults_are_azures() -> None:
    s = drs.from_env({}, cores=2)
    assert (s.attribute_cache_ttl, s.block_based, s.read_block_size, s.read_buffer_block_count) == (None, False, 2 * KB * KB, 32)
    assert (s.read_threads, s.downloader_threads, s.cache_size, s.reserved_free_disk_space, s.unmount_timeout) == \
        (8, 8, None, 150 * KB * KB, 30.0)
    s = drs.from_env({"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000", "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "True",
                      "DATASET_MOUNT_READ_BLOCK_SIZE": "4MB", "DATASET_MOUNT_CACHE_SIZE": "-10GB",
                      "DATASET_MOUNT_MEMORY_CACHE_SIZE": "1GB",
                      "DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET": "0.5"})
    assert (s.attribute_cache_ttl, s.block_based, s.read_block_size, s.cache_size, s.keep_free) == \
        (60.0, True, 4 * KB * KB, None, 10 * KB ** 3)
    assert s.memory_cache_size == KB ** 3 and s.block_file_cache is True
    assert s.ignored == ("DATASET_MOUNT_FILE_CACHE_PRUNE_TARGET",) and drs.Settings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("name,value", [("DATASET_MOUNT_ATTRIBUTE_CACHE_TTL", "1m"),
                                        ("DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED", "maybe"),
                                        ("DATASET_MOUNT_READ_BLOCK_SIZE", "big"),
                                        ("DATASET_MOUNT_READ_THREADS", "0"),
                                        ("DATASET_UNMOUNT_TIMEOUT_SECONDS", "soon")])
def test_a_bad_setting_is_one_line_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        drs.from_env({name: value})
    assert str(err.value).startswith(f"{name}: '{value}'") and "\n" not in str(err.value)


def test_mount_options_and_unmount_commands_are_data() -> None:
    assert fuse_options(drs.Settings())["attr_timeout"] == 3600.0
    assert fuse_options(drs.Settings(attribute_cache_ttl=1.0))["attr_timeout"] == 0.0  # the kernel must not outlive the TTL
    assert fuse_options(drs.Settings())["ro"] is True
    assert unmount_argv("/m") == ["fusermount3", "-u", "/m"]
    assert unmount_argv("/m", "umount", lazy=True) == ["umount", "-l", "/m"]


def test_listing_downloads_nothing_and_one_file_fetches_only_itself(mounted, data: Path) -> None:
    mount, fs, _ = mounted()
    root = mount.mountpoint
    assert sorted(os.listdir(root)) == ["labels.csv", "shards"]
    names = sorted(os.listdir(root / "shards"))
    assert len(names) == 40 and os.stat(root / "shards" / "part-007.bin").st_size == 16 * KB + 7
    assert fs.fetched == {} and mount.ops.cache.disk_bytes() == 0  # sizes came with the listing
    assert (root / "shards" / "part-007.bin").read_bytes() == bytes([7]) * (16 * KB + 7)
    assert fs.fetched == {"part-007.bin": 16 * KB + 7}  # one file of 41 transferred, once
    assert (root / "shards" / "part-007.bin").read_bytes()[:1] == b"\x07" and fs.fetched["part-007.bin"] == 16 * KB + 7


def test_a_file_larger_than_the_cache_streams_in_blocks_with_bounded_disk(mounted, data: Path) -> None:
    big = os.urandom(4 * KB * KB)
    (data / "big.bin").write_bytes(big)
    mount, fs, _ = mounted({"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true", "DATASET_MOUNT_READ_BLOCK_SIZE": "64KB",
                            "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "4", "DATASET_MOUNT_CACHE_SIZE": "512KB"})
    digest, peak = hashlib.sha256(), 0
    with open(mount.mountpoint / "big.bin", "rb") as f:
        while chunk := f.read(128 * KB):
            digest.update(chunk)
            peak = max(peak, mount.ops.cache.disk_bytes())  # the cache folder, as du sees it
    mount.unmount()  # the blocks' disk copies are written behind the reads: all landed now
    peak = max(peak, mount.ops.cache.disk_bytes())
    assert digest.digest() == hashlib.sha256(big).digest()
    assert peak <= 512 * KB and mount.ops.cache.stats.peak_bytes <= 512 * KB  # 8x smaller than the file
    assert mount.ops.cache.stats.pruned > 0 and fs.fetched["big.bin"] < 1.5 * len(big)


def test_a_sequential_read_reaches_the_server_a_mebibyte_at_a_time(mounted, data: Path) -> None:
    """The mount's read-ahead raised from the kernel's 128 KiB once it is up (set_readahead): one
    request, and one Python call, per MiB of a sequential read instead of eight."""
    (data / "big.bin").write_bytes(os.urandom(8 * KB * KB))
    mount, _, _ = mounted({"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"})
    dev = os.stat(mount.mountpoint).st_dev
    setting = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
    wait_until(lambda: setting.read_text().strip() == str(READAHEAD_KIB), 10, "the read-ahead is raised")
    sizes: list[int] = []
    read = mount.ops.read
    mount.ops.read = lambda path, size, offset, fh: sizes.append(size) or read(path, size, offset, fh)
    assert (mount.mountpoint / "big.bin").read_bytes() == (data / "big.bin").read_bytes()
    assert max(sizes) == READAHEAD_KIB * KB and len(sizes) <= 8 * KB * KB // (READAHEAD_KIB * KB) + 2


def test_a_change_in_storage_is_not_seen_until_the_ttl_passes(mounted, data: Path) -> None:
    forever, _, _ = mounted()
    short, _, clock = mounted({"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "5000"})
    for m in (forever, short):
        assert (m.mountpoint / "labels.csv").read_text() == "a,b\n1,2\n"
        assert "new.txt" not in os.listdir(m.mountpoint)  # listed now, kept for the TTL
    (data / "labels.csv").write_text("a,b\n3,4\n5,6\n")
    (data / "new.txt").write_text("new")
    for m in (forever, short):  # within the TTL (never expiring, or 5 s not yet passed): the old file
        assert (m.mountpoint / "labels.csv").read_text() == "a,b\n1,2\n"
        assert "new.txt" not in os.listdir(m.mountpoint)
    clock.now += 6  # the short TTL passes (the mount's clock; the default one never expires)
    assert (short.mountpoint / "labels.csv").read_text() == "a,b\n3,4\n5,6\n"
    assert "new.txt" in os.listdir(short.mountpoint)
    assert (forever.mountpoint / "labels.csv").read_text() == "a,b\n1,2\n"


def test_missing_and_denied_files_fail_as_the_runtime_logs_them(mounted, data: Path) -> None:
    mount, fs, _ = mounted()
    with pytest.raises(FileNotFoundError):
        open(mount.mountpoint / "shards" / "part-999.bin", "rb")
    fs.denied.add("labels.csv")
    with pytest.raises(PermissionError):  # on its first read: the kernel opens files itself (no-open)
        (mount.mountpoint / "labels.csv").read_bytes()
    with pytest.raises(OSError) as err:
        open(mount.mountpoint / "shards" / "part-001.bin", "ab")
    assert err.value.errno == errno.EROFS
    assert "part-002.bin" in os.listdir(mount.mountpoint / "shards")  # listed: its attributes never expire
    (data / "shards" / "part-002.bin").unlink()  # then deleted in storage, mid-job
    assert (mount.mountpoint / "shards" / "part-002.bin").exists()  # still listed, as on AmlCompute...
    with pytest.raises(FileNotFoundError):
        (mount.mountpoint / "shards" / "part-002.bin").read_bytes()  # ...but its first read fails
    log = (mount.ops.log.session).read_text()
    assert "getattr /shards/part-999.bin: DataAccessError(NotFound)" in log
    assert "read /labels.csv: DataAccessError(PermissionDenied)" in log
    assert "read /shards/part-002.bin: DataAccessError(NotFound)" in log
    assert mount.ops.log.session.name == "data-capability.log" and mount.ops.log.rslex.name.startswith("rslex.log.")


class CountingOps(DataRuntimeFS):
    """The mount's server, counting the calls the kernel sends it."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def open(self, path: str, flags: int) -> int:
        self._count("open")
        return super().open(path, flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._count("read")
        return super().read(path, size, offset, fh)

    def flush(self, path: str, fh: int) -> int:
        self._count("flush")
        return super().flush(path, fh)

    def release(self, path: str, fh: int) -> int:
        self._count("release")
        return super().release(path, fh)


@pytest.mark.parametrize("env", [{}, {"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000"}], ids=["defaults", "ttl"])
def test_a_warm_read_is_the_kernels_own_where_nothing_could_change(tmp_path: Path, data: Path, env: dict) -> None:
    """Defaults (attributes never expire, whole files): the kernel opens files itself, keeps their
    pages and sends no release or flush, so reading a file again asks the server nothing; with a
    TTL every open still reaches the server, which then checks the file's attributes."""
    fs, settings = CountingFS(), drs.from_env(env, cores=1)
    ops = CountingOps(fs, str(data), tmp_path / "cache", tmp_path / "logs", settings)
    (tmp_path / "mnt").mkdir()
    mount = ThreadMount(ops, tmp_path / "mnt", tmp_path / "state", settings)
    try:
        shard = tmp_path / "mnt" / "shards" / "part-003.bin"
        assert shard.read_bytes() == bytes([3]) * (16 * KB + 3)
        first = dict(ops.calls)
        for _ in range(4):
            assert shard.read_bytes() == bytes([3]) * (16 * KB + 3)
        assert fs.fetched == {"part-003.bin": 16 * KB + 3}  # downloaded once either way
        if env:
            assert ops.calls["open"] == 5  # (their releases come after each close, in the background)
        else:
            assert ops.calls == first and first["open"] == 1 and "release" not in first
            assert first["read"] >= 1 and first.get("flush", 0) <= 1
        assert ops.log.rslex.read_text().count("opened /shards/part-003.bin (16387 bytes, whole file)") == \
            (5 if env else 1)
        with pytest.raises(OSError) as err:
            open(shard, "ab")
        assert err.value.errno == errno.EROFS
        assert len(ops.copies) == (0 if env else 1)  # no-open keeps the copy read open (pinned) for its next reads
    finally:
        mount.unmount()
    assert not is_mounted(tmp_path / "mnt")
    assert all(entry.pins == 0 for entry in ops.cache.entries.values())  # each copy closed and unpinned at the end


def test_a_full_cache_prunes_the_least_recently_used_file(mounted, data: Path) -> None:
    size = 16 * KB + 1
    mount, fs, _ = mounted({"DATASET_MOUNT_CACHE_SIZE": str(3 * size + 200)})
    shard = mount.mountpoint / "shards"
    cache = mount.ops.cache
    for i in (1, 2, 3, 1):  # part-001 read again: now part-002 is the least recently used
        (shard / f"part-{i:03d}.bin").read_bytes()
    # a file's release reaches the mount after close() returns, and an open file is never pruned
    wait_until(lambda: all(entry.pins == 0 for entry in cache.entries.values()), 10, "every copy released")
    (shard / "part-004.bin").read_bytes()
    assert cache.stats.pruned == 1 and cache.used <= 3 * size + 200
    assert "pruned /shards/part-002.bin" in mount.ops.log.rslex.read_text()
    before = dict(fs.fetched)
    (shard / "part-001.bin").read_bytes()  # still cached
    (shard / "part-002.bin").read_bytes()  # pruned: fetched again
    assert fs.fetched["part-001.bin"] == before["part-001.bin"]
    assert fs.fetched["part-002.bin"] == 2 * before["part-002.bin"]


@pytest.mark.parametrize("placeholders", ["true", "false"])
def test_a_served_process_mount_unmounts_and_cleans_up(tmp_path: Path, data: Path, placeholders: str) -> None:
    """Served as local placeholders (the default settings, where the kernel allows: this machine
    kind's does) or through FUSE; the placeholders' group held here until the server has gone."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    settings = drs.from_env({"DATASET_UNMOUNT_TIMEOUT_SECONDS": "5", "AMLEMU_DATASET_MOUNT_PLACEHOLDERS": placeholders},
                            cores=1)
    record = start_process(LocalFileSystem().to_json(), str(data), mnt, tmp_path / "state", tmp_path / "cache",
                           tmp_path / "logs", settings)
    try:
        assert is_mounted(mnt) and (mnt / "labels.csv").read_text() == "a,b\n1,2\n"
        assert mount_type(mnt) == ("fuse.dataruntime" if placeholders == "false" else "ext4")
        assert find_mounts(record.fsname) == [str(mnt)]  # a name of its own: found by it wherever it moves
        plan = plan_unmount(tmp_path / "state")
        held = [f"close data runtime placeholder group {record.held_fd}"] if placeholders == "true" else []
        assert (record.held_by is not None) == (placeholders == "true")
        assert [a.line().split(" (")[0] for a in plan] == [
            f"unmount data runtime mount {mnt}", f"stop data runtime server {record.pid}", *held,
            f"remove data runtime cache {tmp_path / 'cache'}", f"remove data runtime record {tmp_path / 'state' / 'mount.json'}"]
        execute(plan)
        assert not held or not os.path.exists(f"/proc/self/fd/{record.held_fd}")
    finally:
        if is_mounted(mnt):
            execute(plan_unmount(tmp_path / "state"))
    assert not is_mounted(mnt) and not (tmp_path / "cache").exists() and not (tmp_path / "state" / "mount.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(record.pid, 0)
    assert "unmounted" in (tmp_path / "logs" / "data-capability.log").read_text()


def test_an_unmount_takes_its_own_mount_never_another_of_the_same_source(tmp_path: Path, data: Path) -> None:
    """The mount table is the host's, shared by every run and test worker: a record whose source
    name another mount also has (an older record's default name) unmounts its own mount."""
    settings = drs.from_env({"DATASET_UNMOUNT_TIMEOUT_SECONDS": "5"}, cores=1)
    mounts = []
    for name in ("first", "second"):  # both served under the default source name
        (tmp_path / name).mkdir()
        ops = DataRuntimeFS(LocalFileSystem(), str(data), tmp_path / f"cache-{name}", tmp_path / f"logs-{name}", settings)
        mounts.append(ThreadMount(ops, tmp_path / name, tmp_path / f"state-{name}", settings))
    replace(mounts[1].record, fsname="amlemu-dataruntime").save()  # found by that source if it moved
    try:
        done = execute(plan_unmount(tmp_path / "state-second"))
        assert done[0] == f"unmounted {tmp_path / 'second'}"
        assert not is_mounted(tmp_path / "second") and is_mounted(tmp_path / "first")
        assert (tmp_path / "first" / "labels.csv").read_text() == "a,b\n1,2\n"
    finally:
        for mount in mounts:
            mount.unmount()
    assert not any(mount.thread.is_alive() for mount in mounts)


def test_the_cache_keeps_the_reserved_free_space(tmp_path: Path) -> None:
    free = {"bytes": 300 * KB}  # the disk's free space, as the cache reads it
    settings = drs.Settings(reserved_free_disk_space=100 * KB, downloader_threads=1, read_threads=1)
    cache = DiskCache(tmp_path / "cache", settings, None, lambda line: None, free_space=lambda _: free["bytes"])
    try:
        assert cache.reserve(150 * KB)  # 300 - 150 leaves 150 KiB free: above the 100 reserved
        cache._add("a", tmp_path / "a", 150 * KB, pin=False)
        free["bytes"] = 150 * KB
        assert cache.reserve(100 * KB) and cache.stats.pruned == 1  # only by pruning "a"
        free["bytes"] = 150 * KB
        assert not cache.reserve(100 * KB)  # nothing left to prune: refused (the read streams instead)
    finally:
        cache.close()


def test_a_blob_container_mounts_from_a_serving_process(tmp_path: Path) -> None:
    root = tmp_path / "home"
    root.mkdir()
    datastores = Datastores(Store(root / "amlemu.db"), root, default_cache())
    fs, container = datastores.filesystem(DEFAULT)  # the test session's Azurite
    fs.pipe({f"{container}/dr/a/{i}.txt": f"blob {i}".encode() for i in range(5)})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    start_process(fs.to_json(), f"{container}/dr", mnt, tmp_path / "state", tmp_path / "cache", tmp_path / "logs",
                  drs.from_env({}, cores=1))
    try:
        assert sorted(os.listdir(mnt / "a")) == [f"{i}.txt" for i in range(5)] and os.stat(mnt / "a" / "3.txt").st_size == 6
        assert (mnt / "a" / "3.txt").read_text() == "blob 3"
        assert not (mnt / "a" / "9.txt").exists()
    finally:
        execute(plan_unmount(tmp_path / "state"))
    assert not is_mounted(mnt)
    session = (tmp_path / "logs" / "data-capability.log").read_text()
    assert "unmounted" in session and ": 6 bytes fetched, 1 files," in session  # the one blob read, nothing else


def test_a_busy_mount_is_detached_after_the_unmount_timeout(tmp_path: Path, data: Path) -> None:
    settings = drs.from_env({"DATASET_UNMOUNT_TIMEOUT_SECONDS": "0.3"}, cores=1)
    ops = DataRuntimeFS(CountingFS(), str(data), tmp_path / "cache", tmp_path / "logs", settings)
    (tmp_path / "mnt").mkdir()
    mount = ThreadMount(ops, tmp_path / "mnt", tmp_path / "state", settings)
    reader = open(tmp_path / "mnt" / "labels.csv", "rb")  # a job still reading: the mount is busy
    try:
        done = unmount(str(tmp_path / "mnt"), settings.unmount_timeout)
        assert done.startswith(f"detached {tmp_path / 'mnt'} (busy after 0.3s") and not is_mounted(tmp_path / "mnt")
        assert reader.read() == b"a,b\n1,2\n"  # a lazy unmount: the open file still reads
    finally:
        reader.close()
        mount.unmount()
    assert not mount.thread.is_alive()


def test_a_file_that_cannot_fit_the_cache_is_streamed_in_whole_file_mode(mounted, data: Path) -> None:
    mount, fs, _ = mounted({"DATASET_MOUNT_CACHE_SIZE": "8KB"})  # smaller than any shard
    assert (mount.mountpoint / "shards" / "part-003.bin").read_bytes() == bytes([3]) * (16 * KB + 3)
    assert mount.ops.cache.stats.files_downloaded == 0 and fs.fetched["part-003.bin"] == 16 * KB + 3
    assert "/shards/part-003.bin: 16387 bytes do not fit the cache; streaming it in blocks" in mount.ops.log.rslex.read_text()


def test_a_mount_that_fails_is_one_line(tmp_path: Path, data: Path) -> None:
    settings = drs.from_env({}, cores=1)
    ops = DataRuntimeFS(CountingFS(), str(data), tmp_path / "cache", tmp_path / "logs", settings)
    with pytest.raises(BackendError) as err:
        ThreadMount(ops, tmp_path / "no-such-folder", tmp_path / "state", settings)
    assert str(err.value).startswith(f"data runtime mount at {tmp_path / 'no-such-folder'}: not mounted")
    assert "\n" not in str(err.value) and not (tmp_path / "state" / "mount.json").exists()
