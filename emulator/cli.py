"""`amlemu`: the command line, with verbs shaped after `az ml` (compute, job, workspace)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from . import safeyaml
from .api import Emulator, Run
from .cli_support import EmulatorFactory, OneLineGroup, handle_errors
from .errors import ConfigError
from .specs import ClusterSpec, Priority
from .targets import TARGETS, Target, get_target, resolve_target

console = Console(soft_wrap=True)  # paths and ids must survive copy-paste unbroken
err_console = Console(stderr=True, soft_wrap=True)

COMPUTE_FIELDS = {"$schema", "name", "type", "size", "min_instances", "max_instances",
                  "idle_time_before_scale_down", "tier", "description", "location", "identity"}


def compute_from_dict(data: dict[str, Any]) -> ClusterSpec:
    """The `az ml compute create -f` YAML (v2 names) -> ClusterSpec."""
    if not isinstance(data, dict):
        raise ConfigError("compute", "the YAML must be a mapping of compute fields", "see `az ml compute create -f`")
    unknown = sorted(set(data) - COMPUTE_FIELDS)
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"known fields: {', '.join(sorted(COMPUTE_FIELDS))}")
    if str(data.get("type", "amlcompute")).lower() != "amlcompute":
        raise ConfigError("type", f"'{data['type']}' is not emulated", "use type: amlcompute")
    if "name" not in data:
        raise ConfigError("name", "missing", "give the compute a name")
    return ClusterSpec(
        name=str(data["name"]), vm_size=str(data.get("size", "Standard_D2_v2")),
        vm_priority=Priority.parse(str(data.get("tier", "dedicated"))),
        min_nodes=data.get("min_instances", 0), max_nodes=data.get("max_instances", 4),
        idle_seconds_before_scaledown=data.get("idle_time_before_scale_down", 120))


def emit(data: Any, output: str, human) -> None:  # type: ignore[no-untyped-def]
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human(data)


output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                             show_default=True, help="json for scripts")


@click.group(cls=OneLineGroup)
@click.option("--home", envvar="AMLEMU_HOME", type=click.Path(path_type=Path), default=None,
              help="emulator home (the emulated workspace); default $AMLEMU_HOME or ~/.amlemu, created on "
                   "first use; a --home folder must exist already")
@click.pass_context
def cli(ctx: click.Context, home: Path | None) -> None:
    """amlemu: an Azure ML Compute cluster on this machine."""
    ctx.obj = EmulatorFactory(home, ctx.get_parameter_source("home"))


def _emu(ctx: click.Context, backend: str | None = None) -> Emulator:
    return ctx.obj(backend=backend)


target_option = click.option("--target", "target_name", type=click.Choice(list(TARGETS)), default=None,
                             help="where it goes: emulator or azureml (default: $AMLEMU_TARGET, else "
                                  "[tool.amlemu] target in pyproject.toml, else emulator)")


def _target(ctx: click.Context, explicit: str | None, backend: str | None = None) -> Target:
    name, _ = resolve_target(explicit, os.environ, Path.cwd())
    if name == "emulator":
        return get_target(name, emulator=_emu(ctx, backend))
    return get_target(name)


# --- workspace -----------------------------------------------------------------------------------
@cli.group()
def workspace() -> None:
    """The emulated workspace (placeholders for subscription, resource group, name)."""


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


# --- compute -------------------------------------------------------------------------------------
@cli.group()
def compute() -> None:
    """AmlCompute clusters."""


@compute.command("create")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), help="compute YAML (az ml schema)")
@click.option("--name")
@click.option("--size", default="Standard_D2_v2", show_default=True, help="Azure VM size")
@click.option("--min-instances", type=int, default=0, show_default=True)
@click.option("--max-instances", type=int, default=4, show_default=True)
@click.option("--idle-time-before-scale-down", type=int, default=120, show_default=True, help="seconds")
@click.option("--tier", default="dedicated", show_default=True, help="dedicated | low_priority")
@click.option("--backend", type=click.Choice(["auto", "docker", "process"]), default=None,
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


# --- jobs ----------------------------------------------------------------------------------------
@cli.group()
def job() -> None:
    """Jobs (runs) on the emulated clusters."""


def _run_data(run: Run) -> dict[str, Any]:
    record = run.record
    return {"name": run.id, "experiment": record.experiment, "compute": record.cluster,
            "status": record.status.value, "error": record.error, "outputs": str(run.outputs),
            "logs": str(run.dir / "user_logs"),
            "history": [{"time": ts, "status": st.value, "detail": d} for ts, st, d in run.events()]}


@job.command("create")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), required=True, help="job YAML (CLI v2)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="override a field of the YAML, as az ml does (e.g. inputs.data.path=./data)")
@click.option("--stream", is_flag=True, help="stream rank 0's log until the job ends")
@click.option("--dry-run", is_flag=True,
              help="print what would run (emulator: nodes, launch command, environment; azureml: the REST "
                   "request) and run nothing")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_create(ctx: click.Context, file: Path, overrides: tuple[str, ...], stream: bool, dry_run: bool,
               target_name: str | None, output: str) -> None:
    target = _target(ctx, target_name)
    plan = target.plan_job(file, list(overrides))
    if dry_run:
        click.echo(json.dumps(plan.data, indent=2, default=str))
        return
    notes = {n.get("image_note") for n in plan.data.get("nodes", [])} - {None}
    notes |= {("AmlCompute would refuse this job: " if f["severity"] == "error" else "") +
              f"{f['field']}: {f['problem']}; {f['fix']}" for f in plan.data.get("findings", [])}
    for note in sorted(notes):
        err_console.print(f"notice: {note}", highlight=False)
    name = target.run_job(plan)
    if stream:
        status = target.stream(name)
        if target.name == "emulator":
            _print_metrics(_emu(ctx).run(name))
        sys.exit(0 if status == "Completed" else 1)
    if target.name != "emulator":
        emit({"name": name, "target": target.name, "status": target.status(name)}, output, lambda d: console.print(
            f"submitted {d['name']} to {target.name} (status {d['status']}); follow it with: "
            f"amlemu job stream --target {target.name} {d['name']}", highlight=False))
        return
    emit(_run_data(_emu(ctx).run(name)), output, lambda d: console.print(
        f"submitted {d['name']} to {d['compute']} (status {d['status']}); "
        f"follow it with: amlemu job stream {d['name']}", highlight=False))


def _print_metrics(run: Run) -> None:
    metrics = run.metrics()
    if metrics:
        console.print("Metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())), highlight=False)


@job.command("list")
@click.option("--experiment", default=None, help="only this experiment's jobs")
@output_option
@click.pass_context
@handle_errors
def job_list(ctx: click.Context, experiment: str | None, output: str) -> None:
    emu = _emu(ctx)
    emu.reconcile()
    rows = [_run_data(r) for r in emu.runs(experiment)]

    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "experiment", "compute", "status")
        for d in data:
            table.add_row(d["name"], d["experiment"], d["compute"], d["status"])
        console.print(table)
    emit([{k: v for k, v in r.items() if k != "history"} for r in rows], output, human)


@job.command("show")
@click.argument("name")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_show(ctx: click.Context, name: str, target_name: str | None, output: str) -> None:
    target = _target(ctx, target_name)
    if target.name != "emulator":
        emit(target.show(name), output, lambda d: [console.print(f"{k}: {v}", highlight=False, markup=False)
                                                   for k, v in d.items()])
        return
    emu = _emu(ctx)
    emu.reconcile()
    run = emu.run(name)
    plot = run.plot_path
    data = {**_run_data(run), "metrics": run.metrics(), "plot": str(plot) if plot else None}

    def human(d: dict[str, Any]) -> None:
        console.print(f"{d['name']} ({d['experiment']}) on {d['compute']}: {d['status']}", highlight=False)
        if d["error"]:
            console.print(f"error: {d['error']}", highlight=False, markup=False)
        first = d["history"][0]["time"] if d["history"] else 0
        for h in d["history"]:
            console.print(f"  +{h['time'] - first:7.2f}s  {h['status']:<16} {h['detail'].splitlines()[0] if h['detail'] else ''}",
                          highlight=False, markup=False)
        for k, v in sorted(d["metrics"].items()):
            console.print(f"  {k} = {v:.6g}", highlight=False)
        console.print(f"outputs: {d['outputs']}\nlogs: {d['logs']}", highlight=False)
        if d["plot"]:
            console.print(f"plot: {d['plot']}", highlight=False)
    emit(data, output, human)


@job.command("stream")
@click.argument("name")
@target_option
@click.pass_context
@handle_errors
def job_stream(ctx: click.Context, name: str, target_name: str | None) -> None:
    target = _target(ctx, target_name)
    status = target.stream(name)
    if target.name == "emulator":
        _print_metrics(_emu(ctx).run(name))
    sys.exit(0 if status == "Completed" else 1)


@job.command("cancel")
@click.argument("name")
@target_option
@click.pass_context
@handle_errors
def job_cancel(ctx: click.Context, name: str, target_name: str | None) -> None:
    console.print(f"{name}: {_target(ctx, target_name).cancel(name)}", highlight=False)


@job.command("download")
@click.argument("name")
@click.option("--download-path", type=click.Path(path_type=Path), default=Path("."), show_default=True)
@target_option
@click.pass_context
@handle_errors
def job_download(ctx: click.Context, name: str, download_path: Path, target_name: str | None) -> None:
    console.print(f"downloaded to {_target(ctx, target_name).download(name, download_path)}", highlight=False)


from . import cli_cleanup, cli_convert, cli_data, cli_faults, cli_sync, cli_ui, cli_validate  # noqa: E402,F401 - register their commands on the groups above


def main() -> None:
    cli(prog_name="amlemu")
