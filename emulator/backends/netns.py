"""A process cluster's network: a Linux network namespace of its own, holding only loopback.

Why: process nodes used to share this machine's network, so a job reached every loopback service
of the machine (the home's Azurite with its well-known development key, the home's service and
every other home's). In its cluster's namespace a process node reaches the other nodes of its
cluster (they share its loopback, as they shared the host's: MPI and torch's rendezvous need no
change) and the one port put there for it, its run's service link (emulator/runs/servicelink.py,
whose listening socket is made inside the namespace by `listen_in`); nothing of this machine.

The namespace is persistent, bound at a file (`unshare --net=FILE`) under RUNTIME_ROOT, named by
the home's id and the cluster, so it needs no process to hold it and is found again by its path
(as `ip netns` keeps its own under /run/netns: a run-time folder, empty after a reboot, when no
namespace is left either; and not in the home, whose files anyone may walk and read). It is
removed by unmounting that file (`remove`), which `ProcessBackend` does with the cluster and its reaper. Making one needs
root (mounting the binding, entering it); as another user process nodes keep sharing the host's
network, and the dry run says so.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from amlemu.errors import BackendError

CLONE_NEWNET = 0x40000000
RUNTIME_ROOT = Path("/run/amlemu/netns")  # <home id>/<cluster>: one namespace per process cluster
TOOLS = ("unshare", "nsenter", "ip", "umount")


def supported() -> bool:
    """Whether this process can make and enter cluster namespaces (root, Linux, the tools)."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in TOOLS)


def exists(path: Path) -> bool:
    """Whether `path` is a bound namespace (not merely the empty file a failed create leaves)."""
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def create_argv(path: Path) -> list[str]:
    """The command that binds a new network namespace at `path` with its loopback up (pure)."""
    return [shutil.which("unshare") or "unshare", f"--net={path}", "--",
            shutil.which("ip") or "ip", "link", "set", "lo", "up"]


def enter_argv(path: Path) -> list[str]:
    """The prefix that runs a command inside the namespace at `path` (pure)."""
    return [shutil.which("nsenter") or "nsenter", f"--net={path}", "--"]


def create(path: Path) -> None:
    """Bind a namespace at `path` unless one is there (idempotent). Under a lock: a cluster's nodes
    are made in parallel, and two bindings stacked at one path would leave one after `remove`."""
    if exists(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exists(path):
            return
        path.touch()
        done = subprocess.run(create_argv(path), capture_output=True, text=True, check=False)
        if done.returncode != 0 or not exists(path):
            remove(path)
            raise BackendError(f"could not make the cluster's network namespace at {path}: "
                               f"{(done.stderr or done.stdout).strip() or f'exit code {done.returncode}'}")


def remove(path: Path) -> None:
    """Unbind the namespace at `path` (it ends once no process is left in it), delete the file and
    its folder once empty."""
    for _ in range(8):  # every binding stacked there (older versions could stack two)
        if not exists(path):
            break
        subprocess.run([shutil.which("umount") or "umount", "--lazy", str(path)], capture_output=True, check=False)
    try:
        (path.parent / f".{path.name}.lock").unlink(missing_ok=True)
        path.unlink()
        path.parent.rmdir()  # the home's folder, when this was its last cluster
    except FileNotFoundError:
        pass
    except OSError as exc:  # another cluster's namespace is still there (ENOTEMPTY), or a busy mount
        if exc.errno not in (errno.ENOTEMPTY, errno.EBUSY):
            raise


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python 3.12+
    if setns is not None:
        setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _socket_in(path: Path, make: Callable[[], socket.socket]) -> socket.socket:
    """The socket `make` returns, made inside the namespace at `path`.

    A network namespace belongs to a thread, and a socket to the namespace it was made in for its
    whole life: a short-lived thread enters the namespace, makes the socket and ends, so no other
    thread of this process ever changes network."""
    found: dict[str, object] = {}

    def run() -> None:
        try:
            with open(path, "rb") as target:
                _setns(target.fileno())
            found["sock"] = make()
        except OSError as exc:
            found["error"] = exc

    thread = threading.Thread(target=run, name="amlemu-netns", daemon=True)
    thread.start()
    thread.join()
    if "sock" not in found:
        raise OSError(f"cannot use the network namespace {path}: {found.get('error')}")
    return found["sock"]  # type: ignore[return-value]


def listen_in(path: Path, host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket listening on `host`:<a free port> inside the namespace at `path`."""
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        sock.listen(128)
        return sock
    return _socket_in(path, make)


def connect_in(path: Path, host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A TCP connection to `host`:`port` inside the namespace at `path` (a run's service relay
    reaching a node's service from this machine's side)."""
    return _socket_in(path, lambda: socket.create_connection((host, port), timeout=timeout))
