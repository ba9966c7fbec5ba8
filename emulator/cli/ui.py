"""`amlemu ui`: the studio page of this home (emulator/service/studio.py) over plain HTTP on
loopback, until Ctrl-C; `--mlflow`: MLflow's own UI over the home's MLflow store, where online runs
log live (the service's tracking server writes it) and offline runs are copied in
(emulator/uistore.py).

The MLflow server runs in a session of its own, so a Ctrl-C in the terminal reaches only this
command, which then stops the server's whole process group (the server and its workers) itself.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import webbrowser
from pathlib import Path

import click
import psutil

from amlemu.cli.common import cli, console, emulator_of, err_console, handle_errors
from amlemu.errors import AmlEmuError, ConfigError
from amlemu.servicefile import bind, is_loopback, read_state
from amlemu.studio.uistore import build_ui_store, ui_store_path

READY_TIMEOUT = 60.0
STOP_GRACE = 10.0


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server_argv(store: Path, host: str, port: int) -> list[str]:
    """The installed mlflow's own server (an argv list: no shell), over the combined store. Each
    experiment's artifacts live at a file URI under the home, so no artifact proxy is needed."""
    mlflow = Path(sys.executable).with_name("mlflow")
    launcher = [str(mlflow)] if mlflow.exists() else [sys.executable, "-m", "mlflow"]
    return [*launcher, "server", "--backend-store-uri", f"sqlite:///{store}",
            "--default-artifact-root", (store.parent / "artifacts").as_uri(), "--no-serve-artifacts",
            "--host", host, "--port", str(port), "--workers", "1"]


def server_env() -> dict[str, str]:
    # A read-only view over copies needs none of MLflow's background job runners (a dozen
    # processes, seconds of start-up, their own queue files).
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise AmlEmuError(f"the MLflow server exited with code {proc.returncode}"
                              + (f": {tail[0]}" if tail else "") + f" (its log: {log})")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AmlEmuError(f"the MLflow server did not answer on {url} within {READY_TIMEOUT:g} s (its log: {log})")


def stop_server(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM the server's process group, SIGKILL what is left after a grace. Its workers are
    known by pid before the signal, so one that left the group is still found (never by name)."""
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # start_new_session: the group id is the server's pid
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_GRACE)  # the server reaps its own workers as it shuts down
        except subprocess.TimeoutExpired:
            continue
        _, workers = psutil.wait_procs(workers, timeout=STOP_GRACE if sig == signal.SIGTERM else 2)
        if not workers:
            return
    for worker in workers:
        try:
            worker.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(workers, timeout=5)


def _interrupt(signum: int, frame) -> None:  # type: ignore[no-untyped-def]
    raise KeyboardInterrupt  # the server goes with this command, however it is stopped


def can_open_a_browser() -> bool:
    """Only where a graphical browser can show the page: without a display, Python's webbrowser falls
    back to a text browser that would take over this terminal."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@cli.command("ui")
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="interface to listen on; only loopback unless --allow-remote")
@click.option("--allow-remote", is_flag=True,
              help="allow a non-loopback --host: over plain HTTP, the login link and the session it gives cross "
                   "the network unencrypted (`amlemu serve --allow-remote` serves the page over TLS)")
@click.option("--mlflow", "mlflow_ui", is_flag=True,
              help="MLflow's own UI over the home's MLflow store (online runs live, offline runs copied in), "
                   "instead of the studio page")
@click.option("--no-browser", is_flag=True, help="print the address only; do not open a browser")
@click.option("--link", "link_only", is_flag=True,
              help="print a new one-time login link to the studio page of the home's running service "
                   "(`amlemu serve`, or started by `amlemu env`) and exit")
