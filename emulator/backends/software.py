"""This machine's software as nodes see it: what a mirror node (docker) or a sandbox (process)
mounts read-only at the same paths, and the variables a node's shell starts with."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amlemu.backends.base import NodeRequest


def software_paths() -> list[str]:
    """This machine's software, mirrored read-only at the same paths onto nodes that use it (so
    every path in the venv holds). Only what programs need: /etc/ssl/certs, not /etc/ssl/private."""
    paths = ["/usr", "/etc/alternatives", "/etc/openmpi", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
             str(Path(sys.base_prefix).resolve()), str(Path(sys.prefix).resolve())]
    return [p for p in dict.fromkeys(paths) if Path(p).exists()]


def node_base_env(software_bin: str | None) -> dict[str, str]:
    """What a node's shell has before the run's variables: a container's image defaults. With
    `software_bin` (the emulator's venv, mirrored onto the node) first on PATH."""
    env = {"HOME": "/root", "LANG": "C.UTF-8", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    if software_bin:
        env["PATH"] = f"{software_bin}:/usr/local/bin:/usr/bin:/bin"
    return env


def software_bin(request: NodeRequest | None = None) -> str:
    """First on a mirrored node's PATH: the job's environment's bin folder, else the emulator's venv's."""
    if request is not None and request.python_env:
        return str(Path(request.python_env, "bin"))
    return str(Path(sys.prefix, "bin"))
