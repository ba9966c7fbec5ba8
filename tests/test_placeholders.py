"""The data runtime's default mount as local placeholder files filled on first read
(emulator/storage/dataruntime/placeholders.py, fanotify pre-content events): one fetch however many
readers, reads after it never reach the server, errors the runtime logs, a dead server that leaves
readers waiting rather than reading zeros, and FUSE where placeholders cannot serve. Readers are
other processes: the serving process's own accesses are let through unanswered."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_until
from fsspec.implementations.local import LocalFileSystem

from amlemu.actions import execute
from amlemu.storage.dataruntime import fanotify, placeholders
from amlemu.storage.dataruntime import settings as drs
from amlemu.storage.dataruntime.mount import MountRecord, is_mounted, mount_type, plan_unmount, start_process

MB = 1024 * 1024
READ = "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "deep" / "er").mkdir(parents=True)
    (root / "big.bin").write_bytes(os.urandom(4 * MB))
    (root / "deep" / "er" / "small.txt").write_text("small\n")
    (root / "gone.txt").write_text("deleted after the listing\n")
    (root / "empty").mkdir()
    return root


class Mount:
    """A served mount of `store` (its own process, as nodes get it), unmounted and checked gone."""

    def __init__(self, tmp: Path, store: Path, env: dict[str, str] | None = None, cache: Path | None = None) -> None:
        self.point, self.state, self.logs = tmp / "mnt", tmp / "state", tmp / "logs"
        self.point.mkdir()
        self.record: MountRecord = start_process(
            LocalFileSystem().to_json(), str(store), self.point, self.state, cache or tmp / "cache", self.logs,
            drs.from_env({"DATASET_UNMOUNT_TIMEOUT_SECONDS": "5", **(env or {})}, cores=1))

    def read(self, path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", READ, str(self.point / path)], capture_output=True, text=True,
                              timeout=60)

    def log(self, name: str = "data-capability.log") -> str:
        return "".join(p.read_text() for p in self.logs.glob(name))

    def close(self) -> None:
        execute(plan_unmount(self.state))
        assert not is_mounted(self.point) and not os.listdir(self.point)


@pytest.fixture
def mount(tmp_path: Path, store: Path) -> Iterator[Mount]:
    made = Mount(tmp_path, store)
    try:
        yield made
    finally:
        if (made.state / "mount.json").exists():
            made.close()


def test_the_listing_is_there_at_once_and_one_read_fetches_that_file_once(mount: Mount, store: Path) -> None:
    assert mount_type(mount.point) == "ext4" and mount.record.held_by == os.getpid()
    assert sorted(str(p.relative_to(mount.point)) for p in mount.point.rglob("*")) == [
        "big.bin", "deep", "deep/er", "deep/er/small.txt", "empty", "gone.txt"]
    assert os.stat(mount.point / "big.bin").st_size == 4 * MB and os.stat(mount.point / "big.bin").st_blocks == 0
    want = hashlib.sha256((store / "big.bin").read_bytes()).hexdigest()
    readers = [subprocess.Popen([sys.executable, "-c", READ, str(mount.point / "big.bin")], stdout=subprocess.PIPE,
                                text=True) for _ in range(6)]
    assert [r.communicate(timeout=60)[0].strip() for r in readers] == [want] * 6
    assert mount.read("deep/er/small.txt").stdout.strip() == hashlib.sha256(b"small\n").hexdigest()
    mount.close()
    assert mount.log("rslex.log.*").count("opened /big.bin (") == 1  # six readers, one download
    assert f": {4 * MB + 6} bytes fetched, 2 files," in mount.log()  # nothing else was transferred


def test_a_file_read_once_is_read_later_without_its_server(mount: Mount, store: Path) -> None:
    """Its mark is gone after the fill: later reads never reach the server (here: it is dead)."""
    want = mount.read("big.bin").stdout
    os.kill(mount.record.pid, signal.SIGKILL)
    wait_until(lambda: not _alive(mount.record.pid), 10, "the server ended")
    assert mount.read("big.bin").stdout == want


def test_a_dead_server_leaves_a_first_read_waiting_never_reading_zeros(mount: Mount) -> None:
    """The group is held by the mount's caller: a read that needs a fill waits (in the kernel's
    fanotify wait) until the run ends it, instead of reading the placeholder's holes."""
    os.kill(mount.record.pid, signal.SIGKILL)
    wait_until(lambda: not _alive(mount.record.pid), 10, "the server ended")
    reader = subprocess.Popen([sys.executable, "-c", READ, str(mount.point / "gone.txt")], stdout=subprocess.PIPE)
    try:
        wait_until(lambda: "fanotify" in Path(f"/proc/{reader.pid}/wchan").read_text(), 30,
                   "the reader waits for the placeholder's fill")
        assert reader.poll() is None
    finally:
        reader.kill()
        reader.wait()


def test_a_file_deleted_in_storage_after_the_listing_fails_its_first_read(mount: Mount, store: Path) -> None:
    (store / "gone.txt").unlink()
    done = mount.read("gone.txt")
    assert done.returncode == 1 and "OSError: [Errno 5]" in done.stderr  # EIO: all a pre-content answer may carry
    assert "read /gone.txt: DataAccessError(NotFound)" in mount.log()
    assert mount.read("deep/er/small.txt").returncode == 0  # the mount serves on


