"""The serving process of one mount (`python -m amlemu.storage.dataruntime.serve`, or forked by the
home's fork server, which has imported this module once): reads its configuration as JSON on stdin
(the filesystem as fsspec's JSON, which may hold a secret), mounts, prints `mounted` once the kernel
has the mount, and serves until it is unmounted."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import fsspec

with contextlib.suppress(ImportError):  # a datastore's filesystem: most of a fresh process's start
    import adlfs  # noqa: F401

from amlemu.storage.dataruntime.logs import secrets_of
from amlemu.storage.dataruntime.mount import READY, serve
from amlemu.storage.dataruntime.mountfs import DataRuntimeFS
from amlemu.storage.dataruntime.settings import Settings


def main(argv: list[str] | None = None) -> int:
    config = json.loads(sys.stdin.read())
    # FUSE callbacks wait for the interpreter lock behind fetch and write threads: a shorter switch
    # interval than the default 5 ms keeps a read's latency near its own cost.
    sys.setswitchinterval(0.0005)
    settings = Settings.from_dict(config["settings"])
    fs = fsspec.AbstractFileSystem.from_json(config["fs"])

    def ready() -> None:
        print(READY, flush=True)

    ops = DataRuntimeFS(fs, config["root"], Path(config["cache"]), Path(config["logs"]), settings, on_ready=ready,
                         only=config.get("only"), secrets=secrets_of(config["fs"]))
    serve(ops, config["mountpoint"], settings, config.get("fsname") or "amlemu-dataruntime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
