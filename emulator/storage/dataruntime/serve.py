"""The serving process of one mount (`python -m amlemu.storage.dataruntime.serve`, or forked by the
home's fork server, which has imported this module once): reads its configuration as JSON on stdin
(the filesystem as fsspec's JSON, which may hold a secret), mounts, says `mounted` on its stdout
once the mount is there, and serves until it is unmounted.

With the runtime's default settings the input becomes local placeholder files filled on first read
(placeholders.py: warm reads at the local disk's speed), where the kernel and disk allow; else, and
for a TTL, block mode or a cache size, the FUSE mount (mountfs.py)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from pathlib import Path

import fsspec

with contextlib.suppress(ImportError):  # a datastore's filesystem: most of a fresh process's start
    import adlfs  # noqa: F401

from amlemu.storage.dataruntime import placeholders
from amlemu.storage.dataruntime.logs import secrets_of
from amlemu.storage.dataruntime.mount import READY, serve
from amlemu.storage.dataruntime.mountfs import DataRuntimeFS
from amlemu.storage.dataruntime.settings import Settings


def _ready(held: int | None = None) -> None:
    """The ready line; a placeholder mount's group with it (stdout is a socket then: mount.start_process)."""
    if held is None:
        print(READY, flush=True)
        return
    with socket.socket(fileno=os.dup(1)) as out:
        socket.send_fds(out, [READY.encode() + b"\n"], [held])


def _placeholders(fs, config: dict, settings: Settings, fsname: str, secrets: tuple[str, ...]) -> bool:  # type: ignore[no-untyped-def]
    """Serve the input as placeholders until unmounted; False where they cannot serve it (the FUSE
    mount serves instead)."""
    if placeholders.ineligible(settings) is not None:
        return False
    mount = placeholders.PlaceholderMount(fs, config["root"], Path(config["cache"]), Path(config["logs"]), settings,
                                          fsname, only=config.get("only"), secrets=secrets)
    if mount.build(placeholders.listing(fs, config["root"], config.get("only"))) is None:
        return False
    mount.serve(config["mountpoint"], _ready)
    return True


def main(argv: list[str] | None = None) -> int:
    config = json.loads(sys.stdin.read())
    # FUSE callbacks wait for the interpreter lock behind fetch and write threads: a shorter switch
    # interval than the default 5 ms keeps a read's latency near its own cost.
    sys.setswitchinterval(0.0005)
    settings = Settings.from_dict(config["settings"])
    fs = fsspec.AbstractFileSystem.from_json(config["fs"])
    secrets, fsname = secrets_of(config["fs"]), config.get("fsname") or "amlemu-dataruntime"
    if _placeholders(fs, config, settings, fsname, secrets):
        return 0
    ops = DataRuntimeFS(fs, config["root"], Path(config["cache"]), Path(config["logs"]), settings, on_ready=_ready,
                         only=config.get("only"), secrets=secrets)
    serve(ops, config["mountpoint"], settings, fsname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
