"""Pure data: clusters and the run lifecycle, and (from amlemu.jobspec, re-exported: one import for
users of the Python API) the job. No I/O here; validation raises ConfigError."""
from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass

from amlemu import skus
from amlemu.errors import ConfigError, StateError
from amlemu.names import MACHINES_ALL, check_machine_name
from amlemu.jobspec import (  # noqa: F401 - the job's vocabulary, re-exported
    SHM_RE,
    DEFAULT_SHM_SIZE,
    RUNTIME_INSTALL,
    shm_bytes,
    DistributionType,
    Distribution,
    DataMode,
    INPUT_MODES,
    OUTPUT_MODES,
    URL_SCHEMES,
    is_url,
    DataInput,
    SERVICES_RUN,
    SERVICE_NOT_RUN,
    ServiceSpec,
    JobSpec,
)

NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{1,23}$")  # AmlCompute: 2-24 chars, letter first
# AmlCompute's node limits (Azure ML's quota page): a cluster has at most 65,000 nodes; its default
# quota is 100, raised on request. The emulator's quota is AMLEMU_MAX_INSTANCES (default 100): each
# node is a container or a process group on this one machine, and a job may ask for all of them.
AZURE_MAX_INSTANCES = 65_000
DEFAULT_MAX_INSTANCES_QUOTA = 100
QUOTA_VARIABLE = "AMLEMU_MAX_INSTANCES"
# nodeIdleTimeBeforeScaleDown is a .NET TimeSpan on Azure: at most TimeSpan.MaxValue (about 29,227 years).
MAX_IDLE_SECONDS = 922_337_203_685


class Priority(str, enum.Enum):
    DEDICATED = "dedicated"
    LOW_PRIORITY = "lowpriority"

    @classmethod
    def parse(cls, value: str) -> Priority:
        # v1 says dedicated/lowpriority, v2's tier says dedicated/low_priority.
        normalized = value.strip().lower().replace("_", "").replace("-", "")
        for member in cls:
            if member.value == normalized:
                return member
        raise ConfigError("vm_priority", f"'{value}' is not a priority",
                          "use dedicated or low_priority (az ml's tier; v1's lowpriority is taken too)")


