"""The docker backend past one machine (issue 31): a client per Docker engine, and what differs for
a node on another machine's engine.

A NodeRequest names its node's engine (`engine`: "" is this machine's, docker.from_env; else
another machine's address, placed by the cluster layer). Each engine the home places a node on is
recorded in <home>/docker-engines.json before its first node is made, so that the reaper finds
what is left on every engine, the lost ones' records included, without the machines' registry
(which sits above the backends).

On another machine's engine:
- the launch agent's `docker exec` is addressed to it (`engine_options`: -H and the TLS files);
- a node's host pids are not this machine's: its processes are stopped from inside the node
  (`stop_argv`), its scratch emptied there, and the pids memwatch and the CPU groups read are none
  (recorded: `REMOTE_NOTE`);
- its nodes reach this machine at the machine record's service address (`service_address`), and
  their traffic is told apart by its advertise address (backends/hostguard.py's remote rules).
"""
from __future__ import annotations

import fcntl
import functools
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu import statefile
from amlemu.backends import hostguard
from amlemu.actions import Action
from amlemu.backends.base import LABEL, NodeInfo, NodeRequest
from amlemu.backends.dockerapi import connect, listed_name, until_gone
from amlemu.errors import BackendError

RECORD = "docker-engines.json"  # in the home (DockerBackend.engines): every other engine it placed a node on
ANY_ADDRESS = "0.0.0.0/0"
GWBRIDGE = "docker_gwbridge"  # where a swarm's overlay containers leave their engine (this machine's bridge)
REMOTE_NOTE = "a node on another machine's engine: its processes are not this machine's (no memory or CPU-group reading)"
# Kill every process in the node but its init and the idle sleep, from inside it (pid 1 is tini); a
# `sleep infinity` only where the platform started it (CAP_AUDIT_WRITE, bit 29, in its bounding set:
# dockerapi.platform_started).
STOP_SCRIPT = ('n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
               'c=$(tr "\\0" " " < "$d/cmdline" 2>/dev/null) || continue; [ -z "$c" ] && continue; '
               'case "$c" in "/bin/sleep infinity "|"sleep infinity ") '
               'b=$(sed -n "s/^CapBnd:[[:space:]]*//p" "$d/status" 2>/dev/null); '
               '[ -n "$b" ] && [ $((0x$b >> 29 & 1)) = 1 ] && continue;; esac; '
               'kill -9 "$p" 2>/dev/null && n=$((n+1)); done; echo "$n"')


def local_dockerd() -> str | None:
    """This machine's dockerd as "pid:start time" (its pid file), or None where that is not known (DOCKER_HOST)."""
    if os.environ.get("DOCKER_HOST"):
        return None
    try:
        pid = int(Path("/var/run/docker.pid").read_text())
        return f"{pid}:{Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[19]}"
    except (OSError, ValueError, IndexError):
        return None


def engine_options(address: str, tls: tuple[str, str, str] | list[str] | None) -> list[str]:
    """The docker CLI's options that address the engine at `address` ("": this machine's; pure)."""
    if not address:
        return []
    options = ["-H", address]
    if tls:
        ca, cert, key = tls
        options += ["--tlsverify", "--tlscacert", ca, "--tlscert", cert, "--tlskey", key]
    return options


def stop_argv() -> list[str]:
    """What a node on another engine runs to kill its job's processes (pure); prints how many."""
    return ["/bin/sh", "-c", STOP_SCRIPT]


