"""Datastores: named blob containers (or folders) of the workspace, reached through fsspec.

Kinds: `local` (a folder; no server), `azurite` (the local Azure Storage emulator, started on
demand) and `azure_blob` (real Azure Blob through adlfs: account key, SAS token or
DefaultAzureCredential). `workspaceblobstore`, the default, is made on first use: on Azurite
when it is installed, else a local folder. Secrets live in the home, owner-only, apart from the
specs; nothing here prints them, and errors are redacted before they are raised.
"""
from __future__ import annotations

import os
import posixpath
import re
import shutil
import socket
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from emulator.errors import AmlEmuError, BackendError, ConfigError, NotFoundError, StateError
from emulator.names import check_datastore_name
from emulator.storage.azurite import Azurite

# adlfs warns on stderr when it cannot read a container's properties (a refused credential):
# the error that follows says it in one line.
warnings.filterwarnings("ignore", category=UserWarning, module=r"adlfs\.")

DEFAULT = "workspaceblobstore"
KINDS = ("local", "azurite", "azure_blob")
CREDENTIALS = ("none", "account_key", "sas", "identity")
URI_RE = re.compile(r"^azureml://datastores/(?P<name>[^/]+)/paths/(?P<path>.*)$")
CONTAINER_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
# A storage endpoint that does not answer a TCP connect within this many seconds is reported at
# once; the storage SDK would retry for minutes (up to 247 s seen) before failing.
PROBE_TIMEOUT = 5.0


@dataclass(frozen=True)
class DatastoreSpec:
    name: str
    kind: str
    container: str = ""
    account: str = ""
    folder: str = ""
    credential: str = "none"
    endpoint: str = ""  # a blob endpoint URL other than the public cloud's (sovereign cloud, Azurite)

    def __post_init__(self) -> None:
        check_datastore_name(self.name)
        if self.kind not in KINDS:
            raise ConfigError("type", f"'{self.kind}' is not a datastore type", f"use one of: {', '.join(KINDS)}")
        if self.credential not in CREDENTIALS:
            raise ConfigError("credential", f"'{self.credential}' is not supported",
                              f"use one of: {', '.join(CREDENTIALS)}")
        if self.kind == "local" and not self.folder:
            raise ConfigError("path", "a local datastore needs a folder", "give --path <folder>")
        if self.kind != "local" and not CONTAINER_RE.match(self.container):
            raise ConfigError("container_name", f"'{self.container}' is not a valid blob container name",
                              "use 3-63 lowercase letters, digits and single hyphens")
        if self.kind == "azure_blob" and not self.account:
            raise ConfigError("account_name", "missing", "give the storage account's name")
        if self.endpoint and not re.match(r"^https?://[^/\s]+", self.endpoint):
            raise ConfigError("endpoint", f"'{self.endpoint}' is not a URL", "write e.g. https://acct.blob.core.chinacloudapi.cn")
        if self.endpoint.startswith("http://") and self.credential not in ("account_key", "sas"):
            raise ConfigError("endpoint", "plain http works with an account key or SAS token only", "use https")


def clean_path(path: str) -> str:
    """A datastore-relative path: POSIX, no leading slash; `..` is refused, never resolved."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ConfigError("path", f"'{path}' contains '..'", "datastore paths cannot leave the datastore")
    return "/".join(parts)


def parse_uri(uri: str) -> tuple[str, str]:
    """azureml://datastores/<name>/paths/<path> -> (name, path)."""
    match = URI_RE.match(uri.strip())
    if not match:
        raise ConfigError("path", f"'{uri}' is not a datastore URI",
                          "write azureml://datastores/<datastore>/paths/<path>")
    return match.group("name"), clean_path(match.group("path"))


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    # SAS query strings and account keys in connection strings, whatever their source.
    text = re.sub(r"(sig|se|sp|sv|st|spr|srt|ss)=[^&\s\"']+", r"\1=***", text)
    return re.sub(r"(AccountKey|SharedAccessSignature)=[^;\s\"']+", r"\1=***", text)


