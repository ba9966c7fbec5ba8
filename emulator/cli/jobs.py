"""`amlemu job create|list|show|stream|cancel|download`: jobs on either target, through the Target
interface (emulator/targets/base.py) alone."""
from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from amlemu.actions import execute
from amlemu.cli.common import (
    console,
    dry_run_option,
    emit,
    err_console,
    escaped,
    handle_errors,
    job,
    name_argument,
    output_option,
    report,
    show_plan,
    target_flag,
    target_of,
    target_option,
)

MAX_RESULTS = 50  # az ml job list's default


@job.command("create", workspace="target")
@click.option("-f", "--file", "file", type=click.Path(path_type=Path), required=True, help="job YAML (CLI v2)")
@click.option("-n", "--name", default=None, help="the job's name (instead of the YAML's name or a generated one)")
@click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
              help="override a field of the YAML, as az ml does (e.g. inputs.data.path=./data)")
@click.option("-s", "--stream", is_flag=True, help="stream rank 0's log until the job ends")
@click.option("--dry-run", is_flag=True,
              help="print what would run (emulator: nodes, launch command, environment; azureml: the REST "
                   "request) and run nothing")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_create(ctx: click.Context, file: Path, name: str | None, overrides: tuple[str, ...], stream: bool,
               dry_run: bool, target_name: str | None, output: str) -> None:
    target = target_of(ctx, target_name)
    plan = target.plan_job(file, [*overrides, *([f"name={name}"] if name else [])])
    if dry_run:
        emit(plan.data, output, _print_json)
        return
    notes = {n.get("image_note") for n in plan.data.get("nodes", [])} - {None}
    notes |= {n for n in plan.data.get("notices", []) if n.startswith("environment ")}  # what it runs in
    notes |= {n for n in plan.data.get("notices", []) if n.startswith(("inputs.", "code: "))}  # what it reads
    notes |= {("AmlCompute would refuse this job: " if f["severity"] == "error" else "") +
              f"{f['field']}: {f['problem']}; {f['fix']}" for f in plan.data.get("findings", [])}
    for note in sorted(notes):
        err_console.print(f"notice: {escaped(note)}", highlight=False, markup=False)  # a job's own text in it
    created = target.run_job(plan)
    if stream:
        status = target.stream(created)
        _print_metrics(target.metrics(created))
        sys.exit(0 if status == "Completed" else 1)
    flag = target_flag(target_name)
    emit(target.show(created), output, lambda d: console.print(
        f"submitted {d['name']} to {_compute(d)} on {target.name} (status {d['status']}); "
        f"follow it with: amlemu job stream{flag} -n {d['name']}", highlight=False))


def _print_trials(sweep: dict[str, Any]) -> None:
    """A sweep's trials: their values, primary metric and status, the best one marked."""
    metric = sweep.get("primary_metric", "metric")
    table = Table("trial", "values", metric, "status", "why")
    for t in sweep.get("trials") or []:
        best = " *" if t["name"] == sweep.get("best_child_run_id") else ""
        shown = "" if t.get("metric") is None else f"{t['metric']:.6g}"
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["values"].items())
        table.add_row(*(Text(escaped(str(cell))) for cell in (t["name"] + best, values, shown, t["status"],
                                                               t.get("reason") or "")))
    console.print(table)
    for line in [sweep.get("headline"), *(sweep.get("notes") or [])]:
        if line:
            console.print(line, highlight=False, markup=False)


def _print_steps(pipeline: dict[str, Any]) -> None:
    """A pipeline's steps in run order: each one's child job and status, and the run a reused step reused."""
    console.print(f"  {'step':<20} {'child job':<40} status", highlight=False)
    for s in pipeline.get("steps") or []:
        detail = f"  ({s['detail']})" if s.get("detail") else ""
        reused = f"  reused {s['reused_from']}" if s.get("reused_from") else ""
        console.print(f"  {s['step']:<20} {s.get('child_job') or '-':<40} {s['status']}{reused}{detail}",
                      highlight=False, markup=False)
    for name, uri in sorted((pipeline.get("outputs") or {}).items()):  # the pipeline's own, where a step wrote them
        console.print(f"  output {name}: {uri}", highlight=False, markup=False)


def _compute(job: dict[str, Any]) -> str:
    """The compute's name in az ml's Job shape (`azureml:<name>`; none: serverless)."""
    return str(job.get("compute") or "serverless").removeprefix("azureml:")


def _print_json(data: Any) -> None:
    emit(data, "json")


