"""The blobfuse-style node cache against a real Azurite: stale reads within the TTL, ETag
revalidation after it, several processes filling one cache, and the data runtime's size knobs.
Time is a fake clock: no test sleeps for a TTL."""
from __future__ import annotations

import multiprocessing
import os
import shutil
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import fsspec
import pytest
from conftest import wait_until

from amlemu.cluster.store import Store
from amlemu.errors import ConfigError, NotFoundError
from amlemu.home import default_cache
from amlemu.storage import nodecache
from amlemu.storage.datastores import DEFAULT, Datastores
from amlemu.storage.nodecache import CacheError, CachePolicy, NodeCache, Source, policy_from_env

BLOBFUSE = CachePolicy(ttl=120)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# The tests share the module's Azurite-backed datastore: on one xdist worker it is made once, not once a worker.
pytestmark = pytest.mark.xdist_group("nodecache")


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cache-home")
    datastores = Datastores(Store(root / "amlemu.db"), root, default_cache())
    fs, container = datastores.filesystem(DEFAULT)
    yield datastores, fs, container
    datastores.azurite.stop()


@pytest.fixture
def blob(azurite, request: pytest.FixtureRequest):
    """(source, write(path, bytes), delete(path)) on a fresh folder of the Azurite container."""
    _, fs, container = azurite
    prefix = request.node.name.replace("[", "_").replace("]", "")
    source = Source(DEFAULT, fs, f"{container}/{prefix}")

    def write(path: str, data: bytes) -> None:
        fs.pipe(f"{source.root}/{path}", data)

    def delete(path: str) -> None:
        fs.rm(f"{source.root}/{path}")
    return source, write, delete


def test_within_the_ttl_a_changed_blob_is_not_seen_after_it_it_is(tmp_path: Path, blob) -> None:
    source, write, _ = blob
    write("d/v.txt", b"version 1")
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    first = cache.sync(source, "d", BLOBFUSE)
    assert (first.downloaded, first.listed) == (1, True)
    local = cache.local_path(DEFAULT, "d/v.txt")
    write("d/v.txt", b"version 2")  # same size: only the ETag tells

    clock.now += 119
    stale = cache.sync(source, "d", BLOBFUSE)
    assert local.read_bytes() == b"version 1"  # the stale read AmlCompute users meet
    assert (stale.stale, stale.downloaded, stale.listed) == (1, 0, False)  # nothing asked of the remote

    clock.now += 2
    fresh = cache.sync(source, "d", BLOBFUSE)
    assert local.read_bytes() == b"version 2" and fresh.downloaded == 1


def test_an_unchanged_blob_past_the_ttl_is_revalidated_not_downloaded(tmp_path: Path, blob) -> None:
    source, write, _ = blob
    write("f.bin", bytes(1000))
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    cache.sync(source, "f.bin", BLOBFUSE)
    inode = cache.local_path(DEFAULT, "f.bin").stat().st_ino
    clock.now += 500
    report = cache.sync(source, "f.bin", BLOBFUSE)
    assert (report.revalidated, report.downloaded) == (1, 0)
    assert cache.local_path(DEFAULT, "f.bin").stat().st_ino == inode


def test_added_and_deleted_blobs_show_only_after_the_ttl(tmp_path: Path, blob) -> None:
    source, write, delete = blob
    write("d/a.txt", b"a")
    write("d/b.txt", b"b")
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    cache.sync(source, "d", BLOBFUSE)
    delete("d/a.txt")
    write("d/c.txt", b"c")
    clock.now += 60
    cache.sync(source, "d", BLOBFUSE)
    tree = cache.data / DEFAULT / "d"
    assert sorted(p.name for p in tree.iterdir()) == ["a.txt", "b.txt"]  # the listing is cached too
    clock.now += 61
    report = cache.sync(source, "d", BLOBFUSE)
    assert sorted(p.name for p in tree.iterdir()) == ["b.txt", "c.txt"]
    assert (report.removed, report.downloaded, report.revalidated) == (1, 1, 1)


