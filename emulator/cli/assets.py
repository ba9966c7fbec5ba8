"""`amlemu data create|list|show|archive` and `amlemu model create|list|show`: data and model assets
as az ml registers them (its YAML and flags), for jobs' `azureml:<name>:<version>` / `@latest` inputs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from amlemu import safeyaml
from amlemu.actions import Action
from amlemu.cli.common import (
    console,
    data,
    dry_run_option,
    emit,
    emulator_of,
    handle_errors,
    model,
    output_option,
    show_plan,
)
from amlemu.errors import ConfigError
from amlemu.storage.assets import DATA_TYPES, MODEL_TYPES, asset_from_dict

ARM_KIND = {"data": "data", "model": "models"}


def _shown(ctx: click.Context, spec: dict[str, Any]) -> dict[str, Any]:
    """az ml's fields (id, name, version, type, path, ...) with amlemu's own: where it came from, archived."""
    ws = emulator_of(ctx).workspace()
    arm = (f"/subscriptions/{ws['subscription_id']}/resourceGroups/{ws['resource_group']}/providers/"
           f"Microsoft.MachineLearningServices/workspaces/{ws['workspace_name']}")
    return {"id": f"{arm}/{ARM_KIND[spec['kind']]}/{spec['name']}/versions/{spec['version']}",
            **{k: v for k, v in spec.items() if k != "kind"}}


def _human(d: dict[str, Any]) -> None:
    for key in ("name", "version", "type", "path", "source", "description", "stage", "archived"):
        if d.get(key) not in (None, "", False):
            console.print(f"{key}: {d[key]}", highlight=False, markup=False)


def _table(rows: list[dict[str, Any]]) -> None:
    table = Table("name", "version", "type", "path")
    for d in rows:
        table.add_row(d["name"], d["version"], d["type"], d["path"])
    console.print(table)


def _create(ctx: click.Context, kind: str, file: Path | None, flags: dict[str, Any], dry_run: bool,
            output: str) -> None:
    """Flags over the YAML's fields, as az ml's -n/-v/-p/-t override the file; a relative path in
    the YAML is relative to its folder, on the command line to the working directory."""
    loaded = safeyaml.load_file(file, "-f", f"{kind} YAML") if file else {}
    if not isinstance(loaded, dict):
        raise ConfigError("-f", f"the {kind} YAML must be a mapping of fields", "write name:, path:, type: ...")
    given = {k: v for k, v in flags.items() if v is not None}
    fields = {**loaded, **given}
    base = file.parent if file and "path" not in given else Path.cwd()
    spec = asset_from_dict(kind, fields, base_dir=base)
    assets = emulator_of(ctx).assets
    if dry_run:
        planned = assets.plan(spec)
        show_plan([Action("register", f"{kind} asset", spec["name"],
                          {"version": spec["version"] or "next", "type": spec["type"], "path": planned["path"],
                           **({"upload": spec["path"]} if planned["path"] != spec["path"] and
                              not spec["path"].startswith("azureml://") else {})})], output)
        return
    emit(_shown(ctx, assets.create(spec)), output, _human)


def _list(ctx: click.Context, kind: str, name: str | None, archived_only: bool, include_archived: bool,
          output: str) -> None:
    rows = emulator_of(ctx).assets.list(kind, name, archived=archived_only or include_archived)
    if archived_only:
        rows = [r for r in rows if r.get("archived")]
    emit([_shown(ctx, r) for r in rows], output, _table)


def _show(ctx: click.Context, kind: str, name: str, version: str | None, label: str | None, output: str) -> None:
    if version and label:
        raise click.UsageError("give --version or --label, not both")
    emit(_shown(ctx, emulator_of(ctx).assets.get(kind, name, version, label)), output, _human)


def _common(kind: str, types: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """az ml's create flags for data and model alike."""
    def decorate(fn):  # type: ignore[no-untyped-def]
        for option in reversed([
            click.option("-f", "--file", "file", type=click.Path(path_type=Path, dir_okay=False),
                         help=f"{kind} YAML (az ml's: name, version, type, path, description, tags)"),
            click.option("-n", "--name", default=None, help="the asset's name (over the YAML's)"),
            click.option("-v", "--version", default=None, help="its version (over the YAML's; else the next integer)"),
            click.option("-p", "--path", default=None, help="a local file or folder (uploaded to workspaceblobstore), "
                         "azureml://datastores/<ds>/paths/<p> or azureml://jobs/<job>/outputs/<name>"),
            click.option("-t", "--type", "type_", type=click.Choice(types), default=None, help="the asset's type"),
            click.option("-d", "--description", default=None),
        ]):
            fn = option(fn)
        return fn
    return decorate


