"""Faults as AmlCompute has them, injected on purpose, on both backends: low-priority preemption
with restart semantics (also the seed's MNIST job resuming from its checkpoint), a killed node,
a partitioned node, a slow node, a failing datastore read, many short jobs under random faults."""
from __future__ import annotations

import errno
import json
import os
import random
import re
from pathlib import Path

import docker
import pytest
from conftest import FULL, REPO, STARTUP, TRAINING, job_processes, release, wait_until

from amlemu.api import Emulator
from amlemu.backends import backend_class
from amlemu.cluster.faults import PARTITION_TIMEOUT, preemption_delays
from amlemu.errors import BackendError, StateError
from amlemu.runs.contract import job_rel
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow
LOW = {"vm_priority": "lowpriority"}

# Each rank counts its attempts in ./outputs; the first attempt blocks until it is preempted.
ATTEMPTS = """
import glob, os, time
rank = os.environ["OMPI_COMM_WORLD_RANK"]
os.makedirs("outputs", exist_ok=True)
attempt = len(glob.glob(f"outputs/seen-{rank}-*"))
open(f"outputs/seen-{rank}-{attempt}", "w").write(os.environ["AZ_BATCH_NODE_ID"])
print(f"rank {rank} attempt {attempt}", flush=True)
while attempt == 0:
    time.sleep(0.05)
"""

# Writes something to ./outputs, then blocks (until killed). MPI's rank, or torch's (a node-launched job).
PARTIAL = """
import os, time
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ["RANK"]
os.makedirs("outputs", exist_ok=True)
open(f"outputs/partial-{rank}.txt", "w").write("written before the fault")
print("started", flush=True)
while True:
    time.sleep(0.05)
"""


def _faults_log(run) -> str:  # type: ignore[no-untyped-def]
    path = run.dir / "system_logs" / "faults.txt"
    return path.read_text() if path.exists() else ""


def _both_started(run, what: str = "started"):  # type: ignore[no-untyped-def]
    wait_until(lambda: what in run.logs(0) and what in run.logs(1), STARTUP, "both ranks started")


def test_preemption_delays_are_reproducible() -> None:
    assert preemption_delays(60, 7, 3, 0, 2) == preemption_delays(60, 7, 3, 0, 2)
    assert preemption_delays(60, 7, 3, 0, 2) != preemption_delays(60, 8, 3, 0, 2)
    assert preemption_delays(60, 7, 3, 0, 2) != preemption_delays(60, 7, 3, 1, 2)  # a restart draws anew
    assert preemption_delays(0, 7, 3, 0, 2) == [float("inf")] * 2
    many = preemption_delays(3600, 1, 1, 0, 2000)  # mean 1 s between preemptions per node
    assert 0.9 < sum(many) / len(many) < 1.1


def test_dedicated_nodes_are_never_preempted(emu: Emulator, cluster) -> None:
    cluster()
    with pytest.raises(StateError, match="compute c1 is dedicated: only low-priority nodes are preempted"):
        emu.faults.preempt("c1")
    with pytest.raises(StateError, match="dedicated"):
        emu.faults.set_preemption_policy("c1", rate_per_node_hour=10)


def test_a_preempted_run_restarts_on_fresh_nodes_with_its_outputs(emu: Emulator, cluster, make_job) -> None:
    cluster(**LOW)
    job = make_job(ATTEMPTS, nodes=2)
    run = emu.submit(job)
    _both_started(run, "attempt 0")
    first = {n.name: n.created_at for n in emu.store.nodes("c1")}
    assert emu.faults.preempt("c1", node=1) == ["c1-node-1"]
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert run.record.preemptions == 1
    statuses = [s for _, s, _ in run.events()]
    at = statuses.index(RunStatus.QUEUED, statuses.index(RunStatus.RUNNING))  # back to the queue...
    assert statuses[at:] == [RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING,  # ...and again
                             RunStatus.FINALIZING, RunStatus.COMPLETED]
    assert "preempted (node(s) c1-node-1); restart 1 of at most 3" in run.events()[at][2]
    # ./outputs of the first attempt were put back before the restart, and kept at the end.
    assert sorted(p.name for p in run.outputs.glob("seen-*")) == ["seen-0-0", "seen-0-1", "seen-1-0", "seen-1-1"]
    assert "fault: preempt c1-node-1: requested" in _faults_log(run)
    assert all(n.created_at > first[n.name] for n in emu.store.nodes("c1"))  # fresh nodes
    assert "rank 0 attempt 0" in run.logs(0) and "rank 0 attempt 1" in run.logs(0)


