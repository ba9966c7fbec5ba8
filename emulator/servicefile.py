"""Where `amlemu serve` keeps its state in the home, and how it is found and stopped.

Low in the layers on purpose: `amlemu cleanup` (emulator/cluster/teardown.py) stops the service
and `amlemu workspace show` reports it, neither of which may import the service itself.

<home>/service/ holds: state.json (pid, url, when; written once the service listens, removed as
it stops), the CA and the server certificate (tls), the secrets file (owner-only) and the log.
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from amlemu import procinfo
from amlemu.errors import ConfigError

DEFAULT_PORT = 45443  # stable, so a URL written once (a config, a notebook) keeps working
STOP_GRACE = 10.0


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host` (an address or `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (a server's, or a check that the port is free), or a
    one-line error naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError("--port", f"cannot listen on {host}:{port} ({exc.strerror})",
                          "choose another port with --port, or stop what uses it") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def service_dir(home_root: Path) -> Path:
    return home_root / "service"


def state_path(home_root: Path) -> Path:
    return service_dir(home_root) / "state.json"


@dataclass(frozen=True)
class ServiceState:
    pid: int
    url: str
    host: str
    port: int
    started_at: float
    create_time: float  # psutil's: with the pid, names the process even after the pid is reused
    home: str = ""  # a copied home's state file does not name the copy
    remote: bool = False
    link_port: int = 0  # loopback only: where runs' links relay jobs' requests (service/linkguard.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def write_state(home_root: Path, state: ServiceState) -> None:
    path = state_path(home_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(path)  # readers never see half a file


def _alive(state: ServiceState) -> bool:
    """Is the process that wrote `state` still running? (Never act on a reused pid.)"""
    try:
        proc = psutil.Process(state.pid)
        return proc.status() != psutil.STATUS_ZOMBIE and procinfo.same_start(state.create_time, proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def read_state(home_root: Path) -> ServiceState | None:
    """The running service of this home, or None (a state file left by a killed one is ignored)."""
    try:
        state = ServiceState(**json.loads(state_path(home_root).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if state.home == str(home_root) and _alive(state) else None


def remove_state(home_root: Path, pid: int | None = None) -> None:
    """Remove the state file (only the one `pid` wrote, when given: a newer service's stays)."""
    path = state_path(home_root)
    try:
        if pid is None or json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def stop(home_root: Path) -> bool | None:
    """Stop the home's service: SIGTERM, SIGKILL after a grace. False: none was running (an
    Action's "nothing to do"); None: stopped."""
    state = read_state(home_root)
    if state is None:
        remove_state(home_root)
        return False
    try:
        proc = psutil.Process(state.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    except psutil.NoSuchProcess:
        pass
    remove_state(home_root, state.pid)
    return None

