"""A home's fork server: one Python process per home, with the modules of a run's owner (its
supervisor, a sweep's or a pipeline's driver) imported once, that forks each owner on request.

Why: a fresh interpreter spent 135-170 ms importing the supervisor's modules on every submit
(docs/benchmarks.md, issue 30); a fork of a process that has them costs a few milliseconds.

The submitter (`start_owner`) asks the server over a unix socket in the home (an owner-only
folder no node sees); the server checks the caller is this user, the module one of the owners,
and its own code still the code on disk (else it answers "stale" and exits), then forks: the child
leads a session of its own, writes to the run's log, takes the submitter's environment, umask and
folder, and runs the module's `main`. Whenever the server cannot serve (none yet, another
interpreter or PYTHONPATH, stale, any error) the owner is started as `python -P -m <module> <home>
<run id>`, and a server for the next submit. It leaves when idle (IDLE_SECONDS) or when `cleanup`
stops it.

It also forks the data runtime's serving process of a mount (SERVED: `spawn`, on the caller's
stdin, stdout and stderr, passed over the socket): a fresh one spent ~0.4 s importing fsspec,
adlfs and the FUSE binding per input per node. An owner or server forked here carries the server's
command line, so it is known by its pid and start time (cluster/teardown.ours), never by its argv.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from amlemu.procinfo import alive, started_at

OWNERS = ("amlemu.runs.supervisor", "amlemu.sweeps.driver", "amlemu.pipelines.driver")
# Served too, with the caller's stdin, stdout and stderr (passed over the socket), but imported only
# at the first request: most homes never mount data, and every home's server would pay their imports.
SERVED = ("amlemu.storage.dataruntime.serve",)
IDLE_SECONDS = 600.0  # a home unused this long gives its memory back
MAX_REQUEST = 1 << 20  # an environment and a few paths
MODULE = "amlemu.forkserver"


@dataclass(frozen=True)
class Owner:  # a run's owner process as started: its pid and its start time (psutil's create_time)
    pid: int
    started: float | None


def folder(home_root: Path) -> Path:
    return Path(home_root) / "forkserver"


# --- the submitter's side ---------------------------------------------------------------------
def start_owner(home_root: Path, module: str, run_id: str, log: Path, env: dict[str, str], warm: bool = False) -> Owner:
    """`module`'s main for `run_id`, forked by the home's server when one serves, else started as
    `python -P -m module home run_id` (and a server started, in the background, for the next time).
    -P: the submitter's folder is not on the owner's path (a module of the user's there would shadow
    one the owner imports; the server's children share one path, whoever submits). `warm`: the run
    reads or writes a datastore; once it has forked two such, the server imports SERVED (and so
    adlfs) for the owners and mounts after them (one alone would pay the imports twice)."""
    argv = [str(home_root), run_id]
    forked = _ask(home_root, _request(module, argv, env, log=str(log), warm=warm))
    if forked is not None:
        return forked
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", module, *argv], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    owner = Owner(proc.pid, started_at(proc.pid))
    start_server(home_root, env)
    return owner


def start_server(home_root: Path, env: dict[str, str]) -> None:
    """The home's server, started in the background unless one runs or is starting (a second
    started meanwhile leaves at once: its lock)."""
    if not servers(home_root):
        folder(home_root).mkdir(mode=0o700, exist_ok=True)
        with open(folder(home_root) / "server.txt", "ab") as out:
            server = subprocess.Popen([sys.executable, "-P", "-m", MODULE, str(home_root)], stdin=subprocess.DEVNULL,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        # Recorded at once: a cleanup before the server has written its own pid file still finds it.
        (folder(home_root) / "spawned").write_text(f"{server.pid}:{started_at(server.pid)}")


def _request(module: str, argv: list[str], env: dict[str, str], **more: Any) -> dict[str, Any]:
    """What the server is asked: the module, and the submitter's environment, folder, umask and interpreter."""
    mask = os.umask(0o077)
    os.umask(mask)
    return {"module": module, "argv": argv, "env": env, "cwd": os.getcwd(), "umask": mask,
            "executable": sys.executable, **more}


def spawn(home_root: Path, module: str, argv: list[str], env: dict[str, str], fds: tuple[int, int, int],
          timeout: float = 30.0) -> Owner | None:
    """`module`'s main (one of SERVED) forked by the home's server on `fds` as its stdin, stdout and
    stderr (the first request waits for its imports); None: no server serves, start it yourself."""
    return _ask(home_root, _request(module, argv, env), timeout, fds)


def _ask(home_root: Path, request: dict[str, Any], timeout: float = 10.0,
         fds: tuple[int, ...] = ()) -> Owner | None:
    """The process the server forked for one request; None when no server answers or it declines."""
    path = folder(home_root) / "sock"
    if not path.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], list(fds))
            answer = json.loads(_read_line(conn)[0] or b"{}")
    except (OSError, ValueError):
        return None
    return Owner(int(answer["pid"]), float(answer["started"])) if "pid" in answer else None


def _recorded(path: Path) -> Owner | None:
    """The process a pid file names, if it is still that process."""
    try:
        pid, started = path.read_text().split(":")
        found = Owner(int(pid), float(started))
    except (OSError, ValueError):
        return None
    return found if alive(found.pid, float(started)) else None


def running(home_root: Path) -> Owner | None:
    """The home's server (its pid file, written as it starts, before its imports)."""
    return _recorded(folder(home_root) / "pid")


def servers(home_root: Path) -> list[Owner]:
    """The home's server, and one just started that has not written its pid file yet."""
    found = [_recorded(folder(home_root) / name) for name in ("pid", "spawned")]
    return list({o.pid: o for o in found if o is not None}.values())


