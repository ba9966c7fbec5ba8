"""A job's REST body (what azure-ai-ml PUTs) -> the CLI v2 YAML mapping the emulator's own loader
reads, so a job sent through the service is judged by the same rules, with the same messages, as
`amlemu job validate` and `amlemu job create` judge it. Pure translation: no I/O but the lookups
it is handed.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.jobs.resource import YAML_SERVICE_TYPES
from amlemu.service.state import bad_request
from amlemu.storage.assets import DATA_TYPES, MODEL_TYPES, short_ref

# REST names -> the YAML's.
MODES = {"readonlymount": "ro_mount", "readwritemount": "rw_mount", "download": "download", "upload": "upload",
         "direct": "direct", "evalmount": "ro_mount", "evaldownload": "download"}
_DURATION = re.compile(r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$")
_ARM_ASSET = re.compile(r"/(?P<kind>codes|environments)/(?P<name>[^/]+)/versions/(?P<version>[^/]+)$")
_ENV_SHORT = re.compile(r"^azureml:(?P<name>[^:@/]+)(?:@(?P<label>[^:@/]+)|:(?P<version>[^:@/]+))?$")
DATA_KINDS = ("uri_folder", "uri_file", *DATA_TYPES[2:], *MODEL_TYPES)  # mltable and the model types: folders
NOT_EMULATED = {"pipeline", "sweep", "automl", "spark", "labeling", "base", "finetuning", "distillation"}


def seconds(duration: Any, field: str) -> int:
    """ISO 8601 duration (PT1H30M) -> seconds; a number passes as it is."""
    if isinstance(duration, (int, float)) and not isinstance(duration, bool):
        if not math.isfinite(duration) or duration < 0:
            raise bad_request(field, f"{field}: {duration!r} is not a duration; write e.g. PT1H or a number of seconds")
        return int(duration)
    text = str(duration)
    match = _DURATION.match(text) if len(text) <= 64 else None
    if not match or not any(match.groupdict().values()):
        raise bad_request(field, f"{field}: {text[:64]!r} is not an ISO 8601 duration; write e.g. PT1H")
    # Whole units as integers (P99999999999D stays exact, and the spec's bound refuses it); seconds as given.
    d, h, m = (int(match[k] or 0) for k in "dhm")
    return d * 86400 + h * 3600 + m * 60 + int(float(match["s"] or 0))


def _input(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        raise bad_request(f"inputs.{name}", f"inputs.{name}: not an input object")
    kind = str(value.get("jobInputType", "")).lower()
    if kind == "literal":
        return value.get("value")
    if kind not in DATA_KINDS:
        raise bad_request(f"inputs.{name}.type", f"inputs.{name}.type: '{kind}' inputs are not emulated; "
                          f"use one of: {', '.join(DATA_KINDS)}")
    # An asset input arrives as its ARM id (the SDK resolved @latest): the loader takes azureml:<name>:<version>.
    data: dict[str, Any] = {"type": kind, "path": short_ref(str(value.get("uri") or "")) or None}
    if value.get("mode"):
        data["mode"] = MODES.get(str(value["mode"]).lower(), str(value["mode"]))
    return data


def _output(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"outputs.{name}", f"outputs.{name}: not an output object")
    kind = str(value.get("jobOutputType", "uri_folder")).lower()
    if kind not in DATA_KINDS:
        raise bad_request(f"outputs.{name}.type", f"outputs.{name}.type: '{kind}' outputs are not emulated; "
                          f"use one of: {', '.join(DATA_KINDS)}")
    data: dict[str, Any] = {"type": kind}
    if value.get("uri"):
        data["path"] = value["uri"]
    if value.get("mode"):
        data["mode"] = MODES.get(str(value["mode"]).lower(), str(value["mode"]))
    return data


def environment_ref(env_id: str) -> tuple[str, str | None] | None:
    """(name, version or None for the latest) of a registered environment reference."""
    short = _ENV_SHORT.match(env_id)
    if short:
        return short["name"], short["version"]
    arm = _ARM_ASSET.search(env_id)
    if arm and arm["kind"] == "environments":
        return arm["name"].removeprefix("azureml:"), arm["version"]
    return None


def asset_ref(arm_id: str, kind: str) -> tuple[str, str] | None:
    match = _ARM_ASSET.search(arm_id or "")
    return (match["name"], match["version"]) if match and match["kind"] == kind else None


def job_type(body: Any) -> str:
    props = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(props, dict) or "jobType" not in props:
        raise bad_request("properties.jobType", "properties.jobType: missing; the body is not an Azure ML job")
    kind = str(props["jobType"])
    if kind.lower() in NOT_EMULATED:
        raise bad_request("properties.jobType", f"properties.jobType: {kind} jobs are not emulated yet; "
                          "submit a command job (azure.ai.ml.command)")
    if kind.lower() != "command":
        raise bad_request("properties.jobType", f"properties.jobType: '{kind}' is not a job type; use Command")
    return kind


def _object(props: dict[str, Any], key: str) -> dict[str, Any]:
    """A JSON object field of the body ({} when absent or null), or a 400 naming it."""
    value = props.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(key, f"{key}: not a JSON object; send it as the REST API's {key} object")
    return value


def to_yaml(name: str, body: dict[str, Any], code_dir: Callable[[str, str], Path],
            environment: Callable[[str], str | dict[str, Any]]) -> dict[str, Any]:
    """The CLI v2 YAML mapping of the PUT's body. `code_dir(name, version)`: the folder the code
    version was uploaded to; `environment(env_id)`: the image, `azureml:` name or definition the job runs in."""
    job_type(body)
    props = body["properties"]
    code = asset_ref(str(props.get("codeId") or ""), "codes")
    if code is None and props.get("codeId"):
        raise bad_request("code", f"code: {str(props['codeId'])[:200]!r} is not a code asset id; give "
                          "command(code=<the folder that holds the job's source>), or no code")
    data: dict[str, Any] = {
        "type": "command", "name": name, "command": props.get("command"),
        "code": None if code is None else str(code_dir(*code)),  # none: an empty working folder, as Azure ML
        "compute": str(props.get("computeId") or "").rsplit("/", 1)[-1] or None,
        "experiment_name": props.get("experimentName"), "display_name": props.get("displayName"),
        "environment_variables": props.get("environmentVariables") or {},
        "inputs": {k: _input(k, v) for k, v in _object(props, "inputs").items()},
        "outputs": {k: _output(k, v) for k, v in _object(props, "outputs").items()
                    if k != "default" or not isinstance(v, dict) or v.get("uri")},
    }
    if props.get("environmentId"):
        data["environment"] = environment(str(props["environmentId"]))
    dist = _object(props, "distribution")
    if dist.get("distributionType"):
        data["distribution"] = {"type": str(dist["distributionType"]).lower()}
        for rest, field in (("processCountPerInstance", "process_count_per_instance"),
                            ("workerCount", "worker_count"), ("parameterServerCount", "parameter_server_count")):
            if dist.get(rest):  # the REST body's TensorFlow fields are workerCount / parameterServerCount
                data["distribution"][field] = dist[rest]
    resources = _object(props, "resources")
    if resources.get("instanceCount"):
        data["resources"] = {"instance_count": resources["instanceCount"]}
    if resources.get("instanceType"):  # serverless compute's size (a job with no computeId)
        data.setdefault("resources", {})["instance_type"] = resources["instanceType"]
    tier = _object(props, "queueSettings").get("jobTier")
    if tier is not None and str(tier).lower() != "null":  # the REST enum's Null: no tier
        data["queue_settings"] = {"job_tier": tier}
    limits = _object(props, "limits")
    if limits.get("timeout"):
        data["limits"] = {"timeout": seconds(limits["timeout"], "limits.timeout")}
    data["services"] = _services(props)
    return {k: v for k, v in data.items() if v not in (None, {})}


def _services(props: dict[str, Any]) -> dict[str, Any]:
    """azure-ai-ml's JobServices (JupyterLabJobService, ...) as the YAML's `services:`."""
    found: dict[str, Any] = {}
    for name, rest in _object(props, "services").items():
        if not isinstance(rest, dict) or rest.get("jobServiceType") in ("Studio", "Tracking"):
            continue
        kind, extra = str(rest.get("jobServiceType") or ""), rest.get("properties") or {}
        service = {"type": YAML_SERVICE_TYPES.get(kind, kind.lower()), "nodes": "all" if rest.get("nodes") else None,
                   "log_dir": extra.get("logDir"), "ssh_public_keys": extra.get("sshPublicKeys")}
        found[name] = {k: v for k, v in service.items() if v}
    return found


def config_error(exc: ConfigError) -> Exception:
    """The emulator's refusal, as `amlemu job validate` words it, in Azure's error JSON."""
    return bad_request(exc.field, str(exc))
