"""Registered components (`amlemu component create|list|show`), versioned as az ml registers them,
in the home's `assets` table (kind "component"), and a pipeline step's `azureml:<name>:<version>` /
`azureml:<name>@latest` (or the ARM id azure-ai-ml sends) resolved to the component's YAML mapping.
A registered version never changes; its code folder is kept as an absolute path (not a snapshot).
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from amlemu.errors import ConfigError, NotFoundError, StateError
from amlemu.pipelines.component import FIELDS, ComponentSpec

KIND = "component"
LABELS = ("latest",)
REF_RE = re.compile(r"^azureml:([^:@/]+)(?::([^:@/]+)|@([^:@/]+))?$")
ARM_RE = re.compile(r"^(?:azureml:)?/subscriptions/[^/]+/resource[gG]roups/[^/]+/providers/"
                    r"Microsoft\.MachineLearningServices/workspaces/[^/]+/components/([^/]+)(?:/versions/([^/]+))?$")
# lookup(name, version): the registered record, or None; version None: the latest one.
Lookup = Callable[[str, "str | None"], "Mapping[str, Any] | None"]


def parse_component_ref(ref: str, field: str = "component") -> tuple[str, str | None]:
    """(name, version or None for the latest) of `azureml:<name>:<version>`, `azureml:<name>@latest`
    or an ARM id (`.../components/<name>/versions/<version>`)."""
    text = ref.strip() if isinstance(ref, str) else ""
    if text.startswith("azureml://registries/"):
        raise ConfigError(field, f"{text:.80}: components from a registry are not emulated",
                          "register it here (`amlemu component create -f`) and write azureml:<name>:<version>")
    arm = ARM_RE.match(text)
    if arm:
        return arm.group(1), arm.group(2)
    match = REF_RE.match(text)
    if not match:
        raise ConfigError(field, f"{text or ref!r:.80} is not a component reference",
                          "write azureml:<name>:<version> or azureml:<name>@latest")
    name, version, label = match.groups()
    if version is None and label is None:
        raise ConfigError(field, f"{text}: no version", f"write azureml:{name}:<version> or azureml:{name}@latest")
    if label is not None and label not in LABELS:
        raise ConfigError(field, f"'{label}' is not a label Azure ML resolves for components",
                          f"write azureml:{name}@latest or azureml:{name}:<version>")
    return name, version


def resolve_component_ref(ref: str, lookup: Lookup, field: str = "component") -> dict[str, Any]:
    """The registered component's YAML mapping (for component_from_dict) that `ref` names;
    one line naming `field` when there is none."""
    name, version = parse_component_ref(ref, field)
    found = lookup(name, version)
    if found is None:
        what = f"{name}:{version}" if version else f"{name}@latest"
        raise ConfigError(field, f"no registered component {what}", "register it with `amlemu component create -f "
                          "component.yml`; list them with `amlemu component list`")
    return {k: v for k, v in found.items() if k in FIELDS}


class Components:
    """The workspace's registered components, in the home's database (`assets`, kind component)."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store = store

    def _rows(self, name: str | None = None) -> list[dict[str, Any]]:
        with self.store.transaction() as db:
            rows = db.execute("SELECT spec FROM assets WHERE kind = ? AND (? IS NULL OR name = ?) "
                              "ORDER BY name, created_at", (KIND, name, name)).fetchall()
        return [json.loads(r["spec"]) for r in rows]

    def list(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every version of `name`; without a name, each component's latest version."""
        rows = self._rows(name)
        return rows if name else list({r["name"]: r for r in rows}.values())

    def lookup(self, name: str, version: str | None = None) -> dict[str, Any] | None:
        versions = self._rows(name)
        found = [r for r in versions if r["version"] == version] if version else versions[-1:]
        return found[0] if found else None

    def get(self, name: str, version: str | None = None) -> dict[str, Any]:
        found = self.lookup(name, version)
        if found is None:
            known = ", ".join(r["version"] for r in self._rows(name)) or "none"
            raise NotFoundError("component", f"{name}:{version}" if version else name,
                                f"versions of {name}: {known}; register one with `amlemu component create -f`")
        return found

    def resolve(self, ref: str, field: str = "component") -> dict[str, Any]:
        """A step's `azureml:` reference -> the component's YAML mapping (pipelines' lookup)."""
        return resolve_component_ref(ref, self.lookup, field)

    def _record(self, spec: ComponentSpec, version: str) -> dict[str, Any]:
        return {**spec.to_dict(), "version": version, "base_dir": spec.base_dir}

    def plan(self, spec: ComponentSpec) -> dict[str, Any]:
        """What create would store (the dry run): the version it would get, or already has."""
        return self._record(spec, self._version(spec, self._rows(spec.name)))

    def _version(self, spec: ComponentSpec, rows: list[dict[str, Any]]) -> str:
        """Its version: given, else the one the same component already has, else the next integer."""
        same = [r["version"] for r in rows if not spec.version and r == self._record(spec, r["version"])]
        return spec.version or (same[-1] if same else
                                str(1 + max((int(r["version"]) for r in rows if str(r["version"]).isdigit()), default=0)))

    def create(self, spec: ComponentSpec) -> dict[str, Any]:
        """Register `spec` at its version, else the next integer; the same component again without a
        version is the version it already has; a version never changes."""
        if spec.name is None:
            raise ConfigError("name", "missing", "give the component a name to register it")
        with self.store.transaction() as db:
            rows = [json.loads(r["spec"]) for r in db.execute(
                "SELECT spec FROM assets WHERE kind = ? AND name = ? ORDER BY created_at", (KIND, spec.name))]
            version = self._version(spec, rows)
            record = self._record(spec, version)
            existing = [r for r in rows if r["version"] == version]
            if existing:
                if existing[0] == record:
                    return record
                raise StateError(f"component '{spec.name}' version {version} already exists with other content; "
                                 "versions cannot change: give another --version")
            db.execute("INSERT INTO assets VALUES (?, ?, ?, ?, ?)", (KIND, spec.name, version, json.dumps(record),
                                                                      time.time()))
        return record
