"""`amlemu data sync`: put the emulator's datastore content on the real workspace's datastore of
the same name, so `azureml://datastores/<ds>/paths/<p>` means the same data on both targets."""
from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emulator.errors import BackendError, ConfigError
from emulator.jobs.jobyaml import load_job
from emulator.runs.contract import LOCAL_SOURCE, bindings
from emulator.storage.datastores import open_filesystem, parse_uri, redact, sync_tree

if TYPE_CHECKING:
    from emulator.api import Emulator
    from emulator.targets.azureml import AzureMLTarget


@dataclass(frozen=True)
class SyncResult:
    uri: str
    destination: str  # account/container/path (no secret)
    copied: list[str]  # paths relative to the URI
    skipped: list[str]


def job_data_uris(job_file: Path, overrides: list[str] | None = None) -> list[str]:
    """The datastore inputs of a job: what it reads, hence what the workspace must hold."""
    job = load_job(job_file, overrides)
    return sorted({b.uri for b in bindings(job, "<run id>") if not b.is_output and b.datastore != LOCAL_SOURCE})


def sync(emu: Emulator, target: AzureMLTarget, uri: str,
         progress: Callable[[int, int], None] | None = None) -> SyncResult:
    name, path = parse_uri(uri)
    src_fs, src_root = emu.datastores.filesystem(name)
    source = posixpath.join(src_root, path) if path else src_root
    if not src_fs.exists(source):
        raise ConfigError("uri", f"nothing at {uri} on the emulator", f"upload it first: amlemu data upload <folder> {uri}")
    spec, secret = target.datastore(name)
    try:
        dst_fs, dst_root = open_filesystem(spec, secret)
        destination = posixpath.join(dst_root, path) if path else dst_root
        copied, skipped = sync_tree((src_fs, source), (dst_fs, destination), progress)
    except (OSError, ValueError) as exc:
        raise BackendError(redact(f"datastore {name} of workspace {target.workspace.workspace_name}: "
                                  f"{type(exc).__name__}: {exc}".splitlines()[0], [secret or ""])) from None
    return SyncResult(uri, f"{spec.account}/{destination}", copied, skipped)
