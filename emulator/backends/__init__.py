"""Node backends, chosen by name from a registry; `auto` tries them by their `auto_priority`.

A backend is one module holding one `NodeBackend` subclass (see base.py for what it provides) and
one line in BACKENDS below; every list of backend names (CLI choices, the pytest plugin's option,
the test suite's parameters, cleanup) is read from here.
"""
from __future__ import annotations

import importlib

from amlemu.backends.base import NodeBackend, NodeInfo, NodeRequest, PlannedNode
from amlemu.errors import ConfigError
from amlemu.home import Home

__all__ = ["BACKENDS", "NodeBackend", "NodeInfo", "NodeRequest", "PlannedNode", "auto_order", "backend_class", "get_backend",
           "resolve_backend"]

# name -> "module:class", imported lazily (the docker SDK is needed only by the docker backend).
BACKENDS = {
    "docker": "amlemu.backends.docker:DockerBackend",
    "process": "amlemu.backends.process:ProcessBackend",
}


def backend_class(name: str) -> type[NodeBackend]:
    try:
        module, _, attr = BACKENDS[name].partition(":")
    except KeyError:
        raise ConfigError("backend", f"unknown backend '{name}'",
                          f"use one of: auto, {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), attr)


def auto_order() -> list[type[NodeBackend]]:
    """The backends `auto` may pick, in the order it tries them."""
    ranked = [backend_class(name) for name in BACKENDS]
    return sorted((c for c in ranked if c.auto_priority is not None), key=lambda c: c.auto_priority or 0)


def resolve_backend(name: str) -> tuple[str, str]:
    """(backend name, one line saying why) for a configured name, `auto` included."""
    if name != "auto":
        ok, why = backend_class(name).available()
        if not ok:
            raise ConfigError("backend", f"{name} is not usable here: {why}")
        return name, f"backend {name}: {why}"
    passed: list[str] = []  # "docker: why not", for the ones tried before the chosen one
    for cls in auto_order():
        ok, why = cls.available()
        if ok:
            return cls.name, f"backend auto -> {cls.name} ({'; '.join(passed) or why})"
        passed.append(f"{cls.name}: {why}")
    raise ConfigError("backend", f"no backend is usable here ({'; '.join(passed)})")


def get_backend(name: str, home: Home) -> NodeBackend:
    return backend_class(name)(home)
