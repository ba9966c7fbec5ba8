"""Docker backend: each node is a container on its cluster's own bridge network.

No registry is reachable where this runs, so when the job names no image the engine already has,
nodes use an offline "host mirror" image: an empty root file system (imported once) that sees this
machine's /usr, Python and virtual environment read-only (its own root is read-only too, with
private tmpfs folders that are emptied after each run). Containers are unprivileged, never see the
Docker socket or the workspace's other runs (only the node's own disk), and carry labels from which
state is rebuilt and leftovers are reaped.

A node with GPUs gets exactly its own: through the engine's NVIDIA runtime (device requests) where
one is installed, else (Debian's docker.io has none, and no registry here serves NVIDIA's toolkit)
as the nvidia-container-toolkit did before device requests: its GPUs' /dev/nvidia<minor> and the
driver's control devices, the driver's libraries being on the mirrored /usr. CUDA in the node then
enumerates only those GPUs, numbered from 0.
"""
from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from typing import Any

from amlemu.actions import Action
from amlemu.backends import cpugroup, dockerengines as engines, hostguard, nodedisk, overlaypeers, shipping
from amlemu.backends.mirrorfs import mirror_rootfs
from amlemu.backends.dockerexec import ensure_server, exec_argv, resident, setpriv_path
from amlemu.backends.dockerapi import cgroup_pids, connect, empty_scratch, has_image, kill_job_processes, until_gone
from amlemu.backends.dockerplan import CPU_PERIOD, CPU_WEIGHT, MIRROR_IMAGE, SCRATCH, ContainerPlan, container_plan
from amlemu.backends.base import LABEL, NODE_ROOT, SERVICE_HOST, NodeBackend, NodeInfo, NodeRequest
from amlemu.errors import BackendError
from amlemu.home import default_cache


