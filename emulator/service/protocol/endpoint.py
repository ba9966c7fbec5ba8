"""The request wrapper every route of routes.ROUTES runs in: names and the declared length checked,
then the workspace and the credential, and only then the body read (bounded) and parsed; the
handler in Starlette's thread pool; ServiceError (and a spec's ConfigError) as Azure's error JSON;
one log line per request: method, path, status, never a query (SAS signatures) or a header (tokens).
"""
from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from amlemu.errors import ConfigError, NotFoundError
from amlemu.service.protocol import bodies
from amlemu.service.protocol.calls import SECRET_HEADERS, Call, Context, Reply, arm_error, authorize
from amlemu.service.state import ServiceError, from_config_error, not_found


def endpoint(ctx: Context, fn: Callable[[Call], Reply], auth: bool | str, limit: int,
             slots: bodies.Slots) -> Callable[[Request], Any]:
    """The route's ASGI endpoint: bodies up to `limit`, at most `slots` of them held at once."""
    async def serve(request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        call = Call(ctx, request.method, request.url.path, dict(request.path_params), dict(request.query_params),
                    headers, b"", None)
        # Names, the declared length and the credential first: a refused request's body is never read.
        reply = _refusal(call, limit) or await run_in_threadpool(_admit, call, auth)
        if reply is None:
            try:
                async with slots.hold(headers):
                    reply = await _read_and_handle(request, call, fn, limit)
            except ServiceError as exc:
                reply = Reply(exc.status, exc.body())
        else:
            _seen(call, request)
        ctx.log(f"{call.method} {call.path} {reply.status}")
        return _response(reply, call.method)
    return serve


async def _read_and_handle(request: Request, call: Call, fn: Callable[[Call], Reply], limit: int) -> Reply:
    try:
        call.raw = await bodies.read(request, limit)
        if call.raw and "json" in call.headers.get("content-type", ""):
            call.body = bodies.parse_json(call.raw)
        else:
            call.body = call.raw or None  # blob content stays bytes even when it is a .json file
    except ServiceError:
        _seen(call, request)
        raise
    _seen(call, request)
    return await run_in_threadpool(_handle, call, fn)


def _seen(call: Call, request: Request) -> None:
    """The Context's on_request hook: every request, refused ones too (their body unread: None)."""
    if call.ctx.on_request is not None:
        call.ctx.on_request(call.method, call.path, call.query, call.body,
                            {k: v for k, v in request.headers.items() if k.lower() not in SECRET_HEADERS})


def _refusal(call: Call, limit: int) -> Reply | None:
    try:
        bodies.check_params(call.params, call.query)
        bodies.check_length(call.headers, limit)
    except ServiceError as exc:
        return Reply(exc.status, exc.body())
    return None


def _admit(call: Call, auth: bool | str) -> Reply | None:
    """The workspace the path names and the caller's credential (None: go on)."""
    return _guarded(call, lambda: _workspace_or_refusal(call, auth))


def _workspace_or_refusal(call: Call, auth: bool | str) -> Reply | None:
    p = call.params
    if "ws" in p and not call.st.workspace.matches(p["sub"], p["rg"], p["ws"]):
        raise not_found(f"workspace {p['sub']}/{p['rg']}/{p['ws']}")
    return authorize(call, auth)


def _handle(call: Call, fn: Callable[[Call], Reply]) -> Reply:
    reply = _guarded(call, lambda: fn(call))
    assert reply is not None
    return reply


def _guarded(call: Call, step: Callable[[], Reply | None]) -> Reply | None:
    """`step`'s reply; a client's mistake (ServiceError, or a spec's ConfigError raised below a
    route) as Azure's error JSON naming the field; anything else is a bug: a 500, its cause logged."""
    try:
        return step()
    except ServiceError as exc:
        return Reply(exc.status, exc.body())
    except ConfigError as exc:
        return Reply(400, from_config_error(exc).body())
    except NotFoundError as exc:
        return Reply(404, ServiceError(404, "ResourceNotFound", str(exc)).body())
    except Exception:  # noqa: BLE001 - a bug must reach the client as a 500, its cause in the log
        for line in traceback.format_exc().splitlines():
            call.ctx.log(line)
        return arm_error(500, "InternalServerError", "the service failed; see its log (amlemu serve's service.log)")


def _response(reply: Reply, method: str) -> Response:
    headers = dict(reply.headers)
    if isinstance(reply.body, (dict, list)):
        data = json.dumps(reply.body).encode()
        headers.setdefault("Content-Type", "application/json; charset=utf-8")
    else:
        data = reply.body.encode() if isinstance(reply.body, str) else (reply.body or b"")
    if method == "HEAD":  # the length of what a GET would send, and no body
        return Response(b"", reply.status, {**headers, "Content-Length": str(len(data))})
    return Response(data, reply.status, headers)


def single_slashes(app: Starlette) -> Any:
    """azureml-core joins the cloud's resourceManager ("https://host/", as ARM's metadata writes
    it) with "/subscriptions/...": ARM takes `//subscriptions`, so the service does too."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and "//" in scope.get("path", ""):
            scope = {**scope, "path": re.sub("/{2,}", "/", scope["path"])}
            if scope.get("raw_path"):
                scope["raw_path"] = re.sub(b"/{2,}", b"/", scope["raw_path"])
        await app(scope, receive, send)
    return asgi
