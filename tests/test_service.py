"""`amlemu serve`'s protocol and verbs, without nodes: the REST shapes of its errors, its
credentials, its TLS, `amlemu env` in each format, `serve --stop`, `workspace show` and
`cleanup` stopping it. The SDK end to end on Docker nodes is tests/test_service_sdk.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import certifi
import psutil
import pytest
import requests

from amlemu import servicekeys
from amlemu import servicefile
from amlemu.api import Emulator
from amlemu.cli.serve import render_env
from amlemu.service.state import runblobs
from amlemu.service.state import jobrest
from amlemu.service.server import tls
from amlemu.service.protocol.auth import Auth
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.protocol.routes import Context
from amlemu.service.server import env_vars, run_in_thread
from amlemu.service.state import DiskBlobs, ServiceError
from pytest_amlemu.amlservice import FakeAzureML


def amlemu(home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "AMLEMU_BACKEND": "process"})
    assert done.returncode == code, done.stdout + done.stderr
    return done


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, dict[str, str], Path]]:
    """The service over a real (empty) emulator home, in this process: (url, bearer header, CA
    bundle); the environment points azure-ai-ml at it, as `amlemu env`'s variables do."""
    from amlemu.api import Emulator  # noqa: PLC0415

    emu = Emulator(tmp_path / "emu", backend="process")
    log = tmp_path / "service.log"
    lines: list[str] = []

    def write(line: str) -> None:
        lines.append(line)
        log.write_text("\n".join(lines))

    auth = Auth.fresh()
    running = run_in_thread(Context(EmulatorState(emu, write), auth, log=write), tmp_path / "tls")
    token = ""
    try:
        token = requests.get(f"{running.url}/msi/token", params={"resource": running.url},
                             headers={"X-IDENTITY-HEADER": auth.identity_header},
                             verify=tmp_path / "tls" / "ca-bundle.pem", timeout=10).json()["access_token"]
        for key in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_USERNAME"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env_vars(running.url, auth.identity_header, tmp_path / "tls" / "ca-bundle.pem").items():
            monkeypatch.setenv(key, value)
        yield running.url, {"Authorization": f"Bearer {token}"}, tmp_path / "tls" / "ca-bundle.pem"
    finally:
        running.stop()
        emu.cleanup()
        text = log.read_text() if log.exists() else ""
        assert (not token or token not in text) and auth.identity_header not in text


WS = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/amlemu-rg/providers"
      "/Microsoft.MachineLearningServices/workspaces/amlemu-ws")


# --- the protocol ----------------------------------------------------------------------------------
def test_a_request_without_the_services_token_gets_arms_401(live: tuple[str, dict[str, str], Path]) -> None:
    url, bearer, ca = live
    shaped, _ = servicekeys.encode(b"another key" * 3, 60)  # a JWT of the right shape, another key's
    for headers in ({}, {"Authorization": "Bearer amlemu.9999999999.00.forged"},
                    {"Authorization": f"Bearer {shaped[:-1]}\u00e9"}):  # non-ASCII: once a TypeError, a 500
        refused = requests.get(url + WS + "/jobs", headers=headers, verify=ca, timeout=10)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "InvalidAuthenticationToken"
        assert "invalid_token" in refused.headers["WWW-Authenticate"]
    assert requests.get(url + WS + "/jobs", headers=bearer, verify=ca, timeout=10).json() == {"value": []}


