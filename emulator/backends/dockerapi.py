"""The Docker engine's API as the docker backend uses it: one connection with a clear error where no
engine answers, container names from list entries, and removals that tolerate a race."""
from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from amlemu.backends import nodefs
from amlemu.backends.dockerexec import is_server, platform_started
from amlemu.errors import BackendError
from amlemu.lazydeps import import_docker


def connect(address: str = "", tls: tuple[str, str, str] | None = None, version: str | None = None) -> Any:
    """This machine's engine (docker.from_env), or the engine at `address` (another machine's,
    amlemu.machines: TLS files (ca, cert, key) for tcp://). `version`: the engine's API version where
    known (else the SDK asks for it: ~8 ms of each process's first engine call)."""
    docker = import_docker()  # the SDK is needed only where this backend is used
    if address.startswith("ssh://"):
        _ssh_transport()
    try:
        if address:
            config = docker.tls.TLSConfig(client_cert=tls[1:], ca_cert=tls[0], verify=True) if tls else None
            client = remote_client(docker, address, config, 30)
        else:
            client = docker.from_env(timeout=30, version=version)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        if address:
            raise BackendError(f"the Docker engine at {address} does not answer ({type(exc).__name__}); check that "
                               "machine (`amlemu machine list`)") from None
        raise BackendError(f"no Docker engine answers ({type(exc).__name__}); start dockerd "
                           f"(`make setup` does) or use --backend process") from None
    return client


def remote_client(docker: Any, address: str, tls: Any, timeout: int) -> Any:
    """A DockerClient for another machine's engine; with `tls` (a TLSConfig) trusting the engine's
    CA alone. requests lets REQUESTS_CA_BUNDLE (which `amlemu env` sets for the service) replace a
    session's CA in every request, so the engine's certificate was refused: the client does not read
    the environment, and the API version is asked so before the client is made."""
    version = "auto"
    if tls is not None:
        probe = docker.APIClient(base_url=address, tls=tls, timeout=timeout, version="1.24")  # the SDK's oldest
        probe.trust_env = False
        version = probe.version()["ApiVersion"]
        probe.close()
    client = docker.DockerClient(base_url=address, tls=tls, timeout=timeout, use_ssh_client=False, version=version)
    client.api.trust_env = tls is None
    return client


def _ssh_transport() -> None:
    """The SDK's paramiko transport for an ssh:// engine (lazydeps leaves it out of an SDK imported
    without it); paramiko's failed handshakes logged nowhere: the one-line error says what failed."""
    try:
        importlib.import_module("paramiko")
    except ImportError:
        raise BackendError("ssh:// engines need paramiko; install amlemu's dependencies (scripts/setup.sh)") from None
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    client_module = sys.modules["docker.api.client"]
    if not hasattr(client_module, "SSHHTTPAdapter"):
        client_module.SSHHTTPAdapter = importlib.import_module("docker.transport.sshconn").SSHHTTPAdapter


def listed_name(listed: dict) -> str:
    """A container's name from the list API's entry ("Names": ["/name"])."""
    return listed["Names"][0].lstrip("/")


def until_gone(remove) -> None:  # type: ignore[no-untyped-def]
    """Remove, tolerating a removal already under way (a supervisor scaling its node down, a
    container still detaching from its network): retry until it is gone, for up to 30 s."""
    import docker  # noqa: PLC0415

    deadline = time.monotonic() + 30
    while True:
        try:
            remove()
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def has_image(client: Any, image: str) -> bool:
    import docker  # noqa: PLC0415

    try:
        client.images.get(image)
        return True
    except docker.errors.ImageNotFound:
        return False


def cgroup_pids(pid: int) -> Callable[[], list[int]]:
    """A reader of the pids in the cgroup that holds process `pid` (a container's init): its memory
    controller's under cgroup v1, the unified one under v2."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    found = [line.split(":", 2)[2] for line in lines if "memory" in line.split(":", 2)[1].split(",")]
    if found:
        procs = Path("/sys/fs/cgroup/memory") / found[0].lstrip("/") / "cgroup.procs"
    else:
        unified = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), "/")
        procs = Path("/sys/fs/cgroup") / unified.lstrip("/") / "cgroup.procs"
    return lambda: [int(pid) for pid in procs.read_text().split()] if procs.exists() else []


def kept_processes(main: int, pids: list[int]) -> set[int]:
    """Of a node's `pids`, the ones kept across its jobs: its init (`main`), its idle sleep and its
    resident agent, where the platform started them (dockerexec.platform_started)."""
    keep = {main}
    for pid in pids:
        try:
            cmdline = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if (cmdline[-2:] in (["/bin/sleep", "infinity"], ["sleep", "infinity"]) or is_server(cmdline)) and \
                platform_started(pid):
            keep.add(pid)
    return keep


def kill_job_processes(container: Any) -> int:
    """Kill, by host pid, every process of a running container but the kept ones; how many. Its
    processes are read from its cgroup (`docker top` ran ps through the engine: ~10-20 ms a node at
    every job's end)."""
    try:
        pids = cgroup_pids(container.attrs["State"]["Pid"])()
    except OSError:  # the node died meanwhile (a kill, a preemption): nothing runs on it
        return 0
    keep = kept_processes(container.attrs["State"]["Pid"], pids)
    victims = [pid for pid in pids if pid not in keep]
    for pid in victims:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return len(victims)


def scratch_argv(folders: tuple[str, ...]) -> list[str]:
    """Empties `folders` inside a node. -xdev: each is a tmpfs of its own, and what is mounted
    below one (this machine's Python under /root, mirrored read-only) is not the run's: walking it
    to fail on every file cost 1.2-1.4 s of each job's end on another machine's node."""
    return ["find", *folders, "-xdev", "-mindepth", "1", "-delete"]


def empty_scratch(container: Any, folders: tuple[str, ...], on_this_machine: bool) -> None:
    """Empty a running node's scratch `folders`: from the host through /proc/<pid>/root, without
    following a link (nodefs), as no job process is left; by `find` in the container where the host
    may not look (not root, or another machine's node)."""
    import docker  # noqa: PLC0415

    root = Path(f"/proc/{container.attrs['State']['Pid']}/root")
    try:
        try:
            if not on_this_machine:  # its pids are another machine's
                raise PermissionError
            for folder in folders:
                nodefs.wipe(root / folder.lstrip("/"))
        except PermissionError:
            container.exec_run(scratch_argv(folders), user="0")
    except docker.errors.APIError:
        pass  # a node gone meanwhile has nothing left to empty
