"""A command job without `code:` (`command: echo "hello world"`, as seven of azureml-examples'
cli/jobs/basics jobs are): Azure ML runs it in an empty working folder. It loads, validates and
converts without a code folder (pure), runs through `amlemu job create` on both backends, and
through azure-ai-ml against the in-process service (a v2 `command()` with no code)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_service import WS, live  # noqa: F401 - the in-process service fixture

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.jobs.convert import job_yaml_dict
from amlemu.jobs.jobspec_io import job_from_record, job_to_record
from amlemu.jobs.jobyaml import load_job
from amlemu.jobs.snapshot import take_snapshot
from amlemu.service.state import jobrest
from amlemu.validate import check_job

# Prints what the working folder holds between two markers: for a job without code, only the
# `logs` and `outputs` folders Azure ML's runtime makes in every job's working folder.
COMMAND = 'echo "hello world"; echo "wd<$(ls -A)>"'
EMPTY = "wd<logs\noutputs>"


def test_a_job_without_code_loads_validates_converts_and_snapshots_empty(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "my-project"
    project.mkdir()
    monkeypatch.chdir(project)  # Azure ML's default experiment: the folder the job was created from
    (tmp_path / "job.yml").write_text(f"command: {COMMAND!r}\ncompute: azureml:c1\nenvironment: python:3.11\n")
    job = load_job(tmp_path / "job.yml")
    assert job.code is None and job.experiment_name == "my-project"
    assert [f for f in check_job(job) if f.severity == "error"] == []  # `job validate` accepts it
    assert job_from_record(job_to_record(job)) == job  # kept with the run as submitted
    assert "code" not in job_yaml_dict(job, tmp_path)  # and converted without one
    take_snapshot(job.code, tmp_path / "snapshot")
    assert list((tmp_path / "snapshot").iterdir()) == []
    # A script to run needs the code that holds it: named at load, not found missing on the node.
    (tmp_path / "job.yml").write_text("command: python train.py\ncompute: azureml:c1\n")
    with pytest.raises(ConfigError, match=r"^command: script train.py not found: the job has no code") as err:
        load_job(tmp_path / "job.yml")
    assert "set code:" in str(err.value)
    (tmp_path / "job.yml").write_text("command: echo hi\ncompute: azureml:c1\ncode: [a, b]\n")
    with pytest.raises(ConfigError, match=r"^code: a list is not a folder path"):
        load_job(tmp_path / "job.yml")


def test_the_rest_body_of_a_command_without_code_has_no_code_and_a_bad_code_id_is_a_400() -> None:
    from azure.ai.ml import command  # noqa: PLC0415

    from amlemu.jobs import sdk2  # noqa: PLC0415
    from amlemu.service.state import ServiceError  # noqa: PLC0415

    node = command(command=COMMAND, compute="c1", environment="azureml:AzureML-sklearn-1.5@latest")
    assert sdk2.job_from_v2(node).code is None  # the Python API takes it as the CLI does
    body = sdk2.rest_body(node)
    data = jobrest.to_yaml("j1", body, lambda name, version: Path("/never"), lambda env: env)
    assert "code" not in data and data["command"] == COMMAND
    body["properties"]["codeId"] = "not-an-asset"
    with pytest.raises(ServiceError, match="codeId|code:"):
        jobrest.to_yaml("j1", body, lambda name, version: Path("/never"), lambda env: env)


def test_a_job_without_code_runs_in_an_empty_folder_through_job_create(emu: Emulator, cluster,
                                                                       tmp_path: Path) -> None:
    cluster(max_nodes=1)
    (tmp_path / "job.yml").write_text(f"command: {COMMAND!r}\ncompute: azureml:c1\nexperiment_name: no-code\n")
    exe = str(Path(sys.executable).with_name("amlemu"))
    done = subprocess.run([exe, "--home", str(emu.home.root), "job", "create", "-f", str(tmp_path / "job.yml"),
                           "--stream"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello world" in done.stdout and EMPTY in done.stdout and "Status: Completed" in done.stdout


def test_azure_ai_ml_submits_a_command_without_code_through_the_service(live, tmp_path: Path) -> None:  # noqa: F811
    """A v2 command() with no code, in the registry environment most of Azure ML's examples name."""
    from azure.ai.ml import MLClient, command  # noqa: PLC0415
    from azure.ai.ml.entities import AmlCompute  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    ml_client.compute.begin_create_or_update(AmlCompute(name="c1", size="STANDARD_D2_V2", max_instances=1,
                                                        idle_time_before_scale_down=0)).result()
    job = ml_client.jobs.create_or_update(command(
        command=COMMAND, compute="c1", experiment_name="no-code",
        environment="azureml://registries/azureml/environments/sklearn-1.5/labels/latest"))
    ml_client.jobs.stream(job.name)
    assert ml_client.jobs.get(job.name).status == "Completed"
    log = (tmp_path / "emu" / "runs" / job.name / "user_logs" / "std_log.txt").read_text()
    assert "hello world" in log and EMPTY in log
