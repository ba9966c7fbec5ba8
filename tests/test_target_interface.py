"""The `job` and `compute` commands talk to the Target interface alone (emulator/targets/base.py):
a target the CLI has never heard of serves every one of them, and the azureml target answers the
list, show, delete and cancel verbs through azure-ai-ml's MLClient (a stand-in client here)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import REPO

from amlemu.actions import Action, execute
from amlemu.cli import cli
from amlemu.specs import ClusterSpec
from amlemu.targets.azureml import AzureMLTarget, WorkspaceRef
from amlemu.targets.base import JobSource, Plan, Target

WS = WorkspaceRef("1111-2222", "rg-ml", "ws-ml")


class ToyTarget(Target):
    """A target of its own: every answer says where it came from; `calls` records what was done."""

    name = "toy"
    calls: list[str] = []

    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan:
        return Plan(self.name, "job", {"toy": str(job)})

    def run_job(self, plan: Plan) -> str:
        self.calls.append("run_job")
        return "toy_job"

    def status(self, name: str) -> str:
        return "Completed"

    def show(self, name: str) -> dict[str, Any]:
        return {"name": name, "experiment_name": "toys", "compute": "azureml:toybox", "status": "Completed",
                "services": {"Studio": {"endpoint": "toy://", "type": "Studio"}}}

    def list_jobs(self, experiment: str | None = None, max_results: int | None = None,
                  parent: str | None = None) -> list[dict[str, Any]]:
        return [{"name": "toy_job", "experiment_name": experiment or "toys", "compute": "azureml:toybox",
                 "status": "Completed"}]

    def metrics(self, name: str) -> dict[str, float]:
        return {"fun": 1.0}

    def stream(self, name: str) -> str:
        return "Completed"

    def plan_cancel(self, name: str) -> list[Action]:
        return [Action("cancel", "toy job", name, run=lambda: self.calls.append(f"cancel {name}"))]

    def plan_download(self, name: str, dest: Path, output_name: str | None = None,
                      everything: bool = False) -> list[Action]:
        return [Action("copy", "toy files", name, {"to": str(dest), "output": output_name, "all": everything},
                       run=lambda: self.calls.append("download"))]

    def plan_compute(self, spec: ClusterSpec) -> Plan:
        return Plan(self.name, "compute", {"toy": spec.name}, payload=spec)

    def run_compute(self, plan: Plan) -> None:
        self.calls.append(f"create {plan.payload.name}")

    def show_compute(self, name: str) -> dict[str, Any]:
        return {"name": name, "vm_size": "Toy_1", "vm_priority": "dedicated", "min_nodes": 0, "max_nodes": 1,
                "idle_seconds_before_scaledown": 1, "backend": "toy", "busy": None, "idle": None, "nodes": []}

    def list_computes(self) -> list[dict[str, Any]]:
        return [self.show_compute("toybox")]

    def plan_delete_compute(self, name: str) -> list[Action]:
        return [Action("remove", "toy compute", name, run=lambda: self.calls.append(f"delete {name}"))]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr("amlemu.cli.common.target_class", lambda name: ToyTarget)
    monkeypatch.chdir(tmp_path)
    ToyTarget.calls = []
    (tmp_path / "home").mkdir()

    def invoke(*argv: str, code: int = 0) -> str:
        result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), *argv])
        assert result.exit_code == code, result.output
        return result.stdout
    return invoke


def test_every_job_and_compute_verb_goes_through_the_target(toy) -> None:
    created = json.loads(toy("job", "create", "-f", "any.yml", "-o", "json"))
    assert created["services"]["Studio"]["endpoint"] == "toy://"
    assert json.loads(toy("job", "list", "-o", "json"))[0]["compute"] == "azureml:toybox"
    assert "toybox" in toy("job", "list")
    assert "toy_job (toys) on toybox: Completed" in toy("job", "show", "toy_job")
    assert "studio: toy://" in toy("job", "show", "toy_job")
    assert "Metrics: fun=1" in toy("job", "stream", "toy_job")
    assert json.loads(toy("job", "cancel", "toy_job", "--dry-run", "-o", "json"))["actions"] == [
        {"action": "cancel", "what": "toy job", "name": "toy_job"}]
    assert toy("job", "cancel", "toy_job").strip() == "toy_job: Completed"
    toy("job", "download", "toy_job", "--download-path", "dl")
    toy("compute", "create", "--name", "toybox")
    assert "toybox: Toy_1, dedicated, 0-1 nodes" in toy("compute", "show", "toybox")
    assert json.loads(toy("compute", "list", "-o", "json"))[0]["backend"] == "toy"
    assert "-/-" in toy("compute", "list")  # node counts the target does not know
    assert "remove toy compute toybox" in toy("compute", "delete", "toybox", "--dry-run")
    toy("compute", "delete", "toybox", "--yes")
    assert ToyTarget.calls == ["run_job", "cancel toy_job", "download", "create toybox", "delete toybox"]


def test_the_command_line_never_asks_which_target_it_talks_to() -> None:
    for module in sorted((REPO / "emulator" / "cli").glob("*.py")):
        text = module.read_text()
        assert not re.search(r"\.name\s*[!=]=|[\"'](emulator|azureml)[\"']\s*(==|!=|in\b)", text), module.name


# --- the azureml target's verbs, with a stand-in MLClient ------------------------------------------
class Poller:
    def __init__(self, done: list[str], what: str) -> None:
        self.done, self.what = done, what

    def result(self) -> None:
        self.done.append(self.what)


class StandInClient:
    def __init__(self) -> None:
        from azure.ai.ml import command
        from azure.ai.ml.entities import AmlCompute

        self.done: list[str] = []
        job = command(name="j1", command="echo", compute="gpucluster", experiment_name="exp")
        job._status = "Running"  # noqa: SLF001 - the service sets it
        self._jobs = [job]
        self._computes = [AmlCompute(name="gpucluster", size="STANDARD_NC6", tier="low_priority", min_instances=0,
                                     max_instances=2, idle_time_before_scale_down=300)]
        outer = self

        class Jobs:
            def list(self) -> list[Any]:
                return outer._jobs

            def begin_cancel(self, name: str) -> Poller:
                return Poller(outer.done, f"cancel {name}")

        class Computes:
            def get(self, name: str) -> Any:
                return next(c for c in outer._computes if c.name == name)

            def list(self) -> list[Any]:
                return outer._computes

            def begin_delete(self, name: str) -> Poller:
                return Poller(outer.done, f"delete {name}")

        self.jobs, self.compute = Jobs(), Computes()


def test_azureml_lists_shows_deletes_and_cancels_through_mlclient() -> None:
    target = AzureMLTarget(workspace=WS)
    target._client = client = StandInClient()  # noqa: SLF001 - the client the target would build
    [listed] = target.list_jobs()  # az ml's Job shape, as `az ml job list` prints it
    assert {k: listed[k] for k in ("name", "experiment_name", "compute", "status", "type", "resourceGroup")} == {
        "name": "j1", "experiment_name": "exp", "compute": "azureml:gpucluster", "status": "Running",
        "type": "command", "resourceGroup": "rg-ml"}
    assert target.list_jobs("other") == []
    shown = target.show_compute("gpucluster")
    assert (shown["vm_size"], shown["vm_priority"], shown["max_nodes"], shown["idle_seconds_before_scaledown"]) == \
        ("STANDARD_NC6", "lowpriority", 2, 300)
    assert [c["name"] for c in target.list_computes()] == ["gpucluster"]
    [delete] = target.plan_delete_compute("gpucluster")
    assert delete.to_dict() == {"action": "request", "what": "compute delete", "name": "gpucluster",
                                "method": "DELETE", "path": f"{WS.arm_path}/computes/gpucluster"}
    [cancel] = target.plan_cancel("j1")
    assert cancel.detail["path"] == f"{WS.arm_path}/jobs/j1/cancel" and client.done == []  # a plan sends nothing
    execute([delete, cancel])
    assert client.done == ["delete gpucluster", "cancel j1"]
