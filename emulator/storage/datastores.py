"""Datastores: named blob containers (or folders) of the workspace, reached through fsspec.

Kinds: `local` (a folder; no server), `azurite` (the local Azure Storage emulator, started on
demand) and `azure_blob` (real Azure Blob through adlfs: account key, SAS token or
DefaultAzureCredential). `workspaceblobstore`, the default, is made on first use: on Azurite
when it is installed, else a local folder. Secrets live in the home, owner-only, apart from the
specs; nothing here prints them, and errors are redacted before they are raised.
"""
from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from amlemu import statefile
from amlemu.actions import Action
from amlemu.errors import AmlEmuError, BackendError, ConfigError, NotFoundError, StateError
from amlemu.names import check_datastore_name
from amlemu.storage.azurite import Azurite
from amlemu.storage.filesystems import open_filesystem
from amlemu.storage.transfer import (
    copy_file,
    get_file,
    list_files,
    plan_tree,
    run_transfer,
    sync_tree,  # noqa: F401 - where its callers import it from
)

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
    """The workspace's datastore registry (in the home's SQLite store) and their filesystems.
    Each verb that writes has its plan_* (its dry run: Actions, emulator/actions.py)."""

    def __init__(self, store, home_root: Path, cache: Path) -> None:  # type: ignore[no-untyped-def]
        self.store, self.home_root, self.cache = store, home_root, cache
        self.azurite = Azurite(home_root, cache)
        self._secrets_dir = home_root / "secrets"

    # --- registry ----------------------------------------------------------------------------
    def list(self) -> list[DatastoreSpec]:
        self.get(DEFAULT)
        return [DatastoreSpec(**spec) for spec in self.store.datastores()]

    def peek(self, name: str) -> tuple[DatastoreSpec, list[Action]]:
        """The datastore, creating nothing: its spec, and what using it first does (the default
        datastore is made on first use)."""
        spec = self.store.datastore(name)
        if spec:
            return DatastoreSpec(**spec), []
        if name == DEFAULT:
            default = self._default_spec()
            return default, self.plan_create(default)
        known = sorted({DEFAULT, *(s["name"] for s in self.store.datastores())})
        raise NotFoundError("datastore", name, f"known: {', '.join(known)}; create it with `amlemu datastore create`")

    def get(self, name: str) -> DatastoreSpec:
        spec, first = self.peek(name)
        return self.create(spec) if first else spec

    def _default_spec(self) -> DatastoreSpec:
        from amlemu.storage.azurite import find_binary  # noqa: PLC0415

        if find_binary(self.cache):  # the container of this workspace, named as Azure ML names it
            guid = uuid.uuid5(uuid.NAMESPACE_URL, f"amlemu-home:{self.home_root}")
            return DatastoreSpec(DEFAULT, "azurite", container=f"azureml-blobstore-{guid}")
        return DatastoreSpec(DEFAULT, "local", folder=str(self.home_root / "datastores" / DEFAULT))

    def plan_create(self, spec: DatastoreSpec, secret: str | None = None) -> list[Action]:
        """Everything checked first; the folder, the secret (never shown), the record last."""
        if spec.credential in ("account_key", "sas") and not secret:
            raise ConfigError("credential", f"{spec.credential} needs a secret",
                              "pass it through the environment variable the CLI names")
        if self.store.datastore(spec.name):
            raise StateError(f"datastore '{spec.name}' already exists; pick another name")
        plan = []
        if spec.kind == "local":
            folder = Path(spec.folder)
            if folder.exists() and not folder.is_dir():
                raise ConfigError("path", f"{folder} is a file", "give a folder for a local datastore")
            if not folder.exists():
                plan.append(Action("create", "folder", str(folder), run=functools.partial(_make_folder, folder)))
        if secret:
            plan.append(Action("write", "secret", str(self._secrets_dir / spec.name), {"mode": "0600"},
                               run=functools.partial(self._write_secret, spec.name, secret)))
        return plan + [Action("add", "datastore", spec.name, {"spec": asdict(spec)},
                              run=lambda: self.store.add_datastore(spec.name, asdict(spec)))]

    def create(self, spec: DatastoreSpec, secret: str | None = None) -> DatastoreSpec:
        """Carry out plan_create; a refused datastore leaves no row, secret or folder behind."""
        made: list[Path] = []
        try:
            for action in self.plan_create(spec, secret):
                made += action.run() or []  # type: ignore[misc] - each returns what it made
        except BaseException:
            for path in reversed(made):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            raise
        return spec

    def _write_secret(self, name: str, secret: str) -> list[Path]:
        made = []
        if not self._secrets_dir.exists():
            self._secrets_dir.mkdir(mode=0o700)
            made.append(self._secrets_dir)
        path = self._secrets_dir / name
        made.append(path)
        statefile.write_text(path, secret, owner_only=True)
        return made

    def _secret(self, name: str) -> str:
        path = self._secrets_dir / name
        return path.read_text() if path.exists() else ""

    # --- filesystems -------------------------------------------------------------------------
    def filesystem(self, name: str) -> tuple[Any, str]:
        """(fsspec filesystem, root within it) of a datastore; Azurite is started when needed.
        A storage error (unreachable, refused credential) is one redacted line naming the datastore."""
        spec = self.get(name)
        with self.guarded(name):
            return self._filesystem(spec)

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

    def look(self, name: str) -> tuple[tuple[Any | None, str], list[Action]]:
        """A dry run's read-only look: ((filesystem, root), what opening the datastore for writing
        does first). The filesystem is None where reading it would start Azurite."""
        spec, first = self.peek(name)

        def prepare() -> None:
            self.filesystem(name)
        with self.guarded(name):
            if spec.kind == "azurite":
                running = self.azurite.running()
                if running is None:
                    return (None, spec.container), [*first, Action("start", "Azurite server", "", {
                        "then": f"creates container {spec.container} if missing, reads what is there"}, run=prepare)]
                import adlfs  # noqa: PLC0415

                fs, root = adlfs.AzureBlobFileSystem(connection_string=running.connection_string,
                                                     skip_instance_cache=True), spec.container
            else:
                fs, root = open_filesystem(spec, self._secret(name), create=False)
            if spec.kind != "local" and not fs.exists(root):
                first = [*first, Action("create", "container", root, {"datastore": name}, run=prepare)]
            return (fs, root), first

    @contextlib.contextmanager
    def guarded(self, name: str) -> Iterator[None]:
        """A storage error (unreachable, refused credential) comes out as one redacted line naming
        the datastore; the emulator's own errors pass as they are."""
        try:
            yield
        except AmlEmuError:
            raise
        except Exception as exc:  # noqa: BLE001 - the storage SDKs' errors are many; each is redacted
            raise self.guard(name)(exc) from None

    def guard(self, name: str) -> Callable[[Exception], BackendError]:
        def wrap(exc: Exception) -> BackendError:
            text = f"datastore {name}: {type(exc).__name__}: {exc}".splitlines()[0]
            if not isinstance(exc, OSError):  # the storage service refused: its address or credential
                text += f"; check how it is reached (`amlemu datastore show {name}`) and its secret"
            return BackendError(redact(text, [self._secret(name)]))
        return wrap

    # --- transfers: plan_* lists each file (the dry run); the verb carries the plan out ----------
    def plan_upload(self, local: Path, uri: str, overwrite: bool = False,
                    dst: tuple[Any, str] | None = None) -> list[Action]:
        """Each file of `local` (a file or folder) and where it goes; unless overwrite, files already
        there with the same size are skipped. `dst`: the datastore opened for writing (an upload);
        without it the datastore is only looked at, and what opening it does comes first."""
        name, path = parse_uri(uri)
        if not local.exists():
            raise ConfigError("local path", f"{local} does not exist")
        import fsspec  # noqa: PLC0415

        (fs, root), first = (dst, []) if dst is not None else self.look(name)
        source = fsspec.filesystem("file")
        with self.guarded(name):
            files = plan_tree((source, str(local.resolve())), (fs, posixpath.join(root, path)), overwrite)
        return first + [Action("skip" if f.skip else "copy", "file", f.source,
                               {"to": datastore_uri(name, posixpath.join(path, f.rel)), "size": f.size,
                                **({"why": "already there with the same size"} if f.skip else {})},
                               run=None if f.skip or dst is None else
                               functools.partial(copy_file, source, f.source, fs, f.target)) for f in files]

    def upload(self, local: Path, uri: str, progress: Callable[[int, int], None] | None = None,
               overwrite: bool = False) -> int:
        """Carry out plan_upload (re-running a data upload is cheap). Returns the bytes covered."""
        name, _ = parse_uri(uri)
        if not local.exists():
            raise ConfigError("local path", f"{local} does not exist")
        return self._transfer(name, lambda dst: self.plan_upload(local, uri, overwrite, dst), progress)

    def plan_download(self, uri: str, local: Path, src: tuple[Any, str] | None = None) -> list[Action]:
        """Each file at the URI and where it lands under `local` (the download copies every one).
        `src` as `dst` of plan_upload."""
        name, path = parse_uri(uri)
        (fs, root), first = (src, []) if src is not None else self.look(name)
        if fs is None:
            return [*first, Action("copy", "files", uri, {"to": str(local), "which": "listed once Azurite runs"})]
        base = posixpath.join(root, path)
        with self.guarded(name):
            listing = list_files(fs, base)
        if not listing:
            raise NotFoundError("path", uri, "list what is there with `amlemu data ls`")
        plan = first
        for remote, size in listing:
            target = local / (posixpath.relpath(remote, base) if remote != base else posixpath.basename(remote))
            plan.append(Action("copy", "file", datastore_uri(name, posixpath.relpath(remote, root)),
                               {"to": str(target), "size": size},
                               run=None if src is None else functools.partial(get_file, fs, remote, target)))
        return plan

    def download(self, uri: str, local: Path, progress: Callable[[int, int], None] | None = None) -> int:
        return self._transfer(parse_uri(uri)[0], lambda src: self.plan_download(uri, local, src), progress)

    def _transfer(self, name: str, plan: Callable[[tuple[Any, str]], list[Action]],
                  progress: Callable[[int, int], None] | None) -> int:
        """Open the datastore for writing (Azurite started, the container made), plan with it, and
        carry the plan out; storage errors come out as one redacted line."""
        opened = self.filesystem(name)
        with self.guarded(name):
            return run_transfer(plan(opened), progress)

    def ls(self, uri: str) -> list[tuple[str, int]]:
        name, path = parse_uri(uri)
        fs, root = self.filesystem(name)
        with self.guarded(name):
            return [(posixpath.relpath(p, root), size) for p, size in list_files(fs, posixpath.join(root, path))]


def datastore_uri(name: str, path: str) -> str:
    return f"azureml://datastores/{name}/paths/{path.strip('/')}"


def _make_folder(folder: Path) -> list[Path]:
    """Create a local datastore's folder; returns what was created (to undo on a later failure)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("path", f"cannot create {folder}: {exc.strerror or exc}",
                          "give a folder you can write") from None
    return missing[-1:]  # the topmost new folder holds every other


def credential_from_env(var: str | None) -> str | None:
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise ConfigError(f"${var}", "is empty or unset", f"export {var}=<secret> first")
    return value
