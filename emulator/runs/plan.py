"""The launch plan: everything a run's launch is, as data, built once by one pure function from the
job and the nodes. `amlemu job create --dry-run` prints it with placeholder nodes; the supervisor
builds it with the nodes allocation gave (their names and addresses, nothing else differs),
executes it, and writes it to the run's system_logs/launch.json.

How the processes start depends on the distribution, as on AmlCompute (runs/launchers.py):
- `launcher: mpirun` (distribution mpi): `launch` is the platform's mpirun, run on the host; it
  starts each node's MPI daemon through the launch agent, and the ranks get OMPI_COMM_WORLD_*.
- `launcher: node` (pytorch, tensorflow, none): `launch` is empty and `processes` lists, per
  global rank, its node, the argv it runs there, the variables of its own (RANK/LOCAL_RANK,
  TF_CONFIG) and the agent command the host runs to start it on its node. No OMPI_* reaches them.
Either way every process sees `env` (the run's) + its node's `node_env`, over the node's
`node_base_env` (less the image's OMPI_* for pytorch and tensorflow jobs), and logs to
user_logs/std_log_process_<rank>.txt (std_log.txt for a single process). The supervisor starts
the host's side of it as one gang (runs/gang.py): the first process to fail ends them all.
"""
from __future__ import annotations

import marshal
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from amlemu.backends.base import NodeBackend, NodeRequest
from amlemu.backends.software import node_base_env, sandbox_software
from amlemu.runs.contract import (
    Binding,
    NodeSlot,
    Rank,
    bindings,
    launch_argv,
    mpirun_env,
    node_env,
    node_env_file,
    rank_layout,
    run_env,
)
from amlemu.runs.datamounts import DataMount, plan_mounts
from amlemu.runs.launchers import ProcessPlan, launcher, node_processes
from amlemu.runs.services import ServicePlan, plan_services
from amlemu.specs import DistributionType, JobSpec
from amlemu.storage.nodecache import policy_from_env

AGENT = str(Path(sys.prefix, "bin", "amlemu-agent"))  # the launch agent, as the host runs it per process
# The same agent as mpirun runs it, once per node on every launch: the interpreter on the agent's
# own file (the standard library only), without site (-S: its path hooks, an editable install's
# finder, ~18 ms of every launch) and isolated (-I). Open MPI splits its agent on spaces: where a
# path holds one, the console script. Its first word must exist on the nodes (dockerplan binds it).
MPI_AGENT_ARGV = (sys.executable, "-SI", str(Path(__file__).resolve().with_name("agent.py")))
MPI_AGENT = " ".join(MPI_AGENT_ARGV) if not any(" " in part for part in MPI_AGENT_ARGV) else AGENT
COMMAND = "\0command\0"  # where the agent's command goes in a host's argv (no argv can hold a NUL)


@dataclass(frozen=True)
class NodePlan:
    """One node of the launch: where it is, what it has, and what its shell's environment adds."""

    name: str
    index: int
    address: str
    cpus: float
    memory_bytes: int
    gpus: tuple[str, ...]
    base_env: dict[str, str]  # the node's image defaults (the backend's)
    env: dict[str, str]  # what differs per node (AZ_BATCHAI_TASK_INDEX, NODE_RANK, ...)


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    compute: str
    backend: str
    nodes: tuple[NodePlan, ...]
    launcher: str  # mpirun | node (runs/launchers.py)
    argv: tuple[str, ...]  # mpirun: what the host runs (through the agent); node: empty
    processes: tuple[ProcessPlan, ...]  # node: each process, started on its node; mpirun: empty
    env: dict[str, str]  # what every process of the run sees
    ranks: tuple[Rank, ...]
    data: tuple[Binding, ...]
    notices: tuple[str, ...]
    services: tuple[ServicePlan, ...] = ()  # the job's services: beside it, for its lifetime
    data_mounts: tuple[DataMount, ...] = ()  # ro_mount inputs the data runtime's mount serves on every node
    data_runtime: dict[str, Any] | None = None  # its settings (from the job's DATASET_MOUNT_* variables)
    launch_env: dict[str, str] = field(default_factory=dict)  # mpirun's own, beside the host's (contract.mpirun_env)

    def node_environment(self, node: NodePlan) -> dict[str, str]:
        """The whole environment of a node's processes (the env file the node's shell sources)."""
        return {**node.base_env, **self.env, **node.env}

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "compute": self.compute, "backend": self.backend,
            "launcher": self.launcher, "launch": list(self.argv), "launch_env": self.launch_env,
            "processes": [{**asdict(p), "argv": list(p.argv), "unset": list(p.unset), "launch": list(p.launch)}
                          for p in self.processes],
            "env": self.env,
            "node_env": {n.name: n.env for n in self.nodes},
            "node_base_env": {n.name: n.base_env for n in self.nodes},
            "node_slots": [{k: v for k, v in asdict(n).items() if k not in ("env", "base_env")} for n in self.nodes],
            "ranks": [asdict(r) for r in self.ranks],
            "data": [{**asdict(b), "mode": b.mode.value} for b in self.data],
            "notices": list(self.notices),
            "services": [s.to_dict() for s in self.services],
            "data_runtime": {"mounts": [m.to_dict() for m in self.data_mounts], "settings": self.data_runtime}
            if self.data_mounts else None,
        }


