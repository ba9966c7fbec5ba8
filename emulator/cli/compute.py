"""`amlemu compute create|list|show|delete`: AmlCompute clusters, on either target."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from emulator import safeyaml
from emulator.actions import execute
from emulator.backends import BACKENDS
from emulator.cli.common import (
    _target,
    compute,
    compute_from_dict,
    console,
    dry_run_option,
    emit,
    err_console,
    handle_errors,
    output_option,
    report,
    show_plan,
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
    _show_compute(target.show_compute(spec.name), output)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


@compute.command("list")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_list(ctx: click.Context, target_name: str | None, output: str) -> None:
    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "size", "tier", "nodes (busy/idle)", "min", "max", "backend")
        for d in data:
            table.add_row(d["name"], d["vm_size"], d["vm_priority"], f"{_count(d['busy'])}/{_count(d['idle'])}",
                          _count(d["min_nodes"]), _count(d["max_nodes"]), d["backend"])
        console.print(table)
    emit(_target(ctx, target_name).list_computes(), output, human)


@compute.command("show")
@click.argument("name")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_show(ctx: click.Context, name: str, target_name: str | None, output: str) -> None:
    _show_compute(_target(ctx, target_name).show_compute(name), output)


def _show_compute(data: dict[str, Any], output: str) -> None:
    def human(d: dict[str, Any]) -> None:
        console.print(f"{d['name']}: {d['vm_size']}, {d['vm_priority']}, {_count(d['min_nodes'])}-"
                      f"{_count(d['max_nodes'])} nodes, scale down after {_count(d['idle_seconds_before_scaledown'])} s "
                      f"idle ({d['backend']})", highlight=False)
        for n in d["nodes"]:
            console.print(f"  {n['name']}  {n['state']}  {n['address'] or ''}  {n['run'] or ''}", highlight=False)
    emit(data, output, human)


@compute.command("delete")
@click.argument("name")
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_delete(ctx: click.Context, name: str, dry_run: bool, target_name: str | None, output: str) -> None:
    """Remove the compute: its nodes, network, records and folders."""
    target = _target(ctx, target_name)
    plan = target.plan_delete_compute(name)
    if dry_run:
        show_plan(plan, output)
        return
    with err_console.status(f"deleting {name}"):
        done = execute(plan)
    report(done, output, lambda _: console.print(f"deleted compute {name}", highlight=False))