def _print_metrics(metrics: dict[str, float]) -> None:
    if metrics:
        console.print("Metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())), highlight=False)


@job.command("list", workspace="target")
@click.option("--experiment", default=None, help="only this experiment's jobs")
@click.option("-r", "--max-results", type=click.IntRange(min=1), default=MAX_RESULTS, show_default=True,
              help="at most this many: the most recent ones")
@click.option("--all-results", is_flag=True, help="every job (overrides --max-results)")
@click.option("-p", "--parent-job-name", "parent", default=None, metavar="PARENT", help="only this sweep's trials or pipeline's steps")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_list(ctx: click.Context, experiment: str | None, max_results: int, all_results: bool, parent: str | None,
             target_name: str | None, output: str) -> None:
    """The jobs, oldest first; the 50 most recent unless --max-results or --all-results says otherwise."""
    def human(data: list[dict[str, Any]]) -> None:
        table = Table("name", "experiment", "compute", "status")
        for d in data:
            table.add_row(d["name"], d.get("experiment_name"), _compute(d), d.get("status"))
        console.print(table)
    jobs = target_of(ctx, target_name).list_jobs(experiment, None if all_results else max_results + 1, parent=parent)
    if not all_results and len(jobs) > max_results:  # one more than asked: there are more
        jobs = jobs[1:]
        err_console.print(f"notice: the {max_results} most recent jobs; --max-results N or --all-results for more",
                          highlight=False)
    emit(jobs, output, human)


@job.command("show", workspace="target")
@name_argument("job")
@target_option
@output_option
@click.pass_context
@handle_errors
def job_show(ctx: click.Context, name: str, target_name: str | None, output: str) -> None:
    def human(d: dict[str, Any]) -> None:
        own = d.get("amlemu") or {}  # the emulator's facts; another target may have none
        console.print(f"{d['name']} ({d.get('experiment_name')}) on {_compute(d)}: {d.get('status')}", highlight=False)
        if own.get("error"):
            console.print(f"error: {own['error']}", highlight=False, markup=False)
        props = d.get("properties") or {}
        if props.get("azureml.isreused") == "true":  # a pipeline step that reused an earlier run's outputs
            console.print(f"reused: {props.get('azureml.reusedrunid')} (azureml.isreused: true; not run)",
                          highlight=False, markup=False)
        history = own.get("history") or []
        for h in history:
            detail = h["detail"].splitlines()[0] if h["detail"] else ""
            since = (datetime.fromisoformat(h["time"]) - datetime.fromisoformat(history[0]["time"])).total_seconds()
            console.print(f"  +{since:7.2f}s  {h['status']:<16} {detail}", highlight=False, markup=False)
        for k, v in sorted((own.get("metrics") or {}).items()):
            console.print(f"  {k} = {v:.6g}", highlight=False)
        if own.get("sweep"):
            _print_trials(own["sweep"])
        if own.get("pipeline"):
            _print_steps(own["pipeline"])
        studio = ((d.get("services") or {}).get("Studio") or {}).get("endpoint")
        for key, value in (("studio", studio), *((k, own.get(k)) for k in ("outputs", "logs", "plot"))):
            if value is not None:
                console.print(f"{key}: {value}", highlight=False, markup=False)
        for key, service in (d.get("services") or {}).items():  # the job's own (jupyter_lab, ...)
            if key not in ("Studio", "Tracking"):
                shown = " ".join(str(v) for v in (service.get("status") or "not started", service.get("endpoint"),
                                                  service.get("error_message")) if v)
                console.print(f"service {key} ({service.get('type')}): {shown}", highlight=False, markup=False)
    emit(target_of(ctx, target_name).show(name), output, human)


@job.command("stream", workspace="target")
@name_argument("job")
@target_option
@click.pass_context
@handle_errors
def job_stream(ctx: click.Context, name: str, target_name: str | None) -> None:
    """Print the job's log until it ends (a pipeline: each step's, headed by its name, as the steps
    start); exit 0 when it completed, 1 otherwise."""
    target = target_of(ctx, target_name)
    status = target.stream(name)
    _print_metrics(target.metrics(name))
    sys.exit(0 if status == "Completed" else 1)


@job.command("cancel", workspace="target")
@name_argument("job")
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def job_cancel(ctx: click.Context, name: str, dry_run: bool, target_name: str | None, output: str) -> None:
    """Cancel the job (no --yes: az ml job cancel does not ask either)."""
    target = target_of(ctx, target_name)
    plan = target.plan_cancel(name)
    if dry_run:
        show_plan(plan, output)
        return
    status = target.cancel(name)  # that plan, carried out
    emit({"name": name, "status": status}, output, lambda d: console.print(f"{name}: {status}", highlight=False))


@job.command("download", workspace="target")
@name_argument("job")
@click.option("-p", "--download-path", type=click.Path(path_type=Path), default=Path("."), show_default=True)
@click.option("--output-name", default=None, metavar="OUTPUT",
              help="only this named output of the job (`default`: its logs and default output)")
@click.option("--all", "everything", is_flag=True, help="the logs, the default output and every named output")
@dry_run_option
@target_option
@output_option
@click.pass_context
@handle_errors
def job_download(ctx: click.Context, name: str, download_path: Path, output_name: str | None, everything: bool,
                 dry_run: bool, target_name: str | None, output: str) -> None:
    """Copy the job's logs and default output (outputs/, logs/) to <download-path>/<name>; named
    outputs go to <download-path>/<name>/named-outputs/<output>. A pipeline's --output-name is one
    of its pipeline-level outputs; its --all adds each step's child job, as its own --all lays it out."""
    target = target_of(ctx, target_name)
    plan = target.plan_download(name, download_path, output_name, everything)
    if dry_run:
        show_plan(plan, output)
        return
    execute(plan)
    # a sweep's: its best trial's; a pipeline's with --all: its own and each step's child job's
    copied = [a.detail["to"] for a in plan if a.what == "run files"] or [str(download_path / name)]
    report(copied, output, lambda d: console.print(f"downloaded to {', '.join(d)}", highlight=False))
