"""SDK v1's HyperDriveConfig as azureml-core sends it (`Experiment.submit(HyperDriveConfig(...))`: the
CreateExperimentDto JSON in the multipart `config` file of POST /hyperdrive/v1.0/<experiment>/runs)
<-> the `type: sweep` YAML mapping sweeps/sweepspec.py reads, and the parent run's tags azureml-core's
HyperDriveRun reads back. Pure: the trial is the command job the run configuration describes (the
caller reads it with jobs/convert.py, as a v1 startrun is read), each distribution, the sampling, the
policy, the limits and the objective through the sweeps package's parsers, so a v1 sweep is judged
by the rules and the words of `amlemu job validate`.

v1 names hyperparameters by the script argument that receives them (`--lr`) and appends
`<name> <value>` to the script's arguments for each: the search space is keyed by an identifier made
from each name (`lr`), and the trial's command ends with `--lr ${{search_space.lr}}`.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any

from amlemu.errors import ConfigError
from amlemu.sweeps import policies
from amlemu.sweeps.limits import Objective, SweepLimits
from amlemu.sweeps.sampling import parse_sampling, sampling_to_yaml
from amlemu.sweeps.space import SearchSpace, parse_rest_space, to_yaml_dict
from amlemu.sweeps.sweepspec import SHARED_FIELDS, TRIAL_FIELDS

# v1's sampling names (HyperParameterSampling.to_json) -> the YAML's.
SAMPLING = {"random": "random", "grid": "grid", "bayesianoptimization": "bayesian"}
# The limits' v1 names (HyperDriveConfig's arguments) for errors.
LIMIT_NAMES = {"max_total_trials": "max_total_runs", "max_concurrent_trials": "max_concurrent_runs",
               "timeout": "max_duration_minutes"}
TAG_PREFIX = "_aml_system_"  # a trial's hyperparameters: parent tag _aml_system_<parent>_<n>
_NOT_WORD = re.compile(r"\W+")


def param_names(space: dict[str, Any]) -> dict[str, str]:
    """Each v1 hyperparameter name -> a `${{search_space.<x>}}` identifier: dashes stripped, other
    non-word characters `_`, unique (a suffix `_2`, `_3` ... on a clash)."""
    names: dict[str, str] = {}
    for key in space:
        base = _NOT_WORD.sub("_", str(key).lstrip("-")).strip("_") or "param"
        base = base if re.match(r"[A-Za-z_]", base) else f"p_{base}"
        name, n = base, 2
        while name in names.values():
            name, n = f"{base}_{n}", n + 1
        names[str(key)] = name
    return names


def _mapping(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(field, "missing or not an object", "submit with azureml-core's HyperDriveConfig")
    return value


def parse_config(raw: bytes) -> dict[str, Any]:
    """The multipart `config` file: a JSON object, else a ConfigError naming it."""
    try:
        config = json.loads(raw)
    except ValueError:
        raise ConfigError("config", "not JSON", "submit with azureml-core's HyperDriveConfig") from None
    return _mapping(config, "config")


def run_config(config: dict[str, Any]) -> dict[str, Any]:
    """The trial's run configuration (platform_config.Definition.Overrides)."""
    definition = _mapping(_mapping(config.get("platform_config"), "platform_config").get("Definition"),
                          "platform_config.Definition")
    if str(config.get("platform") or "AML").upper() != "AML":
        raise ConfigError("platform", f"{config.get('platform')} sweeps (a pipeline's) are not emulated",
                          "give HyperDriveConfig a ScriptRunConfig or an estimator (run_config=)")
    return _mapping(definition.get("Overrides"), "platform_config.Definition.Overrides")


def snapshot_id(config: dict[str, Any]) -> str | None:
    found = ((config.get("platform_config") or {}).get("Definition") or {}).get("SnapshotId")
    return str(found) if found else None


