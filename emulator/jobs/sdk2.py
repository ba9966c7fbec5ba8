"""Azure ML SDK v2 (azure-ai-ml) objects <-> the emulator's specs.

A v2 command job (`command(...)`, `load_job("job.yml")`) is read by writing it back as the CLI v2
YAML mapping and passing that through the emulator's own loader, so one set of rules (and one
set of error messages) judges a job whatever form it came in. The other way, a JobSpec becomes
a `command(...)` for the azureml target. azure-ai-ml is imported only here, only when needed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.lazydeps import defer_rfc3987_syntax
from amlemu.specs import ClusterSpec, DataInput, DistributionType, JobSpec, Priority

INSTALL_HINT = "install the SDK v2 extra: pip install 'amlemu[sdk2]'"


def require() -> None:
    defer_rfc3987_syntax()  # over a second of CPU on every import of azure-ai-ml (lazydeps says why)
    try:
        import azure.ai.ml  # noqa: F401,PLC0415
    except ImportError:
        raise ConfigError("azure-ai-ml", "the Azure ML SDK v2 is not installed", INSTALL_HINT) from None
    # Its schemas announce "experimental class" on every load: noise on the user's terminal.
    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)


def is_v2(obj: Any) -> bool:
    """An azure.ai.ml object, recognised without importing the SDK."""
    return type(obj).__module__.startswith("azure.ai.ml.")


def _input_value(value: Any) -> Any:
    """A NodeInput / Input / literal -> what the YAML would hold."""
    value = getattr(value, "_data", value)  # a builder's NodeInput wraps the Input or the literal
    if hasattr(value, "type") and hasattr(value, "path"):
        data = {"type": str(value.type), "path": str(value.path)}
        if getattr(value, "mode", None):
            data["mode"] = str(value.mode)
        return data
    return value


def _output_value(value: Any) -> dict[str, Any]:
    value = getattr(value, "_data", value)
    data: dict[str, Any] = {"type": str(getattr(value, "type", None) or "uri_folder")}
    if getattr(value, "path", None):
        data["path"] = str(value.path)
    if getattr(value, "mode", None):
        data["mode"] = str(value.mode)
    return data


def _environment(env: Any) -> str | dict[str, Any] | None:
    if env is None:
        return None
    if isinstance(env, str):  # a registered environment: v2 drops the azureml: prefix on load
        return env if env.startswith("azureml:") else f"azureml:{env}"
    build = getattr(env, "build", None)
    if getattr(env, "conda_file", None) or build is not None:  # an inline one: its definition
        dockerfile = getattr(build, "dockerfile_path", None)
        context = None if build is None else {"path": str(build.path),
                                              **({"dockerfile_path": str(dockerfile)} if dockerfile else {})}
        return {k: v for k, v in {"image": env.image, "conda_file": env.conda_file, "build": context}.items() if v}
    if getattr(env, "image", None):  # inline too, as `environment: {image: ...}` in YAML
        return {"image": str(env.image)}
    version = f":{env.version}" if getattr(env, "version", None) else ""
    return f"azureml:{env.name}{version}"


def _code_dir(job: Any) -> str | None:
    code = getattr(job, "code", None)
    if code is None:
        return None  # no code: the command runs in an empty working folder, as on Azure ML
    if not isinstance(code, (str, os.PathLike)):
        raise ConfigError("code", f"a {type(code).__name__} is not emulated", "give code as a local folder path")
    base = Path(getattr(job, "_base_path", None) or ".")
    return str((base / str(code)).resolve())


def job_dict(job: Any) -> dict[str, Any]:
    """A v2 command job (a `command()` node or a CommandJob) as the CLI v2 YAML mapping."""
    require()
    if type(job).__name__ not in ("Command", "CommandJob"):
        raise ConfigError("job", f"an azure.ai.ml {type(job).__name__} is not emulated",
                          "give a command job (azure.ai.ml.command or load_job of a type: command YAML)")
    data: dict[str, Any] = {"type": "command", "name": job.name, "command": job.command, "code": _code_dir(job),
                            "compute": job.compute, "experiment_name": job.experiment_name,
                            "display_name": job.display_name, "environment": _environment(job.environment),
                            "environment_variables": dict(job.environment_variables or {}),
                            "inputs": {k: _input_value(v) for k, v in (job.inputs or {}).items()},
                            "outputs": {k: _output_value(v) for k, v in (job.outputs or {}).items()}}
    dist = job.distribution
    if dist is not None:
        kind = str(getattr(dist, "type", "")).lower()
        data["distribution"] = {"type": kind}
        for field in ("process_count_per_instance", "worker_count", "parameter_server_count"):
            if getattr(dist, field, None):
                data["distribution"][field] = getattr(dist, field)
    if job.resources is not None and getattr(job.resources, "instance_count", None):
        data["resources"] = {"instance_count": job.resources.instance_count}
    if job.resources is not None and getattr(job.resources, "shm_size", None):
        data.setdefault("resources", {})["shm_size"] = job.resources.shm_size
    if job.resources is not None and getattr(job.resources, "instance_type", None):  # serverless compute's size
        data.setdefault("resources", {})["instance_type"] = job.resources.instance_type
    tier = getattr(getattr(job, "queue_settings", None), "job_tier", None)
    if tier:
        data["queue_settings"] = {"job_tier": tier}
    timeout = getattr(getattr(job, "limits", None), "timeout", None)
    if timeout:
        data["limits"] = {"timeout": int(timeout)}
    return {k: v for k, v in data.items() if v not in (None, {})}


def job_from_v2(job: Any) -> JobSpec:
    data = job_dict(job)  # no compute: serverless, as azure-ai-ml submits it
    return job_from_dict(data, base_dir=Path(data.get("code") or getattr(job, "_base_path", None) or "."))


def cluster_from_v2(compute: Any) -> ClusterSpec:
    """azure.ai.ml.entities.AmlCompute -> ClusterSpec (the same provisioning fields)."""
    if type(compute).__name__ != "AmlCompute":
        raise ConfigError("compute", f"an azure.ai.ml {type(compute).__name__} is not emulated", "use AmlCompute")
    def given(value: Any, default: Any) -> Any:  # 0 is a value (scale down at once), None is not
        return default if value is None else value

    return ClusterSpec(name=compute.name, vm_size=compute.size or "Standard_D2_v2",
                       vm_priority=Priority.parse(compute.tier or "dedicated"),
                       min_nodes=given(compute.min_instances, 0), max_nodes=given(compute.max_instances, 4),
                       idle_seconds_before_scaledown=given(compute.idle_time_before_scale_down, 120))


def amlcompute(spec: ClusterSpec) -> Any:
    require()
    from azure.ai.ml.entities import AmlCompute  # noqa: PLC0415

    tier = "low_priority" if spec.vm_priority is Priority.LOW_PRIORITY else "dedicated"
    return AmlCompute(name=spec.name, size=spec.vm_size, tier=tier, min_instances=spec.min_nodes,
                      max_instances=spec.max_nodes, idle_time_before_scale_down=spec.idle_seconds_before_scaledown)


def command_from_spec(spec: JobSpec) -> Any:
    """A JobSpec (from the Python API) -> the azure.ai.ml `command(...)` that sends the same job."""
    require()
    from azure.ai.ml import (  # noqa: PLC0415
        Input, MpiDistribution, Output, PyTorchDistribution, TensorFlowDistribution, command)
    from azure.ai.ml.entities import Environment  # noqa: PLC0415

    def data(value: DataInput, cls: Any) -> Any:
        return cls(type=value.type, path=value.path or None, mode=value.mode.value)

    dist = spec.distribution
    per_node = dist.process_count_per_instance
    distribution = {DistributionType.MPI: MpiDistribution(process_count_per_instance=per_node),
                    DistributionType.PYTORCH: PyTorchDistribution(process_count_per_instance=per_node),
                    DistributionType.TENSORFLOW: TensorFlowDistribution(
                        worker_count=dist.worker_count, parameter_server_count=dist.parameter_server_count),
                    }.get(dist.type)
    env, inline = spec.environment, spec.environment_def
    return command(
        command=spec.command, code=None if spec.code is None else str(spec.code), compute=spec.compute,
        experiment_name=spec.experiment_name,
        display_name=spec.display_name, environment_variables=dict(spec.environment_variables),
        environment=Environment(image=inline["image"], conda_file=inline["conda_file"]) if inline and not
        inline["build_path"] else Environment(image=env) if env and not env.startswith("azureml:") else env,
        distribution=distribution,
        instance_count=spec.instance_count, timeout=spec.max_run_duration_seconds,
        instance_type=spec.instance_type, job_tier=spec.job_tier,  # serverless compute's size and tier
        inputs={k: data(v, Input) if isinstance(v, DataInput) else v for k, v in spec.inputs.items()},
        outputs={k: data(v, Output) for k, v in spec.outputs.items()})


def rest_body(job: Any) -> dict[str, Any]:
    """The job's REST body as MLClient.jobs.create_or_update sends it (before the code upload
    replaces codeId with the uploaded snapshot's id)."""
    entity = job._to_job() if type(job).__name__ == "Command" else job
    body = entity._to_rest_object().as_dict()
    env = anonymous_environment(job)
    if env is not None:  # registered first by create_or_update (CliV2AnonymousEnvironment), then named by id
        body["properties"]["environmentId"] = f"azureml:{env.name}:{env.version}"
    return body


def anonymous_environment(job: Any) -> Any:
    """The job's inline environment (image + conda file, or a build context), which azure-ai-ml
    registers as an anonymous environment version before the job; None for a named one."""
    env = getattr(job, "environment", None)
    return None if env is None or isinstance(env, str) else env
