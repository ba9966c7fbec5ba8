"""Azure VM sizes that AmlCompute clusters use, and how a node of that size is scaled to this machine."""
from __future__ import annotations

from dataclasses import dataclass

from amlemu.errors import ConfigError

GIB = 1024**3


@dataclass(frozen=True)
class VmSize:
    name: str  # canonical Azure spelling
    vcpus: int
    memory_gib: float
    gpus: int = 0
    gpu_model: str = ""
    temp_disk_gib: int = 0  # the local (temp) SSD, which AmlCompute mounts at /mnt: the node's disk


# From Azure's published size tables (temp disk: "Temp storage (SSD) GiB"; NVMe disks left out).
VM_SIZES: dict[str, VmSize] = {
    s.name.upper(): s
    for s in (
        VmSize("Standard_D2_v2", 2, 7, temp_disk_gib=100),
        VmSize("Standard_D3_v2", 4, 14, temp_disk_gib=200),
        VmSize("Standard_D4_v2", 8, 28, temp_disk_gib=400),
        VmSize("Standard_DS2_v2", 2, 7, temp_disk_gib=14),
        VmSize("Standard_DS3_v2", 4, 14, temp_disk_gib=28),
        VmSize("Standard_DS12_v2", 4, 28, temp_disk_gib=56),
        VmSize("Standard_F4s_v2", 4, 8, temp_disk_gib=32),
        VmSize("Standard_F8s_v2", 8, 16, temp_disk_gib=64),
        VmSize("Standard_E4s_v3", 4, 32, temp_disk_gib=64),
        VmSize("Standard_NC6", 6, 56, 1, "K80", temp_disk_gib=340),
        VmSize("Standard_NC12", 12, 112, 2, "K80", temp_disk_gib=680),
        VmSize("Standard_NC24", 24, 224, 4, "K80", temp_disk_gib=1440),
        VmSize("Standard_NC6s_v3", 6, 112, 1, "V100", temp_disk_gib=736),
        VmSize("Standard_NC12s_v3", 12, 224, 2, "V100", temp_disk_gib=1474),
        VmSize("Standard_NC24s_v3", 24, 448, 4, "V100", temp_disk_gib=2948),
        VmSize("Standard_NC4as_T4_v3", 4, 28, 1, "T4", temp_disk_gib=180),
        VmSize("Standard_NC24ads_A100_v4", 24, 220, 1, "A100", temp_disk_gib=64),
        VmSize("Standard_ND40rs_v2", 40, 672, 8, "V100", temp_disk_gib=2948),
        VmSize("Standard_ND96asr_v4", 96, 900, 8, "A100", temp_disk_gib=6000),
        VmSize("Standard_NC40ads_H100_v5", 40, 320, 1, "H100", temp_disk_gib=128),
        VmSize("Standard_ND96isr_H100_v5", 96, 1900, 8, "H100", temp_disk_gib=1000),
    )
}


# `compute: local` (the job runs on this machine, as Azure ML's local runs do): a node as large as
# this machine (node_limits caps every size at it). Only the platform's local pool has this size.
LOCAL_SIZE = VmSize("Local", 1 << 16, float(1 << 20))


def lookup(name: str, field: str = "vm_size") -> VmSize:
    """Case-insensitive, as Azure is; unknown sizes are refused with the known ones."""
    if name.strip().upper() == LOCAL_SIZE.name.upper():
        return LOCAL_SIZE
    try:
        return VM_SIZES[name.strip().upper()]
    except KeyError:
        known = ", ".join(sorted(s.name for s in VM_SIZES.values()))
        raise ConfigError(field, f"unknown size '{name}'", f"use one of: {known}") from None