def test_a_run_preempted_more_often_than_allowed_fails_keeping_its_outputs(emu: Emulator, cluster, make_job) -> None:
    cluster(**LOW)
    emu.faults.set_preemption_policy("c1", rate_per_node_hour=0, max_preemptions=1)
    job = make_job(PARTIAL, nodes=2, distribution="pytorch")  # restarts of a job its nodes start themselves
    run = emu.submit(job)
    for attempt in (1, 2):
        # both ranks, so that each has written its partial output before the fault
        wait_until(lambda: all(run.logs(r).count("started") == attempt for r in (0, 1))
                   and run.status is RunStatus.RUNNING, STARTUP, f"attempt {attempt} running")
        emu.faults.preempt("c1", node=0)
    assert run.wait(timeout=60) is RunStatus.FAILED
    assert run.record.error.startswith("preempted 2 times, more than the 1 restarts allowed")
    assert run.record.preemptions == 2 and (run.outputs / "partial-1.txt").exists()
    assert job_processes(job.parent.name) == []


def test_a_seeded_policy_preempts_busy_nodes_on_its_own(emu: Emulator, cluster, make_job) -> None:
    """~1 preemption per node per 0.2 s: every attempt is cut short until the limit fails the run."""
    cluster(**LOW)
    emu.faults.set_preemption_policy("c1", rate_per_node_hour=18000, seed=42, max_preemptions=2)
    job = make_job(PARTIAL, nodes=2)
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.FAILED
    assert run.record.preemptions == 3 and "more than the 2 restarts allowed" in run.record.error
    assert _faults_log(run).count("the cluster's preemption policy") >= 3


