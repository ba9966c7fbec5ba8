"""A run's watchdog: a child forked by its supervisor before anything else starts, which waits on a
pipe whose only writer is the supervisor. The read returns EOF the moment the supervisor is gone,
however it went (SIGKILL included); if the run has not ended, the watchdog recovers it at once
(runs/recovery.py) instead of leaving the job running until some later CLI call notices.

Why a fork and not a new interpreter: it costs no start-up or imports (the supervisor's modules
are already loaded, shared copy-on-write), and while it waits it only sleeps in read() (its own
memory, as the supervisor's pages diverge from the ones it shares: ~8 MiB, measured beside a 31 MiB
supervisor). It lives in the supervisor's process group, so a cleanup that stops the supervisor's
group stops it too; a supervisor that ends its run itself dismisses it first (no process of the run
outlives the supervisor).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback


def start(home_root: str, run_id: str) -> int:
    """Fork the watchdog; returns its pid. The supervisor keeps the pipe's write end open (never
    inherited: os.pipe's ends are close-on-exec) until it exits."""
    read_end, write_end = os.pipe()
    supervisor = os.getpid()
    if (child := os.fork()) != 0:
        os.close(read_end)
        return child
    code = 0
    try:
        os.close(write_end)
        while os.read(read_end, 4096):  # the supervisor never writes: only EOF, at its exit
            pass
        _until_orphaned(supervisor)
        _recover(home_root, run_id)
    except BaseException:  # noqa: BLE001 - told in the run's supervisor.txt (its stdout), never raised on
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the supervisor's atexit handlers and buffers are not the watchdog's


def dismiss(pid: int) -> None:
    """The supervisor ended the run itself: its watchdog goes before it does, so that nothing of
    the run outlives the supervisor (not even the moment a watchdog would take to find the run ended)."""
    with contextlib.suppress(ProcessLookupError, ChildProcessError):  # it died already: nothing to dismiss
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _until_orphaned(supervisor: int, timeout: float = 10.0) -> None:
    """The pipe closes a moment before the supervisor has fully exited (its files go first); once
    this process is re-parented, the supervisor is a zombie or gone, and a check of its pid says so."""
    deadline = time.monotonic() + timeout
    while os.getppid() == supervisor and time.monotonic() < deadline:
        time.sleep(0.01)


def _recover(home_root: str, run_id: str) -> None:
    from amlemu.cluster.store import Store  # noqa: PLC0415 - loaded already (forked): no cost
    from amlemu.home import Home  # noqa: PLC0415
    from amlemu.runs import recovery  # noqa: PLC0415

    home = Home.at(home_root)
    store = Store(home.db)
    try:
        record = store.run(run_id)
        if recovery.claim(store, record):
            recovery.recover(home, store, record)
    finally:
        store.close()
