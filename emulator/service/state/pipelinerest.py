"""A pipeline job's REST body (what azure-ai-ml PUTs for a `@dsl.pipeline` job) -> the CLI v2
`type: pipeline` YAML mapping emulator/pipelines/pipelinespec.py reads, so a pipeline sent through
the service is judged by the rules, with the words, of `amlemu job validate`. Pure: no I/O but the
lookup it is handed (a step's componentId -> what its `component:` is).

The body's shape: `jobType: Pipeline`; `inputs`/`outputs` at pipeline level as a command job's
(`jobInputType: literal` with its value, or a data input with its uri and mode); `settings`
(default_compute, default_datastore, continue_on_step_failure, force_rerun; `_source` is the SDK's
own); `jobs`, each step a node dict in the SDK's spelling: `componentId` (the ARM id of the component
version it registered), `computeId`, `inputs` (`job_input_type: literal` whose value is a binding
string, `${{parent.inputs.x}}` / `${{parent.jobs.s.outputs.o}}`, or a plain value; or a data input),
`outputs` (`{"value": "${{parent.outputs.o}}", "type": "literal"}` bound up, or type, uri and mode),
and its run settings (display_name, environment_variables, resources, distribution, limits). A
sweep step (`command(...).sweep(...)` in the function: `type: sweep`) has its component under
`trial.componentId` and its search_space, sampling_algorithm, objective and limits as the YAML
writes them; only its early_termination is in REST's words.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from amlemu.errors import ConfigError
from amlemu.service.state import bad_request, jobrest
from amlemu.sweeps import policies

# A step's node fields and the YAML fields they become (as they are, or through the functions below).
STEP_AS_IS = {"display_name": "display_name", "tags": "tags", "properties": "properties",
              "environment_variables": "environment_variables", "comment": "comment"}
STEP_HANDLED = {"name", "type", "componentId", "computeId", "inputs", "outputs", "resources", "distribution",
                "limits", "queue_settings", *STEP_AS_IS}
SWEEP_AS_IS = ("search_space", "sampling_algorithm", "objective", "limits")  # a sweep step's, as the YAML's
SETTINGS = ("default_compute", "default_datastore", "continue_on_step_failure", "force_rerun")
# Fields of the node that are empty in a plain step (the SDK sends them as null or {}).
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_SNAKE = re.compile(r"_([a-z])")


def is_pipeline_body(body: Any) -> bool:
    props = body.get("properties") if isinstance(body, dict) else None
    return isinstance(props, dict) and str(props.get("jobType", "")).lower() == "pipeline"


def _snake(data: dict[str, Any]) -> dict[str, Any]:
    """A REST dict's keys as the YAML spells them (instanceCount -> instance_count)."""
    return {_CAMEL.sub("_", str(k)).lower(): v for k, v in data.items()}


def _last(arm_id: Any) -> str | None:
    """A compute's or datastore's name from its ARM id (or the name as sent)."""
    text = str(arm_id or "").strip()
    return text.rsplit("/", 1)[-1].removeprefix("azureml:") or None


