"""The service's door for jobs: requests that arrive on its link port come from a job.

Each run's link (emulator/runs/servicelink.py) relays its nodes' connections to the service's link
port (amlemu.servicefile's `link_port`, loopback only), never to the port users and their SDKs
call. So the service knows a job's request by the socket it arrived on, whatever the request
says, and refuses it what JOB_REFUSED names: the studio (every run's files and logs, for the
user's browser) and the identity routes (the user's tokens). Every other route asks the job's
requests for a token as it asks anyone's, and a run's token opens its own run only (calls.authorize).
"""
from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from amlemu.service.protocol.calls import Context
from amlemu.service.state import ServiceError

JOB_REFUSED = ("/studio", "/msi")  # and everything under them


def from_job(scope: dict[str, Any], link_port: int) -> bool:
    """Whether the request arrived on the link port."""
    server = scope.get("server") or (None, None)
    return bool(link_port) and server[1] == link_port


def link_guard(app: Any, ctx: Context) -> Any:
    """ASGI middleware: a job's request for a path JOB_REFUSED names gets ARM's 403."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope.get("type") == "http" and from_job(scope, ctx.link_port) \
                and any(path == p or path.startswith(p + "/") for p in JOB_REFUSED):
            body = ServiceError(403, "AuthorizationFailed", f"{path} is not open to jobs: a run's link reaches "
                                "its own run's routes only").body()
            ctx.log(f"{scope.get('method')} {path} 403 (from a job)")
            await Response(json.dumps(body).encode(), 403, media_type="application/json")(scope, receive, send)
            return
        await app(scope, receive, send)
    return asgi
