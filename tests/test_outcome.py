"""The supervisor's watch and the status each ending gives a run (emulator/runs/outcome.py), with a
fake clock and a scripted store: no process, no time passes."""
from __future__ import annotations

import pytest

from amlemu.runs.outcome import Attempt, Outcome, Watch, ending
from amlemu.specs import RunStatus


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def watch(clock: Clock, **checks) -> tuple[Watch, list[str]]:  # type: ignore[no-untyped-def]
    fired: list[str] = []
    found = {"canceled": lambda: False, "preempted": lambda: False, "partitioned": lambda: False, **checks}
    return Watch(preempt=fired.append, clock=clock, sleep=clock.sleep, **found), fired


def exits_after(seconds: float, clock: Clock, code: int = 0):  # type: ignore[no-untyped-def]
    return lambda: code if clock.now >= seconds else None


def test_a_job_that_ends_by_itself_exited_and_the_policy_preempted_what_fell_due() -> None:
    clock = Clock()
    w, fired = watch(clock)
    w.due = [(1.0, "c1-node-1"), (99.0, "c1-node-0")]
    assert w.until_done(exits_after(3.0, clock)) is Outcome.EXITED
    assert fired == ["c1-node-1"] and w.due == [(99.0, "c1-node-0")]


def test_limits_timeout_stops_the_job_after_its_seconds_not_before() -> None:
    clock = Clock()
    w, _ = watch(clock)
    w.limit = 5
    assert w.until_done(lambda: None) is Outcome.TIMEOUT
    assert 5.0 < clock.now <= 5.5


@pytest.mark.parametrize("check,outcome", [("canceled", Outcome.CANCELED), ("preempted", Outcome.PREEMPTED),
                                           ("partitioned", Outcome.PARTITIONED),
                                           ("out_of_memory", Outcome.OUT_OF_MEMORY)])
def test_each_reason_to_stop_is_its_outcome_and_a_cancel_wins(check: str, outcome: Outcome) -> None:
    clock = Clock()
    w, _ = watch(clock, **{check: lambda: clock.now >= 1.0})
    assert w.until_done(lambda: None) is outcome
    both, _ = watch(clock, canceled=lambda: True, preempted=lambda: True)
    assert both.until_done(lambda: None) is Outcome.CANCELED


def explain() -> str:
    return "rank 1 on c1-node-1 exited with code 3"


@pytest.mark.parametrize("attempt,status,error", [
    (Attempt(Outcome.EXITED, 0), RunStatus.COMPLETED, None),
    (Attempt(Outcome.EXITED, 3), RunStatus.FAILED, "rank 1 on c1-node-1 exited with code 3"),
    (Attempt(Outcome.EXITED, 0, lost=("c1-node-1",)), RunStatus.FAILED, "rank 1 on c1-node-1 exited with code 3"),
    (Attempt(Outcome.EXITED, 0, upload_error="uploading the outputs failed: x"), RunStatus.FAILED,
     "uploading the outputs failed: x"),
    (Attempt(Outcome.CANCELED, 137), RunStatus.CANCELED, None),
    (Attempt(Outcome.TIMEOUT, 137, timeout_seconds=60), RunStatus.FAILED, "exceeded max_run_duration_seconds=60"),
    (Attempt(Outcome.PARTITIONED, 137, partitioned=("c1-node-1",), partition_timeout=30), RunStatus.FAILED,
     "node c1-node-1 was cut off from the cluster network and the job did not end within 30 s; it was stopped on "
     "all nodes"),
    (Attempt(Outcome.OUT_OF_MEMORY, 137, memory_reason="this machine ran out of memory: 9 GiB"), RunStatus.FAILED,
     "this machine ran out of memory: 9 GiB"),
])
def test_each_ending_gives_the_status_azure_ml_reports(attempt: Attempt, status: RunStatus, error: str | None) -> None:
    end = ending(attempt, explain)
    assert (end.status, end.error) == (status, error)


def test_the_logs_are_read_only_for_a_job_that_failed_by_itself() -> None:
    def never() -> str:
        raise AssertionError("explain was called")
    assert ending(Attempt(Outcome.EXITED, 0), never).status is RunStatus.COMPLETED
    assert ending(Attempt(Outcome.CANCELED, 1), never).status is RunStatus.CANCELED
