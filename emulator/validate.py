"""Would AmlCompute accept this job? The checks Azure ML makes at submission (and the ones that
only fail a job minutes later, on the cluster), run locally before a job goes anywhere.

Each finding names the field and the fix. Errors stop a submission; warnings are things the
emulator cannot verify but AmlCompute will.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from amlemu import safeyaml
from amlemu.envs.resolve import resolve
from amlemu.cluster import pools
from amlemu.errors import AmlEmuError, CapacityError, ConfigError, name_taken
from amlemu.jobs import sdkschema
from amlemu.jobs.jobyaml import load_job
from amlemu.jobs.snapshot import SnapshotPlan, plan_snapshot
from amlemu.runs.contract import LOCAL_SOURCE, bindings
from amlemu.specs import DistributionType, JobSpec
from amlemu.storage import urlinputs

if TYPE_CHECKING:
    from amlemu.api import Emulator

MB = 1024 * 1024
SNAPSHOT_MAX_BYTES = 300 * MB  # Azure ML refuses larger code snapshots ("Snapshot size limit exceeded")
SNAPSHOT_MAX_FILES = 2000
MPI_IMAGE_RE = re.compile(r"mpi|azureml", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    field: str
    problem: str
    fix: str
    severity: str = "error"  # error | warning

    def line(self) -> str:
        return f"{self.severity}: {self.field}: {self.problem}; {self.fix}"


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


def check_links(code: Path | SnapshotPlan, refuse_outside: bool) -> list[Finding]:
    """Links and special files in the code folder, as emulator/jobs/snapshot.py copies them. A link out
    of the folder is an error where the emulator runs the job (it refuses it); Azure ML would
    upload the target from this machine, which is only worth a warning for a job going there."""
    plan = code if isinstance(code, SnapshotPlan) else plan_snapshot(code)
    outside = "error" if refuse_outside else "warning"
    return ([Finding(e.field, e.problem, e.fix or "", outside) for e in plan.outside]
            + [Finding(e.field, e.problem, e.fix or "") for e in plan.refused]
            + [Finding("code", note, "remove it from the code folder (Azure ML's upload would try to read it)",
                       "warning") for note in plan.skipped])


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
    findings += check_links(plan, refuse_outside=emu is not None)
    if emu is not None:
        findings += check_against_workspace(job, emu)
    return findings


def check_against_workspace(job: JobSpec, emu: Emulator) -> list[Finding]:
    findings = []
    try:
        cluster = emu.job_cluster(job)  # serverless and local: the platform's pool (made at submit)
    except AmlEmuError:
        names = ", ".join(c.spec.name for c in emu.computes()) or "none"
        return [Finding("compute", f"'{job.compute}' does not exist in the workspace (computes: {names})",
                        "create it with `amlemu compute create` or fix the name")]
    if job.name and emu.store.run_exists(job.name):
        taken = name_taken(job.name)
        findings.append(Finding(taken.field, taken.problem, taken.fix or ""))
    try:  # a registered environment must exist in the workspace, as Azure ML checks at submit
        resolve(job.environment, job.environment_def, emu.store.environment)
    except ConfigError as exc:
        findings.append(Finding(exc.field, exc.problem, exc.fix or ""))
    try:
        pools.check_fits(cluster, job)
    except CapacityError as exc:
        findings.append(Finding(exc.field, exc.problem, exc.fix or ""))
    try:  # data and model assets and jobs' outputs, resolved to their datastore URIs as submit does
        job = emu.assets.bind(job)
    except ConfigError as exc:
        return [*findings, Finding(exc.field, exc.problem, exc.fix or "")]
    try:  # inputs by URL: each answers (from this machine, as the run will read it)
        urlinputs.check_inputs(job.inputs, probe=True)
    except ConfigError as exc:
        findings.append(Finding(exc.field, exc.problem, exc.fix or ""))
    for b in bindings(job, "<run id>"):
        if b.datastore == LOCAL_SOURCE or b.is_output or urlinputs.is_url_source(b.datastore):
            continue
        try:
            emu.datastores.get(b.datastore)
            present = bool(emu.datastores.ls(b.uri))
        except AmlEmuError as exc:
            findings.append(Finding(f"{b.ref}.path", str(exc), "create the datastore or fix the URI"))
            continue
        if not present:
            findings.append(Finding(f"{b.ref}.path", f"nothing at {b.uri}",
                                    f"upload it: amlemu data upload <folder> {b.uri}"))
    return findings


def validate_file(path: str | Path, overrides: list[str] | None = None, emu: Emulator | None = None) -> list[Finding]:
    """The job file as `amlemu job validate -f` checks it: the emulator's loading error (one finding)
    or its rules, then, when azure-ai-ml is installed, what its own `load_job` refuses besides: one
    finding per problem, so a field the emulator already named is not named twice."""
    try:
        findings = check_job(load_job(path, overrides), emu)
    except ConfigError as exc:
        findings = [Finding(exc.field, exc.problem, exc.fix or "see the Azure ML job schema")]
        if exc.field.startswith("--set"):
            return findings
    if _a_command_job(Path(path)) and sdkschema.installed():
        findings += [Finding(e.field, e.problem, e.fix or sdkschema.REFERENCE) for e in sdkschema.schema_errors(path, overrides)
                     if not any(_same_field(e.field, f.field) for f in findings)]
    return findings


def _a_command_job(path: Path) -> bool:
    """Only a YAML the emulator's own reader takes (never /dev/zero or a YAML bomb) goes to the SDK,
    and only a command job's: of another type it would list that type's fields as problems."""
    try:
        data = safeyaml.load_file(path, "-f", "job YAML")
    except ConfigError:
        return False
    return isinstance(data, dict) and data.get("type", "command") == "command"


def _same_field(a: str, b: str) -> bool:
    """One field, or one inside the other (`inputs.data` and `inputs.data.path`): one problem."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")
