"""azureml-core's code snapshots (SnapshotsClient.create_snapshot, which a HyperDriveConfig submit uses):
the client uploads the files that changed since the snapshot it last made (its cache of the
workspace's latest, ~/.azureml/.projectcontent) to the blob URLs `getblob` handed out, then creates
the snapshot with its whole tree (DirTreeNode), the uploaded files (FileRevisionList) and its parent
(ParentSnapshotId). The service keeps each snapshot as a folder: the uploaded files, the rest of
the tree from the parent's folder. A parent it does not hold, or one without a file the tree names,
is a 400: the client then forgets its cache and sends every file again, as it does for Azure ML.
"""
from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from amlemu.service.state import ACCOUNT, DiskBlobs, bad_request

MAX_BYTES = 300 * 1024 * 1024  # Azure ML's snapshot limit
MAX_FILES = 2000  # azureml-core's own limit on a snapshot's files
CONTAINER_PREFIX = "snapshot-"  # the blob containers getblob hands out
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def new_container() -> str:
    return f"{CONTAINER_PREFIX}{uuid.uuid4().hex[:16]}"


def _tree_files(node: Any, prefix: str, out: dict[str, str]) -> None:
    """Every file ("File") and folder ("Directory") of a DirTreeNode, by relative path."""
    children = node.get("children") if isinstance(node, dict) else None
    if not isinstance(children, dict):
        raise bad_request("DirTreeNode", "DirTreeNode: not a directory tree; create snapshots with azureml-core")
    for name, child in children.items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise bad_request("DirTreeNode", f"DirTreeNode: {name!r} is not a file name")
        path = f"{prefix}{name}"
        kind = str(child.get("type") if isinstance(child, dict) else "")
        out[path] = kind
        if kind != "File":
            _tree_files(child, f"{path}/", out)
        if len(out) > MAX_FILES * 4:
            raise bad_request("DirTreeNode", f"DirTreeNode: over {MAX_FILES} files; leave files out with .amlignore")


class Snapshots:
    """The workspace's snapshots, each a folder under `root`; the uploads are in `blobs`."""

    def __init__(self, root: Path, blobs: DiskBlobs) -> None:
        self.root = root
        self.blobs = blobs

    def folder(self, snapshot_id: str, field: str = "SnapshotId") -> Path:
        found = self.root / snapshot_id if _ID.match(snapshot_id) else None
        if found is None or not found.is_dir():
            # An unchanged source folder is not sent again: the client names the snapshot its cache
            # remembers, which another home of the same workspace may have made.
            raise bad_request(field, f"{field}: snapshot {snapshot_id} was not created on this service; "
                              "delete ~/.azureml/.projectcontent (azureml-core's memory of the workspace's latest "
                              "snapshot, made on another amlemu home) and submit again")
        return found

    def _uploaded(self, body: dict[str, Any]) -> tuple[dict[str, Path], set[str]]:
        """(FullName -> the file its BlobUri names, the containers getblob handed out that hold them)."""
        nodes = (body.get("FileRevisionList") or {}).get("FileNodes") or []
        found: dict[str, Path] = {}
        containers: set[str] = set()
        for node in nodes if isinstance(nodes, list) else []:
            name, uri = (node.get("FullName"), node.get("BlobUri")) if isinstance(node, dict) else (None, None)
            parts = unquote(urlsplit(str(uri)).path).lstrip("/").split("/", 2)
            if not isinstance(name, str) or len(parts) != 3 or parts[0] != ACCOUNT or \
                    not parts[1].startswith(CONTAINER_PREFIX):
                raise bad_request("FileRevisionList", f"FileRevisionList: {name!r} was not uploaded to a URL "
                                  "this service handed out (getblob)")
            found[name] = self.blobs.path(parts[1], parts[2])
            containers.add(parts[1])
        return found, containers

    def create(self, snapshot_id: str, body: Any) -> None:
        """The snapshot's folder, from its uploads and its parent's files; a 400 naming the field."""
        if not _ID.match(snapshot_id):
            raise bad_request("snapshotId", f"snapshotId: '{snapshot_id}' is not a snapshot id")
        if not isinstance(body, dict):
            raise bad_request("body", "body: a snapshot is a JSON object; create it with azureml-core")
        target = self.root / snapshot_id
        if target.is_dir():
            return  # the client's retry of a snapshot made already
        tree: dict[str, str] = {}
        _tree_files(body.get("DirTreeNode") or {"children": {}}, "", tree)
        (uploaded, containers), parent = self._uploaded(body), body.get("ParentSnapshotId")
        staging = self.root / f".{snapshot_id}.{uuid.uuid4().hex[:8]}"
        try:
            self._fill(staging, tree, uploaded, str(parent) if parent else None)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            for container in containers:  # copied, or refused (the client sends them again)
                shutil.rmtree(self.blobs.path(container), ignore_errors=True)
                shutil.rmtree(self.blobs.root.parent / "blob-metadata" / container, ignore_errors=True)

    def _fill(self, staging: Path, tree: dict[str, str], uploaded: dict[str, Path], parent: str | None) -> None:
        staging.mkdir(parents=True)
        total, files = 0, 0
        for path, kind in sorted(tree.items()):
            dest = staging / path
            if kind != "File":
                dest.mkdir(parents=True, exist_ok=True)
                continue
            source = uploaded.get(path)
            if source is None:  # unchanged since the parent snapshot
                source = self.folder(parent, "ParentSnapshotId") / path if parent else None
            if source is None or source.is_symlink() or not source.is_file():
                raise bad_request("FileRevisionList", f"FileRevisionList: {path} was neither uploaded nor in the "
                                  f"parent snapshot {parent}")
            files, total = files + 1, total + source.stat().st_size
            if files > MAX_FILES or total > MAX_BYTES:
                raise bad_request("DirTreeNode", "DirTreeNode: over Azure ML's snapshot limits (300 MB, "
                                  f"{MAX_FILES} files); leave files out with .amlignore")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