class DockerBackend(shipping.Shipped, NodeBackend):  # Shipped: nodes on another host
    name = "docker"
    auto_priority = 10  # the closest to AmlCompute: `auto` takes it when an engine answers
    can_partition = can_slow = enforces_limits = True  # its own bridge network; a CFS quota, a memory limit
    guards_host = True  # its nodes reach this machine only where a run opened a port (hostguard.py)

    def __init__(self, home) -> None:  # type: ignore[no-untyped-def]
        super().__init__(home)
        self.engines = engines.Engines(home.root / "docker-engines.json",  # one client per machine's engine
                                       default_cache() / "docker-engine-facts.json")
        self._lock = threading.Lock()  # nodes are created in parallel; image and network once
        self._pids: dict[str, int] = {}  # container -> its init's pid, as last inspected

    @property
    def client(self):  # type: ignore[no-untyped-def]
        return self.engines.client()  # this machine's engine

    def engine(self, request: NodeRequest):  # type: ignore[no-untyped-def]
        """The engine of the node's machine (issue 31; this machine's unless placed elsewhere)."""
        return self.engines.client(request.engine, request.engine_tls)

    def cut_off(self, request: NodeRequest) -> None:
        if request.engine:
            self.engines.cut_off(request.engine)

    @staticmethod
    def nvidia_runtime() -> bool:
        """Whether the engine can honour GPU device requests: dockerd registers its `gpu` device
        driver when NVIDIA's container toolkit hook is on its PATH (the engine runs on this machine)."""
        return bool(shutil.which("nvidia-container-runtime-hook"))

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            version = connect().version().get("Version", "?")
        except BackendError as exc:
            return False, str(exc)
        return True, f"Docker engine {version}"

    @classmethod
    def agent_tools(cls) -> dict[str, str]:
        return {"docker": found} if (found := shutil.which("docker")) else {}

    @classmethod
    def agent_argv(cls, config: dict[str, Any], host: str, command: str) -> list[str]:
        """`docker exec -i` into the node's container (dockerexec.py: why below the kept processes' capabilities)."""
        entry = config["hosts"][host]  # -H: a node on another machine's engine (dockerengines.py)
        return exec_argv(config["tools"]["docker"], engines.engine_options(entry.get("engine", ""), entry.get("tls")),
                         entry["container"], entry.get("setpriv"), config["env_file"], command)

    @classmethod
    def agent_resident(cls, config: dict[str, Any], host: str, command: str) -> dict[str, Any] | None:
        entry = config["hosts"][host]  # the node's resident agent, where it has one (dockerexec.py)
        return resident(entry["server"], entry["setpriv"], config["env_file"], command) if entry.get("server") else None

    # --- names -------------------------------------------------------------------------------
    def container_name(self, request: NodeRequest) -> str:
        return f"amlemu-{self.home.id}-{request.name}"

    def network_name(self, cluster: str) -> str:
        return f"amlemu-{self.home.id}-{cluster}"

    def has_image(self, image: str, client=None) -> bool:  # type: ignore[no-untyped-def]
        return has_image(client or self.client, image)

    # --- the dry run -------------------------------------------------------------------------
    def plan_node(self, request: NodeRequest, built_image: str | None = None) -> ContainerPlan:
        client = self.engine(request)
        use_job_image = bool(request.image) and (request.image == built_image or self.has_image(request.image, client))
        networks = [] if request.overlay else self._networks(request.cluster)
        return container_plan(request, use_job_image, self.nvidia_runtime() if request.gpus else False,
                              self.container_name(request), request.overlay or self.network_name(request.cluster),
                              engines.guard_note(request, networks[0].id if networks else None),
                              self.engines.cgroup_parent(request.engine))

    # --- execution ---------------------------------------------------------------------------
    def _ensure_image(self, image: str, client=None) -> None:  # type: ignore[no-untyped-def]
        client = client or self.client
        if image == MIRROR_IMAGE and not self.has_image(image, client):
            repository, tag = image.split(":")
            client.api.import_image_from_data(mirror_rootfs(), repository=repository, tag=tag,
                                                   changes=[f"LABEL {LABEL}=1"])

    def ensure_mirror_image(self) -> None:
        """Import the offline node image if the engine lacks it (what a compose file's `up` needs)."""
        with self._lock:
            self._ensure_image(MIRROR_IMAGE)

    def _ensure_network(self, name: str, cluster: str) -> str:
        """The cluster's network, made if missing; its id."""
        found = self._networks(cluster)
        if found:
            return str(found[0].id)
        return str(self.client.networks.create(name, driver="bridge", check_duplicate=True,
                                               labels={LABEL: "1", f"{LABEL}.home": self.home.id,
                                                       f"{LABEL}.cluster": cluster}).id)

    def _guard(self, network_id: str, cluster: str) -> None:
        """This machine closed to the cluster's nodes (backends/hostguard.py), where it can be."""
        bridge = hostguard.bridge_name(network_id)
        if hostguard.supported(bridge) is None:
            hostguard.close(bridge, self.home.id, cluster)

    def create_node(self, request: NodeRequest) -> str:
        import docker  # noqa: PLC0415

        plan = self.plan_node(request)
        nodedisk.attach(request.node_dir, nodedisk.size(request.disk_bytes)[0])  # before the bind
        (request.cache_dir / "data").mkdir(parents=True, exist_ok=True)
        client = self.engine(request)
        with self._lock:
            self._ensure_image(plan.image, client)
            if request.ships_files:  # its volumes' fillers run the mirror image (shipping.py)
                self._ensure_image(MIRROR_IMAGE, client)
            # Guarded with every node (idempotent): a network made before guards existed gets one too.
            if request.overlay:  # made before the nodes, on the swarm (cluster/spanning.py)
                engines.guard(request, self.home.id)
            else:
                self._guard(self._ensure_network(plan.network, request.cluster), request.cluster)
        api = client.api
        device_requests = [docker.types.DeviceRequest(device_ids=list(plan.gpus), capabilities=[["gpu"]])] \
            if plan.gpu_access == "device_requests" else None
        host_config = api.create_host_config(
            binds=plan.volumes, cpu_period=plan.cpu_period, cpu_quota=plan.cpu_quota, mem_limit=plan.mem_limit,
            shm_size=plan.shm_size, init=plan.init, device_requests=device_requests,
            cpu_shares=plan.cpu_shares, cgroup_parent=plan.cgroup_parent,
            devices=list(plan.devices) or None,
            read_only=plan.read_only, tmpfs=plan.tmpfs, security_opt=list(plan.security_opt),
            extra_hosts=engines.extra_hosts(SERVICE_HOST, self.host_address(request)))  # the run's service link
        networking = api.create_networking_config(
            {plan.network: api.create_endpoint_config(aliases=list(plan.aliases))})
        try:
            if request.ships_files:
                shipping.make_volumes(client, request, plan.name, plan.volumes, plan.labels)
            created = api.create_container(
                plan.image, command=list(plan.command), name=plan.name, hostname=plan.hostname,
                labels=plan.labels, environment=plan.environment, host_config=host_config,
                networking_config=networking, detach=True)
            engines.start(api, created["Id"], retry=bool(request.overlay))
        except (docker.errors.APIError, BackendError) as exc:
            self.remove_node(request)
            raise BackendError(f"node {request.name} did not start: {getattr(exc, 'explanation', None) or exc}") from None
        attrs = api.inspect_container(created["Id"])
        self._pids[plan.name] = attrs["State"]["Pid"]
        return attrs["NetworkSettings"]["Networks"][plan.network]["IPAddress"]

    def remove_node(self, request: NodeRequest) -> None:
        import docker  # noqa: PLC0415

        try:
            self._remove_container(self.container_name(request), self.engine(request))
        except Exception as exc:  # noqa: BLE001 - gone; or its machine's engine lost: reaped once it answers
            if not isinstance(exc, docker.errors.NotFound) and not engines.lost(request, exc):
                raise
        if request.ships_files:
            engines.find(lambda: shipping.remove_volumes(self.engine(request), request), request)
        nodedisk.detach(request.node_dir)  # once no container binds it
        shutil.rmtree(request.cache_dir, ignore_errors=True)  # a new node starts with an empty cache

    def agent_entry(self, request: NodeRequest) -> dict[str, Any]:
        mirror, name = not request.image or not self.has_image(request.image, self.engine(request)), \
            self.container_name(request)
        if mirror and not request.engine:  # its resident agent (dockerplan.container_plan), by its init's pid
            pid = self._pids.get(name) or self._container(request).attrs["State"]["Pid"]
            return {"container": name, "setpriv": setpriv_path(), "server": ensure_server(self.client.api, name, pid)}
        return {"container": name, "setpriv": setpriv_path() if mirror else None,
                **({"engine": request.engine, "tls": request.engine_tls} if request.engine else {})}

    def fits(self, request: NodeRequest) -> bool:
        """/dev/shm is sized, the job's environment mounted and the hosts file written as a container is
        created (Azure ML: each job's container, --shm-size, its image; SERVICE_HOST: a node made before
        the service link had none). A job image's container is never kept for another job: its root
        is writable, and AmlCompute starts each job's container anew (dockerexec.py)."""
        try:
            client = self.engine(request)
            attrs = client.api.inspect_container(self.container_name(request))
            self._pids[attrs["Name"].lstrip("/")] = attrs["State"]["Pid"]  # for agent_entry, this run
            image = request.image if request.image and self.has_image(request.image, client) else MIRROR_IMAGE
            return attrs["HostConfig"]["ShmSize"] == request.shm_bytes and image == attrs["Config"]["Image"] == \
                MIRROR_IMAGE and attrs["Config"]["Labels"].get(f"{LABEL}.python_env", "") == (request.python_env or "") \
                and attrs["HostConfig"].get("CgroupParent", "") == (self.engines.cgroup_parent(request.engine) or "") and \
                any(h.startswith(f"{SERVICE_HOST}:") for h in attrs["HostConfig"].get("ExtraHosts") or [])
        except Exception:  # noqa: BLE001 - a container gone or unreadable: made again
            return False

    def until_peers_known(self, requests: list[NodeRequest], addresses: list[str], log: Callable[[str], None]) -> bool:
        return overlaypeers.for_nodes(self._container, requests, addresses, log)  # an overlay's gossip: overlaypeers.py

    def host_address(self, request: NodeRequest) -> str | None:
        """The cluster network's gateway: this machine as its nodes reach it (not its 127.0.0.1)."""
        if request.overlay:  # its way out of its engine, or this machine's address for another machine
            return request.service_address or engines.gateway(self.client, engines.GWBRIDGE)
        return self._cluster_gateway(request.cluster)[1]

    def _cluster_gateway(self, cluster: str) -> tuple[str, str | None]:
        """(id, gateway) of the cluster's network, made if missing: one engine call where it is there."""
        found = self._networks(cluster)
        if not found:
            with self._lock:
                self._ensure_network(self.network_name(cluster), cluster)
            found = self._networks(cluster)
        configs = found[0].attrs.get("IPAM", {}).get("Config") or []
        return found[0].id, next((c["Gateway"] for c in configs if c.get("Gateway")), None)

    def open_port(self, request: NodeRequest, run_id: str, port: int) -> None:
        if request.overlay:
            return engines.open_port(request, engines.gateway(self.client, engines.GWBRIDGE), port, self.home.id, run_id)
        network, address = self._cluster_gateway(request.cluster)
        bridge = hostguard.bridge_name(network)
        if address and hostguard.supported(bridge) is None:
            hostguard.open_port(bridge, address, port, self.home.id, request.cluster, run_id)

    def close_ports(self, request: NodeRequest, run_id: str) -> None:
        hostguard.remove(hostguard.comment(self.home.id, request.cluster, run_id))

    def node_env(self, request: NodeRequest) -> dict[str, str]:
        return engines.node_env(self.client, request)

    def reset_node(self, request: NodeRequest) -> None:
        """Empty the mirror image's scratch folders (its root is read-only, so these are all a run can
        leave in the container; dockerapi.empty_scratch; a job image's root is its own), and a node on
        another host's disk, which is its machine's (the run empties the staging copy here)."""
        container = engines.find(lambda: self.engine(request).containers.get(self.container_name(request)), request)
        folders = (SCRATCH if container and container.attrs["Config"]["Image"] == MIRROR_IMAGE else ()) + \
            ((NODE_ROOT,) if request.ships_files else ())
        if container is not None and container.status == "running" and folders:
            empty_scratch(container, folders, on_this_machine=not request.engine)

    def stop_processes(self, request: NodeRequest) -> int:
        """Kill, by host pid, every process in the container except its init and idle sleep."""
        container = engines.find(lambda: self.engine(request).containers.get(self.container_name(request)), request)
        if container is None or container.status != "running":  # gone, or its machine lost
            return 0
        if request.engine:  # its pids are another machine's
            return engines.stop_inside(container)
        return kill_job_processes(container)

    def node_pids(self, request: NodeRequest) -> Callable[[], list[int]]:
        try:  # found once from the container's init: no engine call per read; none on another machine
            return list if request.engine else cgroup_pids(self._container(request).attrs["State"]["Pid"])
        except (BackendError, OSError):
            return list

    def cpu_sharer(self, requests: list[NodeRequest]) -> cpugroup.Sharer | None:
        if any(r.engine for r in requests):  # another machine's processes (dockerengines.REMOTE_NOTE)
            return None
        try:  # each node's init, its processes, its nominal quota and weight (dockerplan.container_plan)
            return cpugroup.sharer_for(self.home.id, requests[0].cluster, {
                (pid := self._container(r).attrs["State"]["Pid"]): (cgroup_pids(pid), int(r.cpus * CPU_PERIOD),
                                                                   round(CPU_WEIGHT * r.cpu_share)) for r in requests})
        except (BackendError, OSError):  # a node gone meanwhile: its job is ending
            return None

    def _container(self, request: NodeRequest):  # type: ignore[no-untyped-def]
        import docker  # noqa: PLC0415

        try:
            return self.engine(request).containers.get(self.container_name(request))
        except docker.errors.NotFound:
            raise BackendError(f"node {request.name} does not exist") from None

    def kill_node(self, request: NodeRequest) -> None:
        container = self._container(request)
        if container.status == "running":
            container.kill()  # SIGKILL to the node's init: every process in it dies

    def partition_node(self, request: NodeRequest) -> None:
        network = request.overlay or self.network_name(request.cluster)
        self.engine(request).networks.get(network).disconnect(self._container(request), force=True)

    def slow_node(self, request: NodeRequest, cpus: float) -> None:
        self._container(request).update(cpu_period=CPU_PERIOD, cpu_quota=max(1000, int(cpus * CPU_PERIOD)))

    def _labelled(self, label: str, client=None) -> list[dict]:  # type: ignore[no-untyped-def]
        """The containers with `label` as one list call returns them. The SDK's containers.list also
        inspects each one, and raises when one is removed in between (another run's cleanup)."""
        return (client or self.client).api.containers(all=True, filters={"label": label})

    def list_nodes(self) -> list[NodeInfo]:
        return engines.list_nodes([(address, engines.answering(self._labelled, f"{LABEL}.home={self.home.id}", client))
                                   for address, client in self.engines.every() if client])

    def create_cluster(self, cluster: str) -> None:
        with self._lock:
            self._guard(self._ensure_network(self.network_name(cluster), cluster), cluster)

    def remove_cluster(self, cluster: str) -> None:
        for network in self._networks(cluster) + engines.overlays(self.client, self.home.id, cluster):
            until_gone(network.remove)
        hostguard.remove(hostguard.comment(self.home.id, cluster))
        cpugroup.remove(cpugroup.group_dir(self.home.id, cluster))

    def _networks(self, cluster: str) -> list[Any]:
        """The cluster's network (Docker's name filter matches parts of names: c1 would find c10's)."""
        name = self.network_name(cluster)
        return [n for n in self.client.networks.list(names=[name]) if n.name == name]

    def _remove_container(self, name_or_id: str, client=None) -> None:  # type: ignore[no-untyped-def]
        until_gone(lambda: (client or self.client).api.remove_container(name_or_id, force=True))

    # --- dry runs ------------------------------------------------------------------------------
    def plan_reap(self, all_homes: bool = False) -> list[Action]:
        """On every engine the home placed nodes on (dockerengines.Engines): containers first, then
        networks (a swarm's overlays on this machine's engine, their manager)."""
        label = f"{LABEL}=1" if all_homes else f"{LABEL}.home={self.home.id}"
        found = engines.plan_reap(self.engines.every(), label, self._labelled, self._remove_container)
        guards = hostguard.plan_remove(hostguard.comment(None if all_homes else self.home.id))
        return found + guards + cpugroup.plan_remove(None if all_homes else self.home.id)

    def plan_remove_node(self, request: NodeRequest) -> list[Action]:
        where = {"machine": request.machine} if request.engine else {}
        return [Action("remove", "container", self.container_name(request), {"node": request.name, **where},
                       run=lambda: self.remove_node(request))]

    def plan_remove_cluster(self, cluster: str) -> list[Action]:
        return [Action("remove", "network", n.name, run=lambda: self.remove_cluster(cluster))
                for n in self._networks(cluster) + engines.overlays(self.client, self.home.id, cluster)]
