"""A sweep job's page, server-rendered: its settings, the headline and notes (a trial that never
logged the primary metric), the trials table (each trial linking to its own page, its values, the
primary metric, status, the policy's reason for a canceled one, the best one marked) below a place
for the chart of hyperparameters against the primary metric (studio.js draws it, parallel coordinates,
and keeps all of it current from /api/sweeps/<id>), the status history and the sweep's files.

Values, choices and metric names are user data: every one goes through `esc`.
"""
from __future__ import annotations

from typing import Any

from amlemu.studio.pages import _page, _table, esc, event_row, file_item, job_link, status

TRIAL_HEADS = ("trial", "status")  # then a column per hyperparameter, the primary metric, reports, reason


def value(v: Any) -> str:
    """A value as studio.js writes it (the page redraws the table on its first poll)."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v).lower()
    if isinstance(v, float):
        return f"{v:.3e}" if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3) else f"{v:.4f}".rstrip("0").rstrip(".")
    return str(v)


def trial_heads(sweep: dict[str, Any]) -> list[str]:
    return [*TRIAL_HEADS, *sweep["params"], sweep["primary_metric"] or "primary metric", "reports", "reason"]


def trial_row(trial: dict[str, Any], sweep: dict[str, Any], base: str) -> str:
    best = ' <span class="best-mark">best</span>' if trial["best"] else ""
    cells = [job_link(base, trial["name"]) + best, status(trial["status"]),
             *(esc(value(trial["values"].get(p))) for p in sweep["params"]),
             esc(value(trial["metric"])), esc(trial["reports"]), esc(trial["reason"] or "")]
    cls = ' class="best"' if trial["best"] else ""
    return f'<tr{cls} data-trial="{esc(trial["name"])}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def sweep_page(sweep: dict[str, Any], base: str) -> str:
    run_id = sweep["id"]
    limits = f'{sweep["max_total_trials"]} trials, {sweep["max_concurrent_trials"]} at once'
    facts = [("experiment", sweep["experiment"]), ("display name", sweep["display_name"]),
             ("compute", sweep["compute"]), ("objective", f'{sweep["goal"]} {sweep["primary_metric"]}'),
             ("sampling", sweep["sampling"]), ("early termination", sweep["early_termination"] or "none"),
             ("limits", limits)]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    if sweep.get("parent"):  # a pipeline's sweep step
        dl = f'<dt>step of pipeline</dt><dd id="parent">{job_link(base, sweep["parent"])}</dd>' + dl
    notes = "".join(f"<li>{esc(n)}</li>" for n in sweep["notes"])
    trials = _table("trials", tuple(trial_heads(sweep)), [trial_row(t, sweep, base) for t in sweep["trials"]],
                    "no trial yet")
    events = _table("events", ("time", "status", "detail"), [event_row(e) for e in sweep["events"]], "")
    files = "".join(file_item(f, base, run_id) for f in sweep["files"]) or '<li class="empty">nothing yet</li>'
    body = (f'<h1>Sweep {esc(run_id)} <span id="status">{status(sweep["status"])}</span></h1>'
            f'<dl class="facts">{dl}</dl><p id="error" class="error">{esc(sweep["error"] or "")}</p>'
            f'<section><h2>Results</h2><p id="headline">{esc(sweep["headline"])}</p>'
            f'<ul id="notes" class="notes">{notes}</ul></section>'
            f'<section><h2>Hyperparameters and the primary metric</h2><div id="sweep-chart">'
            f'<p class="empty">no trial yet</p></div></section>'
            f'<section><h2>Trials</h2>{trials}</section>'
            f'<section><h2>Status history</h2>{events}</section>'
            f'<section><h2>Outputs and logs</h2><ul id="files">{files}</ul></section>')
    return _page(base, run_id, {"page": "sweep", "job": run_id, "terminal": str(sweep["terminal"]).lower()}, body)
