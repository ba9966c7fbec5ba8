"""`amlemu workspace show|set|config`: the emulated workspace."""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import click

from amlemu import servicefile, servicekeys
from amlemu.actions import execute
from amlemu.cli.common import (
    console,
    dry_run_option,
    emit,
    emulator_of,
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
    emu = emulator_of(ctx)
    running = servicefile.read_state(emu.home.root)
    data = {**emu.workspace(), "home": str(emu.home.root),
            "service": f"{running.url} (pid {running.pid})" if running else "not running"}
    if running:
        data["service_health"] = _service_health(emu.home.root, running)
    emit(data, output, lambda d: [console.print(f"{k}: {v}", highlight=False) for k, v in d.items()])


def _service_health(root: Path, running: servicefile.ServiceState) -> str:
    """What the service's health route (emulator/service/health.py) says, in a line: "ok", or each
    component that cannot serve. Asked over loopback with a short token made from the home's key."""
    folder = servicefile.service_dir(root)
    try:
        key = bytes.fromhex(json.loads((folder / "secrets.json").read_text())["key"])
        token, _ = servicekeys.encode(key, 60)
        request = urllib.request.Request(f"https://127.0.0.1:{running.port}/amlemu/health",
                                         headers={"Authorization": f"Bearer {token}"})
        context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
        try:
            with urllib.request.urlopen(request, context=context, timeout=15) as reply:  # noqa: S310 - https only
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:  # 503: degraded, and the body says what
            body = json.loads(exc.read())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"not answering ({type(exc).__name__}: {exc})"
    failed = {k: v for k, v in (body.get("components") or {}).items() if v != "ok"}
    return "ok" if not failed else "; ".join(f"{k}: {v}" for k, v in failed.items())


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
    store = emulator_of(ctx).store
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
    plan = emulator_of(ctx).plan_write_config(path)
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    report([str(path)], output, lambda done: console.print(f"wrote {done[0]}", highlight=False))