def test_a_killed_node_fails_the_run_within_10_s_and_keeps_outputs(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(PARTIAL, nodes=2, distribution="pytorch")  # test_cluster kills a node under mpirun
    run = emu.submit(job)
    _both_started(run)
    assert emu.faults.kill_node("c1", "c1-node-1") == "c1-node-1"
    wait_until(lambda: run.status.is_terminal, 10, "the run ends within 10 s of the kill")
    assert run.status is RunStatus.FAILED
    assert run.record.error.startswith("node c1-node-1 was killed (an injected fault) while the job ran")
    assert {p.name for p in run.outputs.iterdir()} == {"partial-0.txt", "partial-1.txt"}
    assert job_processes(job.parent.name) == []
    assert "c1-node-1" not in [n.name for n in emu.store.nodes("c1")]  # the killed node is removed
    assert "fault: kill c1-node-1: the node was killed" in _faults_log(run)


ALLREDUCE_LOOP = """
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
for step in range(100000):
    total = comm.allreduce(1)
    if step == 0:
        print("started", flush=True)
    time.sleep(0.02)
"""


def test_a_partitioned_node_ends_the_run_in_bounded_time(emu: Emulator, cluster, make_job, backend: str) -> None:
    cluster()
    job = make_job(ALLREDUCE_LOOP, nodes=2)
    run = emu.submit(job)
    _both_started(run)
    if not backend_class(backend).can_partition:  # process nodes share the host's network: no honest cut
        with pytest.raises(BackendError, match=f"a network partition is not emulated on {backend} nodes; it is on "
                                               f"docker nodes"):
            emu.faults.partition("c1", 1)
        run.cancel()
        return
    emu.faults.partition("c1", 1)
    # bounded: the partition's timeout, plus stopping the job on a loaded machine
    wait_until(lambda: run.status.is_terminal, PARTITION_TIMEOUT + 60, "the run ends, bounded")
    assert run.status is RunStatus.FAILED
    assert "fault: partition c1-node-1" in _faults_log(run)
    assert job_processes(job.parent.name) == []
    assert "c1-node-1" not in [n.name for n in emu.store.nodes("c1")]  # a cut-off node is not reused


def test_a_slow_node(emu: Emulator, cluster, make_job, backend: str) -> None:
    cluster()
    run = emu.submit(make_job(PARTIAL, nodes=2))
    _both_started(run)
    if not backend_class(backend).can_slow:
        with pytest.raises(BackendError, match=f"slowing a node is not emulated on {backend} nodes"):
            emu.faults.slow("c1", 0, cpus=0.1)
    else:
        emu.faults.slow("c1", 0, cpus=0.1)
        client = docker.from_env()
        host = client.containers.get(f"amlemu-{emu.home.id}-c1-node-0").attrs["HostConfig"]
        assert (host["CpuQuota"], host["CpuPeriod"]) == (10_000, 100_000)
        # Its weight beside this machine's processes is its own (one CPU's: 2 nodes on 2 cores), not
        # one shared by every container under the engine's group (dockerplan.CPU_WEIGHT).
        parent = "/" if client.info()["CgroupDriver"] == "cgroupfs" else ""
        assert (host["CpuShares"], host["CgroupParent"]) == (round(1024 * min(2, os.cpu_count() / 2)), parent)
        assert "fault: slow c1-node-0: throttled to 0.1 CPU(s)" in _faults_log(run)
    run.cancel()


READ_AFTER_RELEASE = """
import errno, os, sys, time
release = os.path.join(os.environ["AZUREML_CR_EXECUTION_WORKING_DIR_PATH"], "..", "..", "release")
print("started", flush=True)
while not os.path.exists(release):
    time.sleep(0.05)
try:
    print("read", open(os.path.join(sys.argv[1], "v.txt")).read())
except OSError as exc:
    print("read failed:", errno.errorcode[exc.errno], flush=True)
    sys.exit(1)
"""


# The fault is on a node's cached copy: the input prefetched (a read fault on the data runtime's mount is not emulated).
PREFETCHED = ("inputs:\n  d: {path: azureml://datastores/workspaceblobstore/paths/fault}\n"
              "environment_variables:\n  AMLEMU_DATA_PREFETCH: 'true'\n")


def test_a_failing_datastore_read(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1)
    fs, root = emu.datastores.filesystem("workspaceblobstore")
    fs.pipe(f"{root}/fault/v.txt", b"fine")
    job = make_job(READ_AFTER_RELEASE, args="${{inputs.d}}", extra=PREFETCHED)
    run = emu.submit(job)
    wait_until(lambda: "started" in run.logs(0), STARTUP, "the job started")
    emu.faults.fail_data_read("c1", 0, "azureml://datastores/workspaceblobstore/paths/fault/v.txt")
    release(emu, run)
    assert run.wait(timeout=60) is RunStatus.FAILED
    assert f"read failed: {errno.errorcode[errno.ELOOP]}" in run.logs(0)
    assert "fault: data-error c1-node-0: reads of azureml://" in _faults_log(run)
    again = emu.submit(make_job(READ_AFTER_RELEASE, args="${{inputs.d}}", extra=PREFETCHED))  # fetched again
    release(emu, again)
    assert again.wait(timeout=60) is RunStatus.COMPLETED, again.record.error


FAULTS = ("none", "preempt", "kill", "cancel", "cancel-queued")
QUICK = """
import os, time
time.sleep(float(os.environ.get("HOLD", "0.3")))
"""


# Docker nodes in test-full (with the 100-job run): make test soaks the process nodes, and each of these
# faults on docker nodes has its own test above (kill, preemption's restart, partition, cancel).
@pytest.mark.long
@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=FULL)], indirect=True)
@pytest.mark.parametrize("count", [20, pytest.param(100, marks=FULL)])
def test_many_short_jobs_under_seeded_random_faults_all_end_and_leave_nothing(emu: Emulator, cluster, make_job,
                                                                               backend: str, count: int) -> None:
    """Consecutive short jobs, each hit (or not) by a fault drawn from a seeded generator at a random
    moment: every run reaches a terminal status; the fixture then checks nothing is left. 20 jobs
    draw every kind of fault; `make test-full` runs 100."""
    rng = random.Random(20261130)
    cluster(max_nodes=2, idle_seconds_before_scaledown=600, **LOW)
    jobs = {n: make_job(QUICK, nodes=n) for n in (1, 2)}
    outcomes: dict[str, int] = {}
    drawn: set[str] = set()
    for i in range(count):
        run = emu.submit(jobs[rng.choice((1, 2))])
        fault = rng.choice(FAULTS)
        drawn.add(fault)
        if fault == "cancel-queued":
            run.cancel()
        elif fault != "none":
            wait_until(lambda: run.status in (RunStatus.RUNNING,) or run.status.is_terminal, STARTUP, f"job {i} runs")
            if run.status is RunStatus.RUNNING:
                try:
                    if fault == "preempt":
                        emu.faults.preempt("c1", node=rng.randrange(2))
                    elif fault == "kill":
                        emu.faults.kill_node("c1", rng.randrange(2))
                    else:
                        run.cancel()
                except Exception:  # noqa: BLE001 - the node may be gone already: the job ended meanwhile
                    pass
        status = run.wait(timeout=120)
        assert status.is_terminal, f"job {i} ({fault}) ended {status}"
        outcomes[status.value] = outcomes.get(status.value, 0) + 1
    print(f"{count} jobs under random faults: {json.dumps(outcomes)}")
    assert drawn == set(FAULTS)
    assert outcomes.get("Completed", 0) > 0 and sum(outcomes.values()) == count


