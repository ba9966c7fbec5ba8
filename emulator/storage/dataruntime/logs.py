"""The mount's logs, in the files Azure ML's data runtime writes under system_logs/data_capability/:
`data-capability.log` (the mount session: start, settings, errors as the runtime names them) and
`rslex.log.<timestamp>` (the runtime's own lines: downloads, blocks, pruning). The caller gives the
folder; a job's would be its run's system_logs/data_capability/."""
from __future__ import annotations

import errno
import json
import re
import threading
import time
from pathlib import Path

SESSION = "data-capability.UriMountSession"
# The runtime's DataAccessError kinds (as its logs name them) for the errno a reader gets.
ERRORS = {errno.ENOENT: "NotFound", errno.EACCES: "PermissionDenied", errno.EPERM: "PermissionDenied",
          errno.EROFS: "ReadOnly", errno.EIO: "Unexpected"}


def stamp(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


class RuntimeLog:
    """Appends lines to both files; thread-safe (FUSE calls arrive on many threads)."""

    def __init__(self, folder: Path, clock=time.time, secrets: tuple[str, ...] = ()) -> None:  # type: ignore[no-untyped-def]
        folder.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.secrets = tuple(sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True))
        self.session = folder / "data-capability.log"
        self.rslex = folder / f"rslex.log.{time.strftime('%Y-%m-%d-%H', time.gmtime(clock()))}"
        self.lock = threading.Lock()

    def _write(self, path: Path, level: str, source: str, message: str) -> None:
        for secret in self.secrets:  # a storage error may quote its request (a SAS token in the URL)
            message = message.replace(secret, "***")
        line = f"{stamp(self.clock())} | {level:<5} | {source} | {message}\n"
        with self.lock, open(path, "a", encoding="utf-8") as out:
            out.write(line)

    def info(self, message: str) -> None:
        self._write(self.session, "INFO", SESSION, message)

    def runtime(self, message: str) -> None:
        self._write(self.rslex, "INFO", "rslex::fuse", message)

    def error(self, operation: str, path: str, code: int, detail: str = "") -> str:
        """An access error in both files, as the runtime words it; returns its kind (NotFound...)."""
        kind = ERRORS.get(code, "Unexpected")
        self._write(self.session, "ERROR", f"{SESSION}.PyFuseError",
                    f"{operation} {path}: DataAccessError({kind})" + (f": {detail}" if detail else ""))
        self._write(self.rslex, "ERROR", "rslex::fuse", f"{operation} {path} failed: {kind}")
        return kind


def secrets_of(fs_json: str) -> tuple[str, ...]:
    """The credentials in a filesystem's fsspec JSON (keys, tokens, a SAS and its signature), to be
    kept out of the logs."""
    found: list[str] = []
    for key, value in json.loads(fs_json).items():
        if isinstance(value, str) and re.search(r"key|token|secret|credential|password|connection", key, re.I):
            found += [value, *re.findall(r"sig=([^&\s]+)", value)]
    return tuple(found)
