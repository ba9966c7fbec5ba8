"""The service's own health: whether each part it serves with can serve now, for `amlemu workspace
show` (and a user's curl) rather than only its log.

Why: a service whose working directory was removed answered every MLflow call 500 while every
other route worked; the cause was in service.log alone. Each component is checked as cheaply as
what it serves is used: the working directory, the home's state database, and what the routes'
owners add (Context.health_checks: the MLflow mount adds its store and, once imported, its app).
"""
from __future__ import annotations

import os
from collections.abc import Callable

from amlemu.service.protocol.bodies import printable
from amlemu.service.protocol.calls import Call, Reply

ROUTE = "/amlemu/health"


def _working_directory() -> None:
    os.getcwd()  # FileNotFoundError once the folder the service runs in is removed


def check_all(checks: dict[str, Callable[[], None]]) -> dict[str, str]:
    """Component -> "ok", or what failed (one line)."""
    found: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            found[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - any failure is the component's state, reported as such
            found[name] = printable(f"failed: {type(exc).__name__}: {exc}")[:300]
    return found


def health(call: Call) -> Reply:
    """200 when every component is ok, else 503; the body names each component's state."""
    components = check_all({"workingDirectory": _working_directory,
                            "stateDatabase": lambda: call.st.list_computes(),
                            **call.ctx.health_checks})
    ok = all(state == "ok" for state in components.values())
    return Reply(200 if ok else 503, {"status": "ok" if ok else "degraded", "components": components})
