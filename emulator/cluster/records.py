"""The state database's schema and its records as pure data (cluster/store.py reads and writes them)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from amlemu.specs import ClusterSpec, Priority, RunStatus

SCHEMA = """
CREATE TABLE IF NOT EXISTS workspace (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, backend TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    cluster TEXT NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL,
    run_id TEXT, idle_since REAL, created_at REAL NOT NULL, address TEXT,
    PRIMARY KEY (cluster, idx));
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, experiment TEXT NOT NULL, cluster TEXT NOT NULL,
    status TEXT NOT NULL, job TEXT NOT NULL, created_at REAL NOT NULL, error TEXT,
    supervisor_pid INTEGER, launch_pid INTEGER, nodes TEXT NOT NULL DEFAULT '[]', exit_code INTEGER);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, ts REAL NOT NULL, status TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, ts);
CREATE TABLE IF NOT EXISTS datastores (name TEXT PRIMARY KEY, spec TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS environments (
    name TEXT NOT NULL, version TEXT NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (name, version));
CREATE TABLE IF NOT EXISTS assets (
    kind TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL, spec TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (kind, name, version));
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, cluster TEXT NOT NULL, node TEXT NOT NULL,
    run_id TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS faults_run ON faults (run_id, kind);
CREATE TABLE IF NOT EXISTS preemption_policies (
    cluster TEXT PRIMARY KEY, rate_per_node_hour REAL NOT NULL, seed INTEGER NOT NULL,
    max_preemptions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS machines (name TEXT PRIMARY KEY, spec TEXT NOT NULL, added REAL NOT NULL);
"""
# PRAGMA user_version: bumped whenever the schema changes in a way an older amlemu cannot read.
# A database of a newer version is refused with a way out, never half-read. A new table needs no
# migration (SCHEMA's CREATE ... IF NOT EXISTS adds it on open); a new column goes in MIGRATIONS.
# 2: machines (amlemu.machines.registry), and a cluster's machines and placement in its spec; runs'
#    reuse_key and supervisor_started.
SCHEMA_VERSION = 2
MIGRATIONS = {("runs", "preemptions"): "ALTER TABLE runs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0",
              ("runs", "parent"): "ALTER TABLE runs ADD COLUMN parent TEXT",  # a sweep's trial: the sweep
              ("runs", "reuse_key"): "ALTER TABLE runs ADD COLUMN reuse_key TEXT",  # a pipeline step's run
              # the owner's start time: with its pid, what names it (an owner forked by the fork server
              # has the server's argv: emulator/forkserver.py)
              ("runs", "supervisor_started"): "ALTER TABLE runs ADD COLUMN supervisor_started REAL"}

WORKSPACE_DEFAULTS = {
    "workspace_name": "amlemu-ws",
    "subscription_id": "00000000-0000-0000-0000-000000000000",
    "resource_group": "amlemu-rg",
    "location": "local",
}


@dataclass(frozen=True)
class Cluster:
    spec: ClusterSpec
    backend: str
    created_at: float


@dataclass(frozen=True)
class Node:
    cluster: str
    idx: int
    name: str
    state: str  # creating | idle | busy | removing
    run_id: str | None
    idle_since: float | None
    created_at: float
    address: str | None


@dataclass(frozen=True)
class RunRecord:
    id: str
    seq: int
    experiment: str
    cluster: str
    status: RunStatus
    job: dict[str, Any]
    created_at: float
    error: str | None = None
    supervisor_pid: int | None = None
    launch_pid: int | None = None
    nodes: list[str] = field(default_factory=list)
    exit_code: int | None = None
    preemptions: int = 0
    parent: str | None = None  # the sweep a trial belongs to
    reuse_key: str | None = None  # a pipeline step's run: the key a later step may reuse it under
    supervisor_started: float | None = None  # the supervisor's start time (with its pid, what names it)


def cluster_to_json(spec: ClusterSpec) -> str:
    return json.dumps({**spec.__dict__, "vm_priority": spec.vm_priority.value})


def cluster_from_json(text: str) -> ClusterSpec:
    data = json.loads(text)
    data["vm_priority"] = Priority(data["vm_priority"])
    return ClusterSpec(**data)
