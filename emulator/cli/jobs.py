"""`amlemu job create|list|show|stream|cancel|download`: jobs on either target."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from emulator.api import Run
from emulator.cli.common import (
    _emu,
    _target,
    console,
    emit,
    err_console,
    handle_errors,
    job,
    output_option,
    target_option,
)

# --- jobs ----------------------------------------------------------------------------------------


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
