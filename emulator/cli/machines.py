"""`amlemu machine add|list|remove`: the Docker engines a home may place nodes on
(amlemu.machines; docs/machines.md)."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from amlemu.actions import execute
from amlemu.cli.common import (
    confirm,
    console,
    dry_run_option,
    emit,
    emulator_of,
    err_console,
    handle_errors,
    machine,
    name_argument,
    output_option,
    report,
    show_plan,
    yes_option,
)
from amlemu.machines import engines, registry
from amlemu.machines.address import check_address, check_ip, tls_files

GIB = 1 << 30
_tls_file = click.Path(dir_okay=False, resolve_path=True, path_type=Path)


@machine.command("add")
@click.argument("name")
@click.argument("address")
@click.option("--gpus", metavar="UUID[,UUID...]",
              help="the machine's GPUs by UUID, as `nvidia-smi -L` prints them there: Docker's engine API does "
                   "not list GPUs, so they are not read from the engine (local's are, from nvidia-smi)")
@click.option("--service-address", metavar="IP",
              help="this machine's address as that machine reaches it: the swarm's manager and the runs' "
                   "service link for its nodes (needed for clusters that span machines)")
@click.option("--advertise-address", metavar="IP",
              help="that machine's address as this one reaches it: it joins the swarm on it, and this machine's "
                   "firewall tells its nodes' traffic by it (needed for clusters that span machines)")
@click.option("--files", type=click.Choice([registry.SHARED, registry.SHIPPED]),
              help="shared: that engine sees this machine's files at their paths (an engine of this machine); "
                   "shipped: its nodes' disks, caches and environments are volumes there, filled through the "
                   "engine (another host). Default: shared for unix://, shipped for ssh:// and tcp://")
@click.option("--tls-ca", type=_tls_file, help="tcp:// only: the CA that signed the engine's certificate")
@click.option("--tls-cert", type=_tls_file, help="tcp:// only: this client's certificate")
@click.option("--tls-key", type=_tls_file, help="tcp:// only: this client's key")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def machine_add(ctx: click.Context, name: str, address: str, gpus: str | None, service_address: str | None,
                advertise_address: str | None, files: str | None, tls_ca: Path | None, tls_cert: Path | None,
                tls_key: Path | None, dry_run: bool, output: str) -> None:
    """Add the Docker engine at ADDRESS as machine NAME. ADDRESS: unix:///path/docker.sock,
    ssh://user@host[:port] or tcp://host:port with --tls-ca/--tls-cert/--tls-key (plain tcp is
    refused). The engine is asked once for its cores and memory (`docker info`); one that does not
    answer is refused."""
    tls = tls_files(*(str(p) if p else None for p in (tls_ca, tls_cert, tls_key)))
    address = check_address(address, tls)
    uuids = engines.check_gpu_uuids(gpus)
    network = {"service_address": check_ip(service_address, "--service-address"),
               "advertise_address": check_ip(advertise_address, "--advertise-address"), "files": files or ""}
    store = emulator_of(ctx).store
    registry.check_new(store, name, address)
    with err_console.status(f"asking the engine at {address}"):
        found = replace(engines.read_machine(name, address, tls, uuids), **network)
        _notice_same_engine(store, found)
    plan = registry.plan_add(store, found)
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    emit(_data(found), output, lambda d: console.print(
        f"added machine {d['name']}: {d['address']}, {_facts(d)}", highlight=False))


def _notice_same_engine(store: Any, found: registry.Machine) -> None:
    """The same engine under two names would count its cores twice when nodes are placed."""
    if not found.engine_id:
        return
    local = engines.local_machine()
    same = [m.name for m in registry.stored(store) if m.engine_id == found.engine_id]
    if engines.engine_id(local.address) == found.engine_id:
        same.insert(0, local.name)
    if same:
        err_console.print(f"notice: {found.address} is the engine of machine {', '.join(same)} too: nodes placed "
                          f"on both share its {found.cores:g} cores", highlight=False)


def _data(m: registry.Machine) -> dict[str, Any]:
    return {**m.to_dict(), "files": registry.SHIPPED if m.ships_files else registry.SHARED}  # as it applies


def _facts(d: dict[str, Any]) -> str:
    gpus = f", {len(d['gpus'])} GPU(s)" if d["gpus"] else ", no GPUs"
    return f"{d['cores']:g} cores, {d['memory_bytes'] / GIB:.1f} GiB{gpus}"


@machine.command("list")
@output_option
@click.pass_context
@handle_errors
def machine_list(ctx: click.Context, output: str) -> None:
    """The home's machines: local (this machine, always there) first, then those added."""
    found = registry.machines(emulator_of(ctx).store, engines.local_machine)

    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "address", "cores", "memory", "GPUs", "files", "added")
        for d in data:
            added = time.strftime("%Y-%m-%d %H:%M", time.localtime(d["added"])) if d["added"] else "-"
            table.add_row(d["name"], d["address"], f"{d['cores']:g}", f"{d['memory_bytes'] / GIB:.1f} GiB",
                          str(len(d["gpus"])), d["files"], added)
        console.print(table)
    emit([_data(m) for m in found], output, human)


@machine.command("remove")
@name_argument("machine")
@yes_option
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def machine_remove(ctx: click.Context, name: str, yes: bool, dry_run: bool, output: str) -> None:
    """Forget a machine (nothing on its engine is touched). Refused for local, and for a machine a
    compute still places its nodes on (delete that compute first)."""
    emu = emulator_of(ctx)
    used_by = [c.spec.name for c in emu.computes() if name in c.spec.machines]
    plan = registry.plan_remove(emu.store, name, used_by)
    if dry_run:
        show_plan(plan, output)
        return
    confirm(yes, f"machine {name} will be forgotten")
    report(execute(plan), output, lambda _: console.print(f"removed machine {name}", highlight=False))

