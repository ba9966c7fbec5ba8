"""What azureml-widgets' `RunDetails(run).show()` reads besides the run, its details and its log
files (v1routes.py): the run's children (a sweep's trials; a job is one run, without any) and its metrics
through run history's metric query (`MetricsClient._get_all_metrics`: RunMetricDto, one per value
logged, with the CreatedUtc filter its refresher uses to fetch only what is new).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from amlemu.service.protocol.calls import Call, Reply
from amlemu.service.protocol.v1online import H, _v1, history

RUN_ID_RE = re.compile(r"RunId eq ([\w.:-]+)")
AFTER_RE = re.compile(r"CreatedUtc gt (\S+)")  # the SDK's DATE_TIME_FORMAT: 2026-12-01T22:55:44.354753Z


def _page(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"value": items, "continuationToken": None, "nextLink": None}


def children(call: Call) -> Reply:
    """A run's children: a sweep's trials (a HyperDriveRun's get_children), none for a job."""
    return Reply(body=_page(_v1(call).children(call.params["experiment"], call.params["name"])))


def _when(text: str) -> datetime | None:
    try:
        found = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=timezone.utc)  # compared with the SDK's UTC


def run_metric_dtos(run_id: str, metrics: list[dict[str, Any]], after: datetime | None) -> list[dict[str, Any]]:
    """The metric service's records (MetricV2Dto, as runhistory keeps them) as run history's
    RunMetricDto: one per value, its columns as the schema, its data as the one cell."""
    found = []
    for metric in metrics:
        columns = metric.get("columns") or {}
        schema = {"numProperties": len(columns),
                  "properties": [{"propertyId": col, "name": col, "type": kind} for col, kind in columns.items()]}
        kind = (metric.get("properties") or {}).get("uxMetricType") or "azureml.v1.scalar"
        for value in metric.get("value") or []:
            created = _when(str(value.get("createdUtc", "")))
            if not isinstance(value, dict) or (after and created and created <= after):
                continue
            found.append({"runId": run_id, "metricId": value.get("metricId"), "metricType": kind,
                          "createdUtc": value.get("createdUtc"), "name": metric.get("name"), "description": None,
                          "label": None, "numCells": 1, "dataLocation": None, "cells": [value.get("data") or {}],
                          "schema": schema})
    return found


def metrics_query(call: Call) -> Reply:
    """POST experiments/{experiment}/metrics:query: the metrics of the runs its $filter names."""
    query = call.body if isinstance(call.body, dict) else {}
    text = str(query.get("filter") or "")
    after = AFTER_RE.search(text)
    since = _when(after[1]) if after else None
    found: list[dict[str, Any]] = []
    for run_id in RUN_ID_RE.findall(text):
        _v1(call).run_dto(call.params["experiment"], run_id)  # a run of this experiment, or 404
        found += run_metric_dtos(run_id, history(call).read_metrics(run_id), since)
    return Reply(body=_page(found))


ROUTES: list[tuple[str, str, Callable[[Call], Reply], bool | str]] = [
    ("GET", H + "/experiments/{experiment}/runs/{name}/children", children, "run"),
    ("POST", H + "/experiments/{experiment}/metrics:query", metrics_query, True),
]
