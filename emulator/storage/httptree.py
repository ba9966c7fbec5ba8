"""An http(s) URL read as the node cache reads a datastore: fsspec's HTTPFileSystem underneath, with
what the cache needs on top (a file's ETag and size; a folder's files, listed from its HTML index as
web servers' directory listings give it), and every connection, redirect and name lookup refused
when it leads to a link-local address (urlinputs.blocked: the cloud metadata services)."""
from __future__ import annotations

import socket
from typing import Any

from amlemu.storage.urlinputs import BlockedAddress, blocked

SOCK_CONNECT_TIMEOUT = 10  # seconds: a host that does not answer fails the fetch, not the run's clock
SOCK_READ_TIMEOUT = 120


def _refuse(host: str | None, why: str = "") -> None:
    if host and blocked(host):
        raise BlockedAddress(f"{host}{why} is a link-local address (a cloud metadata service): never read")


async def guarded_client(**kwargs: Any) -> Any:
    """HTTPFileSystem's `get_client`: an aiohttp session whose resolver and request hooks refuse a
    link-local address, by name, as a literal, or behind a redirect."""
    import aiohttp  # noqa: PLC0415
    from yarl import URL  # noqa: PLC0415

    class Resolver(aiohttp.ThreadedResolver):
        async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
            found = await super().resolve(host, port, family)
            for entry in found:
                _refuse(entry["host"], f" (what {host} resolves to)")
            return found

    async def on_start(session: Any, context: Any, params: Any) -> None:
        _refuse(params.url.host)

    async def on_redirect(session: Any, context: Any, params: Any) -> None:
        location = params.response.headers.get("Location")
        if location:
            _refuse(params.url.join(URL(location)).host, " (a redirect's target)")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_redirect.append(on_redirect)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=SOCK_CONNECT_TIMEOUT, sock_read=SOCK_READ_TIMEOUT)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=Resolver()), trace_configs=[trace],
                                 timeout=timeout, **kwargs)


def _etag(info: dict[str, Any]) -> str:
    """The server's ETag; else Last-Modified with the size (what a plain web server gives)."""
    return str(info.get("ETag") or f"{info.get('Last-Modified')}|{info.get('size')}")


class HttpTree:
    """The few filesystem calls the node cache and download mode make (isfile, exists, info, find,
    get, get_file). `folder`: the input is a uri_folder, whose URL answers too (with its index), so
    only the input's type tells a folder from a file."""

    def __init__(self, folder: bool) -> None:
        from fsspec.implementations.http import HTTPFileSystem  # noqa: PLC0415

        self.folder = folder
        self.fs = HTTPFileSystem(get_client=guarded_client, skip_instance_cache=True)

    def isfile(self, path: str) -> bool:
        return not self.folder and self.fs.isfile(path)

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def info(self, path: str) -> dict[str, Any]:
        info = dict(self.fs.info(path))
        # a server that sends no Content-Length: size 0 for the cache's accounting; the file is whole
        return {**info, "name": path, "type": "file", "size": int(info.get("size") or 0), "etag": _etag(info)}

    def find(self, base: str, detail: bool = False) -> Any:
        """Every file under the folder URL, from its index pages (a link that leaves the folder, or
        one with a query, as the sort links of an index have, is not a file of it)."""
        prefix = base.rstrip("/") + "/"
        listed = self.fs.find(prefix, detail=True)
        files = {p: self.info(p) for p, entry in listed.items()
                 if entry.get("type") == "file" and p.startswith(prefix) and not any(c in p for c in "?#")}
        return files if detail else sorted(files)

    def get(self, rpaths: list[str], lpaths: list[str]) -> None:
        self.fs.get(rpaths, lpaths)  # two lists: fetched as given, in parallel

    def get_file(self, rpath: str, lpath: str) -> None:
        self.fs.get_file(rpath, lpath)
