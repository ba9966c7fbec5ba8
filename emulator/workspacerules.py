"""The workspace's rules for a job: what Azure ML checks of a job against its workspace when it is
submitted, in one place. `amlemu job validate` lists every finding; `plan_job` and `submit` raise the
first error (emulator/api.py), and the service refuses a job with the same error through submit.

Each rule has one wording, the error submit raises; a finding is that error's field, problem and
fix. The job is checked as given (bound to its assets here unless it already is), and nothing is
made: a serverless pool not made yet is a record of what submit makes after every check.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from amlemu.cluster import pools
from amlemu.cluster.store import Cluster, Store
from amlemu.envs.resolve import resolve
from amlemu.errors import AmlEmuError, ConfigError, NotFoundError, name_taken
from amlemu.home import Home
from amlemu.jobs import gitcode
from amlemu.jobs.snapshot import SnapshotPlan, plan_snapshot
from amlemu.runs import datamounts, memwatch
from amlemu.runs.contract import LOCAL_SOURCE, Binding, bindings
from amlemu.specs import JobSpec
from amlemu.storage import urlinputs
from amlemu.storage.assets import Assets
from amlemu.storage.datastores import Datastores

RUN_ID = "<run id>"  # outputs without a path: their default URI, whatever the run's id will be


@dataclass(frozen=True)
class Finding:
    field: str
    problem: str
    fix: str
    severity: str = "error"  # error | warning

    def line(self) -> str:
        return f"{self.severity}: {self.field}: {self.problem}" + (f"; {self.fix}" if self.fix else "")


class Workspace(Protocol):
    """What the rules read of the workspace (amlemu.api.Emulator, which sits above this module)."""

    store: Store
    home: Home
    assets: Assets
    datastores: Datastores

    def job_cluster(self, job: JobSpec, make: Any = None) -> Cluster: ...


@dataclass
class Verdict:
    """The job as checked (bound to its assets), its cluster (None: it does not exist) and the
    findings, each error with the exception submit raises for it."""

    job: JobSpec
    cluster: Cluster | None = None
    problems: list[tuple[Finding, AmlEmuError | None]] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return [finding for finding, _ in self.problems]

    def raise_first_error(self) -> Verdict:
        for finding, error in self.problems:
            if finding.severity == "error":
                raise error or ConfigError(finding.field, finding.problem, finding.fix or None)
        return self

    def add(self, error: AmlEmuError, finding: Finding | None = None) -> None:
        if finding is None and isinstance(error, ConfigError):
            finding = Finding(error.field, error.problem, error.fix or "")
        self.problems.append((finding or Finding("job", str(error), ""), error))

    @contextmanager
    def rule(self) -> Iterator[None]:
        """A rule's refusal (a ConfigError, CapacityError included) becomes a finding."""
        try:
            yield
        except ConfigError as exc:
            self.add(exc)


def check(job: JobSpec, ws: Workspace, *, probe: bool, look_for_data: bool = False,
          snapshot: SnapshotPlan | None = None) -> Verdict:
    """Every rule, in the order submit applies them (its first error is the one it raises).
    `probe`: URL inputs are read from the network (a submit, `job validate`; a dry run reads
    nothing). `look_for_data`: each datastore input's data is there (`job validate`: the job
    would fail on its nodes; a submit leaves that to the run, as Azure ML does). `snapshot`:
    the code folder's plan, when the caller has it."""
    verdict = Verdict(job)
    try:  # data and model assets, and jobs' outputs, as their datastore URIs (a bound job: unchanged)
        verdict.job = job = ws.assets.bind(job)
        bound = True
    except ConfigError as exc:
        verdict.add(exc)
        bound = False
    if not _compute(verdict, ws):
        return verdict  # no compute: the rest would only add noise
    if bound:
        with verdict.rule():  # inputs by URL: their form, offline, and (probing) that each answers
            urlinputs.check_inputs(job.inputs, probe)
    with verdict.rule():
        gitcode.check_offline(job)
    if bound:
        _datastores(verdict, ws, bindings(job, RUN_ID))
    _code_links(verdict, snapshot or plan_snapshot(job.code))
    with verdict.rule():  # as az ml does: the YAML's name is the job's name, and a taken name is refused
        if job.name and (ws.store.run_exists(job.name) or ws.home.run_dir(job.name).exists()):
            raise name_taken(job.name)
    with verdict.rule():  # a registered environment must exist in the workspace, as Azure ML checks
        resolve(job.environment, job.environment_def, ws.store.environment)
    with verdict.rule():  # the data runtime's variables and AMLEMU_DATA_PREFETCH (runs/datamounts.py)
        datamounts.plan_mounts(job, bindings(job, RUN_ID))
    with verdict.rule():  # ranks this home measured before, too many to fit in this machine's memory now
        memwatch.check_fits(ws.home.root, job)
    if bound and look_for_data:
        verdict.problems += [(f, None) for f in _data_there(ws, bindings(job, RUN_ID))]
    return verdict