def _flags(name: str | None, version: str | None, path: str | None, type_: str | None,
           description: str | None) -> dict[str, Any]:
    return {"name": name, "version": version, "path": path, "type": type_, "description": description}


@data.command("create")
@_common("data", DATA_TYPES)
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def data_create(ctx: click.Context, file: Path | None, name: str | None, version: str | None, path: str | None,
                type_: str | None, description: str | None, dry_run: bool, output: str) -> None:
    """Register a data asset (uri_file, uri_folder, mltable); a local path is uploaded first."""
    _create(ctx, "data", file, _flags(name, version, path, type_, description), dry_run, output)


@model.command("create")
@_common("model", MODEL_TYPES)
@click.option("--stage", default=None, help="the model's stage (Development, Production, ...)")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def model_create(ctx: click.Context, file: Path | None, name: str | None, version: str | None, path: str | None,
                 type_: str | None, description: str | None, stage: str | None, dry_run: bool, output: str) -> None:
    """Register a model (custom_model, mlflow_model, triton_model); a local path is uploaded first."""
    _create(ctx, "model", file, {**_flags(name, version, path, type_, description), "stage": stage}, dry_run, output)


def _list_options(fn):  # type: ignore[no-untyped-def]
    fn = click.option("--include-archived", is_flag=True, help="archived versions too")(fn)
    fn = click.option("--archived-only", is_flag=True, help="only archived versions")(fn)
    return click.option("-n", "--name", default=None, help="the versions of this asset")(fn)


def _show_options(fn):  # type: ignore[no-untyped-def]
    fn = click.option("-l", "--label", default=None, help="latest: the newest version not archived")(fn)
    fn = click.option("-v", "--version", default=None, help="this version (default: the latest)")(fn)
    return click.option("-n", "--name", required=True, help="the asset's name")(fn)


@data.command("list")
@_list_options
@output_option
@click.pass_context
@handle_errors
def data_list(ctx: click.Context, name: str | None, archived_only: bool, include_archived: bool, output: str) -> None:
    _list(ctx, "data", name, archived_only, include_archived, output)


@model.command("list")
@_list_options
@output_option
@click.pass_context
@handle_errors
def model_list(ctx: click.Context, name: str | None, archived_only: bool, include_archived: bool,
               output: str) -> None:
    _list(ctx, "model", name, archived_only, include_archived, output)


@data.command("show")
@_show_options
@output_option
@click.pass_context
@handle_errors
def data_show(ctx: click.Context, name: str, version: str | None, label: str | None, output: str) -> None:
    _show(ctx, "data", name, version, label, output)


@model.command("show")
@_show_options
@output_option
@click.pass_context
@handle_errors
def model_show(ctx: click.Context, name: str, version: str | None, label: str | None, output: str) -> None:
    _show(ctx, "model", name, version, label, output)


@data.command("archive")
@click.option("-n", "--name", required=True, help="the asset's name")
@click.option("-v", "--version", default=None, help="this version (default: every version)")
@click.option("-l", "--label", default=None, help="latest: the newest version")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def data_archive(ctx: click.Context, name: str, version: str | None, label: str | None, dry_run: bool,
                 output: str) -> None:
    """Hide a version (or all) from list and @latest; a job naming the version still reads it."""
    assets = emulator_of(ctx).assets
    if label:
        version = assets.get("data", name, None, label)["version"]
    if dry_run:
        show_plan([Action("archive", "data asset", f"{s['name']}:{s['version']}")
                   for s in assets.archive_targets("data", name, version)], output)
        return
    done = assets.archive("data", name, version)
    emit({"done": [f"{s['name']}:{s['version']}" for s in done]}, output,
         lambda d: console.print(f"archived {', '.join(d['done'])}", highlight=False, markup=False))