def test_bad_requests_get_azures_error_json_naming_the_field(live: tuple[str, dict[str, str], Path]) -> None:
    url, bearer, ca = live
    pipeline = requests.put(url + WS + "/jobs/p1", json={"properties": {"jobType": "Pipeline"}}, headers=bearer,
                            verify=ca, timeout=10)
    assert pipeline.status_code == 400
    error = pipeline.json()["error"]
    assert (error["code"], error["target"]) == ("UserError", "jobs")  # a pipeline needs steps (test_service_pipeline.py)
    assert error["message"].startswith("jobs: missing")
    sweep = requests.put(url + WS + "/jobs/s1", json={"properties": {"jobType": "Sweep"}}, headers=bearer,
                         verify=ca, timeout=10)
    assert sweep.status_code == 400 and sweep.json()["error"]["message"].startswith("searchSpace: missing")
    compute = requests.put(url + WS + "/computes/k8s", headers=bearer, verify=ca, timeout=10,
                           json={"properties": {"computeType": "Kubernetes"}})
    assert compute.status_code == 400 and compute.json()["error"]["target"] == "properties.computeType"
    size = requests.put(url + WS + "/computes/c1", headers=bearer, verify=ca, timeout=10, json={"properties": {
        "computeType": "AmlCompute", "properties": {"vmSize": "STANDARD_NOPE", "scaleSettings": {"maxNodeCount": 1}}}})
    assert size.status_code == 400 and size.json()["error"]["target"] == "vm_size"
    missing = requests.get(url + WS + "/jobs/nowhere", headers=bearer, verify=ca, timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "ResourceNotFound"
    other = requests.get(url + WS.replace("amlemu-ws", "other-ws") + "/jobs", headers=bearer, verify=ca, timeout=10)
    assert other.status_code == 404


def _wait_operation(reply: requests.Response, bearer: dict[str, str], ca: Path) -> str:
    location = reply.headers.get("Azure-AsyncOperation") or reply.headers["Location"]
    deadline = time.monotonic() + 60
    while (status := requests.get(location, headers=bearer, verify=ca, timeout=10).json()["status"]) == "InProgress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return status


def compute_body(size: str, max_nodes: int) -> dict[str, object]:
    return {"properties": {"computeType": "AmlCompute", "properties": {
        "vmSize": size, "vmPriority": "Dedicated", "scaleSettings": {
            "minNodeCount": 0, "maxNodeCount": max_nodes, "nodeIdleTimeBeforeScaleDown": "PT0S"}}}}


def test_the_emulators_rules_judge_a_put_job_with_validates_words(live: tuple[str, dict[str, str], Path],
                                                                 tmp_path: Path) -> None:
    """One set of rules: a job PUT through the service is refused with the message `amlemu job
    validate` prints for the same job; computes are created and updated (begin_update) for real."""
    url, bearer, ca = live
    made = requests.put(url + WS + "/computes/c1", json=compute_body("STANDARD_D2_V2", 1), headers=bearer,
                        verify=ca, timeout=30)
    assert made.status_code == 201 and _wait_operation(made, bearer, ca) == "Succeeded"
    # The code snapshot, uploaded as the SDK does: through the SAS URL the service hands out.
    pending = requests.post(url + WS + "/codes/src/versions/1/startPendingUpload", json={}, headers=bearer,
                            verify=ca, timeout=10).json()["blobReferenceForConsumption"]
    sas = pending["credential"]["sasUri"].split("?", 1)[1]
    forged = requests.put(f"{pending['blobUri']}/t.py?sig=forged", data=b"x", verify=ca, timeout=10)
    assert forged.status_code == 403
    assert requests.put(f"{pending['blobUri']}/t.py?{sas}", data=b"print('hi')\n", verify=ca,
                        timeout=10).status_code == 201
    assert requests.put(url + WS + "/codes/src/versions/1", json={"properties": {"codeUri": pending["blobUri"]}},
                        headers=bearer, verify=ca, timeout=10).status_code == 201
    job = {"properties": {"jobType": "Command", "command": "python t.py", "codeId": WS + "/codes/src/versions/1",
                          "computeId": WS + "/computes/c1", "environmentId": "azureml:AzureML-sklearn-1.5@latest",
                          "experimentName": "rules", "resources": {"instanceCount": 2},
                          "distribution": {"distributionType": "Mpi", "processCountPerInstance": 1}}}
    refused = requests.put(url + WS + "/jobs/too_big", json=job, headers=bearer, verify=ca, timeout=30)
    assert refused.status_code == 400
    error = refused.json()["error"]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.py").write_text("print('hi')\n")
    (tmp_path / "job.yml").write_text("command: python t.py\ncode: src\ncompute: azureml:c1\nexperiment_name: rules\n"
                                      "environment: azureml:AzureML-sklearn-1.5\nresources: {instance_count: 2}\n"
                                      "distribution: {type: mpi}\n")
    validated = amlemu(tmp_path / "emu", "job", "validate", "-f", str(tmp_path / "job.yml"), code=1)
    assert f"error: {error['message']}" in validated.stdout + validated.stderr
    assert error["target"] == "resources.instance_count"
    # begin_update: a PUT of the existing compute changes its scale settings, not its size.
    grown = requests.put(url + WS + "/computes/c1", json=compute_body("STANDARD_D2_V2", 2), headers=bearer,
                         verify=ca, timeout=30)
    assert _wait_operation(grown, bearer, ca) == "Succeeded"
    shown = requests.get(url + WS + "/computes/c1", headers=bearer, verify=ca, timeout=10).json()
    assert shown["properties"]["properties"]["scaleSettings"]["maxNodeCount"] == 2
    resized = requests.put(url + WS + "/computes/c1", json=compute_body("STANDARD_D4_V2", 2), headers=bearer,
                           verify=ca, timeout=30)
    assert resized.status_code == 400 and resized.json()["error"]["target"] == "vm_size"
    # Now it fits: submitted to the emulator, whose store the service reports.
    accepted = requests.put(url + WS + "/jobs/fits", json=job, headers=bearer, verify=ca, timeout=60)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["properties"]["status"] in ("Queued", "Preparing", "Running", "Finalizing", "Completed")
    listed = requests.get(url + WS + "/jobs", headers=bearer, verify=ca, timeout=10).json()["value"]
    assert [j["name"] for j in listed] == ["fits"]
    nodes = requests.post(url + WS + "/computes/c1/listNodes", headers=bearer, verify=ca, timeout=10).json()
    assert all(n["nodeState"] in ("preparing", "idle", "running", "leaving") for n in nodes["nodes"])
    # An environment the SDK registers (an image and a conda file) is the job's environment, packages included.
    conda = "name: e\ndependencies:\n  - python=3.11\n  - pip:\n      - amlemupin==1.0\n"
    assert requests.put(url + WS + "/environments/pinned/versions/1", headers=bearer, verify=ca, timeout=10, json={
        "properties": {"image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04", "condaFile": conda}}
    ).status_code in (200, 201)
    with_env = {"properties": {**job["properties"], "environmentId": WS + "/environments/pinned/versions/1"}}
    assert requests.put(url + WS + "/jobs/with_env", json=with_env, headers=bearer, verify=ca,
                        timeout=60).status_code == 201
    definition = Emulator(tmp_path / "emu", backend="process").run("with_env").job.environment_def
    assert definition["image"] == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"
    assert definition["conda_file"]["dependencies"][1] == {"pip": ["amlemupin==1.0"]}


def test_a_local_input_is_uploaded_to_the_default_datastore_and_read_by_the_job(
        live: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    """Input(path="./data"): azure-ai-ml uploads the folder to workspaceblobstore through the
    service's blob endpoint, as it does to Azure Storage; the job reads it on its node."""
    from azure.ai.ml import Input, MLClient, command  # noqa: PLC0415
    from azure.ai.ml.entities import AmlCompute  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url, _, _ = live
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "numbers.txt").write_text("1 2 3\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "read.py").write_text("import sys, pathlib\n"
                                              "print('read:', (pathlib.Path(sys.argv[1]) / 'numbers.txt').read_text())\n")
    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    ml_client.compute.begin_create_or_update(AmlCompute(name="c1", size="STANDARD_D2_V2", max_instances=1,
                                                        idle_time_before_scale_down=0)).result()
    assert ml_client.datastores.get_default().account_name == f"{url.removeprefix('https://')}/amlemustore"
    job = ml_client.jobs.create_or_update(command(
        code=str(tmp_path / "src"), command="python read.py ${{inputs.data}}", compute="c1",
        inputs={"data": Input(type="uri_folder", path=str(tmp_path / "data"))},
        environment="AzureML-sklearn-1.5@latest", experiment_name="local-input"))
    uri = job.inputs["data"].path
    assert uri.startswith("azureml://") and "workspaceblobstore" in uri and "LocalUpload" in uri, uri
    ml_client.jobs.stream(job.name)
    assert ml_client.jobs.get(job.name).status == "Completed"
    log = (tmp_path / "emu" / "runs" / job.name / "user_logs" / "std_log.txt").read_text()  # one process
    assert "read: 1 2 3" in log


def test_the_workspace_renamed_while_serving_is_the_one_served(live: tuple[str, dict[str, str], Path],
                                                               tmp_path: Path) -> None:
    url, bearer, ca = live
    amlemu(tmp_path / "emu", "workspace", "set", "--name", "renamed-ws")
    renamed = WS.replace("amlemu-ws", "renamed-ws")
    assert requests.get(url + renamed, headers=bearer, verify=ca, timeout=10).json()["id"] == renamed
    assert requests.get(url + WS, headers=bearer, verify=ca, timeout=10).status_code == 404


def test_the_job_body_becomes_the_emulators_yaml() -> None:
    body = {"properties": {
        "jobType": "Command", "command": "python t.py --n ${{inputs.n}}", "codeId": "/x/codes/c1/versions/1",
        "computeId": "/x/computes/cpu", "environmentId": "azureml:AzureML-sklearn-1.5@latest",
        "environmentVariables": {"A": "1"}, "experimentName": "e",
        "distribution": {"distributionType": "PyTorch", "processCountPerInstance": 2},
        "resources": {"instanceCount": 2}, "limits": {"jobLimitsType": "Command", "timeout": "PT1H30M"},
        "inputs": {"n": {"jobInputType": "literal", "value": "3"},
                   "d": {"jobInputType": "uri_folder", "uri": "azureml://datastores/ds/paths/p", "mode": "Download"}},
        "outputs": {"m": {"jobOutputType": "uri_folder", "mode": "Upload"}}}}
    data = jobrest.to_yaml("j1", body, lambda name, version: Path(f"/snap/{name}/{version}"),
                           lambda env: "azureml:AzureML-sklearn-1.5")
    assert data == {"type": "command", "name": "j1", "command": "python t.py --n ${{inputs.n}}", "code": "/snap/c1/1",
                    "compute": "cpu", "experiment_name": "e", "environment_variables": {"A": "1"},
                    "inputs": {"n": "3", "d": {"type": "uri_folder", "path": "azureml://datastores/ds/paths/p",
                                               "mode": "download"}},
                    "outputs": {"m": {"type": "uri_folder", "mode": "upload"}},
                    "environment": "azureml:AzureML-sklearn-1.5",
                    "distribution": {"type": "pytorch", "process_count_per_instance": 2},
                    "resources": {"instance_count": 2}, "limits": {"timeout": 5400}}
    with pytest.raises(ServiceError, match="limits.timeout: 'soon' is not an ISO 8601 duration"):
        jobrest.seconds("soon", "limits.timeout")


def test_the_double_is_the_service_protocol(tmp_path: Path) -> None:
    """The test double answers with the service's own routes: the same 401 and 404 shapes."""
    with FakeAzureML(tmp_path) as svc:
        ca = svc.env()["REQUESTS_CA_BUNDLE"]
        assert svc.env() == env_vars(svc.url, svc.identity_header, Path(ca))
        refused = requests.get(svc.url + svc.state.workspace_id, verify=ca, timeout=10)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "InvalidAuthenticationToken"
        unknown = requests.get(svc.url + "/nowhere", verify=ca, timeout=10)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "NoRoute"


# --- TLS -------------------------------------------------------------------------------------------
def test_the_ca_is_kept_and_the_bundle_still_trusts_the_public_roots(tmp_path: Path) -> None:
    first = tls.ensure(tmp_path, ["127.0.0.1", "localhost"])
    ca, cert = first.ca.read_bytes(), first.cert.read_bytes()
    again = tls.ensure(tmp_path, ["127.0.0.1", "localhost"])
    assert (again.ca.read_bytes(), again.cert.read_bytes()) == (ca, cert)  # a restart changes nothing
    renamed = tls.ensure(tmp_path, ["10.1.2.3", "127.0.0.1", "localhost"])
    assert renamed.ca.read_bytes() == ca and renamed.cert.read_bytes() != cert  # new names, same CA
    bundle = first.bundle.read_text()
    assert bundle.startswith(Path(certifi.where()).read_text()) and bundle.endswith(ca.decode())
    assert oct(first.key.stat().st_mode & 0o777) == "0o600" and oct((tmp_path / "ca-key.pem").stat().st_mode & 0o777) == "0o600"


# --- the verbs -------------------------------------------------------------------------------------
def test_render_env_in_each_format() -> None:
    variables = {"A_URL": "https://127.0.0.1:1/x?api-version=1", "B": "it's"}
    assert render_env(variables, "sh") == "export A_URL='https://127.0.0.1:1/x?api-version=1'\nexport B='it'\"'\"'s'\n"
    assert render_env(variables, "dotenv") == 'A_URL="https://127.0.0.1:1/x?api-version=1"\nB=it\'s\n'
    assert json.loads(render_env(variables, "json")) == variables
    assert render_env(variables, "powershell") == "$env:A_URL = 'https://127.0.0.1:1/x?api-version=1'\n$env:B = 'it''s'\n"


def test_env_starts_the_service_once_and_stop_and_cleanup_end_it(home: Path) -> None:
    printed = amlemu(home, "env", "--format", "json", "--port", "0")
    variables = json.loads(printed.stdout)
    state = servicefile.read_state(home)
    assert state is not None and "started the service at" in printed.stderr
    assert variables == env_vars(state.url, variables["IDENTITY_HEADER"], home / "service" / "ca-bundle.pem")
    # eval "$(amlemu env)": the sh form sets the same variables in a shell.
    shell = subprocess.run(["bash", "-c", f'eval "$({sys.executable} -m amlemu --home {home} env)"; env'],
                           capture_output=True, text=True, timeout=60, env={**os.environ})
    assert all(f"{k}={v}" in shell.stdout.splitlines() for k, v in variables.items())
    assert servicefile.read_state(home).pid == state.pid  # running: not started twice
    shown = json.loads(amlemu(home, "workspace", "show", "-o", "json").stdout)
    assert shown["service"] == f"{state.url} (pid {state.pid})"
    # The service answers with the variables' credential; its log holds no secret.
    token = requests.get(variables["IDENTITY_ENDPOINT"], params={"resource": state.url}, timeout=10,
                         headers={"X-IDENTITY-HEADER": variables["IDENTITY_HEADER"]},
                         verify=variables["REQUESTS_CA_BUNDLE"]).json()["access_token"]
    assert requests.get(state.url + WS, headers={"Authorization": f"Bearer {token}"}, timeout=10,
                        verify=variables["REQUESTS_CA_BUNDLE"]).json()["name"] == "amlemu-ws"
    log = (home / "service" / "service.log").read_text()
    assert f"GET {WS} 200" in log and token not in log and variables["IDENTITY_HEADER"] not in log

    assert "stopped the service at" in amlemu(home, "serve", "--stop").stdout
    assert not psutil.pid_exists(state.pid) or psutil.Process(state.pid).status() == psutil.STATUS_ZOMBIE
    assert json.loads(amlemu(home, "workspace", "show", "-o", "json").stdout)["service"] == "not running"
    assert "not running" in amlemu(home, "serve", "--stop").stdout
    assert "not running" in amlemu(home, "env", "--no-start", code=1).stderr

    again = json.loads(amlemu(home, "env", "--format", "json", "--port", "0").stdout)
    assert again["IDENTITY_HEADER"] == variables["IDENTITY_HEADER"]  # the home's secret, kept
    pid = servicefile.read_state(home).pid
    assert "Azure ML service" in amlemu(home, "cleanup", "--yes").stdout
    assert servicefile.read_state(home) is None and not psutil.pid_exists(pid)
    # The runs' uploads and REST bodies went with the runs; the CA and the secret stay for next time.
    assert not (home / "service" / "jobs").exists() and (home / "service" / "ca.pem").exists()
    amlemu(home, "cleanup", "--all", "--yes")
    assert not (home / "service").exists()


def test_serve_runs_in_the_foreground_until_ctrl_c(home: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "amlemu", "--home", str(home), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "AMLEMU_BACKEND": "process"})
    try:
        deadline = time.monotonic() + 60
        while servicefile.read_state(home) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        busy = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "serve", "--port", "0"],
                              capture_output=True, text=True, timeout=60)
        assert busy.returncode == 1 and "already runs at" in busy.stderr
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "amlemu serve: https://127.0.0.1:" in err and "Traceback" not in err
    assert not servicefile.state_path(home).exists()
    assert (home / "service" / "service.log").read_text().rstrip().endswith("stopped")