@click.pass_context
@handle_errors
def ui(ctx: click.Context, port: int, host: str, allow_remote: bool, mlflow_ui: bool, no_browser: bool,
       link_only: bool) -> None:
    """The studio page of this emulator (computes, nodes, jobs, live logs and metrics), until Ctrl-C.
    It prints a one-time login link (the page answers no one without the session it gives)."""
    if link_only:
        _service_link(ctx)
        return
    if not is_loopback(host) and not allow_remote:
        raise ConfigError("--host", f"{host} is not a loopback address",
                          "use 127.0.0.1, or add --allow-remote to serve the page to other machines")
    bind(host, port).close()  # free now: the server binds it next
    emu = emulator_of(ctx)
    emu.reconcile()
    if mlflow_ui:
        _mlflow_ui(emu, url_of(host, port), host, port)
    else:
        _studio(emu, host, port, open_browser=not no_browser and can_open_a_browser(), remote=allow_remote)


def _service_link(ctx: click.Context) -> None:
    from amlemu.studio.gate import home_key, login_url  # noqa: PLC0415

    root = ctx.obj.home().root
    state = read_state(root)
    if state is None:
        raise ConfigError("--link", "the service of this home is not running", 'start it with `eval "$(amlemu env)"` '
                          "or `amlemu serve`, or run `amlemu ui` for the page alone")
    click.echo(login_url(home_key(root), state.url))


def _studio(emu, host: str, port: int, *, open_browser: bool, remote: bool) -> None:  # type: ignore[no-untyped-def]
    import uvicorn  # noqa: PLC0415 - the server loads only for this command

    from amlemu.studio.app import standalone_app  # noqa: PLC0415
    from amlemu.studio.gate import LOOPBACK_NAMES, home_key, login_url  # noqa: PLC0415
    from amlemu.service.server.tls import machine_names  # noqa: PLC0415

    # Host names the page answers to (DNS rebinding): loopback's; with --allow-remote this machine's too.
    names = machine_names() if remote else []
    hosts = LOOPBACK_NAMES | frozenset([*names, host.lower()]) if remote else LOOPBACK_NAMES
    # The printed URL names the --host, or this machine when it listens on every interface.
    url = url_of(names[0] if names and host in ("0.0.0.0", "::") else host, port)  # noqa: S104
    key = home_key(emu.home.root)
    server = uvicorn.Server(uvicorn.Config(standalone_app(emu.home, key, hosts), host=host, port=port,
                                           log_level="warning", lifespan="on"))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            link = login_url(key, url)
            console.print(f"amlemu studio: {url}/studio/  (Ctrl-C stops it)\n"
                          f"a one-time login link (`amlemu ui --link` gives one for the service): {link}",
                          highlight=False)
            if open_browser:
                webbrowser.open(link)

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run()  # on Ctrl-C / SIGTERM uvicorn lets in-flight requests end, then re-raises the signal
    except KeyboardInterrupt:
        pass  # how this command is meant to end
    err_console.print("stopped the studio page", highlight=False)


def _mlflow_ui(emu, url: str, host: str, port: int) -> None:  # type: ignore[no-untyped-def]
    store = ui_store_path(emu)
    import mlflow  # noqa: F401,PLC0415 - it sets its loggers up on import: quieted after that

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its notes on creating its tables
    with err_console.status("copying the offline runs' MLflow data"):
        copied = build_ui_store(emu, store)
    err_console.print(f"{copied} offline run(s) copied or refreshed into {store}", highlight=False)
    log = store.parent / "server.log"
    # Also SIGINT: a shell that started this in the background set it to be ignored, yet the
    # contract is "runs until Ctrl-C / SIGINT".
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    proc = None
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(server_argv(store, host, port), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=store.parent, start_new_session=True,
                                    env=server_env())
        wait_ready(proc, url, log)
        console.print(f"MLflow UI: {url}  (server pid {proc.pid}; Ctrl-C stops it)", highlight=False)
        while proc.poll() is None:
            time.sleep(0.5)
        raise AmlEmuError(f"the MLflow server exited with code {proc.returncode} (its log: {log})")
    except KeyboardInterrupt:
        err_console.print("stopping the MLflow UI", highlight=False)
    finally:
        for sig in previous:  # a second Ctrl-C must not cut the stop short and leave the server
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            stop_server(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
