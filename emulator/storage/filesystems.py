"""A datastore's fsspec filesystem, opened: a local folder, Azurite or Azure Blob through adlfs,
with an endpoint that does not answer refused at once and the storage SDK's retries bounded."""
from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from amlemu.errors import BackendError, ConfigError

if TYPE_CHECKING:
    from amlemu.storage.datastores import DatastoreSpec

PROBE_TIMEOUT = 5.0  # seconds for a blob endpoint to accept a connection: an unreachable one fails at once
def open_filesystem(spec: DatastoreSpec, secret: str | None = None, create: bool = True) -> tuple[Any, str]:
    """(fsspec filesystem, root) of a local or Azure Blob datastore, given its secret; the blob
    container is made when missing, unless not `create` (a dry run's look)."""
    if spec.kind == "local":
        import fsspec  # noqa: PLC0415

        return fsspec.filesystem("file"), spec.folder.rstrip("/")
    if spec.kind != "azure_blob":
        raise ConfigError("type", f"{spec.kind} datastores are opened by their registry")
    _probe(spec)
    import adlfs  # noqa: PLC0415

    if spec.endpoint and spec.credential in ("account_key", "sas"):
        key = {"account_key": "AccountKey", "sas": "SharedAccessSignature"}[spec.credential]
        fs = adlfs.AzureBlobFileSystem(connection_string=f"AccountName={spec.account};BlobEndpoint="
                                       f"{spec.endpoint};{key}={secret}", skip_instance_cache=True)
    elif spec.endpoint:
        fs = adlfs.AzureBlobFileSystem(account_name=spec.account, account_host=spec.endpoint.removeprefix("https://"),
                                       anon=spec.credential == "none")
    elif spec.credential == "account_key":
        fs = adlfs.AzureBlobFileSystem(account_name=spec.account, account_key=secret)
    elif spec.credential == "sas":
        fs = adlfs.AzureBlobFileSystem(account_name=spec.account, sas_token=secret)
    else:
        fs = adlfs.AzureBlobFileSystem(account_name=spec.account, anon=spec.credential == "none")
    bound_retries(fs)
    if create and not fs.exists(spec.container):
        fs.mkdir(spec.container)
    return fs, spec.container


def bound_retries(fs: Any) -> Any:
    """The storage SDK retries a failing request with backoff from 15 s (87 s for one call to a
    server that resets every connection): here a failing datastore fails within seconds. adlfs
    gives no option for it, so the client's own retry policy is set (private, hence guarded)."""
    policy = getattr(getattr(getattr(fs, "service_client", None), "_config", None), "retry_policy", None)
    for attr, value in (("total_retries", 2), ("connect_retries", 2), ("read_retries", 2), ("status_retries", 2),
                        ("initial_backoff", 0.5), ("increment_base", 1.5), ("random_jitter_range", 0.5)):
        if hasattr(policy, attr):
            setattr(policy, attr, value)
    return fs


def _probe(spec: DatastoreSpec) -> None:
    """Fail fast, in one line, when the storage endpoint does not answer at all."""
    url = urlsplit(spec.endpoint or f"https://{spec.account}.blob.core.windows.net")
    host, where = url.hostname or "", url.netloc or spec.endpoint
    try:
        port = url.port or (80 if url.scheme == "http" else 443)
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT).close()
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise BackendError(f"datastore {spec.name}: cannot reach {where} ({reason}); check the endpoint and "
                           "account name, and that this machine can reach it") from None
