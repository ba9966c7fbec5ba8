"""A run's metrics: the MLflow stores it has (each node's own, mirrored while it runs and merged into
the run's record as it ends), their points, and a PNG of its curves. matplotlib and mlflow are
imported only when used: both are slow to import and most commands need neither.
"""
from __future__ import annotations

import math
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from amlemu.runs.runhistory import numeric_history

PLOT_NAME = "metrics.png"  # in the run's record, next to its mlflow.db
LIVE_DIR = "live-metrics"  # in the run's record while it runs: a copy of each node's store
# Tags of a source run that would be wrong in the combined store (the name is the emulator run
# id; parent ids point into the source store).
SEED_TAG = "amlemu.seeded"  # the job's run, made by the platform in each node's store before the launch
HOME_MARK = "mlflow-home-store"  # in an online run's record: the home store holding its run (runs/homestore.py)
SKIP_TAGS = {"mlflow.runName", "mlflow.parentRunId", "mlflow.rootRunId", SEED_TAG}


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


def metric_stores(run_dir: Path, active: bool) -> list[Path]:
    """A run's MLflow stores: its record's (merged from every node as each attempt ended) and,
    while it is active, the copies of its nodes' own stores."""
    stores = [run_dir / "mlflow.db"] if (run_dir / "mlflow.db").exists() else []
    if active:
        stores += sorted((run_dir / LIVE_DIR).glob("*.db"))
    return stores


def metric_history(run_dir: Path, active: bool) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every metric the job logged, across its attempts and nodes: with MLflow,
    and with azureml-core's Run.log* (the run history the service keeps, runhistory.py)."""
    history = numeric_history(run_dir)
    home = marked_store(run_dir)  # an online run's ranks logged to the home's store, under the run's id
    for name, step, value in read_metric_points(home, run_dir.name) if home else []:
        history.setdefault(name, []).append((step, value))
    for db in metric_stores(run_dir, active):
        try:
            for name, step, value in read_metric_points(db):
                history.setdefault(name, []).append((step, value))
        except sqlite3.DatabaseError:  # a live copy taken mid-write: the next one will do
            if db.parent.name != LIVE_DIR:
                raise
    return {name: sorted(points) for name, points in history.items()}


def plot_run(run_dir: Path, title: str, log: Callable[[str], None]) -> Path | None:
    """The run's metrics.png from its whole history (every attempt of a preempted run). Never
    raises: a plot must not fail a run, so a failure goes to `log` (the run's system_logs)."""
    try:
        path = plot_metrics(metric_history(run_dir, active=False), run_dir / PLOT_NAME, title)
        if path:
            log(f"metrics plotted: {path}")
        return path
    except Exception as exc:  # noqa: BLE001 - whatever broke, only the picture is missing
        log(f"warning: could not plot the run's metrics: {type(exc).__name__}: {exc}")
        return None


# --- MLflow stores -----------------------------------------------------------------
def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def all_runs(client: Any, view_type: int) -> list[Any]:
    experiments = [e.experiment_id for e in client.search_experiments(view_type=view_type)]
    found, token = [], None
    while experiments:
        page = client.search_runs(experiments, run_view_type=view_type, max_results=1000, page_token=token)
        found += list(page)
        token = page.token
        if not token:
            break
    return found


# --- reading and merging the stores --------------------------------------------------------------
def marked_store(run_dir: Path) -> Path | None:
    """The home store holding the run's MLflow run, if its ranks logged there (HOME_MARK)."""
    try:
        db = Path((run_dir / HOME_MARK).read_text().strip())
    except OSError:
        return None
    return db if db.is_file() else None


def read_metric_points(db: Path, run_id: str | None = None) -> list[tuple[str, int, float]]:
    """(name, step, value) of every metric point of the active runs in an MLflow sqlite store (of
    `run_id` only, when given), read with sqlite itself: no MLflow import (seconds) for `job show`,
    and no cached MLflow engine that would keep reading a store replaced since (the live copies are
    replaced every second)."""
    only = " AND r.run_uuid = ?" if run_id else ""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as db_conn:
        rows = db_conn.execute(
            "SELECT m.key, m.step, m.value, m.is_nan FROM metrics m JOIN runs r ON r.run_uuid = m.run_uuid "
            "JOIN experiments e ON e.experiment_id = r.experiment_id "
            "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'" + only,
            (run_id,) if run_id else ()).fetchall()
    return [(key, int(step), math.nan if is_nan else float(value)) for key, step, value, is_nan in rows]

