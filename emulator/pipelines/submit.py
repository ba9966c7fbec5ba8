"""Submitting a pipeline job (`type: pipeline`): read with the workspace's registered components,
each command step checked as the command job it runs (the workspace's rules), the
pipeline's record queued, and its driver started in a process group of its own
(pipelines/driver.py), as a sweep's is. `plan` is the dry run.

Each step runs as a child job named `<pipeline>_<step>` (Azure ML names a step's child job with a
GUID and shows the step as its display name; a readable unique name serves the same), with the
step's name as its display name; a sweep step is a sweep job of that name (pipelines/sweepstep.py).
A step whose earlier run can stand for it is reused, not run (pipelines/reuse.py). A step's code is
read when the step starts, not at submit.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu import statefile, workspacerules
from amlemu.errors import ConfigError
from amlemu.home import new_run_id
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.pipelines import graph, stepio, sweepstep
from amlemu.pipelines.bindings import StepOutputRef
from amlemu.pipelines.pipelinespec import PipelineSpec, is_pipeline_file, load_pipeline, pipeline_from_dict
from amlemu.pipelines.registry import Components
from amlemu.runs.handle import Run
from amlemu.specs import JobSpec, RunStatus

if TYPE_CHECKING:
    from amlemu.api import Emulator

DRIVER_LOG = "driver.txt"  # in the pipeline's system_logs
STEPS_FILE = "pipeline.json"  # the steps as the driver last saw them: job show, the studio


def is_pipeline(job: Any) -> bool:
    return isinstance(job, PipelineSpec) or (isinstance(job, (str, Path)) and is_pipeline_file(job))


def is_pipeline_record(record: Mapping[str, Any]) -> bool:
    return record.get("kind") == "pipeline"


def load(emu: Emulator, job: Any, overrides: list[str] | None = None) -> PipelineSpec:
    """The pipeline, its registered components resolved from the workspace's registry."""
    if isinstance(job, PipelineSpec):
        return job
    return load_pipeline(job, overrides, components=Components(emu.store).resolve)


def from_record(emu: Emulator, record: Mapping[str, Any]) -> PipelineSpec:
    kept = record["pipeline"]
    return pipeline_from_dict(kept["yaml"], base_dir=Path(kept["base_dir"]), components=Components(emu.store).resolve)


def child_name(pipeline: str, step: str) -> str:
    return f"{pipeline}_{step}"


def step_job(spec: PipelineSpec, step: str, pipeline: str, children: Mapping[str, str]) -> JobSpec:
    """The command job step `step` runs: its inputs bound to the child jobs in `children` (step ->
    child job) whose outputs it reads, its outputs where Azure ML puts them."""
    name = child_name(pipeline, step)
    data = {**stepio.step_job_dict(spec, step, name, children), "name": name}
    component = spec.steps[step].component
    base = Path(component.base_dir) if component is not None else Path(spec.base_dir)
    try:
        return job_from_dict(data, base_dir=base)
    except ConfigError as exc:
        raise ConfigError(f"jobs.{step}.{exc.field}", exc.problem, exc.fix) from None


def written_inputs(spec: PipelineSpec, step: str) -> list[str]:
    """The step's inputs that the steps before it write (`inputs.<name>`): not there before they run."""
    return [f"inputs.{k}" for k, i in spec.steps[step].inputs.items() if isinstance(i.binding, StepOutputRef)]


def same_field(a: str, b: str) -> bool:
    """One field, or one inside the other (`inputs.data` and `inputs.data.path`): one problem."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _first_jobs(emu: Emulator, spec: PipelineSpec, pipeline: str) -> list[JobSpec]:
    """Every command step's job checked by the workspace's rules before anything is made (compute,
    environment, data, memory: a pipeline that would fail at step 3 fails at submit), less the data
    its upstream steps will write; a sweep step that starts the graph as its sweep's submit checks
    it (a later one's trials, as they start). The jobs of the steps that read no other step."""
    deps = graph.dependencies(spec)
    children = {s: child_name(pipeline, s) for s in spec.steps}
    jobs = []
    for step in graph.topological_order(spec):
        if spec.steps[step].type == "sweep":
            if not deps[step]:
                jobs.append(sweepstep.first_job(emu, spec, step, pipeline))
            continue
        job = emu._job(step_job(spec, step, pipeline, children))
        written = written_inputs(spec, step)
        for finding, error in workspacerules.check(job, emu, probe=True).problems:
            if finding.severity == "error" and not any(same_field(finding.field, w) for w in written):
                problem = error if isinstance(error, ConfigError) else ConfigError(finding.field, finding.problem,
                                                                                    finding.fix or None)
                raise ConfigError(f"jobs.{step}.{problem.field}", problem.problem, problem.fix) from None
        if not deps[step]:
            jobs.append(job)
    return jobs


def plan(emu: Emulator, spec: PipelineSpec) -> dict[str, Any]:
    """Dry run: the steps in run order, each with its child job's name and what it reads."""
    _first_jobs(emu, spec, spec.name or "pipeline")  # a name that passes the checks; the real one is made at submit
    name = spec.name or "<pipeline name>"
    deps = graph.dependencies(spec)
    return {"pipeline": spec.source, "run_order": graph.topological_order(spec),
            "steps": [{"step": s, "child_job": child_name(name, s), "after": list(deps[s]),
                       "compute": spec.steps[s].compute} for s in graph.topological_order(spec)],
            "continue_on_step_failure": spec.settings.continue_on_step_failure}


def submit(emu: Emulator, spec: PipelineSpec) -> Run:
    run_id = spec.name or new_run_id()
    first = _first_jobs(emu, spec, run_id)[0]
    emu.reconcile()
    cluster = emu.job_cluster(first, emu._make_cluster)  # the pipeline's record names its first step's compute
    record = {**job_to_record(first), "name": run_id, "display_name": spec.display_name or run_id,
              "command": "", "inputs": {}, "outputs": {}, "code": None, "kind": "pipeline",
              "pipeline": {"yaml": spec.source, "base_dir": spec.base_dir}}
    emu.store.add_run(run_id, spec.experiment_name or first.experiment_name, cluster.spec.name, record)
    emu.store.set_status(run_id, RunStatus.QUEUED, "submitted: the pipeline's driver starts its steps")
    emu.start_owner(run_id, "amlemu.pipelines.driver", DRIVER_LOG)
    return Run(emu.store, emu.home, run_id, emu.reconcile)


def read_steps(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STEPS_FILE).read_text())
    except (OSError, ValueError):
        return None


def output_sources(steps: list[dict[str, Any]]) -> dict[str, str]:
    """step -> the job whose outputs stand for it, as the driver recorded it in pipeline.json
    (`outputs_from`: its child job, the run it reused, a sweep step's best trial once it completed;
    none yet: the step has not started, or its sweep is still running). Pure."""
    found = {}
    for s in steps:
        source = s["outputs_from"] if "outputs_from" in s else s.get("reused_from") or s.get("child_job")
        if source:
            found[s["step"]] = source
    return found


def write_steps(run_dir: Path, data: dict[str, Any]) -> None:
    statefile.write_json(run_dir / STEPS_FILE, data, indent=1)
