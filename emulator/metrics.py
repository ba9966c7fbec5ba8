"""Metrics to look at: a PNG of each run's metric curves, and one MLflow store over every run for
MLflow's own UI (`amlemu ui`).

Each run has its own sqlite MLflow store (contract.tracking_uri), so no single MLflow server sees
them all: build_ui_store copies them into one store under the home, incrementally. matplotlib and
mlflow are imported only when used: both are slow to import and most commands need neither.
"""
from __future__ import annotations

import fcntl
import math
import os
import sqlite3
from contextlib import closing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .specs import RunStatus

if TYPE_CHECKING:
    from .api import Emulator, Run

PLOT_NAME = "metrics.png"  # in the run's record, next to its mlflow.db
LIVE_DIR = "live-metrics"  # in the run's record while it runs: a copy of each node's store
UI_RUN_TAG = "amlemu.run_id"
UI_STATUS_TAG = "amlemu.status"
# Tags of a source run that would be wrong in the combined store (the name is the emulator run
# id; parent ids point into the source store).
_SKIP_TAGS = {"mlflow.runName", "mlflow.parentRunId", "mlflow.rootRunId"}
_MLFLOW_STATUS = {RunStatus.COMPLETED: "FINISHED", RunStatus.FAILED: "FAILED", RunStatus.CANCELED: "KILLED"}
_FINAL = {s.value for s in _MLFLOW_STATUS}


