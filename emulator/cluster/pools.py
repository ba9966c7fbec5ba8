"""The platform's own clusters: serverless compute and `compute: local`.

A job with no compute (or `compute: serverless`) runs on the home's serverless pool for its
`resources.instance_type` (Azure ML's default size when none) and `queue_settings.job_tier` (spot:
low-priority, preemptible nodes). `compute: local` runs on the home's local pool: nodes as large as
this machine, one process per job. A pool is an ordinary emulated cluster that the platform makes
on first use: its nodes are made for a job and removed as soon as it ends (scale-down after 0 s),
and up to the quota of them exist at once, so a job never waits behind another (as on Azure, where
serverless jobs do not queue behind each other). Its name is longer than an AmlCompute name may be,
so no user's cluster can collide with it; users see `serverless` / `local` (skus.shown_compute).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from amlemu import skus
from amlemu.cluster.store import Cluster, Store
from amlemu.errors import CapacityError, ConfigError, NotFoundError, StateError
from amlemu.specs import ClusterSpec, JobSpec, Priority, max_instances_quota


def pool_spec(job: JobSpec, environ: Mapping[str, str]) -> ClusterSpec | None:
    """The pool the job runs on; None when it names a cluster of its own."""
    quota = max_instances_quota(environ)
    if job.compute == skus.SERVERLESS:
        tier = skus.JOB_TIERS[job.job_tier] if job.job_tier else "dedicated"
        return ClusterSpec(skus.serverless_pool(job.instance_type, job.job_tier),
                           vm_size=job.instance_type or skus.DEFAULT_SERVERLESS_SIZE,
                           vm_priority=Priority.parse(tier), min_nodes=0, max_nodes=quota,
                           idle_seconds_before_scaledown=0)
    if job.compute == skus.LOCAL:
        return ClusterSpec(skus.LOCAL_POOL, vm_size=skus.LOCAL_SIZE.name, min_nodes=0, max_nodes=quota,
                           idle_seconds_before_scaledown=0)
    return None


def check_user_compute(spec: ClusterSpec) -> None:
    """A user's compute may take neither a pool's name nor the local pool's size."""
    if skus.is_pool(spec.name):
        raise ConfigError("name", f"'{spec.name}' is the name of amlemu's {skus.shown_compute(spec.name)} pool",
                          "use 2-24 letters, digits or hyphens, starting with a letter")
    if spec.size is skus.LOCAL_SIZE:
        raise ConfigError("size", "Local is the size of `compute: local` only", "give an Azure VM size")


def cluster_for(store: Store, job: JobSpec, environ: Mapping[str, str], backend: Callable[[], str],
                make: Callable[[ClusterSpec, str], Cluster] | None = None) -> Cluster:
    """The cluster the job runs on. For a pool not made yet: with `make` (submit) it is made;
    without (a dry run, a validation) a record of what would be made, stored nowhere."""
    pool = pool_spec(job, environ)
    if pool is None:
        cluster = store.cluster(job.compute)
    else:
        try:
            cluster = store.cluster(pool.name)
        except NotFoundError:
            chosen = backend()
            try:
                cluster = make(pool, chosen) if make else Cluster(pool, chosen, time.time())
            except StateError:  # another submit made it meanwhile: one pool, shared
                cluster = store.cluster(pool.name)
    return cluster


def check_fits(cluster: Cluster, job: JobSpec) -> Cluster:
    """A job that asks more nodes than its compute may ever have is refused (validate, submit, the service)."""
    if job.instance_count > cluster.spec.max_nodes:
        if skus.is_pool(cluster.spec.name):
            raise CapacityError("resources.instance_count", f"{job.instance_count} nodes exceed the emulator's quota "
                                f"of {cluster.spec.max_nodes} per cluster for {job.compute} compute",
                                "lower instance_count or raise the quota with AMLEMU_MAX_INSTANCES")
        raise CapacityError("resources.instance_count", f"{job.instance_count} nodes exceed max_instances "
                            f"{cluster.spec.max_nodes} of compute '{job.compute}'",
                            "lower instance_count or raise the compute's max_instances")
    return cluster


def describe(store: Store, cluster: Cluster) -> dict[str, Any]:
    """What a dry run says of the job's pool; nothing for a user's own cluster."""
    spec = cluster.spec
    if not skus.is_pool(spec.name):
        return {}
    made = any(c.spec.name == spec.name for c in store.clusters())
    return {"pool": {"compute": skus.shown_compute(spec.name), "name": spec.name, "vm_size": spec.vm_size,
                     "vm_priority": spec.vm_priority.value, "backend": cluster.backend,
                     "made": "already" if made else "at submit",
                     "nodes": "made for the job, removed when it ends"}}
