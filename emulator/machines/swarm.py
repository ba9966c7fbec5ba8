"""Docker Swarm as amlemu uses it: only for its network. A swarm joins the machines' engines; each
cluster that spans machines gets one attachable overlay network (VXLAN, swarm scope) that plain
node containers on every engine join and reach each other on by name. No swarm services.

amlemu never takes over a swarm it did not make: `ensure_swarm` uses an existing one as it is, and
one amlemu makes carries the labels amlemu=1 and amlemu.home=<home id> in its spec (the record of
who made it lives on the engine, so any home's cleanup can tell). Only such a swarm is ever left,
and only when nothing else uses it (`plan_reap`). Worker nodes amlemu joins get the same labels.
"""
from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from amlemu.actions import Action
from amlemu.backends.base import LABEL
from amlemu.backends.dockerapi import until_gone
from amlemu.errors import BackendError

SWARM_PORT = 2377  # the managers' API (tcp); gossip is 7946 tcp+udp, VXLAN data 4789 udp
# A worker's heartbeat to the manager (Docker's default 5 s): the manager marks a machine down after
# about 3 missed ones, and a run on a machine cut off ends then (runs/machinewatch.py): ~7 s, not ~20.
HEARTBEAT_S = 2
GWBRIDGE = "docker_gwbridge"  # the bridge a swarm makes on each engine for its overlays' way out
INGRESS = "ingress"  # the overlay every swarm has (routing mesh): goes with the swarm
INGRESS_SANDBOX = "gateway_ingress-sbox"  # its endpoint on each engine's docker_gwbridge


def labels(home_id: str) -> dict[str, str]:
    return {LABEL: "1", f"{LABEL}.home": home_id}


@dataclass(frozen=True)
class SwarmState:
    """The swarm an engine manages: whether amlemu made it (now or before), where workers join."""

    node_id: str
    made_by_amlemu: bool
    created_now: bool
    manager_addr: str  # host:port a worker joins
    worker_token: str

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "made_by_amlemu": self.made_by_amlemu, "created_now": self.created_now,
                "manager_addr": self.manager_addr}  # the token is a credential: never printed


@dataclass(frozen=True)
class Overlay:
    id: str
    name: str
    encrypted: bool
    note: str | None  # why it is not encrypted though asked to be


def init_spec(advertise_addr: str, home_id: str) -> dict[str, Any]:
    """The arguments of swarm init (pure): listening on the advertised address only, not on every
    interface of the machine, and labelled as amlemu's."""
    return {"advertise_addr": advertise_addr, "listen_addr": f"{advertise_addr}:{SWARM_PORT}",
            "labels": labels(home_id), "dispatcher_heartbeat_period": HEARTBEAT_S * 10**9}  # nanoseconds


def join_spec(token: str, manager_addr: str, advertise_addr: str) -> dict[str, Any]:
    """The arguments of swarm join (pure)."""
    return {"remote_addrs": [manager_addr], "join_token": token, "advertise_addr": advertise_addr,
            "listen_addr": f"{advertise_addr}:{SWARM_PORT}"}


def overlay_spec(name: str, net_labels: Mapping[str, str], encrypted: bool, note: str | None) -> dict[str, Any]:
    """The arguments of the overlay network's create (pure): attachable (plain containers join it),
    swarm scope; with `note`, why encryption was asked for and not given, kept in its labels."""
    record = {**net_labels, f"{LABEL}.encrypted": "1" if encrypted else "0",
              **({f"{LABEL}.encryption_note": note} if note else {})}
    return {"name": name, "driver": "overlay", "attachable": True, "check_duplicate": True, "labels": record,
            "options": {"encrypted": "true"} if encrypted else {}}


def ipsec_probe_argv() -> list[str]:
    """An ESP security association of the kind an encrypted overlay uses (AES-GCM, rfc4106), added
    in a throwaway network namespace: it fails where the kernel lacks IPsec (pure)."""
    return [shutil.which("unshare") or "unshare", "--net", "--", shutil.which("ip") or "ip", "xfrm", "state", "add",
            "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "spi", "0x100", "reqid", "1", "mode", "transport",
            "aead", "rfc4106(gcm(aes))", "0x" + "11" * 20, "64"]


