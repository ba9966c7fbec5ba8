"""`amlemu workspace show|set|config`: the emulated workspace."""
from __future__ import annotations

from pathlib import Path

import click

from amlemu import servicefile
from amlemu.actions import execute
from amlemu.cli.common import (
    _emu,
    console,
    dry_run_option,
    emit,
    handle_errors,
    output_option,
    report,
    show_plan,
    workspace,
)

# --- workspace -----------------------------------------------------------------------------------


@workspace.command("show", workspace_aliases=("-n", "--name"))
@output_option
@click.pass_context
@handle_errors
def workspace_show(ctx: click.Context, output: str) -> None:
    """The emulated workspace (-n/-w, -g, --subscription: exit 3 unless they name it, as az's show),
    and its Azure ML service (`amlemu serve`): its URL, or "not running"."""
    emu = _emu(ctx)
    running = servicefile.read_state(emu.home.root)
    data = {**emu.workspace(), "home": str(emu.home.root),
            "service": f"{running.url} (pid {running.pid})" if running else "not running"}
    emit(data, output, lambda d: [console.print(f"{k}: {v}", highlight=False) for k, v in d.items()])


@workspace.command("set")
@click.option("--name", "workspace_name", help="the new workspace name")
@click.option("--subscription-id", help="the new subscription id")
@click.option("--resource-group", help="the new resource group")
@click.option("--location", help="the new location")
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def workspace_set(ctx: click.Context, dry_run: bool, output: str, **values: str | None) -> None:
    """Change the emulated workspace's placeholders (what config.json and the jobs' AZUREML_ARM_*
    variables say); -w and --subscription, as everywhere, name the workspace as it is now."""
    store = _emu(ctx).store
    plan = store.plan_set_workspace(**{k: v for k, v in values.items() if v})
    if dry_run:
        show_plan(plan, output)
        return
    report(execute(plan), output, lambda _: console.print(
        f"workspace {store.workspace()['workspace_name']} updated", highlight=False))


@workspace.command("config")
@click.option("--path", type=click.Path(path_type=Path), default=Path("config.json"), show_default=True)
@dry_run_option
@output_option
@click.pass_context
@handle_errors
def workspace_config(ctx: click.Context, path: Path, dry_run: bool, output: str) -> None:
    """Write config.json for Workspace.from_config() / MLClient.from_config()."""
    plan = _emu(ctx).plan_write_config(path)
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    report([str(path)], output, lambda done: console.print(f"wrote {done[0]}", highlight=False))
