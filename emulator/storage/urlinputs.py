"""Typed inputs whose `path` is a URL (https, http, wasbs/wasb, abfss/abfs), read as Azure ML reads them.

Where the fetch happens: on this machine, by the run's supervisor, into each node's blob cache, as a
datastore input is (runs/mounts.py): ro_mount and download take the same path, a URL is cached and
revalidated like a blob, and a node never needs a network of its own (process nodes have none).
The submit only looks (DNS, a connect, a HEAD): nothing large is fetched while the CLI waits, and an
unreachable URL is refused before a run or a node exists. A URL that goes away after the submit
fails the run with the same one line.

A job is untrusted code, and so is what its YAML points at: only the URLs its inputs declare are
read, never a link-local address (169.254.0.0/16, fe80::/10, fd00:ec2::254: the cloud metadata
services, which hand out this machine's credentials), checked at submit and again on every
connection and redirect of a fetch. Access is anonymous: a URL with a query (a SAS token) or a
user name is refused, with the way to stage the data instead.
"""
from __future__ import annotations

import hashlib
import ipaddress
import os
import posixpath
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from amlemu.errors import AmlEmuError, ConfigError
from amlemu.specs import URL_SCHEMES as SCHEMES
from amlemu.specs import DataInput, DataMode, is_url

BLOB_SCHEMES = ("wasbs", "wasb", "abfss", "abfs")
SOURCE_PREFIX = "_url-"  # a binding's cache key; datastore names start with a letter, never "_"
OFFLINE = "AMLEMU_OFFLINE"  # envs/build.py's switch: nothing is fetched from the network
STAGE_ROOT = "azureml://datastores/workspaceblobstore/paths/url-inputs"
CONNECT_TIMEOUT = 5.0
METADATA_V6 = ipaddress.ip_address("fd00:ec2::254")  # AWS's IPv6 instance metadata service


class BlockedAddress(OSError):
    """A connection to a link-local (cloud metadata) address, refused."""


@dataclass(frozen=True)
class ParsedUrl:
    url: str  # as written
    scheme: str
    host: str
    port: int
    path: str  # the URL's path, no leading slash (blob: within the container)
    container: str = ""  # blob: the container (wasbs) or file system (abfss)
    account: str = ""  # blob: the storage account (the host's first label)

    @property
    def blob_host(self) -> str:
        """An ADLS Gen2 (dfs) account is read through its blob endpoint, as adlfs reads it."""
        return self.host.replace(".dfs.", ".blob.", 1)


def is_url_source(name: str) -> bool:
    return name.startswith(SOURCE_PREFIX)


