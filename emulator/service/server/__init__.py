"""Running the service: uvicorn over HTTPS in the foreground (`amlemu serve`), in a thread (the
tests' double), or started in the background on demand (`amlemu env`); the state file that says
where it listens (amlemu.servicefile) and the variables that point azure-ai-ml at it.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import uvicorn

from amlemu import servicefile
from amlemu.errors import AmlEmuError, ConfigError
from amlemu.service.server import tls
from amlemu.service.protocol.auth import Auth
from amlemu.service.protocol.bodies import printable
from amlemu.service.protocol.routes import CLOUD_NAME, Context, build_app

READY_TIMEOUT = 60.0
DAEMON_UMASK = 0o022
GRACE = 2.0  # seconds a stopping service gives requests in flight
LOOPBACK = "127.0.0.1"


def env_vars(url: str, identity_header: str, ca_bundle: Path, fast_stream: bool = False) -> dict[str, str]:
    """The environment variables that point an unmodified azure-ai-ml + DefaultAzureCredential here.

    ARM_CLOUD_METADATA_URL: azure-ai-ml reads the cloud's endpoints (resourceManager = this
    service) from it; AZUREML_CURRENT_CLOUD names that cloud (the SDK would write it into
    os.environ itself). IDENTITY_ENDPOINT + IDENTITY_HEADER: azure-identity's managed identity
    asks this service for tokens; AZURE_TOKEN_CREDENTIALS narrows DefaultAzureCredential to it, so
    a developer's `az login` is never used by mistake. REQUESTS_CA_BUNDLE: certifi's roots plus
    the service's CA, so the real Azure still verifies. With `fast_stream`, the polling intervals
    make azure-ai-ml's jobs.stream poll every second at most (it reads them at import); they are
    left out by default because azureml-core reads the same variables as strings and its
    Run.wait_for_completion then fails with a TypeError (it divides by the string).
    """
    fast = {"AZUREML_RUN_POLLING_INTERVAL_MIN": "0", "AZUREML_RUN_POLLING_INTERVAL_MAX": "1"} if fast_stream else {}
    return {
        "ARM_CLOUD_METADATA_URL": f"{url}/metadata/endpoints?api-version=2019-05-01",
        "AZUREML_CURRENT_CLOUD": CLOUD_NAME,
        "IDENTITY_ENDPOINT": f"{url}/msi/token",
        "IDENTITY_HEADER": identity_header,
        "AZURE_TOKEN_CREDENTIALS": "ManagedIdentityCredential",
        "REQUESTS_CA_BUNDLE": str(ca_bundle),
        **fast,
        **v1_env_vars(url, identity_header, ca_bundle),
    }


def v1_env_vars(url: str, identity_header: str, ca_bundle: Path) -> dict[str, str]:
    """What azureml-core (SDK v1) needs besides: its default auth tries managed identity first,
    App Service's 2017 protocol when APPSETTING_WEBSITE_SITE_NAME is set (MSI_ENDPOINT +
    MSI_SECRET, the same secret as IDENTITY_HEADER); its vendored Azure CLI core keeps the cloud
    it read from ARM_CLOUD_METADATA_URL in $AZURE_CONFIG_DIR (a folder of the home, never
    ~/.azure) and fetches it with urllib, which trusts SSL_CERT_FILE, not REQUESTS_CA_BUNDLE; its
    snapshot upload rebuilds a blob host name from the account (no such host resolves to this
    machine), so AML_FORCE_EXECUTE_WITH_ZIP sends the code with the run instead."""
    return {
        "APPSETTING_WEBSITE_SITE_NAME": "amlemu",
        "MSI_ENDPOINT": f"{url}/msi/v1",
        "MSI_SECRET": identity_header,
        "AZURE_CONFIG_DIR": str(ca_bundle.parent / "azure-config"),
        "SSL_CERT_FILE": str(ca_bundle),
        "AML_FORCE_EXECUTE_WITH_ZIP": "true",
    }


def public_names(remote: bool) -> list[str]:
    """The names the service's certificate covers, the one its URL uses first: with --allow-remote
    this machine's names and addresses (remote clients verify them with the CA bundle), then loopback's."""
    return list(dict.fromkeys([*(tls.machine_names() if remote else []), LOOPBACK, "localhost"]))


@dataclass
class Running:
    """A service running in a thread of this process (the tests' double)."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def _config(app: Any, files: tls.TlsFiles, grace: float = GRACE) -> uvicorn.Config:
    # access_log off: uvicorn's access lines carry the query string (SAS signatures); the
    # routes log method, path and status themselves.
    return uvicorn.Config(app, ssl_certfile=str(files.cert), ssl_keyfile=str(files.key), access_log=False,
                          log_level="warning", lifespan="off", timeout_keep_alive=30, log_config=None,
                          # An idle keep-alive TLS connection whose client never answers the close
                          # would hold the shutdown for ever (asyncio's wait_closed waits for it).
                          timeout_graceful_shutdown=grace)


def run_in_thread(ctx: Context, folder: Path, extra_routes: list[Any] | None = None) -> Running:
    """Serve `ctx` on 127.0.0.1 (a free port) from a daemon thread; `stop()` ends it."""
    files = tls.ensure(folder, [LOOPBACK, "localhost"])
    sock = servicefile.bind(LOOPBACK, 0)
    ctx.url = f"https://{LOOPBACK}:{sock.getsockname()[1]}"
    server = uvicorn.Server(_config(build_app(ctx, extra_routes), files, grace=0.3))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="amlemu-service", daemon=True)
    thread.start()
    deadline = time.monotonic() + READY_TIMEOUT
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AmlEmuError("the in-process service did not start")
        time.sleep(0.01)
    return Running(server, thread, ctx.url)


