"""A component version's REST body (what azure-ai-ml PUTs for `ml_client.components.create_or_update`
and for the anonymous components it registers when a pipeline is submitted) <-> the component YAML
mapping amlemu.pipelines.component reads, and the ComponentVersion / ComponentContainer shapes the
SDK reads back. Pure: no I/O but the lookups it is handed (a code version's folder, an environment).

The body's `componentSpec` is the component YAML itself, with the code and environment as the SDK
resolved them (ARM ids of the code snapshot it uploaded and of the environment version).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.jobs.gitcode import is_git
from amlemu.pipelines.component import FIELDS, component_from_dict
from amlemu.pipelines.porttypes import INPUT_TYPES
from amlemu.service.state import ARM_TYPE, bad_request, jobrest, system_data

ANONYMOUS = "azureml_anonymous"  # azure-ai-ml's ANONYMOUS_COMPONENT_NAME: a pipeline's own components
DEFAULT_VERSION = "azureml_default"  # components.get(name) with neither version nor label
_TYPES = {t.lower(): t for t in INPUT_TYPES}


def spec_of(props: dict[str, Any]) -> dict[str, Any]:
    """The body's componentSpec, or a 400 naming it."""
    spec = props.get("componentSpec")
    if not isinstance(spec, dict):
        raise bad_request("properties.componentSpec", "properties.componentSpec: missing or not an object; "
                          "send the component (azure-ai-ml's components.create_or_update does)")
    return spec


def _ports(ports: Any) -> Any:
    """Input types as REST may spell them (String, Integer): the YAML's lower-case names."""
    if not isinstance(ports, dict):
        return ports
    return {name: {**port, "type": _TYPES.get(str(port.get("type")).lower(), port.get("type"))}
            if isinstance(port, dict) else port for name, port in ports.items()}


def _code(code: Any, code_dir: Callable[[str, str], Path]) -> str | None:
    """The code snapshot's folder on this machine; a git URL as it is. A local path is refused: over
    HTTP it would name a folder of the service's machine (the SDK uploads the code and sends its id)."""
    if code is None or is_git(code):
        return code
    ref = jobrest.asset_ref(str(code), "codes")
    if ref is None:
        raise bad_request("componentSpec.code", f"componentSpec.code: {str(code)[:200]!r} is not a code asset id; "
                          "give the component's code folder (azure-ai-ml uploads it and sends its id)")
    return str(code_dir(*ref))


def to_yaml(spec: dict[str, Any], code_dir: Callable[[str, str], Path],
            environment: Callable[[str], str | dict[str, Any]]) -> dict[str, Any]:
    """The component YAML mapping of a componentSpec: the SDK's private keys (`_source`) dropped, the
    code and environment ids turned into what the emulator reads; other fields as sent (the
    component's reader refuses an unknown one by name)."""
    data = {k: v for k, v in spec.items() if not str(k).startswith("_")}
    data["inputs"], data["outputs"] = _ports(data.get("inputs")), _ports(data.get("outputs"))
    if "code" in data:
        data["code"] = _code(data["code"], code_dir)
    env = data.get("environment")
    if isinstance(env, str) and env.strip():
        data["environment"] = environment(env.strip())
    return {k: v for k, v in data.items() if v is not None}


def load(spec: dict[str, Any], name: str, version: str, code_dir: Callable[[str, str], Path],
         environment: Callable[[str], str | dict[str, Any]], *, anonymous: bool) -> Any:
    """The ComponentSpec of a PUT's componentSpec, named and versioned by the URL (an anonymous one
    by neither), checked as `amlemu component create` checks a file; a 400 naming the field."""
    data = to_yaml(spec, code_dir, environment)
    if not anonymous:
        data.update(name=name, version=version)
    base = Path(data["code"]) if isinstance(data.get("code"), str) and not is_git(data["code"]) else Path("/")
    try:
        return component_from_dict(data, base_dir=base, inline=anonymous)
    except ConfigError as exc:
        raise bad_request(f"componentSpec.{exc.field}", f"componentSpec.{exc}") from None


def spec_from_record(record: dict[str, Any]) -> dict[str, Any]:
    """The componentSpec of a component `amlemu component create` registered (no REST body): its
    YAML as registered, its code the folder it names."""
    return {k: v for k, v in record.items() if k in FIELDS and k != "$schema"}


def version_resource(workspace_id: str, name: str, version: str, spec: dict[str, Any], *,
                     anonymous: bool = False, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ComponentVersion resource: its componentSpec with its name and version, and the version's
    description, tags and properties (the client_component_hash the SDK compares)."""
    extra = extra or {}
    props = {"componentSpec": {**spec, "name": name, "version": version},
             "description": extra.get("description", spec.get("description")),
             "tags": extra.get("tags") or spec.get("tags") or {}, "properties": extra.get("properties") or {},
             "isAnonymous": anonymous, "isArchived": False, "provisioningState": "Succeeded"}
    return {"id": f"{workspace_id}/components/{name}/versions/{version}", "name": version,
            "type": f"{ARM_TYPE}/components/versions", "properties": props, "systemData": system_data()}


def container_resource(workspace_id: str, name: str, versions: list[str], description: str | None = None) -> dict[str, Any]:
    """A ComponentContainer: its latest version (the last registered) and the next integer one."""
    numbers = [int(v) for v in versions if v.isdigit()]
    props = {"latestVersion": versions[-1] if versions else None, "nextVersion": str(max(numbers, default=0) + 1),
             "description": description, "tags": {}, "properties": {}, "isArchived": False,
             "provisioningState": "Succeeded"}
    return {"id": f"{workspace_id}/components/{name}", "name": name, "type": f"{ARM_TYPE}/components",
            "properties": props, "systemData": system_data()}


def arm_ref(component_id: str) -> tuple[str, str] | None:
    """(name, version) of a component version's ARM id (a pipeline step's componentId)."""
    match = re.search(r"/components/([^/]+)/versions/([^/]+)$", component_id or "")
    return (match.group(1).removeprefix("azureml:"), match.group(2)) if match else None
