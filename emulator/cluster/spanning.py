"""A cluster whose nodes span machines (issue 31): its swarm and overlay network, made before its
nodes, and the swarm's cleanup on every machine.

The docker backend makes each node's container on its machine's engine, on the network its request
names (NodeRequest.overlay, cluster/placing.py); this module makes that network exist first:
this machine's engine in a swarm (machines.swarm.ensure_swarm: initialised and labelled as
amlemu's where the engine is in none, advertised on the address the other machines reach this one
at), each other machine's engine joined to it as a worker, and the cluster's attachable overlay
made on this machine's engine (the manager), encrypted where the kernel can.
"""
from __future__ import annotations

import fcntl
import functools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from amlemu.actions import Action, execute
from amlemu.backends import NodeRequest
from amlemu.backends.base import LABEL
from amlemu.backends.dockerapi import connect
from amlemu.backends.dockerengines import RECORD as ENGINES_RECORD
from amlemu.errors import AmlEmuError, BackendError
from amlemu.home import Home
from amlemu.machines import engines, registry, swarm
from amlemu.machines.address import TlsFiles

JOIN_READY_S = 60.0  # a deadline: a worker the manager does not see ready by then cannot take nodes


def _tls(request: NodeRequest) -> TlsFiles | None:
    return TlsFiles(*request.engine_tls) if request.engine_tls else None


def prepare(root: Path, requests: Sequence[NodeRequest]) -> str | None:
    """The swarm joined by every engine of `requests` and their cluster's overlay made; its name
    (None: the nodes are on one machine, on the cluster's bridge as before)."""
    spanning = [r for r in requests if r.overlay]
    if not spanning:
        return None
    remote = {r.engine: r for r in spanning if r.engine}
    home_id = spanning[0].home_id
    with open(root / "swarm.lock", "a") as lock:  # two runs of a cluster: one swarm, one overlay
        fcntl.flock(lock, fcntl.LOCK_EX)
        local = connect()
        manager_addr = next((r.advertise for r in spanning if not r.engine and r.advertise), None) or \
            next((r.service_address for r in remote.values()), None)
        made = swarm.ensure_swarm(local, manager_addr or "127.0.0.1", home_id)
        _check_advertised(made)
        for address, request in remote.items():
            client = engines.connect(address, _tls(request))
            try:
                node_id = swarm.join(client, made.worker_token, made.manager_addr, request.advertise or "")
            finally:
                client.close()
            if node_id not in {n.id for n in local.nodes.list()}:
                raise BackendError(f"machine {request.machine}'s engine ({address}) is in another swarm; take it out "
                                   "(`docker swarm leave` there) or use another machine")
            _label(local, node_id, {**swarm.labels(home_id), f"{LABEL}.machine": request.machine})
            _until_ready(local, node_id, request.machine)
        if any(not r.engine for r in spanning):
            _ensure_gwbridge(local, home_id)
        name = spanning[0].overlay
        if not [n for n in local.networks.list(names=[name]) if n.name == name]:
            swarm.create_overlay(local, name, {LABEL: "1", f"{LABEL}.home": home_id,
                                               f"{LABEL}.cluster": spanning[0].cluster}, encrypted=True)
    return name


def _label(manager: Any, node_id: str, labels: dict[str, str]) -> None:
    """Mark a swarm node amlemu joined (swarm.label_node's labels and the machine it is), so that a
    cleanup can remove its entry once the machine is gone."""
    node = manager.nodes.get(node_id)
    spec = dict(node.attrs["Spec"])
    if any((spec.get("Labels") or {}).get(k) != v for k, v in labels.items()):
        node.update({**spec, "Labels": {**(spec.get("Labels") or {}), **labels}})


def _check_advertised(made: swarm.SwarmState) -> None:
    """The swarm's manager (this machine's engine) is reached at the address it advertised when the
    swarm was made: where that address is gone from this machine (the link it was on removed, a
    test rig's), workers still join but no overlay packet reaches this machine: refused."""
    host = made.manager_addr.rsplit(":", 1)[0].strip("[]")
    here = {a.address for addresses in psutil.net_if_addrs().values() for a in addresses}
    if host not in here:
        raise BackendError(f"this machine's swarm advertises {host}, which is no longer an address of this machine; "
                           "take the engine out of it (`docker swarm leave --force`) once nothing uses it, or "
                           "add the address back")


def _until_ready(manager: Any, node_id: str, machine: str, limit: float = JOIN_READY_S) -> None:
    """A worker just joined is `unknown` to the manager for a moment; a container attached to an
    overlay on it then may fail ("attaching to network failed ... context deadline exceeded")."""
    deadline = time.monotonic() + limit
    while (state := manager.nodes.get(node_id).attrs["Status"]["State"]) != "ready":
        if time.monotonic() > deadline:
            raise BackendError(f"machine {machine}'s engine joined the swarm but is {state} after {limit:g} s; "
                               "check the swarm's ports between the machines (docs/swarm.md)")
        time.sleep(0.1)


