"""A docker cluster's running job shares one CPU group (backends/cpugroup.py): its ranks' idle
polling then yields to each other as bare ranks' does; memory and every other controller stay the
container's; a slowed node keeps its own group; the group goes with the cluster."""
from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
from conftest import BLOCK, release, wait_until

from amlemu.actions import execute
from amlemu.api import Emulator
from amlemu.backends import cpugroup
from amlemu.specs import RunStatus


def test_the_cpu_controllers_path_is_read_from_a_proc_cgroup_text() -> None:
    text = "12:memory:/abc\n5:cpu,cpuacct:/amlemu/h.c1\n1:name=systemd:/x\n0::/"
    assert cpugroup.cpu_cgroup(text) == "/amlemu/h.c1"
    assert cpugroup.cpu_cgroup("0::/user.slice") is None  # cgroup v2: no cpu controller of its own


def test_the_groups_weight_is_its_nodes_and_never_lowered() -> None:
    assert cpugroup.group_weight(0, [1024, 1024]) == 2048
    assert cpugroup.group_weight(4096, [1024, 1024]) == 4096  # another run of the cluster is in it
    assert cpugroup.group_weight(0, [1024] * 1000) == cpugroup.MAX_SHARES


def test_without_a_v1_cpu_hierarchy_nothing_is_shared(tmp_path: Path) -> None:
    assert "not cgroup v1" in (cpugroup.supported(tmp_path) or "")
    assert cpugroup.sharer_for("h", "c1", {os.getpid(): (list, 200000, 1024)}, root=tmp_path) is None


def fake_root(tmp_path: Path) -> Path:
    """A stand-in for /sys/fs/cgroup/cpu: this process's own cpu group as a node's container group."""
    root = tmp_path / "cpu"
    own = root / (cpugroup.cpu_cgroup(Path("/proc/self/cgroup").read_text()) or "/").lstrip("/")
    own.mkdir(parents=True, exist_ok=True)
    for folder in {root, own}:
        (folder / "cpu.shares").write_text("1024")
        (folder / "cgroup.procs").write_text("")
    (own / "cpu.cfs_quota_us").write_text("200000")
    return root


def test_a_nodes_new_processes_join_the_group_and_a_slowed_nodes_go_back(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    init, pids = os.getpid(), [os.getpid(), 111, 222]
    sharer = cpugroup.sharer_for("h", "c1", {init: (lambda: list(pids), 200000, 1024)}, root=root)
    assert sharer is not None and sharer.group == root / "amlemu" / "h.c1"
    sharer.tick()
    node = sharer.nodes[0]
    assert node.moved == {111, 222}  # the container's init stays where it is
    assert (sharer.group / "cpu.shares").read_text() == "1024"
    (node.own / "cpu.cfs_quota_us").write_text("50000")  # the `slow` fault lowered the node's quota
    sharer.tick()
    assert node.moved == set()  # back in the container's group, where the lowered quota applies
    assert (node.own / "cgroup.procs").read_text() in ("111", "222")
    assert cpugroup.groups("h", root) == [sharer.group] and cpugroup.groups("other", root) == []


def job_pids(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if any(marker in a for a in p.info["cmdline"] or [])]


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_a_docker_clusters_ranks_share_one_cpu_group_and_keep_their_containers_memory_group(
        emu: Emulator, cluster, make_job) -> None:  # type: ignore[no-untyped-def]
    assert cpugroup.supported() is None, "this machine (cgroup v1, root) must share CPU groups"
    cluster()
    run = emu.submit(make_job(BLOCK, nodes=2, name="sharecpu"))
    group = cpugroup.group_dir(emu.home.id, "c1")

    def ranks_in_group() -> list[psutil.Process]:
        inside = set(int(p) for p in (group / "cgroup.procs").read_text().split()) if group.is_dir() else set()
        return [p for p in job_pids("sharecpu.py") if p.pid in inside]
    ranks = wait_until(lambda: len(ranks_in_group()) == 2 and ranks_in_group(), 120, "both ranks in the cluster's group")
    import docker  # noqa: PLC0415

    ids = [c.id for c in docker.from_env().containers.list(filters={"label": f"amlemu.home={emu.home.id}"})]
    for rank in ranks:
        memory = next(line for line in Path(f"/proc/{rank.pid}/cgroup").read_text().splitlines() if ":memory:" in line)
        assert any(i in memory for i in ids), f"rank {rank.pid} left its container's memory group: {memory}"
    release(emu, run)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    emu.delete_compute("c1")
    assert not group.exists() and cpugroup.groups(emu.home.id) == []


def test_a_group_made_after_the_cleanup_was_planned_goes_too(tmp_path: Path) -> None:
    """A job launched while a cleanup was read makes its cluster's group then: the plan's last step
    removes whatever groups of the home exist when it runs."""
    (tmp_path / cpugroup.PARENT).mkdir()
    plan = cpugroup.plan_remove("h1", tmp_path)
    assert [a.what for a in plan] == ["cpu groups made since"]
    made = cpugroup.group_dir("h1", "c1", tmp_path)
    made.mkdir()
    other = cpugroup.group_dir("h2", "c1", tmp_path)
    other.mkdir()
    execute(plan)
    assert cpugroup.groups("h1", tmp_path) == [] and cpugroup.groups("h2", tmp_path) == [other]
