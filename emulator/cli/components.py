"""`amlemu component create|list|show`: command components registered in the emulated workspace,
from az ml's component YAML, for pipeline steps' `component: azureml:<name>:<version>` / `@latest`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from amlemu import safeyaml
from amlemu.actions import Action
from amlemu.cli.common import (
    apply_overrides,
    cli,
    console,
    dry_run_option,
    emit,
    emulator_of,
    handle_errors,
    output_option,
    show_plan,
)
from amlemu.errors import ConfigError
from amlemu.pipelines.component import component_from_dict
from amlemu.pipelines.registry import Components


@cli.group()
def component() -> None:
    """Command components (az ml's component YAML), for pipeline steps' azureml:<name>:<version> or @latest."""


def _registry(ctx: click.Context) -> Components:
    return Components(emulator_of(ctx).store)


def _shown(ctx: click.Context, record: dict[str, Any]) -> dict[str, Any]:
    """az ml's fields (id, name, version, type, inputs, outputs, command, ...); the folder its
    relative paths started from left out."""
    ws = emulator_of(ctx).workspace()
    arm = (f"/subscriptions/{ws['subscription_id']}/resourceGroups/{ws['resource_group']}/providers/"
           f"Microsoft.MachineLearningServices/workspaces/{ws['workspace_name']}")
    return {"id": f"{arm}/components/{record['name']}/versions/{record['version']}",
            **{k: v for k, v in record.items() if k != "base_dir"}}


def _human(d: dict[str, Any]) -> None:
    for key in ("name", "version", "display_name", "description", "is_deterministic", "code", "environment",
                "command"):
        if d.get(key) not in (None, ""):
            console.print(f"{key}: {d[key]}", highlight=False, markup=False)
    for key in ("inputs", "outputs"):
        ports = d.get(key) or {}
        shown = [f"{n} ({p.get('type')}{', optional' if p.get('optional') else ''})" for n, p in ports.items()]
        console.print(f"{key}: {', '.join(shown) or 'none'}", highlight=False, markup=False)


def _table(rows: list[dict[str, Any]]) -> None:
    table = Table("name", "version", "display_name", "inputs", "outputs")
    for d in rows:
        table.add_row(d["name"], d["version"], d.get("display_name") or "", ", ".join(d.get("inputs") or {}),
                      ", ".join(d.get("outputs") or {}))
    console.print(table)


@component.command("create")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="command component YAML (az ml's: name, version, inputs, outputs, command, code, environment)")
@click.option("-n", "--name", default=None, help="the component's name (over the YAML's)")
@click.option("-v", "--version", default=None, help="its version (over the YAML's; else the next integer)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE", help="set a field of the YAML first")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def component_create(ctx: click.Context, file: Path, name: str | None, version: str | None,
                     overrides: tuple[str, ...], dry_run: bool, output: str) -> None:
    """Register a command component (its code folder is read from where it is when a step runs)."""
    data = safeyaml.load_file(file, "-f", "component YAML")
    if not isinstance(data, dict):
        raise ConfigError("-f", "the component YAML must be a mapping of fields", "write name:, type: command, "
                          "command:, environment: ...")
    data = apply_overrides(data, list(overrides))
    data.update({k: v for k, v in (("name", name), ("version", version)) if v is not None})
    spec = component_from_dict(data, base_dir=file.parent)
    registry = _registry(ctx)
    if dry_run:
        planned = registry.plan(spec)
        show_plan([Action("register", "component", planned["name"],
                          {"version": planned["version"], "code": planned.get("code") or "none",
                           "environment": planned["environment"] if isinstance(planned["environment"], str)
                           else "inline"})], output)
        return
    emit(_shown(ctx, registry.create(spec)), output, _human)


@component.command("list")
@click.option("-n", "--name", default=None, help="every version of this component (default: each one's latest)")
@output_option
@click.pass_context
@handle_errors
def component_list(ctx: click.Context, name: str | None, output: str) -> None:
    emit([_shown(ctx, r) for r in _registry(ctx).list(name)], output, _table)


@component.command("show")
@click.option("-n", "--name", required=True, help="the component's name")
@click.option("-v", "--version", default=None, help="this version (default: the latest)")
@click.option("-l", "--label", type=click.Choice(["latest"]), default=None, help="latest: the newest version")
@output_option
@click.pass_context
@handle_errors
def component_show(ctx: click.Context, name: str, version: str | None, label: str | None, output: str) -> None:
    if version and label:
        raise click.UsageError("give --version or --label, not both")
    emit(_shown(ctx, _registry(ctx).get(name, version)), output, _human)
