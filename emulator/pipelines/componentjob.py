"""A component run as a step: the command-job dict it makes (`to_job_dict`), read by the command
job's own reader (jobs/jobyaml.py job_from_dict) into the JobSpec the step runs. Pure: no I/O but
what job_from_dict checks (that a local input's path and the code folder exist)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.pipelines.componentcmd import effective_values, render_command
from amlemu.pipelines.porttypes import PARAM_TYPES, check_value
from amlemu.specs import JobSpec

if TYPE_CHECKING:
    from amlemu.pipelines.component import ComponentSpec

# What a pipeline's step may set over its component (azure-ai-ml's command node): these replace
# the component's, except resources and environment_variables, merged key by key over them.
STEP_FIELDS = ("name", "display_name", "experiment_name", "description", "tags", "properties", "compute",
               "resources", "distribution", "environment_variables", "limits", "queue_settings", "services",
               "identity")
DATA_FIELDS = ("path", "mode", "type", "description", "optional")  # a data input's, as a command job has them
OUTPUT_FIELDS = ("path", "mode", "type", "description", "name", "version")


def _data_input(component: ComponentSpec, name: str, value: Any) -> dict[str, Any]:
    """A data input's value (a path, a URI, an asset or a mapping with path and mode) as the
    command job's input, typed and moded as the component declares it unless the value says."""
    port = component.inputs[name]
    given = dict(value) if isinstance(value, Mapping) else {"path": value}
    unknown = sorted(set(given) - set(DATA_FIELDS))
    if unknown:
        raise ConfigError(f"inputs.{name}.{unknown[0]}", "unknown field", f"known fields: {', '.join(DATA_FIELDS)}")
    if not isinstance(given.get("path"), str) or not given["path"].strip():
        raise ConfigError(f"inputs.{name}", f"a {port.type} input needs a path", "give a local path, an "
                          "azureml://datastores/<ds>/paths/<p> URI or an asset (azureml:<name>:<version>)")
    given.pop("optional", None)
    mode = given.get("mode") or port.mode
    return {"type": given.get("type") or port.type, **given, **({"mode": mode} if mode else {})}


def _literal(component: ComponentSpec, name: str, value: Any) -> str | int | float | bool:
    port = component.inputs[name]
    if isinstance(value, Mapping):
        raise ConfigError(f"inputs.{name}", f"a {port.type} input takes a value, not a mapping",
                          f"write inputs.{name}: <value>")
    return check_value(name, port.type, value, low=port.min, high=port.max, enum=port.enum)


def job_inputs(component: ComponentSpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """The command job's inputs: each input with a value (given, else its default), checked
    against its type; an optional input without one is left out, as Azure ML leaves it."""
    return {name: _literal(component, name, value) if component.inputs[name].type in PARAM_TYPES
            else _data_input(component, name, value)
            for name, value in effective_values(component, values).items()}


def job_outputs(component: ComponentSpec, values: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared output (one without a path goes to Azure ML's default place); a value is a
    datastore URI or a mapping with path, mode, name, version."""
    unknown = sorted(set(values) - set(component.outputs))
    if unknown:
        raise ConfigError(f"outputs.{unknown[0]}", f"the component {component.label} has no output named "
                          f"{unknown[0]}", f"its outputs: {', '.join(component.outputs) or 'none'}")
    found = {}
    for name, port in component.outputs.items():
        value = values.get(name)
        given = dict(value) if isinstance(value, Mapping) else {} if value is None else {"path": value}
        bad = sorted(set(given) - set(OUTPUT_FIELDS))
        if bad:
            raise ConfigError(f"outputs.{name}.{bad[0]}", "unknown field", f"known fields: {', '.join(OUTPUT_FIELDS)}")
        mode = given.get("mode") or port.mode
        found[name] = {"type": given.get("type") or port.type, **given, **({"mode": mode} if mode else {})}
    return found


def _merged(component: ComponentSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The component's run settings with the step's over them."""
    unknown = sorted(set(overrides) - set(STEP_FIELDS))
    if unknown:
        raise ConfigError(unknown[0], "is not a field a component's step sets", f"a step sets: {', '.join(STEP_FIELDS)}")
    job: dict[str, Any] = {k: v for k, v in (("distribution", component.distribution),
                                             ("queue_settings", component.queue_settings)) if v}
    for key in ("resources", "environment_variables"):
        merged = {**(getattr(component, key) or {}), **(overrides.get(key) or {})}
        if merged:
            job[key] = merged
    job.update({k: v for k, v in overrides.items() if k not in ("resources", "environment_variables")})
    return job


def to_job_dict(component: ComponentSpec, inputs: Mapping[str, Any] | None = None,
                outputs: Mapping[str, Any] | None = None, compute: str | None = None,
                overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The command-job dict a step of `component` runs (for jobs/jobyaml.py job_from_dict): its
    command rendered for these inputs (`$[[...]]` parts kept or dropped), its code and environment,
    the inputs with a value, every output, and the step's settings (`overrides`: STEP_FIELDS)
    over the component's. `compute`: the step's cluster (None: serverless, or overrides')."""
    given = dict(inputs or {})
    job: dict[str, Any] = {"type": "command", "command": render_command(component, given)}
    if component.code is not None:
        job["code"] = component.code
    if component.environment is not None:
        job["environment"] = component.environment
    job["inputs"] = job_inputs(component, given)
    job["outputs"] = job_outputs(component, dict(outputs or {}))
    if compute is not None:
        job["compute"] = compute
    job.update(_merged(component, dict(overrides or {})))
    return job


def component_job(component: ComponentSpec, inputs: Mapping[str, Any] | None = None,
                  outputs: Mapping[str, Any] | None = None, compute: str | None = None,
                  overrides: Mapping[str, Any] | None = None, base_dir: Path | None = None) -> JobSpec:
    """The JobSpec a step runs: to_job_dict read by job_from_dict. `base_dir`: where the step's
    relative input paths start (the pipeline's folder; default the component's)."""
    data = to_job_dict(component, inputs, outputs, compute, overrides)
    return job_from_dict(data, base_dir=base_dir or Path(component.base_dir))