class Datastores:
    """The workspace's datastore registry (in the home's SQLite store) and their filesystems."""

    def __init__(self, store, home_root: Path, cache: Path) -> None:  # type: ignore[no-untyped-def]
        self.store, self.home_root, self.cache = store, home_root, cache
        self.azurite = Azurite(home_root, cache)
        self._secrets_dir = home_root / "secrets"

    # --- registry ----------------------------------------------------------------------------
    def list(self) -> list[DatastoreSpec]:
        self.get(DEFAULT)
        return [DatastoreSpec(**spec) for spec in self.store.datastores()]

    def spec(self, name: str) -> DatastoreSpec:
        """The datastore's spec, without making anything (the default one is made on first use)."""
        spec = self.store.datastore(name)
        if spec:
            return DatastoreSpec(**spec)
        if name == DEFAULT:
            return self._default_spec()
        known = sorted({DEFAULT, *(s["name"] for s in self.store.datastores())})
        raise NotFoundError("datastore", name, f"known: {', '.join(known)}; create it with `amlemu datastore create`")

    def get(self, name: str) -> DatastoreSpec:
        """The datastore's spec; the default one is made (its row, its folder) on first use."""
        spec = self.spec(name)
        return spec if self.store.datastore(name) else self.create(spec)

    def _default_spec(self) -> DatastoreSpec:
        from emulator.storage.azurite import find_binary  # noqa: PLC0415

        if find_binary(self.cache):
            return DatastoreSpec(DEFAULT, "azurite", container="azureml-blobstore")
        return DatastoreSpec(DEFAULT, "local", folder=str(self.home_root / "datastores" / DEFAULT))

    def create(self, spec: DatastoreSpec, secret: str | None = None) -> DatastoreSpec:
        """Check everything, make the folder and the secret, and record the datastore last: a
        refused datastore leaves no row, secret or folder behind."""
        if spec.credential in ("account_key", "sas") and not secret:
            raise ConfigError("credential", f"{spec.credential} needs a secret",
                              "pass it through the environment variable the CLI names")
        if self.store.datastore(spec.name):
            raise StateError(f"datastore '{spec.name}' already exists; pick another name")
        made: list[Path] = []
        try:
            if spec.kind == "local":
                made = _make_folder(Path(spec.folder))
            if secret:
                if not self._secrets_dir.exists():
                    self._secrets_dir.mkdir(mode=0o700)
                    made.append(self._secrets_dir)
                path = self._secrets_dir / spec.name
                made.append(path)
                path.touch(mode=0o600)
                path.write_text(secret)
            self.store.add_datastore(spec.name, asdict(spec))
        except BaseException:
            for path in reversed(made):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            raise
        return spec

    def _secret(self, name: str) -> str:
        path = self._secrets_dir / name
        return path.read_text() if path.exists() else ""

    # --- filesystems -------------------------------------------------------------------------
    def filesystem(self, name: str) -> tuple[Any, str]:
        """(fsspec filesystem, root within it) of a datastore; Azurite is started when needed.
        A storage error (unreachable, refused credential) is one redacted line naming the datastore."""
        spec = self.get(name)
        try:
            return self._filesystem(spec)
        except AmlEmuError:
            raise
        except Exception as exc:  # noqa: BLE001 - the storage SDKs' errors are many; each is redacted
            raise self.guard(name)(exc) from None

    def _filesystem(self, spec: DatastoreSpec) -> tuple[Any, str]:
        name = spec.name
        if spec.kind == "azurite":
            import adlfs  # noqa: PLC0415

            fs = adlfs.AzureBlobFileSystem(connection_string=self.azurite.ensure().connection_string,
                                           skip_instance_cache=True)
            if not fs.exists(spec.container):
                fs.mkdir(spec.container)
            return fs, spec.container
        return open_filesystem(spec, self._secret(name))

    def guard(self, name: str) -> Callable[[Exception], BackendError]:
        def wrap(exc: Exception) -> BackendError:
            text = f"datastore {name}: {type(exc).__name__}: {exc}".splitlines()[0]
            if not isinstance(exc, OSError):  # the storage service refused: its address or credential
                text += f"; check how it is reached (`amlemu datastore show {name}`) and its secret"
            return BackendError(redact(text, [self._secret(name)]))
        return wrap

    def upload(self, local: Path, uri: str, progress: Callable[[int, int], None] | None = None,
               overwrite: bool = False) -> int:
        """Copy a file or folder up; unless overwrite, files already there with the same size are
        skipped (re-running a data upload is cheap). Returns the bytes covered."""
        name, path = parse_uri(uri)
        if not local.exists():
            raise ConfigError("local path", f"{local} does not exist")
        import fsspec  # noqa: PLC0415

        fs, root = self.filesystem(name)
        source = (fsspec.filesystem("file"), str(local.resolve()))
        try:
            sync_tree(source, (fs, posixpath.join(root, path)), progress, overwrite=overwrite)
        except AmlEmuError:
            raise
        except Exception as exc:  # noqa: BLE001 - the storage SDKs' errors are many; each is redacted
            raise self.guard(name)(exc) from None
        return sum(size for _, size in list_files(*source))

    def download(self, uri: str, local: Path, progress: Callable[[int, int], None] | None = None) -> int:
        name, path = parse_uri(uri)
        fs, root = self.filesystem(name)
        base = posixpath.join(root, path)
        try:
            listing = list_files(fs, base)
            if not listing:
                raise NotFoundError("path", uri, "list what is there with `amlemu data ls`")
            total, done = sum(size for _, size in listing), 0
            for remote, size in listing:
                rel = posixpath.relpath(remote, base) if remote != base else posixpath.basename(remote)
                target = local / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(target))
                done += size
                if progress:
                    progress(done, total)
        except AmlEmuError:
            raise
        except Exception as exc:  # noqa: BLE001 - as above
            raise self.guard(name)(exc) from None
        return total

    def ls(self, uri: str) -> list[tuple[str, int]]:
        name, path = parse_uri(uri)
        fs, root = self.filesystem(name)
        base = posixpath.join(root, path)
        try:
            return [(posixpath.relpath(p, root), size) for p, size in list_files(fs, base)]
        except Exception as exc:  # noqa: BLE001 - as above
            raise self.guard(name)(exc) from None