@functools.cache
def ipsec_missing() -> str | None:
    """Why this machine's kernel cannot carry an encrypted overlay, or None where it can. An
    encrypted overlay is made without complaint where it cannot: its packets are then dropped."""
    try:
        done = subprocess.run(ipsec_probe_argv(), capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the IPsec probe could not run ({exc})"
    if done.returncode == 0:
        return None
    return f"the kernel lacks IPsec (ESP with AES-GCM): {(done.stderr or done.stdout).strip() or done.returncode}"


def _swarm_attrs(client: Any) -> dict[str, Any]:
    client.swarm.reload()
    return dict(client.swarm.attrs)


def ensure_swarm(manager_client: Any, advertise_addr: str, home_id: str) -> SwarmState:
    """The engine's swarm: initialised (labelled as amlemu's) where the engine is in none, else the
    one it manages, as it is. An engine that is only a worker of someone's swarm cannot host
    overlays for amlemu: refused."""
    info = manager_client.info().get("Swarm") or {}
    state = info.get("LocalNodeState", "inactive")
    created = False
    if state == "inactive":
        manager_client.swarm.init(**init_spec(advertise_addr, home_id))
        created = True
    elif not info.get("ControlAvailable"):
        raise BackendError(f"the engine is a worker of a swarm amlemu did not make (state {state}); make it a "
                           f"manager (`docker node promote`) or use an engine outside any swarm")
    attrs = _swarm_attrs(manager_client)
    info = manager_client.info()["Swarm"]
    addr = (info.get("RemoteManagers") or [{}])[0].get("Addr") or f"{advertise_addr}:{SWARM_PORT}"
    return SwarmState(node_id=info["NodeID"], made_by_amlemu=(attrs["Spec"].get("Labels") or {}).get(LABEL) == "1",
                      created_now=created, manager_addr=addr, worker_token=attrs["JoinTokens"]["Worker"])


def join(worker_client: Any, token: str, manager_addr: str, advertise_addr: str) -> str:
    """Join an engine to the swarm as a worker (idempotent: an engine already in it stays); its node id."""
    info = worker_client.info().get("Swarm") or {}
    if info.get("LocalNodeState") != "active":
        worker_client.swarm.join(**join_spec(token, manager_addr, advertise_addr))
        info = worker_client.info()["Swarm"]
    return str(info["NodeID"])


def label_node(manager_client: Any, node_id: str, home_id: str) -> None:
    """Mark a node amlemu joined, so a cleanup can remove its entry once it is gone."""
    node = manager_client.nodes.get(node_id)
    spec = dict(node.attrs["Spec"])
    spec["Labels"] = {**(spec.get("Labels") or {}), **labels(home_id)}
    node.update(spec)


def leave(client: Any) -> bool:
    """Take an engine out of its swarm (forced: a last manager destroys the swarm); False if in none."""
    if (client.info().get("Swarm") or {}).get("LocalNodeState", "inactive") == "inactive":
        return False
    client.swarm.leave(force=True)
    return True


def create_overlay(client: Any, name: str, net_labels: Mapping[str, str], encrypted: bool) -> Overlay:
    """A cluster's attachable overlay on a swarm manager; encrypted where asked and this machine's
    kernel can (else plain, with the reason kept in the network's labels)."""
    note = ipsec_missing() if encrypted else None
    spec = overlay_spec(name, net_labels, encrypted and note is None, note)
    network = client.networks.create(**spec)
    return Overlay(id=str(network.id), name=name, encrypted=encrypted and note is None, note=note)


def remove_overlay(client: Any, name_or_id: str) -> bool:
    """Remove an overlay network; False if it was gone."""
    import docker  # noqa: PLC0415 - the SDK is loaded by whoever made `client`

    try:
        client.networks.get(name_or_id).remove()
    except docker.errors.NotFound:
        return False
    return True


def _remove_gwbridge(client: Any) -> Any:
    def run() -> bool:
        import docker  # noqa: PLC0415

        try:
            network = client.networks.get(GWBRIDGE)
        except docker.errors.NotFound:
            return False
        # The swarm's ingress sandbox may stay on the bridge after the engine left the swarm ("has
        # active endpoints"): Docker's docs on docker_gwbridge disconnect it by force first.
        with contextlib.suppress(docker.errors.APIError):
            network.disconnect(INGRESS_SANDBOX, force=True)
        until_gone(network.remove)
        return True
    return run


def plan_reap(clients: Mapping[str, Any], home_id: str | None) -> list[Action]:
    """What cleanup does to the swarm on every machine (`clients`: machine name -> engine client):
    remove the overlay networks labelled as the home's (every amlemu home's with None), then, on a
    swarm amlemu made that nothing else uses (no service, no other overlay, no other live node),
    take every engine here out of it and remove the gateway bridges the swarm made. A swarm amlemu
    did not make keeps running; of it only the entries of nodes amlemu joined that are down go."""
    selector = {"label": f"{LABEL}.home={home_id}" if home_id else f"{LABEL}=1", "driver": "overlay"}
    infos = {machine: client.info().get("Swarm") or {} for machine, client in clients.items()}
    plan: list[Action] = []
    for machine, client in clients.items():
        if not infos[machine].get("ControlAvailable"):
            continue  # a worker's overlays are the manager's to remove
        networks = client.networks.list(filters=selector)
        plan += [Action("remove", "overlay network", n.name, {"machine": machine},
                        run=lambda c=client, i=n.id: remove_overlay(c, i)) for n in networks]
        plan += _plan_swarm(machine, client, {n.id for n in networks}, clients, infos)
    return plan


def _plan_swarm(machine: str, client: Any, removed: set[str], clients: Mapping[str, Any],
                infos: Mapping[str, dict[str, Any]]) -> list[Action]:
    """The swarm managed by `client`: left whole when amlemu's and unused; else only amlemu's down nodes."""
    attrs = _swarm_attrs(client)
    nodes = client.nodes.list()
    self_id = infos[machine]["NodeID"]
    listed = {n.id for n in nodes}
    # Its workers: listed by the manager, or whose own record names this manager (an entry the
    # manager forgot, e.g. removed while the machine was cut off, still leaves it joined).
    workers = {m: infos[m]["NodeID"] for m in clients if m != machine and infos[m].get("NodeID")
               and (infos[m]["NodeID"] in listed or any(r.get("NodeID") == self_id
                                                         for r in infos[m].get("RemoteManagers") or []))}
    if (attrs["Spec"].get("Labels") or {}).get(LABEL) != "1":
        return [Action("remove", "swarm node", n.id, {"machine": machine, "why": "amlemu joined it; it is down"},
                       run=lambda n=n: n.remove(force=True)) for n in nodes
                if (n.attrs["Spec"].get("Labels") or {}).get(LABEL) == "1" and n.attrs["Status"]["State"] == "down"
                and n.id not in workers.values()]
    users = [f"service {s.name}" for s in client.services.list()]
    users += [f"network {n.name}" for n in client.networks.list(filters={"driver": "overlay"})
              if n.name != INGRESS and n.id not in removed]
    users += [f"node {n.attrs['Description'].get('Hostname', n.id)} ({n.id[:12]})" for n in nodes
              if n.id != self_id and n.id not in workers.values() and n.attrs["Status"]["State"] != "down"]
    if users:
        return [Action("keep", "swarm", machine, {"why": "still used by " + ", ".join(users)})]
    plan = [Action("leave", "swarm", m, {"as": "worker"}, run=lambda c=clients[m]: leave(c)) for m in workers]
    plan.append(Action("leave", "swarm", machine, {"as": "manager: the swarm amlemu made ends"},
                       run=lambda: leave(client)))
    return plan + [Action("remove", "network", GWBRIDGE, {"machine": m}, run=_remove_gwbridge(clients[m]))
                   for m in (*workers, machine)]
