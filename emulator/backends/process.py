"""Process backend: a node is a folder (its local disk) plus the processes the launch agent starts in
a sandbox of their own (sandbox.sh, next to this module: mount, UTS and PID namespaces, a root
holding only this machine's software, no capabilities), for machines without a Docker engine. A
cluster's nodes share a network namespace of their own holding only loopback (netns.py): they
reach each other and their run's service link, nothing else of this machine.

The node's disk is the job's to write, so the backend keeps its own records of the node (its
plan, the agents it started, whether it was killed) in a state folder the node never sees.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, ClassVar

import socket

import psutil

from amlemu import procinfo, statefile
from amlemu.actions import Action
from amlemu.backends import netns
from amlemu.backends import nodedisk
from amlemu.backends.base import NodeBackend, NodeInfo, NodeRequest, PlannedNode
from amlemu.backends.software import host_library_path, node_base_env, software_bin

NODE_FILE = "node.json"  # in the node's state folder: its plan
PIDS_FILE = "pids"  # (pid, start time) of each agent started on the node
DEAD_FILE = "dead"  # a killed node: its folder stays until the node is removed
KILL_WAIT = 30.0  # seconds for a killed node's processes to die (slower on a loaded machine)
SANDBOX_TOOLS = ("unshare", "chroot", "setpriv", "tini")
SANDBOX = Path(__file__).with_name("sandbox.sh")  # run by the launch agent (package data)


@dataclass(frozen=True, kw_only=True)
class ProcessNodePlan(PlannedNode):
    """A process node as create_node makes it: a folder, and this record of it (NODE_FILE)."""

    backend: ClassVar[str] = "process"
    hostname: str
    address: str
    node_dir: str
    labels: dict[str, str]
    cpus: float
    memory_bytes: int
    gpus: tuple[str, ...]
    shm_size: int
    notes: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessNodePlan:
        """A node's record read back; one written before a field existed has that field empty."""
        return cls(hostname=data["hostname"], address=data["address"], labels=data["labels"],
                   node_dir=data.get("node_dir", ""), cpus=data.get("cpus", 0.0),
                   memory_bytes=data.get("memory_bytes", 0), gpus=tuple(data.get("gpus", ())),
                   shm_size=data.get("shm_size", 0), notes=data.get("notes", ""))