def _space(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the YAML search space, v1 name -> identifier)."""
    generator = _mapping(config.get("generator_config"), "generator_config")
    given = _mapping(generator.get("parameter_space"), "generator_config.parameter_space")
    parsed = parse_rest_space(given, field="generator_config.parameter_space")  # errors name the v1 key
    names = param_names(given)
    return to_yaml_dict(SearchSpace(tuple((names[key], dist) for key, dist in parsed.params))), names


def _sampling(config: dict[str, Any]) -> Any:
    generator = config["generator_config"]
    name = str(generator.get("name") or "")
    if name.lower() not in SAMPLING:
        raise ConfigError("generator_config.name", f"unknown sampling {name!r}",
                          "use RandomParameterSampling, GridParameterSampling or BayesianParameterSampling")
    props = {k: v for k, v in (generator.get("properties") or {}).items() if v is not None}
    return sampling_to_yaml(parse_sampling({"type": SAMPLING[name.lower()], **props}, field="generator_config"))


def _limits(config: dict[str, Any]) -> dict[str, Any]:
    minutes = config.get("max_duration_minutes")
    given = {"max_total_trials": config.get("max_total_jobs"), "max_concurrent_trials": config.get("max_concurrent_jobs"),
             "timeout": minutes * 60 if isinstance(minutes, int) and not isinstance(minutes, bool) else minutes}
    try:
        return SweepLimits.from_yaml({k: v for k, v in given.items() if v is not None}).to_yaml()
    except ConfigError as exc:
        name = exc.field.removeprefix("limits.")
        raise ConfigError(LIMIT_NAMES.get(name, exc.field), exc.problem, exc.fix) from None


def _objective(config: dict[str, Any]) -> dict[str, Any]:
    metric = _mapping(config.get("primary_metric_config"), "primary_metric_config")
    if not metric.get("name") or not metric.get("goal"):
        raise ConfigError("primary_metric_config", "needs name and goal", "give primary_metric_name and "
                          "primary_metric_goal")
    return Objective(str(metric["goal"]).lower(), str(metric["name"])).to_yaml()


def to_yaml(run_id: str, config: dict[str, Any], command_job: dict[str, Any]) -> dict[str, Any]:
    """The `type: sweep` YAML mapping of the config; `command_job` is the trial's run configuration as a
    command job's YAML (jobs/convert.job_yaml_dict). A ConfigError names the v1 field."""
    for key in ("resume_from", "resume_child_runs"):
        if config.get(key):
            raise ConfigError(key, "warm start from earlier HyperDrive runs is not emulated", f"leave {key} out")
    space, names = _space(config)
    policy = policies.policy_from_v1(config.get("policy_config"), field="policy_config")
    appended = " ".join(f"{shlex.quote(key)} ${{{{search_space.{name}}}}}" for key, name in names.items())
    trial = {k: v for k, v in command_job.items() if k in TRIAL_FIELDS}
    trial["command"] = f"{command_job['command']} {appended}"
    data: dict[str, Any] = {
        "type": "sweep", "name": run_id, "display_name": run_id, **{k: command_job[k] for k in SHARED_FIELDS
                                                                     if k in command_job},
        "trial": trial, "search_space": space, "sampling_algorithm": _sampling(config),
        "objective": _objective(config), "limits": _limits(config)}
    if policy is not None:
        data["early_termination"] = policy.to_yaml()
    return data


# --- what azureml-core reads back ------------------------------------------------------------------
def response(run_id: str, experiment: str, config: dict[str, Any]) -> dict[str, Any]:
    """ExperimentResponseDto: the SDK reads result.platform_config.ParentRunId."""
    platform = {**(config.get("platform_config") or {}), "ParentRunId": run_id}
    keep = ("generator_config", "policy_config", "primary_metric_config", "max_concurrent_jobs", "max_total_jobs",
            "max_duration_minutes", "platform")
    return {"code": 201, "result": {**{k: config.get(k) for k in keep}, "name": experiment, "platform_config": platform,
                                    "status": "Running", "hyperdrive_run_id": run_id, "all_jobs_generated": False,
                                    "cancellation_requested": False}}


def parent_tags(run_id: str, config: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, str]:
    """The tags a HyperDrive parent carries: its config (HyperDriveRun rehydrates from them) and each
    trial's hyperparameters under their v1 names, `_aml_system_<trial>: {"--lr": 0.05}`."""
    tags = {key: json.dumps(config.get(key)) for key in ("generator_config", "primary_metric_config", "policy_config",
                                                          "platform_config")}
    tags.update({key: str(config.get(key)) for key in ("max_total_jobs", "max_concurrent_jobs", "max_duration_minutes")})
    names = param_names(((config.get("generator_config") or {}).get("parameter_space") or {}))
    back = {ident: key for key, ident in names.items()}
    for trial in trials:
        name, values = str(trial.get("name") or ""), trial.get("values") or {}
        if name.startswith(f"{run_id}_"):
            tags[f"{TAG_PREFIX}{name}"] = json.dumps({back.get(k, k): v for k, v in values.items()})
    return tags