# The seed's job resuming from its checkpoint: on process nodes in `make test`; on the seed's own
# docker nodes in `make test-full` only (4 container starts more), as a preempted run's restart on fresh docker
# nodes with its outputs put back is checked in `make test` above (both backends).
@TRAINING
@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=FULL)])
def test_the_seed_job_survives_preemption_at_epoch_1(emu: Emulator, cluster, mnist_subset: Path) -> None:
    """Preempted after its first checkpoint, the 2-node MNIST job restarts on fresh nodes, resumes
    from its newest checkpoint and still learns. 2,000 images for 3 epochs: epochs 2 and 3 take
    seconds, far longer than the preemption takes to land; the figure is test_cluster's business.
    `make test`'s run of the seed's job on process nodes: the trainer's contract (both ranks in sync,
    its checkpoints and model, rank 0's metrics) and each node's own read of the data are checked here."""
    cluster(**LOW)
    emu.datastores.upload(mnist_subset, "azureml://datastores/workspaceblobstore/paths/mnist")
    run = emu.submit(REPO / "trainer" / "job.yml", overrides=["compute=c1", "inputs.epochs=3"])
    checkpoint = emu.home.node_dir("c1", "c1-node-0") / job_rel(run.id) / "exe" / "wd" / "outputs" / "checkpoint-epoch1.pt"
    wait_until(checkpoint.exists, 300, "epoch 1 checkpointed")
    emu.faults.preempt("c1", node=1)
    assert run.wait(timeout=600) is RunStatus.COMPLETED, run.record.error
    assert run.record.preemptions == 1
    resumed = re.search(r"resuming from checkpoint-epoch([12])\.pt", run.logs(0))
    assert resumed, run.logs(0)[-2000:]
    assert f"epoch {resumed[1]} [" not in run.logs(0).split(resumed[0])[1]  # the done epochs are not trained again
    assert run.metrics()["test_accuracy"] >= 0.7
    steps = [step for step, _ in run.metric_history()["test_accuracy"]]
    assert sorted(set(steps)) == [1, 2, 3] and steps[0] == 1  # appended across attempts
    summary = json.loads((run.outputs / "summary.json").read_text())
    assert summary["resumed_from"] == f"checkpoint-epoch{resumed[1]}.pt" and summary["params_in_sync"] is True
    assert summary["world_size"] == 2 and "parameters identical on all 2 ranks: True" in run.logs(0)
    assert {"model.pt", "checkpoint-epoch1.pt", "checkpoint-epoch3.pt"} <= {p.name for p in run.outputs.iterdir()}
    assert run.metrics()["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    details = " ".join(d for _, _, d in run.events())
    assert "preempted (node(s) c1-node-1)" in details
    # Each node read the images through its own data runtime mount, whole.
    images = mnist_subset / "MNIST" / "raw" / "train-images-idx3-ubyte"
    logs = sorted((run.dir / "system_logs" / "data_capability").iterdir())
    assert [node.name for node in logs] == ["c1-node-0", "c1-node-1"]
    for node in logs:
        rslex = "".join(p.read_text() for p in node.glob("rslex.log.*"))
        assert f"opened /MNIST/raw/train-images-idx3-ubyte ({images.stat().st_size} bytes, whole file)" in rslex, node


def test_a_fault_on_an_idle_node_removes_it(emu: Emulator, cluster, make_job) -> None:
    cluster(idle_seconds_before_scaledown=600, **LOW)
    run = emu.submit(make_job(QUICK, nodes=2))
    assert run.wait(timeout=60) is RunStatus.COMPLETED
    assert [n.state for n in emu.store.nodes("c1")] == ["idle", "idle"]
    emu.faults.kill_node("c1", 0)
    assert emu.faults.preempt("c1") == ["c1-node-1"]
    assert emu.store.nodes("c1") == []
    again = emu.submit(make_job(QUICK, nodes=2))  # lands on fresh nodes, not on broken ones
    assert again.wait(timeout=60) is RunStatus.COMPLETED, again.record.error
