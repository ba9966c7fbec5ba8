"""Submitting a sweep: checked as its trial would be (the workspace's rules on the trial job), the code
snapshot taken once for every trial, the sweep's record queued, and its driver started in a process
group of its own (sweeps/driver.py), as a run's supervisor is. `plan` is the dry run."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu.errors import ConfigError
from amlemu.home import new_run_id
from amlemu.jobs import gitcode
from amlemu.runs.handle import Run
from amlemu.specs import RunStatus
from amlemu.sweeps.sampling import make_sampler
from amlemu.sweeps.sweepspec import SweepSpec, is_sweep_file, load_sweep, sweep_to_record, trial_field, trial_job

if TYPE_CHECKING:
    from amlemu.api import Emulator

DRIVER_LOG = "driver.txt"  # in the sweep's system_logs


def is_sweep(job: Any) -> bool:
    return isinstance(job, SweepSpec) or (isinstance(job, (str, Path)) and is_sweep_file(job))


def load(job: Any, overrides: list[str] | None = None) -> SweepSpec:
    return job if isinstance(job, SweepSpec) else load_sweep(job, overrides)


def checked(emu: Emulator, spec: SweepSpec) -> SweepSpec:
    """The trial job through the workspace's rules (compute, environment, data), as submit applies them."""
    assert spec.template is not None
    try:
        emu._check(emu._job(spec.template), probe=True)
    except ConfigError as exc:  # named as the sweep's YAML has it (trial.environment, not environment)
        raise type(exc)(trial_field(exc.field), exc.problem, exc.fix) from None
    return spec


def plan(emu: Emulator, spec: SweepSpec) -> dict[str, Any]:
    """Dry run: the sweep as it will run, and its first trial's launch as a command job's dry run."""
    checked(emu, spec)
    values = make_sampler(spec.sampling, spec.space, spec.objective.goal, seed=0).suggest([])  # a seedless sweep's differ
    first = emu.plan_job(trial_job(spec, values or {}, f"{spec.name or 'sweep'}_0", code=None))
    return {"sweep": spec.to_dict(), "max_total_trials": spec.limits.max_total_trials,
            "max_concurrent_trials": spec.limits.concurrency, "trial_names": "<sweep name>_<n>, n from 0",
            "first_trial_values": values, "first_trial": first}


def submit(emu: Emulator, spec: SweepSpec, parent: str | None = None) -> Run:
    """`parent`: the pipeline whose sweep step this sweep is (pipelines/sweepstep.py)."""
    checked(emu, spec)
    emu.reconcile()
    assert spec.template is not None
    run_id = spec.name or new_run_id()
    run_dir = emu.home.run_dir(run_id)
    try:  # every trial runs this code, whatever changes in the folder meanwhile
        gitcode.take_snapshot(spec.template, run_dir / "snapshot")
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    snapshot = run_dir / "snapshot" if spec.template.code is not None else None
    cluster = emu.job_cluster(spec.template, emu._make_cluster)
    emu.store.add_run(run_id, spec.experiment_name, cluster.spec.name, sweep_to_record(spec, run_id, snapshot),
                      parent=parent)
    emu.store.set_status(run_id, RunStatus.QUEUED, "submitted: the sweep's driver samples its trials")
    emu.start_owner(run_id, "amlemu.sweeps.driver", DRIVER_LOG)
    return Run(emu.store, emu.home, run_id, emu.reconcile)
