"""The Azure ML test double (fixtures/amlservice.py) driven by the real, unmodified azure-ai-ml client.

Each test gets its own double on a free port; the SDK finds it through environment variables only.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from azure.ai.ml import MLClient, load_job
from azure.ai.ml.entities import AmlCompute, Environment, Job
from azure.ai.ml.exceptions import JobException, MlException
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceNotFoundError
from azure.identity import DefaultAzureCredential

from pytest_amlemu.amlservice import FakeAzureML

TRAINER = Path(__file__).resolve().parents[1] / "trainer"
JOB_YML = TRAINER / "job.yml"
CREDENTIAL_VARS = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME")


@pytest.fixture
def svc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAzureML]:
    with FakeAzureML(tmp_path / "aml") as fake:
        for key in CREDENTIAL_VARS:
            monkeypatch.delenv(key, raising=False)
        for key, value in fake.env().items():
            monkeypatch.setenv(key, value)
        yield fake


@pytest.fixture
def ml_client(svc: FakeAzureML, tmp_path: Path) -> MLClient:
    # config.json's keys are not MLClient's keywords (resource_group vs resource_group_name): go through the file.
    config = tmp_path / "config.json"
    config.write_text(json.dumps(svc.config()))
    return MLClient.from_config(DefaultAzureCredential(), path=str(config))


def submit(ml_client: MLClient, name: str | None = None) -> Job:
    job = load_job(str(JOB_YML))
    if name:
        job.name = name
    return ml_client.jobs.create_or_update(job)


def test_create_uploads_the_code_and_puts_the_translated_job(svc: FakeAzureML, ml_client: MLClient) -> None:
    created = submit(ml_client)

    assert created.status == "Queued"
    uploaded = {path.rsplit("/", 1)[-1]: data for path, data in svc.blobs.items()}
    assert uploaded["train.py"] == (TRAINER / "train.py").read_bytes()
    [put] = svc.find("PUT", rf"/jobs/{created.name}$")
    props = put.body["properties"]
    assert svc.jobs[created.name] == put.body
    assert props["jobType"] == "Command"
    assert props["command"] == "python train.py --data-dir ${{inputs.data_dir}} --epochs ${{inputs.epochs}}"
    assert props["computeId"].endswith(f"{svc.state.workspace_id}/computes/gpucluster")
    assert props["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 1}
    assert props["resources"]["instanceCount"] == 2
    assert props["inputs"]["data_dir"] == {"jobInputType": "uri_folder", "mode": "ReadOnlyMount",
                                           "uri": "azureml://datastores/workspaceblobstore/paths/mnist"}
    assert props["inputs"]["epochs"] == {"jobInputType": "literal", "value": "2"}
    # The trainer's own environment (image + conda file) is registered as an anonymous version first.
    [env_put] = svc.find("PUT", r"/environments/CliV2AnonymousEnvironment/versions/[^/]+$")
    assert props["environmentId"].endswith(env_put.path.split("/workspaces/ws-amlemu", 1)[1])
    assert "horovod==0.28.1" in env_put.body["properties"]["condaFile"]
    # The job points at the code version registered after the upload, whose URI is where train.py went.
    [code_put] = svc.find("PUT", r"/codes/[^/]+/versions/1$")
    assert props["codeId"].endswith(code_put.path.split("/workspaces/ws-amlemu", 1)[1])
    code_uri = code_put.body["properties"]["codeUri"]
    assert any(f"{svc.url}/amlemustore/{path}".startswith(code_uri) for path in svc.blobs if path.endswith("train.py"))


def test_each_poll_moves_the_job_one_step(svc: FakeAzureML, ml_client: MLClient) -> None:
    name = submit(ml_client).name

    assert svc.status(name) == "Queued"
    seen = [ml_client.jobs.get(name).status for _ in range(4)]
    assert seen == ["Preparing", "Running", "Completed", "Completed"]


def test_stream_returns_when_the_job_completes_and_prints_its_log(svc: FakeAzureML, ml_client: MLClient,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    name = submit(ml_client).name

    ml_client.jobs.stream(name)

    out = capsys.readouterr().out
    assert "Streaming user_logs/std_log.txt" in out
    assert "[amlemu] command: python train.py --data-dir" in out
    assert "[amlemu] completed" in out
    assert svc.find("GET", rf"/history/v1\.0/.*/runs/{name}/details$")
    assert ml_client.jobs.get(name).status == "Completed"


def test_cancel_ends_canceled(svc: FakeAzureML, ml_client: MLClient) -> None:
    name = submit(ml_client).name

    ml_client.jobs.begin_cancel(name).result()

    assert svc.find("POST", rf"/jobs/{name}/cancel$")
    assert svc.status(name) == "CancelRequested"
    assert ml_client.jobs.get(name).status == "Canceled"
    assert ml_client.jobs.get(name).status == "Canceled"  # terminal: further polls do not move it


def test_failed_job_makes_stream_raise_with_the_message(svc: FakeAzureML, ml_client: MLClient,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    svc.fail_job("doomed-run", "rank 1 exited with code 137")
    submit(ml_client, "doomed-run")

    with pytest.raises(JobException, match="rank 1 exited with code 137"):
        ml_client.jobs.stream("doomed-run")
    assert ml_client.jobs.get("doomed-run").status == "Failed"
    assert "[amlemu] error: rank 1 exited with code 137" in capsys.readouterr().out


def test_environments_and_datastores_are_resolved(svc: FakeAzureML, ml_client: MLClient) -> None:
    image = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"
    ml_client.environments.create_or_update(Environment(name="my-env", image=image))

    job = load_job(str(JOB_YML))
    job.environment = "azureml:my-env@latest"  # the SDK looks it up; curated AzureML-* names it leaves to the service
    name = ml_client.jobs.create_or_update(job).name
    assert svc.jobs[name]["properties"]["environmentId"].endswith("/environments/azureml:my-env/versions/1")

    job.environment = "azureml:my-env:7"  # sent as an ARM id without a lookup: the service refuses it
    with pytest.raises(HttpResponseError, match="my-env/versions/7"):
        ml_client.jobs.create_or_update(job)
    job.environment = "azureml:no-such-env@latest"
    with pytest.raises(MlException, match="no-such-env"):
        ml_client.jobs.create_or_update(job)
    assert svc.find("GET", r"/environments/azureml:no-such-env/versions$")
    job = load_job(str(JOB_YML))
    job.inputs["data_dir"].path = "azureml://datastores/nowhere/paths/mnist"
    with pytest.raises(HttpResponseError, match="datastore nowhere"):
        ml_client.jobs.create_or_update(job)
    assert list(svc.jobs) == [name]


def test_compute_create_is_recorded_with_its_scale_settings(svc: FakeAzureML, ml_client: MLClient) -> None:
    cluster = AmlCompute(name="gpucluster", size="STANDARD_NC6", min_instances=0, max_instances=2,
                         tier="low_priority", idle_time_before_scale_down=120)

    result = ml_client.compute.begin_create_or_update(cluster).result()

    assert result.provisioning_state == "Succeeded"
    assert svc.find("GET", r"^/operations/")  # the SDK polled the long-running operation
    props = svc.computes["gpucluster"]["properties"]
    assert props["computeType"] == "AmlCompute"
    assert props["properties"]["vmSize"] == "STANDARD_NC6"
    assert props["properties"]["vmPriority"] == "LowPriority"
    assert props["properties"]["scaleSettings"] == {"minNodeCount": 0, "maxNodeCount": 2,
                                                    "nodeIdleTimeBeforeScaleDown": "PT2M"}
    assert ml_client.compute.get("gpucluster").max_instances == 2


def test_datastores_and_their_secrets(svc: FakeAzureML, ml_client: MLClient) -> None:
    svc.add_datastore("mnist", "mnistacct", "data", "core.windows.net", account_key="a2V5LW9mLW1uaXN0")

    default = ml_client.datastores.get("workspaceblobstore")
    assert (default.name, default.container_name) == ("workspaceblobstore", "azureml-blobstore")
    assert ml_client.datastores.get_default().name == "workspaceblobstore"
    assert sorted(d.name for d in ml_client.datastores.list()) == ["mnist", "workspaceblobstore"]
    assert getattr(ml_client.datastores.get("mnist").credentials, "account_key", None) is None
    keyed = ml_client.datastores.get("mnist", include_secrets=True)
    assert keyed.account_name == "mnistacct"
    assert keyed.credentials.account_key == "a2V5LW9mLW1uaXN0"
    assert svc.find("POST", r"/datastores/mnist/listSecrets$")
    with pytest.raises(ResourceNotFoundError):
        ml_client.datastores.get("nowhere")


def test_no_secret_is_recorded_or_logged(svc: FakeAzureML, ml_client: MLClient) -> None:
    key = "c2VjcmV0LWFjY291bnQta2V5"
    svc.add_datastore("mnist", "mnistacct", "data", "core.windows.net", account_key=key)
    submit(ml_client)
    ml_client.datastores.get("mnist", include_secrets=True)

    assert svc.tokens, "the SDK got its token from the double"
    secrets = [key, svc.identity_header, *svc.tokens]
    log = svc.log_path.read_text()
    assert "listSecrets" in log
    for recorded in svc.requests:
        assert not {"authorization", "x-identity-header"} & {h.lower() for h in recorded.headers}
        assert not [s for s in secrets if s in repr(recorded)]
    assert not [s for s in secrets if s in log]


def test_tokens_and_workspace_are_checked(svc: FakeAzureML, ml_client: MLClient,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ca = str(svc.ca_path)
    token_url = svc.env()["IDENTITY_ENDPOINT"]
    assert requests.get(token_url, params={"resource": svc.url}, verify=ca, timeout=10).status_code == 401
    assert requests.get(token_url, params={"resource": svc.url}, headers={"X-IDENTITY-HEADER": "guess"},
                        verify=ca, timeout=10).status_code == 401
    issued = requests.get(token_url, params={"resource": svc.url}, headers={"X-IDENTITY-HEADER": svc.identity_header},
                          verify=ca, timeout=10)
    assert issued.status_code == 200
    with monkeypatch.context() as wrong_secret:  # the SDK's own credential, without the secret, gets nothing
        wrong_secret.setenv("IDENTITY_HEADER", "guess")
        with pytest.raises(ClientAuthenticationError):
            DefaultAzureCredential().get_token(f"{svc.url}/.default")
    workspace = svc.url + svc.state.workspace_id
    assert requests.get(workspace, verify=ca, timeout=10).status_code == 401
    bearer = {"Authorization": f"Bearer {issued.json()['access_token']}"}
    assert requests.get(workspace, headers=bearer, verify=ca, timeout=10).status_code == 200
    # MLClient's keyword is resource_group_name: config.json's resource_group is silently dropped and
    # the SDK asks for resourceGroups/None, which the double refuses like Azure would.
    wrong = MLClient(DefaultAzureCredential(), **svc.config())
    with pytest.raises(ResourceNotFoundError):
        wrong.datastores.get("workspaceblobstore")
    assert svc.find("GET", r"/resourceGroups/None/")


def test_reset_forgets_everything_but_the_default_datastore(svc: FakeAzureML, ml_client: MLClient) -> None:
    jobs, blobs = svc.jobs, svc.blobs
    name = submit(ml_client).name
    svc.add_datastore("mnist", "mnistacct", "data", "core.windows.net", account_key="a2V5")

    svc.reset()

    assert (jobs, blobs, svc.requests) == ({}, {}, [])  # cleared in place: held references see it
    assert list(svc.datastores) == ["workspaceblobstore"]
    with pytest.raises(ResourceNotFoundError):
        ml_client.jobs.get(name)
