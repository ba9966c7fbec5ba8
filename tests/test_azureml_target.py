"""`--target azureml` end to end: the `amlemu` CLI sends trainer/job.yml through the real, unmodified
azure-ai-ml client to the local HTTPS test double of Azure ML (fixtures/amlservice.py), which
records what it received. Each CLI call is its own process, as a user's would be."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

from pytest_amlemu.amlservice import FakeAzureML

AMLEMU = Path(sys.prefix, "bin", "amlemu")
CREDENTIAL_VARS = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME")


class Cli:
    def __init__(self, svc: FakeAzureML, home: Path, cwd: Path) -> None:
        self.svc, self.cwd = svc, cwd
        self.env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS and not k.startswith("AMLEMU_")}
        self.env.update(svc.env(), AMLEMU_HOME=str(home), AMLEMU_TARGET="azureml")
        # `amlemu env --fast-stream`'s polling: `job stream` polls at once instead of every 2 s or more
        # (the service's job still moves one step per poll, so the stream sees it run, then end).
        self.env.update(AZUREML_RUN_POLLING_INTERVAL_MIN="0", AZUREML_RUN_POLLING_INTERVAL_MAX="1")

    def __call__(self, *args: str, code: int = 0, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([str(AMLEMU), *args], cwd=self.cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == code, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        return done


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    # Enough polls that `stream` finds the job running and prints its log (the SDK prints logs only then).
    with FakeAzureML(tmp_path / "aml", steps_to_complete=6) as svc:
        project = tmp_path / "project"
        project.mkdir()
        (project / "config.json").write_text(json.dumps(svc.config()))  # found as Workspace.from_config finds it
        yield Cli(svc, tmp_path / "home", project)


def test_job_create_sends_the_same_job_through_azure_ai_ml(cli: Cli) -> None:
    created = json.loads(cli("job", "create", "-f", str(REPO / "trainer" / "job.yml"), "-o", "json").stdout)
    name = created["name"]
    # az ml's Job, of the service's workspace; none of the emulator's own facts: nothing ran here.
    assert created["resourceGroup"] == cli.svc.config()["resource_group"] and "amlemu" not in created
    assert created["status"] in ("Queued", "Preparing")
    svc = cli.svc
    # The code snapshot went up through the SAS URL the service handed out.
    uploaded = {path.rsplit("/", 1)[-1]: data for path, data in svc.blobs.items()}
    assert uploaded["train.py"] == (REPO / "trainer" / "train.py").read_bytes()
    assert svc.find("POST", r"/codes/.+/startPendingUpload$")
    [put] = svc.find("PUT", rf"/workspaces/{svc.config()['workspace_name']}/jobs/{name}$")
    props = put.body["properties"]
    assert props["command"] == "python train.py --data-dir ${{inputs.data_dir}} --epochs ${{inputs.epochs}}"
    assert props["computeId"].endswith("/computes/gpucluster")
    assert props["codeId"].endswith("/versions/1") and "/codes/" in props["codeId"]
    assert props["resources"]["instanceCount"] == 2
    assert props["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 1}
    assert props["inputs"]["data_dir"] == {"jobInputType": "uri_folder", "mode": "ReadOnlyMount",
                                           "uri": "azureml://datastores/workspaceblobstore/paths/mnist"}
    assert props["inputs"]["epochs"] == {"jobInputType": "literal", "value": "2"}
    assert props["experimentName"] == "pytorch-horovod"
    # Nothing was made on the emulator: no compute, no run.
    assert not (Path(cli.env["AMLEMU_HOME"]) / "runs").exists()

    streamed = cli("job", "stream", name)
    assert "python train.py" in streamed.stdout  # the log the service serves
    assert svc.find("GET", rf"/history/v1.0/.+/runs/{name}/details$")
    assert svc.status(name) == "Completed"
    shown = json.loads(cli("job", "show", name, "-o", "json").stdout)
    assert (shown["status"], shown["compute"], shown["experiment_name"]) == \
        ("Completed", "azureml:gpucluster", "pytorch-horovod")
    assert not any("authorization" in {h.lower() for h in r.headers} for r in svc.requests)


def test_cancel_and_a_failed_job_reach_the_service(cli: Cli) -> None:
    job = str(REPO / "trainer" / "job.yml")
    first = json.loads(cli("job", "create", "-f", job, "-o", "json").stdout)["name"]
    assert cli("job", "cancel", first).stdout.strip() == f"{first}: Canceled"
    assert cli.svc.find("POST", rf"/jobs/{first}/cancel$")

    second = json.loads(cli("job", "create", "-f", job, "--set", "inputs.epochs=1", "-o", "json").stdout)["name"]
    assert cli.svc.jobs[second]["properties"]["inputs"]["epochs"]["value"] == "1"
    cli.svc.fail_job(second, "rank 1 exited with code 3")
    failed = cli("job", "stream", second, code=1)
    assert cli.svc.status(second) == "Failed" and "rank 1 exited with code 3" in failed.stdout + failed.stderr


def test_compute_create_sends_the_provisioning_fields(cli: Cli) -> None:
    cli("compute", "create", "-f", str(REPO / "trainer" / "compute.yml"))
    props = cli.svc.computes["gpucluster"]["properties"]
    assert props["computeType"] == "AmlCompute"
    assert (props["properties"]["vmSize"], props["properties"]["vmPriority"]) == ("Standard_NC6", "LowPriority")
    assert props["properties"]["scaleSettings"]["maxNodeCount"] == 2


def test_without_a_credential_one_error_and_nothing_created(cli: Cli) -> None:
    refused = cli("job", "create", "-f", str(REPO / "trainer" / "job.yml"), code=1,
                  env={"IDENTITY_HEADER": "not-the-secret"})
    lines = refused.stderr.strip().splitlines()
    assert lines[-1].startswith("amlemu: error: azureml target: submitting the job: DefaultAzureCredential found "
                                "no usable credential: run `az login`")
    assert "Traceback" not in refused.stderr
    assert cli.svc.jobs == {} and cli.svc.blobs == {}
    assert not cli.svc.find("PUT", r".")
