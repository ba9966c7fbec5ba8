"""Mounting and unmounting the data runtime's file system, on the host.

The mount is served by the emulator's side (a thread of the caller, or a process it owns), never
inside a node: a node gets no /dev/fuse nor CAP_SYS_ADMIN, only the finished mount bound read-only.
Each mount is recorded (`mount.json` in its state folder: pid, mountpoint, cache, logs) so cleanup
finds it; `plan_unmount` is the cleanup's plan as Actions.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import psutil

from amlemu import forkserver, procinfo
from amlemu.actions import Action
from amlemu.errors import BackendError
from amlemu.storage.dataruntime import placeholderdisk
from amlemu.storage.dataruntime.mounttable import find_mounts, is_mounted, mount_type, set_readahead
from amlemu.storage.dataruntime.settings import Settings

RECORD = "mount.json"
READY = "mounted"  # the line the serving process prints once the kernel has the mount


@dataclass(frozen=True)
class MountRecord:
    mountpoint: str
    pid: int
    cache: str
    logs: str
    state: str  # the folder that holds this record
    unmount_timeout: float = 30.0
    fsname: str = ""  # the mount's source in the mount table: found by it if its folder was moved
    started: float | None = None  # the server's start time (psutil's): its pid is never taken for another
    # A placeholder mount's fanotify group, held open by the process that asked for it (its pid, the
    # descriptor there) until the unmount: the serving process dying must leave waiting reads
    # waiting, never reading a placeholder's zeros (placeholders.py).
    held_by: int | None = None
    held_fd: int | None = None

    def where(self) -> str:
        """Where the mount is now, as the mount table has its fsname (no link followed): a job may
        rename a folder above its mount point, and the mount moves with it. Never another mount:
        the recorded point while it holds this fsname, else the one mount of that fsname; a name
        that several mounts share (the mount table is the host's, shared by every test worker and
        run) finds none of them."""
        points = find_mounts(self.fsname) if self.fsname else []
        if os.path.realpath(self.mountpoint) in points or len(points) != 1:
            return self.mountpoint
        return points[0]

    def save(self) -> None:
        Path(self.state, RECORD).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, state: Path) -> MountRecord:
        return cls(**json.loads((state / RECORD).read_text()))


def fuse_options(settings: Settings, name: str = "amlemu-dataruntime") -> dict[str, Any]:
    """The libfuse options of a mount: read-only, readable by a node's users (allow_other), and
    the kernel's own attribute caches no longer than the runtime's TTL (the kernel would otherwise
    hide a change the TTL lets through). The kernel keeps a file's pages across opens: always
    when attributes never expire (kernel_cache: no check on open), else while its attributes, as
    the TTL serves them, are unchanged (auto_cache: a change the TTL lets through drops them)."""
    ttl = settings.attribute_cache_ttl
    kernel = 3600.0 if ttl is None else 0.0
    pages = {"kernel_cache": True} if ttl is None else {"auto_cache": True}
    return {"ro": True, "allow_other": True, "default_permissions": True, "fsname": name, "subtype": "dataruntime",
            "attr_timeout": kernel, "entry_timeout": kernel, "negative_timeout": 0.0, **pages}


def unmount_argv(mountpoint: str, tool: str = "fusermount3", lazy: bool = False) -> list[str]:
    """The command that unmounts a FUSE mount (`lazy`: detach it now even while it is busy)."""
    if tool == "umount":
        return ["umount", *(["-l"] if lazy else []), mountpoint]
    return [tool, "-u", *(["-z"] if lazy else []), mountpoint]


def unmount_tool() -> str:
    for tool in ("fusermount3", "fusermount"):
        if shutil.which(tool):
            return tool
    return "umount"


def unique_fsname(prefix: str = "amlemu-dataruntime") -> str:
    """A mount's own source name: `where` finds a moved mount by it, so no two mounts share one."""
    return f"{prefix}:{uuid.uuid4().hex[:16]}"


READAHEAD_KIB = 1024


def serve(ops: Any, mountpoint: str, settings: Settings, fsname: str = "amlemu-dataruntime") -> None:
    """Serve `ops` at `mountpoint` until it is unmounted (blocks)."""
    import mfusepy  # noqa: PLC0415 - libfuse is loaded only where a mount is served

    ready = ops.on_ready

    def mounted() -> None:  # in the server's init: the kernel sets the read-ahead from its answer
        def later() -> None:
            with contextlib.suppress(OSError):
                os.stat(mountpoint)  # answered once init is done
                set_readahead(mountpoint, READAHEAD_KIB)
        threading.Thread(target=later, daemon=True).start()
        if ready is not None:
            ready()

    ops.on_ready = mounted
    mfusepy.FUSE(ops, mountpoint, foreground=True, **fuse_options(settings, fsname))


