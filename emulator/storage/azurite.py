"""Azurite, Microsoft's Azure Storage emulator (npm package, installed by scripts/setup.sh), run by
the emulator itself for the datastores that need it: bound to 127.0.0.1, data and log in the home.

Facts it encodes (shared/research/storage.md): azure-storage-blob 12.31 sends an API version
Azurite 3.37 rejects unless started with --skipApiVersionCheck; without --disableTelemetry it
tries to reach the internet.

Secrets: Azurite's debug log records every request URL, SAS tokens included, so it is off unless
AMLEMU_AZURITE_DEBUG=1 (then <home>/azurite/azurite.log, owner-only, holds full request URLs with
their SAS signatures: treat it like <home>/secrets). It is not redacted: that would need a second
long-lived process between Azurite and the file, whose death would take the storage server down
(Node exits on a broken pipe), for a log that is only read to debug Azurite itself, where the raw
request is the point. Access logs stay off (--silent), so stdout.log holds start-up lines only;
the folder and every file the emulator makes in it are owner-only anyway.

Shared: with AMLEMU_AZURITE_DIR set, every home uses the one Azurite of that folder (started there
on first use, as a home's own is) and no home using it stops it (`stop` is a no-op there): whoever
set the variable does, as the home whose own folder it is (`<home>/azurite`, seen without the
variable: `Azurite(home, cache, env={}).stop()`).
Each home's workspaceblobstore has a container of its own (`azureml-blobstore-<guid>`, as each
Azure ML workspace has), so homes do not see each other's blobs by name; they share Azurite's one
development account, whose key is public, so this is for homes of one user, such as a test
session's (each Azurite start costs ~3 CPU-s: the suite's ~50 homes paid ~170).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from amlemu import procinfo
from amlemu.errors import BackendError

# Azurite's published development account: public, identical on every machine, not a secret.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
VERSION = "3.37.0"


class AzuriteExited(BackendError):
    pass


def find_binary(cache: Path) -> Path | None:
    """azurite-blob as setup installs it (cache/azurite), else one on PATH."""
    local = cache / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and shutil.which("node"):
        return local
    found = shutil.which("azurite-blob")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DEBUG_ENV = "AMLEMU_AZURITE_DEBUG"
SHARED_ENV = "AMLEMU_AZURITE_DIR"


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def azurite_argv(binary: Path, *, port: int, location: Path, log: Path | None) -> list[str]:
    """`log`: the debug log (request URLs with their SAS tokens), None for none."""
    debug = ["--debug", str(log)] if log else []
    return [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location),
            *debug, "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"]


def owner_only(path: Path) -> Path:
    """Create `path` (a file) readable by its owner alone, or make an existing one so."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    return path


@dataclass(frozen=True)
class AzuriteEndpoint:
    port: int

    @property
    def blob_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.blob_url};")


class Azurite:
    """One Azurite per emulator home (or one for several: `env` has SHARED_ENV), found again
    through its state file (pid, port)."""

    def __init__(self, home_root: Path, cache: Path, env: Mapping[str, str] | None = None) -> None:
        shared = (os.environ if env is None else env).get(SHARED_ENV, "").strip()
        self.shared = bool(shared)  # not this home's to stop
        self.dir = Path(shared).absolute() if shared else home_root / "azurite"
        self.state = self.dir / "server.json"
        self.cache = cache

    def running(self) -> AzuriteEndpoint | None:
        if not self.state.exists():
            return None
        info = json.loads(self.state.read_text())
        try:
            proc = psutil.Process(info["pid"])
            if proc.status() != psutil.STATUS_ZOMBIE and str(self.dir) in " ".join(procinfo.argv(proc)):
                return AzuriteEndpoint(info["port"])
        except psutil.NoSuchProcess:
            pass
        return None

    def ensure(self, timeout: float = 60.0) -> AzuriteEndpoint:
        """The running server of this home, started and health-checked if needed. Callers in
        several threads or processes (a supervisor's nodes, the CLI) get the one same server."""
        running = self.running()
        if running:
            return running
        binary = find_binary(self.cache)
        if binary is None:
            raise BackendError("Azurite is not installed (needs Node.js and `make setup`); "
                               "datastores fall back to a local folder")
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)  # blobs, and with debugging on, request URLs: the owner's alone
        with open(owner_only(self.dir / "start.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            running = self.running()  # started by whoever held the lock before us
            if running:
                return running
            for _ in range(2):  # the free port can be taken between the check and the bind
                try:
                    return self._start(binary, timeout)
                except AzuriteExited:
                    continue
            return self._start(binary, timeout)

    def _start(self, binary: Path, timeout: float) -> AzuriteEndpoint:
        port = free_port()
        log = owner_only(self.dir / "azurite.log") if debug_enabled() else None
        with open(owner_only(self.dir / "stdout.log"), "ab") as out:
            proc = subprocess.Popen(azurite_argv(binary, port=port, location=self.dir / "data", log=log),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        # Whole or absent: `running()` reads it outside the start lock (a half-written file is not JSON).
        staged = owner_only(self.dir / f".server.json.{proc.pid}")
        staged.write_text(json.dumps({"pid": proc.pid, "port": port}))
        staged.replace(self.state)
        endpoint = AzuriteEndpoint(port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AzuriteExited(f"Azurite exited with {proc.returncode}; see {self.dir / 'stdout.log'}")
            if healthy(endpoint):
                return endpoint
            time.sleep(0.1)
        self.stop()
        raise BackendError(f"Azurite did not answer within {timeout:g} s; see {log or self.dir / 'stdout.log'}")

    def stop(self) -> bool:
        """Stop this home's server; a shared one is not this home's to stop (module docstring)."""
        if self.shared:
            return False
        running = self.running()
        if running is None:
            return False
        pid = json.loads(self.state.read_text())["pid"]
        os.killpg(pid, signal.SIGTERM)
        try:
            psutil.Process(pid).wait(timeout=10)
        except psutil.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
        self.state.unlink(missing_ok=True)
        return True


def healthy(endpoint: AzuriteEndpoint) -> bool:
    """The blob service answers a real request (listing containers), not just a TCP connect."""
    from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

    try:
        socket.create_connection(("127.0.0.1", endpoint.port), timeout=1).close()
        # Short timeouts: a request left unanswered must not use up the caller's whole deadline.
        client = BlobServiceClient.from_connection_string(endpoint.connection_string, retry_total=0,
                                                          connection_timeout=2, read_timeout=5)
        list(client.list_containers(results_per_page=1))
        return True
    except Exception:  # noqa: BLE001 - any failure means: not ready yet
        return False
