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

import docker
import psutil
import pytest
import requests
from conftest import REPO

from amlemu import servicefile
from amlemu.home import Home

SCRIPT = REPO / "examples" / "sdk2_submit.py"
# What a user's shell has besides the variables: a PATH, a HOME, a Python that finds its packages.
BASE_ENV = ("PATH", "HOME", "LANG", "PYTHONPATH")


@dataclass
class Service:
    home: Path
    project: Path
    env: dict[str, str]  # exactly what `amlemu env --format json` printed

    def amlemu(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(self.home), *args], cwd=self.project,
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ, "AMLEMU_BACKEND": "docker"})
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def submit(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: os.environ[k] for k in BASE_ENV if k in os.environ} | self.env
        return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=self.project, env=env,
                              capture_output=True, text=True, timeout=600)


@pytest.fixture
def service(tmp_path: Path, _homes: set[str]) -> Iterator[Service]:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    _homes.add(Home.at(home).id)
    svc = Service(home, project, {})
    try:
        svc.env = json.loads(svc.amlemu("env", "--format", "json", "--port", "0").stdout)
        svc.amlemu("workspace", "config")
        yield svc
    finally:
        running = servicefile.read_state(home)
        subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "cleanup", "--yes"], timeout=180,
                       capture_output=True)
        # Nothing the service started is left: the service itself, its jobs' supervisors, the nodes.
        assert running is None or not psutil.pid_exists(running.pid), "the service outlived amlemu cleanup"
        assert servicefile.read_state(home) is None
        left = docker.from_env().containers.list(all=True, filters={"label": f"amlemu.home={Home.at(home).id}"})
        assert left == [], f"containers left: {[c.name for c in left]}"


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
    # The link leads to the studio page the service serves beside the API.
    url, ca = servicefile.read_state(service.home).url, service.env["REQUESTS_CA_BUNDLE"]
    page = requests.get(f"{url}/studio/jobs/{name}", verify=ca, timeout=30)
    assert page.status_code == 200 and name in page.text and "Completed" in page.text
    # The emulator ran it: its own store says so, its run folder holds every rank's log and the output.
    shown = json.loads(service.amlemu("job", "show", "-n", name, "-o", "json").stdout)
    assert (shown["status"], shown["compute"]) == ("Completed", "cpu-cluster")
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


def test_a_failing_job_ends_the_stream_with_its_failure(service: Service) -> None:
    done = service.submit("--exit-code", "3")

    assert done.returncode != 0
    assert "hello from rank 0 of 4" in done.stdout  # the log up to the failure was streamed
    assert "Execution Summary" in done.stdout
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
