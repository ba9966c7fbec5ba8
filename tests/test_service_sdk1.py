"""`amlemu serve` end to end for SDK v1: the seed article's notebook cells as a plain script
(examples/sdk1_submit.py: Workspace.from_config, find-or-create the low-priority cluster,
Experiment, a job on 2 nodes x 1 process over MPI, submit, wait_for_completion(show_output=True),
get_status/get_details/get_file_names/download_files, the experiment and run listings), unchanged,
run as its own process with nothing but the variables `amlemu env` prints (and the config.json
`amlemu workspace config` writes), against the service on Docker nodes of the real emulator.
Docker is required: without an engine these tests fail, they never skip."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import BLOCK, FULL, REPO, V1_CLUSTER_AND_MPI_JOB, Script, release, served, service_cli, wait_until

from amlemu.api import Emulator
from amlemu.home import Home
from amlemu.service.protocol.auth import Auth
from amlemu.service.protocol.calls import Context
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.server import run_in_thread

SCRIPT = REPO / "examples" / "sdk1_submit.py"
SOURCE = REPO / "examples" / "sdk2_src"  # a tiny MPI script: each rank says where it runs
BASE_ENV = ("PATH", "LANG", "PYTHONPATH")  # and HOME: a fresh user's, so nothing reaches the real ~/.azure*


@dataclass
class Service:
    home: Path
    project: Path
    user_home: Path
    env: dict[str, str]  # exactly what `amlemu env --format json` printed

    def amlemu(self, *args: str) -> subprocess.CompletedProcess[str]:
        return service_cli(self.home, self.project, *args)

    def start(self, *args: str, source: Path = SOURCE) -> Script:
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ} | {"HOME": str(self.user_home)} | self.env
        return Script(subprocess.Popen([sys.executable, str(SCRIPT), str(source), *args], cwd=self.project, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.start(*args).finish(timeout=600)


@pytest.fixture
def service(tmp_path: Path, _homes: set[str]) -> Iterator[Service]:
    home, project, user = tmp_path / "home", tmp_path / "project", tmp_path / "user"
    for folder in (home, project, user):
        folder.mkdir()
    _homes.add(Home.at(home).id)
    with served(home, project) as env:
        yield Service(home, project, user, env)


def _run_id(stdout: str) -> str:
    found = re.search(r"^RunId: (\S+)$", stdout, re.M)
    assert found, stdout[-3000:]
    return found[1]


def test_the_articles_v1_cells_run_unchanged_on_emulated_docker_nodes(service: Service, tmp_path: Path) -> None:
    # The job waits to be released once the SDK streams its log: a job that ends before
    # wait_for_completion's first poll prints no log (on Azure too), and the stream is what is checked.
    source = tmp_path / "src"
    source.mkdir()
    (source / "hello.py").write_text(BLOCK + (SOURCE / "hello.py").read_text())
    script = service.start(source=source)
    try:
        wait_until(lambda: "Streaming azureml-logs/70_driver_log_0.txt" in script.stdout_so_far(), 300,
                   "the SDK streams rank 0's driver log")
        emu = Emulator(home=service.home, backend="docker")
        release(emu, emu.run(_run_id(script.stdout_so_far())))
        done = script.finish(timeout=300)
    finally:
        script.stop()

    out = done.stdout
    assert done.returncode == 0, (out + done.stderr)[-4000:]
    # The cluster did not exist: ComputeTarget(...) raised ComputeTargetException, the script created it.
    assert "Creating a new compute target..." in out
    assert 'Provisioning operation finished, operation "Succeeded"' in out
    status = json.loads(re.search(r"^(\{'currentNodeCount'.*\})$", out, re.M)[1].replace("'", '"')
                        .replace("None", "null"))
    assert (status["vmPriority"], status["scaleSettings"]["maxNodeCount"]) == ("LowPriority", 2)
    assert status["provisioningState"] == "Succeeded"
    # wait_for_completion(show_output=True) streamed the real rank-0 log and ended with its summary.
    name = _run_id(out)
    # v1's log layout (the v1 runtime's names): the SDK streams rank 0's driver log.
    assert "Streaming azureml-logs/70_driver_log_0.txt" in out
    assert "hello from rank 0 of 2 on gpucluster-node-" in out
    assert out.index("hello from rank 0 of 2") < out.index("Execution Summary")
    assert "status: Completed" in out
    assert f"details: {name} Completed gpucluster" in out
    files = re.search(r"^files: (.*)$", out, re.M)[1]
    assert "'outputs/greeting.txt'" in files and "'azureml-logs/70_driver_log_1.txt'" in files
    assert "user_logs/" not in files  # v2's layout is v2 jobs' only
    assert "experiments: ['pytorch-distr-hvd']" in out
    # The run's "Web View" link opens the studio page the service serves beside the API, in a browser
    # logged in by the one-time link `amlemu ui --link` prints.
    web = re.search(r"^Web View: (\S+)$", out, re.M)[1]
    browser, ca = requests.Session(), service.env["REQUESTS_CA_BUNDLE"]
    assert browser.get(service.amlemu("ui", "--link").stdout.strip(), verify=ca, timeout=30).status_code == 200
    page = browser.get(web, verify=ca, timeout=30)
    assert page.status_code == 200 and name in page.text and "Completed" in page.text
    assert name in re.search(r"^runs: (.*)$", out, re.M)[1]
    # The emulator ran it, as any CLI job: its store, both ranks' logs, the output; download_files copied them.
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert (shown["status"], shown["compute"], shown["experiment_name"]) == \
        ("Completed", "azureml:gpucluster", "pytorch-distr-hvd")
    run_dir = service.home / "runs" / name
    assert sorted(p.name for p in (run_dir / "azureml-logs").glob("70_driver_log_*.txt")) == \
        ["70_driver_log_0.txt", "70_driver_log_1.txt"]
    assert (service.project / "downloads" / "outputs" / "greeting.txt").read_text() == "hello from 2 ranks\n"
    # No credential in the service's log; the user's Azure CLI folder was never touched.
    log = (service.home / "service" / "service.log").read_text()
    assert service.env["IDENTITY_HEADER"] not in log and "sig=" not in log and "Bearer" not in log
    assert not (service.user_home / ".azure").exists()


# `make test-full` only: in `make test` the seed notebook (tests/test_seed_notebook.py) submits the
# article's PyTorch estimator, 2 nodes x 1 MPI process, through the service on docker nodes and
# waits for it to complete; this script's --estimator branch is the same three lines of SDK calls.
# (Importing azureml.train alone costs ~8 s of CPU.)
@FULL
def test_the_articles_pytorch_estimator_runs_on_two_nodes(service: Service) -> None:
    done = service.submit("--estimator")

    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    name = _run_id(done.stdout)
    # Rank 0's log from the run's record: whether wait_for_completion streamed it depends on the job
    # not ending before the SDK's first poll (the ScriptRunConfig test checks the stream).
    log = (service.home / "runs" / name / "azureml-logs" / "70_driver_log_0.txt").read_text()
    assert "hello from rank 0 of 2 on gpucluster-node-" in log
    assert "status: Completed" in done.stdout
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert shown["status"] == "Completed"


CANCEL = "import sys, time\n" + V1_CLUSTER_AND_MPI_JOB + '''
run = Experiment(ws, "cancel-me").submit(mpi_job("sleep.py"))
deadline = time.time() + 240
while run.get_status() != "Running" and time.time() < deadline:
    time.sleep(0.2)
print("before:", run.get_status(), flush=True)
run.cancel()
while run.get_status() not in ("Canceled", "Failed", "Completed") and time.time() < deadline:
    time.sleep(0.2)
print("after:", run.get_status())
'''


def test_run_cancel_stops_a_running_v1_job(service: Service, tmp_path: Path) -> None:
    src = tmp_path / "sleeper"
    src.mkdir()
    (src / "sleep.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    script = tmp_path / "cancel.py"
    script.write_text(CANCEL)
    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ} | {"HOME": str(service.user_home)} | service.env
    done = subprocess.run([sys.executable, str(script), str(src)], cwd=service.project, env=env,
                          capture_output=True, text=True, timeout=400)

    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "before: Running" in done.stdout and "after: Canceled" in done.stdout, done.stdout
    listed = json.loads(service.amlemu("job", "list", "-o", "json").stdout)
    assert [job["status"] for job in listed] == ["Canceled"]


WS = ("/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/amlemu-rg/providers"
      "/Microsoft.MachineLearningServices/workspaces/amlemu-ws")


def test_v1s_managed_identity_tokens_are_jwts_only_this_home_signs(tmp_path: Path) -> None:
    """azureml-core's App Service identity route wants the secret; its tokens are JWTs (the SDK reads
    their tenant) that this home's key alone makes: a changed claim or another key is refused."""
    from amlemu.api import Emulator  # noqa: PLC0415

    emu = Emulator(tmp_path / "emu", backend="process")
    lines: list[str] = []
    auth = Auth.fresh()
    running = run_in_thread(Context(EmulatorState(emu, lines.append), auth, log=lines.append), tmp_path / "tls")
    ca = tmp_path / "tls" / "ca-bundle.pem"
    try:
        token_url = f"{running.url}/msi/v1/"
        query = {"resource": running.url + "/", "api-version": "2017-09-01"}
        assert requests.get(token_url, params=query, headers={"secret": "wrong"}, verify=ca, timeout=10) \
            .status_code == 401
        token = requests.get(token_url, params=query, headers={"secret": auth.identity_header}, verify=ca,
                             timeout=10).json()["access_token"]
        header, payload, _ = token.split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        assert claims["tid"] and claims["exp"] > claims["iat"]
        # ARM's double slash (azureml-core joins "https://host/" and "/subscriptions/..."): the same route.
        assert requests.get(f"{running.url}/{WS}", headers={"Authorization": f"Bearer {token}"}, verify=ca,
                            timeout=10).json()["name"] == "amlemu-ws"
        longer = base64.urlsafe_b64encode(json.dumps({**claims, "exp": claims["exp"] + 10**6}).encode())
        forged = [f"{header}.{longer.decode().rstrip('=')}.{token.rsplit('.', 1)[1]}",
                  Auth.fresh().issue()[0]]  # another home's key
        for bad in forged:
            refused = requests.get(running.url + WS, headers={"Authorization": f"Bearer {bad}"}, verify=ca, timeout=10)
            assert refused.status_code == 401
        # A v1 run sent as a snapshot, without the zip: refused, naming the variable that sends the zip.
        snap = requests.post(f"{running.url}/execution/v1.0{WS}/experiments/e/snapshotrun", params={"runId": "r1"},
                             json={}, headers={"Authorization": f"Bearer {token}"}, verify=ca, timeout=10)
        assert snap.status_code == 400 and snap.json()["error"]["target"] == "AML_FORCE_EXECUTE_WITH_ZIP"
    finally:
        running.stop()
        emu.cleanup()
    log = "\n".join(lines)
    assert auth.identity_header not in log and token not in log
