"""What a route handler is given and returns: the request as a `Call` (with the service's
`Context`) and a `Reply`. Shared by the route modules (routes.py, downloads.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amlemu.service.auth import Auth
from amlemu.service.blocks import Blocks
from amlemu.service.state import ServiceError, State


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
        return self.ctx.url

    @property
    def props(self) -> dict[str, Any]:
        """A copy of the body's ARM `properties` ({} when there are none)."""
        props = self.body.get("properties") if isinstance(self.body, dict) else None
        return dict(props) if isinstance(props, dict) else {}


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes -> as is
    headers: dict[str, str] = field(default_factory=dict)


SECRET_HEADERS = frozenset({"authorization", "x-identity-header", "secret"})


def arm_error(status: int, code: str, message: str) -> Reply:
    return Reply(status, ServiceError(status, code, message).body())


