"""Components through the service (issue 29): `ml_client.components.*` over the emulator's component
registry (amlemu.pipelines.registry: the store `amlemu component create|list|show` uses), so a
component registered by either is the other's. The REST shapes are componentrest.py's; this is the
glue to the emulator (EmulatorState, the store, the service's folder).

A version PUT through the service also keeps its body (the componentSpec with the code and
environment ids as the SDK sent them) in `<home>/service/components/<name>/<version>.json`, so it
reads back as it was sent. The anonymous components azure-ai-ml registers for a pipeline's steps
(`azureml_anonymous/<hash>`) are kept there only, never in the registry (Azure ML lists them
nowhere either); a pipeline step naming one gets its component inline.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu import servicefile, statefile
from amlemu.errors import ConfigError, StateError
from amlemu.names import check_asset_name
from amlemu.pipelines.registry import Components
from amlemu.service.state import ServiceError, bad_request, componentrest, not_found

if TYPE_CHECKING:
    from amlemu.service.state.emulator import EmulatorState

ORDER_DESC = ("createdtime desc", "createdat desc")  # the SDK's $orderBy for the latest version


class ComponentState:
    """PipelineState's `components` (EmulatorState.pipelines.components): what the routes
    (protocol/componentroutes.py) and a pipeline's steps ask of components."""

    def __init__(self, state: EmulatorState) -> None:
        self.st = state
        self.folder = servicefile.service_dir(state.home.root) / "components"

    @property
    def registry(self) -> Components:
        return Components(self.st.emu.store)  # the request thread's own store connection

    def _saved_path(self, name: str, version: str) -> Path:
        try:
            check_asset_name(name, "name")
            check_asset_name(version, "version", "version")
        except ConfigError as exc:
            raise bad_request(exc.field, str(exc)) from None
        return self.folder / name / f"{version}.json"

    def _saved(self, name: str, version: str) -> dict[str, Any] | None:
        try:
            found = json.loads(self._saved_path(name, version).read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    # --- versions --------------------------------------------------------------------------------
    def put(self, name: str, version: str, props: dict[str, Any]) -> dict[str, Any]:
        """A version PUT: checked as `amlemu component create` checks a file, registered (an
        anonymous one kept aside), its body kept; the ComponentVersion."""
        anonymous = name == componentrest.ANONYMOUS  # azure-ai-ml names every anonymous one so (isAnonymous)
        path = self._saved_path(name, version)
        spec = componentrest.spec_of(props)
        loaded = componentrest.load(spec, name, version, self.st._code_dir, self.st._environment, anonymous=anonymous)
        kept = {"componentSpec": spec, "yaml": loaded.to_dict(),
                **{k: props[k] for k in ("description", "tags", "properties") if props.get(k) is not None}}
        if not anonymous:
            try:
                self.registry.create(loaded)
            except StateError:  # the registry's words name the CLI's --version
                raise ServiceError(409, "Conflict", f"component {name} version {version} already exists with other "
                                   "content; a version never changes: register it under another version",
                                   target="version") from None
            except ConfigError as exc:
                raise bad_request(exc.field, str(exc)) from None
        statefile.write_json(path, kept)
        self.st.log(f"component {name}:{version} registered" + (" (anonymous)" if anonymous else ""))
        return self._resource(name, version, kept, anonymous)

    def _resource(self, name: str, version: str, kept: dict[str, Any], anonymous: bool) -> dict[str, Any]:
        return componentrest.version_resource(self.st.workspace.id, name, version, kept["componentSpec"],
                                              anonymous=anonymous, extra=kept)

    def get(self, name: str, version: str) -> dict[str, Any]:
        """A version; `azureml_default` (components.get(name)) is the latest."""
        if name == componentrest.ANONYMOUS:
            kept = self._saved(name, version)
            if kept is None:
                raise not_found(f"component {name}:{version}")
            return self._resource(name, version, kept, True)
        record = self.registry.lookup(name, None if version == componentrest.DEFAULT_VERSION else version)
        if record is None:
            raise not_found(f"component {name}:{version}")
        kept = self._saved(name, record["version"]) or {"componentSpec": componentrest.spec_from_record(record)}
        return self._resource(name, record["version"], kept, False)

    def versions(self, name: str, order_by: str | None = None, top: int | None = None) -> list[dict[str, Any]]:
        """Every version of `name`, the newest first (as the SDK's latest-version query reads them)."""
        found = [self.get(name, r["version"]) for r in reversed(self.registry.list(name))]
        if order_by and order_by.lower() not in ORDER_DESC:
            found.reverse()
        return found[:top] if top else found

    # --- containers ------------------------------------------------------------------------------
    def container(self, name: str) -> dict[str, Any]:
        rows = self.registry.list(name)
        if not rows:
            raise not_found(f"component {name}")
        return componentrest.container_resource(self.st.workspace.id, name, [r["version"] for r in rows],
                                                rows[-1].get("description"))

    def containers(self) -> list[dict[str, Any]]:
        return [self.container(r["name"]) for r in self.registry.list()]

    # --- a pipeline step's componentId -------------------------------------------------------------
    def step_component(self, component_id: str, field: str) -> str | dict[str, Any]:
        """What a pipeline step's `component:` is for a componentId: `azureml:<name>:<version>` of a
        registered one (the driver resolves it from the registry), an anonymous one's YAML inline."""
        ref = componentrest.arm_ref(component_id)
        if ref is None:
            raise bad_request(field, f"{field}: {str(component_id)[:200]!r} is not a component version's id; "
                              "azure-ai-ml registers a step's component and sends its id")
        name, version = ref
        if name == componentrest.ANONYMOUS:
            kept = self._saved(name, version)
            if kept is None:
                raise bad_request(field, f"{field}: component {name}:{version} was not registered here; "
                                  "submit the pipeline with azure-ai-ml, which registers it first")
            return dict(kept["yaml"])
        if self.registry.lookup(name, version) is None:
            raise bad_request(field, f"{field}: no registered component {name}:{version}; register it "
                              "(ml_client.components.create_or_update, or amlemu component create -f)")
        return f"azureml:{name}:{version}"
