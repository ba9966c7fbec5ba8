"""The studio's two pages as server-rendered HTML: the overview (computes and their nodes, jobs,
faults) and a job (status history, metric charts, each rank's log tail, files to download, the
launch plan with its secret values masked).

Every value goes through `esc`: a job wrote its logs, file names and metric names, and a job is
untrusted code. The pages carry no inline script or style (the Content-Security-Policy forbids
them); studio.js fills in and refreshes what the JSON endpoints return, drawing the charts.
"""
from __future__ import annotations

import html
import json
import time
from typing import Any
from urllib.parse import quote


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def status(value: str) -> str:
    return f'<span class="status s-{esc(value)}">{esc(value)}</span>'


def _table(table_id: str, heads: tuple[str, ...], rows: list[str], empty: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    body = "".join(rows) or f'<tr class="empty"><td colspan="{len(heads)}">{esc(empty)}</td></tr>'
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _page(base: str, title: str, attrs: dict[str, str], body: str) -> str:
    data = "".join(f' data-{k}="{esc(v)}"' for k, v in {"base": base, **attrs}.items())
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} - amlemu studio</title>'
            f'<link rel="stylesheet" href="{esc(base)}/static/studio.css"></head>'
            f'<body{data}><header><a href="{esc(base)}/">amlemu studio</a>'
            f'<span id="live" class="live">live</span></header><main>{body}</main>'
            f'<script src="{esc(base)}/static/studio.js"></script></body></html>')


def job_link(base: str, run_id: str) -> str:
    return f'<a href="{esc(base)}/jobs/{esc(quote(run_id, safe=""))}">{esc(run_id)}</a>'


# --- the overview --------------------------------------------------------------------------------
def node_row(node: dict[str, Any], base: str) -> str:
    run = job_link(base, node["run"]) if node["run"] else ""
    fault = f' <span class="fault">{esc(node["fault"])}</span>' if node["fault"] else ""
    return (f'<tr><td>{esc(node["name"])}</td><td><span class="node n-{esc(node["state"])}">'
            f'{esc(node["state"])}</span>{fault}</td><td>{run}</td><td>{esc(node["address"])}</td></tr>')


def compute_block(compute: dict[str, Any], base: str) -> str:
    title = (f'<h3>{esc(compute["name"])} <small>{esc(compute["vm_size"])}, {esc(compute["priority"])}, '
             f'{esc(compute["min_nodes"])}-{esc(compute["max_nodes"])} nodes, {esc(compute["backend"])}</small></h3>')
    rows = [node_row(n, base) for n in compute["nodes"]]
    return title + _table(f'nodes-{esc(compute["name"])}', ("node", "state", "job", "address"), rows,
                          "no nodes: scaled down")


JOB_HEADS = ("job", "type", "display name", "experiment", "compute", "status", "created")


def job_row(job: dict[str, Any], base: str, trial: str = "") -> str:
    """A job's row; a sweep's trials (a pipeline's steps: `trial` says which) follow it, nested (as
    Azure ML studio shows child jobs)."""
    cls, nest, kind = (' class="trial"', '<span class="nest">&#8627; </span>', trial) if trial else ("", "", job["type"])
    row = (f'<tr{cls}><td>{nest}{job_link(base, job["id"])}</td><td>{esc(kind)}</td><td>{esc(job["display_name"])}</td>'
           f'<td>{esc(job["experiment"])}</td><td>{esc(job["compute"])}</td><td>{status(job["status"])}</td>'
           f'<td>{esc(when(job["created_at"]))}</td></tr>')
    child = "step" if job["type"] == "pipeline" else "trial"
    trials = "".join(job_row(t, base, trial=child) for t in job.get("trials", []))
    more = job.get("trials_total", 0) - len(job.get("trials", []))
    if more > 0:
        trials += (f'<tr class="trial more"><td colspan="{len(JOB_HEADS)}"><span class="nest">&#8627; </span>'
                   f'{more} more {child}s on the page of {esc(job["type"])} {job_link(base, job["id"])}</td></tr>')
    return row + trials


def fault_row(fault: dict[str, Any], base: str) -> str:
    run = job_link(base, fault["run_id"]) if fault.get("run_id") else ""
    return (f'<tr><td>{esc(when(fault["ts"]))}</td><td>{esc(fault["kind"])}</td><td>{esc(fault["cluster"])}</td>'
            f'<td>{esc(fault["node"])}</td><td>{run}</td><td>{esc(fault["detail"])}</td></tr>')


FAULT_HEADS = ("time", "fault", "compute", "node", "job", "detail")


