"""`amlemu data sync`: put the emulator's datastore content on the real workspace's datastore of
the same name, so `azureml://datastores/<ds>/paths/<p>` means the same data on both targets."""
from __future__ import annotations

import contextlib
import functools
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu.actions import Action
from amlemu.errors import BackendError, ConfigError
from amlemu.jobs.jobyaml import load_job
from amlemu.runs.contract import LOCAL_SOURCE, bindings
from amlemu.storage.datastores import DatastoreSpec, parse_uri, redact
from amlemu.storage.filesystems import open_filesystem
from amlemu.storage.transfer import copy_file, plan_tree, run_transfer
from amlemu.storage.urlinputs import is_url_source

if TYPE_CHECKING:
    from amlemu.api import Emulator
    from amlemu.targets.azureml import AzureMLTarget


@dataclass(frozen=True)
class SyncResult:
    uri: str
    destination: str  # account/container/path (no secret)
    copied: list[str]  # paths relative to the URI
    skipped: list[str]


def job_data_uris(job_file: Path, overrides: list[str] | None = None) -> list[str]:
    """The datastore inputs of a job: what it reads, hence what the workspace must hold."""
    job = load_job(job_file, overrides)
    return sorted({b.uri for b in bindings(job, "<run id>") if not b.is_output and b.datastore != LOCAL_SOURCE
                   and not is_url_source(b.datastore)})  # a URL: Azure ML reads it itself


def plan_sync(emu: Emulator, target: AzureMLTarget, uri: str, src: tuple[Any, str] | None = None,
              dest: tuple[DatastoreSpec, str | None] | None = None) -> tuple[list[Action], str]:
    """Each file at the URI on the emulator and where it goes on the workspace's datastore of the
    same name (account/container/path, no secret); files already there with the same size are
    skipped. `src`: the emulator's datastore opened (a sync); without it, only looked at (a dry
    run, which also creates no container on the workspace). `dest`: the workspace's datastore
    and its secret, if already looked up. Returns the plan and its destination."""
    name, path = parse_uri(uri)
    (src_fs, src_root), plan = (src, []) if src is not None else emu.datastores.look(name)
    source = posixpath.join(src_root, path) if path else src_root
    if src_fs is not None and not src_fs.exists(source):
        raise ConfigError("uri", f"nothing at {uri} on the emulator", f"upload it first: amlemu data upload <folder> {uri}")
    spec, secret = dest or target.datastore(name)
    with _guard(name, target, secret):
        dst_fs, dst_root = open_filesystem(spec, secret, create=src is not None)
        destination = posixpath.join(dst_root, path) if path else dst_root
        if src is None and not dst_fs.exists(dst_root):
            plan.append(Action("create", "container", dst_root, {"account": spec.account}))
        files = plan_tree((src_fs, source), (dst_fs, destination)) if src_fs is not None else None
    where = f"{spec.account}/{destination}"
    if files is None:  # the emulator's Azurite is not running: its files are listed once it is
        return [*plan, Action("copy", "files", uri, {"to": where, "which": "listed once Azurite runs"})], where
    return plan + [Action("skip" if f.skip else "copy", "file", f.rel,
                          {"to": f"{spec.account}/{f.target}", "size": f.size,
                           **({"why": "already there with the same size"} if f.skip else {})},
                          run=None if f.skip or src is None else
                          functools.partial(copy_file, src_fs, f.source, dst_fs, f.target)) for f in files], where


def sync(emu: Emulator, target: AzureMLTarget, uri: str,
         progress: Callable[[int, int], None] | None = None) -> SyncResult:
    """Carry out plan_sync, with the emulator's datastore opened (Azurite started if needed)."""
    name = parse_uri(uri)[0]
    src = emu.datastores.filesystem(name)
    spec, secret = target.datastore(name)
    plan, destination = plan_sync(emu, target, uri, src, (spec, secret))
    with _guard(name, target, secret):
        run_transfer(plan, progress)
    return SyncResult(uri, destination, [a.name for a in plan if a.verb == "copy"],
                      [a.name for a in plan if a.verb == "skip"])


@contextlib.contextmanager
def _guard(name: str, target: AzureMLTarget, secret: str | None) -> Iterator[None]:
    try:
        yield
    except (OSError, ValueError) as exc:
        raise BackendError(redact(f"datastore {name} of workspace {target.workspace.workspace_name}: "
                                  f"{type(exc).__name__}: {exc}".splitlines()[0], [secret or ""])) from None
