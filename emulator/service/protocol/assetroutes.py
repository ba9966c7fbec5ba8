"""Data and model assets over REST, as azure-ai-ml's `ml_client.data.*` and `ml_client.models.*`
call them: containers (`.../data/{name}`: latestVersion, nextVersion) and versions
(`.../data/{name}/versions/{version}`), over the home's asset registry (emulator/storage/assets.py),
so an asset registered by `amlemu data create` is the SDK's and the other way round.

The SDK uploads a local path itself (to workspaceblobstore, through the blob routes) and sends the
datastore URI; over HTTP only `azureml://` URIs are taken: a path on this machine would let a
caller have the service read and upload any of its files.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError, NotFoundError, StateError
from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.state import ARM_TYPE, ServiceError, bad_request, not_found, system_data
from amlemu.storage.assets import asset_from_dict, short_ref

# REST's names of each kind: the URL segment, and the fields holding the type and the URI.
REST = {"data": ("data", "dataType", "dataUri"), "model": ("models", "modelType", "modelUri")}
_NOWHERE = Path("/nonexistent")  # a base folder never read: every path taken here is an azureml:// URI
_LIST_VIEW = {"activeonly": (False, False), "archivedonly": (True, True), "all": (True, False)}


def _assets(call: Call) -> Any:
    if call.st.assets is None:  # a state with no emulator home behind it (the test double) keeps no assets
        raise not_found("the asset registry")
    return call.st.assets


def _name(call: Call) -> str:
    return call.params["name"].removeprefix("azureml:")  # the SDK keeps the prefix in a reference's name


def _version(call: Call, spec: dict[str, Any]) -> dict[str, Any]:
    segment, type_key, uri_key = REST[spec["kind"]]
    props = {type_key: spec["type"], uri_key: spec["path"], "description": spec["description"] or None,
             "tags": spec["tags"], "properties": spec["properties"], "isAnonymous": False,
             "isArchived": bool(spec.get("archived"))}
    if spec["kind"] == "model":
        flavors = spec.get("flavors") or {}  # the YAML's {flavor: {key: value}}; REST wraps each in "data"
        props.update(flavors={k: {"data": v} for k, v in flavors.items()}, stage=spec.get("stage") or None)
    return {"id": f"{call.st.workspace.id}/{segment}/{spec['name']}/versions/{spec['version']}",
            "name": spec["version"], "type": f"{ARM_TYPE}/{segment}/versions", "properties": props,
            "systemData": system_data()}


def _container(call: Call, kind: str, name: str, versions: list[dict[str, Any]]) -> dict[str, Any]:
    segment = REST[kind][0]
    active = [v for v in versions if not v.get("archived")]
    numbers = [int(v["version"]) for v in versions if v["version"].isdigit()]
    return {"id": f"{call.st.workspace.id}/{segment}/{name}", "name": name, "type": f"{ARM_TYPE}/{segment}",
            "properties": {"latestVersion": (active or versions)[-1]["version"], "nextVersion": str(max(numbers,
                           default=0) + 1), "isArchived": not active, "description": None, "tags": {},
                           "properties": {}},
            "systemData": system_data()}


def _guarded(action: Callable[[], Reply]) -> Reply:
    """The registry's errors as Azure words them: 400 naming the field, 404, 409 for a changed version."""
    try:
        return action()
    except ConfigError as exc:
        raise bad_request(exc.field, str(exc)) from None
    except NotFoundError as exc:
        raise ServiceError(404, "ResourceNotFound", str(exc)) from None
    except StateError as exc:
        raise ServiceError(409, "Conflict", str(exc)) from None


def _put(call: Call, kind: str, name: str, version: str) -> Reply:
    props = call.props if isinstance(call.props, dict) else {}
    _, type_key, uri_key = REST[kind]
    if props.get("isArchived") is True:  # ml_client.<kind>.archive: the version as it is, marked archived
        return Reply(200, _version(call, _assets(call).archive(kind, name, version)[0]))
    uri = short_ref(str(props.get(uri_key) or ""))  # azure-ai-ml may send a datastore URI's long form
    if not uri.startswith("azureml://"):
        raise bad_request(f"properties.{uri_key}", f"properties.{uri_key}: {uri[:200]!r} is not an azureml:// URI; "
                          "upload the data first (azure-ai-ml does for a local path) and send its datastore URI")
    fields = {"name": name, "version": version, "path": uri, "type": props.get(type_key),
              "description": props.get("description"), "tags": props.get("tags"), "properties": props.get("properties")}
    if kind == "model":
        flavors = props.get("flavors") if isinstance(props.get("flavors"), dict) else {}
        fields.update(flavors={k: v.get("data") or {} if isinstance(v, dict) else v for k, v in flavors.items()},
                      stage=props.get("stage"))
    spec = asset_from_dict(kind, {k: v for k, v in fields.items() if v is not None}, base_dir=_NOWHERE)
    return Reply(201, _version(call, _assets(call).create(spec)))


def versioned(kind: str) -> Callable[[Call], Reply]:
    def handler(call: Call) -> Reply:
        name, version = _name(call), call.params["version"]
        if call.method == "PUT":
            return _guarded(lambda: _put(call, kind, name, version))
        return _guarded(lambda: Reply(body=_version(call, _assets(call).get(kind, name, version))))
    return handler


def versions(kind: str) -> Callable[[Call], Reply]:
    def handler(call: Call) -> Reply:
        archived, only = _LIST_VIEW.get(str(call.query.get("listViewType", "ActiveOnly")).lower(), (False, False))
        found = [v for v in _assets(call).list(kind, _name(call), archived=archived)
                 if not only or v.get("archived")]
        return Reply(body={"value": [_version(call, v) for v in reversed(found)]})  # the newest first
    return handler


def container(kind: str) -> Callable[[Call], Reply]:
    def handler(call: Call) -> Reply:
        name = _name(call)
        found = _assets(call).list(kind, name, archived=True)
        if not found:
            raise not_found(f"{kind} {name}")
        return Reply(body=_container(call, kind, name, found))
    return handler


def containers(kind: str) -> Callable[[Call], Reply]:
    def handler(call: Call) -> Reply:
        by_name: dict[str, list[dict[str, Any]]] = {}
        for spec in _assets(call).list(kind, archived=True):
            by_name.setdefault(spec["name"], []).append(spec)
        found = [_container(call, kind, n, v) for n, v in by_name.items()]
        archived, only = _LIST_VIEW.get(str(call.query.get("listViewType", "ActiveOnly")).lower(), (False, False))
        return Reply(body={"value": [c for c in found if (archived or not c["properties"]["isArchived"])
                                     and (not only or c["properties"]["isArchived"])]})
    return handler


def routes(ws: str) -> list[tuple[str, str, Callable[[Call], Reply], bool]]:
    """Each kind's four routes, under the workspace path `ws`."""
    found: list[tuple[str, str, Callable[[Call], Reply], bool]] = []
    for kind, (segment, _, _) in REST.items():
        found += [("GET", f"{ws}/{segment}", containers(kind), True),
                  ("GET", f"{ws}/{segment}/{{name}}", container(kind), True),
                  ("GET", f"{ws}/{segment}/{{name}}/versions", versions(kind), True),
                  ("GET|PUT", f"{ws}/{segment}/{{name}}/versions/{{version}}", versioned(kind), True)]
    return found
