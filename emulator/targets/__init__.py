"""Submission targets, chosen by name from a registry: `emulator` (this machine) and `azureml`
(real AmlCompute through the Azure ML SDKs). The choice: --target, else $AMLEMU_TARGET, else
`target` under [tool.amlemu] in the project's pyproject.toml, else emulator."""
from __future__ import annotations

import importlib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from amlemu.errors import ConfigError
from amlemu.targets.base import JobSource, Plan, Target, WorkspaceOptions

__all__ = ["TARGETS", "JobSource", "Plan", "Target", "WorkspaceOptions", "get_target", "project_config",
           "resolve_target"]

# Imported lazily: the azureml target needs an Azure ML SDK, which is an optional extra.
TARGETS = {
    "emulator": "amlemu.targets.local:EmulatorTarget",
    "azureml": "amlemu.targets.azureml:AzureMLTarget",
}
DEFAULT_TARGET = "emulator"


def target_class(name: str) -> type[Target]:
    try:
        module, _, attr = TARGETS[name].partition(":")
    except KeyError:
        raise ConfigError("target", f"unknown target '{name}'", f"use one of: {', '.join(TARGETS)}") from None
    return getattr(importlib.import_module(module), attr)


def get_target(name: str, **options: Any) -> Target:
    return target_class(name)(**options)


def project_config(start: Path) -> tuple[dict[str, Any], Path | None]:
    """[tool.amlemu] of the nearest pyproject.toml at or above `start` (and that file)."""
    for folder in (start.resolve(), *start.resolve().parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            try:
                data = tomllib.loads(path.read_text())
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(str(path), f"not valid TOML: {exc}") from None
            section = data.get("tool", {}).get("amlemu", {})
            if not isinstance(section, dict):
                raise ConfigError(f"{path}: tool.amlemu", "must be a table")
            return section, path
    return {}, None


def resolve_target(explicit: str | None, environ: Mapping[str, str], start: Path) -> tuple[str, str]:
    """(target name, where the choice came from)."""
    if explicit:
        name, source = explicit, "--target"
    elif environ.get("AMLEMU_TARGET"):
        name, source = environ["AMLEMU_TARGET"], "$AMLEMU_TARGET"
    else:
        config, path = project_config(start)
        if "target" in config:
            name, source = str(config["target"]), f"tool.amlemu.target in {path}"
        else:
            name, source = DEFAULT_TARGET, "default"
    if name not in TARGETS:
        raise ConfigError(source, f"unknown target '{name}'", f"use one of: {', '.join(TARGETS)}")
    return name, source
