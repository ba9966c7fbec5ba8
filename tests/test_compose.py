"""The compose files: valid for docker-compose with no variable set, the cluster file equal to the
docker backend's dry run, and `up` of the cluster file giving two nodes that mpirun can use."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from amlemu.compose import cluster_compose, main

COMPOSE = REPO / "compose"
CLUSTER = COMPOSE / "cluster-2nodes.yml"
VARIABLES = {"AMLEMU_HOME": "/srv/amlemu", "AMLEMU_HOME_ID": "0123abcd", "AMLEMU_VENV": "/srv/venv",
             "AMLEMU_PYTHON": "/srv/python"}
NO_VARIABLES = {"PATH": os.environ["PATH"]}  # nothing else: no HOME, no AMLEMU_*


def _compose(*args: str, env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("docker-compose")
    assert tool, "docker-compose is not installed (Debian: apt-get install docker-compose; `make setup` does)"
    return subprocess.run([tool, *args], capture_output=True, text=True, env=env, timeout=timeout)


def _config(path: Path, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    out = _compose("-f", str(path), "config", env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "variable is not set" not in out.stderr, out.stderr  # every variable has a default
    return yaml.safe_load(out.stdout)


def _volumes(service: dict) -> list[str]:  # type: ignore[type-arg]
    return [f"{v['source']}:{v['target']}:{'ro' if v.get('read_only') else 'rw'}" if isinstance(v, dict) else v
            for v in service["volumes"]]


def test_the_cluster_file_is_the_docker_backends_dry_run() -> None:
    assert CLUSTER.read_text() == cluster_compose(2), \
        "compose/cluster-2nodes.yml is stale: regenerate it with `python -m amlemu.compose > compose/cluster-2nodes.yml`"


def test_the_cluster_file_validates_and_describes_two_labelled_nodes_on_one_network() -> None:
    config = _config(CLUSTER, {**NO_VARIABLES, **VARIABLES})
    assert sorted(config["services"]) == ["cluster-node-0", "cluster-node-1"]
    node = config["services"]["cluster-node-1"]
    assert node["container_name"] == "amlemu-0123abcd-cluster-node-1" and node["labels"]["amlemu.index"] == "1"
    volumes = _volumes(node)
    assert "/srv/amlemu/caches/cluster/cluster-node-1/data:/mnt/amlemu/cache:ro" in volumes
    assert {"/srv/venv:/srv/venv:ro", "/srv/python:/srv/python:ro"} <= set(volumes)  # the same paths inside
    assert node["environment"]["PATH"].startswith("/srv/venv/bin:")
    assert config["networks"]["cluster"]["name"] == "amlemu-0123abcd-cluster"


def test_both_files_validate_with_no_variable_set() -> None:
    """`docker-compose config` with an environment holding only PATH: every variable has a distinct,
    sensible default (before, four unset variables made the volumes "non-unique elements")."""
    config = _config(CLUSTER, NO_VARIABLES)
    home = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".amlemu" / "compose"  # `~` without $HOME
    for i in (0, 1):
        node = config["services"][f"cluster-node-{i}"]
        assert node["container_name"] == f"amlemu-compose-cluster-node-{i}"
        assert node["labels"]["amlemu.home"] == "compose"
        volumes = _volumes(node)
        assert len(volumes) == len(set(volumes)) and len({v.split(":")[1] for v in volumes}) == len(volumes)
        assert f"{home}/nodes/cluster/cluster-node-{i}:/mnt/azureml:rw" in volumes
        assert f"{REPO}/.venv:/opt/amlemu/venv:ro" in volumes  # this repository's venv (relative to compose/)
        assert "/usr/local:/usr/local:ro" in volumes
        assert node["environment"]["PATH"].startswith("/opt/amlemu/venv/bin:")
    assert config["networks"]["cluster"]["name"] == "amlemu-compose-cluster"
    assert set(_config(COMPOSE / "docker-compose.yml", NO_VARIABLES)["services"]) == {"azurite", "node"}


@pytest.mark.parametrize("python", ["/usr", "/usr/local", "pyenv"])
def test_the_file_is_the_same_whatever_python_generates_it(python: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    expected = cluster_compose(2)
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path) if python == "pyenv" else python)
    assert cluster_compose(2) == expected


@pytest.mark.parametrize("nodes", [1, 3])
def test_the_generator_follows_the_node_count(nodes: int) -> None:
    assert len(yaml.safe_load(cluster_compose(nodes))["services"]) == nodes


def test_the_stack_validates_and_its_node_image_is_aml_openmpi_with_the_projects_pins() -> None:
    config = _config(COMPOSE / "docker-compose.yml", {**NO_VARIABLES, **VARIABLES})
    assert set(config["services"]) == {"azurite", "node"}
    assert "--skipApiVersionCheck" in str(config["services"]["azurite"]["command"])
    dockerfile = (COMPOSE / "node" / "Dockerfile").read_text()
    assert re.search(r"^FROM mcr\.microsoft\.com/azureml/openmpi[\d.]+-ubuntu", dockerfile, re.M)
    pins = dict(re.findall(r'"(torch|torchvision)==([^"]+)"', (REPO / "pyproject.toml").read_text()))
    assert f"ARG TORCH={pins['torch']}" in dockerfile and f"ARG TORCHVISION={pins['torchvision']}" in dockerfile
    assert "horovod_wheel.py" in dockerfile and "HOROVOD_WITHOUT_GLOO=1" in dockerfile


# --- `up`: two real nodes ------------------------------------------------------------------------------
# Each rank: its rank, the world size, the node it runs on, and an allreduce over every rank.
RANKS = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
         "print('RANK', c.rank, c.size, socket.gethostname(), c.allreduce(c.rank + 1), flush=True)")
# Node 1 listens; node 0 looks node 1 up by its hostname on the compose network and talks to it.
LISTEN = ("import socket; s = socket.create_server(('0.0.0.0', 7777)); c, a = s.accept(); "
          "c.sendall(('hello from ' + socket.gethostname() + ' to ' + a[0]).encode()); c.close()")
CONNECT = ("import socket, time\n"
           "for _ in range(100):\n"
           "    try: c = socket.create_connection(('cluster-node-1', 7777), timeout=5); break\n"
           "    except OSError: time.sleep(0.1)\n"
           "print(socket.gethostbyname('cluster-node-1'), c.recv(200).decode())\n")
# What mpirun on the host runs instead of ssh (as the emulator's launch agent does for docker nodes):
# the MPI daemon's command, in the node's container. Given as `/bin/sh <script>`: each daemon checks
# that the agent's program exists on its own node, and /bin/sh does.
AGENT = '#!/bin/sh\nhost="$1"; shift\nexec docker exec -i "amlemu-{id}-$host" /bin/sh -c "$*"\n'


def _run(*argv: str, timeout: int = 120) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


def _left(home_id: str, project: str) -> list[str]:
    found = []
    for label in (f"amlemu.home={home_id}", f"com.docker.compose.project={project}"):
        found += _run("docker", "ps", "-aq", "--filter", f"label={label}").split()
        found += _run("docker", "network", "ls", "-q", "--filter", f"label={label}").split()
    return found


def test_up_gives_two_nodes_that_mpirun_runs_across_and_down_removes_them(tmp_path: Path) -> None:
    """`docker-compose up -d` of the cluster file (variables pointing at a temporary home and this
    venv) starts two nodes on one network; node 0 resolves and reaches node 1 by hostname; mpirun
    runs 2 ranks inside node 0, and 2 ranks across the nodes (one each, their daemons started from the
    host through `docker exec`, as the emulator starts them; the allreduce between them over TCP on
    the compose network); `down` leaves no container or network behind."""
    main(["--import-image"])  # the offline node image: no registry has it, `up` cannot pull it
    home_id = "t" + uuid.uuid4().hex[:7]
    project = f"amlemutest{home_id}"
    python = str(Path(sys.base_prefix).resolve())
    env = {**NO_VARIABLES, "AMLEMU_HOME": str(tmp_path / "home"), "AMLEMU_HOME_ID": home_id,
           "AMLEMU_VENV": str(Path(sys.prefix).resolve()),
           **({} if python in ("/usr", "/usr/local") else {"AMLEMU_PYTHON": python})}
    compose = ("-f", str(CLUSTER), "-p", project)
    nodes = [f"amlemu-{home_id}-cluster-node-{i}" for i in (0, 1)]
    venv_python = str(Path(sys.prefix, "bin", "python"))
    try:
        up = _compose(*compose, "up", "-d", env=env, timeout=300)
        assert up.returncode == 0, up.stderr
        states = [json.loads(_run("docker", "inspect", n))[0] for n in nodes]
        assert [s["State"]["Running"] for s in states] == [True, True]
        networks = [set(s["NetworkSettings"]["Networks"]) for s in states]
        assert networks == [{f"amlemu-{home_id}-cluster"}] * 2  # one network, theirs alone
        address_1 = states[1]["NetworkSettings"]["Networks"][f"amlemu-{home_id}-cluster"]["IPAddress"]

        _run("docker", "exec", "-d", nodes[1], venv_python, "-c", LISTEN)
        said = _run("docker", "exec", nodes[0], venv_python, "-c", CONNECT)
        assert said.split()[:4] == [address_1, "hello", "from", "cluster-node-1"], said

        inside = _run("docker", "exec", nodes[0], "mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
                      venv_python, "-c", RANKS)
        assert sorted(line for line in inside.splitlines() if line.startswith("RANK")) == [
            "RANK 0 2 cluster-node-0 3", "RANK 1 2 cluster-node-0 3"], inside

        agent = tmp_path / "agent.sh"
        agent.write_text(AGENT.format(id=home_id))
        across = _run("mpirun", "--allow-run-as-root", "-np", "2", "-H", "cluster-node-0:1,cluster-node-1:1",
                      "--mca", "plm_rsh_agent", f"/bin/sh {agent}", "--mca", "plm_rsh_no_tree_spawn", "1",
                      "--leave-session-attached", "--bind-to", "none", "--mca", "btl", "tcp,self",
                      venv_python, "-c", RANKS, timeout=180)
        assert sorted(line for line in across.splitlines() if line.startswith("RANK")) == [
            "RANK 0 2 cluster-node-0 3", "RANK 1 2 cluster-node-1 3"], across

        down = _compose(*compose, "down", "--remove-orphans", env=env, timeout=300)
        assert down.returncode == 0, down.stderr
        assert _left(home_id, project) == []
    finally:
        _compose(*compose, "down", "--remove-orphans", "--timeout", "1", env=env, timeout=300)
        for kind in ("container", "network"):  # whatever `down` could not remove
            ids = _run("docker", kind, "ls", "-aq" if kind == "container" else "-q", "--filter",
                       f"label=amlemu.home={home_id}").split()
            if ids:
                subprocess.run(["docker", kind, "rm", *(["-f"] if kind == "container" else []), *ids],
                               capture_output=True, timeout=120)
