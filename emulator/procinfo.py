"""What a process is, read from /proc through psutil, safely across the moment it execs."""
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
