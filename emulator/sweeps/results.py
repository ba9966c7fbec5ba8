"""A sweep's trials and results, pure: each trial's values, status and primary-metric reports; the best
trial and the properties Azure ML shows on a sweep job (best_child_run_id, score, primary_metric_config,
best_metric_status); and the trials that never logged the primary metric, with the names they did log
(the mistake a local sweep is there to catch). `write`/`read`: the sweep's sweep.json.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amlemu import statefile
from amlemu.specs import RunStatus
from amlemu.sweeps.sweepspec import SweepSpec

FILE = "sweep.json"  # in the sweep's run folder


@dataclass
class Trial:
    name: str
    values: dict[str, Any]
    status: RunStatus = RunStatus.QUEUED
    points: list[float] = field(default_factory=list)  # the primary metric's reports, in order
    logged: list[str] = field(default_factory=list)  # every metric name the trial logged
    reason: str | None = None  # why the sweep canceled it

    @property
    def final(self) -> float | None:
        """The trial's score: its last report of the primary metric."""
        return self.points[-1] if self.points else None


def best_trial(trials: list[Trial], goal: str) -> Trial | None:
    """The best score among completed trials (among all scored ones when none completed with one)."""
    scored = [t for t in trials if t.final is not None and t.status is RunStatus.COMPLETED] or \
        [t for t in trials if t.final is not None]
    if not scored:
        return None
    pick = max if goal == "maximize" else min
    return pick(scored, key=lambda t: t.final)  # type: ignore[arg-type, return-value]


def missing_metric_notes(trials: list[Trial], metric: str) -> list[str]:
    notes = []
    for t in trials:
        if t.status is RunStatus.COMPLETED and t.final is None:
            logged = ", ".join(t.logged) if t.logged else "no metric at all"
            notes.append(f"trial {t.name} completed without logging the primary metric '{metric}' (it logged: "
                         f"{logged}); log it under that exact name, e.g. mlflow.log_metric('{metric}', value)")
    return notes


def summarize(spec: SweepSpec, trials: list[Trial]) -> dict[str, Any]:
    metric, goal = spec.objective.primary_metric, spec.objective.goal
    best = best_trial(trials, goal)
    counts = {s: sum(t.status is s for t in trials) for s in (RunStatus.COMPLETED, RunStatus.CANCELED, RunStatus.FAILED)}
    tally = f"{len(trials)} trial(s): " + ", ".join(f"{n} {s.value.lower()}" for s, n in counts.items())
    notes = missing_metric_notes(trials, metric)
    if best is not None:
        headline = f"{tally}; best {best.name} with {metric} {best.final:g}"
    else:
        headline = f"{tally}; no trial logged the primary metric '{metric}'"
    properties = {
        "primary_metric_config": json.dumps({"name": metric, "goal": goal}),
        "best_child_run_id": best.name if best else "",
        "score": "" if best is None else repr(best.final),
        "best_metric_status": "Succeeded" if best else "Failed",
        "runTemplate": "HyperDrive", "azureml.runsource": "hyperdrive",
        "generator_config": json.dumps({"name": spec.sampling.type.upper(), "parameter_space": spec.to_dict()["search_space"]}),
    }
    return {"primary_metric": metric, "goal": goal, "best_child_run_id": best.name if best else None,
            "score": best.final if best else None, "headline": headline, "notes": notes, "properties": properties,
            "trials": [{"name": t.name, "values": t.values, "status": t.status.value, "metric": t.final,
                        "reports": len(t.points), "reason": t.reason} for t in trials]}


def write(run_dir: Path, summary: dict[str, Any]) -> None:
    statefile.write_json(run_dir / FILE, summary, indent=2)


def read(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / FILE).read_text())
    except (OSError, ValueError):
        return None
