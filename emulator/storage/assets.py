"""Data and model assets (`amlemu data create`, `amlemu model create`): named, versioned pointers to
data on a datastore, as az ml registers them. A local path is uploaded at create to the default
datastore (`LocalUpload/<content hash>/<name>`, as az ml does), a job's output
(`azureml://jobs/<job>/outputs/<name>`) is resolved to where that job wrote it; the asset then holds
one `azureml://datastores/...` URI, so a job's `azureml:<name>:<version>` input is a datastore input.

Specs are pure data (JSON in the home's database, table `assets`); versions never change once made.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError, NotFoundError, StateError
from amlemu.names import check_asset_name
from amlemu.specs import DataInput, JobSpec
from amlemu.storage.datastores import DEFAULT, parse_uri

DATA_TYPES = ("uri_file", "uri_folder", "mltable")
MODEL_TYPES = ("custom_model", "mlflow_model", "triton_model")
TYPES = {"data": DATA_TYPES, "model": MODEL_TYPES}
DEFAULT_TYPE = {"data": "uri_folder", "model": "custom_model"}
COMMON_FIELDS = {"$schema", "name", "version", "description", "tags", "properties", "path", "type", "datastore",
                 "stage"}
FIELDS = {"data": COMMON_FIELDS | {"auto_delete_setting"}, "model": COMMON_FIELDS | {"flavors"}}
LABELS = ("latest",)  # the one label Azure ML resolves for data and models
# azureml:<name>:<version> | azureml:<name>@<label>; names as amlemu.names.ASSET_RE checks them.
ASSET_REF_RE = re.compile(r"^azureml:([^:@/]+)(?::([^:@/]+)|@([^:@/]+))$")
JOB_OUTPUT_RE = re.compile(r"^azureml://jobs/([^/]+)/outputs/([^/]+)(?:/paths/(.*))?/?$")


# What azure-ai-ml sends for an asset input (an ARM id, with or without "azureml:") and a datastore
# URI's long form; the registry and the job loader take the short forms.
_ARM_ASSET = re.compile(r"^(?:azureml:)?/subscriptions/[^/]+/resource[gG]roups/[^/]+/providers/"
                        r"Microsoft\.MachineLearningServices/workspaces/[^/]+/(?:data|models)/([^/]+)/versions/([^/]+)$")
_LONG_URI = re.compile(r"^azureml://subscriptions/[^/]+/resource[gG]roups/[^/]+/(?:providers/"
                       r"Microsoft\.MachineLearningServices/)?workspaces/[^/]+/(datastores/.*)$")


def short_ref(uri: str) -> str:
    """`azureml:<name>:<version>` for a data or model asset's ARM id, the short datastore URI for a
    long one, anything else as it is."""
    arm, long = _ARM_ASSET.match(uri), _LONG_URI.match(uri)
    return f"azureml:{arm.group(1).removeprefix('azureml:')}:{arm.group(2)}" if arm else f"azureml://{long.group(1)}" if long else uri


def default_output_uri(run_id: str, name: str) -> str:
    """Where a job's output without a path goes: Azure ML's default one on the default datastore."""
    return f"azureml://datastores/{DEFAULT}/paths/azureml/{run_id}/{name}/"


def is_asset_ref(path: str) -> bool:
    return bool(ASSET_REF_RE.match(path)) or bool(JOB_OUTPUT_RE.match(path))


def folder_type(kind: str) -> str:
    """What a job binds an asset of `kind` as: a file, or a folder (mltable and every model type)."""
    return "uri_file" if kind == "uri_file" else "uri_folder"


def _text(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(field, f"must be text, got {type(value).__name__}")
    return str(value)


def _dict(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(field, f"must be a mapping, got {type(value).__name__}")
    return {str(k): v for k, v in value.items()}


def _check_name(value: str, field: str, kind: str) -> None:
    """Azure ML's asset rule (amlemu.names), worded for a data or model asset."""
    try:
        check_asset_name(value, field, field)
    except ConfigError as exc:
        raise ConfigError(field, exc.problem.replace("environment", f"{kind} asset"), exc.fix) from None