def _object(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(field, f"{field}: not a JSON object; send it as azure-ai-ml does")
    return value


def _mode(value: Any) -> str | None:
    return None if not value else jobrest.MODES.get(str(value).lower(), str(value).lower())


def _step_input(where: str, value: Any) -> Any:
    """A node's input: a literal's value (a binding string or a plain value), or a data input's
    mapping; a binding with its own mode becomes `{path: <binding>, mode}` as the YAML writes it."""
    value = _snake(_object(value, where))
    kind = str(value.get("job_input_type") or value.get("type") or "literal").lower()
    mode = _mode(value.get("mode"))
    if kind == "literal":
        found = value.get("value")
        return {"path": found, "mode": mode} if mode and isinstance(found, str) else found
    if kind not in jobrest.DATA_KINDS:
        raise bad_request(f"{where}.job_input_type", f"{where}.job_input_type: '{kind}' inputs are not emulated; "
                          f"use one of: {', '.join(jobrest.DATA_KINDS)}")
    data = {"type": kind, "path": value.get("uri") or value.get("value"), "mode": mode}
    return {k: v for k, v in data.items() if v}


def _step_output(where: str, value: Any) -> Any:
    """A node's output: bound up to the pipeline's (`${{parent.outputs.o}}`), or its type, path, mode."""
    value = _snake(_object(value, where))
    mode = _mode(value.get("mode"))
    if str(value.get("type") or "").lower() == "literal" or (value.get("value") and not value.get("job_output_type")):
        bound = value.get("value")
        return {"path": bound, "mode": mode} if mode else bound
    data = {"type": str(value.get("job_output_type") or "uri_folder").lower(), "path": value.get("uri"), "mode": mode}
    return {k: v for k, v in data.items() if v}


def _run_settings(where: str, node: dict[str, Any]) -> dict[str, Any]:
    """resources, distribution, limits and queue settings, as the YAML writes them."""
    found: dict[str, Any] = {}
    resources = _snake(_object(node.get("resources"), f"{where}.resources"))
    if resources:
        found["resources"] = {k: v for k, v in resources.items() if v is not None}
    dist = _snake(_object(node.get("distribution"), f"{where}.distribution"))
    if dist:
        kind = dist.pop("distribution_type", None) or dist.pop("type", None)
        found["distribution"] = {"type": str(kind).lower(), **{k: v for k, v in dist.items() if v is not None}}
    limits = _snake(_object(node.get("limits"), f"{where}.limits"))
    if limits.get("timeout") is not None:
        found["limits"] = {"timeout": jobrest.seconds(limits["timeout"], f"{where}.limits.timeout")}
    queue = _snake(_object(node.get("queue_settings"), f"{where}.queue_settings"))
    if queue.get("job_tier") is not None and str(queue["job_tier"]).lower() != "null":
        found["queue_settings"] = {"job_tier": queue["job_tier"]}
    return found


def _component_of(where: str, node: dict[str, Any], kind: str,
                  component: Callable[[str, str], str | dict[str, Any]]) -> str | dict[str, Any]:
    """The step's component (a sweep step's trial): what its componentId names here."""
    trial = node.get("trial") if kind == "sweep" else node
    field = f"{where}.trial.componentId" if kind == "sweep" else f"{where}.componentId"
    ref = trial.get("componentId") if isinstance(trial, dict) else trial
    if not ref:
        raise bad_request(field, f"{field}: missing; a step runs a component (azure-ai-ml registers it and "
                          "sends its id)")
    return component(str(ref), field)


def _sweep_fields(where: str, node: dict[str, Any]) -> dict[str, Any]:
    """A sweep step's own fields: the node has them as the YAML does, but its early termination
    policy in REST's words (policy_type: Bandit), read by the sweeps' REST parser."""
    found = {k: node[k] for k in SWEEP_AS_IS if node.get(k) is not None}
    policy = _object(node.get("early_termination"), f"{where}.early_termination")
    if policy:
        camel = {_SNAKE.sub(lambda m: m.group(1).upper(), str(k)): v for k, v in policy.items() if v is not None}
        try:
            parsed = policies.policy_from_rest(camel, f"{where}.early_termination")
        except ConfigError as exc:
            raise jobrest.config_error(exc) from None
        if parsed is not None:
            found["early_termination"] = parsed.to_yaml()
    return found


def _step(name: str, node: Any, component: Callable[[str, str], str | dict[str, Any]]) -> dict[str, Any]:
    where = f"jobs.{name}"
    node = _object(node, where)
    kind = str(node.get("type") or "command").lower()
    if kind not in ("command", "sweep"):
        raise bad_request(f"{where}.type", f"{where}.type: {kind} steps are not emulated through the service; "
                          "use command or sweep steps")
    handled = STEP_HANDLED | ({"trial", "early_termination", *SWEEP_AS_IS} if kind == "sweep" else set())
    unknown = sorted(k for k, v in node.items()
                     if k not in handled and not k.startswith("_") and v not in (None, {}, []))
    if unknown:
        raise bad_request(f"{where}.{unknown[0]}", f"{where}.{unknown[0]}: not emulated in a pipeline step; "
                          "leave it unset")
    ref_field = "trial" if kind == "sweep" else "component"
    own = {yaml: node[rest] for rest, yaml in STEP_AS_IS.items() if node.get(rest) not in (None, {})}
    step: dict[str, Any] = {"type": kind, ref_field: _component_of(where, node, kind, component),
                            "compute": _last(node.get("computeId")), **own,
                            "inputs": {k: _step_input(f"{where}.inputs.{k}", v)
                                       for k, v in _object(node.get("inputs"), f"{where}.inputs").items()},
                            "outputs": {k: _step_output(f"{where}.outputs.{k}", v)
                                        for k, v in _object(node.get("outputs"), f"{where}.outputs").items()},
                            **(_sweep_fields(where, node) if kind == "sweep" else _run_settings(where, node))}
    return {k: v for k, v in step.items() if v not in (None, {})}


def _settings(props: dict[str, Any]) -> dict[str, Any]:
    given = _object(props.get("settings"), "settings")
    found = {k: v for k, v in given.items() if not str(k).startswith("_") and v is not None}
    for key in ("default_compute", "default_datastore"):
        if found.get(key):
            found[key] = _last(found[key])
    return found


def to_yaml(name: str, body: dict[str, Any], component: Callable[[str, str], str | dict[str, Any]]) -> dict[str, Any]:
    """The `type: pipeline` YAML mapping of the PUT's body. `component(componentId, field)`: what
    the step's `component:` is (a registered `azureml:<name>:<version>`, or an anonymous one's YAML
    inline). A refusal names the REST field (a ServiceError, Azure's 400)."""
    props = body["properties"]
    jobs = _object(props.get("jobs"), "jobs")
    if not jobs:
        raise bad_request("jobs", "jobs: missing; a pipeline job has steps (components called in the "
                          "@dsl.pipeline function)")
    data: dict[str, Any] = {
        "type": "pipeline", "name": name, "display_name": props.get("displayName"),
        "description": props.get("description"), "experiment_name": props.get("experimentName"),
        "tags": props.get("tags") or None, "compute": _last(props.get("computeId")), "settings": _settings(props),
        "inputs": {k: jobrest._input(k, v) for k, v in _object(props.get("inputs"), "inputs").items()},
        "outputs": {k: jobrest._output(k, v) for k, v in _object(props.get("outputs"), "outputs").items()},
        "jobs": {str(k): _step(str(k), v, component) for k, v in jobs.items()},
    }
    return {k: v for k, v in data.items() if v not in (None, {})}


def same_pipeline(saved: dict[str, Any], body: dict[str, Any]) -> bool:
    """A re-PUT of the pipeline the name already holds (the SDK retries a PUT)."""
    keys = ("jobs", "inputs", "outputs", "settings")
    return all(saved.get("properties", {}).get(k) == body["properties"].get(k) for k in keys)


# --- the pipeline as the SDK reads it back -------------------------------------------------------
SHARED_PROPS = ("status", "experimentName", "displayName", "description", "tags", "properties", "computeId", "services")


def _rest_input(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and "path" in value:
        data = {"jobInputType": str(value.get("type") or "uri_folder"), "uri": value["path"], "mode": value.get("mode")}
        return {k: v for k, v in data.items() if v is not None}
    if isinstance(value, dict):  # a typed parameter: {type, default}
        value = value.get("value", value.get("default"))
    return {"jobInputType": "literal", "value": "" if value is None else str(value)}


def _component_id(workspace_id: str, component: Any) -> str:
    """A CLI step's component as a node's componentId: a registered one's ARM id; a file's path, or
    `inline` (the SDK keeps it as a name: Azure ML would have registered them anonymously)."""
    if isinstance(component, str) and component.strip().startswith("azureml:"):
        name, _, version = component.strip().removeprefix("azureml:").partition(":")
        name = name.split("@", 1)[0]
        return f"{workspace_id}/components/{name}" + (f"/versions/{version}" if version else "")
    return str(component).removeprefix("file:") if isinstance(component, str) else "inline"


def _rest_step(workspace_id: str, name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A step of a pipeline the CLI submitted, as a node the SDK reads (its component, compute, bindings)."""
    inputs = {k: _rest_input(v) if isinstance(v, dict) else {"job_input_type": "literal", "value": str(v)}
              for k, v in (raw.get("inputs") or {}).items()}
    node = {"name": name, "type": str(raw.get("type") or "command"), "display_name": raw.get("display_name") or name,
            "componentId": _component_id(workspace_id, raw.get("component") or raw.get("trial")),
            "computeId": raw.get("compute"), "inputs": inputs}
    return {k: v for k, v in node.items() if v is not None}


def from_yaml(workspace_id: str, yaml: dict[str, Any]) -> dict[str, Any]:
    """A pipeline the CLI submitted (no body was PUT) as a Pipeline job's REST props."""
    settings = {k: v for k, v in (yaml.get("settings") or {}).items() if k in SETTINGS}
    props = {"jobType": "Pipeline", "displayName": yaml.get("display_name"), "description": yaml.get("description"),
             "tags": yaml.get("tags") or {}, "settings": settings,
             "inputs": {k: _rest_input(v) for k, v in (yaml.get("inputs") or {}).items()},
             "outputs": {k: {"jobOutputType": str((v or {}).get("type") or "uri_folder")}
                         for k, v in (yaml.get("outputs") or {}).items()},
             "jobs": {str(k): _rest_step(workspace_id, str(k), v) for k, v in (yaml.get("jobs") or {}).items()
                      if isinstance(v, dict)}}
    return {k: v for k, v in props.items() if v is not None}


def rest_outputs(outputs: dict[str, Any], written: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The pipeline's outputs with the URI each was written to (`written`: stepio.pipeline_outputs)."""
    found = dict(outputs)
    for name, where in written.items():
        given = found.get(name) if isinstance(found.get(name), dict) else {}
        found[name] = {**given, "jobOutputType": given.get("jobOutputType") or where.get("type") or "uri_folder",
                       "uri": where["path"]}
    return found