def file_logger(path: Path) -> Callable[[str], None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def log(line: str) -> None:
        # One line per call, whatever a client put in it: its newlines, terminal escapes and bidi
        # overrides are written as escapes (bodies.printable), so a path cannot forge a line or
        # rewrite the terminal of whoever reads the log.
        with lock, path.open("a", encoding="utf-8") as out:
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {printable(line.rstrip())}\n")
    return log


class LogHandler(logging.Handler):
    """Python logging's records (uvicorn's: an exception in a route, with what the client sent in
    it) into the service's log, a line at a time, escaped as the log's own lines are."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.write = log

    def emit(self, record: logging.LogRecord) -> None:
        for line in self.format(record).splitlines():
            self.write(line)


class _Stopped(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _Stopped


def serve_forever(home_root: Path, make_ctx: Callable[[Auth, Callable[[str], None]], Context], host: str,
                  port: int, remote: bool, announce: Callable[[str], None],
                  extra_routes: list[Any] | None = None) -> None:
    """`amlemu serve`: listen, write the state file, serve until SIGINT/SIGTERM, remove it.
    `extra_routes` (Starlette routes: the studio page) are served beside the API."""
    folder = servicefile.service_dir(home_root)
    running = servicefile.read_state(home_root)
    if running is not None:
        raise ConfigError("serve", f"the service of this home already runs at {running.url} (pid {running.pid})",
                          "use it, or stop it with `amlemu serve --stop`")
    names = public_names(remote)
    files = tls.ensure(folder, names)
    auth = Auth.load_or_create(folder / "secrets.json")
    log = file_logger(folder / "service.log")
    sock = servicefile.bind(host, port)
    link = servicefile.bind(LOOPBACK, 0)  # runs' links relay here: what arrives is a job's (linkguard.py)
    url = f"https://{f'[{names[0]}]' if ':' in names[0] else names[0]}:{sock.getsockname()[1]}"
    ctx = make_ctx(auth, log)
    ctx.url = url
    ctx.link_port = link.getsockname()[1]
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    logging.getLogger("uvicorn").addHandler(LogHandler(log))  # its errors, escaped, in the service's log
    server = uvicorn.Server(_config(build_app(ctx, extra_routes), files))
    me = psutil.Process()
    servicefile.write_state(home_root, servicefile.ServiceState(os.getpid(), url, host, sock.getsockname()[1],
                                                                time.time(), me.create_time(), str(home_root), remote,
                                                                ctx.link_port))
    log(f"serving {url} (pid {os.getpid()})")
    announce(url)
    # uvicorn turns SIGINT/SIGTERM into a graceful exit, then raises the signal again for the
    # handler it found: ours ends this function through its `finally`, not the process mid-way.
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock, link])
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        servicefile.remove_state(home_root, os.getpid())
        log("stopped")


def start_background(home_root: Path, port: int, timeout: float = READY_TIMEOUT) -> servicefile.ServiceState:
    """Start `amlemu serve` for the home detached as a daemon is, and wait until it answers: its own
    session (it outlives this command and its terminal), stdin from /dev/null, its output to
    <home>/service/service.log, working directory `/` (the folder it was started from may be a CI
    step's temporary one, removed while it serves: MLflow resolves its store against the working
    directory), umask 022 (what it writes for jobs is readable; secrets are written 0600 anyway)."""
    folder = servicefile.service_dir(home_root)
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "amlemu", "--home", str(home_root.resolve()), "serve", "--port", str(port)]
    with open(folder / "service.log", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd="/",
                                umask=DAEMON_UMASK, start_new_session=True, env=_daemon_env())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = servicefile.read_state(home_root)
        if state is not None and state.pid == proc.pid:
            return state
        if proc.poll() is not None:
            tail = (folder / "service.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise AmlEmuError(f"amlemu serve exited with code {proc.returncode}"
                              + (f": {tail[0]}" if tail else "") + f" (its log: {folder / 'service.log'})")
        time.sleep(0.05)
    proc.terminate()
    raise AmlEmuError(f"amlemu serve did not start within {timeout:g} s (its log: {folder / 'service.log'})")


def _daemon_env() -> dict[str, str]:
    """This command's environment for the service, less its debug switches; the paths it reads
    (PYTHONPATH, amlemu's caches, the uv it may run) made absolute, as they would otherwise name
    folders relative to where it was started, not to `/`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMLEMU_DEBUG") and k != "PWD"}
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "AMLEMU_CACHE", "AMLEMU_ENV_CACHE", "AMLEMU_UV", "XDG_CACHE_HOME"):
        if env.get(key):
            env[key] = os.pathsep.join(str(Path(p).expanduser().resolve()) if p else p
                                       for p in env[key].split(os.pathsep))
    return env


def client_env(home_root: Path, state: servicefile.ServiceState, fast_stream: bool = False) -> dict[str, str]:
    folder = servicefile.service_dir(home_root)
    auth = Auth.load_or_create(folder / "secrets.json")
    found = env_vars(state.url, auth.identity_header, folder / "ca-bundle.pem", fast_stream)
    config = Path(found["AZURE_CONFIG_DIR"])
    config.mkdir(mode=0o700, exist_ok=True)
    cached = config / "cloudEndpoints.json"  # azureml-core's copy of the cloud: stale once the port changes
    if cached.exists() and state.url not in cached.read_text(errors="replace"):
        cached.unlink()
    return found
