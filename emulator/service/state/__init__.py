"""What the service's routes ask of a workspace: the small interface between the protocol
(emulator/service/protocol/: paths, REST shapes, auth) and whatever holds the workspace.

Two implementations: `amlemu.service.state.emulator.EmulatorState` (the real emulator on a home) and
the test double's ladder state (pytest_amlemu.amlservice). Both share the registry of code and
environment versions and a blob store (this module), which are protocol bookkeeping rather than
emulation. A state raises ServiceError (Azure's error JSON) for anything a client did wrong.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from amlemu import statefile
from amlemu.errors import ConfigError
from amlemu.names import check_asset_name, check_image_reference

ARM_TYPE = "Microsoft.MachineLearningServices/workspaces"
ACCOUNT = "amlemustore"  # the blob account the service's SAS URLs name, as the first path segment


@dataclass(frozen=True)
class Workspace:
    subscription_id: str
    resource_group: str
    workspace_name: str
    location: str

    @property
    def id(self) -> str:
        return (f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
                f"/providers/Microsoft.MachineLearningServices/workspaces/{self.workspace_name}")

    def matches(self, sub: str, rg: str, ws: str) -> bool:
        # ARM compares resource group and resource names without case.
        return (sub, rg.lower(), ws.lower()) == (self.subscription_id, self.resource_group.lower(),
                                                   self.workspace_name.lower())

    def config(self) -> dict[str, str]:
        """config.json's keys, as MLClient.from_config() reads them."""
        return {"subscription_id": self.subscription_id, "resource_group": self.resource_group,
                "workspace_name": self.workspace_name}


class ServiceError(Exception):
    """An error reply in Azure's shape: {"error": {"code", "message", "target"}}."""

    def __init__(self, status: int, code: str, message: str, target: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.target = status, code, message, target

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        error["details"] = []
        return {"error": error}


def bad_request(field: str, message: str) -> ServiceError:
    """A request the service refuses, naming the field (the SDK prints Azure's JSON as it is)."""
    return ServiceError(400, "UserError", message, target=field)


def from_config_error(exc: ConfigError) -> ServiceError:
    return bad_request(exc.field, str(exc))


def whole_number(value: Any, field: str, default: int) -> int:
    """A JSON integer field's value (`default` when absent or null), or a 400 naming the field: a
    string, a fraction, NaN or an infinity is not a count (int() would take "3" and cut 1.5 to 1)."""
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(field, f"{field}: {str(value)[:40]!r} is not a whole number; send an integer")
    return value


def not_found(what: str) -> ServiceError:
    return ServiceError(404, "ResourceNotFound", f"{what} was not found")


@dataclass(frozen=True)
class RunView:
    """A job as the run history reports it (what jobs.stream polls)."""

    status: str
    target: str
    log_files: list[str] = field(default_factory=list)  # paths readable with State.read_log
    error: str | None = None
    start_time: float | None = None
    end_time: float | None = None


class Blobs(Protocol):
    """The blob container the SDK uploads code snapshots to (through the SAS URL it is handed)."""

    def put(self, container: str, blob: str, data: bytes, metadata: dict[str, str] | None) -> None: ...

    def get(self, container: str, blob: str) -> tuple[bytes, dict[str, str]] | None: ...


class MemoryBlobs:
    """Blobs in a dict, "{container}/{blob}" -> bytes (the double's, which tests inspect)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.metadata: dict[str, dict[str, str]] = {}

    def put(self, container: str, blob: str, data: bytes, metadata: dict[str, str] | None) -> None:
        path = f"{container}/{blob}"
        if metadata is None:
            self.data[path] = data
        self.metadata[path] = metadata or self.metadata.get(path, {})

    def get(self, container: str, blob: str) -> tuple[bytes, dict[str, str]] | None:
        path = f"{container}/{blob}"
        return (self.data[path], self.metadata.get(path, {})) if path in self.data else None


class DiskBlobs:
    """Blobs as files under a folder: a code snapshot uploaded here is a folder a job can run."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, container: str, blob: str = "") -> Path:
        # Within its own container: a SAS names one container, so `..` may not reach a neighbour.
        if "/" in container or container in ("", ".", "..") or ".." in blob.split("/"):
            raise bad_request("blob", f"'{container}/{blob}' leaves the container")
        base = (self.root / container).resolve()
        target = (base / blob).resolve()
        if not target.is_relative_to(base):
            raise bad_request("blob", f"'{container}/{blob}' leaves the container")
        return target

    def put(self, container: str, blob: str, data: bytes, metadata: dict[str, str] | None) -> None:
        target = self.path(container, blob)
        if metadata is None:
            statefile.write_bytes(target, data)
        meta = self.root.parent / "blob-metadata" / container / (blob + ".json")  # never inside a snapshot
        statefile.write_json(meta, metadata or {})

    def get(self, container: str, blob: str) -> tuple[bytes, dict[str, str]] | None:
        target = self.path(container, blob)
        if not target.is_file():
            return None
        meta = self.root.parent / "blob-metadata" / container / (blob + ".json")
        try:
            found = json.loads(meta.read_text())
        except (OSError, ValueError):  # none, or not ours: the SDK then uploads again
            found = {}
        return target.read_bytes(), found if isinstance(found, dict) else {}


def _key(saved: str) -> tuple[str, str]:
    name, version = saved.split("\n", 1)  # ValueError for a key the registry never wrote
    return name, version


def system_data() -> dict[str, str]:
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())
    return {"createdAt": now, "createdBy": "amlemu", "createdByType": "User",
            "lastModifiedAt": now, "lastModifiedBy": "amlemu", "lastModifiedByType": "User"}


