"""The small interface every node backend implements, and the data a node is created from."""
from __future__ import annotations

import abc
import ipaddress
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar

import psutil

from amlemu.actions import Action, execute
from amlemu.backends import nodefs
from amlemu.errors import BackendError
from amlemu.home import Home

LABEL = "amlemu"  # every container and network carries amlemu=1 and the labels below
# Where every backend puts a node's disk and its blob cache (read-only) inside the node: the node
# contract's paths (emulator/runs/contract.py holds the same; this layer cannot import it).
NODE_ROOT = "/mnt/azureml"
CACHE_ROOT = "/mnt/amlemu/cache"
# The name every node resolves to its run's link to the home's Azure ML service
# (emulator/runs/servicelink.py; process nodes: sandbox.sh's /etc/hosts holds the same). Shaped as
# a blob host: azureml-core's Run.upload_file rebuilds `<account>.blob.<suffix>` from the URL it
# is handed, so the one name serves the API and the uploads.
SERVICE_HOST = "amlemu-service.blob.internal"


@dataclass(frozen=True)
class NodeRequest:
    """One node to create: pure data, what `compute create --dry-run` shows."""

    home_id: str
    cluster: str
    index: int
    cpus: float
    memory_bytes: int
    cpu_share: float  # what its processes should plan threads on (nodes share this machine)
    node_dir: Path  # the node's local disk on the host (the job can write it: see nodefs)
    cache_dir: Path  # the node's blob cache on the host (its data/ tree is what the node sees)
    gpus: tuple[str, ...] = ()
    image: str | None = None  # the job's image, when the engine has it
    shm_bytes: int = 2 << 30  # /dev/shm (the job's resources.shm_size; Azure ML's default 2g)
    # The job's built Python environment (amlemu.envs): mounted read-only at this same path, its bin
    # first on PATH in place of the emulator's venv. None: the emulator's venv, as before.
    python_env: str | None = None
    disk_bytes: int = 0  # the VM size's local (temp) disk; nodedisk caps it (0: by its setting alone)
    # Past one machine (amlemu.machines, placed by the cluster layer): the machine the node is on, its
    # Docker engine's address ("": this machine's) and TLS files (ca, cert, key) for a tcp:// engine;
    # `overlay`: the cluster's attachable overlay network when its nodes span machines (else its
    # bridge); `service_address`: this machine's address as nodes on that machine reach it.
    machine: str = "local"
    engine: str = ""
    engine_tls: tuple[str, str, str] | None = None
    overlay: str | None = None
    service_address: str | None = None
    advertise: str | None = None  # its machine's address as the cluster's other machines reach it
    # Its machine does not share this machine's files (another host): its disk, cache and environment
    # are volumes on its engine, filled and read back through it (backends/shipping.py).
    ships_files: bool = False

    @property
    def name(self) -> str:
        """The node's hostname, unique within its cluster."""
        return f"{self.cluster}-node-{self.index}"

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL: "1", f"{LABEL}.home": self.home_id, f"{LABEL}.cluster": self.cluster,
                f"{LABEL}.node": self.name, f"{LABEL}.index": str(self.index),
                **({f"{LABEL}.machine": self.machine} if self.machine != "local" else {})}


@dataclass(frozen=True)
class NodeInfo:
    """A node as the backend sees it now, rebuilt from labels (docker) or the disk (process)."""

    cluster: str
    name: str
    index: int
    running: bool
    address: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class PlannedNode(abc.ABC):
    """What a backend's create_node makes of a NodeRequest, as data: its plan_node (the dry run).
    Each backend's is a frozen, keyword-only dataclass; `to_dict` is the JSON the dry run prints."""

    backend: ClassVar[str]
    image_note: str | None = None  # why the job's image is not what the node runs (docker only)

    def to_dict(self) -> dict[str, Any]:
        """The backend's name, then each field in order (tuples as JSON lists)."""
        fields = asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass
        return {"backend": self.backend, **{k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}}


