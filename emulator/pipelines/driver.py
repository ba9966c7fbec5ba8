"""A pipeline's driver: one process per pipeline job, as a sweep's is
(`python -m amlemu.pipelines.driver <home> <pipeline id>`, started by pipelines/submit.py).

It starts each step as a child job when graph.ready() names it (independent steps at once, each on
its compute, queued behind the cluster's nodes like any job), its inputs bound to the outputs its
upstream steps' child jobs wrote (or the runs they reuse: pipelines/reuse.py, a step whose key
matches an earlier successful run is recorded Completed without running); a failed step stops its
dependents and, unless settings.continue_on_step_failure, cancels the running steps; a cancel of the
pipeline cancels its steps. The steps' states are written to pipeline.json as they change (job show, the studio).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from amlemu.api import Emulator
from amlemu.errors import AmlEmuError
from amlemu.pipelines import graph, reuse, stepartifacts, sweepstep
from amlemu.pipelines.submit import child_name, from_record, step_job, write_steps
from amlemu.runs import recovery
from amlemu.specs import RunStatus

POLL = 0.2  # seconds between looks at the steps when the store did not change (a step's end wakes it at once)
STOPPED = (RunStatus.FAILED, RunStatus.CANCELED, RunStatus.NOT_RESPONDING)


class PipelineDriver:
    def __init__(self, home_root: Path, run_id: str) -> None:
        self.emu = Emulator(home_root)
        self.store = self.emu.store
        self.run_id = run_id
        self.run_dir = self.emu.home.run_dir(run_id)
        self.spec = from_record(self.emu, self.store.run(run_id).job)
        self.children: dict[str, str] = {}  # step -> its child job (shown in job show, the studio)
        # step -> the job whose outputs its dependents read: its child job, or the run it reuses, or a
        # sweep step's best trial
        self.sources: dict[str, str] = {}
        self.states: dict[str, RunStatus] = {}  # step -> its child job's status (a step not there: not started)
        self.notes: dict[str, str] = {}  # step -> why it did not run, or was canceled
        self.keys: dict[str, str | None] = {}  # step -> its reuse key (None: not reused, nor reusable)
        self.reused: dict[str, str] = {}  # step -> the earlier run it reused
        self.handled: set[str] = set()  # stopped steps whose consequences were drawn

    def log(self, line: str) -> None:
        print(f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}] {line}", flush=True)  # system_logs/driver.txt

    def refresh(self) -> None:
        for step, child in self.children.items():
            if not self.states[step].is_terminal:
                self.states[step] = self.store.run(child).status
                if self.states[step].is_terminal:
                    self.log(f"step {step} ({child}) ended {self.states[step].value}")
                    if self.spec.steps[step].type == "sweep" and self.states[step] is RunStatus.COMPLETED:
                        self.sweep_completed(step, child)
                    elif self.states[step] is RunStatus.COMPLETED:  # its `artifacts` output, before dependents start
                        problem = stepartifacts.publish(self.emu, self.spec, step, child)
                        if problem:
                            self.states[step], self.notes[step] = RunStatus.FAILED, problem
                            self.log(f"step {step}: {problem}")

    def start_ready(self) -> None:
        reused = False
        for step in graph.ready(self.spec, self.states):
            if self.reuse(step):
                reused = True
                continue
            try:
                if self.spec.steps[step].type == "sweep":  # its sources entry: its best trial, when it completes
                    sweepstep.submit(self.emu, self.spec, step, self.run_id, self.sources)
                else:
                    self.emu.submit(step_job(self.spec, step, self.run_id, self.sources), parent=self.run_id)
            except AmlEmuError as exc:  # refused as any job would be (its compute deleted, too big): failed
                self.states[step], self.notes[step] = RunStatus.FAILED, f"refused at submit: {exc}"
                self.log(f"step {step} refused at submit: {exc}")
                continue
            self.children[step], self.states[step] = child_name(self.run_id, step), RunStatus.QUEUED
            if self.spec.steps[step].type != "sweep":
                self.sources[step] = self.children[step]
            if self.keys.get(step):  # a later pipeline's same step may reuse this run once it completed
                self.store.update_run(self.children[step], reuse_key=self.keys[step])
            self.log(f"step {step} started as {self.children[step]}")
        if reused:  # a reused step is Completed now: its dependents may start without waiting a poll
            self.start_ready()

    def reuse(self, step: str) -> bool:
        """The step's reuse key; when an earlier successful run has it (its outputs still there), the
        step's child job is recorded Completed as reusing it, and its dependents read that run's outputs."""
        found = reuse.step_key(self.emu, self.spec, step, self.run_id, self.sources, self.keys)
        self.keys[step] = found.key
        original = reuse.find_reusable(self.emu, found.key) if found.key else None
        if original is None:
            if found.why:
                self.log(f"step {step} runs: {found.why}")
            return False
        try:
            child = reuse.record_reused(self.emu, self.spec, step, self.run_id, self.sources, original)
        except AmlEmuError as exc:  # recorded by a racing driver, say: the step runs, and the log says why
            self.log(f"step {step} not reused: {exc}")
            return False
        self.children[step], self.states[step], self.sources[step] = child, RunStatus.COMPLETED, original.id
        self.reused[step] = original.id
        self.log(f"step {step} reused {original.id} (pipeline {original.parent}): recorded as {child}, not run")
        return True

    def sweep_completed(self, step: str, sweep: str) -> None:
        """A sweep step's outputs are its best trial's, as on Azure ML: its dependents read that trial's."""
        best = sweepstep.best_trial(self.emu, sweep)
        if best is None:
            self.states[step], self.notes[step] = RunStatus.FAILED, sweepstep.NO_BEST
        else:
            self.sources[step], self.notes[step] = best, f"best trial {best}"
        self.log(f"step {step}: {self.notes[step]}")

    def cancel(self, step: str, why: str) -> None:
        self.notes.setdefault(step, why)
        if step in self.children and not self.store.run(self.children[step]).status.is_terminal:
            self.log(f"canceling step {step}: {why}")
            self.store.set_status(self.children[step], RunStatus.CANCEL_REQUESTED, why)

    def after_failures(self) -> None:
        for step, status in list(self.states.items()):
            if status in STOPPED and step not in self.handled:
                self.handled.add(step)
                plan = graph.after_failure(self.spec, step, self.states)
                for name in plan.not_run:
                    self.notes.setdefault(name, f"not run: step {step} {status.value}")
                for name in plan.cancel:
                    self.cancel(name, f"step {step} {status.value} (continue_on_step_failure is false)")

    def active(self) -> list[str]:
        return [s for s, st in self.states.items() if not st.is_terminal]

    def write(self) -> None:
        steps = [{"step": s, "child_job": self.children.get(s), "status": self.states.get(s, RunStatus.NOT_STARTED).value,
                  "detail": self.notes.get(s, ""), "reused_from": self.reused.get(s),
                  "outputs_from": self.sources.get(s)}  # the job whose outputs its dependents read
                 for s in graph.topological_order(self.spec)]
        write_steps(self.run_dir, {"steps": steps, "continue_on_step_failure": self.spec.settings.continue_on_step_failure})

    def run(self) -> None:
        if self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:  # canceled while queued
            return self.finish()
        self.store.set_status(self.run_id, RunStatus.PREPARING, "starting the first steps")
        self.store.set_status(self.run_id, RunStatus.RUNNING, f"{len(self.spec.steps)} step(s)")
        canceled = False
        while True:
            self.refresh()
            if not canceled and self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:
                canceled = True
                self.log("the pipeline was canceled: canceling its steps")
                for step in self.active():
                    self.cancel(step, "the pipeline was canceled")
            if not canceled:
                self.after_failures()
                self.start_ready()
            self.write()
            if not self.active() and (canceled or graph.finished(self.spec, self.states)):
                break
            self.store.wait_for_change(POLL)  # at once when a trial or step ends
        self.finish()

    def finish(self) -> None:
        self.write()
        shown = graph.pipeline_status(self.spec, self.states)
        counts = {s: sum(1 for st in self.states.values() if st is s) for s in RunStatus}
        detail = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no step ran"
        if self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:
            status, detail = RunStatus.CANCELED, f"canceled by request; steps: {detail}"
        elif shown is RunStatus.CANCELED:  # a step canceled by itself: the pipeline is canceled too
            self.store.set_status(self.run_id, RunStatus.CANCEL_REQUESTED, "a step was canceled")
            status = RunStatus.CANCELED
        else:
            status = shown
        self.log(f"pipeline {status.value}: {detail}")
        if status is not RunStatus.CANCELED:
            self.store.set_status(self.run_id, RunStatus.FINALIZING, "every step ended")
        failed = [s for s, st in self.states.items() if st in (RunStatus.FAILED, RunStatus.NOT_RESPONDING)]
        error = {"error": f"step(s) {', '.join(failed)} failed; steps: {detail}"} if status is RunStatus.FAILED else {}
        self.store.set_status(self.run_id, status, detail, **error)


def main(argv: list[str] | None = None) -> int:
    home_root, run_id = (argv if argv is not None else sys.argv[1:])[:2]
    driver = PipelineDriver(Path(home_root), run_id)
    with recovery.ending_on_failure(driver.store, run_id, driver.log, "pipeline"):
        driver.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