def list_files(fs: Any, base: str) -> list[tuple[str, int]]:
    """(path, size) of the file at `base` or of every file under it; empty when nothing is there."""
    if fs.isfile(base):
        return [(base, fs.size(base))]
    if not fs.exists(base):
        return []
    return sorted((p, info["size"]) for p, info in fs.find(base, detail=True).items())


def open_filesystem(spec: DatastoreSpec, secret: str | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, root) of a local or Azure Blob datastore, given its secret."""
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
    if not fs.exists(spec.container):
        fs.mkdir(spec.container)
    return fs, spec.container


def _make_folder(folder: Path) -> list[Path]:
    """Create a local datastore's folder; returns what was created (to undo on a later failure)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError("path", f"{folder} is a file", "give a folder for a local datastore")
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("path", f"cannot create {folder}: {exc.strerror or exc}",
                          "give a folder you can write") from None
    return missing[-1:]  # the topmost new folder holds every other


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


def sync_tree(src: tuple[Any, str], dst: tuple[Any, str], progress: Callable[[int, int], None] | None = None,
              overwrite: bool = False) -> tuple[list[str], list[str]]:
    """Copy the file at src, or every file under it, to the same relative path under dst; unless
    overwrite, files already there with the same size are skipped (a re-run sends only what
    changed). Returns the relative paths copied and those skipped."""
    (src_fs, src_root), (dst_fs, dst_root) = src, dst
    listing = list_files(src_fs, src_root)
    total, done, copied, skipped = sum(size for _, size in listing), 0, [], []
    for path, size in listing:
        rel = posixpath.relpath(path, src_root) if path != src_root else posixpath.basename(path)
        target = posixpath.join(dst_root, rel)
        if not overwrite and dst_fs.exists(target) and dst_fs.size(target) == size:
            skipped.append(rel)
        else:
            dst_fs.makedirs(posixpath.dirname(target), exist_ok=True)  # a no-op on blob storage
            with src_fs.open(path, "rb") as reader, dst_fs.open(target, "wb") as writer:
                shutil.copyfileobj(reader, writer, 4 * 1024 * 1024)
            copied.append(rel)
        done += size
        if progress:
            progress(done, total)
    return copied, skipped


def credential_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise ConfigError(f"${var}", "is empty or unset", f"export {var}=<secret> first")
    return value
