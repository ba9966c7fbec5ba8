"""How a launch ended, and the status each ending gives the run: one table, pure.

The supervisor watches the launch (`watch`) until its processes exit or something stops them
(a cancel, limits.timeout, a preemption, a partition, this machine out of memory); `ending` then says which status the run
ends in, with its detail and error, as Azure ML reports them.
"""
from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from amlemu.specs import RunStatus

POLL = 0.2  # how often a supervisor reads the store (cancel, faults, free nodes): most of its CPU


class Outcome(str, enum.Enum):
    EXITED = "exited"  # the job's processes ended by themselves
    CANCELED = "canceled"
    TIMEOUT = "timeout"  # limits.timeout (max_run_duration_seconds) passed
    PREEMPTED = "preempted"  # a low-priority node was taken away: the run restarts
    PARTITIONED = "partitioned"  # a node cut off from the cluster's network for too long
    OUT_OF_MEMORY = "out_of_memory"  # the job drove this machine out of memory (runs/memwatch.py)
    MACHINE_CUT = "machine_cut"  # another machine of the cluster cut off (runs/machinewatch.py): its nodes are lost


@dataclass(frozen=True)
class Ending:
    status: RunStatus
    detail: str = ""
    error: str | None = None


@dataclass(frozen=True)
class Attempt:
    """What the end of one attempt looked like, for `ending`."""

    outcome: Outcome
    exit_code: int
    lost: tuple[str, ...] = ()  # nodes that died under the job
    upload_error: str | None = None  # outputs that could not be written back
    timeout_seconds: int | None = None
    partitioned: tuple[str, ...] = ()
    partition_timeout: float = 0.0
    memory_reason: str | None = None  # why an OUT_OF_MEMORY attempt was stopped


def ending(attempt: Attempt, explain: Callable[[], str]) -> Ending:
    """The run's final status for an attempt that was not preempted. `explain`: the failure's
    reason, read from the logs only when the job failed by itself."""
    code = attempt.exit_code
    if attempt.outcome is Outcome.CANCELED:
        return Ending(RunStatus.CANCELED, "canceled by request; every process was stopped")
    if attempt.outcome is Outcome.PARTITIONED:
        reason = (f"node {', '.join(attempt.partitioned)} was cut off from the cluster network and the job did not "
                  f"end within {attempt.partition_timeout:g} s; it was stopped on all nodes")
        return Ending(RunStatus.FAILED, reason, reason)
    if attempt.outcome is Outcome.OUT_OF_MEMORY:
        reason = attempt.memory_reason or "this machine ran out of memory"
        return Ending(RunStatus.FAILED, reason + "; it was stopped on all nodes", reason)
    if attempt.outcome is Outcome.TIMEOUT:
        return Ending(RunStatus.FAILED, f"the job ran past limits.timeout (max_run_duration_seconds="
                      f"{attempt.timeout_seconds}) and was stopped",
                      f"exceeded max_run_duration_seconds={attempt.timeout_seconds}")
    if code == 0 and not attempt.lost:
        if attempt.upload_error:
            return Ending(RunStatus.FAILED, attempt.upload_error, attempt.upload_error)
        return Ending(RunStatus.COMPLETED)
    reason = explain()
    return Ending(RunStatus.FAILED, reason, reason)


@dataclass
class Watch:
    """What the watch asks at each poll (the store, read through the supervisor), and the cluster
    preemption policy's due preemptions: (seconds after the start, node), fired as they fall due."""

    canceled: Callable[[], bool]
    preempted: Callable[[], bool]
    partitioned: Callable[[], bool]
    preempt: Callable[[str], None]
    due: list[tuple[float, str]] = field(default_factory=list)
    limit: float | None = None  # limits.timeout, seconds
    out_of_memory: Callable[[], bool] = lambda: False
    machine_cut: Callable[[], bool] = lambda: False
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def stopping(self, elapsed: float) -> Outcome | None:
        """The reason to stop the job now, if any (a cancel first: it wins over everything)."""
        if self.canceled():
            return Outcome.CANCELED
        if self.limit and elapsed > self.limit:
            return Outcome.TIMEOUT
        if self.preempted():
            return Outcome.PREEMPTED
        if self.partitioned():
            return Outcome.PARTITIONED
        if self.out_of_memory():
            return Outcome.OUT_OF_MEMORY
        if self.machine_cut():  # its nodes are lost: the run ends as a lost node ends it (`ending`'s last case)
            return Outcome.MACHINE_CUT
        return None

    def until_done(self, poll: Callable[[], int | None]) -> Outcome:
        """Poll the launch (`poll`: its exit code, None while it runs) until it ends (EXITED) or a
        reason to stop it comes (returned; the caller stops it)."""
        started = self.clock()
        while poll() is None:
            elapsed = self.clock() - started
            if (outcome := self.stopping(elapsed)) is not None:
                return outcome
            for due, node in [d for d in self.due if elapsed >= d[0]]:
                self.due.remove((due, node))
                self.preempt(node)
            self.sleep(POLL)
        return Outcome.EXITED
