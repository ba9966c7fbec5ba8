"""All emulator state in one SQLite database, shared by the CLI, the Python API and run supervisors.

Writers take `BEGIN IMMEDIATE` transactions, so node allocation across concurrent supervisors is
serialised by SQLite itself; WAL lets readers (`amlemu job list`) go on meanwhile.
"""
from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from amlemu.actions import Action, execute
from amlemu.cluster.records import (  # noqa: F401 - the records, importable from here as they always were
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    WORKSPACE_DEFAULTS,
    Cluster,
    Node,
    RunRecord,
    cluster_from_json,
    cluster_to_json,
)
from amlemu.errors import NotFoundError, StateDbError, StateError, name_taken
from amlemu.names import check_workspace_field
from amlemu.specs import ClusterSpec, RunStatus

class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateDbError(path, f"cannot be opened ({exc})") from None
        try:
            self._open()
        except sqlite3.OperationalError as exc:
            self._db.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise
            raise StateDbError(path, f"cannot be opened ({exc})") from None
        except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
            self._db.close()
            raise StateDbError(path, f"is corrupt ({exc})") from None

    def _open(self) -> None:
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=30000")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._db.close()
            raise StateDbError(self.path, f"was written by a newer amlemu (schema {version}; this one reads up "
                               f"to {SCHEMA_VERSION}): upgrade amlemu")
        self._db.executescript(SCHEMA)
        for (table, column), statement in MIGRATIONS.items():
            if column not in {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}:
                self._db.execute(statement)
        if version < SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def wait_for_change(self, timeout: float, step: float = 0.02) -> bool:
        """Up to `timeout` seconds, less where another connection commits meanwhile (a trial's or a
        step's status): whether one did. SQLite's data_version costs microseconds, so a driver can
        look every `step` instead of sleeping its whole period (a sweep's next trial waited ~0.25 s)."""
        seen = self._db.execute("PRAGMA data_version").fetchone()[0]
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(step, left))
            if self._db.execute("PRAGMA data_version").fetchone()[0] != seen:
                return True
        return False

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def reset(self, keep_data: bool = False) -> None:
        """Forget everything; with keep_data, the workspace, its datastores, environments, data/model
        assets and machines stay (`amlemu cleanup`)."""
        tables = ["clusters", "nodes", "runs", "events", "faults", "preemption_policies"] + (
            [] if keep_data else ["workspace", "datastores", "environments", "assets", "machines"])
        with self.transaction() as db:
            for table in tables:
                db.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names

    # --- workspace ---------------------------------------------------------------------------
    def workspace(self) -> dict[str, str]:
        stored = {r["key"]: r["value"] for r in self._db.execute("SELECT key, value FROM workspace")}
        return {**WORKSPACE_DEFAULTS, **stored}

    def plan_set_workspace(self, **values: str) -> list[Action]:
        """Each field that changes, checked first (`workspace set --dry-run`)."""
        unknown = set(values) - set(WORKSPACE_DEFAULTS)
        if unknown:
            raise StateError(f"unknown workspace field(s): {', '.join(sorted(unknown))}")
        for key, value in values.items():
            check_workspace_field(key, value)
        current = self.workspace()
        return [Action("set", "workspace field", key, {"from": current[key], "to": value},
                       run=functools.partial(self._set_workspace_field, key, value))
                for key, value in values.items() if current[key] != value]

    def _set_workspace_field(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO workspace VALUES (?, ?)", (key, value))

    def set_workspace(self, **values: str) -> dict[str, str]:
        execute(self.plan_set_workspace(**values))
        return self.workspace()

    # --- datastores (specs only: secrets never enter the database) ----------------------------
    def datastore(self, name: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT spec FROM datastores WHERE name = ?", (name,)).fetchone()
        return json.loads(row["spec"]) if row else None

    def datastores(self) -> list[dict[str, Any]]:
        return [json.loads(r["spec"]) for r in self._db.execute("SELECT spec FROM datastores ORDER BY name")]

    def add_datastore(self, name: str, spec: dict[str, Any]) -> None:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM datastores WHERE name = ?", (name,)).fetchone():
                raise StateError(f"datastore '{name}' already exists; pick another name")
            db.execute("INSERT INTO datastores VALUES (?, ?)", (name, json.dumps(spec)))

    # --- registered environments (`amlemu environment create`), versions immutable as Azure ML's -----
    def environment(self, name: str, version: str | None = None) -> dict[str, Any] | None:
        """One version, or with None the latest created (`@latest`)."""
        row = self._db.execute("SELECT spec FROM environments WHERE name = ? AND (? IS NULL OR version = ?) "
                               "ORDER BY created_at DESC LIMIT 1", (name, version, version)).fetchone()
        return json.loads(row["spec"]) if row else None

    def environments(self) -> list[dict[str, Any]]:
        return [json.loads(r["spec"]) for r in self._db.execute("SELECT spec FROM environments ORDER BY name, created_at")]

    def add_environment(self, spec: dict[str, Any]) -> dict[str, Any]:
        """Register `spec` (its version: given, else the next integer); the same content again is a no-op."""
        with self.transaction() as db:
            rows = db.execute("SELECT version, spec FROM environments WHERE name = ?", (spec["name"],)).fetchall()
            versions = {r["version"]: json.loads(r["spec"]) for r in rows}
            same = [v for v in versions.values() if not spec.get("version") and {**v, "version": None} == spec]
            if same:  # the same definition again, no version asked for: the version it already has
                return same[-1]
            version = spec.get("version") or str(1 + max((int(v) for v in versions if v.isdigit()), default=0))
            spec = {**spec, "version": version}
            if version in versions:
                if versions[version] == spec:
                    return spec
                raise StateError(f"environment '{spec['name']}' version {version} already exists with other content; "
                                 f"versions cannot change: give another --version")
            db.execute("INSERT INTO environments VALUES (?, ?, ?, ?)", (spec["name"], version, json.dumps(spec), time.time()))
        return spec

    # --- clusters ----------------------------------------------------------------------------
    def add_cluster(self, spec: ClusterSpec, backend: str) -> Cluster:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM clusters WHERE name = ?", (spec.name,)).fetchone():
                raise StateError(f"compute '{spec.name}' already exists; delete it first or pick another name")
            db.execute("INSERT INTO clusters VALUES (?, ?, ?, ?)",
                       (spec.name, cluster_to_json(spec), backend, time.time()))
        return self.cluster(spec.name)

    def cluster(self, name: str) -> Cluster:
        row = self._db.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFoundError("compute", name, "create it with `amlemu compute create`")
        return Cluster(cluster_from_json(row["spec"]), row["backend"], row["created_at"])

    def clusters(self) -> list[Cluster]:
        rows = self._db.execute("SELECT name FROM clusters ORDER BY name").fetchall()
        return [self.cluster(r["name"]) for r in rows]

    def update_cluster(self, spec: ClusterSpec) -> Cluster:
        """New scale settings for an existing cluster (its name, size and priority stay)."""
        with self.transaction() as db:
            db.execute("UPDATE clusters SET spec = ? WHERE name = ?", (cluster_to_json(spec), spec.name))
        return self.cluster(spec.name)

    def delete_cluster(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM nodes WHERE cluster = ?", (name,))
            db.execute("DELETE FROM preemption_policies WHERE cluster = ?", (name,))
            db.execute("DELETE FROM clusters WHERE name = ?", (name,))

    # --- nodes -------------------------------------------------------------------------------
    def nodes(self, cluster: str, db: sqlite3.Connection | None = None) -> list[Node]:
        rows = (db or self._db).execute("SELECT * FROM nodes WHERE cluster = ? ORDER BY idx", (cluster,))
        return [Node(**dict(r)) for r in rows.fetchall()]

    def set_node(self, db: sqlite3.Connection, node: Node) -> None:
        db.execute("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (node.cluster, node.idx, node.name, node.state, node.run_id, node.idle_since,
                    node.created_at, node.address))

    def delete_node(self, db: sqlite3.Connection, cluster: str, idx: int) -> None:
        db.execute("DELETE FROM nodes WHERE cluster = ? AND idx = ?", (cluster, idx))

    # --- runs --------------------------------------------------------------------------------
    def add_run(self, run_id: str, experiment: str, cluster: str, job: dict[str, Any],
                parent: str | None = None) -> RunRecord:
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone():
                raise name_taken(run_id)
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs").fetchone()[0]
            now = time.time()
            db.execute("INSERT INTO runs (id, seq, experiment, cluster, status, job, created_at, parent) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (run_id, seq, experiment, cluster, RunStatus.NOT_STARTED.value, json.dumps(job), now, parent))
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (run_id, now, RunStatus.NOT_STARTED.value, ""))
        return self.run(run_id)

    def run(self, run_id: str, db: sqlite3.Connection | None = None) -> RunRecord:
        row = (db or self._db).execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFoundError("job", run_id, "list jobs with `amlemu job list`")
        data = dict(row)
        data["status"] = RunStatus(data["status"])
        data["job"] = json.loads(data["job"])
        data["nodes"] = json.loads(data["nodes"])
        return RunRecord(**data)

    def runs_with_reuse_key(self, key: str) -> list[RunRecord]:
        """Completed runs recorded under a pipeline step's reuse key, newest first (pipelines/reuse.py)."""
        rows = self._db.execute("SELECT id FROM runs WHERE reuse_key = ? AND status = ? ORDER BY seq DESC",
                                (key, RunStatus.COMPLETED.value)).fetchall()
        return [self.run(r["id"]) for r in rows]

    def run_exists(self, run_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None

    def runs(self, experiment: str | None = None, cluster: str | None = None,
             parent: str | None = None) -> list[RunRecord]:
        query, args = "SELECT id FROM runs WHERE 1=1", []
        if parent:
            query, args = query + " AND parent = ?", [*args, parent]
        if experiment:
            query, args = query + " AND experiment = ?", [*args, experiment]
        if cluster:
            query, args = query + " AND cluster = ?", [*args, cluster]
        return [self.run(r["id"]) for r in self._db.execute(query + " ORDER BY seq", args).fetchall()]

    def set_status(self, run_id: str, status: RunStatus, detail: str = "",
                   db: sqlite3.Connection | None = None, **fields: Any) -> RunRecord:
        """Validated transition, recorded with its time; a no-op when already in `status`, and when
        a cancel came first for an active status (the run's own loop then sees the cancel and ends it)."""
        if db is None:
            with self.transaction() as tx:
                return self.set_status(run_id, status, detail, db=tx, **fields)
        current = self.run(run_id, db).status
        if current is RunStatus.CANCEL_REQUESTED and not status.is_terminal:
            return self.run(run_id, db)
        if current is not status:
            current.check_transition(status)
            db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (run_id, time.time(), status.value, detail))
        self._update(db, run_id, status=status.value, **fields)
        return self.run(run_id, db)

    def claim_run(self, run_id: str, dead_pid: int, claimer_pid: int, claimer_started: float | None = None) -> bool:
        """Take over an active run whose supervisor `dead_pid` died: True for the one claimer that
        gets it (a run's watchdog or a CLI call's reconcile noticing the death at the same time)."""
        with self.transaction() as db:
            terminal = [s.value for s in RunStatus if s.is_terminal]
            cursor = db.execute(f"UPDATE runs SET supervisor_pid = ?, supervisor_started = ? "  # noqa: S608
                                f"WHERE id = ? AND supervisor_pid = ? AND status NOT IN ({', '.join('?' * len(terminal))})",
                                (claimer_pid, claimer_started, run_id, dead_pid, *terminal))
            return cursor.rowcount == 1

    def update_run(self, run_id: str, **fields: Any) -> None:
        with self.transaction() as db:
            self._update(db, run_id, **fields)

    @staticmethod
    def _update(db: sqlite3.Connection, run_id: str, **fields: Any) -> None:
        if "nodes" in fields:
            fields["nodes"] = json.dumps(fields["nodes"])
        if fields:
            columns = ", ".join(f"{name} = ?" for name in fields)
            db.execute(f"UPDATE runs SET {columns} WHERE id = ?", (*fields.values(), run_id))  # noqa: S608

    # --- faults ------------------------------------------------------------------------------
    def add_fault(self, cluster: str, node: str, run_id: str | None, kind: str, detail: str = "") -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO faults (ts, cluster, node, run_id, kind, detail) VALUES (?, ?, ?, ?, ?, ?)",
                       (time.time(), cluster, node, run_id, kind, detail))

    def faults(self, run_id: str, kind: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        query = "SELECT * FROM faults WHERE run_id = ? AND ts >= ?" + (" AND kind = ?" if kind else "")
        args = (run_id, since, kind) if kind else (run_id, since)
        return [dict(r) for r in self._db.execute(query + " ORDER BY id", args).fetchall()]

    def recent_faults(self, limit: int = 50) -> list[dict[str, Any]]:
        """The newest `limit` faults of the home, oldest first (those on idle nodes have no run)."""
        rows = self._db.execute("SELECT * FROM faults ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [dict(r) for r in reversed(rows)]

    def set_preemption_policy(self, cluster: str, rate_per_node_hour: float, seed: int, max_preemptions: int) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO preemption_policies VALUES (?, ?, ?, ?)",
                       (cluster, rate_per_node_hour, seed, max_preemptions))

    def preemption_policy(self, cluster: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT * FROM preemption_policies WHERE cluster = ?", (cluster,)).fetchone()
        return dict(row) if row else None

    def events(self, run_id: str) -> list[tuple[float, RunStatus, str]]:
        rows = self._db.execute("SELECT ts, status, detail FROM events WHERE run_id = ? ORDER BY ts, rowid",
                                (run_id,))
        return [(r["ts"], RunStatus(r["status"]), r["detail"]) for r in rows.fetchall()]
