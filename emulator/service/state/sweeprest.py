"""A sweep job's REST body (what azure-ai-ml PUTs for `command(...).sweep(...)`) <-> the CLI v2 YAML
mapping sweeps/sweepspec.py reads, and a sweep and its trials as the REST shapes the SDK reads back.
Pure: the trial goes through jobrest's translation of a command job (codeId, environmentId, inputs
resolved as a command job's are), the sweep's own fields through the sweeps package's REST parsers,
so a sweep sent through the service is judged by the rules and the words of `amlemu job validate`.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.service.state import bad_request, jobrest
from amlemu.sweeps import policies
from amlemu.sweeps.limits import Objective, SweepLimits
from amlemu.sweeps.sampling import parse_rest_sampling, parse_sampling, sampling_to_rest, sampling_to_yaml
from amlemu.sweeps.space import parse_rest_space, parse_space, to_rest_space, to_yaml_dict

# The trial's REST fields (TrialComponent) and the YAML fields they become under `trial:`.
TRIAL_REST = ("codeId", "command", "distribution", "environmentId", "environmentVariables", "resources")
TRIAL_YAML = ("command", "code", "environment", "environment_variables", "distribution", "resources")
# The sweep's fields every trial shares, as the command job's translation names them.
SHARED_YAML = ("compute", "inputs", "outputs", "experiment_name", "queue_settings")


def is_sweep_body(body: Any) -> bool:
    props = body.get("properties") if isinstance(body, dict) else None
    return isinstance(props, dict) and str(props.get("jobType", "")).lower() == "sweep"


def _trial_body(props: dict[str, Any]) -> dict[str, Any]:
    """The trial as a command job's body: its own fields and those every trial shares."""
    trial = props.get("trial")
    if not isinstance(trial, dict):
        raise bad_request("trial", "trial: missing or not an object; a sweep's trial is a command job: "
                          "command(...).sweep(...) sends it")
    if not trial.get("command"):
        raise bad_request("trial.command", "trial.command: missing; give the trial's command")
    shared = {k: props[k] for k in ("computeId", "experimentName", "inputs", "outputs", "queueSettings") if k in props}
    return {"properties": {**shared, **{k: trial[k] for k in TRIAL_REST if k in trial}, "jobType": "Command"}}


def _sweep_fields(props: dict[str, Any]) -> dict[str, Any]:
    """searchSpace, samplingAlgorithm, objective, limits, earlyTermination -> the YAML's fields,
    each through the REST parser that names the REST field when it refuses it."""
    for key in ("searchSpace", "samplingAlgorithm", "objective"):
        if props.get(key) is None:
            raise bad_request(key, f"{key}: missing; a sweep job needs searchSpace, samplingAlgorithm and objective")
    policy = policies.policy_from_rest(props.get("earlyTermination"))
    return {"search_space": to_yaml_dict(parse_rest_space(props["searchSpace"])),
            "sampling_algorithm": sampling_to_yaml(parse_rest_sampling(props["samplingAlgorithm"])),
            "objective": Objective.from_rest(props["objective"]).to_yaml(),
            "limits": SweepLimits.from_rest(props.get("limits")).to_yaml(),
            **({"early_termination": policy.to_yaml()} if policy is not None else {})}


def to_yaml(name: str, body: dict[str, Any], code_dir: Callable[[str, str], Path],
            environment: Callable[[str], str | dict[str, Any]]) -> dict[str, Any]:
    """The `type: sweep` YAML mapping of the PUT's body (see jobrest.to_yaml for the lookups).
    A ConfigError names the REST field; the caller answers it as a 400."""
    props = body["properties"]
    sweep = _sweep_fields(props)  # the sweep's own fields first: no lookup for a sweep refused anyway
    command = jobrest.to_yaml(name, _trial_body(props), code_dir, environment)
    trial = {k: command[k] for k in TRIAL_YAML if k in command}
    data: dict[str, Any] = {
        "type": "sweep", "name": name, "display_name": props.get("displayName"), "description": props.get("description"),
        "tags": props.get("tags") or None, **{k: command[k] for k in SHARED_YAML if k in command},
        "trial": trial, **sweep}
    return {k: v for k, v in data.items() if v is not None}


def same_sweep(saved: dict[str, Any], body: dict[str, Any]) -> bool:
    """A re-PUT of the sweep the name already holds (the SDK retries a PUT)."""
    keys = ("trial", "searchSpace", "samplingAlgorithm", "objective")
    return all(saved.get("properties", {}).get(k) == body["properties"].get(k) for k in keys)


# --- the sweep and its trials, as the SDK reads them back ----------------------------------------------
def sweep_properties(props: dict[str, Any], sweep_yaml: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """A sweep's REST properties: as PUT (jobType Sweep), or, for a sweep the CLI or the Python API
    submitted, its command job's (the trial template's) props turned into the Sweep shape from the
    YAML it was submitted with; with the properties Azure ML adds (best_child_run_id, score, ...)."""
    if str(props.get("jobType")).lower() != "sweep":
        props = _from_command(props, sweep_yaml)
    shown = (summary or {}).get("properties") or {}
    return {**props, "properties": {**(props.get("properties") or {}), **{k: str(v) for k, v in shown.items()}}}


def _from_command(props: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    trial = {k: props[k] for k in ("command", "distribution", "environmentId", "environmentVariables", "resources")
             if props.get(k) is not None}
    trial["command"] = str((data.get("trial") or {}).get("command") or props.get("command"))
    policy = policies.policy_from_yaml(data.get("early_termination"))
    sweep = {k: v for k, v in props.items() if k not in trial and k not in ("limits", "jobType", "distribution")}
    return {**sweep, "jobType": "Sweep", "trial": trial,
            "searchSpace": to_rest_space(parse_space(data["search_space"])),
            "samplingAlgorithm": sampling_to_rest(parse_sampling(data["sampling_algorithm"])),
            "objective": Objective.from_yaml(data["objective"]).to_rest(),
            "limits": SweepLimits.from_yaml(data["limits"]).to_rest(),
            **({"earlyTermination": policy.to_rest()} if policy is not None else {})}


def child_run(name: str, *, parent: str, status: str, experiment: str, compute: str | None, created: str,
              display_name: str | None, values: dict[str, Any] | None) -> dict[str, Any]:
    """A trial as run history's Run (the children listing azure-ai-ml's jobs.list(parent_job_name=)
    reads): its id, status, parent and the hyperparameters it ran with, as Azure ML tags a trial."""
    props = {"azureml.runsource": "hyperdrive"} if values is not None else {}
    if values is not None:
        props["hyperparameters"] = json.dumps(values, sort_keys=True)
    return {"runId": name, "parentRunId": parent, "rootRunId": parent, "experimentId": experiment, "status": status,
            "displayName": display_name or name, "createdUtc": created, "properties": props, "tags": {},
            "compute": {"target": compute} if compute else None}


def refusal(exc: ConfigError) -> Exception:
    """A sweep the rules refuse: Azure's 400, in `amlemu job validate`'s words."""
    return jobrest.config_error(exc)
