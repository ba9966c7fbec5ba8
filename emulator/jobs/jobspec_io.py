"""JobSpec <-> the JSON kept in a run's record (the job exactly as it was submitted)."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from amlemu.specs import DataInput, DataMode, Distribution, DistributionType, JobSpec, ServiceSpec


def _data(value: DataInput) -> dict[str, str]:
    return {"type": value.type, "path": value.path, "mode": value.mode.value}


def _service(value: dict[str, Any] | str) -> ServiceSpec:
    """A record's service; records before services ran kept "name (type)"."""
    if isinstance(value, str):
        name, _, kind = value.partition(" (")
        return ServiceSpec(name, kind.rstrip(")"))
    return ServiceSpec(**value)


def job_to_record(job: JobSpec) -> dict[str, Any]:
    return {
        "command": job.command, "code": None if job.code is None else str(job.code), "compute": job.compute,
        "experiment_name": job.experiment_name, "instance_count": job.instance_count,
        "distribution": {"type": job.distribution.type.value,
                         "process_count_per_instance": job.distribution.process_count_per_instance,
                         "worker_count": job.distribution.worker_count,
                         "parameter_server_count": job.distribution.parameter_server_count},
        "environment": job.environment, "environment_variables": dict(job.environment_variables),
        "inputs": {k: _data(v) if isinstance(v, DataInput) else v for k, v in job.inputs.items()},
        "outputs": {k: _data(v) for k, v in job.outputs.items()},
        "display_name": job.display_name,
        "max_run_duration_seconds": job.max_run_duration_seconds,
        "name": job.name,
        "shm_size": job.shm_size,
        "log_layout": job.log_layout,
        "environment_def": job.environment_def, "code_git": job.code_git,
        "instance_type": job.instance_type, "job_tier": job.job_tier, "services": [asdict(s) for s in job.services],
    }


# A sweep's record: its trial's job, and the sweep (emulator/sweeps/sweepspec.py); a pipeline's; a
# reused pipeline step's properties (pipelines/reuse.py).
RECORD_ONLY = ("kind", "sweep", "pipeline", "properties")


def job_from_record(data: dict[str, Any]) -> JobSpec:
    data = {k: v for k, v in data.items() if k not in RECORD_ONLY}
    dist = data["distribution"]

    def load(v: dict[str, str]) -> DataInput:
        return DataInput(v["type"], v["path"], DataMode(v["mode"]))

    inputs = {k: load(v) if isinstance(v, dict) else v for k, v in data["inputs"].items()}
    outputs = {k: load(v) for k, v in data.get("outputs", {}).items()}
    return JobSpec(**{**data, "code": None if data.get("code") is None else Path(data["code"]), "inputs": inputs, "outputs": outputs,
                      "services": tuple(_service(s) for s in data.get("services", ())),
                      "distribution": Distribution(DistributionType(dist["type"]), dist["process_count_per_instance"],
                                                   dist.get("worker_count"), dist.get("parameter_server_count", 0))})
