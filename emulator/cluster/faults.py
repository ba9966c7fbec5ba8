"""Faults as AmlCompute has them, injected on purpose (a small chaos API, one call and one CLI
command each): preemption of low-priority nodes (the run is restarted on fresh nodes), a node
killed, a node cut off from the others, a slow node, a datastore read that fails.

Each fault is recorded in the store (the run's supervisor reacts to it) and in the run's
`system_logs/faults.txt` with a timestamp, before it is carried out.
"""
from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from amlemu.actions import Action, execute
from amlemu.backends import BACKENDS, NodeBackend, NodeRequest, backend_class, get_backend
from amlemu.cluster import autoscale
from amlemu.cluster.store import Node, Store
from amlemu.errors import BackendError, ConfigError, NotFoundError, StateError
from amlemu.home import Home
from amlemu.specs import Priority
from amlemu.storage.datastores import parse_uri

PARTITION_TIMEOUT = 20.0  # a job still running this long after a node was cut off fails (seconds)
MAX_PREEMPTIONS = 3  # restarts allowed when no preemption policy says otherwise


def preemption_delays(rate_per_node_hour: float, seed: int, run_seq: int, attempt: int, nodes: int) -> list[float]:
    """Seconds after Running at which each node is preempted (Poisson arrivals, one per node).
    The same seed, run and attempt always give the same delays."""
    if rate_per_node_hour <= 0:
        return [float("inf")] * nodes
    return [random.Random(f"{seed}/{run_seq}/{attempt}/{n}").expovariate(rate_per_node_hour / 3600)
            for n in range(nodes)]


def policy_schedule(store: Store, cluster: str, run_id: str, nodes: list[str]) -> list[tuple[float, str]]:
    """(seconds after Running, node) of a run attempt's preemptions under its cluster's policy."""
    policy = store.preemption_policy(cluster)
    if not policy or policy["rate_per_node_hour"] <= 0:
        return []
    record = store.run(run_id)
    delays = preemption_delays(policy["rate_per_node_hour"], policy["seed"], record.seq, record.preemptions, len(nodes))
    return [(d, node) for d, node in zip(delays, nodes) if d != float("inf")]


def fault_log(home: Home, run_id: str, line: str) -> None:
    folder = home.run_dir(run_id) / "system_logs"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "faults.txt", "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def require(backend: NodeBackend, capability: str, fault: str) -> None:
    """A fault the backend cannot carry out honestly is refused (never faked), naming the backends
    that can: the capability is a class attribute (`can_partition`, `can_slow`)."""
    if getattr(backend, capability):
        return
    able = [name for name in BACKENDS if getattr(backend_class(name), capability)]
    hint = f"; it is on {', '.join(able)} nodes (compute create --backend)" if able else ""
    raise BackendError(f"{fault} is not emulated on {backend.name} nodes{hint}")


