"""A backend's node plan is typed data (what create_node makes), and its `to_dict` is exactly the
JSON the dry run prints and launch.json's comparisons read (issue 27)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from amlemu.backends.base import NodeRequest
from amlemu.backends.dockerplan import MIRROR_IMAGE, container_plan
from amlemu.backends.process import NODE_FILE, ProcessBackend, ProcessNodePlan
from amlemu.home import Home

DOCKER_KEYS = ["backend", "image", "image_note", "name", "hostname", "network", "aliases", "labels", "command", "init",
               "environment", "read_only", "tmpfs", "security_opt", "volumes", "cpu_period", "cpu_quota", "cpu_shares",
               "cgroup_parent", "mem_limit",
               "shm_size", "gpus", "gpu_access", "devices", "host_guard", "machine"]
PROCESS_KEYS = ["backend", "hostname", "address", "node_dir", "labels", "cpus", "memory_bytes", "gpus", "shm_size",
                "notes"]


def _request(home: Home, index: int = 0, image: str | None = None) -> NodeRequest:
    return NodeRequest(home.id, "c1", index, 2.0, 1 << 30, 1.0, home.node_dir("c1", f"c1-node-{index}"),
                       home.cache_dir("c1", f"c1-node-{index}"), image=image)


def test_a_docker_node_plan_is_frozen_data_shown_with_the_dry_runs_keys(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    plan = container_plan(_request(home, image="trainer:1"), use_job_image=False, nvidia_runtime=False,
                          container_name="amlemu-x-c1-node-0", network="amlemu-x-c1", host_guard="closed")
    assert (plan.image, plan.command[0], plan.host_guard) == (MIRROR_IMAGE, "/usr/bin/tini", "closed")
    assert plan.image_note and "trainer:1 is not in the engine" in plan.image_note
    shown = json.loads(json.dumps(plan.to_dict()))
    assert list(shown) == DOCKER_KEYS and shown["backend"] == "docker"
    assert shown["aliases"] == ["c1-node-0"] and shown["security_opt"] == ["no-new-privileges"]  # JSON lists
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.image = "other"  # type: ignore[misc]


def test_a_docker_node_weighs_on_this_machines_cpus_as_its_share_of_processes_would(tmp_path: Path) -> None:
    """Not one weight shared by every container of the engine (/docker): a group of its own beside
    this machine's processes, weighted by the CPUs of its fair share (issue 30: beside two busy
    containers, MNIST on docker nodes went from 0.64x to 0.92x bare)."""
    home = Home.at(tmp_path / "home")
    for share, weight in ((1.0, 1024), (2.0, 2048), (0.5, 512)):
        request = dataclasses.replace(_request(home), cpu_share=share)
        plan = container_plan(request, use_job_image=False, nvidia_runtime=False, container_name="n", network="w",
                              host_guard="closed", cgroup_parent="/")
        assert (plan.cpu_shares, plan.cgroup_parent, plan.cpu_quota) == (weight, "/", 200_000)  # quota: 2 CPUs


def test_a_process_nodes_record_is_its_plan_and_an_older_record_still_lists(tmp_path: Path) -> None:
    home = Home.at(tmp_path / "home")
    backend = ProcessBackend(home)
    plan = backend.plan_node(_request(home))
    assert list(plan.to_dict()) == PROCESS_KEYS and plan.to_dict()["backend"] == "process"
    assert ProcessNodePlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    older = {k: v for k, v in backend.plan_node(_request(home, 1)).to_dict().items() if k not in ("shm_size", "notes")}
    for record in (plan.to_dict(), older):  # what create_node writes (before shm_size and notes existed, for one)
        state = backend.state_dir("c1", record["hostname"])
        state.mkdir(parents=True)
        (state / NODE_FILE).write_text(json.dumps(record))
    assert [(n.name, n.index, n.address, n.running) for n in backend.list_nodes()] == [
        ("c1-node-0", 0, "127.0.0.1", True), ("c1-node-1", 1, "127.0.0.1", True)]