class Registry:
    """Versioned assets the SDK registers before a job: code versions and environments. Curated
    environments (AzureML-*) exist in every workspace, at version 1. Kept in a JSON file when
    given one, so a restarted service still knows the snapshots it was sent."""

    KINDS = ("codes", "environments")

    def __init__(self, workspace: Workspace, path: Path | None = None,
                 log: Callable[[str], None] = lambda line: None) -> None:
        self.workspace, self.path = workspace, path
        self.lock = threading.RLock()
        self.assets: dict[str, dict[tuple[str, str], dict[str, Any]]] = {k: {} for k in self.KINDS}
        if path is not None and path.exists():
            self._load(path, log)

    def _load(self, path: Path, log: Callable[[str], None]) -> None:
        """The saved versions; a file that is not the registry (a write cut short before writes were
        staged, an edit by hand) is moved aside and the registry starts empty: the SDK registers
        again what it does not find."""
        try:
            saved = json.loads(path.read_text())
            assets = {kind: {_key(k): dict(v) for k, v in saved.get(kind, {}).items()} for kind in self.KINDS}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            path.replace(aside)
            log(f"warning: {path} could not be read ({type(exc).__name__}: {exc}); moved to {aside.name}, "
                "starting with no registered code or environment versions")
            return
        self.assets.update(assets)

    def clear(self) -> None:
        with self.lock:
            for store in self.assets.values():
                store.clear()

    def _save(self) -> None:
        if self.path is not None:  # staged, then renamed: a kill or a full disk leaves the old file
            data = {kind: {"\n".join(k): v for k, v in store.items()} for kind, store in self.assets.items()}
            statefile.write_json(self.path, data)

    def resource(self, kind: str, name: str, version: str, props: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"{self.workspace.id}/{kind}/{name}/versions/{version}", "name": version,
                "type": f"{ARM_TYPE}/{kind}/versions", "properties": props, "systemData": system_data()}

    def put(self, kind: str, name: str, version: str, props: dict[str, Any]) -> dict[str, Any]:
        try:  # the rule `amlemu environment create` applies, before anything is stored
            check_asset_name(name.removeprefix("azureml:"), "name")
            check_asset_name(version, "version", "version")
            if kind == "environments" and isinstance(props, dict) and props.get("image"):
                check_image_reference(props["image"], "properties.image")
        except ConfigError as exc:
            raise from_config_error(exc) from None
        with self.lock:
            self.assets[kind][(name, version)] = self.resource(kind, name, version, props)
            self._save()
            return self.assets[kind][(name, version)]

    @staticmethod
    def is_curated(name: str) -> bool:
        return name.startswith("AzureML-")

    def curated(self, name: str) -> dict[str, Any] | None:
        if not self.is_curated(name):
            return None
        image = f"mcr.microsoft.com/azureml/curated/{name[len('AzureML-'):].lower()}:1"
        return self.resource("environments", name, "1", {"image": image, "osType": "Linux", "isAnonymous": False,
                                                         "isArchived": False, "tags": {}, "properties": {}})

    def get(self, kind: str, name: str, version: str) -> dict[str, Any]:
        name = name.removeprefix("azureml:")  # the SDK keeps the prefix even inside ARM ids
        found = self.assets[kind].get((name, version))
        if found is None and kind == "environments" and version == "1":
            found = self.curated(name)
        if found is None:
            raise not_found(f"{kind[:-1]} {name}:{version}")
        return found

    def versions(self, kind: str, name: str, hash_sha256: str | None = None) -> list[dict[str, Any]]:
        name = name.removeprefix("azureml:")
        own = [v for (n, _), v in list(self.assets[kind].items()) if n == name and hash_sha256 in (
            None, v["properties"].get("properties", {}).get("hash_sha256"))]
        curated = self.curated(name) if kind == "environments" else None
        return own[::-1] or ([curated] if curated else [])

    def exists(self, kind: str, name: str, version: str | None) -> bool:
        name = name.removeprefix("azureml:")
        if kind == "environments" and self.is_curated(name) and version in (None, "1"):
            return True
        return any(n == name and version in (None, v) for n, v in list(self.assets[kind]))