# --- the plot ------------------------------------------------------------------------------------
def plot_metrics(history: dict[str, list[tuple[int, float]]], path: Path, title: str) -> Path | None:
    """One subplot per metric (x = step), written as a PNG with the Agg backend; None when there is
    nothing to plot. Written to a temporary name and renamed: a reader never sees half a file."""
    series = {name: points for name, points in sorted(history.items()) if points}
    if not series:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415 - no pyplot: no global state, no display
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    cols = 1 if len(series) <= 3 else 2
    rows = math.ceil(len(series) / cols)
    fig = Figure(figsize=(6.4 * cols, 2.6 * rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax, (name, points) in zip(axes, series.items()):
        steps = [step for step, _ in points]
        # An infinite value would flatten the whole curve: it is drawn as a gap, as NaN is.
        values = [v if math.isfinite(v) else math.nan for _, v in points]
        ax.plot(steps, values, marker="o" if len(points) <= 50 else None, markersize=3, linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(True, alpha=0.3)
    for ax in axes[len(series):]:
        ax.set_visible(False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        fig.savefig(partial, format="png", dpi=100)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def plot_run(home: Path, run_id: str, status: str, log: Callable[[str], None]) -> Path | None:
    """The run's metrics.png from its whole history (every attempt of a preempted run). Never
    raises: a plot must not fail a run, so a failure goes to `log` (the run's system_logs)."""
    from .api import Emulator  # noqa: PLC0415 - api imports this module

    emu = None
    try:
        emu = Emulator(home)
        run = emu.run(run_id)
        path = plot_metrics(run.metric_history(), run.dir / PLOT_NAME,
                            f"{run.id} ({run.record.experiment}): {status}")
        if path:
            log(f"metrics plotted: {path}")
        return path
    except Exception as exc:  # noqa: BLE001 - whatever broke, only the picture is missing
        log(f"warning: could not plot the run's metrics: {type(exc).__name__}: {exc}")
        return None
    finally:
        if emu is not None:
            emu.store.close()


# --- one MLflow store for the UI -----------------------------------------------------------------
def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _all_runs(client: Any, view_type: int) -> list[Any]:
    experiments = [e.experiment_id for e in client.search_experiments(view_type=view_type)]
    found, token = [], None
    while experiments:
        page = client.search_runs(experiments, run_view_type=view_type, max_results=1000, page_token=token)
        found += list(page)
        token = page.token
        if not token:
            break
    return found


def _point(metric: Any) -> tuple[str, int, int, str]:
    # repr: NaN != NaN, and a point must compare equal to its own copy.
    return metric.key, metric.step, metric.timestamp, repr(metric.value)


def build_ui_store(emu: Emulator, dest: Path) -> int:
    """Copy every run's MLflow data (experiment, params, metrics with steps and timestamps, tags)
    into the sqlite store `dest`, one MLflow run per emulator run, named after it and tagged
    amlemu.run_id / amlemu.status. A run copied in a terminal state is not copied again; one that
    was still active is brought up to date. Returns how many runs were copied or refreshed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Two `amlemu ui` starting at once must not both copy the same run.
    with open(dest.parent / ".copy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _copy_runs(emu, dest)


def _copy_runs(emu: Emulator, dest: Path) -> int:
    from mlflow.entities import ViewType  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    artifacts = (dest.parent / "artifacts").as_uri()
    client = MlflowClient(tracking_uri=f"sqlite:///{dest}")
    # Deleted copies count too: a run the user deleted in the UI is not brought back.
    copies = {r.data.tags[UI_RUN_TAG]: r for r in _all_runs(client, ViewType.ALL) if UI_RUN_TAG in r.data.tags}
    copied = 0
    for run in emu.runs():
        status = run.status  # read before the data: a run ending meanwhile is refreshed next time
        previous = copies.get(run.id)
        if previous is not None and (previous.info.lifecycle_stage == "deleted"
                                     or previous.data.tags.get(UI_STATUS_TAG) in _FINAL):
            continue
        stores = []
        for db in run.metric_stores():
            source = MlflowClient(tracking_uri=f"sqlite:///{db}")
            found_runs = sorted(_all_runs(source, ViewType.ACTIVE_ONLY), key=lambda r: r.info.start_time or 0)
            if found_runs:
                stores.append((source, found_runs))
        if not stores:
            continue  # the job logged nothing with MLflow
        source, sources = stores[0]
        experiment = source.get_experiment(sources[0].info.experiment_id).name
        if experiment == "Default":  # the job set no experiment of its own: the job's is meant
            experiment = run.record.experiment
        if previous is None:
            found = client.get_experiment_by_name(experiment)
            if found is not None and found.lifecycle_stage == "deleted":
                continue  # deleted in the UI: it stays deleted
            experiment_id = found.experiment_id if found else client.create_experiment(
                experiment, artifact_location=artifacts)
            target = client.create_run(experiment_id, start_time=sources[0].info.start_time,
                                       tags={UI_RUN_TAG: run.id}, run_name=run.id)
        else:
            target = previous
        for source, found_runs in stores:
            _copy_data(client, target.info.run_id, source, found_runs, run)
        plot = run.plot_path
        if plot is not None:
            client.log_artifact(target.info.run_id, str(plot))
        if status.is_terminal:
            ends = [r.info.end_time for _, found_runs in stores for r in found_runs if r.info.end_time]
            end = max(ends) if ends else int(run.events()[-1][0] * 1000)
            client.set_terminated(target.info.run_id, status=_MLFLOW_STATUS[status], end_time=end)
        # Last: a final status marks a complete copy, so a copy cut short is finished next time.
        client.set_tag(target.info.run_id, UI_STATUS_TAG, status.value)
        copied += 1
    return copied


def _copy_data(client: Any, target_id: str, source: Any, sources: list[Any], run: Run) -> None:
    """Params, tags and metric points of `sources` that `target_id` does not have yet."""
    from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415

    have = client.get_run(target_id).data
    params: dict[str, str] = {}
    tags = {"amlemu.compute": run.record.cluster}
    for src in sources:
        for key, value in src.data.params.items():
            params.setdefault(key, value)  # params are immutable: the first attempt's value stays
        tags.update({k: v for k, v in src.data.tags.items() if k not in _SKIP_TAGS})
    new_params = [Param(k, v) for k, v in params.items() if k not in have.params]
    for chunk in _chunks(new_params, 100):
        client.log_batch(target_id, params=chunk)
    for chunk in _chunks([RunTag(k, str(v)) for k, v in tags.items()], 100):
        client.log_batch(target_id, tags=chunk)
    existing = {_point(m) for key in have.metrics for m in client.get_metric_history(target_id, key)}
    points: list[Any] = []
    for src in sources:
        for key in src.data.metrics:
            points += [Metric(m.key, m.value, m.timestamp, m.step)
                       for m in source.get_metric_history(src.info.run_id, key) if _point(m) not in existing]
    for chunk in _chunks(points, 1000):
        client.log_batch(target_id, metrics=chunk)


def ui_store_path(emu: Emulator) -> Path:
    return emu.home.root / "mlflow-ui" / "mlflow.db"


# --- reading and merging the stores --------------------------------------------------------------
def read_metric_points(db: Path) -> list[tuple[str, int, float]]:
    """(name, step, value) of every metric point of the active runs in an MLflow sqlite store, read
    with sqlite itself: no MLflow import (seconds) for `job show`, and no cached MLflow engine that
    would keep reading a store replaced since (the live copies are replaced every second)."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as db_conn:
        rows = db_conn.execute(
            "SELECT m.key, m.step, m.value, m.is_nan FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
            "JOIN experiments e ON e.experiment_id = r.experiment_id "
            "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'").fetchall()
    return [(key, int(step), math.nan if is_nan else float(value)) for key, step, value, is_nan in rows]

def merge_store(source_db: Path, dest_db: Path) -> int:
    """Copy every MLflow run of a node's store (its experiment, params, tags, metric points with
    their steps and timestamps, status) into the run record's store, as runs of their own: ranks on
    other nodes logged into their own node's store. Returns how many runs were copied."""
    from mlflow.entities import Metric, Param, ViewType  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    source = MlflowClient(tracking_uri=f"sqlite:///{source_db}")
    runs = _all_runs(source, ViewType.ACTIVE_ONLY)
    if not runs:
        return 0
    dest = MlflowClient(tracking_uri=f"sqlite:///{dest_db}")
    for src in sorted(runs, key=lambda r: r.info.start_time or 0):
        name = source.get_experiment(src.info.experiment_id).name
        found = dest.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else dest.create_experiment(name)
        target = dest.create_run(experiment_id, start_time=src.info.start_time, run_name=src.info.run_name,
                                 tags={k: v for k, v in src.data.tags.items() if k not in _SKIP_TAGS})
        run_id = target.info.run_id
        for chunk in _chunks([Param(k, v) for k, v in src.data.params.items()], 100):
            dest.log_batch(run_id, params=chunk)
        points = [Metric(m.key, m.value, m.timestamp, m.step) for key in src.data.metrics
                  for m in source.get_metric_history(src.info.run_id, key)]
        for chunk in _chunks(points, 1000):
            dest.log_batch(run_id, metrics=chunk)
        # Still RUNNING in the node's store: its process died without ending it.
        dest.set_terminated(run_id, status="KILLED" if src.info.status == "RUNNING" else src.info.status,
                            end_time=src.info.end_time)
    return len(runs)
