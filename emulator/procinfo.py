"""What a process is, read from /proc through psutil, safely across the moment it execs; whether a
pid is still the process it was (its start time), never acting on a reused one."""
from __future__ import annotations

import time

import psutil


def argv(proc: psutil.Process, wait: float = 2.0) -> list[str]:
    """The process's argv. Empty for a moment right after it was started: the kernel closes the
    close-on-exec pipe that Popen waits on before it sets the new program's argv (and nsenter's
    own exec of dockerd has the same moment), so a process just started can read as a nameless
    one (3 in 300 here when idle, often under load) and be taken for a dead one. Only a zombie or
    a kernel thread stays nameless; wait out the moment."""
    deadline = time.monotonic() + wait
    while not (found := proc.cmdline()) and time.monotonic() < deadline and proc.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.01)
    return found


def started_at(pid: int) -> float | None:
    """The process's start time as psutil computes it (None: gone)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def alive(pid: int, started: float) -> bool:
    """Is `pid` still the process that started at `started` (psutil's create_time), and not a
    zombie? Never act on a reused pid."""
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 0.05 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
