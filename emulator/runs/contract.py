"""The AmlCompute node contract, as pure functions: paths on a node, the environment every process
sees, the placement of ranks, and the mpirun the platform builds for MPI jobs (users never write
mpirun; runs/launchers.py: how other distributions start).

Both backends give every node the same view: its local disk at /mnt/azureml (which holds only the
folder of the run it serves) and its own blob cache, read-only, at /mnt/amlemu/cache; so a path
resolved once (a working directory, an input) is valid on every node, as on AmlCompute. Nothing of
the workspace (other runs, secrets) is visible on a node.
"""
from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass

from amlemu.jobs.jobyaml import substitute_bindings
from amlemu.runs.mpi import MpiLaunch, mpirun_argv
from amlemu.specs import DataInput, DataMode, DistributionType, JobSpec
from amlemu.storage.assets import default_output_uri  # noqa: F401 - one formula, re-exported for targets
from amlemu.storage.datastores import parse_uri
from amlemu.storage.urlinputs import is_url
from amlemu.storage.urlinputs import location as url_location

NODE_ROOT = "/mnt/azureml"
CACHE_ROOT = "/mnt/amlemu/cache"  # the node's blob cache, read-only inside the node
# Azure ML's v1 runtime runs a script through this file of the working folder (runs/v1injector.py):
# `python[3[.x]] script.py ...` at the command's start (not `python -m ...`) goes through it.
V1_INJECTOR = "azureml-setup/context_manager_injector.py"
PYTHON_SCRIPT_RE = re.compile(r"^(\s*(?:\S*/)?python[\d.]*)\s+(?=[^-\s])")
LOCAL_SOURCE = "_local"  # the cache folder of inputs given as local paths
MASTER_PORT = 6105  # what AmlCompute uses for AZ_BATCH_MASTER_NODE and MASTER_PORT
# Azure Batch's task root and the folder shared by all tasks of a node (learn.microsoft.com, "Azure
# Batch runtime environment variables": /mnt/batch/tasks, /mnt/batch/tasks/shared on Linux).
BATCH_ROOT = "/mnt/batch/tasks"
# The node's MLflow store is seeded with the job's experiment, which sqlite numbers 1 (0 is MLflow's
# Default); MLFLOW_EXPERIMENT_ID must name it (Azure ML: the experiment's GUID, AZUREML_EXPERIMENT_ID).
NODE_MLFLOW_EXPERIMENT_ID = "1"
# hwloc's I/O discovery reads every PCI device's configuration through sysfs: ~40 ms of CPU for each
# MPI daemon and for mpirun in a VM, twice that on a busy machine, for a map of devices nothing here
# places by (a node's GPUs are its container's). Off for the platform's processes; the ranks' own
# environment stays as the job declared it (a job that sets the variable keeps its own).
HWLOC_VAR, HWLOC_NO_IO = "HWLOC_COMPONENTS", "-linuxio,-pci"


@dataclass(frozen=True)
class NodeSlot:
    """A node as a launch sees it: its hostname and the address the other nodes reach it at."""

    index: int
    name: str
    address: str


@dataclass(frozen=True)
class Rank:
    rank: int
    node: str
    local_rank: int


