"""This machine's software as nodes see it: what a mirror node (docker) or a sandbox (process)
mounts read-only at the same paths, and the variables a node's shell starts with."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from amlemu.storage.dataruntime.mounttable import unescape

if TYPE_CHECKING:
    from amlemu.backends.base import NodeRequest


def software_paths() -> list[str]:
    """This machine's software, mirrored read-only at the same paths onto nodes that use it (so
    every path in the venv holds). Only what programs need: /etc/ssl/certs, not /etc/ssl/private."""
    paths = ["/usr", "/etc/alternatives", "/etc/openmpi", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
             str(Path(sys.base_prefix).resolve()), str(Path(sys.prefix).resolve())]
    return [p for p in dict.fromkeys(paths) if Path(p).exists()]


def within(path: str, roots: list[str]) -> bool:
    """Whether `path` is one of `roots` or inside one. Pure."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def submounts(paths: list[str], mountinfo: str) -> list[str]:
    """`paths` followed by the mount points strictly inside them (from /proc/self/mountinfo's text),
    parents first: a sandbox binds each path alone, and a mount inside one (a GPU driver's folder
    mounted at /usr/local/nvidia) would otherwise be an empty folder there. Pure."""
    points = [unescape(fields[4]) for fields in map(str.split, mountinfo.splitlines()) if len(fields) > 4]
    inside = [p for p in dict.fromkeys(points) if p not in paths and within(p, paths)]
    return [*paths, *sorted(inside, key=lambda p: p.count("/"))]


# The dynamic loader's own configuration: a process node (a sandbox with this machine's /usr) finds
# libraries where this machine does, e.g. a GPU driver's libcuda outside /usr/lib (/usr/local/nvidia).
LOADER_CONFIG = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")


def sandbox_software() -> list[str]:
    """What a process node's sandbox mirrors: the software paths, the mounts inside them, and the
    loader's configuration."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    return [*submounts(software_paths(), mountinfo), *(p for p in LOADER_CONFIG if Path(p).exists())]


def mirrored_library_path(value: str, mirrored: list[str]) -> str:
    """The LD_LIBRARY_PATH entries of `value` that a mirrored node can see (under `mirrored`, the
    software paths): an image's ENV LD_LIBRARY_PATH, as CUDA's images point at their driver. Pure."""
    return ":".join(e for e in dict.fromkeys(value.split(":")) if e.startswith("/") and within(e, mirrored))


def host_library_path() -> str:
    return mirrored_library_path(os.environ.get("LD_LIBRARY_PATH", ""), software_paths())


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
