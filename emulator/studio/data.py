"""What the studio page shows, as plain JSON-ready data read from a home: computes and their nodes,
jobs and their status history, faults, metric curves, log chunks and the files a run left.

Read-only: the state store is only queried (never reconciled), and every file comes from the run's
record through `runfiles.open_in_run`, which refuses any path that leaves it and the run's private
files (the launch plan is shown with its secret values masked: `runfiles.shown_plan`). A job is
untrusted code and it wrote the logs, outputs and metric names shown here: the page escapes them,
this module only keeps them inside the run's folder and the JSON valid (a NaN metric becomes null).
"""
from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from typing import Any, BinaryIO

from amlemu import skus
from amlemu.cluster.store import Node, RunRecord, Store
from amlemu.errors import NotFoundError
from amlemu.home import Home
from amlemu.runs.metrics import metric_history
from amlemu.runs.runlogs import LOG_FOLDERS, rank_log_name
from amlemu.runs.runfiles import list_files, open_in_run, shown_plan
from amlemu.studio.pipelinedata import is_pipeline, pipeline_view
from amlemu.studio.sweepdata import is_sweep, sweep_view

LOG_CHUNK = 64 * 1024  # bytes of log per poll: the first poll of a long log gets its tail
MAX_POINTS = 400  # per metric curve: the page draws a sparkline, not every step of a long run
MAX_JOBS = 100  # newest first on the overview; `amlemu job list --all-results` has the rest
MAX_TRIALS = 20  # a sweep's trials nested under it on the overview; its own page has them all


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _processes(job: dict[str, Any]) -> int:
    dist = job.get("distribution") or {}
    nodes = int(job.get("instance_count", 1))
    if dist.get("type") == "tensorflow":  # a process per task: the workers and the parameter servers
        return int(dist.get("worker_count") or nodes) + int(dist.get("parameter_server_count") or 0)
    per_node = 1 if dist.get("type", "none") == "none" else int(dist.get("process_count_per_instance", 1))
    return nodes * per_node


def _thin(points: list[tuple[int, float]]) -> list[list[float | None]]:
    """At most MAX_POINTS (step, value) pairs, evenly picked, the last one always kept."""
    if len(points) > MAX_POINTS:
        stride = len(points) / MAX_POINTS
        points = [points[int(i * stride)] for i in range(MAX_POINTS - 1)] + [points[-1]]
    return [[step, _finite(value)] for step, value in points]


def _kind(record: RunRecord) -> str:
    return "sweep" if is_sweep(record) else "pipeline" if is_pipeline(record) else "command"