def plan_launch(job: JobSpec, run_id: str, compute: str, backend: str, requests: list[NodeRequest],
                addresses: list[str], workspace: dict[str, str], *, base_env: list[dict[str, str]],
                mpi_options: tuple[str, ...], as_root: bool, notices: tuple[str, ...] = (),
                launch_prefix: tuple[str, ...] = ()) -> LaunchPlan:
    """The plan for `job` on these nodes (requests, in rank order, with the addresses other nodes
    reach them at). Pure: the same inputs give the same plan, in a dry run and in the supervisor.
    `launch_prefix` (the backend's) puts mpirun in the cluster's network (process nodes' namespace)."""
    slots = [NodeSlot(i, r.name, address) for i, (r, address) in enumerate(zip(requests, addresses))]
    _, cache_notices = policy_from_env(job.environment_variables, job_start=0.0)
    data = tuple(bindings(job, run_id))
    mounts, settings = plan_mounts(job, data, requests[0].cpus)  # a bad DATASET_* value fails here, in one line
    how = launcher(job)
    # The node image's OMPI_* defaults serve the platform's mpirun: torch's and TF's processes,
    # started without it, see none (a docker node's container has them: the command unsets them).
    hidden = tuple(sorted({k for base in (node_base_env(None), *base_env) for k in base if k.startswith("OMPI_")})) \
        if job.distribution.type in (DistributionType.PYTORCH, DistributionType.TENSORFLOW) else ()
    nodes = tuple(NodePlan(r.name, r.index, s.address, r.cpus, r.memory_bytes, tuple(r.gpus),
                           {k: v for k, v in base.items() if k not in hidden}, node_env(job, s))
                  for r, s, base in zip(requests, slots, base_env))
    mpirun = how == "mpirun"
    return LaunchPlan(
        run_id=run_id, compute=compute, backend=backend, nodes=nodes, launcher=how,
        argv=(*launch_prefix, *launch_argv(job, run_id, slots, agent=MPI_AGENT, as_root=as_root, mpi_options=mpi_options))
        if mpirun else (),
        processes=() if mpirun else tuple(node_processes(job, run_id, slots, agent=AGENT, unset=hidden)),
        env=run_env(job, run_id, workspace, slots, node_cpus=requests[0].cpu_share, cluster=compute,
                    node_gpus=len(requests[0].gpus)),
        ranks=tuple(rank_layout(job, slots)), data=data,
        notices=(*notices, *cache_notices), services=plan_services(job, run_id, slots, agent=AGENT),
        data_mounts=mounts, data_runtime=settings.to_dict() if settings else None,
        launch_env=mpirun_env(job) if mpirun else {})


def agent_config(backend: NodeBackend, requests: list[NodeRequest], run_id: str, sandbox_root: Path) -> dict[str, Any]:
    """What the launch agent needs, all fixed by the platform: the tools it runs (absolute paths,
    found on the supervisor's PATH) and the environment it runs them with. Nothing in it comes from
    the job but the name of the env file on the node."""
    sandbox_root.mkdir(parents=True, exist_ok=True)  # a mount point, private to each sandbox
    config: dict[str, Any] = {
        "backend": backend.name,
        "as_root": os.geteuid() == 0,
        "tools": backend.agent_tools(),
        "host_env": {k: v for k, v in os.environ.items()
                     if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") or k.startswith("DOCKER_")},
        "env_file": node_env_file(run_id),
        "sandbox_root": str(sandbox_root),
        "software": sandbox_software(),
        "hosts": {r.name: backend.agent_entry(r) for r in requests},
    }
    config["exec"] = exec_table(type(backend), config)
    return config


def exec_table(backend: type[NodeBackend], config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per host, the argv around the command (`before` + command + `after`) and where the agent
    records itself: computed here once a run, so that the agent imports nothing of amlemu."""
    table = {}
    for host in config["hosts"]:
        argv = backend.agent_argv(config, host, COMMAND)
        at = argv.index(COMMAND)
        table[host] = {"before": argv[:at], "after": argv[at + 1:], "record": backend.agent_record(config, host),
                       "resident": backend.agent_resident(config, host, COMMAND)}
    return table


def agent_file(config: dict[str, Any]) -> bytes:
    """What the agent reads of `config` (its exec table and host environment), in `marshal`'s format:
    the agent starts once per node and launch, and json's import alone cost it ~17 ms (runs/agent.py)."""
    return marshal.dumps({"exec": config["exec"], "host_env": config["host_env"]})
