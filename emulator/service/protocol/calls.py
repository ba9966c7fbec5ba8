"""What a route handler is given and returns: the request as a `Call` (with the service's
`Context`) and a `Reply`. Shared by the route modules (routes.py, downloads.py)."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amlemu.service.protocol.auth import Auth
from amlemu.service.protocol.blocks import Blocks
from amlemu.service.state import ServiceError, State, bad_request
from amlemu.servicekeys import RUN_CLAIM


@dataclass
class Context:
    """What every request sees: the state, the credentials, the public base URL, where to log."""

    state: State
    auth: Auth
    url: str = ""
    log: Callable[[str], None] = lambda line: None
    # Called with each request (method, path, query, parsed body, headers less the secret ones).
    on_request: Callable[[str, str, dict[str, str], Any, dict[str, str]], None] | None = None
    blocks: Blocks = field(default_factory=Blocks)  # pieces of uploads over 64 MiB, until their list
    # What the health route (service/health.py) checks besides the service's own: name -> a check
    # that raises when its component cannot serve (the MLflow mount adds its own).
    health_checks: dict[str, Callable[[], None]] = field(default_factory=dict)
    link_port: int = 0  # the loopback port runs' links relay jobs' requests to (routes.link_guard)


@dataclass
class Call:
    ctx: Context
    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    raw: bytes
    body: Any

    @property
    def st(self) -> State:
        return self.ctx.state

    @property
    def base(self) -> str:
        """The service's URL as this client reached it: the URLs handed back (discovery, blob and
        log URLs) must work from where it is, e.g. a docker node that reaches the service through
        its run's link (emulator/runs/servicelink.py) at the cluster network's gateway."""
        host = self.headers.get("host", "")
        return f"https://{host}" if HOST_RE.fullmatch(host) else self.ctx.url

    @property
    def props(self) -> dict[str, Any]:
        """A copy of the body's ARM `properties` ({} when there are none); a 400 naming them when
        the body or they are not JSON objects."""
        if self.body is None:
            return {}
        props = self.body.get("properties") if isinstance(self.body, dict) else []
        if props is not None and not isinstance(props, dict):
            raise bad_request("properties", "properties: not a JSON object; send the resource's ARM body")
        return dict(props or {})


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes -> as is
    headers: dict[str, str] = field(default_factory=dict)


HOST_RE = re.compile(r"[A-Za-z0-9.-]{1,253}:\d{1,5}|\[[0-9a-fA-F:]{2,39}\]:\d{1,5}")
SECRET_HEADERS = frozenset({"authorization", "x-identity-header", "secret"})


def arm_error(status: int, code: str, message: str) -> Reply:
    return Reply(status, ServiceError(status, code, message).body())




def run_of(params: dict[str, str]) -> str | None:
    """The run a route acts on: its `name` (run history) or `dcid.<run>` artifact container."""
    if "container" in params:
        return params["container"].removeprefix("dcid.") if params["container"].startswith("dcid.") else None
    return params.get("name")


# Signed routes: the resource their `sig` signs (auth.sign), from the path's parameters.
SIGNED: dict[str, Callable[[dict[str, str]], str]] = {
    "sas": lambda params: params["container"],  # a code upload's container (routes.code_pending_upload)
    "upload": lambda params: f"upload/{params['name']}",  # a v1 run's artifact uploads (v1online)
}


def authorize(call: Call, scope: bool | str) -> Reply | None:
    """None when the caller may use a route of this scope, else ARM's 401/403 reply. True: a
    workspace token; "run": also the route's own run's token (AZUREML_RUN_TOKEN), while that run
    is active. A run token opens nothing else: not another run, not the workspace's routes.
    "sas"/"upload": the URL's signature (SIGNED), as Azure Storage answers a wrong one."""
    if scope is False:
        return None
    if scope in SIGNED:  # a URL the service signed (a SAS): checked before its body is read
        resource = SIGNED[scope](call.params)
        if call.ctx.auth.check_signature(resource, call.query.get("sig")):
            return None
        return Reply(403, b"AuthenticationFailed", {"x-ms-error-code": "AuthenticationFailed"})
    claims = call.ctx.auth.claims(call.headers.get("authorization"))
    if claims is None:
        return Reply(401, ServiceError(401, "InvalidAuthenticationToken", "no bearer token issued by this service, "
                                       "or it has expired").body(), {"WWW-Authenticate": 'Bearer error="invalid_token"'})
    run = claims.get(RUN_CLAIM)
    if run is None:
        return None
    if scope != "run" or run_of(call.params) != run:
        return arm_error(403, "AuthorizationFailed", f"the token of run {run} does not have authorization to "
                         f"perform {call.method} on {call.path}: a run's token opens its own run only")
    if not call.st.run_active(run):
        return Reply(401, ServiceError(401, "ExpiredAuthenticationToken", f"the token of run {run} expired with "
                                       "the run").body(), {"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return None