class Engines:
    """One client per engine address, made on first use; the addresses used recorded in the home."""

    def __init__(self, record: Path, facts: Path | None = None) -> None:
        self.record, self.facts = record, facts  # facts: this machine's engine's (a machine's cache, not a home's)
        self._clients: dict[str, Any] = {}
        self._parents: dict[str, str] = {}  # each engine's cgroup parent for nodes ("": the engine's own)
        self._asking = threading.Lock()
        self._lock = threading.Lock()
        self._cut: set[str] = set()  # engines of machines cut off from this one (cut_off)

    def cut_off(self, address: str) -> None:
        """The engine's machine is cut off (runs/machinewatch.py): no call waits on it any more. A
        pooled connection to it would wait out the client's timeout (30 s) on every first call."""
        with self._lock:
            self._cut.add(address)
            client = self._clients.pop(address, None)
        if client is not None:
            client.close()

    def client(self, address: str = "", tls: tuple[str, str, str] | None = None) -> Any:
        with self._lock:
            if address in self._cut:
                raise BackendError(f"the Docker engine at {address} is on a machine cut off from this one")
            if address not in self._clients:
                if address:
                    self._remember(address, tls)
                self._clients[address] = connect(address, tls, version=self._facts().get("version") if not address else None)
            return self._clients[address]

    def cgroup_parent(self, address: str = "") -> str | None:
        """Nodes' cgroup parent: "/" where the engine names cgroups by path (cgroupfs: see
        dockerplan.CPU_WEIGHT); None under systemd's driver, whose own slice (system.slice) is kept."""
        with self._asking:  # asked once an engine (nodes are planned and made in parallel)
            if address not in self._parents:
                self._parents[address] = "/" if self.cgroup_driver(address) == "cgroupfs" else ""
            return self._parents[address] or None

    def cgroup_driver(self, address: str = "") -> str:
        """The engine's cgroup driver (cgroupfs or systemd): this machine's from what was noted of the
        dockerd running now (a submit's supervisor otherwise spends ~7 ms asking), another's asked."""
        if not address and (noted := self._facts().get("cgroup_driver")):
            return str(noted)
        client = self.client(address)
        driver = str(client.info().get("CgroupDriver", ""))
        if not address and self.facts and (running := local_dockerd()):
            statefile.write_json(self.facts, {"dockerd": running, "version": client.api._version,
                                              "cgroup_driver": driver})
        return driver

    def _facts(self) -> dict[str, Any]:
        """What was noted of this machine's engine, if the same dockerd still runs."""
        try:
            facts = json.loads(self.facts.read_text()) if self.facts else None
        except (OSError, ValueError):
            return {}
        return facts if isinstance(facts, dict) and facts.get("dockerd") == local_dockerd() else {}

    def _remember(self, address: str, tls: tuple[str, str, str] | None) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        with open(self.record.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = self.recorded()
            if address not in known or known[address] != (list(tls) if tls else None):
                known[address] = list(tls) if tls else None
                self.record.write_text(json.dumps(known, indent=1))

    def recorded(self) -> dict[str, list[str] | None]:
        """Other engines this home placed nodes on: address -> TLS files."""
        try:
            return dict(json.loads(self.record.read_text()))
        except (OSError, ValueError):
            return {}

    def every(self) -> list[tuple[str, Any]]:
        """(address, client) of this machine's engine and of every recorded one that answers now;
        one that does not is listed with None (its nodes are unreachable, not gone)."""
        found: list[tuple[str, Any]] = [("", self.client())]
        for address, tls in self.recorded().items():
            try:
                found.append((address, self.client(address, tuple(tls) if tls else None)))
            except BackendError:
                found.append((address, None))
        return found


def gateway(client: Any, network: str) -> str | None:
    """The gateway of `network` on `client`'s engine: its host as the network's containers reach it."""
    try:
        configs = client.networks.get(network).attrs.get("IPAM", {}).get("Config") or []
    except Exception:  # noqa: BLE001 - not there (yet)
        return None
    return next((c["Gateway"] for c in configs if c.get("Gateway")), None)


def on(address: str) -> dict[str, str]:
    """A reaping step's detail: the engine, where it is not this machine's."""
    return {"engine": address} if address else {}


def overlays(client: Any, home_id: str, cluster: str) -> list[Any]:
    """The cluster's overlay networks on this machine's engine (their swarm's manager)."""
    selector = {"label": [f"{LABEL}.home={home_id}", f"{LABEL}.cluster={cluster}"], "driver": "overlay"}
    return client.networks.list(filters=selector)


def stop_inside(container: Any) -> int:
    """Kill a node's job processes from inside it (another machine's engine); how many."""
    code, out = container.exec_run(stop_argv(), user="0")
    try:
        return int(out.decode().split()[-1]) if code == 0 else 0
    except (ValueError, IndexError):
        return 0


def guard_note(request: NodeRequest, network_id: str | None) -> str:
    """What the dry run says of the guard of a node's way to this machine."""
    if not request.overlay:
        return hostguard.note(network_id)
    if request.engine:
        why = hostguard.supported("lo")
        return (f"this machine refuses machine {request.machine}'s traffic (from its advertise address) but the "
                "swarm's ports and each run's opened ones (iptables INPUT rules)") if why is None else \
            f"nodes on machine {request.machine} reach services listening on this machine's interfaces: {why}"
    return hostguard.note(None).replace("the cluster's bridge", f"{GWBRIDGE} (shared by the swarm's overlays)")


def guard(request: NodeRequest, home_id: str) -> None:
    """Close this machine to an overlay node: on the swarm's gateway bridge here, or, for a node on
    another machine, to that machine's traffic (its advertise address), the swarm's ports left open."""
    if request.engine:
        if request.advertise and hostguard.supported("lo") is None:
            hostguard.close_source(request.advertise, home_id, request.cluster)
    elif hostguard.supported(GWBRIDGE) is None:
        hostguard.close(GWBRIDGE, home_id, request.cluster)


def open_port(request: NodeRequest, gateway_here: str | None, port: int, home_id: str, run_id: str) -> None:
    """A port a run opened (its service link, mpirun's), for every way in of the cluster's overlay
    nodes: this machine's gateway bridge (where `gateway_here` is its gateway), and each other machine the
    cluster is closed to (the supervisor opens mpirun's port for node 0 alone, on any machine)."""
    if hostguard.supported("lo") is not None:
        return
    if gateway_here and hostguard.supported(GWBRIDGE) is None:
        # At every address of this machine: mpirun publishes them all to daemons that have no interface
        # on this machine's networks (callback_mca), and a daemon refused at each address but the
        # gateway's retried, 1-2 s of a launch. Only what listens at that port answers (mpirun, or the
        # service link at the gateway alone).
        hostguard.open_port(GWBRIDGE, ANY_ADDRESS, port, home_id, request.cluster, run_id)
    for source in {*hostguard.sources(home_id, request.cluster), *([request.advertise] if request.engine else [])}:
        hostguard.open_source_port(source, None, port, home_id, request.cluster, run_id)


def node_env(client: Any, request: NodeRequest) -> dict[str, str]:
    """An overlay node's Open MPI talks to the other ranks on the overlay only: its other interface
    (the engine's gateway bridge) has an address of that engine's, which another engine may reuse."""
    if not request.overlay:
        return {}
    try:
        subnet = next(c["Subnet"] for c in client.networks.get(request.overlay).attrs["IPAM"]["Config"])
    except Exception:  # noqa: BLE001 - not made yet (a dry run)
        return {}
    return {"OMPI_MCA_btl_tcp_if_include": subnet}


def extra_hosts(service_host: str, address: str | None) -> dict[str, str | None]:
    """A node's hosts entries: the run's service link, and this machine's own name at the same
    address. mpirun runs here, and its daemons on the nodes look its host up by name: a name the
    node's DNS does not know cost each lookup the resolver's timeouts where the node's engine has no
    reachable resolver (10 s a family on the rig's nodes: 5-6 s of every warm launch across machines)."""
    return {service_host: address, **({socket.gethostname(): address} if address else {})}


def list_nodes(listed: list[tuple[str, list[dict]]]) -> list[NodeInfo]:
    """The nodes from each engine's labelled containers ((address, list entries); pure)."""
    found = []
    for address, containers in listed:
        for c in containers:
            labels = c["Labels"]
            if f"{LABEL}.node" not in labels:  # a volume's filler (shipping.py), made and removed in a step
                continue
            networks = (c.get("NetworkSettings") or {}).get("Networks") or {}
            ip = next(iter(networks.values())).get("IPAddress") if networks else None
            found.append(NodeInfo(cluster=labels[f"{LABEL}.cluster"], name=labels[f"{LABEL}.node"],
                                  index=int(labels[f"{LABEL}.index"]), running=c["State"] == "running",
                                  address=ip or None, detail={"container": listed_name(c), "status": c["State"],
                                                              **on(address)}))
    return sorted(found, key=lambda n: (n.cluster, n.index))


def plan_reap(every: list[tuple[str, Any]], label: str, labelled: Callable[..., list[dict]],
              remove_container: Callable[..., None]) -> list[Action]:
    """On every engine (dockerengines.Engines.every): the containers labelled `label`, then the
    networks (overlays on this machine's engine, their swarm's manager; a worker's view of one is not
    removable), then the volumes (shipped nodes' disks: shipping.py); an engine that does not answer
    is kept, and said so."""
    lost = [Action("keep", "engine", address, {"why": "it does not answer; run cleanup again once it does"})
            for address, client in every if client is None]
    containers = [Action("remove", "container", listed_name(c), {"home": c["Labels"].get(f"{LABEL}.home"),
                                                                  "status": c["State"], **on(address)},
                         run=functools.partial(remove_container, c["Id"], client))
                  for address, client in every if client for c in labelled(label, client)]
    networks = [Action("remove", "network", n.name, {"home": (n.attrs.get("Labels") or {}).get(f"{LABEL}.home"),
                                                     **on(address)}, run=functools.partial(until_gone, n.remove))
                for address, client in every if client for n in client.networks.list(filters={"label": label})
                if not (address and n.attrs.get("Driver") == "overlay")]
    volumes = [Action("remove", "volume", v.name, {"home": (v.attrs.get("Labels") or {}).get(f"{LABEL}.home"),
                                                   **on(address)}, run=functools.partial(until_gone, v.remove))
               for address, client in every if client for v in client.volumes.list(filters={"label": label})]
    return lost + containers + networks + volumes


def answering(labelled: Callable[..., list[dict]], label: str, client: Any) -> list[dict]:
    """An engine's labelled containers; none where it stopped answering (a machine lost: its nodes
    are gone as far as a run can tell, as AmlCompute reports a node it lost)."""
    import docker  # noqa: PLC0415
    import requests  # noqa: PLC0415 - the SDK's transport

    try:
        return labelled(label, client)
    except (docker.errors.APIError, requests.exceptions.RequestException, OSError):
        return []


def lost(request: NodeRequest, exc: BaseException) -> bool:
    """Whether `exc` says the node's machine's engine (another machine's) does not answer."""
    import requests  # noqa: PLC0415 - the SDK's transport

    return bool(request.engine) and isinstance(exc, (BackendError, requests.exceptions.ConnectionError, OSError))


def find(get: Callable[[], Any], request: NodeRequest) -> Any:
    """The node's container, or None where it is gone or its machine's engine is lost."""
    import docker  # noqa: PLC0415

    try:
        return get()
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, docker.errors.NotFound) or lost(request, exc):
            return None
        raise


ATTACH_FAILED = "attaching to network failed"  # a swarm's attachment not ready in time (a busy manager)


def start(api: Any, container_id: str, retry: bool) -> None:
    """Start a created container; on an overlay, once more where the swarm was slow to attach it."""
    import docker  # noqa: PLC0415

    try:
        api.start(container_id)
    except docker.errors.APIError as exc:
        if not retry or ATTACH_FAILED not in str(exc.explanation or exc):
            raise
        api.start(container_id)
