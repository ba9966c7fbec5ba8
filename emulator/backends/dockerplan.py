"""A docker node as data: the container the docker backend creates for a node request (pure; the
backend's `plan_node` returns exactly this, the dry run shows its `to_dict`, `create_node` executes it)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from amlemu.backends import dockerexec, gpudevices, nodedisk, shipping
from amlemu.backends.base import CACHE_ROOT, LABEL, NODE_ROOT, NodeRequest, PlannedNode
from amlemu.backends.software import node_base_env, software_bin, software_paths

MIRROR_IMAGE = "amlemu/node-host-mirror:1"
CPU_PERIOD = 100_000  # microseconds
# Why nodes' containers get a CPU weight and a cgroup of their own beside this machine's processes:
# under the engine's default parent (/docker) every container of the machine shares ONE weight,
# the same as ONE process here, and the kernel splits it across the CPUs they run on. With two
# busy containers beside the benchmark, MNIST on docker nodes ran at 0.64x bare under /docker and
# 0.92x as groups of their own (docs/benchmarks.md, issue 30). With the weight of the CPUs it may
# use (its fair share), a node competes for this machine as its ranks would as plain processes.
CPU_WEIGHT = 1024  # a process's weight at nice 0 (cgroup v1 cpu.shares)
# The mirror image's root is read-only; these are the node's scratch folders, emptied after a run.
SCRATCH = ("/tmp", "/var/tmp", "/root", "/run")


Volumes = dict[str, dict[str, str]]  # host path -> {"bind": path in the node, "mode": "ro" | "rw"}


@dataclass(frozen=True, kw_only=True)
class ContainerPlan(PlannedNode):
    """The container of one docker node, field for field as create_node creates it."""

    backend: ClassVar[str] = "docker"
    image: str
    image_note: str | None = None  # the job's image is not in the engine: the mirror runs instead
    name: str
    hostname: str
    network: str
    aliases: tuple[str, ...]
    labels: dict[str, str]
    command: tuple[str, ...]
    init: bool  # the engine's init (tini) as PID 1: a job image's; the mirror's command is tini
    environment: dict[str, str]
    read_only: bool  # the root file system (the mirror's never changes)
    tmpfs: dict[str, str]  # folder -> mount options
    security_opt: tuple[str, ...]
    volumes: Volumes
    cpu_period: int
    cpu_quota: int
    cpu_shares: int  # its weight against this machine's other processes (CPU_WEIGHT per CPU of its share)
    cgroup_parent: str | None  # "/": a group of its own beside this machine's processes (see CPU_WEIGHT)
    mem_limit: int
    shm_size: int
    gpus: tuple[str, ...]
    gpu_access: str | None  # device_requests (NVIDIA runtime) | device_nodes | None
    devices: tuple[str, ...]  # docker `devices` (host:node:permissions), with device_nodes
    host_guard: str  # whether this machine is closed to the nodes (backends/hostguard.py)
    machine: str = "local"  # the machine whose engine makes it (amlemu.machines; issue 31)


def _mirror_mounts() -> Volumes:
    return {p: {"bind": p, "mode": "ro"} for p in software_paths()}


def _disk_mode(request: NodeRequest) -> str:
    """rslave: a data runtime mount the host makes in the node's disk during a run reaches the
    container (runs/datamounts.py); the disk must be a shared mount, which nodedisk makes it."""
    return "rw,rslave" if not request.engine and nodedisk.size(request.disk_bytes)[0] is not None else "rw"


def _gpu_access(request: NodeRequest, use_job_image: bool, nvidia_runtime: bool, env: dict[str, str],
                volumes: Volumes) -> tuple[str | None, list[str]]:
    """How the node gets its GPUs, and their device nodes (the driver's libraries added to `env` and
    `volumes` where the node mirrors this machine's)."""
    if not request.gpus:
        return None, []
    if nvidia_runtime:
        return "device_requests", []
    devices = gpudevices.device_nodes(list(request.gpus), gpudevices.gpu_minors())
    driver_libs = None if use_job_image else gpudevices.driver_lib_dir()
    if driver_libs:
        env["LD_LIBRARY_PATH"] = driver_libs
        if not any(driver_libs == p or driver_libs.startswith(p + "/") for p in volumes):
            volumes[driver_libs] = {"bind": driver_libs, "mode": "ro"}
    return "device_nodes", devices


def container_plan(request: NodeRequest, use_job_image: bool, nvidia_runtime: bool, container_name: str,
                   network: str, host_guard: str, cgroup_parent: str | None = None) -> ContainerPlan:
    """The container of one node: the job's image when the engine has it (else the host mirror),
    its disk, cache, limits, GPUs and labels."""
    volumes = {} if use_job_image else _mirror_mounts()
    if request.ships_files:  # another host: volumes on its engine, filled through it (shipping.py)
        volumes.update(shipping.volumes(request, container_name, environment=not use_job_image))
    else:
        if request.python_env and not use_job_image:  # the job's environment, at its own path
            volumes[request.python_env] = {"bind": request.python_env, "mode": "ro"}
        volumes[str(request.node_dir)] = {"bind": NODE_ROOT, "mode": _disk_mode(request)}
        # The blob cache: filled by the host, read-only here (a write fails with EROFS), no FUSE.
        volumes[str(request.cache_dir / "data")] = {"bind": CACHE_ROOT, "mode": "ro"}
    if use_job_image:
        # Open MPI daemons check that the launch agent's path exists on their node: the console
        # script, and the interpreter and file mpirun runs it as (runs/plan.py MPI_AGENT_ARGV).
        for path in (Path(sys.prefix, "bin", "amlemu-agent"), Path(sys.executable),
                     Path(__file__).resolve().parent.parent / "runs" / "agent.py"):
            volumes[str(path)] = {"bind": str(path), "mode": "ro"}
    resident = not use_job_image and not request.engine  # the resident agent (dockerexec.py): this machine's nodes
    volumes.update(dockerexec.server_volume() if resident else {})
    env = node_base_env(None if use_job_image else software_bin(request))
    gpu_access, devices = _gpu_access(request, use_job_image, nvidia_runtime, env, volumes)
    return ContainerPlan(
        image=request.image if use_job_image else MIRROR_IMAGE,
        image_note=None if use_job_image or not request.image else
        f"image {request.image} is not in the engine (no registry here): nodes use {MIRROR_IMAGE}",
        name=container_name,
        hostname=request.name,
        network=network,
        aliases=(request.name,),
        labels={**request.labels, f"{LABEL}.python_env": request.python_env or ""},
        # tini reaps the MPI daemons' orphans; the job image brings its own init via init=True.
        # A mirror node here starts with its resident agent, which becomes its idle sleep when idle (dockerexec.py).
        command=("sleep", "infinity") if use_job_image else
        ("/usr/bin/tini", "--", *(dockerexec.server_argv() if resident else ()), "/bin/sleep", "infinity"),
        init=use_job_image,
        environment=env,
        # A job image may expect to write anywhere; the mirror's root never changes.
        read_only=not use_job_image,
        tmpfs={} if use_job_image else {**{d: f"exec,mode={'1777' if 'tmp' in d else '0755'}" for d in SCRATCH},
                                        **({dockerexec.AGENT_DIR: dockerexec.AGENT_TMPFS} if resident else {})},
        security_opt=("no-new-privileges",),
        volumes=volumes,
        # A CFS quota rather than nano_cpus: `slow_node` can then lower it on the running node.
        cpu_period=CPU_PERIOD,
        cpu_quota=int(request.cpus * CPU_PERIOD),
        cpu_shares=max(2, round(CPU_WEIGHT * request.cpu_share)),
        cgroup_parent=cgroup_parent,
        mem_limit=request.memory_bytes,
        shm_size=request.shm_bytes,  # the job's resources.shm_size, as Azure ML's docker run --shm-size
        gpus=tuple(request.gpus),
        gpu_access=gpu_access,
        devices=tuple(devices),
        host_guard=host_guard,
        machine=request.machine,
    )
