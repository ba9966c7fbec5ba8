"""Node backends, chosen by name from a registry; `auto` picks docker when an engine answers."""
from __future__ import annotations

import importlib

from emulator.backends.base import NodeBackend, NodeInfo, NodeRequest
from emulator.errors import ConfigError
from emulator.home import Home

__all__ = ["BACKENDS", "NodeBackend", "NodeInfo", "NodeRequest", "get_backend", "resolve_backend"]

# Imported lazily: the docker SDK is needed only by the docker backend.
BACKENDS = {
    "docker": "emulator.backends.docker:DockerBackend",
    "process": "emulator.backends.process:ProcessBackend",
}


def backend_class(name: str) -> type[NodeBackend]:
    try:
        module, _, attr = BACKENDS[name].partition(":")
    except KeyError:
        raise ConfigError("backend", f"unknown backend '{name}'",
                          f"use one of: auto, {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), attr)


def resolve_backend(name: str) -> tuple[str, str]:
    """(backend name, one line saying why) for a configured name, `auto` included."""
    if name != "auto":
        ok, why = backend_class(name).available()
        if not ok:
            raise ConfigError("backend", f"{name} is not usable here: {why}")
        return name, f"backend {name}: {why}"
    ok, why = backend_class("docker").available()
    if ok:
        return "docker", f"backend auto -> docker ({why})"
    ok_p, why_p = backend_class("process").available()
    if not ok_p:
        raise ConfigError("backend", f"neither docker ({why}) nor process ({why_p}) is usable here")
    return "process", f"backend auto -> process (docker: {why})"


def get_backend(name: str, home: Home) -> NodeBackend:
    return backend_class(name)(home)