def test_the_default_ttl_is_the_jobs_lifetime(tmp_path: Path, blob) -> None:
    """Unset DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: never expires within a job; the next job on the
    node revalidates (and reuses what did not change)."""
    source, write, _ = blob
    write("x.txt", b"one")
    write("y.txt", b"same")
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    job1, _ = policy_from_env({}, job_start=clock.now)
    cache.sync(source, "", job1)
    write("x.txt", b"two")
    clock.now += 10_000  # hours later, same job: still the first read
    assert cache.sync(source, "", job1).stale == 2
    assert cache.local_path(DEFAULT, "x.txt").read_bytes() == b"one"
    job2, _ = policy_from_env({}, job_start=clock.now)
    report = cache.sync(source, "", job2)
    assert cache.local_path(DEFAULT, "x.txt").read_bytes() == b"two"
    assert (report.downloaded, report.revalidated) == (1, 1)


def _fill(root: str, connection_string: str, container: str) -> int:
    """One 'rank' reading every file through the shared node cache for the first time."""
    import adlfs  # noqa: PLC0415

    fs = adlfs.AzureBlobFileSystem(connection_string=connection_string, skip_instance_cache=True)
    gate = Path(root) / "go"
    (Path(root) / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while not gate.exists() and time.monotonic() < deadline:  # all start together: a real race
        time.sleep(0.01)
    report = NodeCache(Path(root)).sync(Source(DEFAULT, fs, container), "many", BLOBFUSE)
    return report.downloaded


def test_several_processes_filling_one_cache_download_each_file_once(tmp_path: Path, azurite) -> None:
    """Two readers (ranks, or two inputs over the same path) at once: one download per file, and
    a reader never sees a torn or empty file, only none or the whole one."""
    datastores, fs, container = azurite
    payload = {f"many/f{i:03}.bin": bytes([i % 251]) * (20_000 + i) for i in range(120)}
    fs.pipe({f"{container}/{k}": v for k, v in payload.items()})
    root = tmp_path / "node0"
    NodeCache(root)  # the tables exist before the race
    bad: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            for name, data in payload.items():
                path = root / "data" / DEFAULT / name
                if path.exists() and path.read_bytes() != data:
                    bad.append(name)
    watcher = threading.Thread(target=reader)
    watcher.start()
    conn = datastores.azurite.ensure().connection_string
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_fill, str(root), conn, container) for _ in range(3)]
        wait_until(lambda: len(list(root.glob("ready-*"))) == 3, 60, "three readers ready")
        (root / "go").touch()
        downloads = [f.result() for f in futures]
    done.set()
    watcher.join()
    assert sum(downloads) == len(payload), downloads
    assert bad == []
    assert all((root / "data" / DEFAULT / k).read_bytes() == v for k, v in payload.items())
    assert list((root / "tmp").iterdir()) == []  # no partial file left behind


def test_a_missing_path_is_named(tmp_path: Path, blob) -> None:
    source, _, _ = blob
    with pytest.raises(NotFoundError, match=r"path 'nothing/here in datastore workspaceblobstore' not found; "
                                            r"list what is there with `amlemu data ls"):
        NodeCache(tmp_path / "n").sync(source, "nothing/here", BLOBFUSE)


def _local_tree(folder: Path, sizes: dict[str, int]) -> Source:
    for name, size in sizes.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x" * size)
    return Source("_local", fsspec.filesystem("file"), "/")


def test_the_cache_size_limit_evicts_least_recently_used_and_refuses_what_cannot_fit(tmp_path: Path) -> None:
    source = _local_tree(tmp_path / "src", {"a/1": 100, "b/1": 100, "big/1": 300})
    rel = str(tmp_path / "src").lstrip("/")
    policy, _ = policy_from_env({"DATASET_MOUNT_CACHE_SIZE": "250", "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000"})
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    cache.sync(source, f"{rel}/a", policy)
    clock.now += 1
    cache.sync(source, f"{rel}/b", policy)
    clock.now += 1
    cache.sync(source, f"{rel}/a", policy)  # a is now the more recently used
    (tmp_path / "src" / "c").mkdir()
    (tmp_path / "src" / "c" / "1").write_bytes(b"y" * 100)
    cache.sync(source, f"{rel}/c", policy)
    assert cache.local_path("_local", f"{rel}/a/1").exists() and cache.local_path("_local", f"{rel}/c/1").exists()
    assert not cache.local_path("_local", f"{rel}/b/1").exists()  # evicted: least recently used
    with pytest.raises(CacheError, match=r"cannot hold the job's data \(300 bytes\) under DATASET_MOUNT_CACHE_SIZE=250"):
        cache.sync(source, f"{rel}/big", policy)