class NodeBackend(abc.ABC):
    """Everything a kind of node needs, in one class: its registry name, its place in `auto`, what
    it can emulate, how the launch agent runs a command on one of its nodes, and the node's life."""

    name: ClassVar[str]
    mpi_options: ClassVar[tuple[str, ...]] = ()  # what mpirun needs to reach this backend's nodes
    # `auto` tries the available backends by ascending priority; None: chosen only by name.
    auto_priority: ClassVar[int | None] = None
    # What it emulates honestly; the rest is refused with a message, never faked.
    can_partition: ClassVar[bool] = False  # cut one node off the others' network
    can_slow: ClassVar[bool] = False  # lower a running node's CPU quota
    enforces_limits: ClassVar[bool] = False  # the size's CPUs and memory are hard limits
    guards_host: ClassVar[bool] = False  # this machine answers its nodes only on ports open_port opened

    def __init__(self, home: Home) -> None:
        self.home = home

    @classmethod
    @abc.abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why not / what it uses)."""

    @classmethod
    def limits_note(cls) -> str | None:
        """What a dry run says about the node sizes this backend does not hold its nodes to."""
        return None if cls.enforces_limits else f"CPU and memory limits are not enforced on {cls.name} nodes"

    # --- the launch agent (emulator/runs/agent.py: once per node and launch, so no instance) ----
    @classmethod
    def agent_tools(cls) -> dict[str, str]:
        """The host programs its agent_argv runs, by absolute path (found here, by the platform)."""
        return {}

    @classmethod
    @abc.abstractmethod
    def agent_argv(cls, config: dict[str, Any], host: str, command: str) -> list[str]:
        """The argv that runs the shell `command` on node `host` of the agent's `config` (written by
        the supervisor: tools by absolute path, env_file, sandbox_root, software, and the host's
        `agent_entry`). Only the platform's programs run on the host side, never the job's."""

    @classmethod
    def agent_resident(cls, config: dict[str, Any], host: str, command: str) -> dict[str, Any] | None:
        """Where a process resident on node `host` runs `command` in place of agent_argv's program
        (runs/agent.py `run_resident`: the docker backend's nodeserver.py); None: nowhere."""
        return None

    @classmethod
    def agent_record(cls, config: dict[str, Any], host: str) -> str | None:
        """A file where the agent writes its pid and start time before it becomes the argv (same pid
        after exec), for a backend that finds a node's processes that way; None: none."""
        return None

    @abc.abstractmethod
    def plan_node(self, request: NodeRequest, built_image: str | None = None) -> PlannedNode:
        """Dry run: exactly what create_node would create, as data. `built_image`: an image the run
        builds before its nodes are made (the job's software plan), planned as the engine has it."""

    @abc.abstractmethod
    def create_node(self, request: NodeRequest) -> str:
        """Create the node and return the address other nodes reach it at."""

    @abc.abstractmethod
    def remove_node(self, request: NodeRequest) -> None:
        """Remove the node and everything it holds; removing a missing node is not an error."""

    @abc.abstractmethod
    def agent_entry(self, request: NodeRequest) -> dict[str, Any]:
        """What the launch agent needs to run a command on this node."""

    def has_image(self, image: str) -> bool:
        """Whether nodes can run this image (the engine has it); a backend without images never can."""
        return False

    def fits(self, request: NodeRequest) -> bool:
        """Whether an existing node serves `request` as it is (else it is made again for the job):
        what is fixed at a node's creation and differs from job to job (docker: /dev/shm's size)."""
        return True

    def until_peers_known(self, requests: list[NodeRequest], addresses: list[str], log: Callable[[str], None]) -> bool:
        """Before a job starts: wait until every node of `requests` resolves every other's name at
        its address (`addresses`, in order), as AmlCompute's nodes do when their job starts (a
        deadline; past it BackendError naming the node never resolved); whether there was a wait.
        Nothing to wait for where a node is known once it is made (one engine's bridge, hosts files)."""
        return False

    def host_address(self, request: NodeRequest) -> str | None:
        """The address of this machine that the node reaches (where a run's service link
        listens, and SERVICE_HOST resolves to on the node); None: the backend has no such link."""
        return None

    def link_listener(self, request: NodeRequest, run_id: str) -> socket.socket | None:
        """A socket listening where the node reaches this machine (host_address, a free port),
        opened to the run's nodes: the run's service link. None: the backend has no such link."""
        address = self.host_address(request)
        if address is None:
            return None
        sock = socket.create_server((address, 0))
        self.open_port(request, run_id, sock.getsockname()[1])
        return sock

    def callback_port(self, request: NodeRequest, run_id: str) -> int | None:
        """A port of this machine, opened to the run's nodes, for mpirun's daemons to call back to
        (free now: mpirun binds it as it starts); None: mpirun may take any (the nodes reach every
        port of it, or none: a namespace of their own)."""
        if not self.guards_host or self.host_address(request) is None:
            return None
        with socket.create_server(("0.0.0.0", 0)) as probe:  # mpirun listens on every address
            port = int(probe.getsockname()[1])
        self.open_port(request, run_id, port)
        return port

    def callback_mca(self, request: NodeRequest) -> dict[str, str]:
        """Open MPI's settings (as mpirun's environment, which its daemons inherit) that keep mpirun
        and its daemons on the cluster's own network. Without them each daemon tries every address of
        this machine in turn before the one it may reach: each refused by the firewall, 0.05-0.5 s of
        a launch here (more with more networks: a VPN, other clusters), and an address whose packets
        are dropped would cost a TCP timeout. None on a network that spans machines (overlay): its
        daemons have no interface on this machine's networks (the docker backend opens mpirun's port
        there at every address of this machine instead: dockerengines.open_port)."""
        address = None if request.overlay or not self.guards_host else self.host_address(request)
        for found in psutil.net_if_addrs().values() if address else ():
            for entry in found:
                if entry.family == socket.AF_INET and entry.address == address and entry.netmask:
                    return {"OMPI_MCA_oob_tcp_if_include": str(ipaddress.ip_interface(f"{address}/{entry.netmask}").network)}
        return {}

    def open_port(self, request: NodeRequest, run_id: str, port: int) -> None:
        """Let the run's nodes reach `port` at host_address until close_ports; nothing by default."""

    def close_ports(self, request: NodeRequest, run_id: str) -> None:
        """Close every port open_port opened for the run (its end, or its recovery)."""

    def node_port(self, request: NodeRequest, default: int) -> int:
        """A port for a run's service on the node (runs/servicerun.py): `default` where each node has
        a network of its own (a container), else one free there now."""
        return default

    def connect_node(self, request: NodeRequest, address: str, port: int) -> socket.socket:
        """A connection from this machine to `address`:`port` on the node: a run's service relay."""
        return socket.create_connection((address, port), timeout=5.0)

    def launch_prefix(self, cluster: str) -> tuple[str, ...]:
        """What the host's side of a launch (mpirun) runs under, to be in the cluster's network
        (pure: the dry run shows it); nothing by default."""
        return ()

    def node_env(self, request: NodeRequest) -> dict[str, str]:
        """Variables the node's shell has before the run's (a container's image defaults)."""
        return {}

    def late_mounts(self, request: NodeRequest) -> str | None:
        """Why a mount the host makes in the node's disk after the node started would not reach its
        processes (None: it does). A container sees it through slave propagation from its disk,
        which must be a shared mount on this machine's engine (nodedisk: root's sized disks)."""
        from amlemu.backends import nodedisk  # noqa: PLC0415 - base stays free of the disk's imports

        if request.engine:
            return f"the node is on another machine's engine ({request.machine})"
        if not nodedisk.propagates(request.node_dir):
            return "its disk is not a shared mount (as root, node disks of their own size are: AMLEMU_NODE_DISK_GB)"
        return None

    def cut_off(self, request: NodeRequest) -> None:
        """The node's machine is cut off (runs/machinewatch.py): nothing waits on reaching it again."""

    def reset_node(self, request: NodeRequest) -> None:
        """After a run, with no job process left: forget what the run left in the node outside its
        disk (which the supervisor empties), so the next run on it starts clean."""

    # --- a node whose disk is not this machine's folder: nothing to ship here (backends/shipping.py)
    def ship_in(self, request: NodeRequest, rel: str | None) -> int:
        """Before the job: the disk's folder `rel` and new cache entries onto the node; files shipped."""
        return 0

    def ship_out(self, request: NodeRequest, rel: str) -> list[str]:
        """After the job: the node's `rel` back into its staging copy here; the names not taken."""
        return []

    def copy_out(self, request: NodeRequest, rel: str, dest: Path) -> bool:
        """One regular file of the node's disk into `dest` while the job runs (its MLflow store)."""
        return nodefs.copy_file(request.node_dir, rel, dest)

    @abc.abstractmethod
    def stop_processes(self, request: NodeRequest) -> int:
        """Kill every job process still on the node (never the node itself); return how many."""

    def cpu_sharer(self, requests: list[NodeRequest]) -> Any:
        """What moves a running job's processes on `requests` into one CPU group (a
        backends.cpugroup.Sharer), where its nodes are CPU groups of their own; None here."""
        return None

    def node_pids(self, request: NodeRequest) -> Callable[[], list[int]]:
        """A cheap reader of the node's processes (this machine's pids), sampled while a job runs
        (runs/memwatch.py); found once per run, read each second. Unknown here: none."""
        return list

    @abc.abstractmethod
    def list_nodes(self) -> list[NodeInfo]:
        """The nodes of this home that exist now."""

    # --- faults (emulator/cluster/faults.py) --------------------------------------------------
    @abc.abstractmethod
    def kill_node(self, request: NodeRequest) -> None:
        """The node dies at once: its processes get SIGKILL, nothing they could handle."""

    def partition_node(self, request: NodeRequest) -> None:
        """Cut the node off from the other nodes (it keeps running). With `can_partition` only."""
        raise BackendError(f"a network partition is not emulated on {self.name} nodes")

    def slow_node(self, request: NodeRequest, cpus: float) -> None:
        """Throttle the node to `cpus` cores. With `can_slow` only."""
        raise BackendError(f"slowing a node is not emulated on {self.name} nodes")

    def create_cluster(self, cluster: str) -> None:
        """Create what the cluster's nodes share (a network); nothing by default."""

    @abc.abstractmethod
    def remove_cluster(self, cluster: str) -> None:
        """Remove what the cluster holds besides its nodes (a network)."""

    def reap(self, all_homes: bool = False) -> list[str]:
        """Remove every node and network of this home (of every home with all_homes); say what went."""
        return execute(self.plan_reap(all_homes))

    # --- dry runs: the Actions that the calls above carry out (emulator/actions.py) ------------
    @abc.abstractmethod
    def plan_reap(self, all_homes: bool = False) -> list[Action]:
        """What reap would remove, each step removing one thing."""

    def plan_remove_node(self, request: NodeRequest) -> list[Action]:
        """What remove_node would remove."""
        return [Action("remove", "node", request.name, {"backend": self.name}, run=lambda: self.remove_node(request))]

    def plan_remove_cluster(self, cluster: str) -> list[Action]:
        """What remove_cluster would remove (nothing listed: nothing is left to remove)."""
        return [Action("remove", "cluster resources", cluster, {"backend": self.name},
                       run=lambda: self.remove_cluster(cluster))]