def asset_from_dict(kind: str, data: Any, *, base_dir: Path) -> dict[str, Any]:
    """az ml's data / model YAML (or its flags, merged over it) -> the spec to register; `path` as
    written (a local path made absolute)."""
    if not isinstance(data, dict):
        raise ConfigError("-f", f"the {kind} YAML must be a mapping of fields")
    unknown = sorted(set(data) - FIELDS[kind])
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"known fields: {', '.join(sorted(FIELDS[kind]))}")
    name = _text(data.get("name"), "name")
    if name is None:
        raise ConfigError("name", "missing", f"give the {kind} asset's name (name: in the YAML or --name)")
    _check_name(name, "name", kind)
    version = _text(data.get("version"), "version")
    if version is not None:
        _check_name(version, "version", kind)
    type_ = _text(data.get("type"), "type") or DEFAULT_TYPE[kind]
    if type_ not in TYPES[kind]:
        raise ConfigError("type", f"'{type_}' is not a {kind} asset type", f"use one of: {', '.join(TYPES[kind])}")
    path = _text(data.get("path"), "path")
    if not path:
        raise ConfigError("path", "missing", "give a local path, an azureml://datastores/<ds>/paths/<p> URI or "
                          "azureml://jobs/<job>/outputs/<name>")
    if not path.startswith("azureml://"):
        if re.match(r"^[a-z][a-z0-9+.-]*:", path):
            raise ConfigError("path", f"{path}: only local paths and azureml:// URIs are emulated",
                              "stage the data with `amlemu data upload <local> azureml://datastores/<ds>/paths/<p>`"
                              " and register that URI")
        path = str((base_dir / Path(path).expanduser()).resolve())
    spec = {"kind": kind, "name": name, "version": version, "type": type_, "path": path,
            "description": _text(data.get("description"), "description") or "",
            "tags": _dict(data.get("tags"), "tags"), "properties": _dict(data.get("properties"), "properties"),
            "stage": _text(data.get("stage"), "stage") or ""}
    if kind == "model":
        spec["flavors"] = _dict(data.get("flavors"), "flavors")
    return spec


def _content_hash(local: Path) -> str:
    """Of the names and bytes under `local`: the same data registered again lands in the same place."""
    digest = hashlib.sha256()
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(local) if file != local else file.name).encode() + b"\0")
        with open(file, "rb") as reader:
            for chunk in iter(lambda: reader.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:32]