@pytest.mark.parametrize("why", ["tmpfs", "too large", "too many", "ttl"])
def test_fuse_serves_where_placeholders_cannot(tmp_path: Path, store: Path, why: str) -> None:
    """tmpfs takes no pre-content marks (and 3 files get no disk of their own: the next test)."""
    env = {"too large": {"DATASET_RESERVED_FREE_DISK_SPACE": "1000000GB"},
           "too many": {"AMLEMU_DATASET_MOUNT_PLACEHOLDER_MAX_FILES": "2"},
           "ttl": {"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": "60000"}}.get(why, {})
    shm = Path(tempfile.mkdtemp(dir="/dev/shm")) if why == "tmpfs" else None
    try:
        made = Mount(tmp_path, store, env, cache=shm)
        try:
            assert mount_type(made.point) == "fuse.dataruntime" and made.record.held_by is None
            assert made.read("deep/er/small.txt").stdout.strip() == hashlib.sha256(b"small\n").hexdigest()
        finally:
            made.close()
        rslex = made.log("rslex.log.*")
        if why == "ttl":  # settings FUSE serves by design: nothing to explain
            assert "placeholders not used" not in rslex
        else:
            said = {"tmpfs": "Operation not supported", "too large": "do not fit", "too many": "3 files, more than"}[why]
            assert "placeholders not used" in rslex and said in rslex
    finally:
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)


def test_many_files_get_a_disk_of_their_own(tmp_path: Path, store: Path) -> None:
    """Over ON_CACHE_DISK_FILES files, the placeholders are made on an ext4 image of their own
    (placeholderdisk.py: ~40 us a file instead of the root disk's 130-900), allocated for the
    input; here in tmpfs, which takes no marks itself, and the image's file system does."""
    for i in range(placeholders.ON_CACHE_DISK_FILES):
        (store / "deep" / f"n{i:03d}.txt").write_text(str(i))
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        made = Mount(tmp_path, store, cache=shm / "cache")
        try:
            assert mount_type(made.point) == "ext4" and mount_type(shm / "cache" / "disk") == "ext4"
            assert (shm / "cache" / "placeholders.ext4").stat().st_blocks * 512 >= 4 * MB  # allocated when made
            assert made.read("deep/n007.txt").stdout.strip() == hashlib.sha256(b"7").hexdigest()
        finally:
            made.close()
        assert f"{placeholders.ON_CACHE_DISK_FILES + 3} files" in made.log("rslex.log.*")
        assert not is_mounted(shm / "cache" / "disk") and not (shm / "cache").exists()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_which_settings_placeholders_serve() -> None:
    assert placeholders.ineligible(drs.Settings()) is None
    assert "TTL" in placeholders.ineligible(drs.Settings(attribute_cache_ttl=5.0))
    assert "block" in placeholders.ineligible(drs.Settings(block_based=True))
    assert "CACHE_SIZE" in placeholders.ineligible(drs.Settings(cache_size=MB))
    assert "PLACEHOLDERS" in placeholders.ineligible(drs.from_env({"AMLEMU_DATASET_MOUNT_PLACEHOLDERS": "false"}))


def test_the_bind_is_read_only_before_it_reaches_the_mount_point() -> None:
    """Made read-only at a stage, then bound: the copy a docker node's rslave disk receives is a
    clone of a read-only mount (a remount after the bind would not reach it)."""
    assert placeholders.bind_argv("/c/tree", "/c/stage", "/n/in") == [
        ["mount", "--bind", "/c/tree", "/c/stage"], ["mount", "-o", "remount,bind,ro,nosuid,nodev", "/c/stage"],
        ["mount", "--bind", "/c/stage", "/n/in"], ["umount", "/c/stage"]]


def test_a_denied_read_carries_an_errno_the_kernel_takes() -> None:
    assert fanotify.deny_response(errno.EPERM) == fanotify.FAN_DENY | errno.EPERM << 24
    assert fanotify.deny_response(errno.ENOENT) == fanotify.FAN_DENY | errno.EIO << 24  # not one it allows
    assert fanotify.deny_response(errno.ENOSPC) == fanotify.FAN_DENY | errno.ENOSPC << 24


def test_the_listing_is_relative_to_the_input(store: Path) -> None:
    fs = LocalFileSystem()
    found = placeholders.listing(fs, str(store))
    assert sorted(found) == ["big.bin", "deep", "deep/er", "deep/er/small.txt", "empty", "gone.txt"]
    assert found["deep"]["type"] == "directory" and found["big.bin"]["size"] == 4 * MB
    assert list(placeholders.listing(fs, str(store / "deep" / "er"), only="small.txt")) == ["small.txt"]


def test_a_blob_name_that_would_leave_the_input_gets_no_placeholder() -> None:
    class Named:  # blob names as a storage account may hold them
        def find(self, root, withdirs, detail):  # type: ignore[no-untyped-def]
            names = ["c/in/a.txt", "c/in/../../etc/x", "c/in/b//c", "c/in/./d", "c/in/ok/e"]
            return {name: {"type": "file", "size": 1} for name in names}

    assert sorted(placeholders.listing(Named(), "c/in")) == ["a.txt", "ok/e"]
    assert not placeholders.safe("..") and not placeholders.safe("a/..") and placeholders.safe("a..b/c")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (the fork server's or our child) is gone too
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
