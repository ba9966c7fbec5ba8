"""A machine's Docker engine: connecting to it, and what it has (cores, memory, GPUs).

Cores and memory are the engine's own figures (`docker info`: NCPU, MemTotal). GPUs are not: the
engine's API does not list them (NVIDIA's toolkit reports them to swarm as generic resources at
best), so another machine's GPUs are the UUIDs the user gives (`nvidia-smi -L` on that machine);
`local`'s are read here from nvidia-smi, narrowed by CUDA_VISIBLE_DEVICES as cluster/gpus.py does.
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import psutil

from amlemu.backends.dockerapi import remote_client
from amlemu.errors import ConfigError, MachineError
from amlemu.lazydeps import import_docker
from amlemu.machines.address import TlsFiles
from amlemu.machines.registry import LOCAL, Machine

GPU_UUID_RE = re.compile(r"^(?:GPU|MIG)-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
LOCAL_ADDRESS = "unix:///var/run/docker.sock"  # docker.from_env()'s engine when DOCKER_HOST is unset
TIMEOUT = 20  # seconds an engine has to answer


def check_gpu_uuids(text: str | None, field: str = "--gpus") -> tuple[str, ...]:
    """`--gpus GPU-<uuid>,...` as nvidia-smi -L prints them; each once."""
    if not text:
        return ()
    uuids = tuple(part.strip() for part in text.split(","))
    for uuid in uuids:
        if not GPU_UUID_RE.fullmatch(uuid):
            raise ConfigError(field, f"{uuid[:60]!r} is not a GPU UUID",
                              "give the UUIDs `nvidia-smi -L` prints on that machine (GPU-xxxxxxxx-...), comma-separated")
    if len(set(uuids)) != len(uuids):
        raise ConfigError(field, "a GPU is named twice", "name each GPU once")
    return uuids


def parse_gpu_uuids(smi_csv: str, visible: str | None) -> tuple[str, ...]:
    """The UUIDs from `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`, narrowed by
    CUDA_VISIBLE_DEVICES (`visible`: indices or UUIDs, as CUDA takes them). Pure."""
    rows = [tuple(part.strip() for part in line.split(",", 1)) for line in smi_csv.splitlines() if "," in line]
    if visible is None:
        return tuple(uuid for _, uuid in rows)
    allowed = [v.strip() for v in visible.split(",") if v.strip()]
    return tuple(uuid for index, uuid in rows if index in allowed or any(a.startswith("GPU-") and uuid.startswith(a)
                                                                          for a in allowed))


def local_gpus() -> tuple[str, ...]:
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=TIMEOUT, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_gpu_uuids(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.lru_cache(maxsize=1)
def local_machine() -> Machine:
    """This machine, as amlemu plans nodes on it (autoscale.limits_here's figures: its cores and
    memory, its visible GPUs); its engine: DOCKER_HOST, else Docker's default socket."""
    return Machine(LOCAL, os.environ.get("DOCKER_HOST") or LOCAL_ADDRESS, float(os.cpu_count() or 1),
                   psutil.virtual_memory().total, local_gpus())


def _docker_module(address: str) -> Any:
    """The docker SDK, with its ssh transport where the address needs it (lazydeps leaves paramiko
    out otherwise; an SDK imported without it is given it here)."""
    if not address.startswith("ssh://"):
        return import_docker()
    try:
        importlib.import_module("paramiko")
    except ImportError:
        raise MachineError(f"{address}: ssh:// engines need paramiko; install amlemu's dependencies "
                           "(scripts/setup.sh)") from None
    # paramiko's transport thread logs a failed handshake with its traceback; with no handler set up
    # (the CLI has none) Python would print it: the one-line MachineError says what failed instead.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    docker = importlib.import_module("docker")
    client_module = sys.modules["docker.api.client"]
    if not hasattr(client_module, "SSHHTTPAdapter"):  # imported earlier with paramiko left out
        client_module.SSHHTTPAdapter = importlib.import_module("docker.transport.sshconn").SSHHTTPAdapter
    return docker


def _reach(address: str, timeout: float) -> None:
    """ssh:// and tcp://: the host's port answers at all, within `timeout` (paramiko's own connect
    has no timeout: a host that drops packets would hold `machine add` for minutes)."""
    if address.startswith("unix://"):
        path = address[len("unix://"):]
        if not os.path.exists(path):
            raise MachineError(f"{address}: no socket at {path}; check the path, and that dockerd runs there")
        return
    parts = urlsplit(address)
    port = parts.port or (22 if parts.scheme == "ssh" else 2376)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        why = _first_line(exc) or type(exc).__name__
        raise MachineError(f"{address}: cannot reach {parts.hostname} port {port} ({why}); check the address and "
                           "that this machine may reach it") from None


def connect(address: str, tls: TlsFiles | None = None, timeout: int = TIMEOUT) -> Any:
    """A DockerClient for the engine at `address`, after it answered a ping; MachineError (one
    line naming the address and what failed) otherwise."""
    check_tls_files(tls)
    docker = _docker_module(address)
    try:
        config = docker.tls.TLSConfig(client_cert=(tls.cert, tls.key), ca_cert=tls.ca, verify=True) if tls else None
    except Exception as exc:  # noqa: BLE001 - TLSParameterError, or an OSError reading a file
        raise MachineError(f"{address}: the TLS files cannot be used ({_first_line(exc)})") from None
    _reach(address, timeout)
    client = None
    try:  # the client asks the engine for its API version as it is made: that is the first contact
        client = remote_client(docker, address, config, timeout)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine answers there
        if client is not None:
            client.close()
        raise MachineError(f"{address}: no Docker engine answers ({type(exc).__name__}: {_first_line(exc)}); "
                           "check the address, that dockerd runs there and that you may use it") from None
    return client


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def check_tls_files(tls: TlsFiles | None) -> None:
    for option, path in (tls.paths() if tls else {}).items():
        if not os.path.isfile(path):
            raise ConfigError(option, f"{path}: no such file", "give the path of an existing PEM file")


def read_machine(name: str, address: str, tls: TlsFiles | None = None, gpus: tuple[str, ...] = ()) -> Machine:
    """Connect once and read the engine's facts into a Machine (not stored: registry.plan_add)."""
    client = connect(address, tls)
    try:
        info = client.info()
    except Exception as exc:  # noqa: BLE001
        raise MachineError(f"{address}: the engine answered but its info could not be read "
                           f"({type(exc).__name__}: {_first_line(exc)})") from None
    finally:
        client.close()
    try:
        cores, memory = float(info["NCPU"]), int(info["MemTotal"])
    except (KeyError, TypeError, ValueError):
        raise MachineError(f"{address}: the engine's info has no NCPU/MemTotal; is it a Docker engine?") from None
    return Machine(name, address, cores, memory, gpus, time.time(), tls, str(info.get("ID") or ""))


def engine_id(address: str, tls: TlsFiles | None = None) -> str:
    """The ID an engine reports (`docker info`), '' when it cannot be read."""
    try:
        client = connect(address, tls)
    except MachineError:
        return ""
    try:
        return str(client.info().get("ID") or "")
    except Exception:  # noqa: BLE001 - only for a notice
        return ""
    finally:
        client.close()
