"""Which machine each node of a cluster is on (issue 31), as plain data on its NodeRequest.

A cluster with `machines` (ClusterSpec) has its nodes placed by machines.placement.place over
those machines' facts (the registry's records; `local`: this machine's). The placement is a
function of the cluster's spec and the machines' records alone, node index by index, so every
path that rebuilds a node's request (its creation, its removal, faults, recovery, the dry run)
finds it on the same machine without storing it:

- the cluster's nodes (its max_nodes) are placed at once, in index order: spread and pack are
  greedy, so node i is where it would be however many nodes exist;
- a machine takes a whole number of the size's nodes by its cores, memory and GPUs; where the
  size's cores or memory do not fit the cluster's nodes (a small machine), they are scaled down
  together by the least factor that fits (the nodes share the machines' cores, as nodes of one
  machine share it today, by a fair share); GPUs are never shared: too few is refused;
- each node's limits are node_limits on its own machine, with the cluster's nodes placed there.

A cluster whose nodes are all on this machine keeps its bridge network; one with a node on another
machine gets its overlay network's name (the swarm is made before its nodes: cluster/spanning.py).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

from amlemu.backends import NodeRequest
from amlemu.cluster import gpus as gpu_list
from amlemu.cluster.store import Store
from amlemu.errors import CapacityError, ConfigError
from amlemu.home import Home
from amlemu.machines import engines, registry
from amlemu.machines.placement import Free, NodeSize, fits, place, shortfall
from amlemu.machines.registry import LOCAL, Machine
from amlemu.skus import node_limits
from amlemu.specs import ClusterSpec

MAX_PLACED = 4096  # nodes placed ahead (max_nodes may be AmlCompute's 65,000: the first ones only)


@dataclass(frozen=True)
class Placement:
    """A cluster's nodes over its machines (pure data)."""

    machines: tuple[Machine, ...]
    by_index: tuple[str, ...]  # the machine name of node i
    scale: float  # 1: the size as it is; >1: cores and memory shared by that factor

    @property
    def spans(self) -> bool:
        return len(set(self.by_index)) > 1

    @property
    def overlay(self) -> bool:
        """Its nodes span machines, or are on another machine's engine only: an overlay network
        (whose nodes reach this machine's service link, and this machine guards against); all on
        this machine: its bridge, as before."""
        return self.spans or any(name != LOCAL for name in self.by_index)

    def machine(self, index: int) -> Machine:
        if index >= len(self.by_index):
            raise ConfigError("index", f"node {index} is past the {len(self.by_index)} nodes placed",
                              f"give the cluster at most {MAX_PLACED} nodes")
        return next(m for m in self.machines if m.name == self.by_index[index])

    def ordinal(self, index: int) -> int:
        """Its place among the cluster's nodes on its machine (which of that machine's GPUs it gets)."""
        return self.by_index[:index].count(self.by_index[index])


def fit_scale(count: int, size: NodeSize, free: list[Free]) -> float:
    """The least factor by which the size's cores and memory shrink so `count` nodes fit (1: as they
    are); CapacityError where the GPUs alone are short (pure)."""
    gpu_only = NodeSize(0.0, 0, size.gpus, size.name)
    if sum(fits(m, gpu_only) for m in free) < count:
        raise CapacityError("placement", shortfall(count, gpu_only, free))
    scale = 1.0
    if sum(fits(m, size) for m in free) < count:
        cores, memory = sum(m.cores for m in free), sum(m.memory_bytes for m in free)
        scale = max(1.0, count * size.cores / max(cores, 1e-9), count * size.memory_bytes / max(memory, 1))
    while sum(fits(m, scaled(size, scale)) for m in free) < count:  # whole nodes: a little more
        scale *= 1.05
    return scale


def scaled(size: NodeSize, scale: float) -> NodeSize:
    return NodeSize(size.cores / scale, math.floor(size.memory_bytes / scale), size.gpus, size.name)


def plan(spec: ClusterSpec, machines: tuple[Machine, ...]) -> Placement:
    """The cluster's placement over `machines` (pure)."""
    size = NodeSize.of(spec.size)
    count = max(1, min(spec.max_nodes, MAX_PLACED))
    free = [Free.of(m) for m in machines]
    scale = fit_scale(count, size, free)
    return Placement(machines, tuple(place(count, scaled(size, scale), free, spec.placement)), scale)


@functools.lru_cache(maxsize=64)
def _placement(db: str, spec: ClusterSpec) -> Placement:
    """Read once a process: a compute's machines cannot be removed while it names them, and their
    records do not change."""
    store = Store(Path(db))
    try:
        machines = tuple(registry.get(store, name, engines.local_machine) for name in spec.machines)
    finally:
        store.close()
    return plan(spec, machines)


def placement(home: Home, spec: ClusterSpec) -> Placement:
    return _placement(str(home.db), spec)


def overlay_name(home_id: str, cluster: str) -> str:
    """The cluster's attachable overlay network (its bridge is amlemu-<home>-<cluster>)."""
    return f"amlemu-{home_id}-{cluster}-overlay"


def on_machine(home: Home, spec: ClusterSpec, request: NodeRequest, host_gpus: tuple[str, ...] | None) -> NodeRequest:
    """`request` (made as on this machine) on the machine its index is placed on."""
    where = placement(home, spec)
    machine = where.machine(request.index)
    ordinal, sharing = where.ordinal(request.index), where.by_index.count(machine.name)
    local = machine.name == LOCAL
    gpus = (gpu_list.visible_gpus() if host_gpus is None else host_gpus) if local else machine.gpus
    limits = node_limits(spec.size, host_cpus=max(1, int(machine.cores)), host_memory_bytes=machine.memory_bytes,
                         host_gpus=len(gpus), nodes=sharing)
    if where.overlay and not local and not (machine.service_address and machine.advertise_address):
        raise ConfigError("machines", f"machine {machine.name} has no service or advertise address, which nodes "
                          f"on another machine need (compute {spec.name})",
                          f"add it again with --service-address and --advertise-address (docs/machines.md)")
    tls = (machine.tls.ca, machine.tls.cert, machine.tls.key) if machine.tls else None
    return replace(request, machine=machine.name, engine="" if local else machine.address, engine_tls=tls,
                   cpus=limits.cpus, memory_bytes=limits.memory_bytes, cpu_share=limits.cpu_share,
                   gpus=gpu_list.assign(gpus, ordinal, limits.gpus),
                   overlay=overlay_name(home.id, spec.name) if where.overlay else None,
                   service_address=None if local else machine.service_address or None,
                   ships_files=machine.ships_files,
                   advertise=_advertise(where, machine) if where.overlay else None)


def _advertise(where: Placement, machine: Machine) -> str | None:
    """The address the node's machine is reached at by the cluster's other machines: its record's
    for another machine; for this one, the first other machine's service address (the swarm's
    manager is advertised there, whichever node of the cluster is made first)."""
    if machine.name != LOCAL:
        return machine.advertise_address or None
    return next((m.service_address for m in where.machines if m.name != LOCAL and m.name in where.by_index), None)
