"""How AmlCompute starts a job's processes, per distribution, as pure functions (the dry run shows
what they return; the supervisor executes it):

- mpi: the platform's `mpirun` across the nodes (contract.launch_argv); Open MPI starts and numbers
  the ranks (OMPI_COMM_WORLD_*).
- pytorch: no mpirun. Each node starts process_count_per_instance processes itself; each gets RANK
  and LOCAL_RANK, on top of its node's MASTER_ADDR, MASTER_PORT, WORLD_SIZE and NODE_RANK
  (contract.run_env, contract.node_env). No OMPI_* and no AZ_BATCH_MASTER_NODE.
- tensorflow: no mpirun. worker_count workers (default: the instance count) then
  parameter_server_count parameter servers, one process per task, spread evenly over the nodes in
  that order; each gets TF_CONFIG naming every task's host:port and its own task.
- none: its one process, started on the node.

The host starts each process of a node-launched job through the launch agent, as ssh would run a
command on the node (`docker exec` into its container, or a process node's sandbox): the node's
shell has the run's env file, and the command adds the process's own variables.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from amlemu.runs.contract import NodeSlot, Rank, node_workdir, process_argv, rank_layout
from amlemu.specs import DistributionType, JobSpec

# The port of TF_CONFIG's example in Azure ML's distributed-training guide. Task t listens on
# TF_PORT + t: unique on every node, also where all nodes share one address (process nodes).
TF_PORT = 2222
LAUNCHERS = {DistributionType.MPI: "mpirun", DistributionType.PYTORCH: "node", DistributionType.TENSORFLOW: "node",
             DistributionType.NONE: "node"}


@dataclass(frozen=True)
class ProcessPlan:
    """One process a node starts itself: where, what, with which variables of its own."""

    rank: int  # its global rank: the index of its log, user_logs/std_log_process_<rank>.txt
    node: str
    local_rank: int
    argv: tuple[str, ...]  # what runs on the node, in the run's working folder
    env: dict[str, str]  # what it adds to its node's environment (RANK, LOCAL_RANK; TF_CONFIG)
    unset: tuple[str, ...]  # image defaults it must not see (the mirror image's OMPI_* for mpirun)
    launch: tuple[str, ...]  # what the host runs to start it: the launch agent, the node, the command


def launcher(job: JobSpec) -> str:
    """`mpirun` (the platform's, across the nodes) or `node` (each node starts its own processes)."""
    return LAUNCHERS[job.distribution.type]


def tf_tasks(job: JobSpec) -> list[tuple[str, int]]:
    """(type, index) of each process, in rank order: the workers, then the parameter servers."""
    dist = job.distribution
    return [("worker", i) for i in range(dist.worker_count or job.instance_count)] + \
        [("ps", i) for i in range(dist.parameter_server_count)]


def tf_config(job: JobSpec, nodes: list[NodeSlot], rank: int) -> str:
    """TF_CONFIG as Azure ML sets it for task `rank`: the cluster (worker, and ps when there are
    parameter servers) as host:port lists, this process's task, environment "cloud"."""
    per_node = job.process_count // job.instance_count
    tasks = tf_tasks(job)
    cluster: dict[str, list[str]] = {}
    for t, (kind, _) in enumerate(tasks):
        cluster.setdefault(kind, []).append(f"{nodes[t // per_node].address}:{TF_PORT + t}")
    kind, index = tasks[rank]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"})


def process_env(job: JobSpec, rank: Rank, nodes: list[NodeSlot]) -> dict[str, str]:
    """What differs per process of a node-launched job."""
    kind = job.distribution.type
    if kind is DistributionType.PYTORCH:
        return {"RANK": str(rank.rank), "LOCAL_RANK": str(rank.local_rank)}
    if kind is DistributionType.TENSORFLOW:
        return {"TF_CONFIG": tf_config(job, nodes, rank.rank)}
    return {}


def node_command(workdir: str, argv: tuple[str, ...], env: dict[str, str], unset: tuple[str, ...] = ()) -> str:
    """The shell command the agent runs on the node (after its shell sourced the run's env file)."""
    steps = [f"cd {shlex.quote(workdir)}"]
    if unset:
        steps.append(f"unset {' '.join(unset)}")
    if env:
        steps.append("export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items()))
    return " && ".join(steps) + f" && exec {shlex.join(argv)}"


def node_processes(job: JobSpec, run_id: str, nodes: list[NodeSlot], *, agent: str,
                   unset: tuple[str, ...] = ()) -> list[ProcessPlan]:
    """Every process of a node-launched job, in rank order (ranks fill node 0 first)."""
    if launcher(job) != "node":
        raise ValueError(f"a {job.distribution.type.value} job is launched by mpirun, not by its nodes")
    if len(nodes) != job.instance_count:
        raise ValueError(f"{job.instance_count} nodes needed, {len(nodes)} given")
    argv = tuple(process_argv(job, run_id))
    found = []
    for rank in rank_layout(job, nodes):
        env = process_env(job, rank, nodes)
        command = node_command(node_workdir(run_id), argv, env, unset)
        found.append(ProcessPlan(rank.rank, rank.node, rank.local_rank, argv, env, unset, (agent, rank.node, command)))
    return found