class ThreadMount:
    """A mount served by a thread of this process: the caller's tests and benchmarks see its cache
    and counters directly."""

    def __init__(self, ops: Any, mountpoint: Path, state: Path, settings: Settings, timeout: float = 10.0) -> None:
        self.ops, self.mountpoint, self.settings = ops, mountpoint, settings
        ready, cwd = threading.Event(), os.getcwd()

        def mounted() -> None:
            os.chdir(cwd)  # libfuse's fuse_main changes the process's directory to /, even in the foreground
            ready.set()

        ops.on_ready = mounted
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"dataruntime {mountpoint}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05) and self.thread.is_alive() and time.monotonic() < deadline:
            pass  # mounted, failed (the thread ended) or out of time, whichever comes first
        if not ready.is_set():
            self.unmount()
            raise BackendError(f"data runtime mount at {mountpoint}: not mounted within {timeout:g}s"
                               + (f" ({self.error})" if self.error else "") + "; check that /dev/fuse and fusermount3 exist")
        state.mkdir(parents=True, exist_ok=True)
        self.record = MountRecord(str(mountpoint), os.getpid(), str(ops.cache.root), str(ops.log.session.parent),
                                  str(state), settings.unmount_timeout)
        self.record.save()

    def _run(self) -> None:
        try:
            serve(self.ops, str(self.mountpoint), self.settings)
        except BaseException as exc:  # noqa: BLE001 - reported by the constructor or unmount
            self.error = exc

    def unmount(self) -> None:
        unmount(str(self.mountpoint), self.settings.unmount_timeout)
        self.thread.join(self.settings.unmount_timeout)


SERVE_MODULE = "amlemu.storage.dataruntime.serve"


def start_process(fs_json: str, root: str, mountpoint: Path, state: Path, cache: Path, logs: Path,
                  settings: Settings, timeout: float = 20.0, only: str | None = None,
                  fsname: str | None = None, home_root: Path | None = None) -> MountRecord:
    """Serve the mount from a process of its own: forked by the fork server of `home_root` (its
    imports made once: ~0.4 s of a fresh process's start), else `python -m amlemu.storage.dataruntime.serve`.
    The filesystem travels as fsspec's JSON on its stdin (it may hold a secret: never in argv).
    `fsname`: the mount's source in the mount table, unique to it (by default a fresh one)."""
    state.mkdir(parents=True, exist_ok=True)
    fsname = fsname or unique_fsname()
    config = {"fs": fs_json, "root": root, "mountpoint": str(mountpoint), "cache": str(cache), "logs": str(logs),
              "settings": settings.to_dict(), "only": only, "fsname": fsname}
    pid, started, stdin, stdout = _start_server(state, home_root)
    record = MountRecord(str(mountpoint), pid, str(cache), str(logs), str(state), settings.unmount_timeout, fsname,
                         started)
    record.save()
    try:
        with stdin:
            stdin.write(json.dumps(config).encode())
        line, held = _readline(stdout, timeout)
        if line.strip() != READY.encode():
            _stop(pid, 0, started)  # silent or failed: ended at once, by its pid and start time
            err = (state / "serve.err").read_text(errors="replace").strip().splitlines()
            raise BackendError(f"data runtime mount at {mountpoint}: the serving process did not mount "
                               f"({err[-1] if err else 'no output'}); check that /dev/fuse and fusermount3 exist")
    finally:
        stdout.close()
    if held is not None:
        record = replace(record, held_by=os.getpid(), held_fd=held)
        record.save()
    return record


def _start_server(state: Path, home_root: Path | None) -> tuple[int, float | None, BinaryIO, socket.socket]:
    """The serving process: its pid, start time, a pipe to its stdin and a socket from its stdout
    (a placeholder mount's group comes back on it with the ready line)."""
    in_r, in_w = os.pipe()
    here, there = socket.socketpair()
    out_w = there.detach()
    try:
        with open(state / "serve.err", "wb") as err:
            owner = forkserver.spawn(home_root, SERVE_MODULE, [], dict(os.environ), (in_r, out_w, err.fileno())) \
                if home_root is not None else None
            if owner is not None:
                pid, started = owner.pid, owner.started
            else:
                pid = subprocess.Popen([sys.executable, "-m", SERVE_MODULE], stdin=in_r, stdout=out_w, stderr=err,
                                       start_new_session=True).pid
                started = procinfo.started_at(pid)
    except BaseException:
        os.close(in_w)
        here.close()
        raise
    finally:
        os.close(in_r)
        os.close(out_w)
    return pid, started, os.fdopen(in_w, "wb"), here


