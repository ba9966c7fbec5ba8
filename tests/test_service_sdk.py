"""`amlemu serve` end to end: an ordinary SDK v2 submit script (examples/sdk2_submit.py: compute
create, a command() job 2 nodes x 2 processes MPI, create_or_update, stream, get, download), unchanged,
run as its own process with nothing but the variables `amlemu env` prints (and the config.json
`amlemu workspace config` writes), against the service on Docker nodes of the real emulator.
Docker is required: without an engine these tests fail, they never skip."""
from __future__ import annotations

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
from conftest import BLOCK, REPO, Script, release, served, service_cli, wait_until

from amlemu import servicefile
from amlemu.api import Emulator
from amlemu.home import Home
from amlemu.specs import ClusterSpec, RunStatus

SCRIPT = REPO / "examples" / "sdk2_submit.py"
# What a user's shell has besides the variables: a PATH, a HOME, a Python that finds its packages.
BASE_ENV = ("PATH", "HOME", "LANG", "PYTHONPATH")


@dataclass
class Service:
    home: Path
    project: Path
    env: dict[str, str]  # exactly what `amlemu env --format json` printed

    def amlemu(self, *args: str) -> subprocess.CompletedProcess[str]:
        return service_cli(self.home, self.project, *args)

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        script = self.start(*args)
        try:
            return script.finish(timeout=600)
        finally:
            script.stop()

    def start(self, *args: str) -> Script:
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ} | self.env
        return Script(subprocess.Popen([sys.executable, str(SCRIPT), *args], cwd=self.project, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


# One service for the module's tests, on one xdist worker: a service's start and cleanup, and its
# compute's 2 docker nodes (idle 120 s, as the script makes them), are paid once, not per test. The
# tests share its home and compute as a user's scripts share a workspace; each asserts on its own job.
pytestmark = pytest.mark.xdist_group("service-sdk")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, _homes: set[str]) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("service-sdk")
    home, project = root / "home", root / "project"
    home.mkdir()
    project.mkdir()
    _homes.add(Home.at(home).id)
    with served(home, project) as env:
        yield Service(home, project, env)


def test_the_unchanged_sdk2_script_runs_on_emulated_docker_nodes(service: Service) -> None:
    done = service.submit()

    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"compute cpu-cluster: (ProvisioningState\.SUCCEEDED|Succeeded), up to 2 nodes", done.stdout)
    # The real rank-0 log, streamed by jobs.stream: 4 ranks, 2 per node, on the emulator's nodes.
    assert "hello from rank 0 of 4 on cpu-cluster-node-" in done.stdout
    assert "Execution Summary" in done.stdout
    name = done.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    assert re.search(rf"job {name}: (JobStatus\.COMPLETED|Completed)\n", done.stdout)
    assert f"/studio/jobs/{name}" in done.stdout
    # The link leads to the studio page the service serves beside the API, once logged in by the
    # one-time link `amlemu ui --link` prints.
    url, ca = servicefile.read_state(service.home).url, service.env["REQUESTS_CA_BUNDLE"]
    assert requests.get(f"{url}/studio/jobs/{name}", verify=ca, timeout=30).status_code == 401
    browser = requests.Session()
    assert browser.get(service.amlemu("ui", "--link").stdout.strip(), verify=ca, timeout=30).status_code == 200
    page = browser.get(f"{url}/studio/jobs/{name}", verify=ca, timeout=30)
    assert page.status_code == 200 and name in page.text and "Completed" in page.text
    # The emulator ran it: its own store says so, its run folder holds every rank's log and the output.
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert (shown["status"], shown["compute"]) == ("Completed", "azureml:cpu-cluster")
    run_dir = service.home / "runs" / name
    logs = sorted(p.name for p in (run_dir / "user_logs").glob("std_log_process_*.txt"))
    assert logs == [f"std_log_process_{i}.txt" for i in range(4)]
    assert (run_dir / "outputs" / "greeting.txt").read_text() == "hello from 4 ranks\n"
    # jobs.download(all=True): the logs and default outputs, and the named output from its datastore.
    downloads = service.project / "downloads"
    assert (downloads / "artifacts" / "outputs" / "greeting.txt").read_text() == "hello from 4 ranks\n"
    assert (downloads / "artifacts" / "user_logs" / "std_log_process_3.txt").read_text() == \
        (run_dir / "user_logs" / "std_log_process_3.txt").read_text()
    assert (downloads / "named-outputs" / "model" / "model.txt").read_text() == "weights of 4 ranks\n"


def test_a_failing_job_ends_the_stream_with_its_failure(service: Service, tmp_path: Path) -> None:
    """The job waits in the queue behind a blocker until the stream is seen running: streaming a job
    that has already ended prints no log, on Azure as here, and a failing job ends within seconds."""
    emu = Emulator(home=service.home, backend="docker")
    if "cpu-cluster" not in {c.spec.name for c in emu.computes()}:  # the script's compute, unless an earlier test made it
        emu.create_compute(ClusterSpec("cpu-cluster", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=120))
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "block.py").write_text(BLOCK)
    (tmp_path / "block.yml").write_text("type: command\ncode: block\ncommand: python block.py\n"
                                        "compute: azureml:cpu-cluster\nresources: {instance_count: 2}\n"
                                        "distribution: {type: mpi}\n")
    blocker = emu.submit(tmp_path / "block.yml")
    script = service.start("--exit-code", "3")
    try:
        # The SDK flushes "Web View: ..." inside its polling loop: the stream has seen the job in progress.
        wait_until(lambda: "Web View:" in script.stdout_so_far(), 300, "the stream polls the queued job")
        release(emu, blocker)
        done = script.finish(timeout=600)
    finally:
        script.stop()
    assert blocker.wait(timeout=60) is RunStatus.COMPLETED

    assert done.returncode != 0
    # The log up to the failure reaches the user: streamed while the job runs, or, when the job ran
    # and failed between two of azure-ai-ml's polls (their interval grows while a job waits queued:
    # on Azure as here), in the JobException, which carries the failing rank's log tail. (A full
    # suite's load made the second case common: the job waited a minute behind the blocker.)
    if "hello from rank 0 of 4" in done.stdout:
        assert "Execution Summary" in done.stdout
    else:
        assert re.search(r"hello from rank (\d) of 4.*rank \1: exiting with code 3", done.stderr, re.S), done.stderr[-3000:]
    assert "JobException" in done.stderr and "exit code 3" in done.stderr + done.stdout, done.stderr[-3000:]
    name = done.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert shown["status"] == "Failed"


def test_a_pytorch_job_runs_with_torchs_variables(service: Service) -> None:
    done = service.submit("--distribution", "pytorch")

    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "hello from rank 0 of 4 on cpu-cluster-node-" in done.stdout  # RANK / WORLD_SIZE, as torchrun sets them
    name = done.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert shown["status"] == "Completed"
