"""A sweep job as users write it (`type: sweep` in CLI v2 YAML), pure data: its trial (a command job
whose command names `${{search_space.<x>}}`), the search space, sampling, objective, limits and early
termination; and each trial as the command job it runs (`trial_job`). No I/O but reading the YAML.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import apply_overrides, job_from_dict
from amlemu.specs import JobSpec
from amlemu.sweeps import policies
from amlemu.sweeps.limits import Objective, SweepLimits
from amlemu.sweeps.sampling import SamplingAlgorithm, parse_sampling, sampling_to_yaml, validate_sampling
from amlemu.sweeps.space import SearchSpace, parse_space, to_yaml_dict

# The sweep's own fields; `trial` holds the command job's (command, code, environment, distribution,
# resources, environment_variables, queue_settings), as azure-ai-ml's SweepJobSchema has them.
SWEEP_FIELDS = {
    "$schema", "type", "name", "display_name", "experiment_name", "description", "tags", "properties", "compute",
    "trial", "inputs", "outputs", "search_space", "sampling_algorithm", "objective", "early_termination", "limits",
    "resources", "queue_settings", "identity", "services",
}
TRIAL_FIELDS = {"command", "code", "environment", "environment_variables", "distribution", "resources",
                "queue_settings", "limits"}
# Fields of the sweep that every trial takes as its own.
SHARED_FIELDS = ("compute", "inputs", "outputs", "experiment_name", "queue_settings", "identity")
SPACE_RE = re.compile(r"\$\{\{\s*search_space\.([A-Za-z_][\w.]*)\s*\}\}")


@dataclass(frozen=True)
class SweepSpec:
    job: dict[str, Any]  # the trial's command job as a job dict: its command still names the search space
    base_dir: str  # where the YAML's relative paths start
    space: SearchSpace
    sampling: SamplingAlgorithm
    objective: Objective
    limits: SweepLimits
    early_termination: policies.Policy | None = None
    name: str | None = None
    display_name: str | None = None
    description: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    template: JobSpec | None = None  # the trial job as checked (each search-space value a placeholder)
    log_layout: str = "v2"  # the trials' log files: "v1" for an SDK v1 HyperDrive's (azureml-logs/70_driver_log)

    @property
    def experiment_name(self) -> str:
        return self.template.experiment_name if self.template else "Default"

    @property
    def compute(self) -> str | None:
        return self.template.compute if self.template else None

    def to_dict(self) -> dict[str, Any]:
        """The sweep as az ml's YAML has it (its record, `job show`, the dry run)."""
        trial = {k: v for k, v in self.job.items() if k not in SHARED_FIELDS and k not in ("name", "display_name")}
        shared = {k: self.job[k] for k in SHARED_FIELDS if k in self.job}
        return {"type": "sweep", "name": self.name, "display_name": self.display_name, "description": self.description,
                "tags": dict(self.tags), **shared, "trial": trial, "search_space": to_yaml_dict(self.space),
                "sampling_algorithm": sampling_to_yaml(self.sampling), "objective": self.objective.to_yaml(),
                "limits": self.limits.to_yaml(),
                "early_termination": self.early_termination.to_yaml() if self.early_termination else None}


def is_sweep_file(path: str | Path) -> bool:
    try:
        data = safeyaml.load_file(Path(path), "-f", "job YAML")
    except ConfigError:
        return False
    return isinstance(data, dict) and data.get("type") == "sweep"


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    path = Path(path)
    data = safeyaml.load_file(path, "-f", "job YAML")
    if overrides:
        data = apply_overrides(data if isinstance(data, dict) else {}, overrides)
    return sweep_from_dict(data, base_dir=path.parent)


def _trial_dict(data: dict[str, Any]) -> dict[str, Any]:
    trial = data.get("trial")
    if not isinstance(trial, dict):
        raise ConfigError("trial", "missing", "give the trial: a command job's command, code and environment")
    unknown = sorted(set(trial) - TRIAL_FIELDS)
    if unknown:
        raise ConfigError(f"trial.{unknown[0]}", "unknown field", f"known fields: {', '.join(sorted(TRIAL_FIELDS))}")
    if not trial.get("environment"):
        raise ConfigError("trial.environment", "missing", "give the trial's environment (azureml:<name>@latest or an image)")
    job = {**{k: data[k] for k in SHARED_FIELDS if k in data}, **trial}
    if "resources" in data:  # the sweep's resources are every trial's (trial.resources: its own, kept first)
        job["resources"] = {**data["resources"], **(trial.get("resources") or {})}
    return job