def offline(environ: Any = None) -> bool:
    """AMLEMU_OFFLINE set true (read as envs/pipsources.truthy reads it)."""
    value = (os.environ if environ is None else environ).get(OFFLINE, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def blocked(address: str) -> bool:
    """A link-local address (the cloud metadata services live there), also as IPv4-mapped IPv6."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_link_local or ip == METADATA_V6 or bool(mapped and mapped.is_link_local)


def parse_url(url: str, field: str) -> ParsedUrl:
    """Check a URL input's form (pure): scheme, host, no query, no user name, no link-local address."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        host, port = parts.hostname or "", parts.port
    except ValueError:
        raise ConfigError(field, f"{url}: the port is not a number") from None
    if scheme not in SCHEMES or not host:
        raise ConfigError(field, f"{url} is not a URL with a host", f"write {'|'.join(SCHEMES)}://<host>/<path>")
    if parts.query or parts.fragment:
        raise ConfigError(field, f"{url}: a URL with a query or a fragment (a SAS token) is not read here",
                          f"inputs by URL are read anonymously; {stage_hint(field, url)}")
    if blocked(host):
        raise ConfigError(field, f"{url}: {host} is a link-local address (a cloud metadata service); it is "
                          "never read", "point the input at the data itself")
    path = parts.path.lstrip("/")
    if scheme in BLOB_SCHEMES:
        container, at, _ = parts.netloc.rpartition("@")
        if not at or not container or ":" in container:
            raise ConfigError(field, f"{url} names no container", f"write {scheme}://<container>@<account>."
                              f"{'dfs' if scheme.startswith('abfs') else 'blob'}.core.windows.net/<path>")
        return ParsedUrl(url, scheme, host, port or 443, path, container, host.split(".", 1)[0])
    if parts.username or parts.password:
        raise ConfigError(field, f"{url}: a user name in the URL is not read here", stage_hint(field, url))
    return ParsedUrl(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def leaf(url: str) -> str:
    return posixpath.basename(urlsplit(url).path.rstrip("/"))


def location(url: str, kind: str) -> tuple[str, str]:
    """(cache key, path under the key's root) of a URL input: a file is its name under its folder's
    URL, a folder its URL itself. One key per URL: what two inputs read never mixes."""
    key = SOURCE_PREFIX + hashlib.sha256(url.strip().encode()).hexdigest()[:16]
    return key, (leaf(url) if kind == "uri_file" else "")


def stage_hint(field: str, url: str, kind: str = "uri_file") -> str:
    """How to put the data where the emulator reads it: a datastore, then its URI in the YAML."""
    name = field.split(".")[1] if field.count(".") >= 1 else "data"
    folder = f"{STAGE_ROOT}/{name}/"
    if kind == "uri_file":
        return (f"stage it: download it, `amlemu data upload {leaf(url) or '<file>'} {folder}` and set {field} to "
                f"{folder}{leaf(url) or '<file>'}")
    return f"stage it: download the folder, `amlemu data upload <folder> {folder}` and set {field} to {folder}"


def unreachable(field: str, url: str, why: str, kind: str) -> ConfigError:
    return ConfigError(field, f"{url} cannot be read here ({why})", stage_hint(field, url, kind))


def reason(exc: BaseException) -> str:
    """An exception as a few words (HTTP status, the OS's message), never a traceback; fsspec
    reports a failed request as FileNotFoundError, with the request's error as its cause."""
    chain, cause = [], exc
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    exc = next((e for e in chain if isinstance(e, BlockedAddress)), None) or \
        next((e for e in chain if isinstance(getattr(e, "status", None), int)), exc)
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    if isinstance(status, int):
        return f"HTTP {status}"
    if isinstance(exc, FileNotFoundError) and not getattr(exc, "strerror", None):
        return "not found"
    lines = str(exc).strip().splitlines()
    return str(getattr(exc, "strerror", None) or (lines[0] if lines else type(exc).__name__))[:200]


# --- reading ---------------------------------------------------------------------------------------
def check_reachable(parsed: ParsedUrl, kind: str, field: str) -> None:
    """At submit: refuse offline, a name that resolves to a link-local address, a host that does not
    answer, or a URL the server does not serve; each as one line with the way to stage the data."""
    if offline():
        raise unreachable(field, parsed.url, f"{OFFLINE} is set: nothing is fetched", kind)
    host = parsed.blob_host if parsed.scheme in BLOB_SCHEMES else parsed.host
    try:
        found = socket.getaddrinfo(host, parsed.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise unreachable(field, parsed.url, f"{host} does not resolve: {reason(exc)}", kind) from None
    bad = [str(info[4][0]) for info in found if blocked(str(info[4][0]))]
    if bad:
        raise ConfigError(field, f"{parsed.url}: {host} resolves to {bad[0]}, a link-local address (a cloud "
                          "metadata service); it is never read", "point the input at the data itself")
    try:
        socket.create_connection((host, parsed.port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise unreachable(field, parsed.url, f"{host}:{parsed.port}: {reason(exc)}", kind) from None
    try:
        fs, root = open_url(parsed.url, kind)
        target = posixpath.join(root, location(parsed.url, kind)[1]) if kind == "uri_file" else root
        present = fs.isfile(target) if kind == "uri_file" else fs.exists(target)
    except Exception as exc:  # noqa: BLE001 - HTTP and storage errors are many; each is one line
        raise unreachable(field, parsed.url, reason(exc), kind) from None
    if not present:
        raise unreachable(field, parsed.url, "nothing there" if kind == "uri_file" else "no such folder", kind)


def open_url(url: str, kind: str) -> tuple[Any, str]:
    """(filesystem, root) to read a URL input with: the root is the input's folder (uri_folder) or
    the folder its file is in (uri_file), as `location` says."""
    if offline():
        raise AmlEmuError(f"{OFFLINE} is set: nothing is fetched")
    parsed = parse_url(url, "path")
    if parsed.scheme in BLOB_SCHEMES:
        import adlfs  # noqa: PLC0415

        from amlemu.storage.filesystems import bound_retries  # noqa: PLC0415

        fs = bound_retries(adlfs.AzureBlobFileSystem(account_name=parsed.account, account_host=parsed.blob_host,
                                                     anon=True, skip_instance_cache=True))
        full = posixpath.join(parsed.container, parsed.path).rstrip("/")
        return fs, posixpath.dirname(full) if kind == "uri_file" else full
    from amlemu.storage.httptree import HttpTree  # noqa: PLC0415

    full = url.strip().rstrip("/")
    return HttpTree(kind == "uri_folder"), full.rsplit("/", 1)[0] if kind == "uri_file" else full


def check_inputs(inputs: dict[str, Any], probe: bool) -> None:
    """The job's URL inputs (DataInput with a URL path; mode direct passes it to the job, unread):
    their form always; offline and reachability when `probe` (a submit)."""
    for name, value in inputs.items():
        if isinstance(value, DataInput) and is_url(value.path) and value.mode is not DataMode.DIRECT:
            field = f"inputs.{name}.path"
            parsed = parse_url(value.path, field)
            if offline():
                raise unreachable(field, value.path, f"{OFFLINE} is set: nothing is fetched", value.type)
            if probe:
                check_reachable(parsed, value.type, field)
