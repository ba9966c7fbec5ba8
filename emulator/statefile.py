"""Writing a state file whole or not at all: staged beside its target, then renamed over it.

A reader (another CLI call, a supervisor, the service) then finds the old file or the new one,
never half of one, even when the writer is killed or the disk fills mid-write; a failed write
leaves the old file and no stage behind. Owner-only files are created 0600 from the start, so a
secret is never briefly readable by others.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def write_bytes(path: Path, data: bytes, owner_only: bool = False) -> None:
    """`data` into `path` atomically (a rename in the same folder); its folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stage = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.stage")  # threads write too
    fd = os.open(stage, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600 if owner_only else 0o644)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name points at them
        if owner_only:
            os.chmod(stage, 0o600)  # a umask never widens it, but an existing stage could have
        os.replace(stage, path)
    except BaseException:
        stage.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, owner_only: bool = False) -> None:
    write_bytes(path, text.encode(), owner_only)


def write_json(path: Path, value: Any, owner_only: bool = False, indent: int | None = None) -> None:
    write_text(path, json.dumps(value, indent=indent), owner_only)
