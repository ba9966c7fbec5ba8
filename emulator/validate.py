"""Would AmlCompute accept this job? The checks Azure ML makes at submission (and the ones that
only fail a job minutes later, on the cluster), run locally before a job goes anywhere.

Each finding names the field and the fix. Errors stop a submission; warnings are things the
emulator cannot verify but AmlCompute will.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emulator.errors import AmlEmuError, ConfigError
from emulator.jobs.jobyaml import load_job
from emulator.jobs.snapshot import plan_snapshot
from emulator.runs.contract import LOCAL_SOURCE, bindings
from emulator.specs import DistributionType, JobSpec

if TYPE_CHECKING:
    from emulator.api import Emulator

MB = 1024 * 1024
SNAPSHOT_MAX_BYTES = 300 * MB  # Azure ML refuses larger code snapshots ("Snapshot size limit exceeded")
SNAPSHOT_MAX_FILES = 2000
IGNORE_FILES = (".amlignore", ".gitignore")  # Azure ML reads .amlignore, else .gitignore
MPI_IMAGE_RE = re.compile(r"mpi|azureml", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    field: str
    problem: str
    fix: str
    severity: str = "error"  # error | warning

    def line(self) -> str:
        return f"{self.severity}: {self.field}: {self.problem}; {self.fix}"


def ignore_patterns(code: Path) -> list[str]:
    for name in IGNORE_FILES:
        path = code / name
        if path.is_file():
            return [line.strip().rstrip("/") for line in path.read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
    return []


def snapshot_files(code: Path) -> list[Path]:
    """The files Azure ML would upload as the code snapshot (ignore file patterns applied)."""
    patterns = ignore_patterns(code)

    def ignored(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return any(fnmatch.fnmatch(rel, p.lstrip("/")) or fnmatch.fnmatch(name, p) for p in patterns)

    found = []
    for folder, dirs, files in os.walk(code):
        base = Path(folder).relative_to(code).as_posix()
        dirs[:] = [d for d in dirs if not ignored(f"{base}/{d}".lstrip("./"))]
        found += [Path(folder) / f for f in files if not ignored(f"{base}/{f}".lstrip("./"))]
    return found


def check_snapshot(code: Path) -> list[Finding]:
    files = snapshot_files(code)
    size = sum(f.stat().st_size for f in files if f.exists())  # a dangling link has no size
    findings = []
    if len(files) > SNAPSHOT_MAX_FILES:
        findings.append(Finding("code", f"{len(files)} files in the snapshot, Azure ML takes at most {SNAPSHOT_MAX_FILES}",
                                "leave data and outputs out with a .amlignore file, or point code at a smaller folder"))
    if size > SNAPSHOT_MAX_BYTES:
        findings.append(Finding("code", f"the snapshot is {size / MB:.0f} MB, Azure ML takes at most "
                                f"{SNAPSHOT_MAX_BYTES // MB} MB", "move data to a datastore input and list big files in .amlignore"))
    return findings


def check_links(code: Path, refuse_outside: bool) -> list[Finding]:
    """Links and special files in the code folder, as emulator/jobs/snapshot.py copies them. A link out
    of the folder is an error where the emulator runs the job (it refuses it); Azure ML would
    upload the target from this machine, which is only worth a warning for a job going there."""
    plan = plan_snapshot(code)
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
    findings += check_snapshot(job.code)
    findings += check_links(job.code, refuse_outside=emu is not None)
    if emu is not None:
        findings += check_against_workspace(job, emu)
    return findings


def check_against_workspace(job: JobSpec, emu: Emulator) -> list[Finding]:
    findings = []
    try:
        cluster = emu.compute(job.compute)
    except AmlEmuError:
        names = ", ".join(c.spec.name for c in emu.computes()) or "none"
        return [Finding("compute", f"'{job.compute}' does not exist in the workspace (computes: {names})",
                        "create it with `amlemu compute create` or fix the name")]
    if job.name and emu.store.run_exists(job.name):
        findings.append(Finding("name", f"a job named '{job.name}' already exists in this workspace",
                                "pick another name, or leave name out for a generated one"))
    if job.instance_count > cluster.spec.max_nodes:
        findings.append(Finding("resources.instance_count", f"{job.instance_count} nodes, compute {job.compute} "
                                f"has at most {cluster.spec.max_nodes}", "lower instance_count or raise max_instances"))
    for b in bindings(job, "<run id>"):
        if b.datastore == LOCAL_SOURCE or b.is_output:
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
    """The job file as `amlemu job validate -f` checks it: loading errors first (one finding), then the rules."""
    try:
        job = load_job(path, overrides)
    except ConfigError as exc:
        return [Finding(exc.field, exc.problem, exc.fix or "see the Azure ML job schema")]
    return check_job(job, emu)
