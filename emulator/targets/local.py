"""The `emulator` target: the job runs on this machine's emulated AmlCompute."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from emulator.api import Emulator
from emulator.errors import StateError
from emulator.jobs.sdkjobs import to_job
from emulator.specs import ClusterSpec
from emulator.targets.base import JobSource, Plan, Target
from emulator.validate import check_job


class EmulatorTarget(Target):
    name = "emulator"

    def __init__(self, emulator: Emulator | None = None, **emulator_options: Any) -> None:
        self.emu = emulator or Emulator(**emulator_options)

    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan:
        """The emulator runs jobs AmlCompute would refuse (no environment, say): the findings of
        `amlemu job validate` go with the plan, for the CLI to show."""
        spec = to_job(job, overrides)
        findings = [asdict(f) for f in check_job(spec)]
        return Plan(self.name, "job", {**self.emu.plan_job(spec), "findings": findings}, payload=spec)

    def run_job(self, plan: Plan) -> str:
        return self.emu.submit(plan.payload).id

    def plan_compute(self, spec: ClusterSpec) -> Plan:
        if any(c.spec.name == spec.name for c in self.emu.computes()):  # refused before any notice is printed
            raise StateError(f"compute '{spec.name}' already exists; delete it first or pick another name")
        return Plan(self.name, "compute", self.emu.plan_compute(spec), payload=spec)

    def run_compute(self, plan: Plan) -> None:
        self.emu.create_compute(plan.payload, plan.data["backend"])

    def status(self, name: str) -> str:
        self.emu.reconcile()
        return self.emu.run(name).status.value

    def show(self, name: str) -> dict[str, Any]:
        run = self.emu.run(name)
        record = run.record
        return {"name": name, "target": self.name, "status": record.status.value, "compute": record.cluster,
                "experiment": record.experiment, "error": record.error, "metrics": run.metrics()}

    def stream(self, name: str) -> str:
        return self.emu.run(name).wait(show_output=True).value

    def cancel(self, name: str) -> str:
        run = self.emu.run(name)
        run.cancel()
        return run.wait(timeout=30).value

    def download(self, name: str, dest: Path) -> Path:
        return self.emu.run(name).download(dest)