class Assets:
    """The workspace's data and model assets, in the home's database; `datastores` uploads local paths."""

    def __init__(self, store, datastores) -> None:  # type: ignore[no-untyped-def]
        self.store, self.datastores = store, datastores

    # --- reading -------------------------------------------------------------------------------
    def _rows(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        with self.store.transaction() as db:
            rows = db.execute("SELECT spec FROM assets WHERE kind = ? AND (? IS NULL OR name = ?) "
                              "ORDER BY name, created_at", (kind, name, name)).fetchall()
        return [json.loads(r["spec"]) for r in rows]

    def list(self, kind: str, name: str | None = None, archived: bool = False) -> list[dict[str, Any]]:
        """Every version (of `name`), archived ones only when asked for, as az ml's --include-archived."""
        return [s for s in self._rows(kind, name) if archived or not s.get("archived")]

    def get(self, kind: str, name: str, version: str | None = None, label: str | None = None) -> dict[str, Any]:
        """One version; with neither version nor label, or label latest: the latest one not archived."""
        if label is not None and label not in LABELS:
            raise ConfigError("label", f"'{label}' is not a label Azure ML resolves", "use latest, or give a version")
        versions = self._rows(kind, name)
        found = [s for s in versions if s["version"] == version] if version else \
            [s for s in versions if not s.get("archived")][-1:]
        if not found:
            what = f"{name}:{version}" if version else f"{name}@latest"
            known = ", ".join(s["version"] for s in versions) or "none"
            raise NotFoundError(f"{kind} asset", what, f"versions of {name}: {known}; register one with "
                                f"`amlemu {kind} create`")
        return found[0]

    def resolve(self, ref: str, field: str) -> tuple[str, str]:
        """A job input's path: `azureml:<name>:<version>`, `azureml:<name>@latest` (a data or model
        asset) or `azureml://jobs/<job>/outputs/<name>` -> (binding type or '', datastore URI)."""
        job = JOB_OUTPUT_RE.match(ref)
        if job:
            return "", self.job_output(*job.groups(), field=field)
        match = ASSET_REF_RE.match(ref)
        if not match:
            raise ConfigError(field, f"'{ref}' is not an asset reference", "write azureml:<name>:<version> or "
                              "azureml:<name>@latest")
        name, version, label = match.groups()
        for kind in ("data", "model"):
            if self._rows(kind, name):
                try:
                    spec = self.get(kind, name, version, label)
                except ConfigError as exc:
                    raise ConfigError(field, exc.problem, exc.fix) from None
                except NotFoundError as exc:
                    problem, _, fix = str(exc).partition("; ")
                    raise ConfigError(field, problem, fix or None) from None
                return folder_type(spec["type"]), spec["path"]
        raise ConfigError(field, f"no data or model asset named {name}", "register it with `amlemu data create` or "
                          "`amlemu model create`; list them with `amlemu data list`")

    def job_output(self, job: str, output: str, sub: str | None = None, field: str = "path") -> str:
        """Where job `job` wrote its output `output` (its path, or Azure ML's default one)."""
        try:
            record = self.store.run(job)
        except NotFoundError:
            raise ConfigError(field, f"no job named {job} in this workspace", "list jobs with `amlemu job list`") \
                from None
        outputs = record.job.get("outputs", {})
        if output not in outputs:
            raise ConfigError(field, f"job {job} has no output named {output}",
                              f"its outputs: {', '.join(outputs) or 'none'}")
        uri = outputs[output].get("path") or default_output_uri(job, output)
        return uri.rstrip("/") + "/" + sub.lstrip("/") if sub else uri

    # --- registering ---------------------------------------------------------------------------
    def _stored_path(self, spec: dict[str, Any], upload: bool) -> str:
        """The datastore URI the asset will hold; with upload, a local path is uploaded there."""
        path = spec["path"]
        if path.startswith("azureml://jobs/"):
            return self.resolve(path, "path")[1]
        if path.startswith("azureml://"):
            try:
                name, _ = parse_uri(path)
                self.datastores.peek(name)
            except (ConfigError, NotFoundError) as exc:
                raise ConfigError("path", str(exc)) from None
            return path
        local = Path(path)
        wanted_file = spec["type"] == "uri_file"
        if not (local.is_file() if wanted_file else local.exists() if spec["kind"] == "model" else local.is_dir()):
            raise ConfigError("path", f"{local} is not an existing {'file' if wanted_file else 'folder'}",
                              "fix the path (a relative one is relative to the YAML's folder)")
        if spec["type"] == "mltable" and not (local / "MLTable").is_file():
            raise ConfigError("path", f"{local} has no MLTable file", "an mltable asset is a folder with an MLTable")
        folder = f"azureml://datastores/{DEFAULT}/paths/LocalUpload/{_content_hash(local)}/"
        if upload:
            self.datastores.upload(local, folder if local.is_file() else folder + local.name + "/")
        return folder + local.name + ("" if local.is_file() else "/")

    def plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        """What create would store, uploading nothing (the dry run)."""
        return {**spec, "path": self._stored_path(spec, upload=False), "source": spec["path"]}

    def create(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Register `spec` (its version: given, else the next integer); the same content again
        without a version is the version it already has."""
        stored = {**spec, "path": self._stored_path(spec, upload=True), "source": spec["path"], "archived": False}
        kind, name = spec["kind"], spec["name"]
        with self.store.transaction() as db:
            rows = db.execute("SELECT version, spec FROM assets WHERE kind = ? AND name = ?", (kind, name)).fetchall()
            versions = {r["version"]: json.loads(r["spec"]) for r in rows}
            same = [v for v in versions.values() if not spec["version"] and {**v, "version": None} == stored]
            if same:
                return same[-1]
            version = spec["version"] or str(1 + max((int(v) for v in versions if v.isdigit()), default=0))
            stored["version"] = version
            if version in versions:
                if versions[version] == stored:
                    return stored
                raise StateError(f"{kind} asset '{name}' version {version} already exists with other content; "
                                 "versions cannot change: give another --version")
            db.execute("INSERT INTO assets VALUES (?, ?, ?, ?, ?)", (kind, name, version, json.dumps(stored),
                                                                      time.time()))
        return stored

    def archive_targets(self, kind: str, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """What `archive` would hide (its dry run): the version, or every version not hidden yet."""
        targets = [self.get(kind, name, version)] if version else self.list(kind, name)
        if not targets:
            raise NotFoundError(f"{kind} asset", name, f"list them with `amlemu {kind} list`")
        return targets

    def archive(self, kind: str, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """Hide a version (or, without one, every version) from list and @latest; jobs naming the
        version still resolve it, as on Azure ML."""
        targets = self.archive_targets(kind, name, version)
        with self.store.transaction() as db:
            for spec in targets:
                spec["archived"] = True
                db.execute("UPDATE assets SET spec = ? WHERE kind = ? AND name = ? AND version = ?",
                           (json.dumps(spec), kind, name, spec["version"]))
        return targets

    def bind(self, job: JobSpec) -> JobSpec:
        """The job with each asset input (`azureml:<name>:<version>`, `@latest`, a job's output) as
        the datastore URI it resolves to, bound as a file or folder as the asset is. Resolved at
        submission, so a job's record says which version it read."""
        inputs: dict[str, Any] = {}
        for name, value in job.inputs.items():
            if isinstance(value, DataInput) and is_asset_ref(value.path):
                type_, uri = self.resolve(value.path, f"inputs.{name}.path")
                value = DataInput(type_ or value.type, uri, value.mode)
            inputs[name] = value
        return replace(job, inputs=inputs) if inputs != job.inputs else job
