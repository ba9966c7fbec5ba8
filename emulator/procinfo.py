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


def same_start(recorded: float, read: float) -> bool:
    """Do two readings of a start time (psutil's create_time) name one process? A start time is the
    process's ticks since boot, which never change, plus /proc/stat's `btime`, a whole second that
    moves by one when this machine's clock is stepped or drifts across a second boundary: so the
    same process reads equal within 0.05 s or a whole second or two apart. (With a plain tolerance
    every live process read as gone after such a move: supervisors taken for dead, runs failed.)"""
    apart = abs(recorded - read)
    return apart < 0.05 or (apart < 2.05 and abs(apart - round(apart)) < 0.05)


def alive(pid: int, started: float) -> bool:
    """Is `pid` still the process that started at `started` (psutil's create_time), and not a
    zombie? Never act on a reused pid."""
    try:
        proc = psutil.Process(pid)
        return same_start(started, proc.create_time()) and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
