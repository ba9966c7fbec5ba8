"""Process backend: a node is a folder (its local disk) plus the processes the launch agent starts in
their own UTS + mount namespaces, for machines without a Docker engine."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import psutil

from .base import NodeBackend, NodeInfo, NodeRequest

PIDS_FILE = ".amlemu-pids"  # in the node folder: (pid, start time) of each agent started there
DEAD_FILE = ".amlemu-dead"  # a killed node: its folder stays until the node is removed


class ProcessBackend(NodeBackend):
    name = "process"
    # Process nodes share this machine's network: ranks must talk over loopback, which Open MPI's
    # TCP transport leaves out by default (over the other interfaces the first collective hangs).
    mpi_options = ("--mca", "btl_tcp_if_include", "lo")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if not sys.platform.startswith("linux") or not shutil.which("unshare"):
            return False, "needs Linux and unshare (util-linux) for per-node hostnames and paths"
        return True, "local process groups in their own namespaces"

    def plan_node(self, request: NodeRequest) -> dict[str, Any]:
        return {"backend": self.name, "hostname": request.name, "address": "127.0.0.1",
                "node_dir": str(request.node_dir), "labels": request.labels,
                "cpus": request.cpus, "memory_bytes": request.memory_bytes, "gpus": list(request.gpus),
                "notes": "limits are not enforced on process nodes; all nodes share the host network"}

    def create_node(self, request: NodeRequest) -> str:
        request.node_dir.mkdir(parents=True, exist_ok=True)
        (request.cache_dir / "data").mkdir(parents=True, exist_ok=True)
        (request.node_dir / ".amlemu-node.json").write_text(json.dumps(self.plan_node(request)))
        return "127.0.0.1"

    def remove_node(self, request: NodeRequest) -> None:
        self.stop_processes(request)
        shutil.rmtree(request.node_dir, ignore_errors=True)
        shutil.rmtree(request.cache_dir, ignore_errors=True)

    def agent_entry(self, request: NodeRequest) -> dict[str, Any]:
        # A process node runs this machine's software, with the emulator's environment first on
        # PATH (as the mirror image of a docker node has it).
        path = f"{Path(sys.prefix, 'bin')}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        # Its own GPUs only ("" hides every GPU from a node that has none), as a container gets.
        env = {"PATH": path, "CUDA_VISIBLE_DEVICES": ",".join(request.gpus)}
        return {"node_dir": str(request.node_dir), "cache_dir": str(request.cache_dir / "data"), "env": env}

    def stop_processes(self, request: NodeRequest) -> int:
        return self._kill_recorded(request.node_dir)

    def kill_node(self, request: NodeRequest) -> None:
        (request.node_dir / DEAD_FILE).touch()
        self._kill_recorded(request.node_dir)

    @staticmethod
    def _kill_recorded(node_dir: Path) -> int:
        """Kill the trees of the agents recorded for a node (checked by start time: no reused pid)."""
        pids_file = node_dir / PIDS_FILE
        if not pids_file.exists():
            return 0
        victims: list[psutil.Process] = []
        for line in pids_file.read_text().split():
            pid, started = line.split(":")
            try:
                proc = psutil.Process(int(pid))
                if abs(proc.create_time() - float(started)) < 0.5:
                    victims += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        for proc in victims:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)
        pids_file.unlink(missing_ok=True)
        return len(victims)

    def list_nodes(self) -> list[NodeInfo]:
        found = []
        for marker in sorted((self.home.root / "nodes").glob("*/*/.amlemu-node.json")):
            plan = json.loads(marker.read_text())
            found.append(NodeInfo(cluster=plan["labels"]["amlemu.cluster"], name=plan["hostname"],
                                  index=int(plan["labels"]["amlemu.index"]),
                                  running=not (marker.parent / DEAD_FILE).exists(), address=plan["address"]))
        return found

    def remove_cluster(self, cluster: str) -> None:
        shutil.rmtree(self.home.root / "nodes" / cluster, ignore_errors=True)
        shutil.rmtree(self.home.root / "caches" / cluster, ignore_errors=True)

    def reap(self, all_homes: bool = False) -> list[str]:
        """This home's process nodes: their processes, then their folders (other homes are not ours
        to find: a process node is known only to the home that holds its folder)."""
        gone = []
        for node in self.list_nodes():
            request_dir = self.home.node_dir(node.cluster, node.name)
            self._kill_recorded(request_dir)
            shutil.rmtree(request_dir, ignore_errors=True)
            shutil.rmtree(self.home.cache_dir(node.cluster, node.name), ignore_errors=True)
            gone.append(f"process node {node.name}")
        return gone


def record_agent(node_dir: str) -> None:
    """Called by the agent just before it becomes the node's MPI daemon (same pid after exec)."""
    me = psutil.Process(os.getpid())
    with open(Path(node_dir) / PIDS_FILE, "a") as fh:
        fh.write(f"{me.pid}:{me.create_time()}\n")