def _readline(stdout: socket.socket, timeout: float) -> tuple[bytes, int | None]:
    """The first line of the process's output and the descriptor sent with it; b'' when it exits
    or stays silent past `timeout`."""
    line, held, deadline = b"", None, time.monotonic() + timeout
    while not line.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        stdout.settimeout(left)
        try:
            chunk, fds, _, _ = socket.recv_fds(stdout, 4096, 1)
        except OSError:  # timed out
            break
        for fd in fds:
            os.set_inheritable(fd, False)
            held = fd
        if not chunk:
            break
        line += chunk
    return line, held


def unmount(mountpoint: str, timeout: float = 30.0) -> str:
    """Unmount; a mount still busy after `timeout` seconds is detached lazily (it goes once its
    last reader closes). Returns what was done."""
    kind = mount_type(mountpoint)
    if kind is None:
        return f"{mountpoint} was not mounted"
    tool = unmount_tool() if kind.startswith("fuse") else "umount"  # a placeholder mount is a bind
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(unmount_argv(mountpoint, tool), capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0 or not is_mounted(mountpoint):
            return f"unmounted {mountpoint}"
        if time.monotonic() >= deadline:
            subprocess.run(unmount_argv(mountpoint, tool, lazy=True), capture_output=True, timeout=timeout)
            return f"detached {mountpoint} (busy after {timeout:g}s: {done.stderr.strip()})"
        time.sleep(0.2)  # busy (a reader has a file open): the runtime retries until its timeout


def _stop(pid: int, timeout: float, started: float | None = None) -> str | bool:
    """End the serving process once its mount is gone (it exits by itself after an unmount); by its
    pid only while that is still the process started at `started` (where recorded)."""
    if pid == os.getpid():
        return False
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child (the fork server's): alive while it is that process
            done = 0 if (procinfo.alive(pid, started) if started else psutil.pid_exists(pid)) else pid
        if done:
            return False
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return f"killed data runtime server {pid}"


def _release(record: MountRecord) -> None:
    """The group this process held for a placeholder mount, closed once its server has gone."""
    if record.held_fd is not None and record.held_by == os.getpid():
        with contextlib.suppress(OSError):  # closed already: its number may be another file's now
            if os.readlink(f"/proc/self/fd/{record.held_fd}") == "anon_inode:[fanotify]":
                os.close(record.held_fd)


def plan_unmount_under(folder: Path, pattern: str = "*/*/dataruntime/*/*") -> list[Action]:
    """Cleanup's plan for every mount recorded in state folders under `folder` matching `pattern`
    (a home's caches/: <cluster>/<node>/dataruntime/<run>/<input>)."""
    # glob.glob, not Path.glob: a node's cache removed while it is looked at (a run's nodes let go
    # beside a cleanup) is skipped, where pathlib's scandir raised FileNotFoundError.
    plans = []
    for record in sorted(glob.glob(os.path.join(glob.escape(str(folder)), pattern, RECORD))):
        with contextlib.suppress(FileNotFoundError):  # unmounted by its run meanwhile: nothing left to do
            plans += plan_unmount(Path(record).parent)
    return plans


def plan_unmount(state: Path) -> list[Action]:
    """Cleanup's plan for one recorded mount: unmount, end its server, remove its cache and record."""
    record = MountRecord.load(state)
    return [
        Action("unmount", "data runtime mount", record.mountpoint, {"timeout_s": record.unmount_timeout},
               run=lambda: unmount(record.where(), record.unmount_timeout)),
        Action("stop", "data runtime server", str(record.pid),
               run=lambda: _stop(record.pid, record.unmount_timeout, record.started)),
        *([Action("close", "data runtime placeholder group", str(record.held_fd), run=lambda: _release(record))]
          if record.held_by is not None and record.held_by == os.getpid() else []),
        *([Action("remove", "data runtime placeholder disk", str(Path(record.cache, placeholderdisk.IMAGE)),
                  run=lambda: placeholderdisk.remove(Path(record.cache)))]
          if Path(record.cache, placeholderdisk.IMAGE).exists() else []),
        Action("remove", "data runtime cache", record.cache, run=lambda: shutil.rmtree(record.cache, True), always=True),
        Action("remove", "data runtime record", str(state / RECORD),
               run=lambda: [(state / name).unlink(missing_ok=True) for name in ("serve.err", RECORD)] and None,
               always=True),
    ]