@dataclass(frozen=True)
class ClusterSpec:
    """The fields of AmlCompute.provisioning_configuration (v1) / the AmlCompute entity (v2)."""

    name: str
    vm_size: str = "Standard_D2_v2"
    vm_priority: Priority = Priority.DEDICATED
    min_nodes: int = 0
    max_nodes: int = 4
    idle_seconds_before_scaledown: int = 120
    # The machines (`amlemu machine add`) its nodes may be placed on: () this machine only, ("all",)
    # every machine known when it is created; not an AmlCompute field (Azure places nodes itself).
    machines: tuple[str, ...] = ()
    placement: str = "spread"  # spread | pack (machines/placement.py)

    def __post_init__(self) -> None:
        _check_machines(self)
        if not isinstance(self.name, str) or not (NAME_RE.fullmatch(self.name) or skus.is_pool(self.name)):
            raise ConfigError("name", f"'{self.name}' is not a valid compute name",
                              "use 2-24 letters, digits or hyphens, starting with a letter")
        object.__setattr__(self, "vm_size", skus.lookup(self.vm_size).name)
        if not isinstance(self.vm_priority, Priority):
            object.__setattr__(self, "vm_priority", Priority.parse(str(self.vm_priority)))
        for name in ("min_nodes", "max_nodes", "idle_seconds_before_scaledown"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(name, f"must be a non-negative integer, got {value!r:.60}")
        if self.max_nodes < 1:
            raise ConfigError("max_nodes", "must be at least 1")
        if self.max_nodes > AZURE_MAX_INSTANCES:
            raise ConfigError("max_nodes", f"{self.max_nodes} is above AmlCompute's limit of {AZURE_MAX_INSTANCES} "
                              "nodes per cluster", f"use at most {AZURE_MAX_INSTANCES}")
        if self.idle_seconds_before_scaledown > MAX_IDLE_SECONDS:
            raise ConfigError("idle_seconds_before_scaledown", f"{self.idle_seconds_before_scaledown} s is more "
                              f"than Azure ML's duration holds ({MAX_IDLE_SECONDS} s)", "give a shorter idle time")
        if self.max_nodes < self.min_nodes:
            raise ConfigError("max_nodes", f"{self.max_nodes} is below min_nodes {self.min_nodes}",
                              "raise max_nodes or lower min_nodes")

    @property
    def size(self) -> skus.VmSize:
        return skus.lookup(self.vm_size)


PLACEMENTS = ("spread", "pack")


def _check_machines(spec: ClusterSpec) -> None:
    machines = spec.machines
    if isinstance(machines, str) or not isinstance(machines, (list, tuple)):
        raise ConfigError("machines", f"must be a list of machine names, got {machines!r:.60}")
    for name in machines:
        if name != MACHINES_ALL:
            check_machine_name(name, "machines")
    if len(set(machines)) != len(machines) or (MACHINES_ALL in machines and len(machines) > 1):
        raise ConfigError("machines", f"{', '.join(map(str, machines))[:200]}: a machine named twice, or 'all' "
                          "with others", "name each machine once, or give all alone")
    object.__setattr__(spec, "machines", tuple(machines))
    if spec.placement not in PLACEMENTS:
        raise ConfigError("placement", f"{spec.placement!r:.60} is not a placement", "use spread or pack")


def max_instances_quota(environ: Mapping[str, str]) -> int:
    """The emulator's nodes-per-cluster quota: $AMLEMU_MAX_INSTANCES, else AmlCompute's default."""
    raw = environ.get(QUOTA_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_MAX_INSTANCES_QUOTA
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= AZURE_MAX_INSTANCES:
        raise ConfigError(f"${QUOTA_VARIABLE}", f"{raw[:40]!r} is not a node count",
                          f"give a whole number from 1 to {AZURE_MAX_INSTANCES}, or unset it (default "
                          f"{DEFAULT_MAX_INSTANCES_QUOTA})")
    return int(raw)


def check_quota(spec: ClusterSpec, quota: int) -> ClusterSpec:
    """A cluster being created or resized must fit the quota (a cluster already made keeps working)."""
    if spec.max_nodes > quota:
        raise ConfigError("max_nodes", f"{spec.max_nodes} nodes is above the emulator's quota of {quota} per cluster "
                          "(AmlCompute's default quota; a quota increase request on Azure)",
                          f"lower max_instances, or raise the quota with {QUOTA_VARIABLE}=<n> (at most "
                          f"{AZURE_MAX_INSTANCES}; every node runs on this machine)")
    return spec


class RunStatus(str, enum.Enum):
    """Azure ML's run statuses, in lifecycle order (azure-ai-ml's JobStatus). The emulator enters
    neither Starting nor Provisioning (AmlCompute jobs wait in Queued while nodes are created;
    Provisioning is on-demand compute's), nor NotResponding or Paused (no heartbeat, no pause):
    they are here so that a status read from Azure, or given by a client, is understood."""

    NOT_STARTED = "NotStarted"
    STARTING = "Starting"
    PROVISIONING = "Provisioning"
    QUEUED = "Queued"
    PREPARING = "Preparing"
    RUNNING = "Running"
    FINALIZING = "Finalizing"
    CANCEL_REQUESTED = "CancelRequested"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELED = "Canceled"
    NOT_RESPONDING = "NotResponding"
    PAUSED = "Paused"

    @property
    def is_terminal(self) -> bool:
        """As azure-ai-ml's RunHistoryConstants.TERMINAL_STATUSES (its wait stops on these)."""
        return self in _TERMINAL

    def can_become(self, target: RunStatus) -> bool:
        return target in _TRANSITIONS[self]

    def check_transition(self, target: RunStatus) -> None:
        if not self.can_become(target):
            raise StateError(f"a run cannot go from {self.value} to {target.value}")


_TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELED, RunStatus.NOT_RESPONDING,
                       RunStatus.PAUSED})
_ACTIVE = (RunStatus.NOT_STARTED, RunStatus.STARTING, RunStatus.PROVISIONING, RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING,
           RunStatus.FINALIZING)
_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.NOT_STARTED: frozenset({RunStatus.STARTING, RunStatus.QUEUED}),
    RunStatus.STARTING: frozenset({RunStatus.PROVISIONING, RunStatus.QUEUED}),
    RunStatus.PROVISIONING: frozenset({RunStatus.QUEUED, RunStatus.PREPARING}),
    RunStatus.QUEUED: frozenset({RunStatus.PREPARING}),
    # A preempted run goes back to the queue and is restarted on fresh nodes (low priority).
    RunStatus.PREPARING: frozenset({RunStatus.RUNNING, RunStatus.QUEUED}),
    RunStatus.RUNNING: frozenset({RunStatus.FINALIZING, RunStatus.QUEUED}),
    RunStatus.FINALIZING: frozenset({RunStatus.COMPLETED, RunStatus.FAILED}),
    RunStatus.CANCEL_REQUESTED: frozenset({RunStatus.CANCELED, RunStatus.FAILED}),
    RunStatus.NOT_RESPONDING: frozenset(),  # terminal for the SDK, which stops waiting there
    RunStatus.PAUSED: frozenset(),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELED: frozenset(),
}
for _status in _ACTIVE:
    # Any active run can be canceled or fail (gang failure, timeout, a lost node).
    _TRANSITIONS[_status] = _TRANSITIONS[_status] | {RunStatus.CANCEL_REQUESTED, RunStatus.FAILED}