# --- the platform's pools: serverless compute and `compute: local` -----------------------------
SERVERLESS = "serverless"  # what a job with no compute shows as its compute, as Azure ML's jobs do
LOCAL = "local"
# Azure ML picks a serverless job's size "based on quota, performance, cost and disk size" when it
# names none; its serverless compute page gives a single DS3_v2-class node as the default.
DEFAULT_SERVERLESS_SIZE = "Standard_DS3_v2"
# queue_settings.job_tier (azure-ai-ml's schema; the REST API's JobTier adds "Null": no tier): spot
# runs on low-priority (preemptible) nodes, the other tiers (and none) on dedicated ones.
# Basic/standard/premium differ on Azure in how long a job may queue, which is not emulated.
JOB_TIERS = {"spot": "lowpriority", "basic": "dedicated", "standard": "dedicated", "premium": "dedicated"}
# A pool's name is longer than the 24 characters an AmlCompute name may have: no user's cluster
# can take it, yet it is a valid hostname and container name for its nodes.
_POOL_PREFIXES = (f"{SERVERLESS}-", f"{LOCAL}-")


def job_tier(value: object, field: str = "queue_settings.job_tier") -> str:
    """The tier's canonical lower-case name; unknown ones are refused with the known ones."""
    tier = str(value).strip().lower()
    if tier not in JOB_TIERS:
        raise ConfigError(field, f"'{value}' is not a job tier", f"use one of: {', '.join(JOB_TIERS)}")
    return tier


def serverless_pool(instance_type: str | None, tier: str | None) -> str:
    """The name of the home's serverless pool for this size and tier (one pool per pair)."""
    size = lookup(instance_type or DEFAULT_SERVERLESS_SIZE, "resources.instance_type").name
    priority = "spot" if tier is not None and JOB_TIERS[job_tier(tier)] == "lowpriority" else "dedicated"
    return f"{SERVERLESS}-{size.lower().replace('_', '-')}-{priority}"


LOCAL_POOL = f"{LOCAL}-pool-on-this-machine"


def is_pool(name: str) -> bool:
    return len(name) > 24 and name.startswith(_POOL_PREFIXES) and name.replace("-", "").isalnum() and name.isascii()


def shown_compute(cluster: str) -> str:
    """A run's compute as users see it: `serverless` or `local` for the platform's pools."""
    if is_pool(cluster):
        return LOCAL if cluster.startswith(f"{LOCAL}-") else SERVERLESS
    return cluster


@dataclass(frozen=True)
class NodeLimits:
    """What one emulated node may use here, and the notice when that is less than the real size.

    `cpus` is the node's hard limit; `cpu_share` is its fair share when all the cluster's nodes run
    at once (they share this machine's cores), which is what its processes should plan threads on.
    A hard limit at the share would throttle bursts: measured here, 12% of Horovod MNIST throughput.
    """

    cpus: float
    cpu_share: float
    memory_bytes: int
    gpus: int
    notice: str | None = None


def node_limits(size: VmSize, *, host_cpus: int, host_memory_bytes: int, host_gpus: int = 0,
                nodes: int = 1) -> NodeLimits:
    """A node gets its size's CPUs, memory and GPUs, capped at what this machine has (never refused)."""
    cpus = float(min(size.vcpus, host_cpus))
    share = round(min(float(size.vcpus), host_cpus / max(1, nodes)), 2)
    memory = min(int(size.memory_gib * GIB), int(host_memory_bytes * 0.9))
    gpus = min(size.gpus, host_gpus)
    scaled = []
    if share < size.vcpus:
        scaled.append(f"{size.vcpus} vCPUs -> {cpus:g} (a fair share of {share:g} with {nodes} nodes busy)")
    if memory < size.memory_gib * GIB:
        scaled.append(f"{size.memory_gib:g} GiB -> {memory / GIB:.1f} GiB")
    if gpus < size.gpus:
        scaled.append(f"{size.gpus} {size.gpu_model} GPUs -> {gpus}")
    local = size is LOCAL_SIZE  # this machine's own size: nothing is scaled down
    notice = f"{size.name} scaled to this machine: {', '.join(scaled)} per node" if scaled and not local else None
    return NodeLimits(cpus=cpus, cpu_share=share, memory_bytes=memory, gpus=gpus, notice=notice)


def rest_compute(cluster: str) -> str | None:
    """A run's compute in Azure's Job resource: none for serverless (as Azure ML reports it)."""
    shown = shown_compute(cluster)
    return None if shown == SERVERLESS else shown
