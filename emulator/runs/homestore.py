"""The home's own MLflow store (<home>/mlflow/mlflow.db): the one store the service's MLflow tracking
server (emulator/service/mlflowmount.py) serves, where an online run's ranks log while it runs.

Why the supervisor writes it with sqlite itself: a run must exist there, under the job's own id,
before its ranks start (mlflow.start_run() attaches to MLFLOW_RUN_ID), and importing MLflow in
every supervisor costs seconds. The store is made once per home from the machine's seeded
template (metrics.ensure_template: MLflow's migrations run once per machine and MLflow version),
its placeholder run removed; each run is then a copy of the template's run row. SQLite's own
locking keeps this safe beside the service's writers.

A run made here leaves a mark in its record (MARK, naming the store): `amlemu job show`,
Run.metrics() and the run's metrics.png read its points from the home store by the run's id,
whether or not the service still runs (it is a file of the home).
"""
from __future__ import annotations

import importlib.util
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from amlemu import statefile
from amlemu.home import default_cache
from amlemu.runs.metrics import HOME_MARK as MARK
from amlemu.runs.metrics import SEED_PLACEHOLDER, SEED_TAG, empty_store, marked_store
BUSY_MS = 30_000  # the service may be writing: wait for its lock rather than fail the run
_FINAL = {"Completed": "FINISHED", "Failed": "FAILED", "Canceled": "KILLED"}


def template_path() -> Path:
    """One seeded store per machine and MLflow version (runs/rundisk.py lays its copies out on nodes)."""
    return default_cache() / "mlflow" / f"seed-{mlflow_version()}.db"


MLFLOW_DISTS = ("mlflow", "mlflow_skinny")  # the full one, or its tracking client alone (slim images)


def mlflow_version() -> str:
    """The installed MLflow's version, from the name of its dist-info folder beside the package:
    found without importing MLflow or scanning every distribution (`importlib.metadata.version`
    took 6-7 ms a call, three calls a run)."""
    spec = importlib.util.find_spec("mlflow")
    site = Path(spec.origin).parent.parent if spec and spec.origin else None
    for dist in MLFLOW_DISTS:
        found = list(site.glob(f"{dist}-*.dist-info")) if site else []
        if len(found) == 1:
            return found[0].name[len(dist) + 1:-len(".dist-info")]
    for dist in MLFLOW_DISTS:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    raise PackageNotFoundError("mlflow (neither mlflow nor mlflow-skinny is installed)")


def store_path(home_root: Path) -> Path:
    return home_root / "mlflow" / "mlflow.db"


def artifact_root(home_root: Path) -> Path:
    return home_root / "mlflow" / "artifacts"


def _connect(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, timeout=BUSY_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
    return conn


def ensure_store(home_root: Path) -> Path:
    """The home store, made from the template when it does not exist yet (whole or not at all)."""
    db = store_path(home_root)
    if db.exists():
        return db
    empty_store(template_path(), db, (artifact_root(home_root) / "0").as_uri())
    return db


def add_run(home_root: Path, run_dir: Path, experiment: str, run_id: str, run_name: str) -> str:
    """The job's run in the home store (SCHEDULED, as Azure ML makes it before the job starts), in
    the experiment of the job's name (made when missing); kept as it is when a restarted attempt
    finds it. Marks the run's record. Returns the experiment's id (MLFLOW_EXPERIMENT_ID)."""
    db = ensure_store(home_root)
    now = int(time.time() * 1000)
    with closing(_connect(db)) as conn, conn:
        conn.execute("BEGIN IMMEDIATE")  # one writer from here: the experiment's id is drawn once
        found = conn.execute("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ?",
                             (experiment,)).fetchone()
        if found is not None and found[1] != "active":  # as MLflow's own set_experiment refuses it
            raise ValueError(f"experiment {experiment!r} was deleted in MLflow; restore it in MLflow's UI")
        if found is None:
            (top,) = conn.execute("SELECT COALESCE(MAX(experiment_id), 0) FROM experiments").fetchone()
            found = (top + 1,)
            conn.execute("INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage, "
                         "creation_time, last_update_time) VALUES (?, ?, ?, 'active', ?, ?)",
                         (found[0], experiment, (artifact_root(home_root) / str(found[0])).as_uri(), now, now))
        experiment_id = int(found[0])
        if conn.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (run_id,)).fetchone() is None:
            conn.execute("ATTACH DATABASE ? AS seed", (f"file:{template_path()}?mode=ro",))
            # A copy of the template's run row: the columns MLflow's current schema has, as it made them.
            conn.execute("INSERT INTO runs SELECT * FROM seed.runs WHERE run_uuid = ?", (SEED_PLACEHOLDER,))
            # The job's artifacts: its ranks write them where they run (outputs/ comes back with the run).
            conn.execute("UPDATE runs SET run_uuid = ?, name = ?, start_time = ?, experiment_id = ?, "
                         "artifact_uri = 'outputs/mlflow-artifacts' WHERE run_uuid = ?",
                         (run_id, run_name, now, experiment_id, SEED_PLACEHOLDER))
            conn.executemany("INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                             [("mlflow.runName", run_name, run_id), (SEED_TAG, "1", run_id)])
    statefile.write_text(run_dir / MARK, str(db))
    return str(experiment_id)


def end_run(run_dir: Path, status: str, log: Callable[[str], None]) -> None:
    """The run's final status on its MLflow run, where its ranks did not end it themselves (a job
    that never called MLflow, one that was killed): as Azure ML ends the job's run. An error is
    logged, never raised: the MLflow run's status must not decide the run's."""
    db = marked_store(run_dir)
    if db is None or status not in _FINAL:
        return
    try:
        with closing(_connect(db)) as conn, conn:
            conn.execute("UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ? AND status IN ('SCHEDULED', "
                         "'RUNNING')", (_FINAL[status], int(time.time() * 1000), run_dir.name))
    except (OSError, sqlite3.Error) as exc:
        log(f"warning: the run's MLflow status was not set: {exc}")


MOUNT = "/mlflow"  # where the service serves MLflow's tracking server (emulator/service/mlflowmount.py)


def online_env(home_root: Path, run_dir: Path, link_env: dict[str, str], experiment: str, run_id: str,
               run_name: str, log: Callable[[str], None]) -> dict[str, str]:
    """MLflow's variables for an online run (its link's `link_env`): the service's tracking server,
    the run's own token (MLflow's REST client sends it as a bearer token), the link's CA, and the
    run made in the home store; {} (the node stores, as offline) when the run cannot be made there."""
    try:
        experiment_id = add_run(home_root, run_dir, experiment, run_id, run_name)
    except (OSError, ValueError, sqlite3.Error) as exc:
        log(f"warning: the run could not be made in the home's MLflow store ({exc}); MLflow logs to the nodes")
        return {}
    log("MLflow: the ranks log to the service's tracking server (the home's MLflow store), live")
    return {"MLFLOW_TRACKING_URI": link_env["AZUREML_SERVICE_ENDPOINT"] + MOUNT,
            "MLFLOW_TRACKING_TOKEN": link_env["AZUREML_RUN_TOKEN"],
            "MLFLOW_TRACKING_SERVER_CERT_PATH": link_env["REQUESTS_CA_BUNDLE"],
            "MLFLOW_EXPERIMENT_ID": experiment_id}