SEED_PLACEHOLDER = "amlemuseedrun"  # the run id of the template store, replaced by each job's


def _seed_template(template: Path) -> None:
    """An MLflow store with one experiment (id 1) and one SCHEDULED run: made once per machine and
    MLflow version (MLflow's import and schema migrations take seconds; a copy takes none)."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    template.parent.mkdir(parents=True, exist_ok=True)
    tmp = template.with_name(f"{template.name}.{os.getpid()}.tmp")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}")
    made = client.create_run(client.create_experiment(SEED_PLACEHOLDER), run_name=SEED_PLACEHOLDER,
                             tags={SEED_TAG: "1"}).info.run_id
    client.update_run(made, status="SCHEDULED")
    with closing(sqlite3.connect(tmp)) as conn, conn:  # MLflow draws run ids itself: ours replaces it
        for table in ("tags", "runs"):
            conn.execute(f"UPDATE {table} SET run_uuid = ? WHERE run_uuid = ?", (SEED_PLACEHOLDER, made))  # noqa: S608
        conn.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (made, SEED_PLACEHOLDER))
    os.replace(tmp, template)  # whole or not at all: supervisors may make it at the same time


def ensure_template(template: Path) -> None:
    if not template.exists():
        _seed_template(template)


def seed_store(db: Path, experiment: str, run_id: str, run_name: str, template: Path) -> str:
    """A node's MLflow store holding the job's experiment and its run under the job's own id, as
    Azure ML's (MLFLOW_RUN_ID is the job name), so that mlflow.start_run() attaches to it. The run
    waits as SCHEDULED: one no process started is left out of the merge. Returns the experiment id."""
    ensure_template(template)
    shutil.copyfile(template, db)
    now = int(time.time() * 1000)
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("PRAGMA journal_mode = MEMORY")  # a copy made for one launch, removed after it: not made durable
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("UPDATE experiments SET name = ?, creation_time = ?, last_update_time = ? WHERE name = ?",
                     (experiment, now, now, SEED_PLACEHOLDER))
        conn.execute("UPDATE runs SET run_uuid = ?, name = ?, start_time = ?, artifact_uri = replace(artifact_uri, ?, ?) "
                     "WHERE run_uuid = ?", (run_id, run_name, now, SEED_PLACEHOLDER, run_id, SEED_PLACEHOLDER))
        conn.execute("UPDATE tags SET run_uuid = ? WHERE run_uuid = ?", (run_id, SEED_PLACEHOLDER))
        conn.execute("UPDATE tags SET value = ? WHERE run_uuid = ? AND key = 'mlflow.runName'", (run_name, run_id))
        (experiment_id,) = conn.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
    return str(experiment_id)


def empty_store(template: Path, db: Path, default_artifacts: str | None = None) -> None:
    """A store with MLflow's schema and its Default experiment alone (artifacts at `default_artifacts`
    when given), made whole or not at all: when two processes make it at once, the first one's stays."""
    ensure_template(template)
    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f".{db.name}.{time.time_ns()}.tmp")
    try:
        shutil.copyfile(template, tmp)
        with closing(sqlite3.connect(tmp)) as conn, conn:
            conn.execute("DELETE FROM tags WHERE run_uuid = ?", (SEED_PLACEHOLDER,))
            conn.execute("DELETE FROM runs WHERE run_uuid = ?", (SEED_PLACEHOLDER,))
            conn.execute("DELETE FROM experiments WHERE name = ?", (SEED_PLACEHOLDER,))
            if default_artifacts:
                conn.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default_artifacts,))
        if not db.exists():
            tmp.replace(db)
    finally:
        tmp.unlink(missing_ok=True)


