"""The submission interface: one small base class, a dry run that returns data, submit = plan + run."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from emulator.specs import ClusterSpec

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


class Target(ABC):
    name: ClassVar[str]

    @abstractmethod
    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan: ...

    @abstractmethod
    def run_job(self, plan: Plan) -> str:
        """Execute a job plan; returns the job's name (run id)."""

    def submit(self, job: JobSource, overrides: list[str] | None = None) -> str:
        return self.run_job(self.plan_job(job, overrides))

    @abstractmethod
    def plan_compute(self, spec: ClusterSpec) -> Plan: ...

    @abstractmethod
    def run_compute(self, plan: Plan) -> None: ...

    def create_compute(self, spec: ClusterSpec) -> None:
        self.run_compute(self.plan_compute(spec))

    @abstractmethod
    def status(self, name: str) -> str: ...

    @abstractmethod
    def show(self, name: str) -> dict[str, Any]:
        """The job's name, status, compute and what else the target knows (JSON-able)."""

    @abstractmethod
    def stream(self, name: str) -> str:
        """Print the job's log until it ends; returns its final status."""

    @abstractmethod
    def cancel(self, name: str) -> str: ...

    @abstractmethod
    def download(self, name: str, dest: Path) -> Path: ...
