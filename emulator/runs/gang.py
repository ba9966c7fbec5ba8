"""The host side of a launch, watched as one gang: the processes the supervisor starts for a plan
(the platform's mpirun, or one launch agent per process of a node-launched job), their output into
the run's logs, and the first process that failed, which ends the run for all of them.

All of them share one process group (the first one's), so one signal reaches every launch on the
host, and a cleanup that finds the run's launch_pid stops them all.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from amlemu.runs.plan import LaunchPlan
from amlemu.runs.runlogs import RunLogs


class Gang:
    def __init__(self, plan: LaunchPlan, env: dict[str, str], logs: RunLogs) -> None:
        # (rank whose log its output is, or None: mpirun's stream, tagged by rank; its argv)
        commands = [(None, plan.argv)] if plan.launcher == "mpirun" else [(p.rank, p.launch) for p in plan.processes]
        self.failure: tuple[int | None, int] | None = None  # (rank, exit code) of the first to fail
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []  # the output pumps
        self._watchers: list[threading.Thread] = []  # one per process: reaps it, records a failure
        self._ended = threading.Event()  # a process ended since the last nap
        self.pgid = 0
        try:
            for rank, argv in commands:
                # A group of its own in the supervisor's session (itself a session leader): a group
                # of another session could not be joined by the next process.
                proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace", process_group=self.pgid)
                self.pgid = self.pgid or proc.pid
                self._procs.append(proc)
                self._threads.append(self._start(logs.pump, proc.stdout, rank is None, rank or 0))
                self._watchers.append(self._start(self._watch, proc, rank))
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _start(target: Callable[..., None], *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        return thread

    def _watch(self, proc: subprocess.Popen, rank: int | None) -> None:
        code = proc.wait()
        with self._lock:
            if code != 0 and self.failure is None:
                self.failure = (rank, code)
        self._ended.set()

    def nap(self, seconds: float) -> None:
        """Sleep up to `seconds`, less where one of its processes ends meanwhile: the supervisor's
        poll (outcome.Watch) then sees a job's end at once, not up to its period later (a sweep's
        trials paid ~0.1 s each)."""
        self._ended.wait(seconds)
        self._ended.clear()  # before the next poll(), which then sees every process reaped so far

    def poll(self) -> int | None:
        """None while it runs; then its exit code: the first failure's (the others are still to be
        stopped: stop()), or 0 when every process ended with 0."""
        with self._lock:
            if self.failure is not None:
                return self.failure[1]
        codes = [p.returncode for p in self._procs]  # set by the watchers as they reap
        failed = [code for code in codes if code not in (None, 0)]
        return failed[0] if failed else 0 if None not in codes else None

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM the group (mpirun passes it to every rank), SIGKILL what is left after a grace.
        What runs inside the nodes is the backend's to end (a `docker exec` client's exit does not
        end its process in the container)."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            if not self.pgid:
                return  # nothing was started
            try:
                os.killpg(self.pgid, sig)
            except (ProcessLookupError, PermissionError):
                break
            deadline = time.monotonic() + wait
            try:
                for proc in self._procs:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                continue

    def wait(self, output_timeout: float = 5.0) -> int:
        """Until every launch process has ended and its output is in the logs; the exit code."""
        for proc in self._procs:
            proc.wait()
        for thread in self._watchers:
            thread.join()  # each ends as soon as its process is reaped: the first failure is known
        for thread in self._threads:
            thread.join(timeout=output_timeout)
        code = self.poll()
        return 0 if code is None else code
