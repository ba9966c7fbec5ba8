"""What `jobs.download` reads and a local input's upload writes, on the emulator: a run's outputs as Azure ML names them, and the
blobs behind them. Two kinds of container: `azureml` of the artifact store, whose
`ExperimentRun/dcid.<run>/` is the run's own folder (logs and default outputs, as `amlemu job
download` copies them), and each emulator datastore, as a container of its own name, read
through the datastore's filesystem (local folder, Azurite or Azure Blob).
"""
from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from amlemu.errors import AmlEmuError
from amlemu.jobs.jobspec_io import job_from_record
from amlemu.names import JOB_NAME_RE
from amlemu.runs import runhistory
from amlemu.runs.contract import bindings
from amlemu.runs import runfiles
from amlemu.service.state import bad_request, not_found

ARTIFACT_STORE, ARTIFACT_CONTAINER = "workspaceartifactstore", "azureml"
# v2's and v1's log folders, and the files Run.upload_file sent under names of their own.
RUN_FOLDERS = ("outputs", "logs", "user_logs", "system_logs", "azureml-logs", runhistory.ARTIFACTS)


def run_outputs(emu: Any, name: str) -> dict[str, str]:
    """Output name -> azureml:// URI: "default" (logs and outputs/) and each named output."""
    record = emu.store.run(name)
    found = {"default": f"azureml://datastores/{ARTIFACT_STORE}/paths/ExperimentRun/dcid.{name}"}
    if record.job.get("kind") == "pipeline":  # no command of its own: its outputs are its steps' (pipelinestate.py)
        return found
    for b in bindings(job_from_record(record.job), name):
        if b.is_output:
            found[b.name] = b.uri.rstrip("/")
    return found


def _run_files(emu: Any, prefix: str) -> list[tuple[str, Path]]:
    head, _, rest = prefix.partition("ExperimentRun/dcid.")
    run = rest.split("/", 1)[0]
    if head or not JOB_NAME_RE.match(run):  # a run's name, never `..` or a path
        return []
    run_dir = emu.home.run_dir(run)
    files = [p for sub in RUN_FOLDERS for p in sorted((run_dir / sub).rglob("*")) if p.is_file() and not p.is_symlink()
             and not runfiles.private(p.relative_to(run_dir).as_posix(), p.stat())]  # no launch plan
    named = [(f"ExperimentRun/dcid.{run}/{runhistory.listed_name(run_dir, p)}", p) for p in files]
    return [(n, p) for n, p in named if n.startswith(prefix)]


def list_blobs(emu: Any, container: str, prefix: str) -> list[tuple[str, int]]:
    if container == ARTIFACT_CONTAINER:
        return [(n, p.stat().st_size) for n, p in _run_files(emu, prefix)]
    try:
        fs, root = emu.datastores.filesystem(container)
        base = posixpath.join(root, prefix).rstrip("/")
        found = fs.find(base, detail=True) if fs.exists(base) else {}
    except AmlEmuError as exc:
        raise not_found(f"container {container} ({exc})") from None
    strip = root.rstrip("/") + "/" if root else ""
    return sorted((path[len(strip):] if path.startswith(strip) else path, int(info.get("size") or 0))
                  for path, info in found.items() if info.get("type") != "directory")


def read_blob(emu: Any, container: str, blob: str) -> bytes:
    if container == ARTIFACT_CONTAINER:
        for name, path in _run_files(emu, blob):
            if name == blob:
                return path.read_bytes()
        raise not_found(f"blob {blob}")
    if ".." in blob.split("/"):
        raise not_found(f"blob {blob}")
    try:
        fs, root = emu.datastores.filesystem(container)
        with fs.open(posixpath.join(root, blob), "rb") as src:
            return bytes(src.read())
    except (AmlEmuError, FileNotFoundError):
        raise not_found(f"blob {blob} in {container}") from None


def write_blob(emu: Any, container: str, blob: str, data: bytes) -> None:
    """A local input the SDK uploads (to workspaceblobstore/LocalUpload/...): into the datastore."""
    if container == ARTIFACT_CONTAINER or ".." in blob.split("/") or not blob:
        raise bad_request("blob", f"blob: {container}/{blob} cannot be written; upload to a datastore")
    try:
        fs, root = emu.datastores.filesystem(container)
        path = posixpath.join(root, blob)
        parent = posixpath.dirname(path)
        if parent:
            fs.makedirs(parent, exist_ok=True)
        fs.pipe(path, data)
    except AmlEmuError as exc:
        raise bad_request("blob", f"blob: writing {container}/{blob}: {exc}") from None