def stop(home_root: Path) -> bool:
    """End the home's servers (cleanup): by their recorded pids, only if still those processes;
    returns once they have ended (a pid file goes a moment before its process does)."""
    found = servers(home_root)
    for server in found:
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            proc = psutil.Process(server.pid)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                proc.send_signal(sig)
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    time.sleep(0.01)
                if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                    break
    return bool(found)


# --- the server ---------------------------------------------------------------------------------
def _read_line(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One line, and the descriptors that came with it (the caller closes them)."""
    data, fds = b"", []
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        chunk, got, _, _ = socket.recv_fds(conn, 65536, 3)
        fds += got
        if not chunk:
            break
        data += chunk
    return data, fds


def _code_stamp() -> dict[str, int]:
    """The files of every amlemu module loaded here, with their modification times."""
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] == "amlemu" and path:
            with contextlib.suppress(OSError):
                files[path] = os.stat(path).st_mtime_ns
    return files


def _stale(stamp: dict[str, int]) -> bool:
    try:
        return any(os.stat(path).st_mtime_ns != mtime for path, mtime in stamp.items())
    except OSError:  # gone
        return True


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def _child(request: dict[str, Any], inherited: list[int], fds: list[int]) -> int:
    """In the forked child: become the run's owner (without the server's socket and lock), its
    output in its log, or the process the caller asked for, on the caller's descriptors."""
    for fd in inherited:
        os.close(fd)
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not fds:
        out = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fds = [os.open(os.devnull, os.O_RDONLY), out, out]
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.umask(int(request["umask"]))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"], *request["argv"]]
    try:
        return int(importlib.import_module(request["module"]).main(list(request["argv"])) or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the owner's crash goes to its log, as a fresh interpreter's would
        traceback.print_exc()
        return 1


@dataclass
class _Served:  # the server's state: its code's files and times, the runs using a datastore it forked
    stamp: dict[str, int]
    data_runs: int = 0


def _serve_one(conn: socket.socket, served: _Served, inherited: list[int]) -> bool:
    """Answer one request; False when this server must go (its code changed on disk)."""
    fds: list[int] = []
    try:
        try:
            line, fds = _read_line(conn)
            return _fork(conn, json.loads(line), served, inherited, fds)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
            return True
    finally:
        for fd in fds:  # the child has its own copies
            os.close(fd)


def _fork(conn: socket.socket, request: dict[str, Any], served: _Served, inherited: list[int],
          fds: list[int]) -> bool:  # the checks, the fork and the answer; see _serve_one
    module = request.get("module")
    if _peer_uid(conn) != os.getuid() or module not in OWNERS + SERVED:
        raise ValueError("refused: not this user, or not a run's owner")
    if request.get("executable") != sys.executable or request["env"].get("PYTHONPATH") != os.environ.get("PYTHONPATH"):
        raise ValueError("another interpreter or PYTHONPATH")
    if (module in SERVED) != (len(fds) == 3):
        raise ValueError("a served module takes stdin, stdout and stderr; an owner none")
    if _stale(served.stamp):
        with contextlib.suppress(OSError):
            conn.sendall(b'{"error": "stale"}\n')
        return False
    if module in SERVED:
        _import_served(served.stamp)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        code = _child(request, inherited, fds)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # the server's atexit handlers and buffers are not the owner's
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"pid": pid, "started": started_at(pid) or 0.0}).encode() + b"\n")
    served.data_runs += bool(request.get("warm"))
    if request.get("warm") and served.data_runs >= 2:  # a second: more are likely (a sweep, a pipeline)
        _import_served(served.stamp)
    return True


def _import_served(stamp: dict[str, int]) -> None:
    """SERVED, imported by the first request that needs them (not at the server's start: most homes
    never mount data), kept for the forks after it."""
    if not set(SERVED) <= set(sys.modules):
        for module in SERVED:
            importlib.import_module(module)
        stamp.update(_code_stamp())


def _preload() -> None:
    """What every owner imports at its start, paid here once, at the lowest priority: the server
    starts beside the home's first run, which must not wait for it (niceness is per thread, so the
    owners, forked by the main thread, are not lowered)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    for module in OWNERS:
        importlib.import_module(module)
    with contextlib.suppress(ImportError):
        import docker  # noqa: F401, PLC0415 - a docker node's supervisor imports it first thing


def serve(home_root: str) -> int:
    import fcntl  # noqa: PLC0415

    where = folder(Path(home_root))
    where.mkdir(mode=0o700, exist_ok=True)
    lock = os.open(where / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # one server per home: a second started meanwhile leaves at once
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        (where / "pid").write_text(f"{os.getpid()}:{started_at(os.getpid())}")  # cleanup finds it from here on
        # A daemon thread, gone before the first fork (forks of one thread); a SIGTERM meanwhile
        # does not wait for its imports.
        preload = threading.Thread(target=_preload, daemon=True)
        preload.start()
        preload.join()
        served = _Served(_code_stamp())
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # owners are reaped by the kernel: no zombie
        staged = where / f"sock.{os.getpid()}"
        listener.bind(str(staged))
        os.chmod(staged, 0o600)
        listener.listen(64)
        listener.settimeout(IDLE_SECONDS)
        os.replace(staged, where / "sock")
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return 0
            with conn:
                conn.settimeout(10)
                if not _serve_one(conn, served, [listener.fileno(), lock]):
                    return 0
    finally:  # the lock is still this server's: the socket and pid file are too
        for name in ("sock", "pid", f"sock.{os.getpid()}"):
            with contextlib.suppress(OSError):
                (where / name).unlink()
        listener.close()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
