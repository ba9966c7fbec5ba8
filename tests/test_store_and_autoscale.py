"""State in SQLite and the autoscaling decisions (no node is created here)."""
from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest

from amlemu.cluster import autoscale
from amlemu.cluster.store import WORKSPACE_DEFAULTS, Node, Store
from amlemu.errors import NotFoundError, StateError
from amlemu.runs.contract import Rank
from amlemu.runs.supervisor import RunLogs, failure_reason
from amlemu.specs import ClusterSpec, RunStatus


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "amlemu.db")


def test_workspace_defaults_set_and_reset(store: Store) -> None:
    assert store.workspace() == WORKSPACE_DEFAULTS
    assert store.set_workspace(workspace_name="mine")["workspace_name"] == "mine"
    with pytest.raises(StateError, match="unknown workspace field"):
        store.set_workspace(colour="red")
    store.reset()
    assert store.workspace() == WORKSPACE_DEFAULTS


def test_clusters_survive_a_new_connection(store: Store) -> None:
    store.add_cluster(ClusterSpec("c1", "standard_nc6", vm_priority="low_priority", max_nodes=2), "process")
    again = Store(store.path).cluster("c1")
    assert again.spec == ClusterSpec("c1", "Standard_NC6", vm_priority="lowpriority", max_nodes=2)
    with pytest.raises(StateError, match="compute 'c1' already exists"):
        store.add_cluster(ClusterSpec("c1"), "process")
    with pytest.raises(NotFoundError, match="compute 'c9' not found; create it with `amlemu compute create`"):
        store.cluster("c9")


def test_a_cancel_that_came_first_wins_over_a_drivers_next_status(store: Store) -> None:
    """A sweep's or pipeline's driver (or a supervisor) writes Preparing/Running just after a cancel:
    the cancel stays, the run's loop then ends it Canceled (it once failed the run with a StateError)."""
    store.add_run("r1", "exp", "c1", {"k": 1})
    store.set_status("r1", RunStatus.CANCEL_REQUESTED, "cancel requested")
    for status in (RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.FINALIZING):
        assert store.set_status("r1", status).status is RunStatus.CANCEL_REQUESTED
    assert store.set_status("r1", RunStatus.CANCELED).status is RunStatus.CANCELED
    assert [e[1] for e in store.events("r1")] == [RunStatus.NOT_STARTED, RunStatus.CANCEL_REQUESTED, RunStatus.CANCELED]


def test_status_history_is_validated_and_timed(store: Store) -> None:
    store.add_run("r1", "exp", "c1", {"k": 1})
    for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING):
        store.set_status("r1", status)
    with pytest.raises(StateError, match="from Running to Preparing"):
        store.set_status("r1", RunStatus.PREPARING)
    events = store.events("r1")
    assert [e[1] for e in events] == [RunStatus.NOT_STARTED, RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING]
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    assert [r.id for r in store.runs(experiment="exp")] == ["r1"] and store.runs(experiment="other") == []


def _queue(store: Store, run_id: str) -> None:
    store.add_run(run_id, "exp", "c1", {})
    store.set_status(run_id, RunStatus.QUEUED)


def test_allocation_grows_up_to_max_nodes_and_serves_runs_in_order(store: Store) -> None:
    spec = ClusterSpec("c1", max_nodes=3)
    for run_id in ("a", "b", "c"):
        _queue(store, run_id)
    assert autoscale.try_allocate(store, spec, "b", 1) is None  # "a" came first
    first = autoscale.try_allocate(store, spec, "a", 2)
    assert [n.name for n in first.nodes] == ["c1-node-0", "c1-node-1"] and len(first.new) == 2
    assert store.run("a").status is RunStatus.PREPARING
    with store.transaction() as db:  # the backend made them (what create_nodes records)
        for node in first.new:
            store.set_node(db, replace(node, state="busy", address="10.0.0.9"))
    assert autoscale.try_allocate(store, spec, "b", 2) is None  # only one slot left: b waits
    assert autoscale.try_allocate(store, spec, "c", 1) is None  # and c waits behind b
    autoscale.release(store, "c1", "a")
    second = autoscale.try_allocate(store, spec, "b", 2)
    assert [n.name for n in second.nodes] == ["c1-node-0", "c1-node-1"] and second.new == []  # reused


def test_scale_down_keeps_min_nodes_and_waits_for_the_idle_time() -> None:
    spec = ClusterSpec("c1", min_nodes=1, max_nodes=3, idle_seconds_before_scaledown=60)
    nodes = [Node("c1", i, f"c1-node-{i}", "idle", None, 100.0 + i, 0.0, None) for i in range(3)]
    assert autoscale.expired_nodes(nodes, spec, now=150) == []
    assert [n.idx for n in autoscale.expired_nodes(nodes, spec, now=170)] == [0, 1]  # one stays: min_nodes
    busy = [replace(nodes[0], state="busy", idle_since=None), *nodes[1:]]
    assert [n.idx for n in autoscale.expired_nodes(busy, spec, now=500)] == [1, 2]


def test_mpi_output_is_split_per_rank_even_mid_line(tmp_path: Path) -> None:
    logs = RunLogs(tmp_path, processes=2)
    stream = io.StringIO(
        "[1,0]<stdout>:hello [1,1]<stdout>:from one\n"  # two chunks on one line
        "[1,0]<stdout>:world\n"
        "[1,1]<stderr>:partial [1,1]<stderr>:end\n"
        "--------------------\nmpirun noticed something\n")
    logs.pump(stream, tagged=True)
    logs.close()
    assert (tmp_path / "user_logs" / "std_log_process_0.txt").read_text() == "hello world\n"
    assert (tmp_path / "user_logs" / "std_log_process_1.txt").read_text() == "from one\npartial end\n"
    assert "mpirun noticed something" in (tmp_path / "system_logs" / "mpi_log.txt").read_text()


def test_failure_reason_names_rank_node_exit_code_and_log_tail(tmp_path: Path) -> None:
    (tmp_path / "user_logs").mkdir()
    (tmp_path / "user_logs" / "std_log_process_1.txt").write_text("step 1\nValueError: boom\n")
    mpi_log = ("Primary job  terminated normally, but 1 process returned\na non-zero exit code.\n"
               "  Process name: [[4711,1],1]\n  Exit code:    3\n")
    layout = [Rank(0, "c1-node-0", 0), Rank(1, "c1-node-1", 0)]
    reason = failure_reason(mpi_log, layout, tmp_path, 3, lost=[])
    assert reason.startswith("rank 1 on node c1-node-1 failed with exit code 3; the job was stopped on all nodes")
    assert reason.endswith("ValueError: boom")
    assert failure_reason("", layout, tmp_path, 137, lost=["c1-node-1"]).startswith("node c1-node-1 was lost")


def test_a_driver_waiting_on_the_store_wakes_for_another_process_s_commit_not_its_own(store: Store) -> None:
    """Sweep and pipeline drivers wait on the store: another connection's commit (a
    trial's supervisor writing its status) ends the wait; nothing committed, it runs out."""
    import threading  # noqa: PLC0415

    assert store.wait_for_change(0.1) is False
    other = Store(store.path)
    writer = threading.Timer(0.05, lambda: other.add_cluster(ClusterSpec("c9", "STANDARD_D2_V2", max_nodes=1), "process"))
    writer.start()
    try:
        assert store.wait_for_change(30) is True
    finally:
        writer.join()
        other.close()
    assert store.cluster("c9").spec.max_nodes == 1
    store.add_cluster(ClusterSpec("c8", "STANDARD_D2_V2", max_nodes=1), "process")  # its own write
    assert store.wait_for_change(0.1) is False
