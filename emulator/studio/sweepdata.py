"""A sweep job as the studio shows it, pure: its trials (each one's hyperparameter values, status,
primary metric, the policy's reason for a canceled one, the best one marked), the headline and notes
(a trial that never logged the primary metric), and its settings, from the sweep's record, its
trials' records and the sweep.json its driver rewrites every second (sweeps/results.py).

The records are fresher than sweep.json on a trial's status (the driver writes what it saw on its
last look), so a trial's status comes from its record; the rest from sweep.json. A value, a choice
or a metric name is user data: this only keeps it JSON (a non-finite number becomes null), the
page escapes it. A conditional choice's option (a mapping) is shown as one column per key.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from amlemu.cluster.records import RunRecord


def is_sweep(record: RunRecord) -> bool:
    return record.job.get("kind") == "sweep"


def clean(value: Any) -> Any:
    """`value` as JSON carries it: a NaN or infinite float becomes None."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def flat_values(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A trial's values, one per column: a conditional choice's option {type: cnn, layers: 3}
    under `model` becomes model.type and model.layers."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_values(value, f"{name}."))
        else:
            flat[name] = clean(value) if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat


def param_names(space: Mapping[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """The columns: each search space name in its order (a conditional one's keys in the order the
    trials first show them), then any other name a trial has."""
    seen: dict[str, None] = {}
    for trial in trials:
        seen.update(dict.fromkeys(trial["values"]))
    order = list(space)
    return sorted(seen, key=lambda n: order.index(n.split(".")[0]) if n.split(".")[0] in order else len(order))


def settings(yaml: Mapping[str, Any]) -> dict[str, Any]:
    """What the page says of how the sweep runs: its objective, sampling, limits and policy."""
    objective, limits = yaml.get("objective") or {}, yaml.get("limits") or {}
    sampling, policy = yaml.get("sampling_algorithm"), yaml.get("early_termination")
    return {"primary_metric": str(objective.get("primary_metric") or ""), "goal": str(objective.get("goal") or ""),
            "sampling": str(sampling.get("type") if isinstance(sampling, Mapping) else sampling or ""),
            "early_termination": str(policy.get("type")) if isinstance(policy, Mapping) else None,
            "max_total_trials": limits.get("max_total_trials"),
            "max_concurrent_trials": limits.get("max_concurrent_trials")}


def sweep_view(record: RunRecord, children: list[RunRecord], summary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The sweep page's data (without what every job has: the caller adds status, events, files)."""
    yaml = (record.job.get("sweep") or {}).get("yaml") or {}
    summary = summary or {}
    status = {child.id: child.status.value for child in children}
    best = summary.get("best_child_run_id")
    trials = [{"name": str(t.get("name")), "values": flat_values(t.get("values") or {}),
               "status": status.get(str(t.get("name")), str(t.get("status") or "")),
               "metric": clean(t.get("metric")), "reports": t.get("reports", 0), "reason": t.get("reason"),
               "best": t.get("name") == best} for t in summary.get("trials") or []]
    listed = {t["name"] for t in trials}
    trials += [{"name": child.id, "values": {}, "status": child.status.value, "metric": None, "reports": 0,
                "reason": None, "best": False} for child in children if child.id not in listed]  # submitted just now
    view = settings(yaml)
    return {**view, "primary_metric": str(summary.get("primary_metric") or view["primary_metric"]),
            "best_child_run_id": best, "score": clean(summary.get("score")),
            "headline": str(summary.get("headline") or "no trial yet"),
            "notes": [str(n) for n in summary.get("notes") or []],
            "params": param_names(yaml.get("search_space") or {}, trials), "trials": trials}