class ProcessBackend(NodeBackend):
    name = "process"
    # A cluster's process nodes share one loopback (their namespace's, or as non-root this machine's):
    # ranks must talk over it, which Open MPI's TCP transport leaves out by default.
    mpi_options = ("--mca", "btl_tcp_if_include", "lo")
    auto_priority = 20  # where no Docker engine answers
    # Its nodes share one network per cluster and have no CPU quota: partition, slow and limits stay off.

    @classmethod
    def available(cls) -> tuple[bool, str]:
        missing = [tool for tool in SANDBOX_TOOLS if not shutil.which(tool)] + ([] if Path("/bin/sh").exists() else ["/bin/sh"])
        if not sys.platform.startswith("linux") or missing:
            return False, (f"needs Linux and {', '.join(missing or SANDBOX_TOOLS)} (util-linux, coreutils, "
                           f"tini) for the nodes' sandboxes")
        return True, "local process groups in their own namespaces"

    @classmethod
    def agent_tools(cls) -> dict[str, str]:
        tools = {name: path for name in ("unshare", "nsenter") if (path := shutil.which(name))}
        return {**tools, "sh": "/bin/sh"}

    @classmethod
    def agent_argv(cls, config: dict[str, Any], host: str, command: str) -> list[str]:
        """The node's sandbox in new namespaces, inside its cluster's network namespace; as a user
        without root, in a user namespace too (and the host's network: see netns.py)."""
        tools, node = config["tools"], config["hosts"][host]
        network = [tools["nsenter"], f"--net={node['netns']}", "--"] if node.get("netns") else []
        # slave: the host's unmounts reach the sandbox's copies of its mounts (with private, every
        # node disk and data mount of the host at the sandbox's start stayed mounted in it, their
        # loop devices held, until the sandbox ended); nothing the sandbox mounts reaches the host.
        unshare = [*network, tools["unshare"], "--mount", "--uts", "--pid", "--kill-child=SIGKILL", "--propagation", "slave"]
        if not config.get("as_root", True):
            unshare.append("--map-root-user")
        return [*unshare, tools["sh"], str(SANDBOX), host, node["node_dir"], node["cache_dir"], config["sandbox_root"],
                config["env_file"], str(node["shm_bytes"]), command, *config["software"], *node.get("software", [])]

    @classmethod
    def agent_record(cls, config: dict[str, Any], host: str) -> str | None:
        return str(Path(config["hosts"][host]["state_dir"]) / PIDS_FILE)  # so stop_processes finds the sandbox

    def state_dir(self, cluster: str, node: str) -> Path:
        return self.home.root / "process-nodes" / cluster / node

    def network_path(self, cluster: str) -> Path | None:
        """Where the cluster's network namespace is bound; None where this user cannot make one (not
        root): its nodes then share this machine's network."""
        return netns.RUNTIME_ROOT / self.home.id / cluster if netns.supported() else None

    def _ensure_network(self, cluster: str) -> None:
        """The cluster's namespace, made with its first node (a compute with no node holds none)."""
        if (path := self.network_path(cluster)) is not None:
            netns.create(path)

    def launch_prefix(self, cluster: str) -> tuple[str, ...]:
        path = self.network_path(cluster)
        return tuple(netns.enter_argv(path)) if path is not None else ()

    def link_listener(self, request: NodeRequest, run_id: str) -> socket.socket | None:
        """The run's service link on the nodes' own loopback, inside their namespace."""
        path = self.network_path(request.cluster)
        if path is None:
            return super().link_listener(request, run_id)
        netns.create(path)  # made with the nodes; again here for nodes made before namespaces were
        return netns.listen_in(path)

    def node_port(self, request: NodeRequest, default: int) -> int:
        """A cluster's nodes share one loopback (with other runs on the cluster): a port free there now."""
        path = self.network_path(request.cluster)
        with netns.listen_in(path) if path is not None else socket.create_server(("127.0.0.1", 0)) as sock:
            return int(sock.getsockname()[1])

    def connect_node(self, request: NodeRequest, address: str, port: int) -> socket.socket:
        path = self.network_path(request.cluster)
        return netns.connect_in(path, address, port) if path is not None else super().connect_node(request, address, port)

    def _network_note(self) -> str:
        if netns.supported():
            return "the cluster's nodes share a network namespace of their own (loopback only)"
        return ("the nodes share this machine's network (a cluster network namespace needs root): a job "
                "reaches this machine's loopback services; use docker nodes for untrusted code")

    def plan_node(self, request: NodeRequest, built_image: str | None = None) -> ProcessNodePlan:
        return ProcessNodePlan(hostname=request.name, address="127.0.0.1", node_dir=str(request.node_dir),
                               labels=request.labels, cpus=request.cpus, memory_bytes=request.memory_bytes,
                               gpus=tuple(request.gpus), shm_size=request.shm_bytes,
                               notes=f"{self.limits_note()}; {self._network_note()}")

    def create_node(self, request: NodeRequest) -> str:
        self._ensure_network(request.cluster)
        nodedisk.attach(request.node_dir, nodedisk.size(request.disk_bytes)[0])
        (request.cache_dir / "data").mkdir(parents=True, exist_ok=True)
        state = self.state_dir(request.cluster, request.name)
        state.mkdir(parents=True, exist_ok=True)
        statefile.write_json(state / NODE_FILE, self.plan_node(request).to_dict())
        return "127.0.0.1"

    def remove_node(self, request: NodeRequest) -> None:
        self._remove_found(request.cluster, request.name)  # its processes, then its folders

    def agent_entry(self, request: NodeRequest) -> dict[str, Any]:
        # /dev/shm is a tmpfs of the sandbox's own, capped at the job's shm_size (a cap, as docker's:
        # its pages are this machine's memory, not reserved, and the node has no memory limit).
        network = self.network_path(request.cluster)
        return {"node_dir": str(request.node_dir), "cache_dir": str(request.cache_dir / "data"),
                "state_dir": str(self.state_dir(request.cluster, request.name)), "shm_bytes": request.shm_bytes,
                **({"netns": str(network)} if network is not None else {}),
                "software": [request.python_env] if request.python_env else []}  # the job's environment, read-only

    def late_mounts(self, request: NodeRequest) -> str | None:
        return None  # each launch's sandbox binds the disk recursively, mounts made in it included

    def host_address(self, request: NodeRequest) -> str | None:
        return "127.0.0.1"  # the nodes' loopback, where link_listener puts the link

    def node_env(self, request: NodeRequest) -> dict[str, str]:
        # This machine's software with the emulator's venv first (as a docker node's mirror image
        # has it), and its own GPUs only ("" hides every GPU from a node that has none). The indices
        # are nvidia-smi's, which are in PCI bus order; CUDA's own default order is fastest first.
        # And this machine's LD_LIBRARY_PATH, as far as the node sees it (an image's ENV).
        library_path = host_library_path()
        return {**node_base_env(software_bin(request)), "CUDA_VISIBLE_DEVICES": ",".join(request.gpus),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **({"LD_LIBRARY_PATH": library_path} if library_path else {})}

    def node_pids(self, request: NodeRequest) -> Callable[[], list[int]]:
        state = self.state_dir(request.cluster, request.name)
        return lambda: [proc.pid for proc in self._recorded(state)]

    def stop_processes(self, request: NodeRequest) -> int:
        return self._kill_recorded(self.state_dir(request.cluster, request.name))

    def kill_node(self, request: NodeRequest) -> None:
        state = self.state_dir(request.cluster, request.name)
        state.mkdir(parents=True, exist_ok=True)
        (state / DEAD_FILE).touch()
        self._kill_recorded(state)

    @staticmethod
    def _recorded(state_dir: Path) -> list[psutil.Process]:
        """The trees of the agents recorded for a node (checked by start time: no reused pid).
        Each agent is the `unshare` of a sandbox: its tree holds every process of the node's PID
        namespace (orphans are re-parented to the namespace's init, not to the host's)."""
        pids_file = state_dir / PIDS_FILE
        found: list[psutil.Process] = []
        for line in pids_file.read_text().split() if pids_file.exists() else []:
            pid, started = line.split(":")
            try:
                proc = psutil.Process(int(pid))
                if procinfo.same_start(float(started), proc.create_time()):
                    found += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return found

    @classmethod
    def _kill_recorded(cls, state_dir: Path) -> int:
        """Kill the recorded agents' trees (every process of the node)."""
        pids_file = state_dir / PIDS_FILE
        if not pids_file.exists():
            return 0
        victims = cls._recorded(state_dir)
        for proc in victims:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        _wait_dead(victims, KILL_WAIT)
        pids_file.unlink(missing_ok=True)
        return len(victims)

    def list_nodes(self) -> list[NodeInfo]:
        found = []
        for marker in sorted((self.home.root / "process-nodes").glob(f"*/*/{NODE_FILE}")):
            try:
                plan = ProcessNodePlan.from_dict(json.loads(marker.read_text()))
            except FileNotFoundError:  # removed since the listing (a supervisor scaling its node down)
                continue
            found.append(NodeInfo(cluster=plan.labels["amlemu.cluster"], name=plan.hostname,
                                  index=int(plan.labels["amlemu.index"]),
                                  running=not (marker.parent / DEAD_FILE).exists(), address=plan.address))
        return found

    def remove_cluster(self, cluster: str) -> None:
        netns.remove(netns.RUNTIME_ROOT / self.home.id / cluster)
        nodedisk.detach_all(self.home.root / "nodes" / cluster)
        shutil.rmtree(nodedisk.images_dir(self.home.root, cluster), ignore_errors=True)
        for sub in ("nodes", "caches", "process-nodes"):
            shutil.rmtree(self.home.root / sub / cluster, ignore_errors=True)

    # --- dry runs ------------------------------------------------------------------------------
    def _folders(self, cluster: str, node: str) -> tuple[Path, ...]:
        """A node's disk, its blob cache and the backend's records of it."""
        return self.home.node_dir(cluster, node), self.home.cache_dir(cluster, node), self.state_dir(cluster, node)

    def _node_parts(self, cluster: str, node: str) -> dict[str, Any]:
        """A node's live processes and existing folders: what removing it removes."""
        return {"processes": [p.pid for p in self._recorded(self.state_dir(cluster, node))],
                "folders": [str(f) for f in self._folders(cluster, node) if f.exists()]}

    def _remove_found(self, cluster: str, node: str) -> None:
        self._kill_recorded(self.state_dir(cluster, node))
        nodedisk.detach(self.home.node_dir(cluster, node))  # its disk, before its folder goes
        for folder in self._folders(cluster, node):
            shutil.rmtree(folder, ignore_errors=True)

    def plan_reap(self, all_homes: bool = False) -> list[Action]:
        """This home's process nodes: their processes, then their folders (other homes' are not ours
        to find: a process node is known only to the home that holds its folder); its network
        namespaces, and with `all_homes` those every home left (a home deleted before its cleanup)."""
        nodes = [Action("remove", "process node", node.name, self._node_parts(node.cluster, node.name),
                        run=functools.partial(self._remove_found, node.cluster, node.name))
                 for node in self.list_nodes()]
        homes = sorted(netns.RUNTIME_ROOT.glob("[!.]*")) if all_homes else [netns.RUNTIME_ROOT / self.home.id]
        networks = [Action("remove", "network namespace", path.name, {"path": str(path)},
                           run=functools.partial(netns.remove, path), always=True)  # a kernel object: never left
                    for home in homes for path in sorted(home.glob("[!.]*"))]  # not the locks
        return nodes + networks

    def plan_remove_node(self, request: NodeRequest) -> list[Action]:
        return [Action("remove", "process node", request.name, self._node_parts(request.cluster, request.name),
                       run=lambda: self.remove_node(request))]

    def plan_remove_cluster(self, cluster: str) -> list[Action]:
        folders = [str(p) for sub in ("nodes", "caches", "process-nodes") if (p := self.home.root / sub / cluster).exists()]
        return [Action("remove", "cluster folders", cluster, {"folders": folders},
                       run=lambda: self.remove_cluster(cluster))] if folders else []


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Until each process is gone or a zombie. A sandbox's `unshare` is re-parented to this machine's
    init when mpirun exits, and some inits reap zombies only every second or two: a zombie runs
    nothing and holds no file, so waiting for its reaping (as psutil.wait_procs does) only slows
    every run's end."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
