"""The rig's engine as a process (emulator/machines/rig.py): started, waited for, stopped by its
pid (and its helpers, containerd and shims, by theirs), and the mounts it leaves unmounted."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from amlemu import procinfo
from amlemu.backends.base import LABEL
from amlemu.errors import BackendError

if TYPE_CHECKING:
    from amlemu.machines.rig import Layout

STOP_S = 15.0  # SIGTERM's grace: dockerd stops its containerd and saves its state


def start(argv: list[str], lay: Layout) -> subprocess.Popen[bytes]:
    """Start the engine detached from this process's session (nsenter execs dockerd: one pid)."""
    with open(lay.log, "ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def ours(lay: Layout, pid: int | None) -> psutil.Process | None:
    """The rig's dockerd by its recorded pid, only while that pid is still it (not a reused one)."""
    if not pid:
        return None
    try:
        proc = psutil.Process(int(pid))
        alive = proc.status() != psutil.STATUS_ZOMBIE
        return proc if alive and lay.address in procinfo.argv(proc) else None
    except (psutil.Error, ValueError):
        return None


def _client(lay: Layout, timeout: int = 30) -> Any:
    import docker  # noqa: PLC0415

    return docker.DockerClient(base_url=lay.address, timeout=timeout)


def answers(lay: Layout, pid: int | None) -> bool:
    if ours(lay, pid) is None or not lay.socket.exists():
        return False
    try:
        _client(lay, timeout=5).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure: it does not answer
        return False


def wait_ready(lay: Layout, proc: subprocess.Popen[bytes], within: float) -> Any:
    """A client of the engine once it answers; an error with its log's last line if it exits or
    does not answer `within` seconds. Exited means this process's child ended (its own handle,
    not a pid's argv, which is empty for a moment while nsenter execs dockerd)."""
    deadline = time.monotonic() + within
    what = f"did not answer within {within:.0f} s"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            what = f"exited with status {proc.returncode}"
            break
        if lay.socket.exists():
            with contextlib.suppress(Exception):
                rig = _client(lay)
                rig.ping()
                return rig
        time.sleep(0.05)
    tail = lay.log.read_text(errors="replace").strip().splitlines()[-1:] if lay.log.exists() else []
    raise BackendError(f"rig: the second dockerd {what} (its log's last line: {tail[0] if tail else 'none'})")


def import_mirror(rig: Any) -> None:
    """The docker backend's node image, made in the rig's engine as in the first (no registry here)."""
    from amlemu.backends.dockerplan import MIRROR_IMAGE  # noqa: PLC0415
    from amlemu.backends.mirrorfs import mirror_rootfs  # noqa: PLC0415
    import docker  # noqa: PLC0415

    try:
        rig.images.get(MIRROR_IMAGE)
    except docker.errors.ImageNotFound:
        repository, tag = MIRROR_IMAGE.split(":")
        rig.api.import_image_from_data(mirror_rootfs(), repository=repository, tag=tag, changes=[f"LABEL {LABEL}=1"])


def _empty(lay: Layout) -> list[str]:
    """The engine's containers removed and the engine out of any swarm (the whole engine is the rig's)."""
    done = []
    with contextlib.suppress(Exception):
        rig = _client(lay, timeout=10)
        for container in rig.containers.list(all=True):
            container.remove(force=True)
            done.append(f"removed container {container.name} (rig engine)")
        if (rig.info().get("Swarm") or {}).get("LocalNodeState", "inactive") != "inactive":
            rig.swarm.leave(force=True)
            done.append("rig engine left its swarm")
    return done


def stop(lay: Layout, pid: int | None) -> list[str]:
    """Stop the rig's engine: emptied, SIGTERM, SIGKILL after STOP_S; then its helpers that outlived it."""
    return halt(lay, pid, empty=True)


def halt(lay: Layout, pid: int | None, empty: bool = False, kill: bool = False) -> list[str]:
    """Stop the rig's engine by its pid (`empty`: its containers and swarm membership removed first;
    else they stay in its data root, as a machine's engine that stops keeps them; `kill`: SIGKILL at
    once, as a machine that crashes: it stops answering before anyone can remove them)."""
    proc = ours(lay, pid)
    if proc is None and lay.pidfile.exists():
        with contextlib.suppress(ValueError, OSError):
            proc = ours(lay, int(lay.pidfile.read_text().strip()))
    if proc is None:
        return []
    done = _empty(lay) if empty else []
    helpers = _descendants(proc)
    _end(proc, 0.0 if kill else STOP_S)
    for helper in helpers:
        _end(helper, 5.0)
    return done + [f"stopped dockerd {proc.pid}"]


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _end(proc: psutil.Process, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace`; waited for (and reaped, where it is this process's child)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0))[0 if grace else 1:]:
        try:
            proc.send_signal(sig)
            proc.wait(timeout=wait)
            return
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            continue


def umount_argv(path: str, lazy: bool = False) -> list[str]:
    return ["umount", *(["--lazy"] if lazy else []), path]


def mounts_under(roots: Iterable[Path], mountinfo: str) -> list[str]:
    """Mount points at or under any of `roots`, deepest first (pure: from /proc/self/mountinfo's text)."""
    tops = [str(r).rstrip("/") for r in roots]
    points = [line.split()[4].encode().decode("unicode_escape") for line in mountinfo.splitlines() if line.strip()]
    found = {p for p in points if any(p == t or p.startswith(t + "/") for t in tops)}
    return sorted(found, key=lambda p: (-p.count("/"), p))


def unmount_under(roots: Iterable[Path]) -> list[str]:
    """What the engine left mounted (container layers, sandboxes' namespaces) unmounted."""
    done = []
    for point in mounts_under(roots, Path("/proc/self/mountinfo").read_text()):
        if subprocess.run(umount_argv(point), capture_output=True, check=False).returncode != 0:
            subprocess.run(umount_argv(point, lazy=True), capture_output=True, check=False)
        done.append(f"unmounted {point}")
    return done
