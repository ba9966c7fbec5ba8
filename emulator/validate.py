"""Would AmlCompute accept this job? The checks Azure ML makes at submission (and the ones that
only fail a job minutes later, on the cluster), run locally before a job goes anywhere.

Each finding names the field and the fix. Errors stop a submission; warnings are things the
emulator cannot verify but AmlCompute will. The rules against the workspace are
emulator/workspacerules.py's, the ones submit applies, with their wording.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from amlemu import safeyaml, workspacerules
from amlemu.errors import ConfigError
from amlemu.jobs import sdkschema
from amlemu.jobs.jobyaml import load_job
from amlemu.jobs.snapshot import SnapshotPlan, plan_snapshot
from amlemu.pipelines import submit as pipelines
from amlemu.pipelines.pipelinespec import is_pipeline_file, load_pipeline
from amlemu.specs import DistributionType, JobSpec
from amlemu.sweeps.sweepspec import SweepSpec, is_sweep_file, load_sweep, trial_field
from amlemu.workspacerules import Finding, check_links

__all__ = ["Finding", "check_job", "check_links", "check_snapshot", "validate_file"]

if TYPE_CHECKING:
    from amlemu.api import Emulator

MB = 1024 * 1024
SNAPSHOT_MAX_BYTES = 300 * MB  # Azure ML refuses larger code snapshots ("Snapshot size limit exceeded")
SNAPSHOT_MAX_FILES = 2000
MPI_IMAGE_RE = re.compile(r"mpi|azureml", re.IGNORECASE)


def check_snapshot(code: Path | SnapshotPlan) -> list[Finding]:
    """Azure ML's limits on the code snapshot, counted over what it would upload: the code folder
    less what its .amlignore (else .gitignore) leaves out, as emulator/jobs/ignorefile.py applies it."""
    plan = code if isinstance(code, SnapshotPlan) else plan_snapshot(code)
    files = list(plan.files.values())
    size = sum(f.stat().st_size for f in files if f.exists())  # removed meanwhile: no size
    findings = []
    if len(files) > SNAPSHOT_MAX_FILES:
        findings.append(Finding("code", f"{len(files)} files in the snapshot, Azure ML takes at most {SNAPSHOT_MAX_FILES}",
                                "leave data and outputs out with a .amlignore file, or point code at a smaller folder"))
    if size > SNAPSHOT_MAX_BYTES:
        findings.append(Finding("code", f"the snapshot is {size / MB:.0f} MB, Azure ML takes at most "
                                f"{SNAPSHOT_MAX_BYTES // MB} MB", "move data to a datastore input and list big files in .amlignore"))
    return findings


def check_job(job: JobSpec, emu: Emulator | None = None) -> list[Finding]:
    """Every rule that needs no service: the job alone, then against the workspace when given."""
    findings = []
    if not job.environment:
        findings.append(Finding("environment", "missing", "give environment: azureml:<name>@latest or an image"))
    elif job.distribution.type is DistributionType.MPI and job.image and not MPI_IMAGE_RE.search(job.image):
        findings.append(Finding("environment", f"cannot tell whether {job.image} has Open MPI, which mpi jobs need",
                                "base it on an Azure ML image (mcr.microsoft.com/azureml/openmpi...)", "warning"))
    plan = plan_snapshot(job.code)
    findings += check_snapshot(plan)
    if emu is None:  # links out of the code folder: Azure ML would upload their targets
        return findings + check_links(plan, refuse_outside=False)
    # The workspace's rules, as submit applies them, and whether each input's data is there.
    return findings + workspacerules.check(job, emu, probe=True, look_for_data=True, snapshot=plan).findings


def validate_file(path: str | Path, overrides: list[str] | None = None, emu: Emulator | None = None) -> list[Finding]:
    """The job file as `amlemu job validate -f` checks it: the emulator's loading error (one finding)
    or its rules, then, when azure-ai-ml is installed, what its own `load_job` refuses besides: one
    finding per problem, so a field the emulator already named is not named twice."""
    try:
        findings = _sweep_findings(load_sweep(path, overrides), emu) if is_sweep_file(path) else \
            _pipeline_findings(path, overrides, emu) if is_pipeline_file(path) else check_job(load_job(path, overrides), emu)
    except ConfigError as exc:
        findings = [Finding(exc.field, exc.problem, exc.fix or "see the Azure ML job schema")]
        if exc.field.startswith("--set"):
            return findings
    if _a_command_job(Path(path)) and sdkschema.installed():
        findings += [Finding(e.field, e.problem, e.fix or sdkschema.REFERENCE) for e in sdkschema.schema_errors(path, overrides)
                     if not any(pipelines.same_field(e.field, f.field) for f in findings)]
    return findings


def _sweep_findings(spec: SweepSpec, emu: Emulator | None) -> list[Finding]:
    """A sweep's rules hold by loading it; its trial is checked as the command job it runs."""
    assert spec.template is not None
    return [replace(f, field=trial_field(f.field)) for f in check_job(spec.template, emu)]


def _pipeline_findings(path: str | Path, overrides: list[str] | None, emu: Emulator | None) -> list[Finding]:
    """A pipeline's own rules hold by loading it (each refusal names jobs.<step>.<field>); each
    command step is checked as the command job it runs (jobs.<step>.<field>), less the data the
    steps before it will write. A sweep step's trials are checked as they start."""
    spec = pipelines.load(emu, path, overrides) if emu is not None else load_pipeline(path, overrides)
    children = {name: pipelines.child_name(spec.name or "pipeline", name) for name in spec.steps}
    findings = []
    for name, step in spec.steps.items():
        if step.type != "command":
            continue
        written = pipelines.written_inputs(spec, name)
        job = pipelines.step_job(spec, name, spec.name or "pipeline", children)
        findings += [replace(f, field=f"jobs.{name}.{f.field}") for f in check_job(job, emu)
                     if not any(pipelines.same_field(f.field, w) for w in written)]
    return findings


def _a_command_job(path: Path) -> bool:
    """Only a YAML the emulator's own reader takes (never /dev/zero or a YAML bomb) goes to the SDK,
    and only a command job's: of another type it would list that type's fields as problems."""
    try:
        data = safeyaml.load_file(path, "-f", "job YAML")
    except ConfigError:
        return False
    return isinstance(data, dict) and data.get("type", "command") == "command"