def test_reserved_free_disk_space_is_kept(tmp_path: Path) -> None:
    source = _local_tree(tmp_path / "src", {"f": 10})
    policy = CachePolicy(ttl=60, reserved_free=1 << 60)
    with pytest.raises(CacheError, match="DATASET_RESERVED_FREE_DISK_SPACE=1152921504606846976 bytes"):
        NodeCache(tmp_path / "node0").sync(source, str(tmp_path / "src").lstrip("/"), policy)


def test_a_negative_cache_size_is_the_disk_space_to_leave_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure ML's data runtime reads DATASET_MOUNT_CACHE_SIZE=-<size> as "leave <size> of the disk
    free": the cache evicts (least recently used first) to keep it so, and refuses what cannot fit."""
    policy, _ = policy_from_env({"DATASET_MOUNT_CACHE_SIZE": "-1KB", "DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000",
                                 "DATASET_RESERVED_FREE_DISK_SPACE": "0"})
    assert (policy.size_limit, policy.keep_free) == (None, 1024)
    source = _local_tree(tmp_path / "src", {"a/1": 100, "b/1": 100, "c/1": 100, "big/1": 400})
    rel = str(tmp_path / "src").lstrip("/")
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    disk = 1024 + 250  # a disk of which 250 bytes may hold the cache

    def usage(path):  # type: ignore[no-untyped-def]
        used = sum(f.stat().st_size for f in (tmp_path / "node0" / "data").rglob("*") if f.is_file())
        return shutil._ntuple_diskusage(disk, used, disk - used)
    monkeypatch.setattr(nodecache.shutil, "disk_usage", usage)
    for folder in ("a", "b", "a", "c"):  # a used again: b is the least recently used
        clock.now += 1
        cache.sync(source, f"{rel}/{folder}", policy)
    assert not cache.local_path("_local", f"{rel}/b/1").exists()
    assert cache.local_path("_local", f"{rel}/a/1").exists() and cache.local_path("_local", f"{rel}/c/1").exists()
    with pytest.raises(CacheError, match=r"\(400 bytes\) under DATASET_MOUNT_CACHE_SIZE=-1024 bytes \(to leave free\)"):
        cache.sync(source, f"{rel}/big", policy)
    with pytest.raises(ConfigError, match="DATASET_MOUNT_CACHE_SIZE"):
        policy_from_env({"DATASET_MOUNT_CACHE_SIZE": "-x"})


def test_a_local_file_changed_in_place_is_noticed_after_the_ttl(tmp_path: Path) -> None:
    source = _local_tree(tmp_path / "src", {"f": 10})
    clock = Clock()
    cache = NodeCache(tmp_path / "node0", clock)
    path = str(tmp_path / "src" / "f").lstrip("/")
    cache.sync(source, path, BLOBFUSE)
    (tmp_path / "src" / "f").write_bytes(b"y" * 10)
    clock.now += 121
    assert cache.sync(source, path, BLOBFUSE).downloaded == 1
    assert cache.local_path("_local", path).read_bytes() == b"y" * 10


def test_the_data_runtime_variables() -> None:
    policy, notices = policy_from_env({"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "120000",
                                       "DATASET_MOUNT_CACHE_SIZE": "10 GB",
                                       "DATASET_RESERVED_FREE_DISK_SPACE": "150MB",
                                       "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "true"}, job_start=5.0)
    assert (policy.ttl, policy.size_limit, policy.reserved_free, policy.valid_since) == (120.0, 10 << 30, 150 << 20, 0.0)
    assert notices == ["DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED is not emulated: the node cache fetches whole files"]
    default, none = policy_from_env({}, job_start=5.0)
    assert (default.ttl, default.valid_since, default.size_limit, default.reserved_free, none) == (
        None, 5.0, None, 150 << 20, [])
    assert default.fresh(5.0, 1e12) and not default.fresh(4.9, 5.0)
