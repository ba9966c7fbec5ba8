"""`amlemu environment create|list|show`: environments registered in the emulated workspace, from
az ml's environment YAML (name, version, image, conda_file, build.path)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from amlemu.actions import Action, execute
from amlemu.cli.common import (
    console,
    dry_run_option,
    emit,
    emulator_of,
    environment,
    err_console,
    escaped,
    handle_errors,
    name_argument,
    output_option,
    show_plan,
)
from amlemu.envs.resolve import resolve
from amlemu.errors import AmlEmuError, NotFoundError
from amlemu.jobs.envyaml import load_environment
from amlemu.names import check_asset_name


def _described(spec: dict[str, Any]) -> dict[str, Any]:
    """The registered spec with what it resolves to: the Python and packages its jobs run with."""
    found = resolve(f"azureml:{spec['name']}:{spec['version']}", None, lambda n, v: spec)
    return {**spec, "python": found.python, "requirements": list(found.requirements), "notices": list(found.notices)}


def _human(d: dict[str, Any]) -> None:
    for key in ("name", "version", "image", "build_path", "python", "requirements", "description", "notices"):
        if d.get(key):
            value = ", ".join(d[key]) if isinstance(d[key], list) else d[key]
            console.print(f"{key}: {value}", highlight=False, markup=False)


@environment.command("create")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), required=True,
              help="environment YAML (az ml's: name, version, image, conda_file or build.path)")
@click.option("-n", "--name", default=None, help="the environment's name (over the YAML's)")
@click.option("--version", "version", default=None, help="its version (over the YAML's; else the next integer)")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def environment_create(ctx: click.Context, file: Path, name: str | None, version: str | None, dry_run: bool,
                       output: str) -> None:
    spec = load_environment(file, name, version)
    store = emulator_of(ctx).store
    plan = [Action("register", "environment", spec["name"], {"version": spec["version"] or "next",
                                                               "image": spec["image"], "build_path": spec["build_path"]},
                   run=lambda: store.add_environment(spec))]
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    emit(_described(store.environment(spec["name"], spec["version"]) or spec), output, _human)


@environment.command("list")
@output_option
@click.pass_context
@handle_errors
def environment_list(ctx: click.Context, output: str) -> None:
    rows = []
    for spec in emulator_of(ctx).store.environments():
        try:  # a record stored before names were checked must not hide every other one
            check_asset_name(spec.get("name"), "name")
            check_asset_name(spec.get("version"), "version", "version")
            rows.append(_described(spec))
        except AmlEmuError as exc:
            err_console.print(f"notice: skipped a stored environment record: {escaped(str(exc))}", highlight=False,
                              markup=False)

    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "version", "image", "python", "packages")
        for d in data:
            table.add_row(d["name"], d["version"], d["image"] or d["build_path"] or "", d["python"] or "",
                          str(len(d["requirements"])))
        console.print(table)
    emit(rows, output, human)


@environment.command("show")
@name_argument("environment")
@click.option("--version", "version", default=None, help="this version (default: the latest)")
@output_option
@click.pass_context
@handle_errors
def environment_show(ctx: click.Context, name: str, version: str | None, output: str) -> None:
    spec = emulator_of(ctx).store.environment(name, version)
    if spec is None:
        raise NotFoundError("environment", name + (f" version {version}" if version else ""),
                            "register it with `amlemu environment create -f env.yml`")
    emit(_described(spec), output, _human)
