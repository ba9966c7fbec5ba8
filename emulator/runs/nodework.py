"""The platform's work on a run's nodes around its job: stopping what the job left (quiesce),
collecting outputs and logs, emptying the nodes for the next job or removing lost ones, and
scaling idle nodes down once the run has ended (the supervisor's linger). Nodes are independent:
the steps on them run side by side."""
from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from amlemu.backends import NodeRequest, nodefs
from amlemu.backends.base import NodeBackend
from amlemu.cluster import autoscale
from amlemu.cluster.store import Store
from amlemu.errors import AmlEmuError
from amlemu.home import Home
from amlemu.runs import datamounts, rundisk
from amlemu.runs.contract import job_rel
from amlemu.runs.metrics import LIVE_DIR
from amlemu.runs.outcome import POLL
from amlemu.specs import ClusterSpec

Log = Callable[[str], None]


def each_node(requests: list[NodeRequest], action: Callable[[NodeRequest], Any]) -> None:
    if requests:
        with ThreadPoolExecutor(len(requests)) as pool:
            list(pool.map(action, requests))


def create(store: Store, backend: NodeBackend, cluster: str, new: list[NodeRequest], requests: list[NodeRequest],
           log: Log, mark: Callable[[str], None]) -> dict[str, str | None]:
    """The run's `new` nodes made; then, new or warm (made by `compute create` and never asked), every
    node of the run resolving every other by name before the job starts (backends' until_peers_known:
    a deadline). Each node's address, by name."""
    if new:
        log(f"creating node(s) {', '.join(r.name for r in new)} ({backend.name})")
        autoscale.create_nodes(store, backend, new)
        mark(f"{len(new)} node(s) created")
    addresses = {n.name: n.address for n in store.nodes(cluster)}
    if backend.until_peers_known(requests, [addresses[r.name] or "" for r in requests], log):
        mark("every node resolves the others")
    return addresses


def unfit(backend: NodeBackend, requests: list[NodeRequest]) -> list[NodeRequest]:
    """The nodes kept from earlier runs that this job cannot use as they are (`backend.fits`), all
    asked at once: on docker each answer is a call to its engine, ~20 ms, per node and submit."""
    with ThreadPoolExecutor(min(len(requests), 16) or 1) as pool:
        fits = list(pool.map(backend.fits, requests))
    return [r for r, ok in zip(requests, fits) if not ok]


def quiesce(backend: NodeBackend, requests: list[NodeRequest], run_id: str, run_dir: Path, log: Log) -> None:
    """Before the host reads a node's disk: no job process is left to change it (a daemon the
    job started included), and every link or special file the job made there is removed, so
    that copying and uploading cannot be led out of the run's folder."""
    shutil.rmtree(run_dir / LIVE_DIR, ignore_errors=True)  # the merge replaces it

    def one(request: NodeRequest) -> None:
        backend.stop_processes(request)
        take_back(backend, request, run_id, log)
    each_node(requests, one)


def take_back(backend: NodeBackend, request: NodeRequest, run_id: str, log: Log) -> None:
    """With no job process left on the node: the data runtime's mounts gone, the run's folder here
    (shipped back from a node on another host), every link or special file in it removed."""
    datamounts.unmount_node(request.cache_dir, run_id, log)  # before anything reads the disk
    try:
        made = [p for p in backend.ship_out(request, job_rel(run_id)) if not p.startswith(rundisk.PLATFORM_LINKS)]
    except (OSError, AmlEmuError) as exc:  # its staging disk full, its engine failing: what came is kept
        log(f"warning: {request.name}: {exc}")
        made = []
    made += rundisk.secure(request.node_dir, run_id)
    if made:
        log(f"notice: {request.name}: not collected (links or special files, which Azure ML does not "
            f"upload as such): {', '.join(made[:10])}")


def ship_in(backend: NodeBackend, requests: list[NodeRequest], run_id: str, log: Log) -> bool:
    """Before the job: each node on another host gets the run's folder and its new cache entries
    (backends/shipping.py); whether any did."""
    shipped = [r for r in requests if r.ships_files]

    def one(request: NodeRequest) -> None:
        count = backend.ship_in(request, job_rel(run_id))
        log(f"{request.name}: the run's folder shipped to machine {request.machine}"
            + (f", and {count} new file(s) of its cache" if count else ""))
    each_node(shipped, one)
    return bool(shipped)


def collect(requests: list[NodeRequest], run_id: str, run_dir: Path, log: Log) -> None:
    """./outputs, ./logs and the MLflow store of every node into the run's record (also after
    a failure); after quiesce, so only real files and folders are left."""
    for request in requests:
        rundisk.collect(request.node_dir, request.name, run_id, run_dir, log)


def clean(home: Home, store: Store, backend: NodeBackend, spec: ClusterSpec, run_id: str,
          requests: list[NodeRequest], dead: set[str], stop: bool, log: Log) -> None:
    """Stop the run's processes (`stop`: unless quiesce did) and empty the nodes' disks (the next
    run on a node finds nothing of this one); lost or half-made nodes (`dead`) go."""
    def one(request: NodeRequest) -> None:
        if stop:
            backend.stop_processes(request)
        datamounts.unmount_node(request.cache_dir, run_id, log)  # done by quiesce, unless it did not run
        nodefs.wipe(request.node_dir)
        backend.reset_node(request)
    each_node(requests, one)
    for node in autoscale.release(store, spec.name, run_id, dead):
        log(f"removing node {node.name}")
        backend.remove_node(autoscale.node_request(home, spec, node.idx))


def linger(home: Home, store: Store, backend: NodeBackend, spec: ClusterSpec) -> None:
    """Stay while this cluster has idle nodes to scale down; the last supervisor out removes them."""
    while (expiry := autoscale.next_expiry(store, spec)) is not None:
        time.sleep(max(POLL, min(expiry - time.time(), 5.0)))
        try:
            store.cluster(spec.name)
        except AmlEmuError:
            return  # the cluster was deleted meanwhile
        autoscale.scale_down(store, spec, lambda n: backend.remove_node(autoscale.node_request(home, spec, n.idx)))
