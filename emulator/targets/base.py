"""The submission interface: one small base class, a dry run that returns data, submit = plan + run.

Everything the `job` and `compute` commands do goes through it, so the command line never asks
which target it talks to. A verb that changes something has its dry run: a Plan (job and
compute creation: the request) or a list of Actions (emulator/actions.py: the steps).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from amlemu.actions import Action, execute
from amlemu.errors import ConfigError, NotFoundError
from amlemu.specs import ClusterSpec

# What a job can be given as: a CLI v2 YAML path, a JobSpec, an azure.ai.ml command job, or an
# SDK v1 ScriptRunConfig / estimator. Each target reads all of them.
JobSource = Any


@dataclass(frozen=True)
class Plan:
    """A dry run: `data` is what would be created or sent (JSON-able, printed by --dry-run);
    `payload` is the object that executing the plan hands to the emulator or the SDK."""

    target: str
    kind: str  # job | compute
    data: dict[str, Any]
    payload: Any = field(default=None, compare=False, repr=False)


# az's options that name the workspace, by the field of the workspace each one names.
WORKSPACE_OPTIONS = {"subscription_id": ("--subscription", "--subscription"),
                     "resource_group": ("-g/--resource-group", "-g"),
                     "workspace_name": ("-w/--workspace-name", "-w")}


@dataclass(frozen=True)
class WorkspaceOptions:
    """--subscription, -g/--resource-group and -w/--workspace-name as a command line gave them
    (None: not given). The emulator checks them against its workspace; the azureml target looks
    the workspace up with them."""

    subscription_id: str | None = None
    resource_group: str | None = None
    workspace_name: str | None = None

    def given(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def check(self, workspace: Mapping[str, str], whose: str = "the emulated workspace") -> None:
        """Each option given names this workspace, or the command goes no further: the workspace
        it names is not here (a `show` verb exits 3 on it, as az does on a workspace it cannot find)."""
        for key, value in self.given().items():
            if workspace.get(key) != value:
                option, short = WORKSPACE_OPTIONS[key]
                label = key.replace("_id", "").replace("_", " ")
                raise NotFoundError("workspace", value, message=(
                    f"{option}: '{value}' is not {whose}'s {label} ('{workspace.get(key)}'); pass "
                    f"{short} {workspace.get(key)} or leave {short} out (`amlemu workspace show` shows it)"))


class Target(ABC):
    name: ClassVar[str]

    @classmethod
    def for_cli(cls, emulator: Callable[[], Any], workspace: WorkspaceOptions | None = None) -> Target:
        """The target a command uses; `emulator()` makes the command's Emulator (the home rule
        applied), for a target that needs one; `workspace`: the workspace the command line named,
        which a target without workspaces refuses."""
        for key in (workspace or WorkspaceOptions()).given():
            raise ConfigError(WORKSPACE_OPTIONS[key][0], f"the {cls.name} target has no workspace to choose",
                              "leave the option out")
        return cls()

    # --- jobs ----------------------------------------------------------------------------------
    @abstractmethod
    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan: ...

    @abstractmethod
    def run_job(self, plan: Plan) -> str:
        """Execute a job plan; returns the job's name (run id)."""

    def submit(self, job: JobSource, overrides: list[str] | None = None) -> str:
        return self.run_job(self.plan_job(job, overrides))

    @abstractmethod
    def status(self, name: str) -> str: ...

    @abstractmethod
    def show(self, name: str) -> dict[str, Any]:
        """The job as `az ml job show` prints it (az ml's Job shape: name, status, experiment_name,
        compute as azureml:<name>, services.Studio.endpoint, ...; JSON-able); a target's own facts
        under a key of its own (the emulator's: `amlemu`)."""

    @abstractmethod
    def list_jobs(self, experiment: str | None = None, max_results: int | None = None,
                  parent: str | None = None) -> list[dict[str, Any]]:
        """Each job as `show` gives it (of one experiment, if given; a sweep's trials, with `parent`),
        oldest first; with max_results, only that many of the most recent ones."""

    @abstractmethod
    def metrics(self, name: str) -> dict[str, float]:
        """The last value of each metric the job logged (empty where the target does not say)."""

    @abstractmethod
    def stream(self, name: str) -> str:
        """Print the job's log until it ends; returns its final status."""

    @abstractmethod
    def plan_cancel(self, name: str) -> list[Action]: ...

    def cancel(self, name: str) -> str:
        """Carry out plan_cancel; returns the job's status then."""
        execute(self.plan_cancel(name))
        return self.status(name)

    @abstractmethod
    def plan_download(self, name: str, dest: Path, output_name: str | None = None,
                      everything: bool = False) -> list[Action]:
        """What `download` copies, and where (into dest/<name>), as `az ml job download` chooses:
        the job's logs and default output; with output_name, only that named output (`default`
        being the logs and default output); with everything (--all), both and every named output
        (into dest/<name>/named-outputs/<output>)."""

    def download(self, name: str, dest: Path, output_name: str | None = None, everything: bool = False) -> Path:
        execute(self.plan_download(name, dest, output_name, everything))
        return Path(dest) / name

    # --- computes ------------------------------------------------------------------------------
    @abstractmethod
    def plan_compute(self, spec: ClusterSpec) -> Plan: ...

    @abstractmethod
    def run_compute(self, plan: Plan) -> None: ...

    def create_compute(self, spec: ClusterSpec) -> None:
        self.run_compute(self.plan_compute(spec))

    @abstractmethod
    def show_compute(self, name: str) -> dict[str, Any]:
        """name, vm_size, vm_priority, min_nodes, max_nodes, idle_seconds_before_scaledown,
        backend, busy and idle node counts (None: not known) and the nodes."""

    @abstractmethod
    def list_computes(self) -> list[dict[str, Any]]:
        """show_compute of each compute."""

    @abstractmethod
    def plan_delete_compute(self, name: str) -> list[Action]: ...

    def delete_compute(self, name: str) -> list[str]:
        return execute(self.plan_delete_compute(name))
