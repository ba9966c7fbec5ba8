"""`amlemu job create|list|show|stream|cancel|download`: jobs on either target, through the Target
interface (emulator/targets/base.py) alone."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from emulator.actions import execute
from emulator.cli.common import (
    _target,
    console,
    dry_run_option,
    emit,
    err_console,
    handle_errors,
    job,
    output_option,
    report,
    show_plan,
    target_flag,
    target_option,
)


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
        _print_metrics(target.metrics(name))
        sys.exit(0 if status == "Completed" else 1)
    flag = target_flag(target_name)
    emit(target.show(name), output, lambda d: console.print(
        f"submitted {d['name']} to {d['compute']} on {target.name} (status {d['status']}); "
        f"follow it with: amlemu job stream{flag} {d['name']}", highlight=False))


def _print_metrics(metrics: dict[str, float]) -> None:
    if metrics:
        console.print("Metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())), highlight=False)


@job.command("list")
@click.option("--experiment", default=None, help="only this experiment's jobs")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_list(ctx: click.Context, experiment: str | None, target_name: str | None, output: str) -> None:
    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "experiment", "compute", "status")
        for d in data:
            table.add_row(d["name"], d["experiment"], d["compute"], d["status"])
        console.print(table)
    emit(_target(ctx, target_name).list_jobs(experiment), output, human)


@job.command("show")
@click.argument("name")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_show(ctx: click.Context, name: str, target_name: str | None, output: str) -> None:
    def human(d: dict[str, Any]) -> None:
        console.print(f"{d['name']} ({d['experiment']}) on {d['compute']}: {d['status']}", highlight=False)
        if d.get("error"):
            console.print(f"error: {d['error']}", highlight=False, markup=False)
        history = d.get("history") or []
        for h in history:
            detail = h["detail"].splitlines()[0] if h["detail"] else ""
            console.print(f"  +{h['time'] - history[0]['time']:7.2f}s  {h['status']:<16} {detail}",
                          highlight=False, markup=False)
        for k, v in sorted((d.get("metrics") or {}).items()):
            console.print(f"  {k} = {v:.6g}", highlight=False)
        known = ("name", "experiment", "compute", "status", "error", "history", "metrics")
        for key, value in d.items():  # outputs, logs, plot; a target's own fields (studio_url)
            if key not in known and value is not None:
                console.print(f"{key}: {value}", highlight=False, markup=False)
    emit(_target(ctx, target_name).show(name), output, human)


@job.command("stream")
@click.argument("name")
@target_option
@click.pass_context
@handle_errors
def job_stream(ctx: click.Context, name: str, target_name: str | None) -> None:
    target = _target(ctx, target_name)
    status = target.stream(name)
    _print_metrics(target.metrics(name))
    sys.exit(0 if status == "Completed" else 1)


@job.command("cancel")
@click.argument("name")
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def job_cancel(ctx: click.Context, name: str, dry_run: bool, target_name: str | None, output: str) -> None:
    target = _target(ctx, target_name)
    plan = target.plan_cancel(name)
    if dry_run:
        show_plan(plan, output)
        return
    status = target.cancel(name)  # that plan, carried out
    emit({"name": name, "status": status}, output, lambda d: console.print(f"{name}: {status}", highlight=False))


@job.command("download")
@click.argument("name")
@click.option("--download-path", type=click.Path(path_type=Path), default=Path("."), show_default=True)
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def job_download(ctx: click.Context, name: str, download_path: Path, dry_run: bool, target_name: str | None,
                 output: str) -> None:
    """Copy the job's outputs and logs to <download-path>/<name>."""
    target = _target(ctx, target_name)
    plan = target.plan_download(name, download_path)
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    report([str(download_path / name)], output, lambda d: console.print(f"downloaded to {d[0]}", highlight=False))