class FaultInjector:
    def __init__(self, home: Home, store: Store) -> None:
        self.home, self.store = home, store

    def _nodes(self, cluster: str, node: int | str | None) -> list[Node]:
        nodes = [n for n in self.store.nodes(cluster) if n.state in ("busy", "idle")]
        if node is None:
            return nodes
        chosen = [n for n in nodes if str(node) in (str(n.idx), n.name)]
        if not chosen:
            names = ", ".join(n.name for n in nodes) or "none"
            raise NotFoundError("node", f"{node} of compute {cluster}", f"nodes up now: {names}")
        return chosen

    def _record(self, cluster: str, node: Node, kind: str, detail: str) -> None:
        self.store.add_fault(cluster, node.name, node.run_id, kind, detail)
        if node.run_id:
            fault_log(self.home, node.run_id, f"fault: {kind} {node.name}: {detail}")

    def _backend_and_request(self, cluster: str, node: Node):  # type: ignore[no-untyped-def]
        record = self.store.cluster(cluster)
        return get_backend(record.backend, self.home), autoscale.node_request(self.home, record.spec, node.idx)

    def _then(self, node: Node, removed: bool) -> str:
        if node.run_id:
            return f"run {node.run_id} reacts (see its system_logs/faults.txt)"
        return "the idle node is removed" if removed else "the idle node stays"

    def _fault(self, kind: str, cluster: str, node: Node, detail: str,
               fault: Callable[[NodeBackend, NodeRequest], None], take_down: bool = True) -> Action:
        """The fault as an Action: carried out and recorded (store, the run's faults.txt); a node
        taken down that is idle is removed (`_take_down`). A node taken down is recorded first: its
        run's supervisor reads the record as it reacts to the node's death."""
        def run() -> None:
            if take_down:
                self._record(cluster, node, kind, detail)
                self._take_down(cluster, node, fault)
            else:
                fault(*self._backend_and_request(cluster, node))
                self._record(cluster, node, kind, detail)
        return Action(kind, "node", node.name, {"compute": cluster, "run": node.run_id, "fault": detail,
                                                 "then": self._then(node, take_down)}, run=run)

    # --- the faults: plan_* is each one's dry run, the verb carries the plan out ----------------
    def plan_preempt(self, cluster: str, node: int | str | None = None, reason: str = "requested") -> list[Action]:
        """Low-priority preemption: the node is taken away without a signal the job could handle.
        A busy node's run is restarted on fresh nodes; an idle node just goes."""
        spec = self.store.cluster(cluster).spec
        if spec.vm_priority is not Priority.LOW_PRIORITY:
            raise StateError(f"compute {cluster} is dedicated: only low-priority nodes are preempted; "
                             "create the compute with vm_priority lowpriority (tier: low_priority)")
        return [self._fault("preempt", cluster, victim, reason, lambda backend, request: backend.kill_node(request))
                for victim in self._nodes(cluster, node)]

    def preempt(self, cluster: str, node: int | str | None = None, reason: str = "requested") -> list[str]:
        """Returns the nodes preempted."""
        plan = self.plan_preempt(cluster, node, reason)
        execute(plan)
        return [a.name for a in plan]

    def _take_down(self, cluster: str, node: Node, fault: Callable[[NodeBackend, NodeRequest], None]) -> None:
        """A busy node's supervisor reacts to the fault (restart, gang failure) and removes the node;
        an idle node has nobody to do that: it is removed now, so no job lands on a broken node."""
        backend, request = self._backend_and_request(cluster, node)
        fault(backend, request)
        if not node.run_id:
            with self.store.transaction() as db:
                self.store.delete_node(db, cluster, node.idx)
            backend.remove_node(request)

    def plan_kill_node(self, cluster: str, node: int | str) -> list[Action]:
        [victim] = self._nodes(cluster, node)
        return [self._fault("kill", cluster, victim, "the node was killed",
                            lambda backend, request: backend.kill_node(request))]

    def kill_node(self, cluster: str, node: int | str) -> str:
        [action] = self.plan_kill_node(cluster, node)
        execute([action])
        return action.name

    def plan_partition(self, cluster: str, node: int | str) -> list[Action]:
        [victim] = self._nodes(cluster, node)
        require(self._backend_and_request(cluster, victim)[0], "can_partition", "a network partition")
        detail = f"cut off from the cluster network; a job still running {PARTITION_TIMEOUT:g} s later fails"
        return [self._fault("partition", cluster, victim, detail, lambda backend, request: backend.partition_node(request),
                            take_down=not victim.run_id)]

    def partition(self, cluster: str, node: int | str) -> str:
        [action] = self.plan_partition(cluster, node)
        execute([action])
        return action.name

    def plan_slow(self, cluster: str, node: int | str, cpus: float) -> list[Action]:
        if cpus <= 0:
            raise ConfigError("--cpus", f"must be positive, got {cpus}")
        [victim] = self._nodes(cluster, node)
        require(self._backend_and_request(cluster, victim)[0], "can_slow", "slowing a node")
        return [self._fault("slow", cluster, victim, f"throttled to {cpus:g} CPU(s)",
                            lambda backend, request: backend.slow_node(request, cpus), take_down=False)]

    def slow(self, cluster: str, node: int | str, cpus: float) -> str:
        [action] = self.plan_slow(cluster, node, cpus)
        execute([action])
        return action.name

    def plan_fail_data_read(self, cluster: str, node: int | str, uri: str) -> list[Action]:
        """Reads of one cached file on one node fail (ELOOP: the entry becomes a symlink to itself)
        until the cache fetches it again (the next job, or a refresh after the TTL)."""
        [victim] = self._nodes(cluster, node)
        datastore, path = parse_uri(uri)
        cached = self.home.cache_dir(cluster, victim.name) / "data" / datastore / path
        if not cached.is_file():
            raise NotFoundError("cached file", f"{uri} on {victim.name}",
                                "a read fault applies to a file the node has cached (start the job first)")

        def run() -> None:
            broken = cached.with_name(f".{cached.name}.fault")
            os.symlink(cached.name, broken)
            os.replace(broken, cached)
            self._record(cluster, victim, "data-error", f"reads of {uri} fail with ELOOP")
        return [Action("data-error", "cached file", str(cached), {"compute": cluster, "node": victim.name, "uri": uri,
                                                                  "run": victim.run_id, "fault": "reads fail with ELOOP"},
                       run=run)]

    def fail_data_read(self, cluster: str, node: int | str, uri: str) -> Path:
        [action] = self.plan_fail_data_read(cluster, node, uri)
        execute([action])
        return Path(action.name)

    def plan_set_preemption_policy(self, cluster: str, rate_per_node_hour: float, seed: int = 0,
                                   max_preemptions: int = MAX_PREEMPTIONS) -> list[Action]:
        """Random preemption of a low-priority cluster's busy nodes, reproducible with `seed`, and
        how many preemptions a run survives before it fails."""
        spec = self.store.cluster(cluster).spec
        if spec.vm_priority is not Priority.LOW_PRIORITY and rate_per_node_hour > 0:
            raise StateError(f"compute {cluster} is dedicated: only low-priority nodes are preempted")
        if rate_per_node_hour < 0 or max_preemptions < 0:
            raise ConfigError("preemption policy", "rate and limit must not be negative")
        was = self.store.preemption_policy(cluster)
        return [Action("set", "preemption policy", cluster,
                       {"rate_per_node_hour": rate_per_node_hour, "seed": seed, "max_preemptions": max_preemptions,
                        "was": {k: v for k, v in was.items() if k != "cluster"} if was else None},
                       run=lambda: self.store.set_preemption_policy(cluster, rate_per_node_hour, seed, max_preemptions))]

    def set_preemption_policy(self, cluster: str, rate_per_node_hour: float, seed: int = 0,
                              max_preemptions: int = MAX_PREEMPTIONS) -> None:
        execute(self.plan_set_preemption_policy(cluster, rate_per_node_hour, seed, max_preemptions))