class StudioData:
    """One home's state for the page. The store's sqlite connection is shared by the server's
    worker threads, so each read holds a lock (reads take milliseconds)."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.store = Store(home.db)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def _run(self, run_id: str) -> RunRecord:
        with self._lock:
            return self.store.run(run_id)

    def overview(self) -> dict[str, Any]:
        with self._lock:
            workspace = self.store.workspace()
            clusters = self.store.clusters()
            nodes = {c.spec.name: self.store.nodes(c.spec.name) for c in clusters}
            runs = self.store.runs()
            faults = self.store.recent_faults()
        def fault_on(node: Node) -> str | None:
            """The newest fault of this node; node names come back after a removal, so a fault
            older than the node was another node's."""
            kinds = [f["kind"] for f in faults if f["cluster"] == node.cluster and f["node"] == node.name
                     and f["ts"] >= node.created_at]
            return kinds[-1] if kinds else None
        computes = [{
            "name": c.spec.name, "vm_size": c.spec.vm_size, "priority": c.spec.vm_priority.value,
            "min_nodes": c.spec.min_nodes, "max_nodes": c.spec.max_nodes, "backend": c.backend,
            "nodes": [{"name": n.name, "state": n.state, "run": n.run_id, "address": n.address,
                       "fault": fault_on(n)} for n in nodes[c.spec.name]],
        } for c in clusters]
        # As Azure ML studio lists them: top-level jobs, a sweep's trials under it (not among them).
        top = [r for r in runs if r.parent is None]
        trials: dict[str, list[RunRecord]] = {}
        for record in runs:
            if record.parent is not None:
                trials.setdefault(record.parent, []).append(record)
        jobs = [{**self._job_row(r), "trials": [self._job_row(t) for t in trials.get(r.id, [])[:MAX_TRIALS]],
                 "trials_total": len(trials.get(r.id, []))} for r in top[::-1][:MAX_JOBS]]
        return {"workspace": workspace.get("workspace_name", ""), "now": time.time(), "computes": computes,
                "jobs": jobs, "jobs_total": len(top), "faults": faults[::-1]}

    @staticmethod
    def _job_row(record: RunRecord) -> dict[str, Any]:
        return {"id": record.id, "experiment": record.experiment, "compute": skus.shown_compute(record.cluster),
                "display_name": record.job.get("display_name") or "", "status": record.status.value,
                "terminal": record.status.is_terminal, "created_at": record.created_at,
                "nodes": list(record.nodes), "processes": _processes(record.job),
                "type": _kind(record), "parent": record.parent}

    def job(self, run_id: str) -> dict[str, Any]:
        """Everything the job page polls, but the logs (each rank's has its own endpoint)."""
        with self._lock:
            record = self.store.run(run_id)
            events = self.store.events(run_id)
            faults = self.store.faults(run_id)
            parent = self.store.run(record.parent) if record.parent and self.store.run_exists(record.parent) else None
        run_dir = self.home.run_dir(run_id)
        try:
            history = metric_history(run_dir, active=not record.status.is_terminal) if run_dir.is_dir() else {}
        except sqlite3.DatabaseError:  # the record's store caught mid-creation as the run ends (MLflow
            history = None             # migrates its schema in steps): the page keeps what it drew
        metrics = None if history is None else {name: _thin(points) for name, points in sorted(history.items())}
        return {**self._job_row(record), "error": record.error, "exit_code": record.exit_code,
                "preemptions": record.preemptions, "command": record.job.get("command", ""),
                "events": [{"ts": ts, "status": status.value, "detail": detail} for ts, status, detail in events],
                "faults": faults, "parent_type": _kind(parent) if parent else None,
                "metrics": metrics,
                "files": list_files(run_dir) if run_dir.is_dir() else []}

    def is_sweep(self, run_id: str) -> bool:
        return is_sweep(self._run(run_id))

    def sweep(self, run_id: str) -> dict[str, Any]:
        """A sweep's page data: what every job has, and its trials and results (sweepdata)."""
        with self._lock:
            record = self.store.run(run_id)
            children = self.store.runs(parent=run_id) if is_sweep(record) else []
        if not is_sweep(record):
            raise NotFoundError("sweep", run_id, f"{run_id} is a {self._job_row(record)['type']} job: "
                                f"/api/jobs/{run_id} has it")
        from amlemu.sweeps import results  # noqa: PLC0415 - numpy comes with it: only for a sweep's page

        job = self.job(run_id)
        job.pop("metrics")  # a sweep logs none itself: its trials do
        return {**job, **sweep_view(record, children, results.read(self.home.run_dir(run_id)))}

    def is_pipeline(self, run_id: str) -> bool:
        return is_pipeline(self._run(run_id))

    def pipeline(self, run_id: str) -> dict[str, Any]:
        """A pipeline's page data: what every job has, and its steps, data edges and layers (pipelinedata)."""
        from amlemu.pipelines.submit import read_steps  # noqa: PLC0415 - the job machinery: only for a pipeline's page

        with self._lock:
            record = self.store.run(run_id)
            children = self.store.runs(parent=run_id) if is_pipeline(record) else []
        if not is_pipeline(record):
            raise NotFoundError("pipeline", run_id, f"{run_id} is a {_kind(record)} job: /api/jobs/{run_id} has it")
        job = self.job(run_id)
        job.pop("metrics")  # a pipeline logs none itself: its steps do
        return {**job, **pipeline_view(record, read_steps(self.home.run_dir(run_id)), children)}

    def plan(self, run_id: str) -> dict[str, Any] | None:
        """The run's launch plan, its secret values masked (for the job page; the polled JSON
        leaves it out: it is written once, at the launch)."""
        record = self._run(run_id)
        return shown_plan(self.home.run_dir(run_id), set(record.job.get("environment_variables") or {}))

    def log_chunk(self, run_id: str, rank: int, offset: int) -> dict[str, Any]:
        """Rank `rank`'s log from byte `offset` (negative: its last LOG_CHUNK bytes), at most
        LOG_CHUNK of it, cut after the last whole line while the run goes on (a line, or a UTF-8
        character, is never shown in halves). `offset` in the answer is where the next poll starts."""
        record = self._run(run_id)
        if not 0 <= rank < _processes(record.job):
            raise NotFoundError("log", f"rank {rank} of job {run_id}",
                                f"ranks are 0 to {_processes(record.job) - 1}")
        layout = record.job.get("log_layout", "v2")
        fh = open_in_run(self.home.run_dir(run_id), f"{LOG_FOLDERS.get(layout, 'user_logs')}/"
                         f"{rank_log_name(rank, _processes(record.job), layout)}")
        if fh is None:
            return {"offset": 0, "size": 0, "text": "", "skipped": 0, "terminal": record.status.is_terminal}
        with fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size - LOG_CHUNK) if offset < 0 else min(offset, size)
            fh.seek(start)
            data = fh.read(LOG_CHUNK)
        if not record.status.is_terminal and b"\n" in data and not data.endswith(b"\n"):
            data = data[:data.rindex(b"\n") + 1]
        return {"offset": start + len(data), "size": size, "text": data.decode("utf-8", errors="replace"),
                "skipped": start if offset < 0 else 0, "terminal": record.status.is_terminal}

    def open_file(self, run_id: str, rel: str) -> BinaryIO | None:
        self._run(run_id)  # an unknown job is a 404 before any path is built from its name
        return open_in_run(self.home.run_dir(run_id), rel)
