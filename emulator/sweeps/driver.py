"""A sweep's driver: one process per sweep, as a run's supervisor is one per run
(`python -m amlemu.sweeps.driver <home> <sweep id>`, started by sweeps/submit.py).

It samples the trials, submits each as a child job `<sweep>_<n>` on the sweep's compute (queued
behind the cluster's nodes like any job), keeps at most max_concurrent_trials active, reads each
active trial's primary metric as it is logged, cancels the trials the early termination policy
picks, enforces limits.timeout, and at the end writes the sweep's results (sweep.json: the trials,
the best one, the properties Azure ML shows) and its decisions (azureml-logs/hyperdrive.txt).
"""
from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from amlemu.api import Emulator
from amlemu.errors import AmlEmuError
from amlemu.runs import recovery
from amlemu.runs.metrics import metric_history
from amlemu.specs import RunStatus
from amlemu.sweeps import policies, results
from amlemu.sweeps.results import Trial
from amlemu.sweeps.sampling import make_sampler
from amlemu.sweeps.sweepspec import SweepSpec, sweep_from_record, trial_job

POLL = 0.5  # seconds between looks at the trials when the store did not change (a trial's end wakes it at once)


class SweepDriver:
    def __init__(self, home_root: Path, run_id: str) -> None:
        self.emu = Emulator(home_root)
        self.store = self.emu.store
        self.run_id = run_id
        self.run_dir = self.emu.home.run_dir(run_id)
        self.spec: SweepSpec = sweep_from_record(self.store.run(run_id).job)
        seed = int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)  # bayesian's, and unseeded random's
        self.sampler = make_sampler(self.spec.sampling, self.spec.space, self.spec.objective.goal, seed=seed)
        self.trials: list[Trial] = []
        self.seen: dict[str, int] = {}  # reports each trial had at the policy's last look
        self.exhausted = False
        (self.run_dir / "azureml-logs").mkdir(parents=True, exist_ok=True)

    def log(self, line: str, part: str = "CONTROLLER") -> None:
        """hyperdrive.txt as Azure ML writes it: [time][GENERATOR|SCHEDULER|CONTROLLER|POLICY][INFO]..."""
        with open(self.run_dir / "azureml-logs" / "hyperdrive.txt", "a") as out:
            out.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}][{part}][INFO]{line}\n")

    # --- trials --------------------------------------------------------------------------------
    def submit_next(self) -> bool:
        history = [(t.values, t.final) for t in self.trials]
        values = None if self.exhausted else self.sampler.suggest(history)
        if values is None:
            if not self.exhausted:
                self.log(f"the search space is exhausted after {len(self.trials)} trial(s)", "GENERATOR")
            self.exhausted = True
            return False
        name = f"{self.run_id}_{len(self.trials)}"
        try:
            job = trial_job(self.spec, values, name, code=None)  # the record's trial code is the sweep's snapshot
            self.emu.submit(job, parent=self.run_id)
        except AmlEmuError as exc:  # refused as any job would be (its compute deleted, too big to fit): failed
            self.trials.append(Trial(name, values, RunStatus.FAILED, reason=f"refused at submit: {exc}"))
            self.log(f"job id='{name}' refused at submit: {exc}", "SCHEDULER")
            return True
        self.trials.append(Trial(name, values))
        self.log(f"Scheduling job, id='{name}' with {values}", "SCHEDULER")
        return True

    def refresh(self) -> None:
        metric = self.spec.objective.primary_metric
        for trial in self.trials:
            if trial.status.is_terminal:
                continue
            record = self.store.run(trial.name)
            history = metric_history(self.emu.home.run_dir(trial.name), active=not record.status.is_terminal)
            trial.points = [value for _, value in history.get(metric, [])]
            trial.logged = sorted(history)
            if record.status.is_terminal:
                trial.status = record.status
                self.log(f"trial {trial.name} ended {record.status.value}"
                         + (f" with {metric} {trial.final:g}" if trial.final is not None else f", no {metric} logged"))

    def apply_policy(self) -> None:
        policy = self.spec.early_termination
        if policy is None:
            return
        histories = {t.name: policies.TrialHistory(tuple(t.points), "finished" if t.status.is_terminal or t.reason
                                                   else "running")  # one being canceled is decided already
                     for t in self.trials if t.points}
        for decision in policies.to_cancel(policy, histories, self.spec.objective.goal, self.seen):
            trial = next(t for t in self.trials if t.name == decision.trial)
            trial.reason = f"early termination: {decision.reason}"
            self.log(f"canceling job, id='{trial.name}': {decision.reason}", "POLICY")
            self.cancel(trial.name, trial.reason)
        self.seen = {name: len(h.reports) for name, h in histories.items()}

    def cancel(self, name: str, why: str) -> None:
        if not self.store.run(name).status.is_terminal:
            self.store.set_status(name, RunStatus.CANCEL_REQUESTED, why)

    def active(self) -> list[Trial]:
        return [t for t in self.trials if not t.status.is_terminal]

    # --- the sweep -----------------------------------------------------------------------------
    def stop_reason(self, deadline: float) -> str | None:
        if self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:
            return "canceled by request"
        if time.time() > deadline:
            return f"limits.timeout ({self.spec.limits.sweep_timeout} s) reached"
        return None

    def run(self) -> None:
        limits = self.spec.limits
        if self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:  # canceled while queued
            return self.finish()
        self.store.set_status(self.run_id, RunStatus.PREPARING, "sampling the first trials")
        self.store.set_status(self.run_id, RunStatus.RUNNING, f"sampling {self.spec.sampling.type}, at most "
                              f"{limits.max_total_trials} trial(s), {limits.concurrency} at once")
        self.log(f"sweep started: {self.spec.sampling.type} sampling of {', '.join(self.spec.space.names)}; "
                 f"{self.spec.objective.goal} {self.spec.objective.primary_metric}")
        deadline = time.time() + limits.sweep_timeout
        stopped: str | None = None
        while True:
            self.refresh()
            if stopped is None and (stopped := self.stop_reason(deadline)):
                self.log(f"stopping: {stopped}; canceling the active trials")
                for trial in self.active():
                    trial.reason = f"the sweep stopped: {stopped}"
                    self.cancel(trial.name, trial.reason)
            if stopped is None:
                self.apply_policy()
                while len(self.active()) < limits.concurrency and len(self.trials) < limits.max_total_trials \
                        and self.submit_next():
                    pass
            results.write(self.run_dir, results.summarize(self.spec, self.trials))  # live: job show, the studio
            if not self.active() and (stopped or self.exhausted or len(self.trials) >= limits.max_total_trials):
                break
            self.store.wait_for_change(POLL)  # at once when a trial or step ends
        self.finish()

    def finish(self) -> None:
        summary = results.summarize(self.spec, self.trials)
        results.write(self.run_dir, summary)
        for line in summary["notes"]:
            self.log(line)
        if self.store.run(self.run_id).status is RunStatus.CANCEL_REQUESTED:  # also one that came just now
            status, detail = RunStatus.CANCELED, "canceled by request; its active trials were canceled"
        elif summary["best_child_run_id"] or any(t.status is RunStatus.COMPLETED for t in self.trials):
            status, detail = RunStatus.COMPLETED, summary["headline"]
        else:
            status, detail = RunStatus.FAILED, summary["headline"]
        self.log(f"sweep {status.value}: {detail}")
        if status is not RunStatus.CANCELED:
            self.store.set_status(self.run_id, RunStatus.FINALIZING, "the sweep's results written")
        self.store.set_status(self.run_id, status, detail, **({"error": detail} if status is RunStatus.FAILED else {}))


def main(argv: list[str] | None = None) -> int:
    home_root, run_id = (argv if argv is not None else sys.argv[1:])[:2]
    driver = SweepDriver(Path(home_root), run_id)
    with recovery.ending_on_failure(driver.store, run_id, driver.log, "sweep"):
        driver.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
