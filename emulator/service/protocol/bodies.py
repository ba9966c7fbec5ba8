"""What a request may carry before a route sees it: names without control characters and of a
bounded length, a body of a bounded size (refused from its Content-Length before a byte is read,
or as soon as a chunked body passes the limit), JSON that is JSON (no NaN, no 1e400, no nesting
deeper than any Azure ML body). Each refusal is a ServiceError naming the field (Azure's error JSON).

Why here and not in each route: a job is untrusted code and reaches the service through its run's
link; one route that read a 300 MB body whole, or handed a NUL to Azurite (whose client then
retried for 80 s), was enough to hold the service's memory or its workers.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request

from amlemu.service.state import ServiceError, bad_request

MiB = 1024**2
JSON_LIMIT = 4 * MiB  # an ARM or run-history body: a job's definition is a few KiB
MLFLOW_LIMIT = 16 * MiB  # MLflow's log-batch is at most 1,000 metrics, 100 params and 100 tags
# azure-storage-blob sends a file up to 64 MiB as one Put Blob and larger ones as 4 MiB blocks;
# azureml-core's startrun carries the project's zip (its snapshot limit is 300 MB, but the SDK
# refuses over it before sending, and the service refuses over this).
UPLOAD_LIMIT = 320 * MiB
# How many bodies of each kind the service holds at once (while read and while their route runs):
# with the limits above, at most 32 x 4 MiB + 4 x 320 MiB + 8 x 16 MiB (1.5 GiB) of bodies, whatever
# the clients send. A request that finds no slot within SLOT_WAIT seconds gets Azure's 503 ServerBusy
# (the SDKs retry it).
JSON_SLOTS, UPLOAD_SLOTS, MLFLOW_SLOTS = 32, 4, 8
SLOT_WAIT = 30.0
MAX_DEPTH = 64  # nesting of a JSON body: Azure ML's deepest (a pipeline's) is under 20
NAME_LIMIT, PATH_LIMIT = 260, 1024  # ARM's longest resource name; Azure Blob's longest blob name
PATH_PARAMS = frozenset({"blob", "path"})
MAX_SEGMENTS = 254  # of a blob name, as Azure Blob allows
# C0 and C1 controls and DEL: never in an Azure name, and a NUL held a worker for 80 s at Azurite.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# What a terminal or an editor acts on besides: bidi overrides and isolates, zero-width marks.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: str) -> str:
    """`text` with control characters, terminal escapes and bidi overrides written as escapes: a
    log line with a client's path in it must not rewrite the terminal that shows the log."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def check_params(params: dict[str, str], query: dict[str, str]) -> None:
    """Refuse a path parameter or query value with a control character, and an over-long name;
    a blob or file path with `.` or `..` segments (`..%2f..` arrives here decoded)."""
    for key, value in params.items():
        what = f"{key}: {printable(value[:40])}{'...' if len(value) > 40 else ''}"
        if _CONTROL.search(value):
            raise bad_request(key, f"{what} has a control character (a NUL, a newline...); Azure names have none")
        limit = PATH_LIMIT if key in PATH_PARAMS else NAME_LIMIT
        if len(value) > limit:
            raise bad_request(key, f"{what} is {len(value)} characters; at most {limit} are allowed")
        if key in PATH_PARAMS and any(part in (".", "..") for part in value.split("/")):
            raise bad_request(key, f"{what} has a '.' or '..' segment; name the blob by its own path")
        if key in PATH_PARAMS and value.count("/") >= MAX_SEGMENTS:
            raise bad_request(key, f"{what} has over {MAX_SEGMENTS} path segments, Azure Blob's most")
    for key, value in query.items():
        if _CONTROL.search(value) or _CONTROL.search(key):
            raise bad_request(printable(key), f"query parameter {printable(key)} has a control character")


class Slots:
    """A bounded number of bodies held at once (see JSON_SLOTS)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free: asyncio.Semaphore | None = None  # made in the server's event loop, on first use

    @asynccontextmanager
    async def hold(self, headers: dict[str, str]) -> AsyncIterator[None]:
        """A slot while the request's body is read and handled; none for a request without one."""
        if headers.get("content-length", "0").strip() in ("", "0") and "transfer-encoding" not in headers:
            yield
            return
        self._free = self._free or asyncio.Semaphore(self.count)
        try:
            await asyncio.wait_for(self._free.acquire(), SLOT_WAIT)
        except TimeoutError:
            raise ServiceError(503, "ServerBusy", f"body: {self.count} requests of this kind are being received; "
                               "send it again", "body") from None
        try:
            yield
        finally:
            self._free.release()


def too_large(limit: int) -> ServiceError:
    return ServiceError(413, "RequestBodyTooLarge", f"body: the request body is over this route's limit of "
                        f"{limit // MiB} MiB; send large data with `amlemu data upload`", "body")


def check_length(headers: dict[str, str], limit: int) -> None:
    """The declared Content-Length against the limit, before anything is read."""
    declared = headers.get("content-length")
    if declared is None:
        return
    if not declared.strip().isdigit():
        raise bad_request("Content-Length", f"Content-Length: {printable(declared[:20])} is not a number of bytes")
    if int(declared) > limit:
        raise too_large(limit)


async def read(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit`: a chunked body is read only that far."""
    check_length({k.lower(): v for k, v in request.headers.items()}, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _constant(name: str) -> Any:
    raise bad_request("body", f"body: {name} is not a JSON number; send a finite number or null")


def parse_json(raw: bytes) -> Any:
    """A JSON body, or a 400 naming what is wrong (where in the body, when it is a value)."""
    try:
        value = json.loads(raw, parse_constant=_constant)
    except ServiceError:
        raise
    except RecursionError:
        raise bad_request("body", f"body: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise bad_request("body", f"body: not valid JSON ({printable(str(exc))[:200]})") from None
    _check_values(value)
    return value


def _check_values(value: Any) -> None:
    """No nesting past MAX_DEPTH and no infinite number (1e400 parses as inf) anywhere: walked
    with a list, not recursion, so the walk itself has a bounded stack."""
    todo: list[tuple[Any, str, int]] = [(value, "", 0)]
    while todo:
        item, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise bad_request(where or "body", f"body: JSON nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, float) and not math.isfinite(item):
            raise bad_request(where or "body", f"{where or 'body'}: a number out of range; send a finite number")
        if isinstance(item, dict):
            todo += [(v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in item.items()]
        elif isinstance(item, list):
            todo += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item)]