def run_folder_id(run_id: str) -> str:
    """AmlCompute names a run's folder on the node by a 32-hex id, not by the job name (which is in
    AZUREML_RUN_ID): here derived from the run id, so every node and every attempt agrees."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"amlemu:run:{run_id}").hex


def job_rel(run_id: str) -> str:
    """The run's folder on a node's disk, relative to the disk (the host's node_dir)."""
    return f"cr/j/{run_folder_id(run_id)}"


def node_job_dir(run_id: str) -> str:
    return f"{NODE_ROOT}/{job_rel(run_id)}"


def node_workdir(run_id: str) -> str:
    return f"{node_job_dir(run_id)}/exe/wd"


def node_env_file(run_id: str) -> str:
    """The file the platform writes the run's environment to; each node's shell sources it."""
    return f"{node_job_dir(run_id)}/amlemu-env.sh"


def data_dir(run_id: str, name: str) -> str:
    """Where AmlCompute materialises a data input (INPUT_<name>) or output (<name>) on the node."""
    return f"{node_job_dir(run_id)}/cap/data-capability/wd/{name}"


def mount_dir(run_id: str, datastore: str) -> str:
    """A datastore as the run sees it mounted (it points into the node's read-only cache)."""
    return f"{node_job_dir(run_id)}/mounts/{datastore}"


@dataclass(frozen=True)
class Binding:
    """One data input or output of a run, as the node sees it: pure data, shown by the dry run."""

    ref: str  # inputs.<name> | outputs.<name>
    type: str  # uri_folder | uri_file
    mode: DataMode
    datastore: str  # LOCAL_SOURCE for an input from a local path
    path: str  # within the datastore (a local input: its absolute path without the leading /)
    uri: str  # as the job gave it (outputs without a path: Azure ML's default)
    node_path: str  # what ${{<ref>}} and $AZUREML_DATAREFERENCE_<name> resolve to

    @property
    def name(self) -> str:
        return self.ref.partition(".")[2]

    @property
    def is_output(self) -> bool:
        return self.ref.startswith("outputs.")


def bindings(job: JobSpec, run_id: str) -> list[Binding]:
    found = []
    for kind, items in (("inputs", job.inputs), ("outputs", job.outputs)):
        for name, data in items.items():
            if not isinstance(data, DataInput):
                continue
            uri = data.path or default_output_uri(run_id, name)
            if is_url(data.path):  # read by the host into the node's cache, as a datastore (storage/urlinputs.py)
                datastore, path = url_location(data.path, data.type)
            else:
                datastore, path = parse_uri(uri) if data.on_datastore or not data.path else \
                    (LOCAL_SOURCE, data.path.lstrip("/"))
            folder = data_dir(run_id, f"INPUT_{name}" if kind == "inputs" else name)
            leaf = f"{folder}/{path.rsplit('/', 1)[-1]}" if data.type == "uri_file" else folder
            node_path = uri if data.mode is DataMode.DIRECT else leaf
            found.append(Binding(f"{kind}.{name}", data.type, data.mode, datastore, path, uri, node_path))
    return found


def resolve_command(job: JobSpec, run_id: str) -> str:
    """The command with ${{inputs.x}} / ${{outputs.y}} replaced: literals by their value, data by its
    node path; a v1 job's `python script.py` run through the v1 runtime's injector, as Azure ML runs it."""
    values = {f"inputs.{name}": str(v) for name, v in job.inputs.items()}
    values.update({b.ref: b.node_path for b in bindings(job, run_id)})
    command = substitute_bindings(job.command, values)
    return PYTHON_SCRIPT_RE.sub(rf"\1 {V1_INJECTOR} ", command, count=1) if job.log_layout == "v1" else command


def node_tracking_dir(run_id: str) -> str:
    """Each node's own MLflow store (nodes see no shared folder); the host merges them into the
    run's record when the job ends."""
    return f"{node_job_dir(run_id)}/tracking"


def tracking_uri(run_id: str) -> str:
    return f"sqlite:///{node_tracking_dir(run_id)}/mlflow.db"


def workspace_arm_id(workspace: dict[str, str]) -> str:
    return (f"/subscriptions/{workspace['subscription_id']}/resourceGroups/{workspace['resource_group']}"
            f"/providers/Microsoft.MachineLearningServices/workspaces/{workspace['workspace_name']}")


def workspace_guid(workspace: dict[str, str]) -> str:
    """AZUREML_WORKSPACE_ID: a GUID, as Azure's workspaceId; the one the service reports for the
    workspace (emulator/service/routes.py derives it the same way from the ARM id)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, workspace_arm_id(workspace)))


def experiment_guid(workspace: dict[str, str], experiment: str) -> str:
    """AZUREML_EXPERIMENT_ID: Azure ML gives each experiment a GUID; stable per workspace and name."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{workspace_arm_id(workspace)}/experiments/{experiment}"))


