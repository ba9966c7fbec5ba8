"""The studio's door: a browser's session from a one-time login link, and the Host names it answers.

The studio shows every run's commands, logs and files, and a job is untrusted code that can reach
this machine's loopback, so no studio route answers without a credential a job cannot get. As
Jupyter does it:
- a login link (`.../studio/?login=<token>`), printed by `amlemu serve`, `amlemu ui` and
  `amlemu ui --link`: the token is `<expiry>.<nonce>.<mac>`, an HMAC under the home's key (its
  owner-only secrets file, which no job sees), good for LINK_SECONDS and once: the nonces used
  are kept in memory (a restart forgets them; the expiry still holds);
- it gives the browser a session cookie (HttpOnly, SameSite=Lax, Path=/studio, Secure over https)
  holding `<expiry>.<mac>`: stateless, so it outlives a restart of the service. Lax, not Strict:
  azureml-core's "Web View" link is followed from another site (a notebook's page), and the
  studio has only GET routes that change nothing, so a cross-site navigation can do no harm.
The Host check stops DNS rebinding: a page whose name resolves to 127.0.0.1 reaches the port, but
its requests carry its own name as Host, and only this machine's names are answered.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from amlemu import servicefile, servicekeys

LINK_SECONDS = 12 * 3600  # a link printed when `amlemu serve` starts is still good later that day
SESSION_SECONDS = 7 * 24 * 3600
LOGIN_PARAM = "login"
HOST_HEADER = re.compile(r"(?:\[([0-9a-f:.]+)\]|([^\[\]:/@\s]+))(?::\d{1,5})?")  # name or [address], a port
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
HOW = "open the login link `amlemu serve` or `amlemu ui` printed, or get a new one with `amlemu ui --link`"


def home_key(home_root: Path) -> bytes:
    """The home's signing key (made on first use, owner-only): only its owner can read it."""
    return servicekeys.load_or_create(servicefile.service_dir(home_root) / "secrets.json")[1]


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    """Constant-time, and False (not a TypeError) for a value with non-ASCII characters."""
    return hmac.compare_digest(given.encode(), expected.encode())


def _expiry(text: str) -> int | None:
    """A Unix time written in ASCII digits, or None (no huge number is parsed)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) < 12 else None


def mint_login(key: bytes, seconds: int = LINK_SECONDS) -> str:
    """A one-time login token, good for `seconds`."""
    body = f"{int(time.time()) + seconds}.{secrets.token_urlsafe(12)}"
    return f"{body}.{_mac(key, 'studio-login:' + body)}"


def login_url(key: bytes, base_url: str, path: str = "/studio/") -> str:
    """`base_url` + `path` with a fresh login token: what a user opens once in a browser."""
    return f"{base_url.rstrip('/')}{path}?{urlencode({LOGIN_PARAM: mint_login(key)})}"


def host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:5000" is "::1"); "" when it is malformed."""
    found = HOST_HEADER.fullmatch(header.strip().lower())
    return (found.group(1) or found.group(2)) if found else ""


class Sessions:
    """Login tokens redeemed once, and the session values they give."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._used: dict[str, int] = {}  # nonce -> its token's expiry (forgotten after it)
        self._lock = threading.Lock()

    def cookie(self, secure: bool) -> str:
        """The cookie's name: the home's own (two homes' studios on one host keep theirs apart; a
        cookie ignores the port), and another over https (a Secure cookie is not http's to replace)."""
        return f"amlemu-studio-{_mac(self.key, 'cookie')[:12]}{'-tls' if secure else ''}"

    def redeem(self, token: str) -> bool:
        """True, once, for a token this home minted that has not expired."""
        parts = token.split(".")
        expiry = _expiry(parts[0]) if len(token) <= 200 and len(parts) == 3 else None
        if expiry is None:
            return False
        if not _same(parts[2], _mac(self.key, f"studio-login:{parts[0]}.{parts[1]}")):
            return False
        now = time.time()
        with self._lock:
            self._used = {nonce: until for nonce, until in self._used.items() if until > now}
            if expiry <= now or parts[1] in self._used:
                return False
            self._used[parts[1]] = expiry
        return True

    def new_session(self) -> str:
        expiry = str(int(time.time()) + SESSION_SECONDS)
        return f"{expiry}.{_mac(self.key, 'studio-session:' + expiry)}"

    def valid(self, value: str | None) -> bool:
        text, _, mac = (value or "").partition(".")
        expiry = _expiry(text)
        return expiry is not None and expiry > time.time() and _same(mac, _mac(self.key, "studio-session:" + text))


def _refusal(request: Request, status: int, message: str) -> Response:
    if "/api/" in request.url.path:
        code = "Unauthorized" if status == 401 else "BadRequest"
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
    return PlainTextResponse(message + "\n", status_code=status)


class StudioGate:
    """Pure ASGI middleware in front of the studio: the Host must name this machine, then a login
    link's token becomes a session cookie (and a redirect to the same URL without the token);
    anything else without a valid session is a 401 saying how to get a link."""

    def __init__(self, app: ASGIApp, key: bytes, hosts: frozenset[str] = LOOPBACK_NAMES) -> None:
        self.app = app
        self.sessions = Sessions(key)
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        answer = self._check(request)
        await (answer or self.app)(scope, receive, send)

    def _check(self, request: Request) -> Response | None:
        if host_name(request.headers.get("host", "")) not in self.hosts:
            return _refusal(request, 400, "the studio answers only to this machine's own names in the Host header "
                                          "(127.0.0.1, localhost, [::1], ...): open it by one of them")
        secure = request.url.scheme == "https"
        name = self.sessions.cookie(secure)
        has_session = self.sessions.valid(request.cookies.get(name))
        token = request.query_params.get(LOGIN_PARAM)
        if token is None:
            return None if has_session else _refusal(request, 401, f"the studio needs a login: {HOW}")
        if not has_session and not self.sessions.redeem(token):
            return _refusal(request, 401, f"this login link was used already, has expired or is not this home's: {HOW}")
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != LOGIN_PARAM])
        reply = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
        if not has_session:
            reply.set_cookie(name, self.sessions.new_session(), max_age=SESSION_SECONDS, path="/studio",
                             secure=secure, httponly=True, samesite="lax")
        return reply
