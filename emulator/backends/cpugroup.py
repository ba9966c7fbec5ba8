"""One CPU group per docker cluster for its jobs' processes (cgroup v1's cpu controller only).

Why: each container is a cgroup of its own, and an MPI rank that waits for its peer polls and
yields the CPU (Open MPI's mpi_yield_when_idle: sched_yield), which under the kernel's fair
scheduler hands the CPU only to another task of the same group. A rank waiting in one container
kept its share of a core spinning while its peer in the other container waited for that core.
Measured on 2 cores (docs/benchmarks.md): Horovod MNIST on 2 docker nodes, 3,800-6,600 samples/s
with each node's processes in its container's group, 6,800-7,200 with the cluster's in one group,
6,700 bare. So while a job runs, its processes on the cluster's nodes join the cluster's group for
the cpu controller only: memory, pids and every other controller stay the container's (each is a
hierarchy of its own under v1), and so do namespaces, mounts and the network.

The nodes' own CPU quotas (their VM size's cores) give way to the group's, their sum: a node
slowed by the `slow` fault (a lowered quota) keeps its processes in its container's group, where
that quota applies. Where the cpu controller is not v1's own hierarchy (cgroup v2, not root),
nothing is moved and each node keeps its group (`supported` says why).
"""
from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from amlemu.actions import Action

ROOT = Path("/sys/fs/cgroup/cpu")
PARENT = "amlemu"  # every home's cluster groups under it: <home id>.<cluster>
TICK = 0.5  # seconds between looks for new processes on the nodes
MAX_SHARES = 262144  # cgroup v1's largest cpu.shares

Pids = Callable[[], list[int]]


def supported(root: Path = ROOT) -> str | None:
    """None when the cluster's processes can share a CPU group, else why not."""
    if not (root / "cpu.shares").exists() or not (root / "cgroup.procs").exists():
        return "this machine's cpu controller is not cgroup v1's own hierarchy"
    if not os.access(root, os.W_OK):
        return "moving processes between CPU groups needs root"
    return None


def group_dir(home_id: str, cluster: str, root: Path = ROOT) -> Path:
    return root / PARENT / f"{home_id}.{cluster}"


def cpu_cgroup(proc_cgroup: str) -> str | None:
    """The cpu controller's path in a /proc/<pid>/cgroup text (v1: `N:cpu,cpuacct:/path`)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and "cpu" in parts[1].split(","):
            return parts[2]
    return None


def group_weight(current: int, node_shares: list[int]) -> int:
    """The group's cpu.shares: the sum of its nodes' (never lowered while another run of the
    cluster may be in it), within v1's bounds."""
    return max(2, min(MAX_SHARES, max(current, sum(node_shares))))


def _move(pid: int, group: Path) -> bool:
    try:
        (group / "cgroup.procs").write_text(str(pid))
        return True
    except OSError:  # the process ended meanwhile
        return False


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Node:
    """A node as the sharer sees it: its container's init (left where it is), the container's own
    cpu group, a reader of its processes (its memory group's), and its nominal CFS quota."""

    def __init__(self, init: int, pids: Pids, quota: int, root: Path = ROOT) -> None:
        own = cpu_cgroup(Path(f"/proc/{init}/cgroup").read_text()) or "/"
        self.init, self.pids, self.quota, self.own = init, pids, quota, root / own.lstrip("/")
        self.moved: set[int] = set()

    def slowed(self) -> bool:
        quota = _read_int(self.own / "cpu.cfs_quota_us")
        return quota is not None and 0 < quota < self.quota


class Sharer:
    """Moves the job's processes on `nodes` into `group` as they appear; a slowed node's back."""

    def __init__(self, group: Path, nodes: list[Node], node_shares: list[int]) -> None:
        group.mkdir(parents=True, exist_ok=True)
        weight = group_weight(_read_int(group / "cpu.shares") or 0, node_shares)
        (group / "cpu.shares").write_text(str(weight))
        self.group, self.nodes = group, nodes

    def tick(self) -> None:
        for node in self.nodes:
            try:
                now = set(node.pids()) - {node.init}
            except OSError:  # the node went meanwhile
                continue
            if node.slowed():
                node.moved = {p for p in node.moved & now if not _move(p, node.own)}
            else:
                node.moved |= {p for p in now - node.moved if _move(p, self.group)}


def start(find: Callable[[], Sharer | None], stop: threading.Event) -> threading.Thread:
    """A thread moving the job's processes until `stop`; `find` (engine calls) runs in it, so the
    launch does not wait for it."""
    def run() -> None:
        sharer = find()
        while sharer is not None and not stop.is_set():
            sharer.tick()
            stop.wait(TICK)
    thread = threading.Thread(target=run, name="cpugroup", daemon=True)
    thread.start()
    return thread


def remove(group: Path, root: Path = ROOT) -> bool:
    """The group gone: a process left in it (a node not removed yet) back to the top group first."""
    if not group.is_dir():
        return False
    for pid in _read_int_list(group / "cgroup.procs"):
        _move(pid, root)
    try:
        group.rmdir()
        group.parent.rmdir()  # the last home's: nothing of amlemu left
    except OSError:
        pass
    return not group.exists()


def _read_int_list(path: Path) -> list[int]:
    try:
        return [int(p) for p in path.read_text().split()]
    except (OSError, ValueError):
        return []


def groups(home_id: str | None, root: Path = ROOT) -> list[Path]:
    """The cluster groups of one home (every home's with None)."""
    parent = root / PARENT
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and (home_id is None or p.name.startswith(f"{home_id}.")))


def plan_remove(home_id: str | None, root: Path = ROOT) -> list[Action]:
    """The reaper's step: each cluster group of the home, removed; then any made since the plan was
    read (a job launched while a cleanup was planned makes its cluster's group then, before the
    cleanup's first step stops its supervisor)."""
    listed = [Action("remove", "cpu group", str(g), run=functools.partial(remove, g, root), always=True)
              for g in groups(home_id, root)]
    return listed + [Action("remove", "cpu groups made since", f"{home_id or '*'}.*",
                            run=functools.partial(_remove_all, home_id, root), always=True)]


def _remove_all(home_id: str | None, root: Path = ROOT) -> bool:
    return any([remove(g, root) for g in groups(home_id, root)])


def sharer_for(home_id: str, cluster: str, nodes: Mapping[int, tuple[Pids, int, int]],
               root: Path = ROOT) -> Sharer | None:
    """The cluster's sharer: `nodes` maps each node's init pid to (its processes, its nominal CFS
    quota, its cpu.shares). None where the cpu controller cannot be shared."""
    if supported(root) is not None or not nodes:
        return None
    found = [Node(init, pids, quota, root) for init, (pids, quota, _) in nodes.items()]
    return Sharer(group_dir(home_id, cluster, root), found, [shares for _, _, shares in nodes.values()])