def _compute(verdict: Verdict, ws: Workspace) -> bool:
    """The job's cluster (serverless and local: the platform's pool, made at submit) exists and
    the job fits it; False when there is none."""
    job = verdict.job
    try:
        verdict.cluster = ws.job_cluster(job)
    except NotFoundError:  # one wording for validate, the dry run, submit and the service
        names = ", ".join(c.spec.name for c in ws.store.clusters()) or "none"
        verdict.add(ConfigError("compute", f"'{job.compute}' does not exist in the workspace (computes: {names})",
                                "create it with `amlemu compute create` or fix the name"))
        return False
    with verdict.rule():
        pools.check_fits(verdict.cluster, job)
    return True


def _datastores(verdict: Verdict, ws: Workspace, found: list[Binding]) -> None:
    """Each input's and output's datastore exists: looked up, not made (a dry run creates nothing)."""
    for b in found:
        if b.datastore != LOCAL_SOURCE and not urlinputs.is_url_source(b.datastore):
            try:
                ws.datastores.peek(b.datastore)
            except NotFoundError as exc:
                verdict.add(ConfigError(f"{b.ref}.path", str(exc)))


def _code_links(verdict: Verdict, plan: SnapshotPlan) -> None:
    """Links out of the code folder and loops: refused where the emulator runs the job; submit's
    error names the first and how many more (as snapshot.check_code, which take_snapshot runs again)."""
    found = check_links(plan, refuse_outside=True)
    refused = len(plan.outside) + len(plan.refused)
    for i, finding in enumerate(found):
        more = f" (and {refused - 1} more)" if i == 0 and refused > 1 else ""
        error = ConfigError(finding.field, finding.problem + more, finding.fix or None) if i < refused else None
        verdict.problems.append((finding, error))


def check_links(code: Path | SnapshotPlan | None, refuse_outside: bool) -> list[Finding]:
    """Links and special files in the code folder (a path or its SnapshotPlan), as
    emulator/jobs/snapshot.py copies them. A link out of the folder is an error where the emulator
    runs the job (it refuses it); Azure ML would upload the target from this machine, which is only
    worth a warning for a job going there."""
    plan = code if isinstance(code, SnapshotPlan) else plan_snapshot(code)
    outside = "error" if refuse_outside else "warning"
    return ([Finding(e.field, e.problem, e.fix or "", outside) for e in plan.outside]
            + [Finding(e.field, e.problem, e.fix or "") for e in plan.refused]
            + [Finding("code", note, "remove it from the code folder (Azure ML's upload would try to read it)",
                       "warning") for note in plan.skipped])


def _data_there(ws: Workspace, found: list[Binding]) -> Iterator[Finding]:
    """Each datastore input's data is there, looked for where the run will read it; a datastore
    not made yet (the default one before first use) holds nothing, and is not made here."""
    for b in found:
        if b.is_output or b.datastore == LOCAL_SOURCE or urlinputs.is_url_source(b.datastore):
            continue
        try:
            _, first_use = ws.datastores.peek(b.datastore)
        except NotFoundError:
            continue  # the datastores rule names it
        try:
            present = not first_use and bool(ws.datastores.ls(b.uri))
        except AmlEmuError as exc:
            yield Finding(f"{b.ref}.path", str(exc), "create the datastore or fix the URI")
            continue
        if not present:
            yield Finding(f"{b.ref}.path", f"nothing at {b.uri}", f"upload it: amlemu data upload <folder> {b.uri}")
