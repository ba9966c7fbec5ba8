"""`amlemu job stream` of a pipeline: each step's child job followed in the order the steps start,
its rank 0 log headed by the step's name, then the pipeline's end status.

az ml streams a pipeline's own execution log (`logs/azureml/executionlogs.txt`: which step runs
were submitted) and its Execution Summary; a step's output is read with `az ml job stream -n
<child job>`. amlemu prints the steps' logs in the one stream, since that is what a local run is
watched for, and its own driver's log stays in `system_logs/driver.txt` (`job download`).
Parallel steps are not interleaved: the step that started first is followed to its end, then the
next one's log is printed from its start.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from amlemu.pipelines.submit import read_steps
from amlemu.runs.handle import Run
from amlemu.specs import RunStatus
from amlemu.sweeps.sweepspec import is_sweep_record

if TYPE_CHECKING:
    from amlemu.api import Emulator

POLL = 0.2  # seconds between looks at the steps


def header(step: str, child: str) -> str:
    return f"\n=== step {step} (job {child}) ===\n"


def footer(step: str, child: Run) -> str:
    record = child.record
    why = f": {record.error.splitlines()[0]}" if record.error else ""
    return f"=== step {step}: {record.status.value}{why}\n"


def step_log(child: Run) -> str:
    """What a step's stream shows: its child job's rank 0 log; a sweep step's, the sweep's decisions
    (azureml-logs/hyperdrive.txt: what az ml streams for a sweep job; each trial's log is its own)."""
    if is_sweep_record(child.record.job):
        path = child.dir / "azureml-logs" / "hyperdrive.txt"
        return path.read_text(errors="replace") if path.exists() else ""
    return child.logs(0)


def not_run_lines(steps: list[Mapping[str, Any]]) -> list[str]:
    """The steps that never got a child job (not run after a failure, refused at submit), one line
    each with why. Pure."""
    return [f"=== step {s['step']}: {s['status']}" + (f" ({s['detail']})" if s.get("detail") else "") + "\n"
            for s in steps if not s.get("child_job")]


class StepFollower:
    """What one pass over the pipeline's children prints: each child's log from where the last pass
    stopped, in the order the children were made; it stops at the first child still going."""

    def __init__(self, emu: Emulator, pipeline: str, out: TextIO) -> None:
        self.emu, self.pipeline, self.out = emu, pipeline, out
        self.done: set[str] = set()
        self.offsets: dict[str, int] = {}

    def step_names(self) -> dict[str, str]:
        kept = read_steps(self.emu.home.run_dir(self.pipeline)) or {}
        return {s["child_job"]: s["step"] for s in kept.get("steps", []) if s.get("child_job")}

    def one_pass(self, to_the_end: bool) -> bool:
        """Print what is new; True when every child seen has ended and been printed whole.
        `to_the_end`: the pipeline has ended, print every child's log without waiting on it."""
        names = self.step_names()
        for child in self.emu.runs(parent=self.pipeline):  # oldest first: the order the steps started
            if child.id in self.done:
                continue
            step = names.get(child.id) or child.record.job.get("display_name") or child.id
            if child.id not in self.offsets:
                self.out.write(header(step, child.id))
                self.offsets[child.id] = 0
            ended = child.status.is_terminal  # read before the log: a log read after its end is whole
            text = step_log(child)
            self.out.write(text[self.offsets[child.id]:])
            self.offsets[child.id] = len(text)
            if not (ended or to_the_end):
                self.out.flush()
                return False
            if text and not text.endswith("\n"):
                self.out.write("\n")
            self.out.write(footer(step, child))
            self.done.add(child.id)
        self.out.flush()
        return True


def stream(emu: Emulator, pipeline: str, out: TextIO | None = None, poll: float = POLL) -> RunStatus:
    """Follow the pipeline's steps until it ends; returns its final status."""
    out = out or sys.stdout
    run = emu.run(pipeline)
    out.write(f"RunId: {pipeline}\n")
    follower = StepFollower(emu, pipeline, out)
    while True:
        emu.reconcile()
        status = run.status  # read before the children: when it has ended, so have the steps it waited for
        if follower.one_pass(to_the_end=status.is_terminal) and status.is_terminal:
            break
        time.sleep(poll)
    kept = read_steps(run.dir) or {}
    out.write("".join(not_run_lines(kept.get("steps", []))))
    out.write(run.summary() + "\n")
    out.flush()
    return status
