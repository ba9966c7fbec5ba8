"""The compose files: valid for docker-compose, and the cluster file equal to the docker backend's dry run."""
from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml
from conftest import REPO

from emulator.compose import cluster_compose

COMPOSE = REPO / "compose"
VARIABLES = {"AMLEMU_HOME": "/srv/amlemu", "AMLEMU_HOME_ID": "0123abcd", "AMLEMU_VENV": "/srv/venv",
             "AMLEMU_PYTHON": "/srv/python"}


def _config(path) -> dict:  # type: ignore[no-untyped-def]
    out = subprocess.run(["docker-compose", "-f", str(path), "config"], capture_output=True, text=True,
                         env={**os.environ, **VARIABLES}, timeout=60)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_the_cluster_file_is_the_docker_backends_dry_run() -> None:
    assert (COMPOSE / "cluster-2nodes.yml").read_text() == cluster_compose(2), \
        "compose/cluster-2nodes.yml is stale: regenerate it with `python -m emulator.compose > compose/cluster-2nodes.yml`"


def test_the_cluster_file_validates_and_describes_two_labelled_nodes_on_one_network() -> None:
    config = _config(COMPOSE / "cluster-2nodes.yml")
    assert sorted(config["services"]) == ["cluster-node-0", "cluster-node-1"]
    node = config["services"]["cluster-node-1"]
    assert node["container_name"] == "amlemu-0123abcd-cluster-node-1" and node["labels"]["amlemu.index"] == "1"
    assert "/srv/amlemu/caches/cluster/cluster-node-1/data:/mnt/amlemu/cache:ro" in [
        f"{v['source']}:{v['target']}:{'ro' if v.get('read_only') else 'rw'}" if isinstance(v, dict) else v
        for v in node["volumes"]]
    assert config["networks"]["cluster"]["name"] == "amlemu-0123abcd-cluster"


@pytest.mark.parametrize("nodes", [1, 3])
def test_the_generator_follows_the_node_count(nodes: int) -> None:
    assert len(yaml.safe_load(cluster_compose(nodes))["services"]) == nodes


def test_the_stack_validates_and_its_node_image_is_aml_openmpi_with_the_projects_pins() -> None:
    config = _config(COMPOSE / "docker-compose.yml")
    assert set(config["services"]) == {"azurite", "node"}
    assert "--skipApiVersionCheck" in str(config["services"]["azurite"]["command"])
    dockerfile = (COMPOSE / "node" / "Dockerfile").read_text()
    assert re.search(r"^FROM mcr\.microsoft\.com/azureml/openmpi[\d.]+-ubuntu", dockerfile, re.M)
    pins = dict(re.findall(r'"(torch|torchvision)==([^"]+)"', (REPO / "pyproject.toml").read_text()))
    assert f"ARG TORCH={pins['torch']}" in dockerfile and f"ARG TORCHVISION={pins['torchvision']}" in dockerfile
    assert "horovod_wheel.py" in dockerfile and "HOROVOD_WITH_GLOO=1" in dockerfile
