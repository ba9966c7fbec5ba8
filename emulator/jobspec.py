"""Pure data: the job as users write it (a command job: its distribution, data, services), the
vocabulary `amlemu.specs` re-exports. No I/O here; validation raises ConfigError."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlemu import skus
from amlemu.errors import ConfigError

# resources.shm_size: "(number)(unit), number greater than 0, unit b, k, m or g" (the REST API's
# JobResourceConfiguration.shmSize). Unset: 2g, azureml-core's _DEFAULT_SHM_SIZE (core/environment.py).
SHM_RE = re.compile(r"^([1-9][0-9]*)([bkmg]?)$", re.IGNORECASE)
DEFAULT_SHM_SIZE = "2g"

# A command that installs packages when it runs (Azure's hello-git and hello-notebook examples do).
RUNTIME_INSTALL = re.compile(r"(?:^|[;&|\s(])(?:pip3?|conda|mamba|python3? -m pip) install\b")


def shm_bytes(value: str) -> int:
    match = SHM_RE.match(value.strip())
    if not match:
        raise ConfigError("resources.shm_size", f"'{value}' is not a size",
                          "write a number greater than 0 with b, k, m or g, e.g. 2g")
    return int(match.group(1)) * 1024 ** "bkmg".index((match.group(2) or "b").lower())


class DistributionType(str, enum.Enum):
    NONE = "none"
    MPI = "mpi"
    PYTORCH = "pytorch"
    TENSORFLOW = "tensorflow"


@dataclass(frozen=True)
class Distribution:
    """az ml's distribution: mpi/pytorch take process_count_per_instance; tensorflow takes
    worker_count (None: the instance count, as az ml defaults it) and parameter_server_count."""

    type: DistributionType = DistributionType.NONE
    process_count_per_instance: int = 1
    worker_count: int | None = None
    parameter_server_count: int = 0

    def __post_init__(self) -> None:
        if self.process_count_per_instance < 1:
            raise ConfigError("distribution.process_count_per_instance",
                              f"must be at least 1, got {self.process_count_per_instance}")
        if self.worker_count is not None and self.worker_count < 1:
            raise ConfigError("distribution.worker_count", f"must be at least 1, got {self.worker_count}")
        if self.parameter_server_count < 0:
            raise ConfigError("distribution.parameter_server_count",
                              f"must be 0 or more, got {self.parameter_server_count}")


class DataMode(str, enum.Enum):
    """How a data input or output reaches the node (Azure ML v2 modes)."""

    RO_MOUNT = "ro_mount"
    RW_MOUNT = "rw_mount"
    DOWNLOAD = "download"
    UPLOAD = "upload"
    DIRECT = "direct"


INPUT_MODES = (DataMode.RO_MOUNT, DataMode.DOWNLOAD, DataMode.DIRECT)
OUTPUT_MODES = (DataMode.RW_MOUNT, DataMode.UPLOAD, DataMode.DIRECT)
URL_SCHEMES = ("https", "http", "wasbs", "wasb", "abfss", "abfs")  # inputs by URL (storage/urlinputs.py)


def is_url(path: Any) -> bool:
    """An input's path (or a literal input's value) that is a URL Azure ML reads."""
    return isinstance(path, str) and "://" in path and path.split("://", 1)[0].lower() in URL_SCHEMES


@dataclass(frozen=True)
class DataInput:
    """A uri_folder / uri_file input or output: a datastore URI (azureml://datastores/<ds>/paths/<p>)
    or, for inputs, an absolute local path. An output's empty path means Azure ML's default one."""

    type: str  # uri_folder | uri_file
    path: str
    mode: DataMode = DataMode.RO_MOUNT

    def __post_init__(self) -> None:
        if self.type not in ("uri_folder", "uri_file"):
            raise ConfigError("inputs.type", f"'{self.type}' is not supported", "use uri_folder or uri_file")

    @property
    def on_datastore(self) -> bool:
        return self.path.startswith("azureml://")


# `services:` types that run beside the job here (emulator/runs/services.py); the others are
# accepted with a notice saying why not.
SERVICES_RUN = ("jupyter_lab", "tensor_board")
SERVICE_NOT_RUN = {
    "ssh": "an SSH server needs the capabilities and terminals a node's sandbox drops; open a jupyter_lab "
           "service instead",
    "vs_code": "Azure ML's VS Code endpoint goes through Azure's tunnel service; open a jupyter_lab service "
               "instead (VS Code's Jupyter extension connects to its URL)",
}


@dataclass(frozen=True)
class ServiceSpec:
    """One of a job's `services:` (interactive endpoints beside the job), as azure-ai-ml's schema has it."""

    name: str
    type: str  # jupyter_lab, tensor_board, ssh, vs_code (custom and others: noticed)
    nodes: str | None = None  # "all": every node; None: the head node only (Azure ML's default)
    log_dir: str | None = None  # tensor_board: relative to the job's working folder
    ssh_public_keys: str | None = None

    def __post_init__(self) -> None:
        if self.nodes not in (None, "all"):
            raise ConfigError(f"services.{self.name}.nodes", f"'{self.nodes}' is not a choice",
                              "write nodes: all (every node), or leave it out for the head node")

    @property
    def notice(self) -> str | None:
        """Why this service does not run here; None for one that does."""
        if self.type in SERVICES_RUN:
            return None
        why = SERVICE_NOT_RUN.get(self.type, "Azure ML would open this endpoint beside the job; here the job "
                                  "runs without it")
        return f"services.{self.name} ({self.type}) is not emulated: {why}"


@dataclass(frozen=True)
class JobSpec:
    """A command job as the CLI v2 YAML describes it."""

    command: str
    code: Path | None  # None: no code (Azure ML runs the command in an empty working folder)
    compute: str
    experiment_name: str
    instance_count: int = 1
    distribution: Distribution = field(default_factory=Distribution)
    environment: str | None = None
    environment_variables: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str | int | float | bool | DataInput] = field(default_factory=dict)
    outputs: dict[str, DataInput] = field(default_factory=dict)
    display_name: str | None = None
    max_run_duration_seconds: int | None = None
    name: str | None = None  # the job's name, as az ml takes it from the YAML: the run id (None: generated)
    shm_size: str | None = None  # resources.shm_size: each node's /dev/shm (None: DEFAULT_SHM_SIZE)
    # Where the processes' logs go: "v2" (user_logs/std_log*.txt) or "v1" (azureml-logs/70_driver_log*.txt,
    # the v1 runtime's layout: runs submitted with azureml-core through `amlemu serve`).
    log_layout: str = "v2"
    # An inline environment (jobs.envyaml): image, conda_file (its content), build_path; None: by reference.
    environment_def: dict[str, Any] | None = None
    # Serverless compute (compute: serverless, or none): resources.instance_type (None: Azure ML's
    # default size) and queue_settings.job_tier (skus.JOB_TIERS; None: dedicated nodes).
    instance_type: str | None = None
    job_tier: str | None = None
    # `code: git+https://...` as written (code is then None): cloned at submit (emulator/jobs/gitcode.py).
    code_git: str | None = None
    # `services:` (interactive endpoints): jupyter_lab and tensor_board run beside the job
    # (emulator/runs/services.py); ssh, vs_code and others are accepted with a notice.
    services: tuple[ServiceSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise ConfigError("command", "is empty", "give the command that starts the job")
        if self.compute == skus.LOCAL and (self.instance_count > 1 or self.process_count > 1):
            raise ConfigError("compute", "a local job runs as one process on this machine: Azure ML refuses "
                              "instance_count or processes above 1 on local", "drop distribution and "
                              "instance_count, or leave compute out to run on serverless compute")
        if self.instance_type is not None:
            object.__setattr__(self, "instance_type", skus.lookup(self.instance_type, "resources.instance_type").name)
        if self.job_tier is not None:
            object.__setattr__(self, "job_tier", skus.job_tier(self.job_tier))
        if self.instance_count < 1:
            raise ConfigError("resources.instance_count", f"must be at least 1, got {self.instance_count}")
        if self.distribution.type is DistributionType.NONE and self.instance_count > 1:
            raise ConfigError("distribution", f"instance_count {self.instance_count} needs a distribution",
                              "add distribution: {type: mpi}, {type: pytorch} or {type: tensorflow}")
        if self.process_count % self.instance_count:
            raise ConfigError("distribution.worker_count", f"{self.process_count} TensorFlow tasks (workers and "
                              f"parameter servers) do not divide over {self.instance_count} instances",
                              "make worker_count + parameter_server_count a multiple of instance_count")
        if self.shm_size is not None:
            shm_bytes(self.shm_size)
        if self.max_run_duration_seconds is not None and self.max_run_duration_seconds < 1:
            raise ConfigError("limits.timeout", f"must be a positive number of seconds, "
                              f"got {self.max_run_duration_seconds}")

    @property
    def image(self) -> str | None:
        """A Docker image reference, when the environment is one (not an `azureml:` registered env)."""
        if self.environment_def is not None:
            return self.environment_def.get("image")
        if not self.environment or self.environment.startswith("azureml:"):
            return None
        return self.environment

    @property
    def shm_bytes(self) -> int:
        return shm_bytes(self.shm_size or DEFAULT_SHM_SIZE)

    @property
    def notices(self) -> tuple[str, ...]:
        """What the job declares that is accepted but not emulated (the dry run and the run say it)."""
        return self.remote_notices + tuple(service.notice for service in self.services if service.notice)

    @property
    def remote_notices(self) -> tuple[str, ...]:
        """What the job reads from the network: a repository cloned at submit, URL inputs fetched by
        this machine, URLs the job itself reads (a literal input, or mode direct)."""
        found = [f"code: {self.code_git} is cloned at submit (its ref, shallow) into the run's snapshot"] \
            if self.code_git else []
        for name, value in self.inputs.items():
            url = value.path if isinstance(value, DataInput) else value
            if not is_url(url):
                continue
            if isinstance(value, DataInput) and value.mode is not DataMode.DIRECT:
                found.append(f"inputs.{name}: {url} is read by this machine when the run starts ({value.mode.value})")
            else:
                found.append(f"inputs.{name}: the job reads {url} itself, so its nodes need network (docker nodes have "
                             "it; process nodes in their own network namespace have none)")
        if RUNTIME_INSTALL.search(self.command):
            found.append("command: it installs packages as it runs (pip/conda install), so its nodes need a package "
                         "index (docker nodes have network; process nodes have none): declare them in the "
                         "environment (its conda file's pip list) to have them built from your pip's sources")
        return tuple(found)

    @property
    def process_count(self) -> int:
        dist = self.distribution
        if dist.type is DistributionType.TENSORFLOW:  # one process per task, spread evenly over the nodes
            return (dist.worker_count or self.instance_count) + dist.parameter_server_count
        return self.instance_count * (1 if dist.type is DistributionType.NONE else dist.process_count_per_instance)