def _ensure_gwbridge(client: Any, home_id: str) -> None:
    """The bridge by which overlay containers leave this machine's engine, made now as Docker makes
    it with the first of them (its docs' options): its gateway is where they reach this machine's
    service link, asked before they are made."""
    if not client.networks.list(names=[swarm.GWBRIDGE]):
        client.networks.create(swarm.GWBRIDGE, driver="bridge", options={  # the swarm's: it goes with it
            "com.docker.network.bridge.name": swarm.GWBRIDGE, "com.docker.network.bridge.enable_icc": "false",
            "com.docker.network.bridge.enable_ip_masquerade": "true"})


def machines_down(nodes: Sequence[dict[str, Any]], home_id: str) -> dict[str, str]:
    """The machines this home joined whose swarm entry the manager has marked down (its heartbeat
    lost: the machine cut off from this one, or its engine gone): machine -> the swarm's message
    (pure: from the manager's node list, each node's attrs)."""
    return {labels[f"{LABEL}.machine"]: n["Status"].get("Message") or "no heartbeat"
            for n in nodes for labels in [n["Spec"].get("Labels") or {}]
            if labels.get(f"{LABEL}.home") == home_id and f"{LABEL}.machine" in labels
            and n["Status"].get("State") == "down"}


def down_now(manager: Any, home_id: str) -> dict[str, str]:
    """machines_down, as this machine's engine (the swarm's manager) sees it now; {} outside a swarm."""
    if not (manager.info().get("Swarm") or {}).get("ControlAvailable"):
        return {}
    return machines_down([n.attrs for n in manager.nodes.list()], home_id)


def recorded_engines(home: Home, stored: Sequence[registry.Machine]) -> dict[str, TlsFiles | None]:
    """The engines the home placed nodes on (the docker backend's record, <home>/docker-engines.json)
    that are not among `stored` machines: address -> TLS files. What a cleanup reaches without the
    machines' registry (its state database gone, or a machine forgotten while its nodes were left)."""
    try:
        record = json.loads((home.root / ENGINES_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    known = {m.address for m in stored}
    return {address: TlsFiles(*tls) if tls else None for address, tls in record.items() if address not in known}


def plan_forget_lost(home: Home, store: Any) -> list[Action]:
    """Before the nodes' cleanup: the swarm entries of machines this home joined that are lost (the
    swarm says down, or their engine does not answer). A lost node's overlay attachments stay in
    the swarm and keep the overlays from being removed until its entry goes. `store` None: the
    state database is gone; the engines are those the home recorded."""
    stored = registry.stored(store) if store is not None else []
    if not stored and not recorded_engines(home, stored):
        return []
    local = connect()
    if not (local.info().get("Swarm") or {}).get("ControlAvailable"):
        return []
    lost = {m.name for m in stored if not _answers(m)}
    return [Action("remove", "swarm node", node.id[:12], {"machine": labels.get(f"{LABEL}.machine", "?"),
                                                          "why": "a machine amlemu joined; it is lost"},
                   run=functools.partial(node.remove, force=True))
            for node in local.nodes.list() for labels in [node.attrs["Spec"].get("Labels") or {}]
            if labels.get(f"{LABEL}.home") == home.id
            and (node.attrs["Status"]["State"] == "down" or labels.get(f"{LABEL}.machine") in lost)]


def _answers(machine: registry.Machine) -> bool:
    try:
        engines.connect(machine.address, machine.tls).close()
    except AmlEmuError:
        return False
    return True


def plan_reap(home: Home, store: Any) -> list[Action]:
    """The swarm's part of a cleanup (machines.swarm.plan_reap) on this machine's engine and every
    machine of the home: the home's overlays, then the swarm amlemu made where nothing else uses it.
    Nothing where the home has no other machine; a machine whose engine does not answer is kept.
    The machines are the registry's and every engine the home recorded placing nodes on: `store`
    None (the state database gone: cleanup's reaper) leaves the latter alone."""
    stored = registry.stored(store) if store is not None else []
    others = [(m.name, m.address, m.tls) for m in stored] + \
        [(f"engine {address}", address, tls) for address, tls in recorded_engines(home, stored).items()]
    if not others:
        return []
    clients: dict[str, Any] = {registry.LOCAL: connect()}
    kept = []
    for name, address, tls in others:
        try:
            clients[name] = engines.connect(address, tls)
        except AmlEmuError as exc:
            kept.append(Action("keep", "swarm membership", name, {"why": str(exc)}))
    listed = swarm.plan_reap(clients, home.id)
    if not listed:
        return kept
    # Carried out as found when it runs, as hostguard's: the nodes' cleanup before it (a lost
    # machine's swarm entry removed) changes what still uses the swarm.
    return kept + [Action("reap", "swarm", registry.LOCAL, {"steps": [a.line() for a in listed]},
                          run=lambda: execute(swarm.plan_reap(clients, home.id)) or False)]
