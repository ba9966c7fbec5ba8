"""Autoscaling as AmlCompute does it: nodes appear when a job needs them, min_nodes stay up, a node
idle longer than the scale-down time goes away, and a job that does not fit yet waits, in order.

The decisions happen inside one SQLite transaction each, so concurrent runs never share a node.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import psutil

from amlemu.backends import NodeBackend, NodeRequest
from amlemu.cluster import gpus as gpu_list, placing, spanning
from amlemu.cluster.store import Node, Store
from amlemu.home import Home
from amlemu import skus
from amlemu.skus import GIB, node_limits
from amlemu.specs import ClusterSpec, RunStatus


@dataclass(frozen=True)
class Allocation:
    nodes: list[Node]  # in launch order: node 0 is the head
    new: list[Node]  # those that must be created first


def limits_here(spec: ClusterSpec, host_gpus: tuple[str, ...] | None = None):  # type: ignore[no-untyped-def]
    gpus = gpu_list.visible_gpus() if host_gpus is None else host_gpus
    # A pool's max_nodes is a quota, not nodes meant to run at once: each of its nodes plans on its size.
    busy = 1 if skus.is_pool(spec.name) else spec.max_nodes
    return node_limits(spec.size, host_cpus=os.cpu_count() or 1, host_memory_bytes=psutil.virtual_memory().total,
                       host_gpus=len(gpus), nodes=busy)


def node_request(home: Home, spec: ClusterSpec, index: int, image: str | None = None,
                 host_gpus: tuple[str, ...] | None = None, shm_bytes: int = 2 << 30,
                 python_env: str | None = None) -> NodeRequest:
    """What node `index` of the cluster is made of; each node gets its own GPUs (its size's count,
    as far as this machine has them)."""
    gpus = gpu_list.visible_gpus() if host_gpus is None else host_gpus
    limits = limits_here(spec, gpus)
    name = f"{spec.name}-node-{index}"
    request = NodeRequest(home_id=home.id, cluster=spec.name, index=index, cpus=limits.cpus,
                          memory_bytes=limits.memory_bytes, cpu_share=limits.cpu_share,
                          node_dir=home.node_dir(spec.name, name),
                          cache_dir=home.cache_dir(spec.name, name), gpus=gpu_list.assign(gpus, index, limits.gpus),
                          image=image, shm_bytes=shm_bytes, python_env=python_env,
                          disk_bytes=spec.size.temp_disk_gib * GIB)
    # Past one machine: on the machine its index is placed on (cluster/placing.py).
    return placing.on_machine(home, spec, request, host_gpus) if spec.machines else request


def free_indices(used: set[int], count: int) -> list[int]:
    """The `count` lowest node indices not in use. Its cost grows with the nodes that exist and
    the nodes asked for, never with max_nodes (which may be AmlCompute's 65,000)."""
    found: list[int] = []
    index = 0
    while len(found) < count:
        if index not in used:
            found.append(index)
        index += 1
    return found


def try_allocate(store: Store, spec: ClusterSpec, run_id: str, count: int) -> Allocation | None:
    """Claim `count` nodes for the run if the cluster can give them now; else None (stay Queued).
    Runs are served in submission order: only the oldest queued run of the cluster may claim."""
    now = time.time()
    with store.transaction() as db:
        oldest = db.execute("SELECT id FROM runs WHERE cluster = ? AND status = ? ORDER BY seq LIMIT 1",
                            (spec.name, RunStatus.QUEUED.value)).fetchone()
        if oldest is None or oldest["id"] != run_id:
            return None
        nodes = store.nodes(spec.name, db)
        idle = [n for n in nodes if n.state == "idle"]
        if len(idle) + spec.max_nodes - len(nodes) < count:
            return None
        taken = [replace(n, state="busy", run_id=run_id, idle_since=None) for n in idle[:count]]
        new = [Node(spec.name, i, f"{spec.name}-node-{i}", "creating", run_id, None, now, None)
               for i in free_indices({n.idx for n in nodes}, count - len(taken))]
        for node in taken + new:
            store.set_node(db, node)
        store.set_status(run_id, RunStatus.PREPARING, f"nodes: {', '.join(n.name for n in taken + new)}",
                         db=db, nodes=[n.name for n in taken + new])
    return Allocation(sorted(taken + new, key=lambda n: n.idx), new)


def create_nodes(store: Store, backend: NodeBackend, requests: list[NodeRequest]) -> dict[str, str]:
    """Create nodes in parallel (node start-up is mostly waiting on the engine); record addresses.
    Nodes that span machines: their swarm and overlay network first (cluster/spanning.py)."""
    spanning.prepare(store.path.parent, requests)
    with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
        addresses = dict(zip([r.name for r in requests], pool.map(backend.create_node, requests)))
    with store.transaction() as db:
        for node in store.nodes(requests[0].cluster, db) if requests else []:
            if node.name in addresses:
                store.set_node(db, replace(node, address=addresses[node.name],
                                           state="busy" if node.state == "creating" else node.state))
    return addresses


def release(store: Store, cluster: str, run_id: str, dead: set[str] = frozenset()) -> list[Node]:
    """The run's nodes become idle (scale-down clock starts); dead ones are forgotten. Returns the dead."""
    now = time.time()
    gone = []
    with store.transaction() as db:
        for node in store.nodes(cluster, db):
            if node.run_id != run_id:
                continue
            if node.name in dead or node.state == "creating":
                store.delete_node(db, cluster, node.idx)
                gone.append(node)
            else:
                store.set_node(db, replace(node, state="idle", run_id=None, idle_since=now))
    return gone


def expired_nodes(nodes: list[Node], spec: ClusterSpec, now: float) -> list[Node]:
    """Idle nodes past the scale-down time, oldest first, never going below min_nodes. Pure."""
    removable = max(0, len(nodes) - spec.min_nodes)
    idle = sorted((n for n in nodes if n.state == "idle" and n.idle_since is not None
                   and now - n.idle_since >= spec.idle_seconds_before_scaledown), key=lambda n: n.idle_since)
    return idle[:removable]


def scale_down(store: Store, spec: ClusterSpec, remove: Callable[[Node], None]) -> list[Node]:
    now = time.time()
    with store.transaction() as db:
        victims = expired_nodes(store.nodes(spec.name, db), spec, now)
        for node in victims:
            # Kept (as removing) until its container is gone: a new node must not take its name meanwhile.
            store.set_node(db, replace(node, state="removing"))
    for node in victims:
        remove(node)
        with store.transaction() as db:
            store.delete_node(db, spec.name, node.idx)
    return victims


def next_expiry(store: Store, spec: ClusterSpec) -> float | None:
    """When the next idle node above min_nodes will expire (None: nothing to scale down)."""
    nodes = store.nodes(spec.name)
    idle = [n.idle_since for n in nodes if n.state == "idle" and n.idle_since is not None]
    if len(nodes) <= spec.min_nodes or not idle:
        return None
    return min(idle) + spec.idle_seconds_before_scaledown