def test_allow_remote_warns_and_still_wants_a_token(home: Path) -> None:
    """--allow-remote: the URL names this machine as other machines reach it (its certificate covers
    that name: tests/test_studio_login.py), every request needs a token, the studio its login."""
    proc = subprocess.Popen([sys.executable, "-m", "amlemu", "--home", str(home), "serve", "--port", "0",
                             "--allow-remote"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (state := servicefile.read_state(home)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        assert state.host == "0.0.0.0" and state.remote
        names = tls.machine_names()
        assert state.url == f"https://{names[0]}:{state.port}" if names else state.url.startswith("https://127.0.0.1")
        ca = home / "service" / "ca-bundle.pem"
        refused = requests.get(f"https://127.0.0.1:{state.port}{WS}", verify=ca, timeout=10)
        assert refused.status_code == 401
        assert requests.get(f"https://127.0.0.1:{state.port}/studio/", verify=ca, timeout=10).status_code == 401
        # `amlemu ui --link`: a login link to the service's studio, by the name the URL uses (here by
        # 127.0.0.1, which the certificate also covers: this test stays on loopback).
        link = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "ui", "--link"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
        assert link.startswith(f"{state.url}/studio/?login=")
        browser = requests.Session()
        page = browser.get(link.replace(state.url, f"https://127.0.0.1:{state.port}"), verify=ca, timeout=10)
        assert page.status_code == 200 and "amlemu studio" in page.text
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "warning: --allow-remote" in err
    # The studio's address; its login link, a credential, only to a terminal (never into a log).
    assert f"amlemu serve: {state.url} " in err and f"{state.url}/studio/ (its login link: `amlemu ui --link`)" in err
    assert "login=" not in err


@pytest.mark.parametrize("container,blob", [("code-a", "../code-b/train.py"), ("code-a", "x/../../code-b/t.py"),
                                            ("..", "x"), ("code-a/../code-b", "t.py"), ("code-a", "/etc/passwd")])
def test_an_upload_stays_in_the_container_its_sas_names(tmp_path: Path, container: str, blob: str) -> None:
    blobs = DiskBlobs(tmp_path / "blobs")
    blobs.put("code-a", "train.py", b"ok", None)
    with pytest.raises(ServiceError) as refused:
        blobs.put(container, blob, b"evil", None)
    assert refused.value.status == 400 and "leaves the container" in str(refused.value.body())
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "blob-metadata/code-a/train.py.json", "blobs/code-a/train.py"]


def test_the_artifact_listing_names_runs_only(tmp_path: Path) -> None:
    emu = Emulator(home=tmp_path / "home", backend="process")
    (emu.home.root / "runs").mkdir(exist_ok=True)
    (emu.home.root / "outputs").mkdir()  # what a `..` run name would reach: the home itself
    (emu.home.root / "outputs" / "secret.txt").write_text("not a run's")
    for prefix in ("ExperimentRun/dcid.../", "ExperimentRun/dcid...", "ExperimentRun/dcid../"):  # run `..`, `.`
        assert runblobs.list_blobs(emu, runblobs.ARTIFACT_CONTAINER, prefix) == []
