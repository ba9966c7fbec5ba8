"""`amlemu workspace show|set|config`: the emulated workspace."""
from __future__ import annotations

from pathlib import Path

import click

from emulator.cli.common import _emu, console, emit, handle_errors, output_option, workspace

# --- workspace -----------------------------------------------------------------------------------


@workspace.command("show")
@output_option
@click.pass_context
@handle_errors
def workspace_show(ctx: click.Context, output: str) -> None:
    emu = _emu(ctx)
    data = {**emu.workspace(), "home": str(emu.home.root)}
    emit(data, output, lambda d: [console.print(f"{k}: {v}", highlight=False) for k, v in d.items()])


@workspace.command("set")
@click.option("--name", "workspace_name")
@click.option("--subscription-id")
@click.option("--resource-group")
@click.option("--location")
@click.pass_context
@handle_errors
def workspace_set(ctx: click.Context, **values: str | None) -> None:
    ws = _emu(ctx).store.set_workspace(**{k: v for k, v in values.items() if v})
    console.print(f"workspace {ws['workspace_name']} updated", highlight=False)


@workspace.command("config")
@click.option("--path", type=click.Path(path_type=Path), default=Path("config.json"), show_default=True)
@click.pass_context
@handle_errors
def workspace_config(ctx: click.Context, path: Path) -> None:
    """Write config.json for Workspace.from_config() / MLClient.from_config()."""
    console.print(f"wrote {_emu(ctx).write_config(path)}", highlight=False)
