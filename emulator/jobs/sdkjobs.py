"""Whatever form a job or a compute comes in (CLI v2 YAML, the Python API's specs, an Azure ML SDK
v2 or v1 object) -> the emulator's JobSpec / ClusterSpec. Each SDK is imported only when its
object is given (sdk1/sdk2 import them lazily), so neither is needed for YAML jobs."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.jobs import sdk1, sdk2
from amlemu.jobs.jobyaml import load_job
from amlemu.names import (
    check_display_name,
    check_environment_variables,
    check_experiment_name,
    check_image_reference,
    check_job_name,
)
from amlemu.specs import ClusterSpec, JobSpec, check_quota, max_instances_quota

JOB_FORMS = ("a job YAML path, a JobSpec, an azure.ai.ml command job (command() / load_job()) "
             "or an azureml ScriptRunConfig / PyTorch estimator")


def to_job(job: Any, overrides: list[str] | None = None) -> JobSpec:
    if isinstance(job, (str, Path)):
        return load_job(job, overrides)  # the YAML loader checks names and variables itself
    if isinstance(job, JobSpec):
        spec = job
    elif sdk2.is_v2(job):
        spec = sdk2.job_from_v2(job)
    elif sdk1.is_job_config(job):
        spec = sdk1.job_from_v1(job)
    else:
        raise ConfigError("job", f"a {type(job).__name__} is not a job", f"give {JOB_FORMS}")
    # Whatever form the job came in, the same rules: a name Azure ML takes, variables a node can hold.
    check_job_name(spec.name)
    check_experiment_name(spec.experiment_name)
    check_display_name(spec.display_name)
    check_environment_variables(spec.environment_variables)
    if spec.image:
        check_image_reference(spec.image)
    return spec


def to_cluster(compute: Any, name: str | None = None) -> ClusterSpec:
    """A ClusterSpec, an azure.ai.ml AmlCompute, or a v1 provisioning configuration (+ its name,
    which v1 gives to ComputeTarget.create rather than to the configuration)."""
    if isinstance(compute, ClusterSpec):
        spec = compute
    elif sdk2.is_v2(compute):
        spec = sdk2.cluster_from_v2(compute)
    elif sdk1.is_v1(compute):
        if not name:
            raise ConfigError("name", "a v1 provisioning configuration carries no name",
                              "pass the compute's name too, as ComputeTarget.create(ws, name, config) does")
        spec = sdk1.cluster_from_v1(compute, name)
    else:
        raise ConfigError("compute", f"a {type(compute).__name__} is not a compute",
                          "give a ClusterSpec, an azure.ai.ml AmlCompute or AmlCompute.provisioning_configuration(...)")
    return check_quota(spec, max_instances_quota(os.environ))  # every compute created, whatever its form
