"""A pipeline job's page, server-rendered: its facts, a place for the graph of its steps (studio.js
draws it as inline SVG from /api/pipelines/<id>: a box per step, coloured by its status, linking to
its child job, marked when it reused an earlier run; an arrow per data edge labelled with the output
and the input it feeds; the steps in columns by depth, left to right) and recolours it as steps move,
the steps table (the same, as text: each step's child job, status, the run it reused, why it did not
run), the status history and the pipeline's own files.

Step, output and input names and the driver's notes are user data: every one goes through `esc`.
"""
from __future__ import annotations

from typing import Any

from amlemu.studio.pages import _page, _table, esc, event_row, file_item, job_link, status

STEP_HEADS = ("step", "child job", "status", "reused from", "detail")


def step_row(step: dict[str, Any], base: str) -> str:
    """A step's row as studio.js writes it (the page redraws the table on its first poll)."""
    child = job_link(base, step["child_job"]) if step["child_job"] else ""
    reused = job_link(base, step["reused_from"]) if step["reused_from"] else ""
    cells = [esc(step["step"]), child, status(step["status"]), reused, esc(step["detail"])]
    return f'<tr data-step="{esc(step["step"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def counts_line(pipeline: dict[str, Any]) -> str:
    return ", ".join(f"{n} {s}" for s, n in pipeline["counts"].items()) or "no steps"


def pipeline_page(pipeline: dict[str, Any], base: str) -> str:
    run_id = pipeline["id"]
    facts = [("experiment", pipeline["experiment"]), ("display name", pipeline["display_name"]),
             ("compute", pipeline["compute"]),
             ("on a failed step", "the other steps go on" if pipeline["continue_on_step_failure"]
              else "the pipeline stops (continue_on_step_failure: false)")]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    steps = _table("steps", STEP_HEADS, [step_row(s, base) for s in pipeline["steps"]], "no steps")
    events = _table("events", ("time", "status", "detail"), [event_row(e) for e in pipeline["events"]], "")
    files = "".join(file_item(f, base, run_id) for f in pipeline["files"]) or '<li class="empty">nothing yet</li>'
    body = (f'<h1>Pipeline {esc(run_id)} <span id="status">{status(pipeline["status"])}</span></h1>'
            f'<dl class="facts">{dl}<dt>steps</dt><dd id="step-counts">{esc(counts_line(pipeline))}</dd></dl>'
            f'<p id="error" class="error">{esc(pipeline["error"] or "")}</p>'
            f'<section><h2>Graph</h2><div id="pipeline-graph" class="pipeline-graph">'
            f'<p class="empty">the graph is drawn by the page\'s script</p></div></section>'
            f'<section><h2>Steps</h2>{steps}</section>'
            f'<section><h2>Status history</h2>{events}</section>'
            f'<section><h2>Outputs and logs</h2><ul id="files">{files}</ul></section>')
    return _page(base, run_id, {"page": "pipeline", "job": run_id, "terminal": str(pipeline["terminal"]).lower()},
                 body)
