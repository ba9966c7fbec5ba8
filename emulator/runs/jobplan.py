"""A job's launch plan on given nodes, assembled one way for the dry run (`Emulator.plan_job`, with
placeholder addresses) and for the supervisor (with the nodes allocation gave): the node requests
carry the planned software (its image, its environment's prefix), the notices are the software's,
the job's, the image's and the disk's, and runs/plan.py's pure `plan_launch` does the rest."""
from __future__ import annotations

import os
from collections.abc import Iterable

from amlemu.backends import NodeBackend, NodeRequest, PlannedNode, nodedisk
from amlemu.cluster import autoscale
from amlemu.envs.software import Software, SoftwarePlan
from amlemu.home import Home
from amlemu.runs.plan import LaunchPlan, plan_launch
from amlemu.specs import ClusterSpec, JobSpec


def node_requests(home: Home, spec: ClusterSpec, indices: Iterable[int], job: JobSpec,
                  software: SoftwarePlan | Software) -> list[NodeRequest]:
    """The job's nodes: the image the software names (a layer, a built context) or the job's, and
    the environment's prefix, mounted read-only where it is on this machine."""
    return [autoscale.node_request(home, spec, i, software.image or job.image, shm_bytes=job.shm_bytes,
                                   python_env=software.prefix) for i in indices]


def node_plans(backend: NodeBackend, requests: list[NodeRequest], software: SoftwarePlan | Software
               ) -> list[PlannedNode]:
    """What the backend makes of each node; an image the run builds first (a layer, a build context)
    is planned as there, as it will be when the nodes are made."""
    return [backend.plan_node(r, built_image=software.image) for r in requests]


def job_launch(job: JobSpec, run_id: str, backend: NodeBackend, requests: list[NodeRequest], addresses: list[str],
               workspace: dict[str, str], software: SoftwarePlan | Software) -> LaunchPlan:
    """The launch plan of `job` on these nodes (in rank order, with the addresses they are reached at)."""
    compute = requests[0].cluster
    note = node_plans(backend, requests[:1], software)[0].image_note  # the same for every node
    disk_note = nodedisk.size(requests[0].disk_bytes)[1]
    return plan_launch(job, run_id, compute, backend.name, requests, addresses, workspace,
                       base_env=[backend.node_env(r) for r in requests], mpi_options=backend.mpi_options,
                       as_root=os.geteuid() == 0,
                       notices=(*software.notices, *job.notices, *(n for n in (note, disk_note) if n)),
                       launch_prefix=backend.launch_prefix(compute))
