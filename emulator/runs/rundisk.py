"""A run's folder on a node's disk (/mnt/azureml/cr/j/<32-hex id> inside the node): laid out by the host
before the launch, read back after every job process is gone, emptied for the next run.

The job is root on its node and can write its disk, so every host step here goes through
backends.nodefs: nothing the job made (a link to /, a fifo) leads the host out of the folder.
"""
from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amlemu import statefile
from amlemu.specs import JobSpec
from amlemu.backends import nodefs
from amlemu.runs import v1injector
from amlemu.runs.contract import NODE_MLFLOW_EXPERIMENT_ID, V1_INJECTOR, env_file_text, job_rel
from amlemu.runs.homestore import template_path
from amlemu.runs.metrics import LIVE_DIR, merge_store, seed_store

ENV_FILE = "amlemu-env.sh"  # contract.node_env_file, as the host sees it
PLATFORM_LINKS = ("cap/", "mounts/")  # the platform's own links into the node's cache


def platform_files(job: JobSpec, link: Any) -> dict[str, bytes]:
    """What the platform puts in each node's run folder beside the job: the service link's files,
    and a v1 job's context manager injector in its working folder (runs/v1injector.py)."""
    files = dict(link.files) if link is not None else {}
    if job.log_layout == "v1":
        files[f"exe/wd/{V1_INJECTOR}"] = Path(v1injector.__file__).read_bytes()
    return files


def lay_out_nodes(node_dirs: list[Path], run_id: str, run_dir: Path, envs: list[dict[str, str]], restarted: bool,
                  experiment: str, run_name: str, files: dict[str, bytes] | None = None) -> None:
    """Every node's run folder, each with a copy of one MLflow store seeded with the job's run
    (seeding is the slow part: done once), and `files` (the platform's: the service link's CA bundle)."""
    seed = run_dir / f".seed-{time.time_ns()}.db"
    try:
        # One empty store per machine and MLflow version, like the other builds in the cache: made
        # per home, it cost every new home ~6 s of MLflow's import and schema migrations.
        template = template_path()
        if seed_store(seed, experiment, run_id, run_name, template) != NODE_MLFLOW_EXPERIMENT_ID:
            raise RuntimeError("the seeded MLflow store numbers the experiment unlike MLFLOW_EXPERIMENT_ID")
        for node_dir, env in zip(node_dirs, envs):
            job_dir = lay_out(node_dir, run_id, run_dir, env, restarted, seed)
            for name, data in (files or {}).items():
                (job_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (job_dir / name).write_bytes(data)
    finally:
        seed.unlink(missing_ok=True)


def lay_out(node_dir: Path, run_id: str, run_dir: Path, env: dict[str, str], restarted: bool,
            seed: Path | None = None) -> Path:
    """The run's folder on a node: the snapshot as the working folder, outputs and logs (a
    preempted attempt's put back), the MLflow store folder (with a copy of `seed`), and the env
    file the node's shell sources (owner-only: the job's variables may hold secrets). Returns the
    folder (host path)."""
    job_dir = nodefs.fresh_dir(node_dir, job_rel(run_id))
    shutil.copytree(run_dir / "snapshot", job_dir / "exe" / "wd")
    for sub in ("outputs", "logs"):
        (job_dir / "exe" / "wd" / sub).mkdir(exist_ok=True)
        if restarted and (run_dir / sub).is_dir():
            shutil.copytree(run_dir / sub, job_dir / "exe" / "wd" / sub, dirs_exist_ok=True)
    (job_dir / "tracking").mkdir()
    if seed is not None:
        shutil.copyfile(seed, job_dir / "tracking" / "mlflow.db")
    statefile.write_text(job_dir / ENV_FILE, env_file_text(env), owner_only=True)
    return job_dir


def secure(node_dir: Path, run_id: str) -> list[str]:
    """With no job process left: remove every link and special file the job made in its folder;
    returns those the job made (the platform's own links into the cache go silently)."""
    job_dir = nodefs.inside(node_dir, job_rel(run_id))
    removed = nodefs.strip_links(job_dir) if job_dir else []
    return [p for p in removed if not p.startswith(PLATFORM_LINKS)]


def collect(node_dir: Path, node: str, run_id: str, run_dir: Path, log: Callable[[str], None]) -> None:
    """./outputs, ./logs and the node's MLflow store into the run's record (after secure)."""
    job_dir = nodefs.inside(node_dir, job_rel(run_id))
    if job_dir is None:
        return
    for sub in ("outputs", "logs"):
        source = nodefs.inside(job_dir, f"exe/wd/{sub}")
        if source is not None:
            shutil.copytree(source, run_dir / sub, dirs_exist_ok=True)
    # A copy: the node's file is the job's (nodefs copies it without following its links).
    copy = run_dir / f".merge-{node}-{time.time_ns()}.db"
    try:
        if nodefs.copy_file(node_dir, f"{job_rel(run_id)}/tracking/mlflow.db", copy):
            merge_store(copy, run_dir / "mlflow.db", template_path())
    except Exception as exc:  # noqa: BLE001 - a broken store loses metrics, not the run
        log(f"warning: the MLflow store of {node} could not be read: {type(exc).__name__}: {exc}")
    finally:
        copy.unlink(missing_ok=True)


def mirror_stores(backend: Any, requests: list[Any], run_id: str, run_dir: Path, stop: threading.Event) -> None:
    """While the job runs, a copy of each node's MLflow store in the run's record (LIVE_DIR), so
    metrics are seen before the end (backend.copy_out: from the node's disk, wherever it is); the
    stores themselves are merged when the job ends."""
    live = run_dir / LIVE_DIR
    live.mkdir(exist_ok=True)
    while not stop.wait(1.0):
        for request in requests:
            if stop.is_set():  # the job ended meanwhile: its stores are merged, not copied
                return
            backend.copy_out(request, f"{job_rel(run_id)}/tracking/mlflow.db", live / f"{request.name}.db")