def started_runs(db: Path) -> int:
    """How many runs of a node's store a process started (all but the seeded run still SCHEDULED),
    counted with sqlite itself."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM runs r WHERE r.lifecycle_stage = 'active' AND NOT (r.status = 'SCHEDULED' AND "
            "EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?))", (SEED_TAG,)).fetchone()
    return int(count)


def merge_store(source_db: Path, dest_db: Path, template: Path) -> int:
    """Copy every MLflow run a process started in a node's store (its experiment, params, tags,
    metric points with their steps and timestamps, status) into the run record's store, as runs of
    their own: ranks on other nodes logged into their own node's store. Returns how many were copied.

    With sqlite itself, not MLflow's client: importing MLflow and opening two stores with it cost
    ~7 CPU-s at the end of every job that logged. Both stores come from the same template, so they
    have MLflow's current schema; the columns are read from it, not assumed. The node's store is the
    job's file: opened read-only, and with `trusted_schema` off so a view or trigger it planted can
    call no function with side effects."""
    if not started_runs(source_db):  # the seeded run alone
        return 0
    if not dest_db.exists():
        empty_store(template, dest_db)
    with closing(sqlite3.connect(dest_db.as_uri(), uri=True, timeout=30)) as conn, conn:
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("ATTACH DATABASE ? AS src", (f"{source_db.as_uri()}?mode=ro",))
        runs = conn.execute(
            "SELECT r.run_uuid, r.experiment_id, r.status FROM src.runs r JOIN src.experiments e "
            "ON e.experiment_id = r.experiment_id WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active' "
            "AND NOT (r.status = 'SCHEDULED' AND EXISTS (SELECT 1 FROM src.tags t WHERE t.run_uuid = r.run_uuid "
            "AND t.key = ?)) ORDER BY COALESCE(r.start_time, 0)", (SEED_TAG,)).fetchall()  # seeded, never started
        skip = sorted(SKIP_TAGS - {"mlflow.runName"})  # the run keeps its name
        for source_id, source_experiment, status in runs:
            new_id = uuid.uuid4().hex
            _copy_rows(conn, "runs", "run_uuid = ?", (source_id,), {
                "run_uuid": new_id, "experiment_id": _dest_experiment(conn, source_experiment),
                # Still RUNNING in the node's store: its process died without ending it.
                "status": "KILLED" if status == "RUNNING" else status})
            conn.execute("UPDATE runs SET end_time = COALESCE(end_time, ?) WHERE run_uuid = ?",
                         (int(time.time() * 1000), new_id))
            for table in ("params", "metrics", "latest_metrics"):
                _copy_rows(conn, table, "run_uuid = ?", (source_id,), {"run_uuid": new_id})
            _copy_rows(conn, "tags", f"run_uuid = ? AND key NOT IN ({', '.join('?' * len(skip))})",
                       (source_id, *skip), {"run_uuid": new_id})
    return len(runs)


def _copy_rows(conn: sqlite3.Connection, table: str, where: str, args: tuple[Any, ...], values: dict[str, Any]) -> None:
    """Rows of src.`table` into main.`table`, the columns both have, with `values` replacing some."""
    mine = [row[1] for row in conn.execute(f"PRAGMA main.table_info({table})")]
    theirs = {row[1] for row in conn.execute(f"PRAGMA src.table_info({table})")}
    columns = [c for c in mine if c in theirs]
    picks = ", ".join("?" if c in values else f'"{c}"' for c in columns)  # names from our own schema
    names = ", ".join(f'"{c}"' for c in columns)
    conn.execute(f"INSERT INTO main.{table} ({names}) SELECT {picks} FROM src.{table} WHERE {where}",  # noqa: S608
                 (*[values[c] for c in columns if c in values], *args))


def _dest_experiment(conn: sqlite3.Connection, source_experiment: int) -> int:
    """The record store's experiment of the source experiment's name, made (as a copy) when missing."""
    (name,) = conn.execute("SELECT name FROM src.experiments WHERE experiment_id = ?", (source_experiment,)).fetchone()
    found = conn.execute("SELECT experiment_id FROM main.experiments WHERE name = ?", (name,)).fetchone()
    if found:
        return int(found[0])
    (top,) = conn.execute("SELECT COALESCE(MAX(experiment_id), 0) FROM main.experiments").fetchone()
    _copy_rows(conn, "experiments", "experiment_id = ?", (source_experiment,), {"experiment_id": top + 1})
    return int(top + 1)