class State(Protocol):
    """What the routes call. Names are the REST ones; bodies are the JSON the SDK sent."""

    workspace: Workspace
    registry: Registry
    blobs: Blobs

    def put_job(self, name: str, body: Any) -> dict[str, Any]: ...  # the job's REST properties, status set

    def get_job(self, name: str) -> dict[str, Any]: ...

    def job_created(self, name: str) -> float: ...  # when it was submitted (systemData.createdAt)

    def list_jobs(self) -> list[tuple[str, dict[str, Any]]]: ...

    def cancel_job(self, name: str) -> str: ...  # a long-running operation's id

    def run_details(self, name: str) -> RunView: ...

    def read_log(self, name: str, path: str) -> bytes: ...

    def put_compute(self, name: str, body: Any) -> tuple[dict[str, Any], str]: ...  # properties, operation id

    def get_compute(self, name: str) -> dict[str, Any]: ...

    def list_computes(self) -> list[tuple[str, dict[str, Any]]]: ...

    def delete_compute(self, name: str) -> str: ...

    def list_nodes(self, name: str) -> list[dict[str, Any]]: ...

    def operation(self, op_id: str) -> tuple[str, str | None]: ...  # InProgress|Succeeded|Failed, error

    def list_datastores(self) -> list[tuple[str, dict[str, Any]]]: ...

    def datastore_secrets(self, name: str) -> dict[str, Any]: ...

    # Capabilities a state may lack (the tests' double has none of them): the routes then answer
    # 404 or 501 saying what is not served, or refuse a run's token as expired.
    v1: Any | None  # SDK v1 runs: experiments, startrun, run history (state/v1.py's EmulatorV1)
    assets: Any | None  # data and model assets (amlemu.storage.assets.Assets)
    sweeps: Any | None  # sweep jobs: their PUT, their Sweep resource, their trials (state/sweepstate.py)
    pipelines: Any | None  # pipeline jobs and the components they run (state/pipelinestate.py, componentstate.py)

    def run_active(self, name: str) -> bool: ...  # a run's token opens its routes while the run is active

    def run_outputs(self, name: str) -> dict[str, str]: ...  # jobs.download: the run's output assets

    def list_blobs(self, container: str, prefix: str) -> list[tuple[str, int]]: ...

    def read_blob(self, container: str, blob: str) -> bytes: ...

    def write_blob(self, container: str, blob: str, data: bytes) -> None: ...


class WithoutDownloads:
    """State's download methods for a state that does not serve jobs.download (the tests' double)."""

    def _refuse(self) -> ServiceError:
        return ServiceError(501, "NotImplemented", "jobs.download is not served by this service", target="download")

    def run_outputs(self, name: str) -> dict[str, str]:
        raise self._refuse()

    def list_blobs(self, container: str, prefix: str) -> list[tuple[str, int]]:
        raise self._refuse()

    def read_blob(self, container: str, blob: str) -> bytes:
        raise self._refuse()

    def write_blob(self, container: str, blob: str, data: bytes) -> None:
        raise self._refuse()
