"""`amlemu compute create|list|show|delete`: AmlCompute clusters, on either target."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table

from amlemu import safeyaml
from amlemu.actions import execute
from amlemu.backends import BACKENDS
from amlemu.cli.common import (
    apply_overrides,
    compute,
    compute_from_dict,
    confirm,
    console,
    dry_run_option,
    emit,
    err_console,
    handle_errors,
    name_argument,
    output_option,
    report,
    show_plan,
    target_of,
    target_option,
    yes_option,
)
from amlemu.errors import ConfigError

# The compute YAML field each of create's options sets, with the option's default.
FIELDS = {"name": ("name", None), "size": ("size", "Standard_D2_v2"), "min_instances": ("min_instances", 0),
          "max_instances": ("max_instances", 4), "tier": ("tier", "dedicated"), "compute_type": ("type", "amlcompute"),
          "idle_time_before_scale_down": ("idle_time_before_scale_down", 120)}


@compute.command("create", workspace="target")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), help="compute YAML (az ml schema)")
@click.option("-n", "--name", help="the compute's name (over the YAML's)")
@click.option("-t", "--type", "compute_type", default="amlcompute", show_default=True, help="only AmlCompute is emulated")
@click.option("--size", default="Standard_D2_v2", show_default=True, help="Azure VM size")
@click.option("--min-instances", type=int, default=0, show_default=True)
@click.option("--max-instances", type=int, default=4, show_default=True)
@click.option("-d", "--idle-time-before-scale-down", type=int, default=120, show_default=True, help="seconds")
@click.option("--tier", default="dedicated", show_default=True, help="dedicated | low_priority")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="set a field of the compute YAML, as az ml does (e.g. --set max_instances=2)")
@click.option("--backend", type=click.Choice(["auto", *BACKENDS]), default=None,
              help="how nodes are made (default $AMLEMU_BACKEND or auto)")
@click.option("--machines", metavar="NAME[,NAME...]|all",
              help="the machines (`amlemu machine list`) its nodes may be placed on; all: every machine known now "
                   "(default: this one only; the emulator target only)")
@click.option("--placement", type=click.Choice(["spread", "pack"]), default=None,
              help="with --machines: nodes spread over the machines (default) or packed onto the first ones")
@click.option("--dry-run", is_flag=True, help="print what would be created (or sent), create nothing")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_create(ctx: click.Context, file: Path | None, overrides: tuple[str, ...], backend: str | None,
                   machines: str | None, placement: str | None, dry_run: bool, target_name: str | None,
                   output: str, **options: Any) -> None:
    """Create an AmlCompute cluster from -f compute.yml and/or options (an option given, and then
    --set, override the YAML's field, as az ml does)."""
    data = (safeyaml.load_file(file, "-f", "compute YAML") or {}) if file else {}
    if not isinstance(data, dict):
        compute_from_dict(data)  # says what is wrong with it
    for option, (field, default) in FIELDS.items():
        given = ctx.get_parameter_source(option) is ParameterSource.COMMANDLINE
        if given or (not file and default is not None):
            data[field] = options[option]
    data = apply_overrides(data, list(overrides))
    if "name" not in data and not file:
        raise ConfigError("--name", "missing", "give --name or -f compute.yml")
    spec = compute_from_dict(data)
    target = target_of(ctx, target_name, backend)
    if machines is not None or placement is not None:  # the emulator's alone: a real target refuses them
        spec = replace(spec, machines=tuple(m.strip() for m in (machines or "").split(",") if m.strip()),
                       placement=placement or "spread")
    plan = target.plan_compute(spec)
    if plan.data.get("notice"):
        err_console.print(f"notice: {plan.data['notice']}", highlight=False)
    if plan.data.get("backend_note"):
        err_console.print(plan.data["backend_note"], highlight=False)
    if dry_run:
        emit(plan.data, output, lambda d: emit(d, "json"))
        return
    with err_console.status(f"creating {spec.name} on {target.name} ({spec.min_nodes} node(s) now)"):
        target.run_compute(plan)
    _show_compute(target.show_compute(spec.name), output)


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


@compute.command("list", workspace="target")
@click.option("-r", "--max-results", type=click.IntRange(min=1), default=None, help="at most this many")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_list(ctx: click.Context, max_results: int | None, target_name: str | None, output: str) -> None:
    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "size", "tier", "nodes (busy/idle)", "min", "max", "backend")
        for d in data:
            table.add_row(d["name"], d["vm_size"], d["vm_priority"], f"{_count(d['busy'])}/{_count(d['idle'])}",
                          _count(d["min_nodes"]), _count(d["max_nodes"]), d["backend"])
        console.print(table)
    emit(target_of(ctx, target_name).list_computes()[:max_results], output, human)


@compute.command("show", workspace="target")
@name_argument("compute")
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_show(ctx: click.Context, name: str, target_name: str | None, output: str) -> None:
    _show_compute(target_of(ctx, target_name).show_compute(name), output)


def _show_compute(data: dict[str, Any], output: str) -> None:
    def human(d: dict[str, Any]) -> None:
        console.print(f"{d['name']}: {d['vm_size']}, {d['vm_priority']}, {_count(d['min_nodes'])}-"
                      f"{_count(d['max_nodes'])} nodes, scale down after {_count(d['idle_seconds_before_scaledown'])} s "
                      f"idle ({d['backend']})", highlight=False)
        if d.get("machines"):
            console.print(f"  on machines {', '.join(d['machines'])} ({d['placement']})", highlight=False)
        for n in d["nodes"]:
            console.print(f"  {n['name']}  {n['state']}  {n['address'] or ''}  {n['run'] or ''}", highlight=False)
    emit(data, output, human)


@compute.command("delete", workspace="target")
@name_argument("compute")
@yes_option
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def compute_delete(ctx: click.Context, name: str, yes: bool, dry_run: bool, target_name: str | None,
                   output: str) -> None:
    """Remove the compute: its nodes, network, records and folders (asks first, unless --yes)."""
    target = target_of(ctx, target_name)
    plan = target.plan_delete_compute(name)
    if dry_run:
        show_plan(plan, output)
        return
    confirm(yes, f"compute {name} and its nodes will be deleted ({len(plan)} action(s); --dry-run lists them)")
    with err_console.status(f"deleting {name}"):
        done = execute(plan)
    report(done, output, lambda _: console.print(f"deleted compute {name}", highlight=False))