def overview_page(data: dict[str, Any], base: str) -> str:
    computes = "".join(compute_block(c, base) for c in data["computes"]) or \
        '<p class="empty">No computes: <code>amlemu compute create</code></p>'
    more = data["jobs_total"] - len(data["jobs"])
    more_note = f'<p id="more-jobs" class="empty">{more} older jobs: <code>amlemu job list</code></p>' if more else ""
    jobs = _table("jobs", JOB_HEADS,
                  [job_row(j, base) for j in data["jobs"]], "no jobs yet")
    faults = _table("faults", FAULT_HEADS, [fault_row(f, base) for f in data["faults"]], "none injected")
    body = (f'<h1>Workspace {esc(data["workspace"])}</h1>'
            f'<section><h2>Computes</h2><div id="computes">{computes}</div></section>'
            f'<section><h2>Jobs</h2>{jobs}{more_note}</section><section><h2>Faults injected</h2>{faults}</section>')
    return _page(base, "overview", {"page": "overview"}, body)


# --- a job ---------------------------------------------------------------------------------------
def event_row(event: dict[str, Any]) -> str:
    return (f'<tr><td>{esc(when(event["ts"]))}</td><td>{status(event["status"])}</td>'
            f'<td>{esc(event["detail"])}</td></tr>')


def file_item(item: dict[str, Any], base: str, run_id: str) -> str:
    href = f'{base}/files/{quote(run_id, safe="")}/{quote(item["path"])}'
    return f'<li><a href="{esc(href)}" download>{esc(item["path"])}</a> <small>{esc(size(item["size"]))}</small></li>'


def log_block(rank: int, chunk: dict[str, Any]) -> str:
    skipped = f"... {chunk['skipped']} bytes before this\n" if chunk["skipped"] else ""
    return (f'<h3>rank {rank}</h3><pre class="log" id="log-{rank}" data-rank="{rank}" '
            f'data-offset="{chunk["offset"]}">{esc(skipped + chunk["text"])}</pre>')


def plan_block(plan: dict[str, Any] | None) -> str:
    """The launch plan (runfiles.shown_plan: its secret values already masked), folded."""
    if plan is None:
        return '<p id="plan" class="empty">not launched yet</p>'
    return (f'<details id="plan"><summary>system_logs/launch.json, the values of the job\'s variables and '
            f'tokens masked</summary><pre class="log">{esc(json.dumps(plan, indent=2))}</pre></details>')


def job_page(job: dict[str, Any], logs: list[dict[str, Any]], base: str, plan: dict[str, Any] | None = None) -> str:
    run_id = job["id"]
    facts = [("experiment", job["experiment"]), ("display name", job["display_name"]),
             ("compute", job["compute"]), ("processes", job["processes"]), ("command", job["command"])]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    if job.get("parent"):  # a sweep's trial, or a pipeline's step
        of = "step of pipeline" if job.get("parent_type") == "pipeline" else "trial of sweep"
        dl = f'<dt>{of}</dt><dd id="parent">{job_link(base, job["parent"])}</dd>' + dl
    nodes = f'<dt>nodes</dt><dd id="job-nodes">{esc(", ".join(job["nodes"]))}</dd>'
    error = f'<p id="error" class="error">{esc(job["error"] or "")}</p>'
    events = _table("events", ("time", "status", "detail"), [event_row(e) for e in job["events"]], "")
    faults = _table("job-faults", FAULT_HEADS, [fault_row(f, base) for f in job["faults"]], "none injected")
    files = "".join(file_item(f, base, run_id) for f in job["files"]) or '<li class="empty">nothing yet</li>'
    body = (f'<h1>Job {esc(run_id)} <span id="status">{status(job["status"])}</span></h1>'
            f'<dl class="facts">{dl}{nodes}</dl>{error}'
            f'<section><h2>Status history</h2>{events}</section>'
            f'<section><h2>Metrics</h2><div id="metrics"><p class="empty">no metrics logged yet</p></div></section>'
            f'<section><h2>Logs</h2><div id="logs">{"".join(log_block(i, c) for i, c in enumerate(logs))}</div>'
            f'</section><section><h2>Outputs and logs</h2><ul id="files">{files}</ul></section>'
            f'<section><h2>Launch plan</h2>{plan_block(plan)}</section>'
            f'<section><h2>Faults injected</h2>{faults}</section>')
    return _page(base, run_id, {"page": "job", "job": run_id, "terminal": str(job["terminal"]).lower()}, body)


def not_found_page(base: str, what: str) -> str:
    return _page(base, "not found", {"page": "none"}, f'<h1>Not found</h1><p>{esc(what)}</p>')
