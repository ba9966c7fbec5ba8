"""`amlemu cleanup`: stop what the home runs and forget its runs; --all forgets the workspace's
data too; --reset-state gets a home with an unusable state database going again.

Cleanup must work when the database cannot be read (corrupt, or of a newer amlemu): nodes are
then found the way the backends' reap finds them anyway (Docker labels, node folders), and
supervisors by their command line, which names the home and the run.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import click
import psutil

from emulator.cli.common import cli, console, handle_errors
from emulator.errors import StateDbError
from emulator.home import Home, default_cache


def _stop_supervisors(home: Home) -> list[str]:
    """Supervisors are started as `python -m emulator.runs.supervisor <home> <run id>`, each in its own
    process group: find them by exactly that, never by a looser match."""
    gone = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        argv = proc.info["cmdline"] or []
        if "emulator.runs.supervisor" in argv and str(home.root) in argv and proc.info["pid"] != os.getpid():
            try:
                os.killpg(proc.info["pid"], signal.SIGKILL)
                gone.append(f"process group {proc.info['pid']}")
            except (ProcessLookupError, PermissionError):
                pass
    return gone


def reap_without_state(home: Home, all_homes: bool) -> list[str]:
    """What cleanup can do when the state database cannot be read: stop supervisors, remove every
    node and network (Docker labels, process nodes' folders) and stop Azurite."""
    from emulator.backends import BACKENDS, backend_class, get_backend  # noqa: PLC0415
    from emulator.storage.azurite import Azurite  # noqa: PLC0415

    gone = _stop_supervisors(home)
    try:
        for name in BACKENDS:
            if backend_class(name).available()[0]:
                gone += get_backend(name, home).reap(all_homes)
    finally:
        if Azurite(home.root, default_cache()).stop():
            gone.append("Azurite server")
    return gone


def move_state_aside(home: Home) -> str:
    """amlemu.db (and its -wal/-shm, which belong to it) -> amlemu.db.broken-<time>: kept for a
    post-mortem, out of the way of the fresh database the next command creates."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = home.db.with_name(f"{home.db.name}.broken-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{home.db}{suffix}")
        if source.exists():
            source.rename(f"{target}{suffix}")
    return f"state database (moved to {target})"


def forget_data(emu: Any) -> list[str]:
    """--all: the workspace's settings, datastore records, secrets, and the data the emulator
    holds for its datastores (Azurite's, and local datastores' folders inside the home). A local
    datastore's folder outside the home is the user's own and stays."""
    root = emu.home.root
    gone = []
    for spec in emu.store.datastores():
        folder = Path(spec.get("folder") or "/nonexistent")
        if spec.get("kind") == "local" and folder.is_relative_to(root) and folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            gone.append(f"data of datastore {spec['name']}")
    if emu.datastores.azurite.stop():
        gone.append("Azurite server")
    for sub, what in (("azurite", "Azurite's data"), ("datastores", "datastore folders"), ("secrets", "secrets")):
        if (root / sub).exists():
            shutil.rmtree(root / sub, ignore_errors=True)
            gone.append(what)
    records = len(emu.store.datastores())
    emu.store.reset(keep_data=False)
    return gone + [f"workspace settings and {records} datastore record(s)"]


def _report(gone: list[str]) -> None:
    console.print(f"removed {len(gone)} item(s)" + "".join(f"\n  {g}" for g in gone), highlight=False)


@cli.command()
@click.option("--all", "everything", is_flag=True,
              help="also forget the workspace: its settings, datastore records, secrets and the data the emulator "
                   "holds for them (a local datastore's own folder outside the home is left alone)")
@click.option("--all-homes", is_flag=True, help="also the nodes and networks other emulator homes left behind")
@click.option("--reset-state", is_flag=True,
              help="then move the state database aside (kept as amlemu.db.broken-<time>) and start afresh: the "
                   "way out of a corrupt database or one written by a newer amlemu")
@click.pass_context
@handle_errors
def cleanup(ctx: click.Context, everything: bool, all_homes: bool, reset_state: bool) -> None:
    """Stop every job and remove every node, network and run the emulator created.

    The workspace and its datastores persist, as a real workspace's do: their settings, records,
    secrets and data stay for the next job. --all removes them too.
    """
    gone: list[str] = []
    try:
        emu = ctx.obj()
    except StateDbError:
        gone += reap_without_state(ctx.obj.home(), all_homes)
        if not reset_state:
            _report(gone)
            raise
        emu = None
    if emu is not None:
        gone += emu.cleanup(all_homes=all_homes)
    if reset_state:
        if emu is not None:
            emu.store.close()
        gone.append(move_state_aside(ctx.obj.home()))
        emu = ctx.obj()
    if everything:
        gone += forget_data(emu)
    _report(gone)
