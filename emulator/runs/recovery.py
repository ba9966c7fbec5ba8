"""A run whose supervisor died (SIGKILL, a crash, the machine restarted): what its supervisor would
have done at the end, done by whoever notices first (the run's watchdog at once, else the next CLI
call's reconcile). The job's processes are stopped, its ./outputs and ./logs collected from its
nodes' disks into the run's record, its datastore-bound outputs uploaded, its nodes removed (no
supervisor is left to scale them down), and the run Failed with the supervisor's last words.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from amlemu import procinfo
from amlemu.backends import get_backend
from amlemu.cluster import autoscale
from amlemu.cluster.store import RunRecord, Store
from amlemu.cluster.teardown import ours
from amlemu.errors import AmlEmuError
from amlemu.home import Home, default_cache
from amlemu.jobs.jobspec_io import job_from_record
from amlemu.runs import homestore, nodework, rundisk
from amlemu.runs.mounts import RunData
from amlemu.runs.runlogs import tail
from amlemu.specs import RunStatus
from amlemu.storage.datastores import Datastores
from amlemu.storage.nodecache import policy_from_env

DIED = "the emulator process supervising this run died; the run was stopped and its nodes removed"


def claim(store: Store, record: RunRecord) -> bool:
    """Whether this process is the one to recover the run: its supervisor is gone (not merely busy)
    and no other claimer (alive) took it first."""
    if record.status.is_terminal or record.supervisor_pid is None or \
            ours(record.supervisor_pid, record.id, record.supervisor_started):
        return False
    return store.claim_run(record.id, record.supervisor_pid, os.getpid(), procinfo.started_at(os.getpid()))


def recover(home: Home, store: Store, record: RunRecord) -> None:
    """Stop, collect, release, fail: a claimed run (claim) whose supervisor is gone."""
    run_dir = home.run_dir(record.id)
    last = tail(run_dir / "system_logs" / "supervisor.txt", 5).strip()  # before anything else writes there

    def log(line: str) -> None:
        (run_dir / "system_logs").mkdir(parents=True, exist_ok=True)
        with open(run_dir / "system_logs" / "lifecycle.txt", "a") as out:
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")

    log("the supervisor died: stopping the job, collecting its outputs and logs, removing its nodes")
    if record.launch_pid and ours(record.launch_pid, record.id):
        try:
            os.killpg(record.launch_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cancel_children(store, record.id, "the driver of their parent job died")  # a sweep's or pipeline's
    try:
        _collect_and_release(home, store, record, log)
    finally:  # whatever failed above, the run ends
        reason = DIED + (f" (its last words: {last.splitlines()[-1][:300]})" if last else "")
        homestore.end_run(run_dir, RunStatus.FAILED.value, log)
        log(f"status {RunStatus.FAILED.value}: {reason}")
        store.set_status(record.id, RunStatus.FAILED, reason, error=reason)


def cancel_children(store: Store, run_id: str, why: str) -> None:
    """A sweep's trials or a pipeline's steps, when nothing is left to end them."""
    for child in store.runs(parent=run_id):
        if not child.status.is_terminal:
            store.set_status(child.id, RunStatus.CANCEL_REQUESTED, why)


@contextmanager
def ending_on_failure(store: Store, run_id: str, log: Callable[[str], None], what: str) -> Iterator[None]:
    """Around a driver's run (a sweep's, a pipeline's): whatever fails in it, its child jobs are canceled
    and the job fails with the reason, then the error goes on (to the driver's log)."""
    try:
        yield
    except BaseException as exc:
        cancel_children(store, run_id, f"the {what}'s driver failed")
        reason = f"the {what}'s driver failed: {type(exc).__name__}: {exc}"
        log(reason)
        if not store.run(run_id).status.is_terminal:
            store.set_status(run_id, RunStatus.FAILED, reason, error=reason)
        raise


def _collect_and_release(home: Home, store: Store, record: RunRecord, log) -> None:  # type: ignore[no-untyped-def]
    cluster = store.cluster(record.cluster)
    backend = get_backend(cluster.backend, home)
    requests = [autoscale.node_request(home, cluster.spec, int(name.rsplit("-", 1)[1]), host_gpus=())
                for name in record.nodes]
    for request in requests:  # as the supervisor's quiesce and collect: no job process left first
        try:
            backend.stop_processes(request)
            nodework.take_back(backend, request, record.id, log)  # the data runtime's servers outlive it
            rundisk.collect(request.node_dir, request.name, record.id, home.run_dir(record.id), log)
        except (AmlEmuError, OSError) as exc:  # a node gone or unreadable: the others are still collected
            log(f"warning: {request.name}: {type(exc).__name__}: {exc}")
    _upload_outputs(home, store, record, requests, log)
    if requests:
        backend.close_ports(requests[0], record.id)  # its service link and mpirun's port
    for node in autoscale.release(store, record.cluster, record.id, dead=set(record.nodes)):
        backend.remove_node(autoscale.node_request(home, cluster.spec, node.idx, host_gpus=()))


def _upload_outputs(home: Home, store: Store, record: RunRecord, requests: list, log) -> None:  # type: ignore[no-untyped-def]
    """Outputs bound to a datastore (upload, rw_mount) go there, as the supervisor's end would send them."""
    if not requests:
        return
    try:
        job = job_from_record(record.job)
        policy, _ = policy_from_env(job.environment_variables, job_start=time.time())
        data = RunData(Datastores(store, home.root, default_cache()), job, record.id, policy, log)
        data.upload_outputs({r.name: r.node_dir for r in requests})
    except AmlEmuError as exc:  # its outputs in the run's record are kept all the same
        log(f"error: uploading the outputs failed: {exc}")