def sweep_from_dict(data: Any, *, base_dir: Path) -> SweepSpec:
    if not isinstance(data, dict) or data.get("type") != "sweep":
        raise ConfigError("type", "this is not a sweep job", "write type: sweep")
    unknown = sorted(set(data) - SWEEP_FIELDS)
    if unknown and unknown[0] in TRIAL_FIELDS:  # a command job's field, as a command job has it
        raise ConfigError(unknown[0], "is the trial's, not the sweep's", f"move it under trial: (trial.{unknown[0]})")
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"a sweep job's fields: {', '.join(sorted(SWEEP_FIELDS))}")
    job = _trial_dict(data)
    if "search_space" not in data:
        raise ConfigError("search_space", "missing", "give each hyperparameter's distribution, e.g. "
                          "lr: {type: uniform, min_value: 0.001, max_value: 0.1}")
    space = parse_space(data["search_space"])
    if "sampling_algorithm" not in data:
        raise ConfigError("sampling_algorithm", "missing", "write random, grid or bayesian")
    sampling = parse_sampling(data["sampling_algorithm"])
    validate_sampling(sampling, space)
    if "objective" not in data:
        raise ConfigError("objective", "missing", "give goal (maximize or minimize) and primary_metric")
    objective = Objective.from_yaml(data["objective"])
    if "limits" not in data:
        raise ConfigError("limits", "missing", "give limits.max_total_trials (and max_concurrent_trials, timeout)")
    limits = SweepLimits.from_yaml(data["limits"])
    policy = policies.policy_from_yaml(data.get("early_termination"))
    if policy is not None and sampling.type == "bayesian":
        raise ConfigError("early_termination", "bayesian sampling does not support early termination (Azure ML's "
                          "rule)", "remove early_termination, or use random or grid sampling")
    spec = SweepSpec(job=job, base_dir=str(base_dir), space=space, sampling=sampling, objective=objective,
                     limits=limits, early_termination=policy, name=data.get("name"),
                     display_name=data.get("display_name"), description=data.get("description"),
                     tags={str(k): str(v) for k, v in (data.get("tags") or {}).items()})
    return replace(spec, template=_template(spec, data.get("name")))


def _template(spec: SweepSpec, name: str | None) -> JobSpec:
    """The trial job, checked as a command job with a stand-in for each search-space value."""
    command = str(spec.job.get("command") or "")
    for ref in SPACE_RE.findall(command):
        top = ref.split(".")[0]
        if top not in spec.space.names:
            known = ", ".join(spec.space.names) or "none"
            raise ConfigError("trial.command", f"${{{{search_space.{ref}}}}} is not in search_space (it has: {known})",
                              "name a hyperparameter the search space defines")
    stand_in = {**spec.job, "command": SPACE_RE.sub("0", command), **({"name": name} if name else {})}
    try:
        return job_from_dict(stand_in, base_dir=Path(spec.base_dir))
    except ConfigError as exc:
        raise ConfigError(trial_field(exc.field), exc.problem, exc.fix) from None


def trial_field(name: str) -> str:
    return name if name.split(".")[0] in SHARED_FIELDS or name == "name" else f"trial.{name}"


def format_value(value: Any) -> str:
    """A sampled value as it goes into the command (a conditional choice's mapping as JSON)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def lookup(values: dict[str, Any], ref: str) -> Any:
    found: Any = values
    for part in ref.split("."):
        if not isinstance(found, dict) or part not in found:
            raise ConfigError("trial.command", f"${{{{search_space.{ref}}}}} has no value in this trial's sample",
                              "name a hyperparameter (or a key of a conditional choice's option) the sample has")
        found = found[part]
    return found


def trial_job(spec: SweepSpec, values: dict[str, Any], name: str, code: Path | None) -> JobSpec:
    """Trial `name` with the sampled `values` in its command, its code the sweep's snapshot, its
    limits.timeout the sweep's trial_timeout."""
    command = SPACE_RE.sub(lambda m: format_value(lookup(values, m.group(1))), str(spec.job["command"]))
    data = {**spec.job, "command": command, "name": name, "display_name": name}
    if spec.job.get("outputs"):  # `${{name}}` in an output's path is the trial's name, as Azure ML expands it
        data["outputs"] = {k: {**v, "path": v["path"].replace("${{name}}", name)} if isinstance(v, dict)
                           and isinstance(v.get("path"), str) else v for k, v in spec.job["outputs"].items()}
    if code is not None:
        data["code"] = str(code)
    if spec.limits.trial_timeout:
        data["limits"] = {**(data.get("limits") or {}), "timeout": int(spec.limits.trial_timeout)}
    return replace(job_from_dict(data, base_dir=Path(spec.base_dir)), log_layout=spec.log_layout)


def sweep_to_record(spec: SweepSpec, run_id: str, snapshot: Path | None) -> dict[str, Any]:
    """The sweep's run record: the trial template as a command job's record (what listings read),
    its command as written, and the sweep itself (its trials' code: the sweep's snapshot)."""
    data = {**spec.to_dict(), "name": run_id}
    if snapshot is not None:
        data["trial"] = {**data["trial"], "code": str(snapshot)}
    assert spec.template is not None
    return {**job_to_record(spec.template), "name": run_id, "command": str(spec.job["command"]), "kind": "sweep",
            "sweep": {"yaml": data, "base_dir": spec.base_dir, "log_layout": spec.log_layout}}


def sweep_from_record(record: dict[str, Any]) -> SweepSpec:
    spec = sweep_from_dict(record["sweep"]["yaml"], base_dir=Path(record["sweep"]["base_dir"]))
    return replace(spec, log_layout=str(record["sweep"].get("log_layout") or "v2"))


def is_sweep_record(record: dict[str, Any]) -> bool:
    return record.get("kind") == "sweep"
