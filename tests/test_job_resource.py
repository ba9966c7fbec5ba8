"""`amlemu job show|list -o json|yaml` print az ml's Job resource: the entity `amlemu serve` returns
to azure-ai-ml, as `az ml job show` prints it (azure-ai-ml's `jobs.get(name)._to_job()._to_dict()`,
plus az's `resourceGroup`), one serializer for both (emulator/jobs/resource.py); amlemu's own
facts under `amlemu`. A job without experiment_name goes to the experiment named after the
working directory it was created from, as on Azure ML."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from click.testing import CliRunner

from amlemu import servicefile
from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.jobs import resource
from amlemu.jobs.sdkjobs import to_job
from amlemu.names import default_experiment_name
from amlemu.service.protocol.auth import Auth
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.protocol.routes import Context
from amlemu.service.server import env_vars, run_in_thread
from amlemu.specs import ClusterSpec, RunStatus

SUB, RG, WS = "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws"
WS_ID = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.MachineLearningServices/workspaces/{WS}"
JOB_YAML = """\
type: command
code: src
command: python hello.py ${{inputs.words}} ${{inputs.count}} ${{outputs.result}}
compute: azureml:c1
display_name: a friendly name
environment_variables: {GREETING: hi}
inputs:
  words: {type: uri_folder, path: ./words}
  count: 3
outputs:
  result: {type: uri_folder}
limits: {timeout: 600}
"""
HELLO = "import sys, pathlib\nprint('hello', sys.argv[2])\npathlib.Path(sys.argv[3], 'r.txt').write_text('ok')\n"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Emulator]]:
    """The service over a process-backend home, in this process, recorded as the home's running
    service (as `amlemu serve` records itself); azure-ai-ml pointed at it."""
    emu = Emulator(tmp_path / "home", backend="process")
    auth = Auth.fresh()
    running = run_in_thread(Context(EmulatorState(emu), auth), tmp_path / "tls")
    me = psutil.Process()
    servicefile.write_state(emu.home.root, servicefile.ServiceState(
        os.getpid(), running.url, "127.0.0.1", int(running.url.rsplit(":", 1)[1]), 0.0, me.create_time(),
        home=str(emu.home.root)))
    for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env_vars(running.url, auth.identity_header, tmp_path / "tls" / "ca-bundle.pem").items():
        monkeypatch.setenv(key, value)
    try:
        yield running.url, emu
    finally:
        servicefile.remove_state(emu.home.root)
        running.stop()
        emu.cleanup()


def _cli(emu: Emulator, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--home", str(emu.home.root), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _as_az_prints(job: Any) -> dict[str, Any]:
    """What `az ml job show` prints of an azure-ai-ml job (azext_mlv2's _dump_job_with_warnings)."""
    entity = job._to_job() if hasattr(job, "_to_job") else job
    shown = entity._to_dict()
    # This azure-ai-ml dumps its enums' names ("JobStatus.COMPLETED"); az's own pin prints their values.
    shown["status"] = str(getattr(job.status, "value", job.status))
    shown["creation_context"].update(created_by_type="User", last_modified_by_type="User")
    # Client-side: the SDK appends its tenant to the studio link, and takes a local input's path
    # for an asset id (Azure ML would have uploaded it: a CLI job here reads the folder in place).
    studio = shown["services"]["Studio"]
    studio["endpoint"] = studio["endpoint"].split("&tid=")[0]
    for data in shown.get("inputs", {}).values():
        if isinstance(data, dict) and data.get("path", "").startswith("azureml:/tmp/"):
            data["path"] = data["path"].removeprefix("azureml:")
    return shown


def _resource_fields(shown: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in shown.items() if k not in ("amlemu", "resourceGroup")}


def test_job_show_is_az_mls_job_resource_and_the_sdk_reads_the_same(served: tuple[str, Emulator], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.ai.ml import MLClient, command  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url, emu = served
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=0))
    project = tmp_path / "my project!"  # the experiment is named after it, made a name Azure ML takes
    (project / "src").mkdir(parents=True)
    (project / "words").mkdir()
    (project / "words" / "w.txt").write_text("hi")
    (project / "src" / "hello.py").write_text(HELLO)
    (project / "job.yml").write_text(JOB_YAML)
    monkeypatch.chdir(project)
    name = json.loads(_cli(emu, "job", "create", "-f", "job.yml", "--query", "{name: name}", "-o", "json"))["name"]
    ml_client = MLClient(DefaultAzureCredential(), SUB, RG, WS)
    sdk_job = ml_client.jobs.create_or_update(command(code=str(project / "src"), command="python hello.py a 1 .",
                                                      compute="c1", environment="AzureML-sklearn-1.5@latest",
                                                      experiment_name="sdk-jobs"))
    ml_client.jobs.stream(sdk_job.name)  # the SDK follows the job by the resource it reads
    for run in (name, sdk_job.name):
        assert emu.run(run).wait(timeout=300) is RunStatus.COMPLETED, (emu.run(run).record.error, emu.run(run).logs())

    shown = json.loads(_cli(emu, "job", "show", "-n", name, "-o", "json"))
    assert {k: shown[k] for k in ("name", "type", "status", "experiment_name", "display_name", "compute")} == {
        "name": name, "type": "command", "status": "Completed", "experiment_name": "my_project_",
        "display_name": "a friendly name", "compute": "azureml:c1"}
    assert default_experiment_name("my project!") == "my_project_"
    assert shown["id"] == f"azureml:{WS_ID}/jobs/{name}" and shown["resourceGroup"] == RG
    assert shown["services"]["Studio"] == {"endpoint": f"{url}/studio/jobs/{name}?wsid={WS_ID}",
                                           "type": "Studio"}
    assert shown["services"]["Tracking"] == {"endpoint": f"{url}/mlflow", "type": "Tracking"}
    assert shown["environment_variables"] == {"GREETING": "hi"} and shown["limits"] == {"timeout": 600}
    assert shown["inputs"]["count"] == "3"
    assert shown["inputs"]["words"] == {"type": "uri_folder", "mode": "ro_mount", "path": str(project / "words")}
    assert shown["outputs"]["result"]["path"].startswith("azureml://datastores/workspaceblobstore/paths/")
    assert shown["resources"] == {"instance_count": 1, "properties": {}}
    assert shown["creation_context"]["created_at"].endswith("+00:00")
    own = shown["amlemu"]  # the emulator's facts, in one place
    assert [h["status"] for h in own["history"]][-1] == "Completed" and own["compute"] == "c1"
    assert (Path(own["outputs"]).parent / "outputs") == emu.run(name).outputs and own["error"] is None

    # The entity azure-ai-ml reads from the service is the one printed, for a CLI and an SDK job alike.
    for job in (name, sdk_job.name):
        printed = json.loads(_cli(emu, "job", "show", "-n", job, "-o", "json"))
        assert _as_az_prints(ml_client.jobs.get(job)) == _resource_fields(printed)
    listed = json.loads(_cli(emu, "job", "list", "-o", "json"))
    assert [j["name"] for j in listed] == [name, sdk_job.name]
    assert _resource_fields(listed[0]) == _resource_fields(shown)
    sdk_listed = {j.name: _as_az_prints(j) for j in ml_client.jobs.list()}
    assert sdk_listed[name]["status"] == "Completed" and sdk_listed[name]["experiment_name"] == "my_project_"

    # What scripts written for az query works unchanged; yaml is the same data; table is amlemu's own.
    assert _cli(emu, "job", "show", "-n", name, "--query", "status", "-o", "tsv") == "Completed\n"
    assert _cli(emu, "job", "show", "-n", name, "--query", "name", "-o", "tsv") == f"{name}\n"
    assert _cli(emu, "job", "show", "-n", name, "--query", "services.Studio.endpoint", "-o", "tsv") == \
        f"{url}/studio/jobs/{name}?wsid={WS_ID}\n"
    assert yaml.safe_load(_cli(emu, "job", "show", "-n", name, "-o", "yaml")) == shown
    human = _cli(emu, "job", "show", "-n", name)
    assert f"{name} (my_project_) on c1: Completed" in human and f"studio: {url}/studio/jobs/{name}?wsid=" in human
    assert "my_project_" in _cli(emu, "job", "list")
    resource.saved_body(emu.home.root, sdk_job.name).write_text("{not json")  # a damaged file: the record's job
    assert json.loads(_cli(emu, "job", "show", "-n", sdk_job.name, "-o", "json"))["experiment_name"] == "sdk-jobs"