def rank_layout(job: JobSpec, nodes: list[NodeSlot]) -> list[Rank]:
    """Ranks fill node 0 first, then node 1 (mpirun --map-by slot with P slots per host)."""
    per_node = job.process_count // job.instance_count
    return [Rank(n * per_node + local, node.name, local) for n, node in enumerate(nodes) for local in range(per_node)]


def threads_per_process(job: JobSpec, node_cpus: float) -> int:
    return max(1, int(node_cpus) // (job.process_count // job.instance_count))


def run_env(job: JobSpec, run_id: str, workspace: dict[str, str], nodes: list[NodeSlot],
            node_cpus: float, *, cluster: str = "", node_gpus: int = 0) -> dict[str, str]:
    """What every process of the run sees, whatever its node. Unlike real nodes, emulated nodes
    share this machine's cores: OMP_NUM_THREADS tells each process its share (the job may override)."""
    head = nodes[0]
    env = {
        "AZUREML_RUN_ID": run_id,
        # v1's run identity (azureml/_run_impl/constants.py reads both): GUIDs, as Azure gives them.
        "AZUREML_WORKSPACE_ID": workspace_guid(workspace),
        "AZUREML_EXPERIMENT_ID": experiment_guid(workspace, job.experiment_name),
        "AZUREML_ARM_SUBSCRIPTION": workspace["subscription_id"],
        "AZUREML_ARM_RESOURCEGROUP": workspace["resource_group"],
        "AZUREML_ARM_WORKSPACE_NAME": workspace["workspace_name"],
        "AZUREML_ARM_PROJECT_NAME": job.experiment_name,
        "AZUREML_EXPERIMENT_NAME": job.experiment_name,
        "AZUREML_OUTPUT_DIRECTORY": "outputs",
        "AZUREML_CR_EXECUTION_WORKING_DIR_PATH": node_workdir(run_id),
        "AZUREML_NODE_COUNT": str(job.instance_count),
        "MLFLOW_TRACKING_URI": tracking_uri(run_id),
        "MLFLOW_EXPERIMENT_NAME": job.experiment_name,
        # Azure ML's MLflow run is the job's run (its id is the job name); mlflow.start_run() attaches
        # to it. The node's store is seeded with it before the launch (rundisk.lay_out).
        "MLFLOW_RUN_ID": run_id,
        "MLFLOW_EXPERIMENT_ID": NODE_MLFLOW_EXPERIMENT_ID,
        # Batch AI's names, read by user launch scripts (torchrun --master_addr, hostfiles).
        "AZ_BATCHAI_JOB_MASTER_NODE_IP": head.address,
        "AZ_BATCH_HOST_LIST": ",".join(n.address for n in nodes),  # Batch: "nodeIP,nodeIP"
        "AZ_BATCHAI_CLUSTER_NAME": cluster or job.compute,
        "AZ_BATCHAI_GPU_COUNT": str(node_gpus),  # the GPUs of a node (all nodes of a cluster alike)
        "AZ_BATCH_NODE_ROOT_DIR": BATCH_ROOT,
        "AZ_BATCH_NODE_SHARED_DIR": f"{BATCH_ROOT}/shared",
        "OMP_NUM_THREADS": str(threads_per_process(job, node_cpus)),
    }
    # v1's DataReference.as_mount() puts $AZUREML_DATAREFERENCE_<name> in the arguments.
    env.update({f"AZUREML_DATAREFERENCE_{b.name}": b.node_path for b in bindings(job, run_id)})
    kind = job.distribution.type
    if kind in (DistributionType.MPI, DistributionType.NONE):  # the MPI master: not for torch's or TF's launch
        if job.instance_count > 1:
            env["AZ_BATCH_MASTER_NODE"] = f"{head.address}:{MASTER_PORT}"
        else:
            env["AZ_BATCHAI_MPI_MASTER_NODE"] = head.address
    if kind is DistributionType.PYTORCH:
        env.update(MASTER_ADDR=head.address, MASTER_PORT=str(MASTER_PORT), WORLD_SIZE=str(job.process_count))
    env.update(job.environment_variables)  # the job's own variables win, as on AmlCompute
    return env


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def env_file_text(env: dict[str, str]) -> str:
    """The environment as a POSIX shell file of `export NAME='value'` lines (any value, newlines
    included, survives the quoting). Names that are not shell identifiers are refused: the
    validator names them first, this is the last guard before a node's shell reads the file."""
    bad = [name for name in env if not ENV_NAME_RE.match(name)]
    if bad:
        raise ValueError(f"environment variable name(s) {', '.join(map(repr, bad))} are not valid")
    return "".join(f"export {name}={shlex.quote(str(value))}\n" for name, value in env.items())


def node_env(job: JobSpec, node: NodeSlot) -> dict[str, str]:
    """What differs per node; the launch agent sets it on the node's processes."""
    # AZUREML_CR_NODE_RANK: the node's index in the job, on every distribution (torchrun --node_rank).
    env = {"AZ_BATCHAI_TASK_INDEX": str(node.index), "AZUREML_CR_NODE_RANK": str(node.index),
           "AZ_BATCH_NODE_ID": node.name}
    if job.distribution.type is DistributionType.PYTORCH:
        env["NODE_RANK"] = str(node.index)
    return env


def process_argv(job: JobSpec, run_id: str) -> list[str]:
    """Every process runs the job's command with bash, as AmlCompute does."""
    return ["/bin/bash", "-c", resolve_command(job, run_id)]


def launch_argv(job: JobSpec, run_id: str, nodes: list[NodeSlot], *, agent: str, as_root: bool,
                mpi_options: tuple[str, ...] = ()) -> list[str]:
    """The mpirun the platform runs on the host to start an MPI job on its nodes (other
    distributions are started by the nodes themselves: runs/launchers.py). The agent gives each
    node's processes run_env + node_env (ranks inherit them from the node's MPI daemon)."""
    if job.distribution.type is not DistributionType.MPI:
        raise ValueError(f"a {job.distribution.type.value} job is not launched by mpirun")
    if len(nodes) != job.instance_count:
        raise ValueError(f"{job.instance_count} nodes needed, {len(nodes)} given")
    per_node = job.process_count // job.instance_count
    no_io = bool(mpirun_env(job))
    program = ["/usr/bin/env", "-u", HWLOC_VAR] if no_io else []  # ranks inherit their daemon's environment
    launch = MpiLaunch(program=[*program, *process_argv(job, run_id)], nprocs=job.process_count,
                       hosts=[(node.name, per_node) for node in nodes], as_root=as_root,
                       tag_output=True)
    argv = mpirun_argv(launch)
    at = argv.index("-np")
    platform = ["--mca", "plm_rsh_agent", agent,
                # mpirun starts every node's daemon itself through the agent (no sshd on nodes),
                # and keeps them attached so killing the launch kills the whole job.
                "--mca", "plm_rsh_no_tree_spawn", "1", "--leave-session-attached",
                # Node names resolve only on the nodes' network: mpirun asked this machine's DNS
                # for each (is it this machine?) before launching, ~80 s for 128 docker nodes here.
                "--mca", "if_base_do_not_resolve", "1",
                "--map-by", "slot", "-wdir", node_workdir(run_id), *mpi_options]
    if no_io:
        platform += ["--mca", "orte_launch_agent", f"env {HWLOC_VAR}={HWLOC_NO_IO} orted"]
    return argv[:at] + platform + argv[at:]


def mpirun_env(job: JobSpec) -> dict[str, str]:
    """What the platform's mpirun runs with beside the host's variables (and its daemons, through
    their launch command): hwloc's I/O discovery off, unless the job set hwloc's variable itself."""
    return {} if HWLOC_VAR in job.environment_variables else {HWLOC_VAR: HWLOC_NO_IO}
