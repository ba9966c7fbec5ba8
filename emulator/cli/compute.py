"""`amlemu compute create|list|show|delete`: AmlCompute clusters."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from emulator import safeyaml
from emulator.api import Emulator
from emulator.backends import BACKENDS
from emulator.cli.common import (
    _emu,
    _target,
    compute,
    compute_from_dict,
    console,
    emit,
    err_console,
    handle_errors,
    output_option,
    target_option,
)
from emulator.errors import ConfigError

# --- compute -------------------------------------------------------------------------------------


@compute.command("create")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), help="compute YAML (az ml schema)")
@click.option("--name")
@click.option("--size", default="Standard_D2_v2", show_default=True, help="Azure VM size")
@click.option("--min-instances", type=int, default=0, show_default=True)
@click.option("--max-instances", type=int, default=4, show_default=True)
@click.option("--idle-time-before-scale-down", type=int, default=120, show_default=True, help="seconds")
@click.option("--tier", default="dedicated", show_default=True, help="dedicated | low_priority")
@click.option("--backend", type=click.Choice(["auto", *BACKENDS]), default=None,
              help="how nodes are made (default $AMLEMU_BACKEND or auto)")
@click.option("--dry-run", is_flag=True, help="print what would be created (or sent), create nothing")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_create(ctx: click.Context, file: Path | None, name: str | None, size: str, min_instances: int,
                   max_instances: int, idle_time_before_scale_down: int, tier: str, backend: str | None,
                   dry_run: bool, target_name: str | None, output: str) -> None:
    if file:
        spec = compute_from_dict(safeyaml.load_file(file, "-f", "compute YAML") or {})
    else:
        if not name:
            raise ConfigError("--name", "missing", "give --name or -f compute.yml")
        spec = compute_from_dict({"name": name, "size": size, "min_instances": min_instances,
                                  "max_instances": max_instances, "tier": tier,
                                  "idle_time_before_scale_down": idle_time_before_scale_down})
    target = _target(ctx, target_name, backend)
    plan = target.plan_compute(spec)
    if plan.data.get("notice"):
        err_console.print(f"notice: {plan.data['notice']}", highlight=False)
    if plan.data.get("backend_note"):
        err_console.print(plan.data["backend_note"], highlight=False)
    if dry_run:
        click.echo(json.dumps(plan.data, indent=2, default=str))
        return
    with err_console.status(f"creating {spec.name} on {target.name} ({spec.min_nodes} node(s) now)"):
        target.run_compute(plan)
    if target.name == "emulator":
        _show_compute(_emu(ctx), spec.name, output)
    else:
        console.print(f"created compute {spec.name} in {plan.data['workspace']['workspace_name']} "
                      f"({target.name})", highlight=False)


@compute.command("list")
@output_option
@click.pass_context
@handle_errors
def compute_list(ctx: click.Context, output: str) -> None:
    emu = _emu(ctx)
    rows = [_compute_data(emu, c.spec.name) for c in emu.computes()]

    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "size", "tier", "nodes (busy/idle)", "min", "max", "backend")
        for d in data:
            table.add_row(d["name"], d["vm_size"], d["vm_priority"], f"{d['busy']}/{d['idle']}",
                          str(d["min_nodes"]), str(d["max_nodes"]), d["backend"])
        console.print(table)
    emit(rows, output, human)


def _compute_data(emu: Emulator, name: str) -> dict[str, Any]:
    cluster = emu.compute(name)
    nodes = emu.store.nodes(name)
    return {**cluster.spec.__dict__, "vm_priority": cluster.spec.vm_priority.value, "backend": cluster.backend,
            "busy": sum(n.state == "busy" for n in nodes), "idle": sum(n.state == "idle" for n in nodes),
            "nodes": [{"name": n.name, "state": n.state, "run": n.run_id, "address": n.address} for n in nodes]}


@compute.command("show")
@click.argument("name")
@output_option
@click.pass_context
@handle_errors
def compute_show(ctx: click.Context, name: str, output: str) -> None:
    _show_compute(_emu(ctx), name, output)


def _show_compute(emu: Emulator, name: str, output: str) -> None:
    def human(d: dict[str, Any]) -> None:
        console.print(f"{d['name']}: {d['vm_size']}, {d['vm_priority']}, {d['min_nodes']}-{d['max_nodes']} "
                      f"nodes, scale down after {d['idle_seconds_before_scaledown']} s idle ({d['backend']})",
                      highlight=False)
        for n in d["nodes"]:
            console.print(f"  {n['name']}  {n['state']}  {n['address'] or ''}  {n['run'] or ''}", highlight=False)
    emit(_compute_data(emu, name), output, human)


@compute.command("delete")
@click.argument("name")
@click.pass_context
@handle_errors
def compute_delete(ctx: click.Context, name: str) -> None:
    _emu(ctx).delete_compute(name)
    console.print(f"deleted compute {name}", highlight=False)