def test_without_a_service_the_studio_endpoint_is_amlemu_uis() -> None:
    props = resource.command_properties("j1", {"command": "echo hi", "code": None, "distribution": {"type": "mpi",
                                        "process_count_per_instance": 2}, "instance_count": 2,
                                        "environment": "python:3.11-slim"},
                                        workspace_id=WS_ID, compute="c1", experiment="e", status="Queued",
                                        output_uris={})
    shown = resource.az_job(resource.rest_resource("j1", props, workspace_id=WS_ID, created_at=0.0,
                                                   service_url=None))
    assert shown["services"]["Studio"]["endpoint"] == f"{resource.UI_URL}/studio/jobs/j1?wsid={WS_ID}"
    assert shown["distribution"] == {"type": "mpi", "process_count_per_instance": 2}
    assert shown["resources"]["instance_count"] == 2 and "code" not in shown
    # An inline environment (an image) is shown as az ml registers it: an anonymous version.
    assert shown["environment"].startswith(f"azureml:{resource.ANONYMOUS_ENV}:")
    assert shown["creation_context"]["created_at"] == "1970-01-01T00:00:00+00:00"
    assert list(shown) == sorted(shown)  # az prints keys sorted


def test_a_job_without_experiment_name_takes_the_working_directorys(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The YAML read from elsewhere (`-f ../jobs/x.yml`, or the Python API's submit of a path): the
    working directory at submit names the experiment, not the code folder; one given stands."""
    (tmp_path / "jobs" / "src").mkdir(parents=True)
    (tmp_path / "jobs" / "src" / "t.py").write_text("")
    (tmp_path / "jobs" / "x.yml").write_text("type: command\ncode: src\ncommand: python t.py\ncompute: c\n")
    (tmp_path / "work.dir").mkdir()
    monkeypatch.chdir(tmp_path / "work.dir")
    assert to_job("../jobs/x.yml").experiment_name == "work_dir"
    assert to_job("../jobs/x.yml", ["experiment_name=mine"]).experiment_name == "mine"
